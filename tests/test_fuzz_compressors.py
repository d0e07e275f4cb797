"""Property (fuzz) tests of the compressor math, in-process and without Horovod.

- ``select_topk`` / ``k_for``: exact top-k on random shapes, dtypes, layouts and value
  distributions (ties, zeros, huge and tiny magnitudes), on both the exact and the sampled path;
- error feedback: ``residual + sent == error-fed`` exactly, step after step, as ``sync.py`` does it;
- ``GradMessage.flat_grads`` / ``write_grads`` round trips (0-d, empty, non-contiguous, sparse and
  missing gradients) and ``build_messages`` partitions;
- the byte packing of AG-Topk and the payload layout of AR-Topk, through the *real*
  ``sync.launch`` / ``advance`` / ``finish``: every rank runs in its own thread against a small
  in-memory stand-in for Horovod's collectives (allgather / broadcast / allreduce), so the packing,
  unpacking, aggregation, residual commit and non-finite skip are all exercised for every dtype,
  odd and even k, 1 to 4 ranks.
"""

from __future__ import annotations

import math
import threading

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hvd_flexcomm.sync as sync_mod
from hvd_flexcomm.error_feedback import commit_residual, squared_norm
from hvd_flexcomm.messages import GradMessage, build_messages
from hvd_flexcomm.selectors import star_root, var_root
from hvd_flexcomm.sync import CONTROL_SLOTS, TIMING_SLOTS, StepConfig, advance, finish, launch
from hvd_flexcomm.topk import _EXACT_BELOW, TopkWorkspace, k_for, select_topk

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
VALUE_KINDS = ["normal", "ties", "zeros", "huge", "tiny", "small_ints", "one_spike"]
LAYOUTS = ["contiguous", "transposed", "strided", "expanded"]
#: Largest magnitude generated for "huge" values, per dtype (finite after the cast).
_HUGE = {torch.float32: 1e30, torch.float64: 1e200, torch.float16: 6e4, torch.bfloat16: 1e30}

# cr in (0, 1]: tiny ratios (k = 1), the top end (k = numel) and everything in between.
crs = st.one_of(
    st.floats(min_value=1e-12, max_value=1.0, allow_nan=False, exclude_min=False),
    st.sampled_from([1e-12, 1e-6, 0.001, 0.01, 0.05, 0.25, 0.5, 0.999, 1.0]),
)

#: Bytes of float64 metadata at the head of each rank's AG-Topk row (read from sync.py, whose
#: layout evolves: sq_sent, sq_total, nonfinite, agreement, control...).
_HEAD = 8 * sync_mod._EXTRA_AG

FAST = settings(deadline=None, max_examples=150, suppress_health_check=[HealthCheck.too_slow])


# --------------------------------------------------------------------------------------------
# tensor generation
# --------------------------------------------------------------------------------------------
def _values(shape: tuple, kind: str, dtype: torch.dtype, g: torch.Generator) -> torch.Tensor:
    """float64 values of ``shape`` following ``kind``, clamped so the cast to ``dtype`` is finite."""
    n = math.prod(shape)
    if kind == "normal":
        v = torch.randn(n, generator=g, dtype=torch.float64)
    elif kind == "ties":  # a handful of magnitudes, both signs, many zeros
        v = torch.randint(-3, 4, (n,), generator=g).double() * 0.5
    elif kind == "zeros":  # +0.0 and -0.0 only
        v = torch.zeros(n, dtype=torch.float64)
        v[torch.rand(n, generator=g) < 0.5] = -0.0
    elif kind == "huge":
        v = torch.randn(n, generator=g, dtype=torch.float64) * (_HUGE[dtype] / 4)
    elif kind == "tiny":  # subnormal or flushed to zero in the low-precision dtypes
        v = torch.randn(n, generator=g, dtype=torch.float64) * 1e-30
    elif kind == "small_ints":
        v = torch.randint(-2, 3, (n,), generator=g).double()
    elif kind == "one_spike":
        v = torch.full((n,), 1.0, dtype=torch.float64)
        if n:
            v[int(torch.randint(0, n, (1,), generator=g))] = -_HUGE[dtype] / 2
    else:
        raise ValueError(kind)
    v = v.clamp(-_HUGE[dtype], _HUGE[dtype])
    return v.reshape(shape)


