"""A burst of slow steps on a steady link: does Adaptive take it for a network change? (root only)

    python benchmarks/bench_drift_burst.py                     # N=4: 5 ms / 100 Mbit/s, 6 steps at 25 ms
    python benchmarks/bench_drift_burst.py --n 2 --numel 200000 --steps 60 --burst-at 25

``Adaptive``'s drift detector fires after ``drift_patience`` steps off the model (5 by default).
A drift probe then re-anchors the path in use on those steps and the spans after it refit its
line, so a burst that passes the detector moves the whole time curve the solver reads
(``Adaptive.drift_confirm``, ``docs/performance/adaptive_status.md``). This benchmark makes such
a burst on purpose: one ``Adaptive(cr=--cr)`` optimizer (the ``change`` job of
``flexible_job.py``: one parameter of ``--numel`` float32 entries, its ``.grad`` refilled with
standard-normal values each step) runs ``--steps`` steps on ``--link``; before step
``--burst-at`` the emulator switches to ``--burst`` for ``--burst-steps`` steps, then back. The
same run once per ``--confirm`` value (``Adaptive(drift_confirm=...)``), on a fresh emulator
each; ``--options`` (JSON) sets Adaptive's other options. Reported per arm: the drift probes
and the drifts not confirmed, the CR in use from the burst on (span steps aside), the predicted
communication at the candidates' ends in the last solve before the burst and the last one of
the run, and the steps' communication after the burst (each collective's own cost, combined
over ranks: rank 0's median ms per route step from ``--settle`` steps after the burst to the
end, probe and span steps aside), as a ratio to the first arm's. Writes ``drift_burst.json``,
``drift_burst.md`` and ``drift_burst.png`` (the CR in use and each step's communication per
arm, the burst shaded) under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections import Counter
from typing import Any, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import flexible_driver as drv  # noqa: E402
from bench_probe_phases import ADAPTIVE_MLP_NUMEL  # noqa: E402


def _steps(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted((r for r in records if r.get("kind") == "step"), key=lambda r: r["step"])


def _drift_probe_steps(steps: list[dict[str, Any]]) -> list[int]:
    """The steps (of :func:`_steps`) before which a drift probe ran."""
    return [r["step"] for r in steps if r.get("probe_ms") and r.get("probe_kind") == "drift"]


def _ends(solve: Optional[dict[str, Any]]) -> Optional[dict[str, float]]:
    """A solve's predicted communication (ms) at the lowest and highest candidate CR."""
    if solve is None:
        return None
    pairs = sorted(zip(solve["crs"], solve["comm_ms"]))
    return {"c_low": pairs[0][1], "c_high": pairs[-1][1]}


def summarize_arm(records: list[dict[str, Any]], burst_at: int, burst_steps: int,
                  settle: int) -> dict[str, Any]:
    """One arm's numbers (see the module docstring); ``after_ms`` is None when no step lies
    ``settle`` steps or more after the burst."""
    every_step = _steps(records)
    steps = [r for r in every_step if not r.get("span")]  # the route's steps
    solves = [s for r in records if r.get("kind") == "solves" for s in r["solves"]]
    counters = next((r for r in records if r.get("kind") == "controller"), {})
    end = burst_at + burst_steps
    after = [r["net_ms"] for r in steps if r["step"] >= end + settle and r.get("net_ms") is not None
             and not r.get("probe_ms")]
    before = [s for s in solves if s["step"] < burst_at]
    cr_changes = []
    for prev, cur in zip(steps, steps[1:]):
        if cur.get("cr") != prev.get("cr"):
            cr_changes.append([cur["step"], cur.get("cr")])
    return {
        "steps": len(steps),
        "drift_probe_steps": _drift_probe_steps(every_step),
        "n_drift_probes": counters.get("n_drift_probes"),
        "n_drift_unconfirmed": counters.get("n_drift_unconfirmed"),
        "cr_before_burst": next((r.get("cr") for r in reversed(steps) if r["step"] < burst_at), None),
        "cr_end": steps[-1].get("cr") if steps else None,
        "cr_changes_after_burst": [c for c in cr_changes if c[0] >= burst_at],
        "solve_before_burst": _ends(before[-1] if before else None),
        "last_solve": _ends(solves[-1] if solves else None),
        "last_solve_step": solves[-1]["step"] if solves else None,
        "paths_after_burst": dict(Counter(r["collective"] for r in steps if r["step"] >= end)),
        "after_ms": statistics.median(after) if after else None,
        "after_steps": len(after),
    }


