"""How many more steps a lower CR costs: the exponent γ of ``steps ∝ (1/gain)^γ``, measured.

Adaptive's time pick (``time_scale="tta"``, :func:`hvd_flexcomm.moo.tta_objectives`) minimises
``step_time(c) · (1/gain(c))^γ`` with ``γ = w_gain / w_time`` (2/3 with the default weights
(0.6, 0.4)): it assumes the steps a run needs to reach an accuracy grow as ``(1/gain)^γ``, where
``gain(c)`` is the fraction of the error-fed gradient's squared norm that top-k at CR ``c``
keeps, as Adaptive measures it. This script checks that assumption against saved runs of
``benchmarks/bench_adaptive.py``:

- the **steps** each fixed-CR AG-Topk run needed to reach the target (or the smoothed target)
  depend on the seed and the training settings only, not on the network (the network moves the
  time of a step, not what a step does). Repeated runs of one seed agree to within an
  evaluation or two (evaluations every 20 steps); each seed's steps at a CR are the median over
  the runs given (a run that missed the target counting as more than any that reached it);
- the **gain curve** of a seed is the median, per candidate CR, of the gains that Adaptive's
  solves measured in the runs of that seed (solves at step ``>= from_step``: the first steps'
  gains are the untrained model's), read at the fixed CRs by interpolation in log-log;
- for two fixed CRs ``c_hi > c_lo`` of a seed, ``γ = ln(steps(c_lo) / steps(c_hi)) /
  ln(gain(c_hi) / gain(c_lo))``: the exponent under which the measured gain ratio predicts the
  measured step ratio;
- a second estimate pools every **Adaptive** run against the fixed run at ``reference_cr``
  (AG-Topk 0.01) of the same run and seed (:func:`adaptive_points`): Adaptive's mean ``ln
  gain`` over its steps to the target, less that of the fixed CR, against ``ln`` of the step
  ratio; ``γ`` is the slope through the origin (:func:`slope_through_origin`), with an
  interval from resampling the seeds (:func:`bootstrap_interval`). Many more seeds (every saved
  static run), CRs between 0.01 and 0.05, and noisier pairs (a CR path, not one CR).

Steps to the target are multiples of the evaluation interval, so one seed's ``γ`` is coarse
(at 140 against 280 steps, one evaluation moves the ratio by 7–14%); the median over seeds is
the figure to read. The gains are Adaptive's, measured on its own error-fed gradient, not on
the fixed-CR runs' (whose residuals differ): they are the numbers the pick uses, which is what
is being checked. Since ``γ`` describes the training and not the network, runs on any network
(and the change runs) can be pooled, and a γ measured once for a model and dataset holds on
every network. Pure functions over the records, and a command line::

    python benchmarks/steps_per_gain.py docs/performance/runs/reverse_581a89f [more run dirs] \\
        [--smoothed] [--from-step 50] [--reference-cr 0.01] [--out gamma.md] [--plot gamma.png]
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
from collections.abc import Sequence
from typing import Any, Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from benchmarks.bench_adaptive import read_seed_runs  # noqa: E402
from benchmarks.step_budget import run_name  # noqa: E402

#: Settings that decide what a training step does (the network is not among them).
TRAINING_SETTINGS = ("seed", "n", "model", "dense_steps", "lr", "momentum", "batch_size",
                     "target_drop", "eval_every")
#: Solves before this step are left out of a gain curve by default (the untrained model's).
FROM_STEP = 50
#: The fixed CR each Adaptive run is compared with (:func:`adaptive_points`).
REFERENCE_CR = 0.01


def exponent(steps_hi: float, steps_lo: float, gain_hi: float, gain_lo: float) -> float:
    """γ under which ``(gain_hi / gain_lo)^γ = steps_lo / steps_hi``: the steps at the lower
    CR over those at the higher one, against the gains (fractions kept) at the higher CR over
    the lower one. Raises ValueError for non-positive values or equal gains. Pure function."""
    values = (steps_hi, steps_lo, gain_hi, gain_lo)
    if not all(math.isfinite(v) and v > 0 for v in values):
        raise ValueError(f"steps and gains must be finite and > 0, got {values!r}")
    if gain_hi == gain_lo:
        raise ValueError(f"the two gains are equal ({gain_hi!r}): no exponent")
    return math.log(steps_lo / steps_hi) / math.log(gain_hi / gain_lo)


def gain_at(crs: Sequence[float], gains: Sequence[float], cr: float) -> float:
    """The gain at ``cr``, interpolated linearly in ``log cr`` and ``log gain`` between the
    candidates ``crs`` (any order, at least two) and their ``gains`` (> 0); outside the
    candidates, the nearest one's gain. Pure function."""
    pts = sorted(zip((float(c) for c in crs), (float(g) for g in gains)))
    if len(pts) < 2 or any(c <= 0 or g <= 0 for c, g in pts) or cr <= 0:
        raise ValueError(f"need two or more candidates, CRs and gains > 0: {pts!r}, cr={cr!r}")
    if cr <= pts[0][0]:
        return pts[0][1]
    if cr >= pts[-1][0]:
        return pts[-1][1]
    for (c0, g0), (c1, g1) in zip(pts, pts[1:]):
        if c0 <= cr <= c1:
            t = math.log(cr / c0) / math.log(c1 / c0)
            return math.exp(math.log(g0) + t * (math.log(g1) - math.log(g0)))
    raise AssertionError("unreachable: cr lies between the candidates")