def _laid_out(values: torch.Tensor, layout: str, dtype: torch.dtype) -> torch.Tensor:
    """``values`` (float64) as a ``dtype`` tensor of the same shape with the given memory layout:
    the same contents, except ``"expanded"`` (stride 0), which repeats the first row."""
    shape = tuple(values.shape)
    if layout == "contiguous" or values.dim() == 0:
        return values.to(dtype)
    if layout == "transposed":  # storage in reversed dimension order
        dims = list(range(values.dim()))[::-1]
        return values.permute(dims).contiguous().to(dtype).permute(dims)
    if layout == "strided":  # every other element of a twice-as-long last dimension
        wide = torch.zeros(*shape[:-1], 2 * shape[-1], dtype=dtype)
        wide[..., ::2] = values.to(dtype)
        return wide[..., ::2]
    if layout == "expanded":  # stride 0 along the first dimension: the same row repeated
        if shape[0] == 0:
            return values.to(dtype)
        return values[:1].to(dtype).expand(*shape)
    raise ValueError(layout)


@st.composite
def tensors(draw, max_dim: int = 12, max_ndim: int = 3):
    ndim = draw(st.integers(0, max_ndim))
    shape = tuple(draw(st.lists(st.integers(0, max_dim), min_size=ndim, max_size=ndim)))
    dtype = draw(st.sampled_from(DTYPES))
    kind = draw(st.sampled_from(VALUE_KINDS))
    layout = draw(st.sampled_from(LAYOUTS))
    seed = draw(st.integers(0, 2**31 - 1))
    t = _laid_out(_values(shape, kind, dtype, torch.Generator().manual_seed(seed)), layout, dtype)
    return t


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Exact equality, NaN equal to NaN (and -0.0 equal to 0.0)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    na, nb = torch.isnan(a), torch.isnan(b)
    return bool(torch.equal(na, nb)) and bool(torch.equal(a[~na], b[~nb]))


def _assert_exact_topk(x: torch.Tensor, idx: torch.Tensor, k: int) -> None:
    assert idx.dtype == torch.int32
    assert idx.dim() == 1 and idx.numel() == k
    assert torch.unique(idx).numel() == k, "indices are not unique"
    if k:
        assert int(idx.min()) >= 0 and int(idx.max()) < x.numel()
    chosen = x.abs()[idx.long()].sort(descending=True).values
    best = torch.topk(x.abs(), k).values.sort(descending=True).values
    assert torch.equal(chosen, best), (chosen[:8], best[:8])  # ties may pick other slots


# --------------------------------------------------------------------------------------------
# k_for and select_topk
# --------------------------------------------------------------------------------------------
@settings(deadline=None, max_examples=300)
@given(cr=crs, numel=st.integers(0, 10**9))
def test_k_for_bounds(cr, numel):
    k = k_for(cr, numel)
    if numel == 0:
        assert k == 0
        return
    assert 1 <= k <= numel
    assert abs(k - cr * numel) <= 0.5 or k == 1
    if cr == 1.0:
        assert k == numel


_SHARED_WORKSPACE = TopkWorkspace()  # reused across examples of different sizes and dtypes


@FAST
@given(t=tensors(), cr=crs, seed=st.integers(0, 2**31 - 1), reuse=st.booleans())
def test_select_topk_exact_on_reshaped_tensors(t, cr, seed, reuse):
    flat = t.reshape(-1)  # what GradMessage.flat_grads does with every gradient
    before = flat.clone()
    k = k_for(cr, flat.numel())
    ws = _SHARED_WORKSPACE if reuse else None
    idx = select_topk(flat, k, torch.Generator().manual_seed(seed), ws)
    _assert_exact_topk(flat, idx, k)
    assert _same(flat, before), "select_topk modified its input"
    if k == flat.numel():
        assert torch.equal(idx, torch.arange(k, dtype=torch.int32))


@FAST
@given(t=tensors(max_ndim=1, max_dim=200), cr=crs, step=st.integers(1, 4))
def test_select_topk_on_strided_1d_view(t, cr, step):
    """A 1-D but non-contiguous tensor passed directly (no reshape copy)."""
    view = t.reshape(-1)[::step]
    k = k_for(cr, view.numel())
    _assert_exact_topk(view, select_topk(view, k), k)


