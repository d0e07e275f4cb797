"""Where Adaptive's start-up probe spends its time, phase by phase (diagnostic, root only)

    python benchmarks/bench_probe_phases.py                     # N=4: 25 ms one way, then 5 ms / 100 Mbit/s
    python benchmarks/bench_probe_phases.py --n 2 --latency-ms 1 --bandwidth inf --rounds 2

Before step 0, ``Adaptive()`` calibrates its cost model with a probe (``probing.py``): one
untimed warm-up round (every op of the plan in flight at once, so that Horovod negotiates the new
names together), the timed ops one at a time (each sparse path at two sizes: the allgather alone,
AR-Topk's index broadcast followed by its value allreduce), and one allgather that combines the
timings over ranks (with rank 0's gains for the first pick in its row). No training happens
meanwhile, so on a latency-bound link, where every Horovod op costs several round trips whatever
its size, the probe is the largest part of Adaptive's start. This benchmark runs that probe
(``Adaptive(**options)``'s plan for ``--numel`` float32 entries) ``--rounds`` times per network
under names new to Horovod each round, as at a job's start, and reports per network the median
of rank 0's wall time per phase (``probing.PHASES``) and the medians of the timed ops by path
(each timing combined over ranks as the cost model learns it). Writes ``probe_phases.json`` and
``probe_phases.md`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import flexible_driver as drv  # noqa: E402

#: The gradient entries of ``bench_adaptive.py``'s model (the MLP of 768 x 2 hidden units on
#: Fashion-MNIST), the size the start-up probes of its runs were planned for.
ADAPTIVE_MLP_NUMEL = 1_201_162

#: Which path each probed collective kind serves.
PATH_OF_KIND = {"allgather": "AG-Topk", "broadcast": "AR-Topk", "allreduce": "AR-Topk"}


def summarize(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per network: the rounds' medians (ms) of rank 0's time in all and per phase, and
    of the sum of each path's timed ops (combined over ranks), in network order."""
    by_net: dict[str, list[dict[str, Any]]] = {}
    for rec in records:
        if rec.get("kind") == "probe_phases":
            by_net.setdefault(rec["network"]["label"], []).append(rec)
    rows = []
    for label, recs in by_net.items():
        row: dict[str, Any] = {"network": label, "N": recs[0]["N"], "rounds": len(recs),
                               "total_ms": statistics.median(r["total_ms"] for r in recs)}
        for phase in recs[0]["phases_ms"]:
            row[phase + "_ms"] = statistics.median(r["phases_ms"][phase] for r in recs)
        for path in sorted(set(PATH_OF_KIND.values())):
            row[path] = statistics.median(sum(ms for kind, _, ms in r["timings"]
                                              if PATH_OF_KIND[kind] == path) for r in recs)
        row["ops"] = len(recs[0]["timings"])
        rows.append(row)
    return rows


def markdown(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [f"# Adaptive's start-up probe, phase by phase ({meta['started']})", "",
             f"N = {meta['n']}, {meta['numel']} float32 entries, `Adaptive({meta['options']})`'s "
             f"start-up plan, {meta['rounds']} rounds per network under new names. Medians over "
             "the rounds of rank 0's wall time (ms): in all, the warm-up round, the timed ops, "
             "the allgather that combines the timings; then the timed ops of each path as the "
             "cost model learns them (combined over ranks, so they sum to less than rank 0's "
             "timed phase).", "",
             "| network | probe ms | warm-up | timed | combine | timed ops | AG-Topk ops ms "
             "| AR-Topk ops ms |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['network']} | {r['total_ms']:.0f} | {r['warm_up_ms']:.0f} | "
                     f"{r['timed_ms']:.0f} | {r['combine_ms']:.0f} | {r['ops']} | "
                     f"{r['AG-Topk']:.0f} | {r['AR-Topk']:.0f} |")
    return "\n".join(lines) + "\n"


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--latency-ms", type=float, nargs="+", default=[25.0, 5.0])
    ap.add_argument("--bandwidth", type=drv.parse_rate, nargs="+", default=[None, 100.0],
                    help="link rates in Mbit/s, or inf; paired with --latency-ms by position "
                         "(or one for all)")
    ap.add_argument("--numel", type=int, default=ADAPTIVE_MLP_NUMEL)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--options", default="{}",
                    help="Adaptive's options as JSON (e.g. '{\"probe_top_cr\": 0.1}')")
    ap.add_argument("--out", default=os.path.join(drv.REPO, "results", "probe_phases"))
    ap.add_argument("--timeout-s", type=float, default=900.0)
    args = ap.parse_args(argv)
    options = json.loads(args.options)
    if not isinstance(options, dict):
        ap.error(f"--options must be a JSON object, got {args.options!r}")
    networks = drv.paired_networks(ap, args.latency_ms, args.bandwidth)
    meta = {"started": time.strftime("%c"), "n": args.n, "numel": args.numel,
            "rounds": args.rounds, "networks": [n["label"] for n in networks],
            "options": ", ".join(f"{k}={v!r}" for k, v in options.items())}
    plan = {"kind": "probe_phases", "numel": args.numel, "rounds": args.rounds,
            "adaptive_options": options, "pool": 1}
    t0 = time.perf_counter()
    records = drv.run_job(args.n, plan, networks, args.timeout_s,
                          on_line=lambda line: print(f"  {line}", flush=True))
    rows = summarize(records)
    meta["elapsed_s"] = time.perf_counter() - t0
    drv.write_report(args.out, "probe_phases", {"meta": meta, "rows": rows, "records": records},
                     markdown(rows, meta))
    return 0


if __name__ == "__main__":
    sys.exit(main())