def _candidates(settings: dict[str, Any], record: dict[str, Any]) -> list[float]:
    """The candidate CRs of an Adaptive record, in the order of its solves' gains (largest
    first, as ``Adaptive`` sorts them)."""
    options = record.get("method", {}).get("options") or {}
    cands = options.get("candidates") or settings["adaptive_defaults"]["candidates"]
    return sorted({float(c) for c in cands}, reverse=True)


def solve_gains(settings: dict[str, Any], record: dict[str, Any],
                from_step: int = FROM_STEP) -> list[tuple[list[float], list[float]]]:
    """``(candidates, gains)`` of each solve of an Adaptive ``record`` at step ``>= from_step``
    whose gains are all > 0 (none for other methods)."""
    if record.get("method", {}).get("kind") != "adaptive":
        return []
    cands = _candidates(settings, record)
    out = []
    for solve in (record.get("adaptive") or {}).get("solves") or []:
        gains = solve.get("gains")
        if (solve.get("step", -1) >= from_step and gains and len(gains) == len(cands)
                and all(g > 0 for g in gains)):
            out.append((cands, [float(g) for g in gains]))
    return out


def training_key(settings: dict[str, Any]) -> tuple:
    """What decides a run's training steps (:data:`TRAINING_SETTINGS`), hashable."""
    return tuple(repr(settings.get(name)) for name in TRAINING_SETTINGS)


def fixed_ag_steps(result: dict[str, Any], smoothed: bool = False) -> dict[float, Optional[int]]:
    """Steps to the target (or the smoothed target) of each fixed-CR AG-Topk row of a run,
    by CR; None where it was not reached."""
    field = "steps_to_smoothed_target" if smoothed else "steps_to_target"
    return {float(row["cr"]): row.get(field) for row in result["rows"]
            if row.get("kind") == "ag" and row.get("cr") is not None}


def _groups(results: Sequence[dict[str, Any]], smoothed: bool,
            from_step: int) -> dict[tuple, dict[str, Any]]:
    """The results by training setting (:func:`training_key`): ``seed``, ``runs`` (run names),
    ``steps`` (CR -> the fixed AG-Topk runs' steps, None for a miss), ``curves`` (the Adaptive
    solves' ``(candidates, gains)``) and ``results``."""
    groups: dict[tuple, dict[str, Any]] = {}
    for res in results:
        settings = res["settings"]
        group = groups.setdefault(training_key(settings), {
            "seed": settings.get("seed"), "runs": [], "steps": {}, "curves": [], "results": []})
        group["runs"].append(run_name(res.get("source", "?")))
        group["results"].append(res)
        for cr, steps in fixed_ag_steps(res, smoothed).items():
            group["steps"].setdefault(cr, []).append(steps)
        for record in res["records"]:
            group["curves"].extend(solve_gains(settings, record, from_step))
    return groups


def median_curve(curves: Sequence[tuple[list[float], list[float]]]
                 ) -> Optional[tuple[list[float], list[float], int]]:
    """``(candidates, gains, n)``: per candidate, the median gain (in log) of the ``n`` curves
    over the first curve's candidates (curves over other candidates are left out); None
    without curves. Pure function."""
    if not curves:
        return None
    cands = curves[0][0]
    same = [g for c, g in curves if c == cands]
    gains = [math.exp(statistics.median(math.log(g[i]) for g in same))
             for i in range(len(cands))]
    return cands, gains, len(same)


