"""What one Horovod operation costs on an emulated network: the price of an announcement, a probe
and a change of message size, against a small cached allreduce timed in the same job (root only).

    python benchmarks/bench_horovod_ops.py                       # N=4, 100 Mbit/s, 5 ms, Gloo
    python benchmarks/bench_horovod_ops.py --launcher mpirun     # the same under Open MPI (+ mpi4py)
    python benchmarks/bench_horovod_ops.py --quick               # N=2, 3 timed ops each (a test)

Every rank runs the same sequence of blocking operations (``--iters`` timed after one untimed
call each); a call's time is the longest any rank spent in it (a root returns from a small
eager broadcast at once, the others wait for the data). Rank 0 reports, per kind, the median of
those times in ms and its ratio to the baseline, a 4-float ``hvd.allreduce`` under one name
(Horovod's response cache hits from the second call on). Kinds:

- ``allreduce_tiny`` (baseline) and ``broadcast_f64``: a 1-float64 ``hvd.broadcast``;
- ``broadcast_object``: ``hvd.broadcast_object`` of a float, what ``Adaptive`` sends under Gloo to
  announce a CR (two broadcasts: the pickle's size, then its bytes);
- ``allgather_same``: ``--elements`` float32 per rank under one name and shape (a step of AG-Topk at
  a fixed CR);
- ``allgather_resized``: the same name, the first dimension changed by 100 elements per call (the
  steps after a CR change: each new shape is negotiated again);
- ``allgather_new_name``: a new name per call (a probe size used for the first time);
- ``mpi4py_bcast`` (``--launcher mpirun`` only): ``MPI.COMM_WORLD.bcast`` of a float, the channel
  ``Adaptive`` uses under MPI, each after an untimed ``Barrier`` (without it the root runs ahead
  and the others find the data already there).

Writes ``ops.json`` and ``ops.md`` under ``--out`` (default ``results/horovod_ops``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any, Callable, Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARKER = "HFC_OPS "
BASELINE = "allreduce_tiny"


# -- the job (every rank) ----------------------------------------------------------------------------


def _timed_ms(fn: Callable[[int], Any], iters: int,
              before: Optional[Callable[[], Any]] = None) -> list[float]:
    """Wall ms of ``fn(i)`` for i = 1..iters, after one untimed ``fn(0)``; ``before()`` runs
    untimed ahead of every call."""
    fn(0)
    out = []
    for i in range(1, iters + 1):
        if before is not None:
            before()
        t0 = time.perf_counter()
        fn(i)
        out.append(1e3 * (time.perf_counter() - t0))
    return out


def worker(iters: int, elements: int) -> int:
    import horovod.torch as hvd
    import torch

    hvd.init()
    rank = hvd.rank()
    ms: dict[str, list[float]] = {}
    ms[BASELINE] = _timed_ms(lambda i: hvd.allreduce(torch.zeros(4), name="ops.tiny"), iters)
    ms["broadcast_f64"] = _timed_ms(
        lambda i: hvd.broadcast(torch.tensor([float(i)], dtype=torch.float64), 0, name="ops.b"), iters)
    ms["broadcast_object"] = _timed_ms(
        lambda i: hvd.broadcast_object(0.01 + 1e-4 * i if rank == 0 else None, 0, name="ops.bo"),
        iters)
    ms["allgather_same"] = _timed_ms(
        lambda i: hvd.allgather(torch.zeros(elements), name="ops.ag"), iters)
    ms["allgather_resized"] = _timed_ms(
        lambda i: hvd.allgather(torch.zeros(elements + 100 * i), name="ops.agr"), iters)
    ms["allgather_new_name"] = _timed_ms(
        lambda i: hvd.allgather(torch.zeros(elements), name=f"ops.agn{i}"), iters)
    if hvd.mpi_enabled():
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        ms["mpi4py_bcast"] = _timed_ms(lambda i: comm.bcast(0.01 + 1e-4 * i if rank == 0 else None,
                                                            root=0), iters, before=comm.Barrier)
    per_rank = hvd.allgather_object(ms)  # every rank's times; a call costs the slowest rank's
    slowest = {k: [max(r[k][i] for r in per_rank) for i in range(iters)] for k in ms}
    if rank == 0:
        print(MARKER + json.dumps({"size": hvd.size(), "mpi": hvd.mpi_enabled(), "ms": slowest,
                                   "rank0_ms": ms}), flush=True)
    hvd.shutdown()
    return 0


# -- the driver ----------------------------------------------------------------------------------------


def summarize(raw: dict[str, Any]) -> list[dict[str, Any]]:
    """Per kind: median ms and its ratio to the baseline's median (same job)."""
    base = statistics.median(raw["ms"][BASELINE])
    return [{"kind": k, "median_ms": statistics.median(v), "min_ms": min(v), "max_ms": max(v),
             "ratio_to_baseline": statistics.median(v) / base, "n": len(v)}
            for k, v in raw["ms"].items()]


