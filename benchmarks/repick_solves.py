"""Re-pick the CR of recorded Adaptive solves under every pick rule.

Each solve that ``bench_adaptive.py`` records keeps its inputs: the candidate CRs' predicted
communication ms, their compression ms (or None), the smoothed gains and ``other_ms``. This tool
refits the same curves (:func:`hvd_flexcomm.moo.fit_comm_curve`, :func:`fit_gain_curve`) and picks
on a grid of ``--grid`` CRs, log-spaced over ``[c_low, c_high]`` (no NSGA-II: a dense grid is the
front of a one-variable problem), with each rule: the ASF on the step-normalised front
(``"step"``), on the front's span (``"front"``), and the time-to-accuracy pick (``"tta"``). The
CR the run used is printed beside them. The candidates are ``Adaptive``'s defaults (what
``bench_adaptive.py`` runs) unless a record names its own. Usage::

    python benchmarks/repick_solves.py results/adaptive/seed42/adaptive.json [more.json ...]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hvd_flexcomm.compression import DEFAULT_CANDIDATES  # noqa: E402
from hvd_flexcomm.moo import fit_comm_curve, fit_gain_curve, normalise_front, tta_objectives  # noqa: E402


def repick(solve: dict[str, Any], crs: list[float], weights: tuple = (0.6, 0.4),
           c_low: float = 0.001, c_high: float = 0.1, grid: int = 400) -> dict[str, float]:
    """The CR each rule picks from one solve's recorded inputs."""
    time_ms = np.asarray(solve["comm_ms"], dtype=np.float64)
    if solve.get("compress_ms"):
        time_ms = time_ms + np.asarray(solve["compress_ms"], dtype=np.float64)
    cs = np.exp(np.linspace(math.log(c_low), math.log(c_high), grid))
    t = fit_comm_curve(crs, time_ms)(cs)
    g = np.maximum(fit_gain_curve(crs, solve["gains"])(cs), 1e-9)
    F = np.column_stack([t, 1.0 / g])
    w = np.asarray(weights, dtype=np.float64)
    other = float(solve["other_ms"] or 0.0)
    return {"step": float(cs[(normalise_front(F, other) * w).max(axis=1).argmin()]),
            "front": float(cs[(normalise_front(F, None) * w).max(axis=1).argmin()]),
            "tta": float(cs[(tta_objectives(F, other) * w).sum(axis=1).argmin()])}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("json", nargs="+", help="adaptive.json files written by bench_adaptive.py")
    ap.add_argument("--grid", type=int, default=400, help="CRs on the log-spaced grid")
    args = ap.parse_args(argv)
    for path in args.json:
        with open(path) as f:
            data = json.load(f)
        for rec in data["records"]:
            if rec.get("method", {}).get("kind") != "adaptive" or not rec.get("adaptive"):
                continue
            print(f"== {path}: {rec['describe']}")
            print("step  reason                              used     step     front    tta")
            for solve in rec["adaptive"]["solves"]:
                crs = solve.get("crs") or list(DEFAULT_CANDIDATES)  # the benchmark's Adaptive
                picks = repick(solve, crs, grid=args.grid)
                used = float("nan") if solve["cr"] is None else solve["cr"]
                print(f"{solve['step']:<5} {solve['reason'][:34]:<35} {used:<8.4f} "
                      f"{picks['step']:<8.4f} {picks['front']:<8.4f} {picks['tta']:.4f}")


if __name__ == "__main__":
    main()