def seed_estimates(results: Sequence[dict[str, Any]], smoothed: bool = False,
                   from_step: int = FROM_STEP) -> list[dict[str, Any]]:
    """One entry per training setting (seed) that has two or more fixed AG-Topk CRs reached
    and an Adaptive gain curve: ``seed``, ``runs`` (run names), ``steps`` (CR -> median
    steps), ``gains`` (CR -> gain at it, from the median curve), ``n_solves``, and ``pairs``:
    ``(c_hi, c_lo, gamma)`` for each pair of its CRs. A run that missed the target counts as
    more steps than any that reached it; a CR whose median run missed is left out. Pure
    function of the results."""
    out = []
    for group in _groups(results, smoothed, from_step).values():
        # a miss counts as more steps than any reached (as bench_adaptive's medians); a CR
        # whose median run missed has no step count
        medians = {cr: statistics.median(math.inf if s is None else s for s in v)
                   for cr, v in group["steps"].items()}
        steps = {cr: m for cr, m in medians.items() if math.isfinite(m)}
        curve = median_curve(group["curves"])
        if len(steps) < 2 or curve is None:
            continue
        cands, median_gains, n_solves = curve
        gains = {cr: gain_at(cands, median_gains, cr) for cr in steps}
        crs = sorted(steps, reverse=True)
        pairs = [(hi, lo, exponent(steps[hi], steps[lo], gains[hi], gains[lo]))
                 for i, hi in enumerate(crs) for lo in crs[i + 1:] if gains[hi] != gains[lo]]
        out.append({"seed": group["seed"], "runs": sorted(set(group["runs"])),
                    "steps": steps, "gains": gains, "n_solves": n_solves, "pairs": pairs})
    return sorted(out, key=lambda e: (str(e["seed"])))


def adaptive_points(results: Sequence[dict[str, Any]], smoothed: bool = False,
                    from_step: int = FROM_STEP, reference_cr: float = REFERENCE_CR
                    ) -> dict[tuple, list[tuple[float, float]]]:
    """Each Adaptive run against the fixed AG-Topk run at ``reference_cr`` of the same run
    directory and seed (both reached the target), by training setting: ``(x, y)`` with ``x``
    the mean over Adaptive's steps up to its target (span steps left out) of ``ln gain(cr) −
    ln gain(reference_cr)`` (the seed's median gain curve) and ``y = ln(steps of the fixed run
    / steps of Adaptive)``. Under ``steps ∝ (1/gain)^γ``, ``y ≈ γ·x``. Pure function."""
    points: dict[tuple, list[tuple[float, float]]] = {}
    field = "steps_to_smoothed_target" if smoothed else "steps_to_target"
    for key, group in _groups(results, smoothed, from_step).items():
        curve = median_curve(group["curves"])
        if curve is None:
            continue
        cands, gains, _ = curve
        log_ref = math.log(gain_at(cands, gains, reference_cr))
        for res in group["results"]:
            ref = fixed_ag_steps(res, smoothed).get(float(reference_cr))
            if not ref:
                continue
            rows = {row["name"]: row for row in res["rows"]}
            for record in res["records"]:
                method = record.get("method", {})
                n = rows.get(method.get("name"), {}).get(field)
                if method.get("kind") != "adaptive" or not n:
                    continue
                per_step = record["per_step"]
                spans = per_step.get("span") or [False] * len(per_step["cr"])
                crs = [c for c, span in zip(per_step["cr"][:n], spans[:n]) if c and not span]
                if crs:
                    x = statistics.fmean(math.log(gain_at(cands, gains, c)) for c in crs)
                    points.setdefault(key, []).append((x - log_ref, math.log(ref / n)))
    return points


def slope_through_origin(points: Sequence[tuple[float, float]]) -> float:
    """Least-squares slope of ``y = γ·x`` (no intercept). Raises ValueError when every ``x``
    is 0. Pure function."""
    sxx = sum(x * x for x, _ in points)
    if sxx == 0:
        raise ValueError("every x is 0: no slope")
    return sum(x * y for x, y in points) / sxx