def markdown(result: dict[str, Any]) -> str:
    s = result["settings"]
    lines = [f"# One Horovod operation on an emulated network ({s['launcher']})", "",
             f"N = {s['n']}, {s['rate_mbit'] or 'unlimited'} Mbit/s, {s['delay_ms']} ms one way; "
             f"{s['iters']} timed calls per kind after one untimed; allgather of {s['elements']} "
             f"float32 per rank. Baseline: `{BASELINE}` (4 floats, cached name) in the same job.", "",
             "| operation | median ms | min–max ms | × baseline |", "|---|---:|---:|---:|"]
    for r in result["rows"]:
        lines.append(f"| {r['kind']} | {r['median_ms']:.1f} | {r['min_ms']:.1f}–{r['max_ms']:.1f} | "
                     f"{r['ratio_to_baseline']:.2f} |")
    return "\n".join(lines) + "\n"


def run(n: int, delay_ms: float, rate_mbit: Optional[float], iters: int, elements: int,
        launcher: str, timeout_s: float) -> dict[str, Any]:
    from hvd_flexcomm.netem.emulator import Emulator
    from hvd_flexcomm.netem.spec import LinkSpec

    script = [sys.executable, os.path.abspath(__file__), "--worker", "--iters", str(iters),
              "--elements", str(elements)]
    with Emulator(n_hosts=n, link=LinkSpec(delay_ms=delay_ms, rate_mbit=rate_mbit)) as emu:
        argv = emu.launcher_argv(launcher, n, script)
        proc = subprocess.run(argv, env={**os.environ, **emu.env()}, capture_output=True, text=True,
                              timeout=timeout_s, stdin=subprocess.DEVNULL)
    for line in proc.stdout.splitlines():
        if MARKER in line and proc.returncode == 0:
            raw = json.loads(line.split(MARKER, 1)[1])
            return {"settings": {"n": n, "delay_ms": delay_ms, "rate_mbit": rate_mbit, "iters": iters,
                                 "elements": elements, "launcher": launcher},
                    "raw": raw, "rows": summarize(raw)}
    raise RuntimeError(f"{launcher} job failed (rc {proc.returncode}):\n{proc.stdout[-3000:]}\n"
                       f"{proc.stderr[-3000:]}")


def main(argv: Optional[list[str]] = None) -> int:
    sys.path.insert(0, REPO)
    from hvd_flexcomm.netem.emulator import LAUNCHERS

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--quick", action="store_true", help="N=2, 3 timed calls per kind")
    ap.add_argument("--n", type=int, default=None, help="ranks (default 4; --quick: 2)")
    ap.add_argument("--delay-ms", type=float, default=5.0, help="one-way delay, ms (default 5)")
    ap.add_argument("--rate-mbit", type=float, default=100.0, help="Mbit/s; 0 = unlimited")
    ap.add_argument("--iters", type=int, default=None, help="timed calls per kind (default 8)")
    ap.add_argument("--elements", type=int, default=12_000,
                    help="float32 per rank in the allgathers (default 12000: k of MLP 1.2M at CR 0.01)")
    ap.add_argument("--launcher", choices=LAUNCHERS, default="horovodrun")
    ap.add_argument("--timeout-s", type=float, default=600.0)
    ap.add_argument("--out", default=os.path.join(REPO, "results", "horovod_ops"))
    a = ap.parse_args(argv)
    iters = a.iters or (3 if a.quick else 8)
    if iters < 1 or a.elements < 1:
        ap.error(f"--iters and --elements must be >= 1, got {iters} and {a.elements}")
    if a.worker:
        return worker(iters, a.elements)
    n = a.n or (2 if a.quick else 4)
    if n < 2:
        ap.error(f"--n must be >= 2, got {n}")
    result = run(n, a.delay_ms, a.rate_mbit or None, iters, a.elements, a.launcher, a.timeout_s)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "ops.json"), "w") as f:
        json.dump(result, f, indent=1)
    text = markdown(result)
    with open(os.path.join(a.out, "ops.md"), "w") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