def markdown(meta: dict[str, Any], arms: dict[str, dict[str, Any]]) -> str:
    """The report: one row per arm, ratios against the first arm."""
    first = next(iter(arms.values()))

    def fmt_ends(ends: Optional[dict[str, float]]) -> str:
        return "-" if ends is None else f"{ends['c_low']:.0f} / {ends['c_high']:.0f}"

    lines = [
        "# A burst of slow steps on a steady link: Adaptive's drift detector", "",
        f"N = {meta['n']}, {meta['numel']} float32 entries, `Adaptive(cr={meta['cr']:g}, "
        + "".join(f"{k}={v!r}, " for k, v in meta.get("options", {}).items())
        + "drift_confirm=...)`, " + f"{meta['steps']} steps on {meta['link']['label']}; steps "
        f"{meta['burst_at']}–{meta['burst_at'] + meta['burst_steps'] - 1} on "
        f"{meta['burst']['label']} (the burst). Communication after the burst: rank 0's median "
        f"ms per step (each collective's own cost, combined over ranks) from step "
        f"{meta['burst_at'] + meta['burst_steps'] + meta['settle']} on, probe steps left out.",
        "",
        "| drift_confirm | drift probes (steps) | drifts not confirmed | CR before the burst → "
        "at the end | CR changes from the burst on (step, CR) | route steps after the burst, "
        "by path | predicted ms at c_low / c_high: last solve before the burst; last solve "
        f"(step) | comm after the burst (ms) | vs drift_confirm={next(iter(arms))} |",
        "|---:|---|---:|---|---|---|---|---:|---:|",
    ]
    for name, arm in arms.items():
        ratio = ("-" if arm["after_ms"] is None or not first["after_ms"]
                 else f"{arm['after_ms'] / first['after_ms']:.2f}")
        after = "-" if arm["after_ms"] is None else f"{arm['after_ms']:.1f}"
        lines.append(
            f"| {name} | {arm['n_drift_probes']} ({', '.join(map(str, arm['drift_probe_steps'])) or '-'})"
            f" | {arm['n_drift_unconfirmed']} | {arm['cr_before_burst']} → {arm['cr_end']} | "
            f"{arm['cr_changes_after_burst'] or '-'} | "
            + (", ".join(f"{p} {n}" for p, n in sorted(arm["paths_after_burst"].items())) or "-")
            + f" | {fmt_ends(arm['solve_before_burst'])}; "
            f"{fmt_ends(arm['last_solve'])} ({arm['last_solve_step']}) | {after} | {ratio} |")
    lines += ["", f"Run {meta['started']}, {meta['elapsed_s']:.0f} s."]
    return "\n".join(lines) + "\n"


