"""A timed, checked ``hvd.allreduce``: the worker script, and :func:`run_job` that launches it.

The worker runs as a script on every rank, e.g. through :meth:`Emulator.horovodrun_argv`::

    hvd_allreduce.py --elements 6553600 --iters 3

Every rank contributes ``rank + 1`` in each of ``--elements`` float32 entries (4 bytes each) and
sums; the result must be ``size * (size + 1) / 2`` everywhere. Rank 0 prints one line
``HFC_RESULT {json}`` with the size, elements, bytes, per-iteration seconds, their median and
``ok``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    from .emulator import Emulator

WORKER = os.path.abspath(__file__)
MARKER = "HFC_RESULT "


def run_job(emu: Emulator, np: int = 2, elements: int = 1, iters: int = 5, warmup: int = 1,
            launcher: str = "horovodrun", timeout_s: float = 300.0) -> dict[str, Any]:
    """Run the worker under ``horovodrun --gloo`` (or ``launcher="mpirun"``) across ``emu``.

    Returns rank 0's result (``median_s``: median seconds per allreduce of ``4 * elements``
    bytes; ``ok``: every rank got the right sum) plus ``wall_s``, the launcher's whole run time in
    seconds. Raises RuntimeError with the launcher's output if the job fails.
    """
    script = [sys.executable, WORKER, "--elements", str(elements), "--iters", str(iters),
              "--warmup", str(warmup)]
    argv = emu.launcher_argv(launcher, np, script)
    t0 = time.perf_counter()
    res = subprocess.run(argv, env={**os.environ, **emu.env()}, capture_output=True, text=True,
                         timeout=timeout_s, stdin=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    for line in res.stdout.splitlines():
        if MARKER in line:
            out = json.loads(line.split(MARKER, 1)[1])
            out["wall_s"] = wall
            if res.returncode != 0:
                out["ok"] = False
            return out
    raise RuntimeError(f"{launcher} job failed (rc {res.returncode}):\n"
                       f"{res.stdout[-3000:]}\n{res.stderr[-3000:]}")


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--elements", type=int, default=1, help="float32 entries per allreduce")
    ap.add_argument("--iters", type=int, default=5, help="timed allreduces")
    ap.add_argument("--warmup", type=int, default=1, help="untimed allreduces first")
    a = ap.parse_args(argv)

    import horovod.torch as hvd
    import torch

    hvd.init()
    size, rank = hvd.size(), hvd.rank()
    x = torch.full((a.elements,), float(rank + 1), dtype=torch.float32)
    expect = size * (size + 1) / 2
    ok = True
    times = []
    for i in range(a.warmup + a.iters):
        t0 = time.perf_counter()
        y = hvd.allreduce(x, op=hvd.Sum, name="hfc_bench")
        dt = time.perf_counter() - t0
        ok = ok and bool(torch.all(y == expect))
        if i >= a.warmup:
            times.append(dt)
    oks = hvd.allgather_object(ok)
    if rank == 0:
        out = {
            "size": size,
            "elements": a.elements,
            "bytes": 4 * a.elements,
            "seconds": times,
            "median_s": statistics.median(times) if times else None,
            "ok": all(oks),
        }
        print(MARKER + json.dumps(out), flush=True)
    hvd.shutdown()
    return 0 if all(oks) else 1


if __name__ == "__main__":
    sys.exit(main())
