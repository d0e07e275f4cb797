"""Estimate γ, the exponent in the time pick's model of steps to accuracy, from recorded runs.

Adaptive's default pick (``time_scale="tta"``, :func:`hvd_flexcomm.moo.tta_objectives`) assumes
that the steps to a given accuracy grow as ``(1/gain)^γ`` with ``γ = w_gain / w_time`` (2/3 with
the default weights (0.6, 0.4)). A run of ``bench_adaptive.py`` holds what it takes to check that
on real training: a fixed-CR run (the reference, e.g. AG-Topk 0.01) that needed ``S_ref`` steps
to the target, and Adaptive, which ran CR ``c_t`` at step ``t`` and needed ``S_ada`` steps, with
the gain curves its solves measured (``solves[i]["gains"]`` at the candidate CRs).

Model: a step at CR ``c`` makes progress in proportion to ``gain(c)^γ``, so both runs made the same
progress by their targets::

    sum_{t < S_ada} (gain_t(c_t) / gain_t(c_ref))^γ = S_ref

where ``gain_t`` is the gain curve of the last solve at or before step ``t`` (the first solve's
before it), fitted as Adaptive fits it (:func:`hvd_flexcomm.moo.fit_gain_curve`). The left side
is convex in γ and equals ``S_ada`` at γ = 0; when Adaptive needed fewer steps than the reference,
it crosses ``S_ref`` once for γ > 0, and that γ is this run's estimate (None when Adaptive needed
as many steps or more, or no γ up to ``GAMMA_BOUND`` reaches ``S_ref``). Caveats: Adaptive's gains are
of its own error-fed gradient, not the reference run's; one seed's steps to target carry the
swings of single evaluations (hence both rulers of ``bench_adaptive.py``: the first evaluation
over the target, and the smoothed target); and progress that adds up step by step is a model.

Usage::

    python benchmarks/estimate_gamma.py results/adaptive [more dirs or adaptive.json ...]
        [--reference "AG-Topk 0.01"]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import sys
from collections.abc import Sequence
from typing import Any, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import bench_adaptive as bench  # noqa: E402

from hvd_flexcomm.compression import DEFAULT_CANDIDATES  # noqa: E402
from hvd_flexcomm.moo import fit_gain_curve  # noqa: E402

#: The estimate is searched in [0, GAMMA_BOUND].
GAMMA_BOUND = 4.0


def gain_ratios(record: dict[str, Any], ref_cr: float, n_steps: int) -> list[float]:
    """``gain_t(c_t) / gain_t(ref_cr)`` for the first ``n_steps`` steps of an Adaptive record
    (span steps included: they trained at their CR too)."""
    solves = sorted(record["adaptive"]["solves"], key=lambda s: s["step"])
    if not solves:
        raise ValueError("the record has no solves (no gain curves)")
    curves = [(s["step"], fit_gain_curve(s.get("crs") or list(DEFAULT_CANDIDATES), s["gains"]))
              for s in solves]
    crs = record["per_step"]["cr"][:n_steps]
    out = []
    i = 0
    for t, cr in enumerate(crs):
        while i + 1 < len(curves) and curves[i + 1][0] <= t:
            i += 1
        curve = curves[i][1]
        # a step without a recorded CR (none in Adaptive's records so far) counts as the reference's
        out.append(1.0 if cr is None else float(curve(cr)) / float(curve(ref_cr)))
    return out


def solve_gamma(ratios: Sequence[float], ref_steps: float) -> Optional[float]:
    """The γ > 0 with ``sum(r ** γ for r in ratios) == ref_steps`` (bisection), or None when
    ``len(ratios) >= ref_steps`` (no positive γ: the sum is convex in γ and starts at
    ``len(ratios)``) or no γ up to ``GAMMA_BOUND`` reaches ``ref_steps``."""
    if not ratios or ref_steps <= 0 or any(r <= 0 for r in ratios):
        return None

    def excess(gamma: float) -> float:
        return sum(r ** gamma for r in ratios) - ref_steps

    lo, hi = 0.0, GAMMA_BOUND
    f_lo = excess(lo)
    if f_lo >= 0 or excess(hi) < 0:
        return None
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        f_mid = excess(mid)
        if (f_mid < 0) == (f_lo < 0):
            lo, f_lo = mid, f_mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def estimate_run(result: dict[str, Any], reference: str) -> list[dict[str, Any]]:
    """Per Adaptive method of one run: γ on both rulers against the ``reference`` fixed run."""
    rows = bench.summarize_all(result["records"], result["target"], result["dense_accuracy"])
    by_name = {r["name"]: r for r in rows}
    ref = by_name.get(reference)
    if ref is None or ref["cr"] is None:
        raise ValueError(f"no fixed-CR run named {reference!r} in this run: "
                         f"{sorted(by_name)}")
    out = []
    for rec, row in zip(result["records"], rows, strict=True):
        if row["kind"] != "adaptive" or not rec.get("adaptive"):
            continue
        est: dict[str, Any] = {"seed": result["settings"].get("seed"), "method": row["name"],
                               "reference": reference}
        for ruler, key in (("first", "steps_to_target"), ("smoothed", "steps_to_smoothed_target")):
            s_ada, s_ref = row.get(key), ref.get(key)
            est[f"steps_{ruler}"] = (s_ada, s_ref)
            if s_ada is None or s_ref is None:
                est[f"gamma_{ruler}"] = None
                continue
            ratios = gain_ratios(rec, ref["cr"], int(s_ada))
            est[f"gamma_{ruler}"] = solve_gamma(ratios, float(s_ref))
            est[f"mean_ratio_{ruler}"] = sum(ratios) / len(ratios)
        out.append(est)
    return out


def _load(paths: Sequence[str]) -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path in paths:
        files = ([path] if path.endswith(".json")
                 else sorted(glob.glob(os.path.join(path, "seed*", "adaptive.json")))
                 or sorted(glob.glob(os.path.join(path, "adaptive.json"))))
        if not files:
            raise SystemExit(f"no adaptive.json under {path!r}")
        for f in files:
            with open(f) as fh:
                found.append((f, json.load(fh)))
    return found


def _fmt(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:.2f}"


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="+", help="bench_adaptive.py --out dirs or adaptive.json files")
    ap.add_argument("--reference", default="AG-Topk 0.01",
                    help="the fixed-CR method to compare with (default: %(default)s)")
    args = ap.parse_args(argv)
    weights = None
    estimates = []
    print("run | seed | method | steps to target (Adaptive, reference) | γ | "
          "steps to smoothed target | γ (smoothed) | mean gain ratio")
    for path, result in _load(args.paths):
        weights = weights or result["settings"].get("adaptive_defaults", {}).get("weights")
        for est in estimate_run(result, args.reference):
            estimates.append(est)
            print(f"{path} | {est['seed']} | {est['method']} | {est['steps_first']} | "
                  f"{_fmt(est['gamma_first'])} | {est['steps_smoothed']} | "
                  f"{_fmt(est['gamma_smoothed'])} | {_fmt(est.get('mean_ratio_smoothed'))}")
    for ruler in ("first", "smoothed"):
        values = [e[f"gamma_{ruler}"] for e in estimates if e[f"gamma_{ruler}"] is not None]
        if values:
            print(f"γ ({ruler} ruler): median {statistics.median(values):.2f}, range "
                  f"{min(values):.2f} to {max(values):.2f} over {len(values)} run(s)"
                  + ("" if len(values) == len(estimates)
                     else f" ({len(estimates) - len(values)} without an estimate)"))
    if weights:
        print(f"assumed by the time pick: γ = w_gain / w_time = {weights[1]:g} / {weights[0]:g} = "
              f"{weights[1] / weights[0]:.2f}")
    return 0 if estimates else 1


if __name__ == "__main__":
    sys.exit(main())