def plot(runs: dict[str, list[dict[str, Any]]], meta: dict[str, Any], path: str) -> None:
    """Per arm, each step's communication (combined over ranks) and the CR in use; the burst
    shaded, drift probes marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(11, 7), sharex=True,
                                   gridspec_kw={"height_ratios": [2, 1]})
    for (name, records), color in zip(runs.items(), ("tab:green", "tab:red", "tab:blue")):
        steps = _steps(records)
        xs = [r["step"] for r in steps]
        ax1.plot(xs, [r.get("net_ms") for r in steps], color=color, lw=1, marker=".",
                 label=f"drift_confirm={name}")
        ax2.step(xs, [r.get("cr") for r in steps], where="mid", color=color,
                 label=f"drift_confirm={name}")
        for step in _drift_probe_steps(steps):
            ax1.axvline(step, color=color, ls=":", lw=1.2)
    for ax in (ax1, ax2):
        ax.axvspan(meta["burst_at"] - 0.5, meta["burst_at"] + meta["burst_steps"] - 0.5,
                   color="0.9", zorder=0)
    ax1.set_yscale("log")
    ax1.set_ylabel("communication per step (ms)")
    ax1.legend(fontsize=8)
    ax1.set_title(f"Adaptive, N={meta['n']}: {meta['link']['label']}, burst of "
                  f"{meta['burst_steps']} steps on {meta['burst']['label']} (shaded); "
                  "dotted: drift probes", fontsize=9)
    ax2.set_yscale("log")
    ax2.set_ylabel("CR in use")
    ax2.set_xlabel("step")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--numel", type=int, default=ADAPTIVE_MLP_NUMEL)
    ap.add_argument("--cr", type=float, default=0.02, help="Adaptive's CR until its first solve")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--link", nargs=2, default=["5", "100"], metavar=("LATENCY_MS", "RATE_MBIT"),
                    help="the steady link (RATE_MBIT may be inf)")
    ap.add_argument("--burst", nargs=2, default=["25", "inf"], metavar=("LATENCY_MS", "RATE_MBIT"),
                    help="the link during the burst")
    ap.add_argument("--burst-at", type=int, default=40, help="the burst's first step")
    ap.add_argument("--burst-steps", type=int, default=6)
    ap.add_argument("--settle", type=int, default=10,
                    help="steps after the burst before its after-effects are measured")
    ap.add_argument("--confirm", type=int, nargs="+", default=[3, 0],
                    help="the drift_confirm of each arm (the first is the ratios' baseline)")
    ap.add_argument("--options", default="{}",
                    help="Adaptive's other options as JSON (e.g. '{\"weights\": [0.8, 0.2]}')")
    ap.add_argument("--out", default=os.path.join(drv.REPO, "results", "drift_burst"))
    ap.add_argument("--timeout-s", type=float, default=1200.0)
    args = ap.parse_args(argv)
    end = args.burst_at + args.burst_steps
    options = json.loads(args.options)
    if not isinstance(options, dict) or "drift_confirm" in options:
        ap.error(f"--options must be a JSON object without drift_confirm (--confirm sets it), "
                 f"got {args.options!r}")
    if args.burst_steps < 1 or any(c < 0 for c in args.confirm):
        ap.error(f"need --burst-steps >= 1 and every --confirm >= 0, got {args.burst_steps} and "
                 f"{args.confirm}")
    if not (0 < args.burst_at and end < args.steps):
        ap.error(f"the burst (steps {args.burst_at}..{end - 1}) must lie inside the run's "
                 f"{args.steps} steps, after step 0 and before the last")
    link = drv.network(float(args.link[0]), drv.parse_rate(args.link[1]))
    burst = drv.network(float(args.burst[0]), drv.parse_rate(args.burst[1]))
    meta = {"n": args.n, "numel": args.numel, "cr": args.cr, "steps": args.steps, "link": link,
            "burst": burst, "burst_at": args.burst_at, "burst_steps": args.burst_steps,
            "settle": args.settle, "confirm": args.confirm, "options": options,
            "started": time.strftime("%c")}
    print(f"drift burst: N={args.n}, {args.numel} entries, {args.steps} steps on {link['label']}, "
          f"steps {args.burst_at}-{end - 1} on {burst['label']}; drift_confirm {args.confirm}",
          flush=True)
    t0 = time.perf_counter()
    runs: dict[str, list[dict[str, Any]]] = {}
    failures = []
    for confirm in args.confirm:
        plan = {"kind": "change", "numel": args.numel, "cr": args.cr, "steps": args.steps,
                "changes": [[0, 0], [args.burst_at, 1], [end, 2]],
                "flex_options": {"drift_confirm": confirm}, "adaptive_options": options,
                "barrier": True}
        try:
            records = drv.run_job(args.n, plan, [link, burst, link], args.timeout_s,
                                  on_line=lambda line: print(f"  {line}", flush=True))
        except drv.JobError as exc:
            records = exc.records
            failures.append(f"drift_confirm={confirm}: {exc}")
            print(f"job FAILED: {exc}", flush=True)
        runs[str(confirm)] = records
    meta["elapsed_s"] = time.perf_counter() - t0
    meta["failures"] = failures
    arms = {name: summarize_arm(records, args.burst_at, args.burst_steps, args.settle)
            for name, records in runs.items()}
    drv.write_report(args.out, "drift_burst", {"meta": meta, "arms": arms, "runs": runs},
                     markdown(meta, arms))
    if any(_steps(r) for r in runs.values()):
        plot(runs, meta, os.path.join(args.out, "drift_burst.png"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