def bootstrap_interval(points_by_key: dict[tuple, list[tuple[float, float]]],
                       level: float = 0.9, n_resamples: int = 2000, seed: int = 0
                       ) -> tuple[float, float]:
    """The central ``level`` interval of :func:`slope_through_origin` over ``n_resamples``
    resamples of the training settings (seeds) with replacement, each taking all its points
    (the runs of one seed are not independent of each other). Deterministic for a ``seed``."""
    import numpy as np

    keys = list(points_by_key)
    rng = np.random.default_rng(seed)
    slopes = []
    for _ in range(n_resamples):
        picked = [p for i in rng.integers(0, len(keys), len(keys)) for p in points_by_key[keys[i]]]
        if any(x != 0 for x, _ in picked):
            slopes.append(slope_through_origin(picked))
    tail = 100 * (1 - level) / 2
    lo, hi = np.percentile(slopes, [tail, 100 - tail])
    return float(lo), float(hi)


def weights_for(gamma: float) -> tuple[float, float]:
    """The weights ``(w_time, w_gain)`` summing to 1 whose time pick assumes ``gamma``
    (``gamma = w_gain / w_time``, >= 0). Pure function."""
    if not (math.isfinite(gamma) and gamma >= 0):
        raise ValueError(f"gamma must be finite and >= 0, got {gamma!r}")
    return 1.0 / (1.0 + gamma), gamma / (1.0 + gamma)


def markdown(estimates: Sequence[dict[str, Any]], ruler: str, from_step: int,
             weights: tuple[float, float] = (0.6, 0.4),
             points: Optional[dict[tuple, list[tuple[float, float]]]] = None,
             reference_cr: float = REFERENCE_CR) -> str:
    """A table per seed (steps, gains, γ of each CR pair), the median over seeds, and (given
    ``points``, :func:`adaptive_points`) the pooled slope of Adaptive against the fixed
    ``reference_cr`` with its interval over seeds resampled."""
    lines = [f"Steps to the {ruler} at fixed CRs against Adaptive's measured gains "
             f"(`benchmarks/steps_per_gain.py`; gains: the median of Adaptive's solves from "
             f"step {from_step} on, per seed).", "",
             "| seed | runs | solves | steps at each CR | gain at each CR (fraction kept) "
             "| γ (CR pair) |", "|---|---:|---:|---|---|---|"]
    gammas: dict[tuple[float, float], list[float]] = {}
    for e in estimates:
        crs = sorted(e["steps"], reverse=True)
        steps = ", ".join(f"{cr:g}: {e['steps'][cr]:g}" for cr in crs)
        gains = ", ".join(f"{cr:g}: {e['gains'][cr]:.3f}" for cr in crs)
        pairs = ", ".join(f"{g:.2f} ({hi:g}/{lo:g})" for hi, lo, g in e["pairs"])
        for hi, lo, g in e["pairs"]:
            gammas.setdefault((hi, lo), []).append(g)
        lines.append(f"| {e['seed']} | {len(e['runs'])} | {e['n_solves']} | {steps} | {gains} "
                     f"| {pairs} |")
    assumed = weights[1] / weights[0]
    lines += ["", f"The time pick with weights {tuple(weights)} assumes γ = {assumed:.2f}.", "",
              "| CR pair | seeds | median γ | range | weights (time, gain) that assume it |",
              "|---|---:|---:|---|---|"]
    for (hi, lo), gs in sorted(gammas.items(), reverse=True):
        med = statistics.median(gs)
        w_t, w_g = weights_for(max(med, 0.0))
        lines.append(f"| {hi:g} / {lo:g} | {len(gs)} | {med:.2f} | {min(gs):.2f} to "
                     f"{max(gs):.2f} | ({w_t:.2f}, {w_g:.2f}) |")
    if not gammas:
        lines.append("| - | 0 | - | - | - |")
    if points is not None:
        lines += ["", f"Adaptive against AG-Topk {reference_cr:g} of the same run and seed: x = "
                  f"Adaptive's mean ln gain over its steps to the {ruler} (span steps left out) "
                  f"minus ln gain({reference_cr:g}), y = ln(steps of AG-Topk {reference_cr:g} / "
                  "steps of Adaptive); γ is the least-squares slope of y = γ·x, its interval "
                  "the central 90% over 2000 resamples of the seeds (all runs of a seed "
                  "together).", "",
                  "| pairs | seeds (training settings) | mean x | mean y | γ | 90% interval |",
                  "|---:|---:|---:|---:|---:|---|"]
        flat = [p for v in points.values() for p in v]
        if flat and any(x != 0 for x, _ in flat):
            lo, hi = bootstrap_interval(points)
            lines.append(f"| {len(flat)} | {len(points)} | "
                         f"{statistics.fmean(x for x, _ in flat):.2f} | "
                         f"{statistics.fmean(y for _, y in flat):.2f} | "
                         f"{slope_through_origin(flat):.2f} | {lo:.2f} to {hi:.2f} |")
        else:
            lines.append("| 0 | 0 | - | - | - | - |")
    return "\n".join(lines) + "\n"


