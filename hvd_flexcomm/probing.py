"""Timed probe collectives: the measurements that calibrate the cost model.

Every rank must call :func:`run_probes` with the same plan at the same point (the plan is a pure
function of values all ranks share). Each probe is one Horovod op on a zero buffer of the given
size, timed on every rank; the per-rank timings are then combined with one small allgather, so
every rank ends with identical numbers. A rank's time of an operation is its wait for the last
rank to enter plus the operation's own cost, and the last rank to enter waits for nobody, so an
allgather's or an allreduce's cost is its minimum over ranks. A broadcast's root is done once its
bytes are handed to the transport, before they arrive: each timed broadcast is followed by a
timed allreduce that every rank must enter, and its cost is ``sync.delivered_ms`` of the two --
the same rule as the step timings in ``sync.py``. Where the plan lists an allreduce right after
the broadcast (AR-Topk's pair at one k) that allreduce follows it, as in a step, and its timing
is its own sample too; otherwise a 4-byte allreduce (a barrier) does. Every Horovod op costs
several round trips whatever its size (a cached 4-float allreduce: 113 ms at 5 ms one way,
N = 4, ``docs/performance/horovod_op_cost.md``), so a barrier is as dear as a small probe.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Optional, Union

import torch

from .calibration import KINDS
from .sync import delivered_ms
from .waiting import synchronize

__all__ = ["run_probes", "run_probes_sharing", "BARRIER_BYTES", "PHASES", "barriers_needed",
           "repeat_counts"]

#: Bytes of the allreduce that follows each timed broadcast no allreduce entry of the plan
#: follows (see the module docstring).
BARRIER_BYTES = 4

#: The phases of a probe whose wall times ``run_probes_sharing(phases_ms=...)`` reports, in
#: order: the untimed warm-up round (new names only), the timed ops one at a time, and the
#: allgather that combines the timings over ranks.
PHASES = ("warm_up", "timed", "combine")


def repeat_counts(n_entries: int, repeats: Union[int, Sequence[int]]) -> list[int]:
    """Timings per plan entry: ``repeats`` is one count for all ``n_entries`` entries or one per
    entry, each >= 1 (a ValueError naming the value otherwise). Pure function."""
    counts = [int(repeats)] * n_entries if isinstance(repeats, int) else [int(r) for r in repeats]
    if len(counts) != n_entries or any(r < 1 for r in counts):
        raise ValueError(f"repeats must be one count >= 1 or one per plan entry ({n_entries}), "
                         f"got {repeats!r}")
    return counts


def _partners(kinds: Sequence[str], counts: Sequence[int]) -> dict[int, Optional[int]]:
    """For each broadcast entry's index: the index of the allreduce entry timed right after it
    (the next entry, if it is an allreduce with the same count), or None (a barrier follows)."""
    return {i: (i + 1 if i + 1 < len(kinds) and kinds[i + 1] == "allreduce"
                and counts[i + 1] == counts[i] else None)
            for i, kind in enumerate(kinds) if kind == "broadcast"}


def barriers_needed(kinds: Sequence[str], counts: Optional[Sequence[int]] = None) -> int:
    """How many :data:`BARRIER_BYTES` allreduces :func:`run_probes` runs after the timed
    broadcasts of a plan of ``kinds`` (``counts`` timings each, default one): one per timing of
    a broadcast that no allreduce entry follows. Pure function."""
    counts = [1] * len(kinds) if counts is None else list(counts)
    return sum(counts[i] for i, j in _partners(kinds, counts).items() if j is None)


def _write_phases(phases_ms: Optional[dict], clock: Sequence[float]) -> None:
    """Write the ms between consecutive ``clock`` readings (s) into ``phases_ms`` under the keys
    of :data:`PHASES`, in order (nothing when ``phases_ms`` is None)."""
    if phases_ms is not None:
        phases_ms.update({phase: 1e3 * (end - start)
                          for phase, start, end in zip(PHASES, clock, clock[1:])})


def _start(hvd: Any, kind: str, buf: torch.Tensor, name: str, kw: dict) -> Any:
    """Start one probe op of ``kind`` on ``buf`` (in place for a broadcast or an allreduce);
    its Horovod handle."""
    if kind == "allgather":
        return hvd.allgather_async(buf, name=name, **kw)
    if kind == "broadcast":
        return hvd.broadcast_async_(buf, root_rank=0, name=name, **kw)
    return hvd.allreduce_async_(buf, op=hvd.Sum, name=name, **kw)


def _warm_up(hvd: Any, ops: Sequence[tuple[str, str, torch.Tensor]], kw: dict) -> None:
    """One untimed op per ``(kind, name, buffer)``, all in flight at once: Horovod negotiates
    them in the same cycles, so warming up n new names costs about one op's round trip (plus
    their bytes) instead of n."""
    for handle in [_start(hvd, kind, buf, name, kw) for kind, name, buf in ops]:
        synchronize(hvd, handle)


def run_probes(hvd: Any, plan: Sequence[tuple[str, int]], repeats: Union[int, Sequence[int]],
               process_set: Any = None, tag: str = "probe", warmed: Optional[set] = None,
               warm_up: bool = True, phases_ms: Optional[dict] = None
               ) -> list[tuple[str, int, float]]:
    """:func:`run_probes_sharing` with nothing shared: the probe results only."""
    return run_probes_sharing(hvd, plan, repeats, (), process_set, tag, warmed, warm_up,
                              phases_ms)[0]


def run_probes_sharing(hvd: Any, plan: Sequence[tuple[str, int]],
                       repeats: Union[int, Sequence[int]], extra: Sequence[float] = (),
                       process_set: Any = None, tag: str = "probe", warmed: Optional[set] = None,
                       warm_up: bool = True, phases_ms: Optional[dict] = None
                       ) -> tuple[list[tuple[str, int, float]], list[list[float]]]:
    """Time each ``(kind, nbytes)`` of ``plan`` ``repeats`` times (one count for every entry,
    or one count per entry, each >= 1).

    ``kind`` is ``"allgather"`` (``nbytes`` per rank), ``"broadcast"`` (from rank 0) or
    ``"allreduce"``. Each op is named by ``tag``, kind and size; the first op of a name pays
    Horovod's full negotiation (its response cache has not seen the name), so every name's
    first use gets one untimed warm-up op first, all of a plan's warm-ups in flight together
    (:func:`_warm_up`). ``warmed``: the names already used in this process (updated in place,
    the same set on every rank since plans are identical): those skip the warm-up. Without it
    every plan entry is warmed up. ``warm_up=False`` runs no untimed op at all (a one-off
    refresh: a new name's negotiation then rides in its timing, a small upward bias that costs
    less than a whole extra op on a slow link). The timed ops run one at a time, in plan order.
    A broadcast entry directly followed by an allreduce entry with the same count is timed in
    pairs with it, broadcast then allreduce, as a step runs them (the allreduce's timing is its
    own sample and the broadcast's barrier); any other timed broadcast is followed by a
    :data:`BARRIER_BYTES` allreduce (named by ``tag``, warmed up like the plan's names).
    ``extra``: numbers this rank shares with every rank (the same count on every rank), sent
    in the row of the allgather that combines the timings, at no extra op (Adaptive's first CR:
    rank 0's gains and time outside communication, see ``optimizer.py``).
    ``phases_ms``: a dict this rank's wall time (ms) of each phase is written into (the keys of
    :data:`PHASES`: the warm-up round, the timed ops, the allgather that combines the timings;
    0 for a phase that did not run), so that a log can say where a probe's time went.
    Returns ``([(kind, nbytes, ms), ...], extras)``: each timing combined over ranks (see the
    module docstring), and every rank's ``extra`` by rank; both identical on every rank.
    """
    for kind, _ in plan:
        if kind not in KINDS:
            raise ValueError(f"unknown probe kind {kind!r}")
    counts = repeat_counts(len(plan), repeats)
    kw = {} if process_set is None else {"process_set": process_set}
    ops = []
    for kind, nbytes in plan:
        buf = torch.zeros(max(1, int(nbytes) // 4), dtype=torch.float32)
        ops.append((kind, f"hvd_flexcomm.{tag}.{kind}.{buf.numel()}", buf))
    barrier_name = f"hvd_flexcomm.{tag}.barrier"
    barrier_buf = torch.zeros(BARRIER_BYTES // 4, dtype=torch.float32)
    # the allreduce entry timed right after each broadcast entry (None: the barrier)
    partner = _partners([kind for kind, _ in plan], counts)
    barriers = [("allreduce", barrier_name, barrier_buf)] if any(
        j is None for j in partner.values()) else []
    clock = [time.perf_counter()]
    if warm_up:
        cold = {name: (kind, name, buf) for kind, name, buf in ops + barriers
                if warmed is None or name not in warmed}
        if cold:
            _warm_up(hvd, list(cold.values()), kw)
    clock.append(time.perf_counter())
    samples: list[tuple[str, int]] = []
    timings: list[float] = []
    after: list[float] = []  # each timing's following allreduce ms (a broadcast's), else 0
    paired = {j for j in partner.values() if j is not None}
    for i, ((kind, name, buf), count) in enumerate(zip(ops, counts)):
        if i in paired:
            continue  # timed with its broadcast
        j = partner.get(i)
        for _ in range(count):
            t0 = time.perf_counter()
            synchronize(hvd, _start(hvd, kind, buf, name, kw))
            t1 = time.perf_counter()
            if kind == "broadcast":
                then_kind, then_name, then_buf = ops[j] if j is not None else (
                    "allreduce", barrier_name, barrier_buf)
                synchronize(hvd, _start(hvd, then_kind, then_buf, then_name, kw))
                then_ms = 1e3 * (time.perf_counter() - t1)
            samples.append((kind, buf.numel() * 4))
            timings.append(1e3 * (t1 - t0))
            after.append(then_ms if kind == "broadcast" else 0.0)
            if j is not None:
                samples.append(("allreduce", then_buf.numel() * 4))
                timings.append(then_ms)
                after.append(0.0)
        if warmed is not None:
            warmed.update(ops[used][1] for used in (i, j) if used is not None)
    clock.append(time.perf_counter())
    extra = [float(x) for x in extra]
    if not timings and not extra:
        _write_phases(phases_ms, clock + clock[-1:])
        return [], []
    if warmed is not None and barriers:
        warmed.add(barrier_name)
    n = len(timings)
    every = hvd.allgather(torch.tensor([timings + after + extra], dtype=torch.float64),
                          name=f"hvd_flexcomm.{tag}.timings", **kw)
    _write_phases(phases_ms, clock + [time.perf_counter()])
    combined = delivered_ms(every[:, :n], every[:, n:2 * n]).tolist() if n else []
    results = [(kind, nbytes, float(ms)) for (kind, nbytes), ms in zip(samples, combined)]
    return results, every[:, 2 * n:].tolist()
