"""Timed probe collectives: the measurements that calibrate the cost model.

Every rank must call :func:`run_probes` with the same plan at the same point (the plan is a pure
function of values all ranks share). Each probe is one Horovod op on a zero buffer of the given
size, timed on every rank; the per-rank timings are then combined with one small allreduce (min:
a rank's time of an operation is its wait for the last rank to enter plus the operation's own cost,
and the last rank to enter waits for nobody -- the same rule as the step timings in ``sync.py``),
so every rank ends with identical numbers.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Optional

import torch

__all__ = ["run_probes"]


def run_probes(hvd: Any, plan: Sequence[tuple[str, int]], repeats: int, process_set: Any = None,
               tag: str = "probe", warmed: Optional[set] = None,
               warm_up: bool = True) -> list[tuple[str, int, float]]:
    """Time each ``(kind, nbytes)`` of ``plan`` ``repeats`` times.

    ``kind`` is ``"allgather"`` (``nbytes`` per rank), ``"broadcast"`` (from rank 0) or
    ``"allreduce"``. Each op is named by ``tag``, kind and size; the first op of a name pays
    Horovod's full negotiation (its response cache has not seen the name), so a name's first use
    runs one untimed warm-up op. ``warmed``: the names already used in this process (updated in
    place, the same set on every rank since plans are identical): those skip the warm-up. Without
    it every plan entry is warmed up. ``warm_up=False`` runs no untimed op at all (a one-off
    refresh: a new name's negotiation then rides in its timing, a small upward bias that costs
    less than a whole extra op on a slow link). Returns ``[(kind, nbytes, ms), ...]`` with the min over
    ranks of each timing, identical on every rank.
    """
    kw = {} if process_set is None else {"process_set": process_set}
    samples: list[tuple[str, int]] = []
    timings: list[float] = []
    for kind, nbytes in plan:
        buf = torch.zeros(max(1, int(nbytes) // 4), dtype=torch.float32)
        name = f"hvd_flexcomm.{tag}.{kind}.{buf.numel()}"
        warm = warm_up and (warmed is None or name not in warmed)
        for rep in range(repeats + 1 if warm else repeats):
            t0 = time.perf_counter()
            if kind == "allgather":
                hvd.allgather(buf, name=name, **kw)
            elif kind == "broadcast":
                hvd.broadcast_(buf, root_rank=0, name=name, **kw)
            elif kind == "allreduce":
                hvd.allreduce_(buf, op=hvd.Sum, name=name, **kw)
            else:
                raise ValueError(f"unknown probe kind {kind!r}")
            if rep or not warm:
                samples.append((kind, buf.numel() * 4))
                timings.append(1e3 * (time.perf_counter() - t0))
        if warmed is not None:
            warmed.add(name)
    if not timings:
        return []
    own = hvd.allreduce(torch.tensor(timings, dtype=torch.float64), op=hvd.Min,
                        name=f"hvd_flexcomm.{tag}.timings", **kw)
    return [(kind, nbytes, float(ms)) for (kind, nbytes), ms in zip(samples, own.tolist())]
