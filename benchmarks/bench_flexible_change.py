"""Flexible on a network that changes mid-run: does it switch collective, and how fast? (root only)

    python benchmarks/bench_flexible_change.py                       # N=2, the default pair
    python benchmarks/bench_flexible_change.py --n 4 --cr 0.1 --steps 80 \\
        --phase 0 10 inf --phase 30 0.1 100                          # STEP LATENCY_MS RATE_MBIT|inf
    python benchmarks/bench_flexible_change.py --render results/flexible_change/change.json

One ``Flexible(cr)`` optimizer (one parameter of ``--numel`` float32 entries, ResNet-18's size by
default, whose ``.grad`` is refilled with standard-normal values each step) runs ``--steps`` steps
on the network emulator; before step ``STEP`` of each ``--phase`` the parent applies that phase's
link (every rank waits at that step boundary until it is in force, see ``flexible_driver.py``).
Recorded per step (rank 0): the collective used, Flexible's predicted ms of both paths, the
measured communication ms (each collective's own cost combined over ranks, what the model
predicts, and
rank 0's own time, which also holds its waits for the other ranks' top-k), the probing ms and the
link in force.

Acceptance (reported, not asserted): after each change, Flexible uses another collective within
20 steps (searched until the next change). A change after which the same path stays best needs
no switch; the report says which path was in use before and after. Also reported: what probing
cost (probe ms over the steps' wall ms), and, under ``reprobe_by="steps"`` (the default), what
the steps that re-measure the path not in use cost beyond the route's steps before them.

Writes ``change.json`` (per-step records + summary) and ``change.png`` (predicted vs measured time
and the chosen path over the steps, the changes marked) under ``--out`` (default
``results/flexible_change/``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from collections import Counter
from typing import Any, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import flexible_driver as drv  # noqa: E402

TARGET_STEPS = 20
#: Default schedule, from the grid at N=2, cr=0.1: 10 ms / unlimited (AG-Topk faster: one collective
#: instead of two at a high latency) -> 0.1 ms / 100 Mbit (AR-Topk faster) -> back.
DEFAULT_PHASES = [(0, 10.0, None), (30, 0.1, 100.0), (70, 10.0, None)]


def _next_change(step: int, changes: list[int]) -> Optional[int]:
    """The first change step after ``step`` (None: it is the last change)."""
    return min((x for x in changes if x > step), default=None)


def analyse(records: list[dict[str, Any]], changes: list[int]) -> list[dict[str, Any]]:
    """For each change step: the path in use before it and the first later step whose **route**
    is another path. An exploring step (``exploring`` in the record: Flexible tries the path it
    did not choose for a step or two after a probe, without switching) is not a switch; the
    first step on another path of any kind is reported too (``first_other_step``)."""
    steps = sorted((r for r in records if r.get("kind") == "step"), key=lambda r: r["step"])
    by_step = {r["step"]: r for r in steps}
    out = []
    for c in changes:
        if c == 0:
            continue
        before = by_step.get(c - 1, {}).get("collective")
        nxt = _next_change(c, changes)
        seg = [r for r in steps if c <= r["step"] < (math.inf if nxt is None else nxt)]
        switch = next((r["step"] for r in seg
                       if r["collective"] != before and not r.get("exploring")), None)
        first_other = next((r["step"] for r in seg if r["collective"] != before), None)
        after = [r["collective"] for r in seg]
        probes = [r["step"] for r in seg if r.get("probe_ms")]
        kinds = [r.get("probe_kind") for r in seg if r.get("probe_ms")]
        remeasures = [(r["step"], r["remeasure"]) for r in seg if r.get("remeasure")]
        out.append({
            "change_step": c, "network": by_step.get(c, {}).get("network"), "segment_steps": len(seg),
            "path_before": before, "switch_step": switch, "first_other_step": first_other,
            "steps_to_switch": None if switch is None else switch - c,
            "within_target": switch is not None and switch - c <= TARGET_STEPS,
            "paths_until_next_change": dict(Counter(after)), "probe_steps": probes,
            "probe_kinds": kinds, "remeasure_steps": remeasures,
        })
    return out


def plot(records: list[dict[str, Any]], changes: list[int], path: str, title: str,
         show_cr: bool = False) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = sorted((r for r in records if r.get("kind") == "step"), key=lambda r: r["step"])
    xs = [r["step"] for r in steps]
    if show_cr:
        fig, (ax1, ax2, ax3) = plt.subplots(3, 1, figsize=(12, 9), sharex=True,
                                            gridspec_kw={"height_ratios": [3, 1, 1.5]})
        ax3.step(xs, [r.get("cr") for r in steps], where="mid", color="tab:green")
        ax3.set_yscale("log")
        ax3.set_ylabel("CR in use")
        solves = [s for r in records if r.get("kind") == "solves" for s in r["solves"]]
        for s in solves:
            ax3.axvline(s["step"], color="0.6", lw=0.8, ls=":")
        ax3.set_xlabel("step (dotted: solves started)")
    else:
        fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(12, 7), sharex=True,
                                       gridspec_kw={"height_ratios": [3, 1]})
    axes = fig.axes  # every panel gets the change lines
    pa = [(r.get("predicted_ms") or {}).get("allgather", math.nan) for r in steps]
    pr = [(r.get("predicted_ms") or {}).get("allreduce", math.nan) for r in steps]
    ax1.plot(xs, pa, color="tab:blue", ls="--", lw=1.2, label="predicted AG-Topk")
    ax1.plot(xs, pr, color="tab:orange", ls="--", lw=1.2, label="predicted AR-Topk")
    # what the model predicts: each collective's own cost (net_ms); rank 0's own comm
    # time also holds its waits for the other ranks' top-k, drawn faint for comparison
    has_net = any(r.get("net_ms") is not None for r in steps)
    for coll, color, marker in (("allgather", "tab:blue", "o"), ("allreduce", "tab:orange", "^")):
        sel = [r for r in steps if r["collective"] == coll]
        if has_net:
            ax1.scatter([r["step"] for r in sel], [r["comm_ms"] for r in sel], color=color,
                        marker=marker, s=10, alpha=0.25, label=f"rank 0's comm ({coll})", zorder=2)
        ax1.scatter([r["step"] for r in sel], [r["net_ms"] if has_net else r["comm_ms"] for r in sel],
                    color=color, marker=marker, s=18, zorder=3,
                    label=f"measured ({coll}{', combined over ranks' if has_net else ''})")
    probes = [r for r in steps if r.get("probe_ms")]
    for r in probes:
        ax1.axvspan(r["step"] - 0.5, r["step"] + 0.5, color="0.85", zorder=0)
    for c in changes:
        if c:
            net = next((r["network"] for r in steps if r["step"] == c), None) or {}
            for ax in axes:
                ax.axvline(c - 0.5, color="red", lw=1.5)
            ax1.annotate(f"-> {net.get('label', '?')}", (c - 0.5, 1.0), xycoords=("data", "axes fraction"),
                         color="red", ha="left", va="top", fontsize=9)
    ax1.set_yscale("log")
    ax1.set_ylabel("comm ms per step")
    ax1.legend(fontsize=8, loc="upper left", bbox_to_anchor=(0.0, 0.93))
    ax1.set_title(title + ("  (grey: probing steps)" if probes else ""))
    ax2.step(xs, [1 if r["collective"] == "allreduce" else 0 for r in steps], where="mid",
             color="black")
    ax2.set_yticks([0, 1])
    ax2.set_yticklabels(["AG-Topk", "AR-Topk"])
    ax2.set_ylim(-0.3, 1.3)
    if not show_cr:
        ax2.set_xlabel("step")
    ax2.set_ylabel("path")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_outputs(out: str, records: list[dict[str, Any]],
                  meta: dict[str, Any]) -> tuple[list[dict], Optional[list[dict]]]:
    """Write ``change.json`` and ``change.png``; (path analysis, CR analysis or None)."""
    os.makedirs(out, exist_ok=True)
    changes = meta["change_steps"]
    result = analyse(records, changes)
    cr_result = analyse_cr(records, changes, meta) if meta.get("adaptive_options") else None
    with open(os.path.join(out, "change.json"), "w") as fh:
        json.dump({"meta": meta, "changes": result, "cr_changes": cr_result,
                   "probe_share": probe_share([r for r in records if r.get("kind") == "step"]),
                   "records": records}, fh, indent=1)
    if any(r.get("kind") == "step" for r in records):
        plot(records, changes, os.path.join(out, "change.png"),
             f"{_mode_name(meta)}, N={meta['n']}, {meta['numel']} entries",
             show_cr=cr_result is not None)
    return result, cr_result


def _mode_name(meta: dict[str, Any]) -> str:
    if meta.get("adaptive_options"):
        return f"Adaptive(starting cr={meta['cr']:g})"
    by = (meta.get("flex_options") or {}).get("reprobe_by")
    return f"Flexible(cr={meta['cr']:g}" + (f", reprobe_by={by!r})" if by else ")")


def _crossover_in_range(paths: list[str]) -> bool:
    """Whether the cheaper path differs between candidate CRs (the time curve has a kink)."""
    return len(set(paths)) > 1


def analyse_cr(records: list[dict[str, Any]], changes: list[int],
               meta: dict[str, Any]) -> list[dict[str, Any]]:
    """Adaptive only. For each change: the CR in use before it and at the end of its segment,
    the first re-solve after it whose reason is the recalibrated network model (after the
    change's first drift probe where there is one: a recalibration that a span closed just
    before the change can trigger a solve at the change step itself, on the old network's
    times), the cheaper path
    per candidate CR in that solve and in the solve before the change, and a counterfactual: the
    CR the solver picks from the **old** network's predicted times (and the old solve's time
    outside communication, which the job's own barrier and timing collectives make network-bound
    too) with the **new** gains (the same solver and settings, deterministic), so that the part
    of the CR change due to the network is told apart from the part due to the gains."""
    from benchmarks.jobctl import flexible_mode
    from hvd_flexcomm.moo import solve_cr

    mode = flexible_mode(meta, meta["cr"])
    steps = {r["step"]: r for r in records if r.get("kind") == "step"}
    solves = [s for r in records if r.get("kind") == "solves" for s in r["solves"]]
    out = []
    for c in changes:
        if c == 0:
            continue
        nxt = _next_change(c, changes)
        end = (max(steps, default=c) + 1 if nxt is None else nxt) - 1
        before = [s for s in solves if s["step"] < c]
        # the recalibration for this change follows its drift probe: a solve at the change step
        # (or before that probe) was triggered by a recalibration on the old network
        drift = next((i for i in range(c, end + 1)
                      if steps.get(i, {}).get("probe_ms") and steps[i].get("probe_kind") == "drift"),
                     c)
        after = [s for s in solves if drift < s["step"] <= end
                 and s["reason"] == "network model recalibrated"]
        prev, new = (before[-1] if before else None), (after[0] if after else None)
        row: dict[str, Any] = {
            "change_step": c, "cr_before": steps.get(c - 1, {}).get("cr"),
            "cr_end": steps.get(end, {}).get("cr"),
            "first_cr_change_step": next((s for s in range(c, end + 1) if s in steps and s - 1 in steps
                                          and steps[s]["cr"] != steps[s - 1]["cr"]), None),
            "resolve_step": None if new is None else new["step"],
            "paths_before": None if prev is None else prev["paths"],
            "paths_after": None if new is None else new["paths"],
            "solved_before": None if prev is None else prev["cr"],
            "solved_after": None if new is None else new["cr"],
            "other_ms_before": None if prev is None else prev.get("other_ms"),
            "other_ms_after": None if new is None else new.get("other_ms"),
            "comm_ms_before": None if prev is None else prev["comm_ms"],
            "comm_ms_after": None if new is None else new["comm_ms"],
        }
        if prev is not None and new is not None:
            old_curve = solve_cr(new["crs"], prev["comm_ms"], new["gains"], mode.c_low, mode.c_high,
                                 mode.weights, mode.pop_size, mode.n_gen,
                                 other_ms=prev.get("other_ms"))
            row["solved_with_old_times"] = old_curve.cr
            row["network_moved_pick"] = abs(new["cr"] - old_curve.cr) / old_curve.cr
        out.append(row)
    return out


def report_cr(rows: list[dict[str, Any]]) -> list[str]:
    lines = []
    for r in rows:
        if r["resolve_step"] is None:
            lines.append(f"- change at step {r['change_step']}: no re-solve for the recalibrated "
                         f"network before the next change; CR {r['cr_before']} -> {r['cr_end']}")
            continue
        kink = _crossover_in_range(r["paths_after"])
        line = (f"- change at step {r['change_step']}: re-solve at step {r['resolve_step']} "
                f"(network model recalibrated); cheaper path per candidate before "
                f"{r['paths_before']}, after {r['paths_after']} (AG/AR crossover inside the "
                f"candidates: {'yes' if kink else 'no'}); solved CR {r['solved_before']:.4g} -> "
                f"{r['solved_after']:.4g}; CR in use {r['cr_before']} -> {r['cr_end']} (first "
                f"changed at step {r['first_cr_change_step']})")
        if r.get("other_ms_after") is not None and r.get("other_ms_before") is not None:
            line += (f"; time outside communication per step {r['other_ms_before']:.1f} -> "
                     f"{r['other_ms_after']:.1f} ms")
        if "solved_with_old_times" in r:
            line += (f"; with the old network's times and the new gains the solver picks "
                     f"{r['solved_with_old_times']:.4g}: the network moved the pick by "
                     f"{100 * r['network_moved_pick']:.0f}%")
        lines.append(line)
    return lines


def _remeasured(seg: dict[str, Any]) -> str:
    """"; re-measuring on real steps S (why), ..." where the path not in use ran for that."""
    steps = seg.get("remeasure_steps") or []
    if not steps:
        return ""
    return "; re-measuring on real steps " + ", ".join(f"{s} ({why})" for s, why in steps)


def _explored(seg: dict[str, Any]) -> str:
    """", exploring from step S" where an exploring step ran another path before the switch."""
    first, switch = seg.get("first_other_step"), seg["switch_step"]
    if first is None or first == switch:
        return ""
    return f", exploring the other path from step {first}"


def report(result: list[dict[str, Any]], records: list[dict[str, Any]]) -> list[str]:
    lines = []
    steps = [r for r in records if r.get("kind") == "step"]
    for seg in result:
        net = (seg["network"] or {}).get("label", "?")
        if seg["switch_step"] is None:
            lines.append(f"- change at step {seg['change_step']} (-> {net}): the route stays on "
                         f"{seg['path_before']} until the next change or the end (no switch; "
                         f"target <= {TARGET_STEPS}: NOT met){_explored(seg)}; paths: "
                         f"{seg['paths_until_next_change']}; probing at steps {_probes(seg)}"
                         f"{_remeasured(seg)}")
        else:
            lines.append(f"- change at step {seg['change_step']} (-> {net}): {seg['path_before']} -> "
                         f"another path at step {seg['switch_step']} ({seg['steps_to_switch']} steps; "
                         f"target <= {TARGET_STEPS}: {'met' if seg['within_target'] else 'NOT met'})"
                         f"{_explored(seg)}; paths until the next change: "
                         f"{seg['paths_until_next_change']}; probing at steps {_probes(seg)}"
                         f"{_remeasured(seg)}")
    lines.append(f"- steps recorded: {len(steps)}; probing steps overall: "
                 f"{[r['step'] for r in steps if r.get('probe_ms')]}")
    share = probe_share(steps)
    if share is not None:
        lines.append(f"- probing: {share['probe_ms']:.0f} ms of {share['wall_ms']:.0f} ms of steps "
                     f"({100 * share['share']:.1f}%; without the start-up probe "
                     f"{100 * share['share_after_start']:.1f}%)")
        if share["remeasure_steps"]:
            lines.append(
                f"- re-measuring on real steps ({share['remeasure_steps']} steps): "
                f"{share['remeasure_extra_ms']:+.0f} ms against the route's steps before them "
                f"({100 * share['remeasure_share']:+.1f}% of the steps' time); probing and "
                f"re-measuring without the start-up probe: "
                f"{100 * share['share_after_start_all']:.1f}%")
    return lines


def _probes(seg: dict[str, Any]) -> str:
    """A segment's probing steps, each with its probe's kind where recorded (full, drift,
    refresh)."""
    kinds = seg.get("probe_kinds") or [None] * len(seg["probe_steps"])
    return "[" + ", ".join(str(s) if k is None else f"{s} ({k})"
                           for s, k in zip(seg["probe_steps"], kinds)) + "]"


def remeasure_extra_ms(steps: list[dict[str, Any]], before: int = 3) -> tuple[int, float]:
    """``(n, ms)``: the re-measuring steps (``remeasure`` in the record: the path not in use run
    on a real step after drift or as a refresh) and what they cost beyond the route: each one's
    wall ms minus the median wall ms of the last ``before`` steps before it on the same link that
    were route steps (not exploring, not cold, no probe). Negative where the path re-measured
    was the faster one. A step with no such steps before it is left out."""
    ordered = sorted(steps, key=lambda r: r["step"])
    n, extra = 0, 0.0
    for i, r in enumerate(ordered):
        if not r.get("remeasure"):
            continue
        link = (r.get("network") or {}).get("index")
        route = [x["wall_ms"] for x in ordered[:i]
                 if not (x.get("exploring") or x.get("cold") or x.get("probe_ms"))
                 and (x.get("network") or {}).get("index") == link][-before:]
        if route:
            n += 1
            extra += r["wall_ms"] - statistics.median(route)
    return n, extra


def probe_share(steps: list[dict[str, Any]]) -> Optional[dict[str, float]]:
    """Probing ms / rank 0's ``opt.step()`` wall ms summed over the steps (fractions), overall and
    without the first step's (start-up) probe; and the re-measuring steps' extra ms
    (:func:`remeasure_extra_ms`), alone and with the probing after start-up."""
    wall = sum(r.get("wall_ms") or 0.0 for r in steps)
    if not steps or wall <= 0:
        return None
    probe = sum(r.get("probe_ms") or 0.0 for r in steps)
    first = min(steps, key=lambda r: r["step"]).get("probe_ms") or 0.0
    n_re, extra = remeasure_extra_ms(steps)
    return {"probe_ms": probe, "wall_ms": wall, "share": probe / wall,
            "share_after_start": (probe - first) / wall, "remeasure_steps": n_re,
            "remeasure_extra_ms": extra, "remeasure_share": extra / wall,
            "share_after_start_all": (probe - first + max(extra, 0.0)) / wall}


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=2)
    ap.add_argument("--numel", type=int, default=drv.RESNET18_NUMEL)
    ap.add_argument("--cr", type=float, default=0.1)
    ap.add_argument("--steps", type=int, default=110)
    ap.add_argument("--phase", nargs=3, action="append", metavar=("STEP", "LATENCY_MS", "RATE_MBIT"),
                    help="from STEP on, this link (repeat; the first must be step 0)")
    ap.add_argument("--hysteresis", type=float, help="Flexible option (default: the package's)")
    ap.add_argument("--drift-patience", type=int, help="Flexible option")
    ap.add_argument("--reprobe-interval", type=int, help="Flexible option")
    ap.add_argument("--reprobe-by", choices=("steps", "probes"),
                    help="Flexible option: re-measure the path not in use on real steps or by "
                         "timed probes (default: the package's)")
    ap.add_argument("--no-barrier", action="store_true", help="no untimed barrier before each step")
    ap.add_argument("--adaptive", action="store_true",
                    help="run Adaptive (starting at --cr) instead of Flexible(cr); see the options below")
    ap.add_argument("--min-interval", type=int, default=10,
                    help="Adaptive option: steps between solves (default 10)")
    ap.add_argument("--gain-threshold", type=float, default=0.9,
                    help="Adaptive option (default 0.9: gains re-solve only when one moved by 90%%, "
                         "so the re-solves after a change are the network's)")
    ap.add_argument("--out", default=os.path.join(drv.REPO, "results", "flexible_change"))
    ap.add_argument("--timeout-s", type=float, default=3000.0)
    ap.add_argument("--render", metavar="JSON", help="only re-render a change.json")
    args = ap.parse_args(argv)

    if args.render:
        with open(args.render) as fh:
            data = json.load(fh)
        result, cr_result = write_outputs(args.out, data["records"], data["meta"])
        print("\n".join(report(result, data["records"])))
        if cr_result is not None:
            print("\n".join(report_cr(cr_result)))
        return 0

    phases = ([(int(s), float(d), drv.parse_rate(b)) for s, d, b in args.phase] if args.phase
              else DEFAULT_PHASES)
    phases.sort()
    if phases[0][0] != 0:
        ap.error("the first --phase must start at step 0")
    networks = [drv.network(d, b) for _, d, b in phases]
    changes = [s for s, _, _ in phases]
    flex_options = {k: v for k, v in (("hysteresis", args.hysteresis),
                                      ("drift_patience", args.drift_patience),
                                      ("reprobe_interval", args.reprobe_interval),
                                      ("reprobe_by", args.reprobe_by)) if v is not None}
    adaptive_options = ({"min_interval": args.min_interval, "gain_threshold": args.gain_threshold,
                         "min_cr_change": 0.0, "min_tta_gain": 0.0} if args.adaptive else None)
    plan = {"kind": "change", "numel": args.numel, "cr": args.cr, "steps": args.steps,
            "changes": [[s, i] for i, s in enumerate(changes)], "flex_options": flex_options,
            "adaptive_options": adaptive_options, "barrier": not args.no_barrier}
    meta = {"n": args.n, "numel": args.numel, "cr": args.cr, "steps": args.steps,
            "phases": [{"step": s, **net} for s, net in zip(changes, networks)],
            "change_steps": changes, "flex_options": flex_options,
            "adaptive_options": adaptive_options, "barrier": not args.no_barrier,
            "started": time.strftime("%c")}
    print(f"{_mode_name(meta)} change: N={args.n}, {args.numel} entries, {args.steps} steps; "
          + ", ".join(f"step {s}: {net['label']}" for s, net in zip(changes, networks)), flush=True)
    t0 = time.perf_counter()
    failure = None
    try:
        records = drv.run_job(args.n, plan, networks, args.timeout_s,
                              on_line=lambda line: print(f"  {line}", flush=True))
    except drv.JobError as exc:
        records, failure = exc.records, str(exc)
        print(f"job FAILED: {exc}", flush=True)
    meta["elapsed_s"] = time.perf_counter() - t0
    meta["failure"] = failure
    result, cr_result = write_outputs(args.out, records, meta)
    print(f"\nwrote {args.out}/change.json, change.png ({meta['elapsed_s']:.0f} s)")
    print("\n".join(report(result, records)))
    if cr_result is not None:
        print("\n".join(report_cr(cr_result)))
    return 1 if failure else 0


if __name__ == "__main__":
    sys.exit(main())
