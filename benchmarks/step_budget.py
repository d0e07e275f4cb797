"""Where a method's time to the target goes: its steps priced at steady state, and the rest.

Reads the saved records of ``benchmarks/bench_adaptive.py`` (``seed*/adaptive.json``: rank 0's
time of every step, the CR it ran, whether it was a span step, the probe time it held) and
splits each method's training time up to the target into

- **steady** (s): every step priced at the median time of the *steady* steps at the CR in use
  (a steady step holds no probe, is not a span step, and it and the two steps before it ran the
  same CR outside spans: a new message size's first steps pay Horovod's negotiation). A CR with
  fewer than :data:`MIN_STEADY` steady steps has no price of its own (Adaptive's steps at its
  starting CR before the first solved one is in force, a CR it left at once): its steps are
  priced at the next priced CR of the run (the previous one at the end), i.e. as if that CR
  had been in force from the start. A span step is priced at the CR in use around it. After a
  network change each network's steps are priced by its own steady steps (the steps at the
  old CR on the new network are then priced as such: a slow reaction shows in the steady part);
- **overhead** (s): the time above those prices, by where it arose (:data:`PARTS`, a step
  counts towards the first that applies): ``start-up`` (every step before the run's first
  steady step at a priced CR: for Adaptive the start-up probe, the steps at the starting CR and
  the first steps at the first solved CR; for a fixed CR its first two steps), ``network
  change`` (the steps from a network change to the first steady step after it), ``spans``
  (span steps and the step after each span), ``probes`` (later steps that held a probe), ``CR
  changes`` (the first step at a new CR and the ``ANNOUNCE_LAG_STEPS`` before it, which run
  while its announcement is in flight), ``stalls`` (any other step over :data:`STALL_FACTOR` times its
  price: a TCP retransmission timeout, a starved process) and ``rest`` (step-to-step noise
  about the median; it can be negative).

The steady part compares the CRs the methods ran, the overhead what it cost to run them. Pure
functions over the records, and a command line that prints a markdown table per seed and the
per-seed ratios of Adaptive to the best fixed CR on both parts (of each Adaptive, in an A/B run
of two)::

    python benchmarks/step_budget.py docs/performance/runs/static_eea3726 [more run dirs] \\
        [--smoothed] [--out budget.md] [--plot budget.png]
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

from benchmarks.bench_adaptive import (  # noqa: E402
    STALL_FACTOR,
    parse_pool_methods,
    read_seed_runs,
    renamed_arms,
)
from hvd_flexcomm.adaptive import ANNOUNCE_LAG_STEPS  # noqa: E402

#: Steady steps a CR needs for a price of its own.
MIN_STEADY = 5
#: Where overhead arises, in the order a step is classified (the first that applies).
PARTS = ("start-up", "network change", "spans", "probes", "CR changes", "stalls", "rest")


def _flags(per_step: dict[str, list], n: int) -> tuple[list, list[bool], list[float]]:
    """The first ``n`` steps' CRs, span flags and probe ms (records without span flags: none)."""
    crs = list(per_step["cr"][:n])
    spans = [bool(x) for x in (per_step.get("span") or [False] * len(crs))[:n]]
    probes = [float(p or 0.0) for p in per_step["probe_ms"][:n]]
    return crs, spans, probes


def cr_in_use(crs: Sequence, spans: Sequence[bool]) -> list:
    """The CR in use at each step: a step's own CR, or, for a span step (which runs at an end of
    the candidates), the CR of the last step before it outside spans (the first one after it
    when the run opens with a span). Pure function."""
    regular = [c for c, span in zip(crs, spans) if not span]
    out, last = [], (regular[0] if regular else None)
    for c, span in zip(crs, spans):
        if not span:
            last = c
        out.append(last)
    return out


def steady_steps(crs: Sequence, spans: Sequence[bool], probes: Sequence[float]) -> list[bool]:
    """Whether each step is steady (see the module docstring). Pure function."""
    return [i >= 2 and not any(spans[i - 2:i + 1]) and probes[i] == 0
            and crs[i] == crs[i - 1] == crs[i - 2] for i in range(len(crs))]


def _fill(prices: list[Optional[float]]) -> list[Optional[float]]:
    """Each None replaced by the next price in the list, or, after the last price, the previous
    one (all None stays all None)."""
    out = list(prices)
    nxt: Optional[float] = None
    for i in reversed(range(len(out))):
        if out[i] is None:
            out[i] = nxt
        else:
            nxt = out[i]
    prev: Optional[float] = None
    for i, p in enumerate(out):
        if p is None:
            out[i] = prev
        else:
            prev = p
    return out


