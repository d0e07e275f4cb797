"""How per-rank collective timings become the one number every rank learns (sync.py)."""

from __future__ import annotations

import pytest
import torch

from hvd_flexcomm.sync import combine_control, combine_timings, delivered_ms


def _star_step(root: int, size: int, select_ms: float, buffer_ms: float, wire_ms: float,
               reduce_ms: float) -> torch.Tensor:
    """Per-rank ``[broadcast, allreduce, VAR]`` ms of one AR-Topk STAR step, built from events on
    one clock (every rank starts at 0): the root selects its top-k (``select_ms``) while the
    others already wait in the broadcast, hands the indices to the transport (``buffer_ms``) and
    enters the allreduce; the indices reach the others ``wire_ms`` after the root entered, and
    the allreduce ends ``reduce_ms`` after the last rank entered it."""
    arrive = select_ms + wire_ms
    end = arrive + reduce_ms
    rows = []
    for r in range(size):
        if r == root:
            enter_bcast, leave_bcast = select_ms, select_ms + buffer_ms
        else:
            enter_bcast, leave_bcast = 0.0, arrive
        rows.append([leave_bcast - enter_bcast, end - leave_bcast, 0.0])
    return torch.tensor(rows, dtype=torch.float64)


def test_broadcast_of_a_root_that_enters_last_is_timed_until_delivery():
    t = _star_step(root=2, size=4, select_ms=30.0, buffer_ms=0.5, wire_ms=40.0, reduce_ms=6.0)
    # the plain minimum over ranks sees only the root's buffering
    assert t[:, 0].min().item() == pytest.approx(0.5)
    got = combine_timings(t).tolist()
    assert got == pytest.approx([40.0, 6.0, 0.0])
    # the sum is the step's time from the root's entry, as the model adds the two collectives
    assert sum(got) == pytest.approx((t[:, 0] + t[:, 1]).min().item())


def test_a_collective_with_nothing_after_it_is_its_minimum_over_ranks():
    t = torch.tensor([[5.0, 0.0, 2.0], [3.0, 0.0, 4.0], [9.0, 0.0, 1.5]])
    assert combine_timings(t).tolist() == [3.0, 0.0, 1.5]
    assert delivered_ms(t[:, 0], torch.zeros(3)).item() == 3.0


def test_delivered_is_never_below_the_minimum_and_works_column_by_column():
    gen = torch.Generator().manual_seed(0)
    first = torch.rand(5, 7, generator=gen, dtype=torch.float64) * 10
    then = torch.rand(5, 7, generator=gen, dtype=torch.float64) * 10
    got = delivered_ms(first, then)
    assert got.shape == (7,)
    assert bool((got >= first.min(dim=0).values - 1e-12).all())
    for j in range(7):
        want = min(first[r, j] + then[r, j] for r in range(5)) - min(then[:, j])
        assert got[j].item() == pytest.approx(want.item())


def test_combine_control_keeps_rank_0s_other_entries():
    rank0 = torch.tensor([2.0, 0.5, 46.0, 0.0, 1.0])
    t = _star_step(root=0, size=2, select_ms=10.0, buffer_ms=0.5, wire_ms=20.0, reduce_ms=3.0)
    assert combine_control(rank0, t) == pytest.approx([2.0, 20.0, 3.0, 0.0, 1.0])
