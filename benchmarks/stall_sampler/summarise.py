"""Summarise the logs of ``sitecustomize.py`` (this directory): the waits outside collectives.

    python benchmarks/stall_sampler/summarise.py LOG_DIR [--min-ms 700] [--procmon OUT.jsonl]

Prints every ``starved`` event and every ``held`` event of at least ``--min-ms`` whose stack lies
in a training step (it passes through the job's ``run_method``) and does not end in Horovod's
wait or hvd_flexcomm's polling one (a rank waiting in a collective waits for another rank or
the network, not for itself), with its rank, time and innermost frames; then counts by innermost
function. With ``--procmon`` (the output of ``procmon.py``, recorded meanwhile): for each such held event of
at least 1 s, the CPU ticks (1/100 s) each rank's busiest thread used during it, and the
machine's idle ticks.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import sys
from collections import Counter
from typing import Optional

EVENT = re.compile(r"^(held|starved) (\d+\.\d+) ms=(\d+)")
FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')
#: A stack in a collective's wait: Horovod's loop, or hvd_flexcomm's polling one (waiting.py).
WAITS = ("horovod_torch_wait_and_clear", "hvd_flexcomm/waiting.py")


def read_events(log_dir: str) -> list[dict]:
    """Every held/starved event of every ``r<rank>_<pid>.log`` in ``log_dir``, in time order:
    ``{"rank", "kind", "t", "ms", "frames": [(file, line, function), ...], "text"}``."""
    events = []
    for path in glob.glob(os.path.join(log_dir, "r*_*.log")):
        rank = os.path.basename(path)[1:].split("_")[0]
        with open(path) as fh:
            lines = fh.read().splitlines()
        for i, line in enumerate(lines):
            m = EVENT.match(line)
            if not m:
                continue
            stack = []
            for nxt in lines[i + 1:]:
                if not nxt.startswith("  "):
                    break
                stack.append(nxt)
            frames = [(f, int(n), fn) for f, n, fn in FRAME.findall("\n".join(stack))]
            events.append({"rank": rank, "kind": m.group(1), "t": float(m.group(2)),
                           "ms": int(m.group(3)), "frames": frames, "text": "\n".join(stack)})
    return sorted(events, key=lambda e: e["t"])


def in_step_outside_collectives(event: dict) -> bool:
    """A held event in a training step, not in a collective's wait (:data:`WAITS`)."""
    text = event["text"]
    return ("run_method" in text and not any(w in text for w in WAITS)
            and "horovod_init" not in text)


def cpu_during(rows: list[dict], t0: float, t1: float) -> Optional[str]:
    """Per rank, the ticks its busiest thread used between ``t0`` and ``t1`` (unix s), and the
    machine's idle ticks, from ``procmon.py`` rows; None without two rows in the window."""
    win = [r for r in rows if t0 <= r["t"] <= t1]
    if len(win) < 2:
        return None
    a, b = win[0], win[-1]
    parts = []
    for rank in sorted(k for k in b if k.isdigit()):
        ta, tb = a.get(rank + "t", {}), b.get(rank + "t", {})
        used = [tb[tid][1] - ta[tid][1] for tid in tb if tid in ta]
        parts.append(f"rank {rank} {max(used) if used else 0}")
    idle = int(b["cpu"][3]) - int(a["cpu"][3])
    return f"busiest thread's ticks over {b['t'] - a['t']:.2f} s: " + ", ".join(parts) + f"; idle {idle}"


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log_dir")
    ap.add_argument("--min-ms", type=int, default=700)
    ap.add_argument("--procmon", help="procmon.py's output for the same jobs")
    args = ap.parse_args(argv)
    rows = []
    if args.procmon:
        with open(args.procmon) as fh:
            rows = [json.loads(line) for line in fh if line.strip()]
    events = read_events(args.log_dir)
    if not events:
        print(f"no events in {args.log_dir}")
        return 1
    where: Counter = Counter()
    for e in events:
        if e["kind"] == "held" and not (e["ms"] >= args.min_ms and in_step_outside_collectives(e)):
            continue
        inner = e["frames"][-1] if e["frames"] else ("-", 0, "-")
        label = f"{os.path.basename(inner[0])}:{inner[2]}" if e["frames"] else "-"
        where[(e["kind"], label)] += 1
        print(f"rank {e['rank']} {e['kind']:7s} {e['ms']:6d} ms at {e['t']:.1f}  {label}")
        long_hold = e["kind"] == "held" and e["ms"] >= 1000
        cpu = cpu_during(rows, e["t"] - e["ms"] / 1e3, e["t"]) if long_hold else None
        if cpu:
            print(f"    {cpu}")
    print("\nby innermost frame:")
    for (kind, label), n in where.most_common():
        print(f"  {n:3d}  {kind:7s} {label}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