def phases(n_steps: int, change_step: Optional[int]) -> list[int]:
    """0 for each step before the network change, 1 from ``change_step`` (the first step on the
    new network) on; all 0 without a change. Pure function."""
    return [int(change_step is not None and i >= change_step) for i in range(n_steps)]


def _priced(per_step: dict[str, list], n_steps: int, change_step: Optional[int],
            min_steady: int) -> Optional[dict[str, list]]:
    """The first ``n_steps`` steps' ``ms``, ``spans``, ``probes``, CR ``in_use``, network
    ``phase``, ``steady`` (a steady step whose CR made a price) and ``prices`` (see
    :func:`step_prices`), or None when no CR has ``min_steady`` steady steps."""
    crs, spans, probes = _flags(per_step, n_steps)
    ms = per_step["ms"][:n_steps]
    phase = phases(len(ms), change_step)
    # the change's first steps are not steady: the two before them ran on the other network
    steady = [s and phase[i] == phase[i - 2]
              for i, s in enumerate(steady_steps(crs, spans, probes))]
    samples: dict[tuple, list[float]] = {}
    for i in range(len(ms)):
        if steady[i]:
            samples.setdefault((phase[i], crs[i]), []).append(ms[i])
    price = {key: statistics.median(v) for key, v in samples.items() if len(v) >= min_steady}
    if not price:
        return None
    in_use = cr_in_use(crs, spans)
    prices: list[Optional[float]] = []
    for ph in sorted(set(phase)):
        prices += _fill([price.get((ph, c)) for c, p in zip(in_use, phase) if p == ph])
    return {"ms": ms, "spans": spans, "probes": probes, "in_use": in_use, "phase": phase,
            "steady": [s and (phase[i], crs[i]) in price for i, s in enumerate(steady)],
            "prices": [float(p) for p in _fill(prices)]}  # type: ignore[arg-type]


def step_prices(per_step: dict[str, list], n_steps: int, change_step: Optional[int] = None,
                min_steady: int = MIN_STEADY) -> Optional[list[float]]:
    """Steady price (ms) of each of the first ``n_steps`` steps (see the module docstring), or
    None when no CR of the run has ``min_steady`` steady steps. With a network change
    (``change_step``: the first step on the new network) the steps on each network are priced
    by that network's steady steps (a network without a priced CR borrows the other's)."""
    run = _priced(per_step, n_steps, change_step, min_steady)
    return None if run is None else run["prices"]


def budget(per_step: dict[str, list], n_steps: int, change_step: Optional[int] = None,
           min_steady: int = MIN_STEADY) -> Optional[dict[str, Any]]:
    """``{"steps", "time_s", "steady_s", "overhead_s", "parts": {part: s}}`` of the first
    ``n_steps`` steps (the parts sum to ``overhead_s`` = ``time_s - steady_s``), or None when
    the steps cannot be priced (:func:`step_prices`). ``change_step``: the first step on a new
    network (the steps from it to the first steady step after it count as ``network change``)."""
    run = _priced(per_step, n_steps, change_step, min_steady)
    if run is None:
        return None
    ms, spans, probes, in_use, phase, steady, prices = (
        run[k] for k in ("ms", "spans", "probes", "in_use", "phase", "steady", "prices"))
    first_steady = steady.index(True) if any(steady) else len(ms)
    settled = next((i for i in range(len(ms)) if steady[i] and phase[i]),
                   len(ms))  # the first steady step on the new network
    changes = {i for i in range(1, len(ms)) if in_use[i] != in_use[i - 1]}
    near_change = {j for i in changes for j in range(i - ANNOUNCE_LAG_STEPS, i + 1)}
    parts = dict.fromkeys(PARTS, 0.0)
    for i, (t, p) in enumerate(zip(ms, prices)):
        if i < first_steady:
            part = "start-up"
        elif phase[i] and i < settled:
            part = "network change"
        elif spans[i] or (i > 0 and spans[i - 1]):
            part = "spans"
        elif probes[i] > 0:
            part = "probes"
        elif i in near_change:
            part = "CR changes"
        elif t > STALL_FACTOR * p:
            part = "stalls"
        else:
            part = "rest"
        parts[part] += (t - p) / 1e3
    time_s, steady_s = sum(ms) / 1e3, sum(prices) / 1e3
    return {"steps": len(ms), "time_s": time_s, "steady_s": steady_s,
            "overhead_s": time_s - steady_s, "parts": parts}


