"""Sample the CPU each Horovod rank's threads use, every 200 ms, into a JSON-lines file.

    python benchmarks/stall_sampler/procmon.py OUT.jsonl [--interval-s 0.2]   # as root; Ctrl-C ends

Each line: ``t`` (unix s), ``cpu`` (the first line of ``/proc/stat``: user, nice, system, idle,
iowait, irq, softirq, steal in clock ticks), and per rank ``"<rank>"``: ``[state, minor faults,
major faults, user ticks, system ticks]`` of the process and ``"<rank>t"``: ``{tid: [state,
user + system ticks, cpu]}`` of each thread (the training thread's tid is the pid). Ranks are the
processes whose environment holds ``HOROVOD_RANK`` (found again every 2 s). ``summarise.py
--procmon OUT.jsonl`` reads it against the sampler's stalls.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import time
from typing import Optional


def find_ranks() -> dict[int, str]:
    """pid -> rank of every process with ``HOROVOD_RANK`` in its environment."""
    ranks = {}
    for proc in glob.glob("/proc/[0-9]*"):
        try:
            with open(os.path.join(proc, "environ"), "rb") as fh:
                env = fh.read()
        except OSError:
            continue
        if b"HOROVOD_RANK=" in env:
            ranks[int(proc[6:])] = env.split(b"HOROVOD_RANK=")[1].split(b"\0")[0].decode()
    return ranks


def _stat_fields(path: str) -> list[str]:
    with open(path) as fh:
        return fh.read().rsplit(")", 1)[1].split()


def sample(ranks: dict[int, str]) -> dict:
    """One line of the output (see the module docstring)."""
    row: dict = {"t": round(time.time(), 3)}
    for pid, rank in ranks.items():
        try:
            st = _stat_fields(f"/proc/{pid}/stat")
            row[rank] = [st[0], int(st[7]), int(st[9]), int(st[11]), int(st[12])]
            threads = {}
            for task in glob.glob(f"/proc/{pid}/task/*"):
                try:
                    ts = _stat_fields(os.path.join(task, "stat"))
                    threads[os.path.basename(task)] = [ts[0], int(ts[11]) + int(ts[12]), int(ts[36])]
                except (OSError, IndexError):
                    pass
            row[rank + "t"] = threads
        except (OSError, IndexError):
            pass
    with open("/proc/stat") as fh:
        row["cpu"] = [int(x) for x in fh.readline().split()[1:9]]
    return row


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--interval-s", type=float, default=0.2)
    args = ap.parse_args(argv)
    ranks, found_at = {}, 0.0
    with open(args.out, "a") as out:
        try:
            while True:
                if time.monotonic() - found_at > 2:
                    ranks, found_at = find_ranks(), time.monotonic()
                out.write(json.dumps(sample(ranks)) + "\n")
                out.flush()
                time.sleep(args.interval_s)
        except KeyboardInterrupt:
            return 0


if __name__ == "__main__":
    sys.exit(main())
