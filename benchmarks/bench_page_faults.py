"""What a fresh page costs here: memory freed and allocated again, with and without glibc keeping it.

    python benchmarks/bench_page_faults.py                  # 256 MB, 6 rounds, 4 s apart
    python benchmarks/bench_page_faults.py --mb 64 --rounds 10 --pause-s 2

Each arm is a child process that, ``--rounds`` times, allocates ``--mb`` MB (a NumPy array of
ones: every page written), frees it, and sleeps ``--pause-s`` seconds (time for the guest to
hand free pages back to the host, as a VM with free-page reporting does). Arm ``default``: glibc's
malloc as it comes (a block this large is ``mmap``-ed and ``munmap``-ed, so every round faults
fresh pages in). Arm ``keep``: :data:`benchmarks.jobctl.KEEP_FREED_MEMORY` in the environment
(the heap keeps freed memory; rounds after the first reuse mapped pages), as the benchmark
drivers launch their ranks. Prints each round's ms and the ratio of the medians of rounds 2..n
(``default / keep``), measured in this run. A diagnostic of the machine, not of hvd_flexcomm.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from typing import Optional

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.jobctl import KEEP_FREED_MEMORY  # noqa: E402

CHILD = """
import json, sys, time
import numpy as np
mb, rounds, pause = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
out = []
for _ in range(rounds):
    t0 = time.perf_counter()
    a = np.ones(mb * (1 << 20) // 8)
    out.append(1e3 * (time.perf_counter() - t0))
    del a
    time.sleep(pause)
print(json.dumps(out))
"""


def run_arm(keep: bool, mb: int, rounds: int, pause_s: float) -> list[float]:
    """One child process's ms per round (allocate ``mb`` MB and write every page)."""
    env = {k: v for k, v in os.environ.items() if k not in KEEP_FREED_MEMORY}
    if keep:
        env.update(KEEP_FREED_MEMORY)
    out = subprocess.run([sys.executable, "-c", CHILD, str(mb), str(rounds), str(pause_s)],
                         env=env, capture_output=True, text=True, check=True).stdout
    return [float(x) for x in json.loads(out.strip().splitlines()[-1])]


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--pause-s", type=float, default=4.0)
    args = ap.parse_args(argv)
    if args.mb < 1 or args.rounds < 2 or args.pause_s < 0:
        ap.error(f"need --mb >= 1, --rounds >= 2, --pause-s >= 0; got {args.mb}, "
                 f"{args.rounds}, {args.pause_s}")
    medians = {}
    for name, keep in (("default", False), ("keep", True)):
        ms = run_arm(keep, args.mb, args.rounds, args.pause_s)
        medians[name] = statistics.median(ms[1:])
        print(f"{name:8s} {args.mb} MB allocated and written, ms per round: "
              + " ".join(f"{x:.0f}" for x in ms) + f"  (median of rounds 2..: {medians[name]:.0f})")
    ratio = medians["default"] / medians["keep"] if medians["keep"] > 0 else float("inf")
    print(f"default / keep (median of rounds 2..{args.rounds}): {ratio:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