@settings(deadline=None, max_examples=25)
@given(n=st.integers(_EXACT_BELOW, 4 * _EXACT_BELOW), frac=st.floats(1e-6, 0.25),
       dtype=st.sampled_from(DTYPES), kind=st.sampled_from(VALUE_KINDS),
       seed=st.integers(0, 2**31 - 1), strided=st.booleans())
def test_select_topk_sampled_path_is_exact(n, frac, dtype, kind, seed, strided):
    """Large tensors with k <= n/4 take the sampled-threshold path (plus retries / fallback)."""
    g = torch.Generator().manual_seed(seed)
    x = _values((n,), kind, dtype, g).to(dtype)
    if strided:
        x = _laid_out(x.double(), "strided", dtype)
    k = max(1, min(n // 4, int(frac * n)))
    ws = TopkWorkspace()
    idx = select_topk(x, k, torch.Generator().manual_seed(seed), ws)
    _assert_exact_topk(x, idx, k)
    # reproducible: the same generator seed and a reused workspace give the same set
    again = select_topk(x, k, torch.Generator().manual_seed(seed), ws)
    assert torch.equal(idx.sort().values, again.sort().values)


# --------------------------------------------------------------------------------------------
# error feedback, the way sync.launch / sync.finish do it
# --------------------------------------------------------------------------------------------
@st.composite
def param_specs(draw, max_params: int = 5):
    """Shapes of a message's parameters: 0-d, empty and ordinary ones."""
    count = draw(st.integers(1, max_params))
    shapes = []
    for _ in range(count):
        ndim = draw(st.integers(0, 3))
        shapes.append(tuple(draw(st.lists(st.integers(0, 9), min_size=ndim, max_size=ndim))))
    return shapes


def _params(shapes, dtype) -> list:
    return [torch.nn.Parameter(torch.zeros(s, dtype=dtype)) for s in shapes]


def _set_grads(params, g: torch.Generator, kind: str, layouts: list, none_mask: list,
               sparse_mask: list | None = None) -> None:
    for i, p in enumerate(params):
        if none_mask[i]:
            p.grad = None
            continue
        v = _values(tuple(p.shape), kind, p.dtype, g)
        if sparse_mask and sparse_mask[i] and p.dim() == 2:
            p.grad = v.to(p.dtype).to_sparse()
        else:
            p.grad = _laid_out(v, layouts[i % len(layouts)], p.dtype)


def _expected_flat(params) -> torch.Tensor:
    pieces = []
    for p in params:
        if p.grad is None:
            pieces.append(torch.zeros(p.numel(), dtype=p.dtype))
        else:
            g = p.grad.to_dense() if p.grad.is_sparse else p.grad
            pieces.append(g.reshape(-1))
    return torch.cat(pieces) if pieces else torch.zeros(0)


@settings(deadline=None, max_examples=120)
@given(shapes=param_specs(), dtype=st.sampled_from(DTYPES), kind=st.sampled_from(VALUE_KINDS),
       cr=crs, steps=st.integers(1, 4), seed=st.integers(0, 2**31 - 1),
       layouts=st.lists(st.sampled_from(LAYOUTS), min_size=1, max_size=4),
       none_mask=st.lists(st.booleans(), min_size=5, max_size=5))
def test_error_feedback_conserves_every_entry(shapes, dtype, kind, cr, steps, seed, layouts,
                                              none_mask):
    g = torch.Generator().manual_seed(seed)
    params = _params(shapes, dtype)
    msg = GradMessage(0, params)
    k = k_for(cr, msg.numel)
    for step in range(steps):
        _set_grads(params, g, kind, layouts, none_mask)
        # sync.launch
        error_fed = msg.flat_grads().add_(msg.residual)
        expected = error_fed.clone()
        idx = select_topk(error_fed, k, torch.Generator().manual_seed(step), msg.workspace)
        values = error_fed.index_select(0, idx.long())
        # sync.finish
        residual = commit_residual(error_fed, idx)
        assert residual is error_fed  # in place, as documented
        msg.residual = residual
        sent = torch.zeros(msg.numel, dtype=dtype).index_copy_(0, idx.long(), values)
        assert _same(residual + sent, expected)
        assert int(torch.count_nonzero(residual[idx.long()])) == 0
        _assert_exact_topk(expected, idx, k)


# --------------------------------------------------------------------------------------------
# GradMessage round trips and build_messages
# --------------------------------------------------------------------------------------------
@settings(deadline=None, max_examples=150)
@given(shapes=param_specs(max_params=6), dtype=st.sampled_from(DTYPES),
       kind=st.sampled_from(VALUE_KINDS), seed=st.integers(0, 2**31 - 1),
       layouts=st.lists(st.sampled_from(LAYOUTS), min_size=1, max_size=4),
       none_mask=st.lists(st.booleans(), min_size=6, max_size=6),
       sparse_mask=st.lists(st.booleans(), min_size=6, max_size=6))
def test_flat_grads_write_grads_round_trip(shapes, dtype, kind, seed, layouts, none_mask,
                                           sparse_mask):
    g = torch.Generator().manual_seed(seed)
    params = _params(shapes, dtype)
    msg = GradMessage(3, params)
    assert msg.numel == sum(p.numel() for p in params)
    assert msg.offsets == [sum(p.numel() for p in params[:i]) for i in range(len(params))]
    assert msg.residual.shape == (msg.numel,) and msg.residual.dtype == dtype
    assert int(torch.count_nonzero(msg.residual)) == 0
    _set_grads(params, g, kind, layouts, none_mask, sparse_mask)
    grads_before = [None if p.grad is None else p.grad.clone() for p in params]

    flat = msg.flat_grads()
    assert flat.dim() == 1 and flat.numel() == msg.numel and flat.dtype == dtype
    assert _same(flat, _expected_flat(params).to(dtype))
    flat.add_(1)  # a new tensor: the gradients are not views of it
    for p, before in zip(params, grads_before):
        assert (p.grad is None) == (before is None)
        if before is not None:
            assert _same(p.grad.to_dense() if p.grad.is_sparse else p.grad,
                         before.to_dense() if before.is_sparse else before)

    new = _values((msg.numel,), "normal", dtype, g).to(dtype)
    msg.write_grads(new)
    for p, off, n in zip(params, msg.offsets, msg.numels):
        assert p.grad is not None and p.grad.shape == p.shape and p.grad.dtype == dtype
        assert _same(p.grad.reshape(-1), new[off:off + n])
        if n:
            assert p.grad.untyped_storage().data_ptr() == new.untyped_storage().data_ptr()
    assert _same(msg.flat_grads(), new)
    if msg.numel:
        new[-1] = 7.0  # views, not copies
        last = next(p for p in reversed(params) if p.numel())
        assert float(last.grad.reshape(-1)[-1]) == 7.0


@settings(deadline=None, max_examples=100)
@given(shapes=param_specs(max_params=8), dtypes=st.lists(st.sampled_from(DTYPES), min_size=8,
                                                         max_size=8),
       cap=st.integers(0, 600), granularity=st.sampled_from(["model", "bucket"]))
def test_build_messages_partitions_parameters(shapes, dtypes, cap, granularity):
    params = [torch.nn.Parameter(torch.zeros(s, dtype=dt)) for s, dt in zip(shapes, dtypes)]
    msgs = build_messages(params, granularity, cap)
    seen = [p for m in msgs for p in m.params]
    assert sorted(map(id, seen)) == sorted(map(id, params))  # every parameter exactly once
    assert [m.index for m in msgs] == list(range(len(msgs)))
    for m in msgs:
        assert {p.dtype for p in m.params} == {m.dtype}
        if granularity == "bucket" and len(m.params) > 1:
            assert m.nbytes() <= cap
    if granularity == "bucket":
        assert [id(p) for p in seen] == [id(p) for p in reversed(params)]  # backward order
    else:
        assert len(msgs) == len({p.dtype for p in params})


# --------------------------------------------------------------------------------------------
# byte-level views the AG payload relies on
# --------------------------------------------------------------------------------------------
@settings(deadline=None, max_examples=200)
@given(dtype=st.sampled_from(DTYPES), k=st.integers(0, 9), rows=st.integers(2, 5),
       kind=st.sampled_from(VALUE_KINDS), seed=st.integers(0, 2**31 - 1))
def test_uint8_view_round_trip_for_every_dtype(dtype, k, rows, kind, seed):
    """``values.view(uint8)`` then, on the gathered (rows, bytes) matrix, a column slice
    ``.contiguous().view(dtype)`` gives every row's values back bit for bit (odd k included)."""
    g = torch.Generator().manual_seed(seed)
    head = torch.randn(rows, _HEAD // 8, generator=g, dtype=torch.float64)
    vals = [_values((k,), kind, dtype, g).to(dtype) for _ in range(rows)]
    idx = [torch.randint(0, 2**31 - 1, (k,), generator=g, dtype=torch.int32) for _ in range(rows)]
    payloads = [torch.cat([head[r].view(torch.uint8), vals[r].view(torch.uint8),
                           idx[r].view(torch.uint8)]) for r in range(rows)]
    assert all(p.numel() == _HEAD + k * (vals[0].element_size() + 4) for p in payloads)
    gathered = torch.cat(payloads).view(rows, -1)
    vb = k * vals[0].element_size()
    got_head = gathered[:, :_HEAD].contiguous().view(torch.float64)
    got_vals = gathered[:, _HEAD:_HEAD + vb].contiguous().view(dtype)
    got_idx = gathered[:, _HEAD + vb:].contiguous().view(torch.int32)
    assert torch.equal(got_head, head)
    for r in range(rows):
        assert torch.equal(got_vals[r].view(torch.uint8), vals[r].view(torch.uint8))
        assert torch.equal(got_idx[r], idx[r])


# --------------------------------------------------------------------------------------------
# the real sync.launch / advance / finish against in-memory collectives
# --------------------------------------------------------------------------------------------
class _World:
    """In-memory stand-in for Horovod's collectives among ``size`` threads (one per rank).

    Collectives match by (name, per-rank call count); inputs are copied at submission; results
    are computed once, in rank order, so every rank receives identical data (as with Horovod).
    """

    Average, Sum, Adasum = 0, 1, 2

    def __init__(self, size: int) -> None:
        self.size = size
        self.cond = threading.Condition()
        self.ops: dict = {}
        self.counts: dict = {}
        self.failed: BaseException | None = None

    def submit(self, rank: int, name: str, kind: str, tensor: torch.Tensor, **args):
        with self.cond:
            n = self.counts.get((rank, name), 0)
            self.counts[(rank, name)] = n + 1
            key = (name, n)
            op = self.ops.setdefault(key, {"kind": kind, "args": args, "inputs": {}})
            assert op["kind"] == kind and op["args"] == args, (key, op["kind"], kind, args)
            op["inputs"][rank] = tensor.clone()
            self.cond.notify_all()
        return key, rank, tensor

    def wait(self, handle):
        key, rank, tensor = handle
        with self.cond:
            done = self.cond.wait_for(
                lambda: self.failed is not None or len(self.ops[key]["inputs"]) == self.size,
                timeout=30)
            if self.failed is not None:
                raise RuntimeError("another rank failed")
            if not done:
                raise TimeoutError(f"collective {key} incomplete: {sorted(self.ops[key]['inputs'])}")
            op = self.ops[key]
            if "result" not in op:
                op["result"] = self._compute(op)
        result = op["result"]
        if op["kind"] == "allgather":
            return result.clone()
        tensor.copy_(result)  # in-place collectives
        return tensor

    def _compute(self, op) -> torch.Tensor:
        ins = [op["inputs"][r] for r in range(self.size)]
        kind, args = op["kind"], op["args"]
        if kind == "allgather":
            return torch.cat(ins)
        if kind == "broadcast":
            return ins[args["root"]].clone()
        pre, post = args["prescale"], args["postscale"]
        acc = ins[0] * pre
        for t in ins[1:]:
            acc = acc + t * pre
        if args["op"] == self.Average:
            acc = acc / self.size
        return acc * post


class _RankHvd:
    """What ``sync.py`` calls on ``cfg.hvd``, for one rank of a :class:`_World`."""

    Average, Sum, Adasum = _World.Average, _World.Sum, _World.Adasum

    def __init__(self, world: _World, rank: int) -> None:
        self.world, self.rank = world, rank

    def allgather_async(self, tensor, name):
        return self.world.submit(self.rank, name, "allgather", tensor)

    def allgather(self, tensor, name):
        return self.synchronize(self.allgather_async(tensor, name))

    def broadcast_async_(self, tensor, root_rank, name):
        return self.world.submit(self.rank, name, "broadcast", tensor, root=root_rank)

    def allreduce_async_(self, tensor, name, op=None, prescale_factor=1.0, postscale_factor=1.0):
        op = self.Average if op is None else op
        return self.world.submit(self.rank, name, "allreduce", tensor, op=op,
                                 prescale=prescale_factor, postscale=postscale_factor)

    def synchronize(self, handle):
        return self.world.wait(handle)


def _control(rank: int, size: int = 4) -> tuple:
    # distinct per rank and exactly representable in every dtype; the timing slots shrink with
    # the rank for some slots and grow for others, so a min over ranks differs from rank 0's
    return tuple(float((size - rank) if i in (1, 3) else (rank * 8 + i + 1)) * 0.5
                 for i in range(CONTROL_SLOTS))


def _delivered(size: int) -> list:
    """What every rank must receive: rank 0's entries; the second and VAR timings' minimum over
    ranks; the first collective's delivered time: min over ranks of first + second, less the
    second's minimum (here 0.5 * size, while the first slot's minimum is 0.5)."""
    rows = [_control(r, size) for r in range(size)]
    out = [min(row[i] for row in rows) if i in TIMING_SLOTS else rows[0][i]
           for i in range(CONTROL_SLOTS)]
    first, second = TIMING_SLOTS[0], TIMING_SLOTS[1]
    out[first] = (min(row[first] + row[second] for row in rows)
                  - min(row[second] for row in rows))
    return out


def _run_ranks(world: _World, fn, collect: bool = False) -> list:
    """Run ``fn(rank)`` in one thread per rank; return the results. A rank's exception is
    re-raised (the first one), or with ``collect=True`` returned in that rank's slot (then the
    other ranks are not interrupted: use it where every rank raises after its collectives)."""
    results: list = [None] * world.size
    errors: list = []

    def body(rank):
        try:
            results[rank] = fn(rank)
        except BaseException as exc:  # noqa: BLE001 - reported below
            if collect:
                results[rank] = exc
                return
            with world.cond:
                world.failed = exc
                world.cond.notify_all()
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(r,)) for r in range(world.size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a simulated rank hung"
    if errors:
        raise errors[0]
    return results


def _step(world: _World, msgs: list, step: int, path: str, selector: str, cr: float,
          average: bool = True, predivide: float = 1.0, agreements: list | None = None,
          collect: bool = False):
    """One step of every rank's message through the real launch / advance / finish. Returns
    (per-rank results, per-rank error-fed snapshots); a result is (pending, outcome), or the
    exception the rank raised when ``collect``."""
    fed: list = [None] * world.size

    def one_rank(r):
        cfg = StepConfig(step=step, rank=r, size=world.size, cr=cr, path=path, selector=selector,
                         average=average, predivide=predivide, hvd=_RankHvd(world, r),
                         control=_control(r, world.size), agreement=agreements[r] if agreements else 0)
        pending = launch(msgs[r], cfg)
        fed[r] = pending.error_fed.clone()
        advance(pending)
        return pending, finish(pending)

    return _run_ranks(world, one_rank, collect=collect), fed


def _tolerance(dtype: torch.dtype, size: int, magnitude: torch.Tensor) -> torch.Tensor:
    info = torch.finfo(dtype)
    return 4 * (size + 3) * info.eps * magnitude + 8 * info.tiny


def _simulate(size: int, path: str, selector: str, dtype: torch.dtype, shapes: list, cr: float,
              kind: str, steps: int, seed: int, average: bool = True, predivide: float = 1.0,
              bad: tuple | None = None) -> None:
    """Run ``steps`` steps of one message on ``size`` simulated ranks through the real
    ``sync.launch`` / ``advance`` / ``finish`` and check every invariant of each step."""
    world = _World(size)
    params = [_params(shapes, dtype) for _ in range(size)]
    msgs = [GradMessage(0, params[r]) for r in range(size)]
    n = msgs[0].numel
    for step in range(steps):
        for r in range(size):
            g = torch.Generator().manual_seed(seed + 7919 * step + 104729 * r)
            _set_grads(params[r], g, kind, ["contiguous", "transposed"], [False] * len(shapes))
            if bad is not None and bad[:2] == (step, r) and n:
                grad = next(p for p in params[r] if p.numel()).grad
                grad[(0,) * grad.dim()] = float(bad[2])
        residual_before = [m.residual.clone() for m in msgs]
        out, fed = _step(world, msgs, step, path, selector, cr, average, predivide)
        pendings, outcomes = [o[0] for o in out], [o[1] for o in out]
        k = n if path == "dense" else k_for(cr, n)
        nonfinite = [r for r in range(size) if not bool(torch.isfinite(fed[r]).all())]
        for r, o in enumerate(outcomes):
            assert o.k == k
            assert o.result.shape == (n,) and o.result.dtype == dtype
            assert o.skipped == bool(nonfinite), (r, o.skipped, nonfinite)
            assert _same(o.result, outcomes[0].result), "ranks received different gradients"
            assert 0.0 <= o.gain <= 1.0
            if path != "dense":
                assert [float(c) for c in o.control] == _delivered(len(outcomes))
            if path == "allgather":
                assert o.bytes_sent == _HEAD + k * (fed[0].element_size() + 4)
        if nonfinite:
            for r, o in enumerate(outcomes):
                assert int(torch.count_nonzero(o.result)) == 0
                assert _same(msgs[r].residual, residual_before[r]), "residual changed on a skip"
                if path != "dense":
                    assert o.nonfinite_ranks == nonfinite
            continue

        # what each rank contributed (exactly what left its residual) and the expected result
        if path == "allreduce":
            root = star_root(step, size) if selector == "star" else None
            if selector == "var":
                norms = [squared_norm(torch.topk(fed[r].abs(), k).values) for r in range(size)]
                root, best = outcomes[0].root, var_root(norms)
                # the largest norm wins; summation order may only flip near-exact ties
                assert root == best or math.isclose(norms[root], norms[best], rel_tol=1e-5) \
                    or not math.isfinite(norms[best]), (root, best, norms)
            assert all(o.root == root for o in outcomes)
            _assert_exact_topk(fed[root], pendings[root].indices, k)
            for p in pendings:
                assert torch.equal(p.indices, pendings[root].indices)
            sent_idx = [pendings[root].indices.long()] * size
        elif path == "allgather":
            sent_idx = [p.indices.long() for p in pendings]
            for r in range(size):
                _assert_exact_topk(fed[r], pendings[r].indices, k)
        else:
            sent_idx = [torch.arange(n)] * size
        contrib = [torch.zeros(n, dtype=torch.float64).index_copy_(0, sent_idx[r],
                                                                    fed[r][sent_idx[r]].double())
                   for r in range(size)]
        expected = sum(contrib) / (size if average else 1)
        scale = sum(c.abs() for c in contrib) / (size if average else 1)
        err = (outcomes[0].result.double() - expected).abs()
        assert bool((err <= _tolerance(dtype, size, scale)).all()), float(err.max())
        support = torch.zeros(n, dtype=torch.bool)
        for idx in sent_idx:
            support[idx] = True
        assert int(torch.count_nonzero(outcomes[0].result[~support])) == 0
        for r in range(size):  # residual + sent == error-fed, exactly
            if path == "dense":
                assert int(torch.count_nonzero(msgs[r].residual)) == 0
            else:
                assert _same(msgs[r].residual, fed[r].index_fill(0, sent_idx[r], 0))


@settings(deadline=None, max_examples=120, suppress_health_check=[HealthCheck.too_slow])
@given(size=st.integers(2, 4),
       mode=st.sampled_from([("allgather", "star"), ("allreduce", "star"), ("allreduce", "var"),
                             ("dense", "star")]),
       dtype=st.sampled_from(DTYPES), shapes=param_specs(max_params=4), cr=crs,
       kind=st.sampled_from(VALUE_KINDS), steps=st.integers(1, 3), seed=st.integers(0, 10**6),
       average=st.booleans(), predivide=st.sampled_from([1.0, 1.0, 2.0, 0.5]),
       bad=st.one_of(st.none(), st.tuples(st.integers(0, 2), st.integers(0, 3),
                                          st.sampled_from(["nan", "inf", "-inf"]))))
def test_sync_paths_on_simulated_ranks(size, mode, dtype, shapes, cr, kind, steps, seed, average,
                                       predivide, bad):
    if dtype == torch.float16 and kind in ("huge", "one_spike"):
        kind = "normal"  # sums of several ranks' near-65504 values overflow float16 (as in Horovod)
    _simulate(size, mode[0], mode[1], dtype, shapes, cr, kind, steps, seed,
              average=average, predivide=predivide if average else 1.0, bad=bad)


_DTYPE_IDS = [str(dt).split(".")[-1] for dt in DTYPES]


@pytest.mark.parametrize("path", ["allgather", "allreduce"])
@pytest.mark.parametrize("dtype", DTYPES, ids=_DTYPE_IDS)
@pytest.mark.parametrize("k", [1, 2, 3, 4, 5])
def test_sync_odd_and_even_k_on_two_ranks(path, dtype, k):
    """Deterministic coverage of every dtype with odd and even k (numel 10, cr = k / 10)."""
    _simulate(2, path, "star", dtype, [(2, 5)], k / 10, "normal", steps=3, seed=k)


_SINGLE_RANK_CASES = [(dt, k) for dt in DTYPES for k in (1, 2, 3, 4, 5)]


@pytest.mark.parametrize("dtype,k", [
    pytest.param(dt, k, id=f"{str(dt).split('.')[-1]}-k{k}") for dt, k in _SINGLE_RANK_CASES])
def test_sync_allgather_on_a_single_rank(dtype, k):
    """AG-Topk with one rank (a one-process run, or a process set of one) for every dtype and k.
    The byte fields of a row need not be aligned to their dtype (odd k with float64, float16
    values before int32 indices): the gather must copy before reinterpreting."""
    _simulate(1, "allgather", "star", dtype, [(k * 10,)], 0.1, "normal", steps=2, seed=k)


@pytest.mark.parametrize("path", ["allgather", "allreduce"])
@pytest.mark.parametrize("size", [1, 2, 3])
def test_sync_empty_message(size, path):
    """A message of zero elements (k = 0): the gathered rows hold only the float64 header."""
    _simulate(size, path, "star", torch.float32, [(0,)], 1.0, "normal", steps=2, seed=0)


@pytest.mark.parametrize("path", ["allreduce", "dense"])
@pytest.mark.parametrize("dtype", DTYPES, ids=_DTYPE_IDS)
def test_sync_other_paths_on_a_single_rank(path, dtype):
    _simulate(1, path, "star", dtype, [(3, 7), ()], 0.2, "normal", steps=2, seed=1)


def _detects_mismatch(path: str, dtype: torch.dtype, size: int, agreements: list) -> bool:
    """Whether the payload's agreement check can see these per-rank hashes differ: AG rows carry
    32 bits; AR sums carry 16 (float64) or 8 (float32, and bfloat16, which is summed as float32)
    bits and nothing in float16."""
    dtype = sync_mod.wire_dtype(dtype)
    if path == "allgather":
        bits = 32
    elif dtype == torch.float64:
        bits = 16
    elif dtype == torch.float32:
        bits = 8 if size <= 256 else 4
    else:
        return False
    return len({a % (1 << bits) for a in agreements}) > 1


@settings(deadline=None, max_examples=80)
@given(size=st.integers(2, 4), path=st.sampled_from(["allgather", "allreduce"]),
       dtype=st.sampled_from(DTYPES), shapes=param_specs(max_params=3), cr=crs,
       seed=st.integers(0, 10**6), base=st.integers(0, 2**62),
       deltas=st.lists(st.sampled_from([0, 0, 1, 256, 1 << 16, 1 << 32, 12345]), min_size=4,
                       max_size=4))
def test_agreement_mismatch_stops_every_rank_and_keeps_residuals(size, path, dtype, shapes, cr,
                                                                 seed, base, deltas):
    agreements = [base + d for d in deltas[:size]]
    world = _World(size)
    params = [_params(shapes, dtype) for _ in range(size)]
    msgs = [GradMessage(0, params[r]) for r in range(size)]
    for r in range(size):
        _set_grads(params[r], torch.Generator().manual_seed(seed + r), "normal", ["contiguous"],
                   [False] * len(shapes))
    before = [m.residual.clone() for m in msgs]
    results, _ = _step(world, msgs, 0, path, "star", cr, agreements=agreements, collect=True)
    if _detects_mismatch(path, dtype, size, agreements):
        for r, res in enumerate(results):
            assert isinstance(res, RuntimeError), (r, res)
            assert "ranks disagree" in str(res)
            assert _same(msgs[r].residual, before[r]), "residual committed on a disagreeing step"
    else:
        for r, res in enumerate(results):
            assert not isinstance(res, BaseException), (r, res)
