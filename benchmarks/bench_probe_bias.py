"""Does a probe time a collective as a training step does? (diagnostic, root only)

    python benchmarks/bench_probe_bias.py                      # N=4, three networks, CR 0.1 / 0.01
    python benchmarks/bench_probe_bias.py --n 2 --latency-ms 10 --bandwidth inf --cr 0.1

Flexible's start-up probe times each collective kind alone (``probing.run_probes``); before the
broadcast fix (80f9ee7) its predictions of AR-Topk steps read about 1.2x the steps' measured
time in the acceptance grid
(``bench_flexible_grid.py``, "start-up prediction / measured steps"). This benchmark puts the two
side by side, collective by collective, in one job per network: ``--rounds`` times, a probe of
the allgather, broadcast and allreduce at exactly the sizes AG-Topk and AR-Topk send (``--repeats``
timings each), then ``--steps`` AG-Topk and ``--steps`` AR-Topk steps. Each timing is combined
over ranks as Flexible combines it (the minimum over ranks; a broadcast's delivered time, see
``sync.delivered_ms``), for the probe as ``run_probes`` reports it, for a step as the step's
payload delivers it. It prints, per cell and collective, the medians and their ratio
(probe / step), and writes ``probe_bias.json`` and ``probe_bias.md`` under ``--out``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import flexible_driver as drv  # noqa: E402

#: (kind, which path's steps time it, the index of its time in a step's timings)
COLLECTIVES = (("allgather", "ag_steps", 0), ("broadcast", "ar_steps", 0),
               ("allreduce", "ar_steps", 1))


def summarize(rec: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per collective kind of one cell record (see ``flexible_job.run_probe_bias``)."""
    rows = []
    for kind, steps_key, slot in COLLECTIVES:
        probe = [ms for k, _, ms in rec["probes"] if k == kind]
        step = [s[slot] for s in rec[steps_key]]
        p, s = statistics.median(probe), statistics.median(step)
        rows.append({"N": rec["N"], "network": rec["network"]["label"], "cr": rec["cr"],
                     "kind": kind, "bytes": rec["sizes"][kind], "probe_ms": p, "step_ms": s,
                     "ratio": p / s if s > 0 else float("nan"),
                     "probe_n": len(probe), "step_n": len(step)})
    return rows


def markdown(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [f"# Probe vs step, collective by collective ({meta['started']})", "",
             f"{meta['rounds']} rounds of: a probe of each kind ({meta['repeats']} timings), then "
             f"{meta['steps']} AG-Topk and {meta['steps']} AR-Topk steps; {meta['numel']} float32 "
             "entries. Medians of the timings combined over ranks (`sync.combine_timings`); "
             "ratio = probe / step.", "",
             "| N | network | cr | collective | bytes per rank | probe ms | step ms | ratio |",
             "|---|---|---|---|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['N']} | {r['network']} | {r['cr']:g} | {r['kind']} | {r['bytes']} | "
                     f"{r['probe_ms']:.1f} | {r['step_ms']:.1f} | {r['ratio']:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--latency-ms", type=float, nargs="+", default=[0.1, 1.0, 10.0])
    ap.add_argument("--bandwidth", type=drv.parse_rate, nargs="+", default=[100.0, 1000.0, None],
                    help="link rates in Mbit/s, or inf; paired with --latency-ms by position "
                         "(or one for all)")
    ap.add_argument("--cr", type=float, nargs="+", default=[0.1, 0.01])
    ap.add_argument("--numel", type=int, default=drv.RESNET18_NUMEL)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=2, help="timings per kind in each probe")
    ap.add_argument("--out", default=os.path.join(drv.REPO, "results", "probe_bias"))
    ap.add_argument("--timeout-s", type=float, default=1800.0)
    args = ap.parse_args(argv)
    networks = drv.paired_networks(ap, args.latency_ms, args.bandwidth)
    meta = {"started": time.strftime("%c"), "n": args.n, "numel": args.numel,
            "rounds": args.rounds, "steps": args.steps, "repeats": args.repeats,
            "networks": [n["label"] for n in networks], "crs": args.cr}
    plan = {"kind": "probe_bias", "numel": args.numel, "crs": args.cr, "rounds": args.rounds,
            "steps": args.steps, "repeats": args.repeats}
    t0 = time.perf_counter()
    records = drv.run_job(args.n, plan, networks, args.timeout_s,
                          on_line=lambda line: print(f"  {line}", flush=True))
    rows = [row for rec in records if rec.get("kind") == "probe_bias" for row in summarize(rec)]
    meta["elapsed_s"] = time.perf_counter() - t0
    drv.write_report(args.out, "probe_bias", {"meta": meta, "rows": rows, "records": records},
                     markdown(rows, meta))
    return 0


if __name__ == "__main__":
    sys.exit(main())
