"""Thin glue between a :class:`~hvd_flexcomm.messages.GradMessage` and Horovod's collectives.

One step of one message goes through up to three phases, so that the optimizer can submit every
message's collective before it waits on any of them:

- :func:`launch` -- error feedback (``G = grad + residual``), top-k selection, and the first
  collective: ``allgather`` of the packed top-k (AG-Topk), ``broadcast`` of the root's indices
  (AR-Topk), or ``allreduce`` of ``G`` (dense, ``cr == 1``);
- :func:`advance` -- AR-Topk only: wait for the indices, take this rank's values at them and submit
  the ``allreduce`` of the k values;
- :func:`finish` -- wait, aggregate into a dense result, commit the residual.

Metadata rides inside the payloads, never in extra round trips:

- AG-Topk packs, per rank, ``[sq_sent, sq_total, nonfinite, control...]`` (float64) + k values + k int32
  indices as raw bytes into one ``uint8`` allgather, so every dtype works and one op is submitted;
- AR-Topk appends :func:`ar_extra_entries` entries to the k values it allreduces: a one-hot
  "non-finite" flag per rank, the rank's gain, the agreement hash, control entries that only
  rank 0 fills and three timing slots per rank that only that rank fills, so every rank learns
  whether any rank saw NaN/Inf, the mean gain, rank 0's control entries and every rank's timings.
- The control entries (``CONTROL_SLOTS`` numbers) carry what Flexible routing needs to stay
  identical on every rank: the path code and Adaptive's "a new CR is ready to announce" flag
  (rank 0's, see ``adaptive.py``), and the previous step's collective times (ms), combined over
  ranks by :func:`combine_timings`. Every rank's time of a collective is the wait for the last
  rank to enter it plus the collective's own cost, and the last rank to enter waits for nobody,
  so the minimum over ranks is the collective's own cost -- for a collective that every rank
  finishes only once the data has arrived (allgather, allreduce). A **broadcast's** root finishes
  as soon as its bytes are handed to the transport, before they are delivered: the STAR root,
  which enters last (after its selection, while the others wait), would report the buffering
  time only (measured: 1.9-6.2x too low at 100 Mbit/s). The allreduce that follows it cannot
  start before every rank holds the indices, so the broadcast's delivered time is
  ``min_r(t1 + t2) - min_r(t2)``: the last rank to enter the broadcast, up to the end of the
  allreduce, less the allreduce's own cost.

If any rank's error-fed gradient is non-finite, every rank learns it from the same collective and
the step is skipped consistently: the residuals keep their previous values (the error-fed buffer is a
separate tensor until :func:`finish` commits it).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from .error_feedback import commit_residual, gain, has_nonfinite, squared_norm
from .messages import GradMessage
from .selectors import star_root, var_root
from .topk import k_for, select_topk
from .waiting import synchronize

__all__ = ["StepConfig", "Pending", "MessageOutcome", "launch", "advance", "finish", "wire_dtype",
           "ar_extra_entries", "combine_control", "combine_timings", "delivered_ms",
           "CONTROL_SLOTS", "PATH_SLOT", "TIMING_SLOTS",
           "ANNOUNCE_SLOT"]

#: Control entries carried in every top-k payload: [path code, first-collective ms,
#: second-collective ms, VAR allgather ms, announce flag] (see flexible.py).
CONTROL_SLOTS = 5
#: Index of the path code (rank 0's) among the control entries.
PATH_SLOT = 0
#: The control entries that hold timings: [first collective, second collective, VAR allgather],
#: combined over ranks by :func:`combine_timings` (the other entries: rank 0's).
TIMING_SLOTS = (1, 2, 3)
#: Index of Adaptive's announce flag (rank 0's) among the control entries.
ANNOUNCE_SLOT = 4
#: float64 entries per rank in the AG payload: sq_sent, sq_total, nonfinite, agreement, control...
_EXTRA_AG = 4 + CONTROL_SLOTS
#: AR payload: per-rank one-hot flags (size), gain, agreement h and h², control (CONTROL_SLOTS),
#: then len(TIMING_SLOTS) timings per rank
_EXTRA_AR_FIXED = 3 + CONTROL_SLOTS


def ar_extra_entries(size: int) -> int:
    """Entries AR-Topk appends to its k values for ``size`` ranks (see the module docstring)."""
    return size + _EXTRA_AR_FIXED + len(TIMING_SLOTS) * size


def delivered_ms(first: torch.Tensor, then: torch.Tensor) -> torch.Tensor:
    """The own cost (ms) of a collective timed as ``first`` on every rank (one row per rank) and
    followed by a collective all ranks must enter before it completes, timed as ``then``:
    ``min_r(first + then) - min_r(then)``, column by column.

    The span from the last rank's entry into ``first`` to the end of ``then`` is the first
    collective's delivery plus the second's own cost (``min_r(then)``, the rank that entered
    ``then`` last). Where ``then`` is all zeros (nothing follows) this is ``min_r(first)``; it
    is never below ``min_r(first)`` (the minimum of a sum is at least the sum of the minima).
    """
    first, then = first.double(), then.double()
    return (first + then).min(dim=0).values - then.min(dim=0).values


def combine_timings(timings: torch.Tensor) -> torch.Tensor:
    """One step's collective times (ms, ``[first, second, VAR]`` as in TIMING_SLOTS) from one row
    per rank: the second and VAR collectives' minimum over ranks, the first one's
    :func:`delivered_ms` with the second (its minimum when there is no second collective, as on
    the allgather and dense paths). See the module docstring."""
    timings = timings.double()
    out = timings.min(dim=0).values
    out[0] = delivered_ms(timings[:, 0], timings[:, 1])
    return out


def combine_control(rank0: torch.Tensor, timings: torch.Tensor) -> list:
    """The delivered control entries: ``rank0`` (rank 0's CONTROL_SLOTS entries) with the timing
    slots replaced by :func:`combine_timings` of ``timings`` (one row per rank, one column per
    TIMING_SLOTS entry)."""
    out = rank0.double().clone()
    out[list(TIMING_SLOTS)] = combine_timings(timings)
    return out.tolist()


_F64 = torch.float64
#: Reduction dtypes for values Horovod's CPU allreduce cannot sum: bfloat16 travels as float32
#: (twice the bytes, and the sum is exact to float32; the result is cast back).
_WIRE_DTYPE = {torch.bfloat16: torch.float32}


def wire_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a gradient of ``dtype`` is allreduced in (dense and AR-Topk paths)."""
    return _WIRE_DTYPE.get(dtype, dtype)


@dataclass(frozen=True)
class StepConfig:
    """What every rank agrees on for one step. ``average``: divide the sum by ``size``.
    ``predivide``: Horovod's gradient_predivide_factor (values are scaled by 1/f before the sum and
    f/size after it)."""

    step: int
    rank: int
    size: int
    cr: float
    path: str  # "allgather" | "allreduce" | "dense"
    selector: str = "star"  # AR-Topk only
    average: bool = True
    predivide: float = 1.0
    process_set: Any = None
    hvd: Any = None  # the horovod.torch module
    control: tuple = (0.0,) * CONTROL_SLOTS  # this rank's entries (see combine_control)
    agreement: int = 0  # hash of (settings, step, CR, path); must be equal on every rank
    #: appended to the collectives' names. Adaptive's span steps (``flexible.py``) send another
    #: size than the steps around them: under its own name each size stays in Horovod's response
    #: cache, so neither the span step nor the step after it renegotiates its message.
    name_suffix: str = ""


@dataclass
class Pending:
    """A message in flight. ``error_fed`` is the step's ``G``; ``handle`` the current collective."""

    msg: GradMessage
    cfg: StepConfig
    error_fed: torch.Tensor
    k: int
    sq_total: float
    nonfinite_local: bool
    handle: Any = None
    phase: str = "launched"
    indices: Optional[torch.Tensor] = None
    root: Optional[int] = None
    bytes_sent: int = 0
    compress_s: float = 0.0
    comm_s: float = 0.0
    comm_started: float = 0.0
    first_s: float = 0.0  # allgather (AG) or index broadcast (AR) wall time
    second_s: float = 0.0  # value allreduce (AR) wall time
    var_s: float = 0.0  # VAR's norm allgather wall time


@dataclass
class MessageOutcome:
    """The result of one message's step, for the optimizer's statistics."""

    result: torch.Tensor
    skipped: bool
    nonfinite_ranks: list = field(default_factory=list)
    gain: float = 1.0
    k: int = 0
    root: Optional[int] = None
    bytes_sent: int = 0
    compress_s: float = 0.0
    comm_s: float = 0.0
    control: list = field(default_factory=list)  # as received: see combine_control
    timings_ms: tuple = (0.0, 0.0, 0.0)  # this rank's (first, second, VAR) collective times


def _small_hash(agreement: int, size: int, dtype: torch.dtype) -> Optional[int]:
    """The agreement hash reduced so that Σh and Σh² over ``size`` ranks stay exact integers in
    ``dtype`` (float32: 8 bits up to 256 ranks, 4 bits beyond; float64: 16 bits). Half-precision
    payloads carry no check (None: a zero is sent)."""
    if dtype == torch.float64:
        bits = 16
    elif dtype == torch.float32:
        bits = 8 if size <= 256 else 4
    else:
        return None
    return agreement % (1 << bits)


def _disagree(cfg: StepConfig, hashes: Optional[list]) -> None:
    seen = f" (per-rank hashes {hashes})" if hashes else ""
    raise RuntimeError(
        f"hvd_flexcomm: ranks disagree on step / CR / collective at this rank's step {cfg.step} "
        f"(cr {cfg.cr!r}, path {cfg.path}){seen}; the ranks' training state has diverged, "
        "stopping before gradients mix")


def _collective_kwargs(cfg: StepConfig) -> dict:
    return {} if cfg.process_set is None else {"process_set": cfg.process_set}


def _generator(cfg: StepConfig, msg: GradMessage) -> torch.Generator:
    # Seed of the threshold sample: deterministic in (step, message), so resumed runs repeat.
    return torch.Generator().manual_seed((cfg.step * 1_000_003 + msg.index) & 0x7FFFFFFF)


def launch(msg: GradMessage, cfg: StepConfig) -> Pending:
    """Error-feed the message's gradients, select, and submit the first collective."""
    hvd = cfg.hvd
    t0 = time.perf_counter()
    error_fed = msg.flat_grads().add_(msg.residual)
    sq_total = squared_norm(error_fed)
    nonfinite = has_nonfinite(error_fed, sq_total)
    k = msg.numel if cfg.path == "dense" else k_for(cfg.cr, msg.numel)
    pending = Pending(msg, cfg, error_fed, k, sq_total, nonfinite)
    kw = _collective_kwargs(cfg)

    if cfg.path == "dense":
        pre = 1.0 / cfg.predivide if cfg.average else 1.0
        post = cfg.predivide if cfg.average else 1.0
        op = hvd.Average if cfg.average else hvd.Sum
        wire = error_fed.to(wire_dtype(error_fed.dtype))  # the same tensor unless bfloat16
        pending.bytes_sent = wire.numel() * wire.element_size()
        pending.compress_s = time.perf_counter() - t0
        pending.comm_started = time.perf_counter()
        pending.handle = hvd.allreduce_async_(wire, name=msg.name + ".dense", op=op,
                                              prescale_factor=pre, postscale_factor=post, **kw)
        return pending

    if cfg.path == "allgather":
        idx = select_topk(error_fed, k, _generator(cfg, msg), msg.workspace)
        values = error_fed.index_select(0, idx.long())
        sq_sent = squared_norm(values)
        if cfg.average and cfg.predivide != 1.0:
            values = values * (1.0 / cfg.predivide)
        extras = torch.tensor([sq_sent, sq_total if not nonfinite else 0.0, float(nonfinite),
                               float(cfg.agreement % (1 << 32)), *cfg.control], dtype=_F64)
        payload = torch.cat([extras.view(torch.uint8), values.view(torch.uint8),
                             idx.view(torch.uint8)])
        pending.indices = idx
        pending.bytes_sent = payload.numel()
        pending.compress_s = time.perf_counter() - t0
        pending.comm_started = time.perf_counter()
        pending.handle = hvd.allgather_async(payload, name=msg.name + ".ag" + cfg.name_suffix,
                                             **kw)
        return pending

    if cfg.path != "allreduce":
        raise ValueError(f"unknown path {cfg.path!r}")
    local_idx = None
    if cfg.selector == "var":
        local_idx = select_topk(error_fed, k, _generator(cfg, msg), msg.workspace)
        local_sq = squared_norm(error_fed.index_select(0, local_idx.long()))
        pending.compress_s += time.perf_counter() - t0
        t1 = time.perf_counter()
        norms = synchronize(hvd, hvd.allgather_async(torch.tensor([local_sq], dtype=_F64),
                                                     name=msg.name + ".var", **kw))
        pending.var_s = time.perf_counter() - t1
        pending.comm_s += pending.var_s
        t0 = time.perf_counter()
        root = var_root(norms.tolist())
        pending.bytes_sent += 8
    else:
        root = star_root(cfg.step, cfg.size)
    if cfg.rank == root:
        idx = local_idx if local_idx is not None else select_topk(
            error_fed, k, _generator(cfg, msg), msg.workspace)
    else:
        idx = torch.empty(k, dtype=torch.int32)
    pending.root = root
    pending.indices = idx
    pending.bytes_sent += idx.numel() * idx.element_size()
    pending.compress_s += time.perf_counter() - t0
    pending.comm_started = time.perf_counter()
    pending.handle = hvd.broadcast_async_(idx, root, name=msg.name + ".idx" + cfg.name_suffix,
                                          **kw)
    return pending


def advance(pending: Pending) -> None:
    """AR-Topk: wait for the root's indices, then submit the allreduce of this rank's values."""
    if pending.cfg.path != "allreduce" or pending.phase != "launched":
        return
    cfg, hvd = pending.cfg, pending.cfg.hvd
    synchronize(hvd, pending.handle)
    t0 = time.perf_counter()
    pending.first_s = t0 - pending.comm_started
    pending.comm_s += pending.first_s
    idx = pending.indices
    values = pending.error_fed.index_select(0, idx.long())
    local_gain = gain(squared_norm(values), pending.sq_total) if not pending.nonfinite_local else 0.0
    values = values.to(wire_dtype(values.dtype))
    if cfg.average and cfg.predivide != 1.0:
        values = values * (1.0 / cfg.predivide)
    extras = torch.zeros(ar_extra_entries(cfg.size), dtype=values.dtype)
    extras[cfg.rank] = 1.0 if pending.nonfinite_local else 0.0
    extras[cfg.size] = local_gain
    h = _small_hash(cfg.agreement, cfg.size, values.dtype) or 0
    extras[cfg.size + 1] = float(h)
    extras[cfg.size + 2] = float(h * h)
    control = torch.tensor(cfg.control, dtype=values.dtype)
    base = cfg.size + _EXTRA_AR_FIXED
    if cfg.rank == 0:  # the sum delivers rank 0's control entries to everyone
        extras[cfg.size + 3:base] = control
    n_t = len(TIMING_SLOTS)  # and every rank's timings, each in its own slots
    extras[base + n_t * cfg.rank: base + n_t * (cfg.rank + 1)] = control[list(TIMING_SLOTS)]
    payload = torch.cat([values, extras])
    pending.bytes_sent += payload.numel() * payload.element_size()
    pending.phase = "reducing"
    pending.compress_s += time.perf_counter() - t0
    pending.comm_started = time.perf_counter()
    pending.handle = hvd.allreduce_async_(payload, name=pending.msg.name + ".ar" + cfg.name_suffix,
                                          op=hvd.Sum,
                                          **_collective_kwargs(cfg))


def _field(rows: torch.Tensor, first: int, end: int, dtype: torch.dtype) -> torch.Tensor:
    """Bytes ``first:end`` of every gathered row, reinterpreted as ``dtype``.

    The slice is copied into fresh, densely packed storage first: a byte offset or row length
    need not be a multiple of ``dtype``'s size (odd k with float64, float16 values before int32
    indices), and with one row the slice is already "contiguous", so ``.contiguous()`` would
    not copy it.
    """
    if end <= first:  # an empty field (k = 0): nothing to reinterpret
        return torch.empty(rows.shape[0], 0, dtype=dtype)
    return rows[:, first:end].clone(memory_format=torch.contiguous_format).view(dtype)


def finish(pending: Pending) -> MessageOutcome:
    """Wait for the last collective, aggregate into a dense result, commit the residual.

    On a skipped step (some rank's ``G`` was non-finite) the residual is left as it was and the
    result is all zeros.
    """
    advance(pending)
    cfg, hvd, msg = pending.cfg, pending.cfg.hvd, pending.msg
    output = synchronize(hvd, pending.handle)
    t0 = time.perf_counter()
    if cfg.path == "dense":
        output = output.to(msg.dtype)  # a no-op unless the gradient travelled in wire_dtype
    if cfg.path == "allreduce":
        pending.second_s = t0 - pending.comm_started
    else:
        pending.first_s = t0 - pending.comm_started
    pending.comm_s += t0 - pending.comm_started
    n, size, k = msg.numel, cfg.size, pending.k
    outcome = MessageOutcome(result=output, skipped=False, k=k, root=pending.root,
                             bytes_sent=pending.bytes_sent)

    if cfg.path == "dense":
        # every rank holds the same reduced tensor, so this decision is identical on all ranks
        reduced_sq = squared_norm(output)
        if has_nonfinite(output, reduced_sq):
            outcome.skipped = True
            outcome.nonfinite_ranks = [cfg.rank] if pending.nonfinite_local else []
        else:
            msg.residual.zero_()
            outcome.gain = 1.0
    elif cfg.path == "allgather":
        rows = output.view(size, -1)
        value_bytes = k * msg.residual.element_size()
        start = 8 * _EXTRA_AG
        extras = _field(rows, 0, start, _F64)
        values = _field(rows, start, start + value_bytes, msg.dtype)
        indices = _field(rows, start + value_bytes, rows.shape[1], torch.int32)
        flags = extras[:, 2]
        outcome.control = combine_control(extras[0, 4:], extras[:, 4:][:, list(TIMING_SLOTS)])
        hashes = extras[:, 3]
        if bool((hashes != hashes[0]).any()):
            _disagree(cfg, [int(h) for h in hashes.tolist()])
        if bool((flags != 0).any()):
            outcome.skipped = True
            outcome.nonfinite_ranks = [int(r) for r in torch.nonzero(flags).view(-1)]
        else:
            result = torch.zeros(n, dtype=msg.dtype)
            result.index_add_(0, indices.reshape(-1).long(), values.reshape(-1))
            if cfg.average:
                result.mul_(cfg.predivide / size)
            outcome.result = result
            outcome.gain = gain(float(extras[:, 0].sum()), float(extras[:, 1].sum()))
            msg.residual = commit_residual(pending.error_fed, pending.indices)
    else:
        values, flags, gain_sum = output[:k], output[k:k + size], output[k + size]
        h_sum, h2_sum = float(output[k + size + 1]), float(output[k + size + 2])
        base = k + size + _EXTRA_AR_FIXED
        outcome.control = combine_control(output[k + size + 3:base],
                                          output[base:].view(size, len(TIMING_SLOTS)))
        # all h equal  <=>  (Σh)² == N·Σh²  (Cauchy-Schwarz); exact: small integers
        if _small_hash(cfg.agreement, size, output.dtype) is not None and h_sum * h_sum != size * h2_sum:
            _disagree(cfg, None)
        if bool((flags != 0).any()):
            outcome.skipped = True
            outcome.nonfinite_ranks = [int(r) for r in torch.nonzero(flags).view(-1)]
        else:
            if cfg.average:
                values = values * (cfg.predivide / size)
            result = torch.zeros(n, dtype=msg.dtype)
            result.index_copy_(0, pending.indices.long(), values.to(msg.dtype))
            outcome.result = result
            outcome.gain = min(1.0, max(0.0, float(gain_sum) / size))
            msg.residual = commit_residual(pending.error_fed, pending.indices)
    if outcome.skipped:
        outcome.result = torch.zeros(n, dtype=msg.dtype)
    outcome.compress_s = pending.compress_s + (time.perf_counter() - t0)
    outcome.comm_s = pending.comm_s
    outcome.timings_ms = (1e3 * pending.first_s, 1e3 * pending.second_s, 1e3 * pending.var_s)
    pending.phase = "done"
    return outcome