def plot(estimates: Sequence[dict[str, Any]], points: dict[tuple, list[tuple[float, float]]],
         path: str, ruler: str, weights: tuple[float, float] = (0.6, 0.4),
         reference_cr: float = REFERENCE_CR) -> None:
    """ln(step ratio) against ln(gain ratio): each Adaptive run against the fixed
    ``reference_cr`` (small grey points), each seed's fixed-CR pair (large points), the line of
    the γ the pick assumes with ``weights`` and the lines of the two measured γ."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 5.0))
    flat = [p for v in points.values() for p in v]
    if flat:
        ax.scatter([x for x, _ in flat], [y for _, y in flat], s=10, color="grey", alpha=0.5,
                   label=f"Adaptive vs AG-Topk {reference_cr:g}, one run ({len(flat)})")
    pairs = [(math.log(e["gains"][hi] / e["gains"][lo]), math.log(e["steps"][lo] / e["steps"][hi]))
             for e in estimates for hi, lo, _ in e["pairs"]]
    if pairs:
        ax.scatter([x for x, _ in pairs], [y for _, y in pairs], s=45, color="tab:blue",
                   label=f"fixed CRs of one seed ({len(pairs)})", zorder=3)
    xs = [x for x, _ in flat + pairs] + [0.0]
    grid = [min(xs), max(xs)]
    assumed = weights[1] / weights[0]
    ax.plot(grid, [assumed * x for x in grid], color="tab:red", ls="--",
            label=f"assumed by weights {tuple(weights)}: γ = {assumed:.2f}")
    if pairs:
        gamma = statistics.median(g for e in estimates for _, _, g in e["pairs"])
        ax.plot(grid, [gamma * x for x in grid], color="tab:blue",
                label=f"fixed CRs, median γ = {gamma:.2f}")
    if flat and any(x != 0 for x, _ in flat):
        gamma = slope_through_origin(flat)
        ax.plot(grid, [gamma * x for x in grid], color="black",
                label=f"Adaptive runs, fitted γ = {gamma:.2f}")
    ax.axhline(0.0, color="black", lw=0.6)
    ax.axvline(0.0, color="black", lw=0.6)
    ax.set_xlabel("ln(gain ratio): higher CR's fraction kept over the lower one's")
    ax.set_ylabel(f"ln(step ratio): lower CR's steps to the {ruler} over the higher one's")
    ax.set_title("How many more steps a lower CR costs: steps ∝ (1/gain)^γ", fontsize=10)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dirs", nargs="+", metavar="DIR",
                    help="run directories of bench_adaptive.py (each holding seed*/adaptive.json)")
    ap.add_argument("--smoothed", action="store_true",
                    help="steps to the smoothed target instead of the first evaluation over it")
    ap.add_argument("--from-step", type=int, default=FROM_STEP,
                    help=f"gains from Adaptive's solves at this step or later (default {FROM_STEP})")
    ap.add_argument("--reference-cr", type=float, default=REFERENCE_CR,
                    help="the fixed AG-Topk CR each Adaptive run is compared with (default "
                         f"{REFERENCE_CR:g})")
    ap.add_argument("--out", help="also write the markdown to this file")
    ap.add_argument("--plot", metavar="PNG", help="also plot the points and lines (see plot())")
    args = ap.parse_args(argv)
    if args.from_step < 0:
        ap.error(f"--from-step must be >= 0, got {args.from_step}")
    if not (0 < args.reference_cr <= 1):
        ap.error(f"--reference-cr must be in (0, 1], got {args.reference_cr}")
    try:
        results = read_seed_runs(args.dirs)
    except ValueError as exc:
        ap.error(str(exc))
    estimates = seed_estimates(results, args.smoothed, args.from_step)
    points = adaptive_points(results, args.smoothed, args.from_step, args.reference_cr)
    ruler = "smoothed target" if args.smoothed else "target"
    md = markdown(estimates, ruler, args.from_step, points=points, reference_cr=args.reference_cr)
    print(md)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(md)
    if args.plot:
        plot(estimates, points, args.plot, ruler, reference_cr=args.reference_cr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
