"""Worker of ``bench_table6.py``: runs on every rank under ``horovodrun``, one network per job.

    bench_table6_job.py --sizes 11689512 25557032 --crs 0.1 0.01 0.001 --warmup 1 --steps 3 --json F

For each gradient size, each CR: a fresh ``AGTopk(cr)`` and ``ARTopk(cr, selector="star")``
optimizer, each over one ``torch.nn.Parameter`` of that many float32 entries (no model: the
``.grad`` is refilled before every step from two pre-drawn standard-normal tensors per rank).
``--warmup`` untimed steps of each, then ``--steps`` timed steps, AG and AR interleaved (order
alternating) so that machine noise hits both alike. Every step starts with a tiny allreduce (a
barrier, untimed), so that the ranks enter the step together.

Per step, rank 0's ``opt.last_stats`` (``comm_ms``, ``compress_ms``, ``k``, ``bytes_sent``,
``root_rank``) and the ``opt.step()`` wall time are kept; every rank's ``compress_ms`` is gathered
once per cell, which gives an estimate of how long rank 0 waited for the slowest rank's top-k
selection inside ``comm_ms`` (AR-Topk STAR: the root's selection when rank 0 is not the root; AG-Topk:
the slowest rank's selection). Also, once per job, plain Horovod collectives of ``--probe-numel``
float32 per rank are timed (allreduce, allgather, broadcast) to show what the network and Gloo give.

Rank 0 appends one JSON record per cell (and one ``"probe"`` record) to ``--json`` and prints
progress lines starting with ``[bench_table6]``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)

import horovod.torch as hvd  # noqa: E402
import torch  # noqa: E402

import hvd_flexcomm  # noqa: E402

TAG = "[bench_table6]"


def _loadavg() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


class Job:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rank, self.size = hvd.rank(), hvd.size()
        self.t0 = time.perf_counter()
        self.bar = torch.zeros(1)

    def say(self, text: str) -> None:
        if self.rank == 0:
            print(f"{TAG} {text} (elapsed {time.perf_counter() - self.t0:.0f} s)", flush=True)

    def emit(self, record: dict) -> None:
        if self.rank == 0 and self.args.json:
            with open(self.args.json, "a") as fh:
                fh.write(json.dumps(record) + "\n")

    def barrier(self) -> None:
        hvd.allreduce_(self.bar, op=hvd.Sum, name="bench_table6.barrier")

    def make(self, mode, numel: int) -> tuple:
        param = torch.nn.Parameter(torch.zeros(numel))
        opt = hvd_flexcomm.DistributedOptimizer(torch.optim.SGD([param], lr=1e-3),
                                                named_parameters=[("g", param)], compression=mode)
        return param, opt

    def step(self, param, opt, grad: torch.Tensor) -> dict:
        if param.grad is None:
            param.grad = torch.empty_like(param)
        param.grad.copy_(grad)
        self.barrier()
        t0 = time.perf_counter()
        opt.step()
        wall = 1e3 * (time.perf_counter() - t0)
        st = opt.last_stats
        return {"comm_ms": st["comm_ms"], "compress_ms": st["compress_ms"], "wall_ms": wall,
                "k": st["k"], "bytes_sent": st["bytes_sent"], "root_rank": st.get("root_rank"),
                "collective": st["collective"]}

    # -- plain collectives ---------------------------------------------------------------------
    def probe(self) -> None:
        n = int(self.args.probe_numel)
        x = torch.randn(n)
        out: dict = {"kind": "probe", "numel_per_rank": n, "bytes_per_rank": 4 * n, "N": self.size}
        ops = {
            "allreduce": lambda i: hvd.allreduce(x, op=hvd.Sum, name=f"t6.p.ar.{i}"),
            "allgather": lambda i: hvd.allgather(x, name=f"t6.p.ag.{i}"),
            "broadcast": lambda i: hvd.broadcast(x, 0, name=f"t6.p.bc.{i}"),
        }
        for name, op in ops.items():
            times = []
            for i in range(self.args.probe_repeats + 1):
                self.barrier()
                t0 = time.perf_counter()
                op(i)
                if i > 0:  # the first one is a warm-up
                    times.append(1e3 * (time.perf_counter() - t0))
            out[f"{name}_ms"] = statistics.median(times)
        self.emit(out)
        self.say(f"plain collectives of {4 * n / 1e6:.1f} MB per rank: allreduce "
                 f"{out['allreduce_ms']:.1f} ms, allgather {out['allgather_ms']:.1f} ms, broadcast "
                 f"{out['broadcast_ms']:.1f} ms")

    # -- the grid --------------------------------------------------------------------------------
    def run(self) -> None:
        a = self.args
        total = len(a.sizes) * len(a.crs)
        done = 0
        for numel in a.sizes:
            gen = torch.Generator().manual_seed(1000 + self.rank)
            pool = [torch.randn(numel, generator=gen) for _ in range(2)]
            for cr in a.crs:
                t_cell = time.perf_counter()
                load0 = _loadavg()
                setups = {"ag": self.make(hvd_flexcomm.AGTopk(cr=cr), numel),
                          "ar": self.make(hvd_flexcomm.ARTopk(cr=cr, selector="star"), numel)}
                n_step = 0
                for _ in range(a.warmup):
                    for m in ("ag", "ar"):
                        self.step(*setups[m], pool[n_step % 2])
                    n_step += 1
                timed: dict = {"ag": [], "ar": []}
                for r in range(a.steps):
                    for m in (("ag", "ar") if r % 2 == 0 else ("ar", "ag")):
                        timed[m].append(self.step(*setups[m], pool[n_step % 2]))
                    n_step += 1
                # every rank's compress_ms, for the wait-for-slowest-selection estimate
                mine = {m: [s["compress_ms"] for s in timed[m]] for m in timed}
                everyone = hvd.allgather_object(mine, name=f"t6.compress.{numel}.{cr}")
                record = {"kind": "cell", "numel": numel, "cr": cr, "N": self.size,
                          "warmup": a.warmup, "timed": timed,
                          "compress_ms_all_ranks": {m: [e[m] for e in everyone] for m in timed},
                          "cell_s": time.perf_counter() - t_cell, "loadavg_start": load0,
                          "loadavg_end": _loadavg()}
                self.emit(record)
                done += 1
                ag = statistics.median(s["comm_ms"] for s in timed["ag"])
                ar = statistics.median(s["comm_ms"] for s in timed["ar"])
                self.say(f"cell {done}/{total}: {a.label} numel={numel:,} cr={cr:g}: AG {ag:.1f} ms, "
                         f"AR {ar:.1f} ms -> {'AG' if ag <= ar else 'AR'}")
                del setups
                gc.collect()
            del pool
            gc.collect()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", required=True)
    ap.add_argument("--crs", type=float, nargs="+", required=True)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--probe-numel", type=int, default=1_000_000)
    ap.add_argument("--probe-repeats", type=int, default=2)
    ap.add_argument("--label", default="")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    hvd.init()
    job = Job(args)
    job.say(f"{job.size} ranks, network {args.label}, sizes {args.sizes}, CRs {args.crs}")
    if args.probe_numel > 0:
        job.probe()
    job.run()
    job.barrier()
    job.say("done")
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