def run_budgets(result: dict[str, Any], smoothed: bool = False) -> list[dict[str, Any]]:
    """One entry per method of a saved run (``result``: a resummarised ``adaptive.json``) that
    reached the target (``smoothed``: the smoothed one): ``{"name", "kind", **budget}``."""
    key = "steps_to_smoothed_target" if smoothed else "steps_to_target"
    out = []
    for row, rec in zip(result["rows"], result["records"], strict=True):
        if row.get(key) is None or row["kind"] == "dense":
            continue
        change = rec.get("network_change") or {}
        change_step = change.get("step") if change.get("network") else None
        b = budget(rec["per_step"], int(row[key]), change_step)
        if b is not None:
            out.append({"name": row["name"], "kind": row["kind"], **b})
    return out


def _geo_mean(xs: Sequence[float]) -> float:
    return math.exp(statistics.mean(math.log(x) for x in xs))


def compare(per_run: list[tuple[str, list[dict[str, Any]]]],
            adaptive: Optional[str] = None) -> dict[str, Any]:
    """Adaptive against the best fixed CR of each run (the fixed method with the shortest time
    to the target): per-run ratios of time and of steady time, their medians and geometric
    means, and the mean overhead parts of each side (s). ``adaptive``: the name of the Adaptive
    to compare where a run has several (an A/B run); None: each run's first. Runs without both
    are left out."""
    pairs = []
    for label, entries in per_run:
        ada = next((e for e in entries if e["kind"] == "adaptive"
                    and (adaptive is None or e["name"] == adaptive)), None)
        fixed = [e for e in entries if e["kind"] != "adaptive"]
        if ada is None or not fixed:
            continue
        best = min(fixed, key=lambda e: e["time_s"])
        pairs.append({"run": label, "adaptive": ada, "best": best,
                      "time_ratio": ada["time_s"] / best["time_s"],
                      "steady_ratio": ada["steady_s"] / best["steady_s"]})
    if not pairs:
        return {"pairs": []}

    def mean_parts(side: str) -> dict[str, float]:
        return {p: statistics.mean(x[side]["parts"][p] for x in pairs) for p in PARTS}

    return {"pairs": pairs,
            "median_time_ratio": statistics.median(x["time_ratio"] for x in pairs),
            "median_steady_ratio": statistics.median(x["steady_ratio"] for x in pairs),
            "geo_time_ratio": _geo_mean([x["time_ratio"] for x in pairs]),
            "geo_steady_ratio": _geo_mean([x["steady_ratio"] for x in pairs]),
            "adaptive_parts_s": mean_parts("adaptive"), "best_parts_s": mean_parts("best")}


def adaptive_names(per_run: list[tuple[str, list[dict[str, Any]]]]) -> list[str]:
    """The names of the Adaptives in the runs, in the order they first appear."""
    return list(dict.fromkeys(e["name"] for _, entries in per_run for e in entries
                              if e["kind"] == "adaptive"))


def markdown(per_run: list[tuple[str, list[dict[str, Any]]]],
             summaries: list[tuple[str, dict[str, Any]]], ruler: str) -> str:
    """The per-run table and each comparison (``(Adaptive's name, compare(...))``), as
    markdown."""
    lines = [f"Time to the {ruler} (s of rank 0's step times), steady part and overhead "
             "(`benchmarks/step_budget.py`).", "",
             "| run | method | steps | time (s) | steady (s) | overhead (s) | "
             + " | ".join(PARTS) + " |",
             "|---|---|---:|---:|---:|---:|" + "---:|" * len(PARTS)]
    for label, entries in per_run:
        for e in entries:
            lines.append(f"| {label} | {e['name']} | {e['steps']} | {e['time_s']:.1f} | "
                         f"{e['steady_s']:.1f} | {e['overhead_s']:.1f} | "
                         + " | ".join(f"{e['parts'][p]:.1f}" for p in PARTS) + " |")
    for name, summary in summaries:
        pairs = summary["pairs"]
        lines.append("")
        if not pairs:
            lines.append(f"No run has {name} and a fixed CR that both reached the target.")
            continue
        lines += [f"{name} against the best fixed CR of each run ({len(pairs)} runs):", "",
                  f"| ratio, {name} / best fixed | median of the runs | geometric mean |",
                  "|---|---:|---:|",
                  f"| time to the target | {summary['median_time_ratio']:.2f} | "
                  f"{summary['geo_time_ratio']:.2f} |",
                  f"| steady part (every step at its CR's steady price) | "
                  f"{summary['median_steady_ratio']:.2f} | {summary['geo_steady_ratio']:.2f} |",
                  "", "| mean overhead per run (s) | " + " | ".join(PARTS) + " | all |",
                  "|---|" + "---:|" * (len(PARTS) + 1)]
        for side, label in (("adaptive_parts_s", name), ("best_parts_s", "best fixed CR")):
            parts = summary[side]
            lines.append(f"| {label} | " + " | ".join(f"{parts[p]:.2f}" for p in PARTS)
                         + f" | {sum(parts.values()):.2f} |")
    return "\n".join(lines) + "\n"


def _group(label: str) -> str:
    """A run's group in the plot: its directory's name up to the last underscore (this repo
    names runs ``<scenario>_<commit>``), the whole name without one."""
    name = label.rsplit(" seed ", 1)[0]
    return name.rsplit("_", 1)[0] if "_" in name else name


def plot(summary: dict[str, Any], path: str, ruler: str) -> None:
    """One point per run: Adaptive / best fixed CR on the steady part (x) against the time to
    the target (y), coloured by group (:func:`_group`). Below the horizontal line Adaptive was
    faster; left of the vertical one its CRs were cheaper at steady state; the height of a point
    above the diagonal is what its overhead cost it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pairs = summary["pairs"]
    fig, ax = plt.subplots(figsize=(6.4, 5.6))
    xs = [p["steady_ratio"] for p in pairs]
    ys = [p["time_ratio"] for p in pairs]
    lo, hi = min(xs + ys + [1.0]) * 0.95, max(xs + ys + [1.0]) * 1.05
    ax.plot([lo, hi], [lo, hi], color="grey", lw=0.8, ls=":", label="time = steady (no overhead)")
    ax.axhline(1.0, color="black", lw=0.8)
    ax.axvline(1.0, color="black", lw=0.8, ls="--")
    for group in sorted({_group(p["run"]) for p in pairs}):
        mine = [p for p in pairs if _group(p["run"]) == group]
        ax.scatter([p["steady_ratio"] for p in mine], [p["time_ratio"] for p in mine],
                   label=f"{group} ({len(mine)})", s=28)
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("steady part, Adaptive / best fixed CR")
    ax.set_ylabel(f"time to the {ruler}, Adaptive / best fixed CR")
    ax.set_title(f"Adaptive against the best fixed CR, one point per seed-run\n"
                 f"medians: time {summary['median_time_ratio']:.2f}, "
                 f"steady {summary['median_steady_ratio']:.2f}", fontsize=10)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run_name(directory: str) -> str:
    """A saved run's name in the tables: the last part of its directory's path."""
    return os.path.basename(os.path.normpath(directory))


def load_runs(dirs: list[str], pool_methods: Optional[list[tuple[str, str]]] = None
              ) -> list[tuple[str, dict[str, Any]]]:
    """``(label, resummarised result)`` of every ``seed*/adaptive.json`` under each of ``dirs``
    (label: the directory's name and the seed). Raises ValueError naming a directory without
    one. Runs of different library versions may be mixed: each seed is compared within its own
    run only. ``pool_methods``: keep only these methods, a run's ``SOURCE`` taken as ``NAME``
    (``bench_adaptive.select_methods``)."""
    return [(f"{run_name(res['source'])} seed "
             f"{res['settings']['seed']}", res) for res in read_seed_runs(dirs, pool_methods)]


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dirs", nargs="+", metavar="DIR",
                    help="run directories of bench_adaptive.py (each holding seed*/adaptive.json)")
    ap.add_argument("--smoothed", action="store_true",
                    help="up to the smoothed target instead of the first evaluation over it")
    ap.add_argument("--out", help="also write the markdown to this file")
    ap.add_argument("--plot", metavar="PNG",
                    help="also plot each run's two ratios (see plot(); the first Adaptive's)")
    ap.add_argument("--pool-methods", metavar="NAME[=SOURCE]", nargs="+", default=None,
                    help="keep only these methods of every run; NAME=SOURCE takes a run's method "
                         "SOURCE as NAME where it has one (as bench_adaptive.py --render-seeds)")
    args = ap.parse_args(argv)
    try:
        pool = parse_pool_methods(args.pool_methods) if args.pool_methods else None
        runs = load_runs(args.dirs, pool)
    except ValueError as exc:
        ap.error(str(exc))
    per_run = [(label, run_budgets(result, args.smoothed)) for label, result in runs]
    ruler = "smoothed target" if args.smoothed else "target"
    names = adaptive_names(per_run)
    summaries = ([(name, compare(per_run, name)) for name in names] if len(names) > 1
                 else [("Adaptive", compare(per_run))])
    summary = summaries[0][1]
    md = markdown(per_run, summaries, ruler)
    renamed = [f"**{name}** is `{taken}` in {run_name(src)}"
               for name, taken, src in renamed_arms([result for _, result in runs])]
    if renamed:
        md += "\nMethods taken under another name (`--pool-methods`): " + "; ".join(renamed) + ".\n"
    print(md)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(md)
    if args.plot and summary["pairs"]:
        plot(summary, args.plot, ruler)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
