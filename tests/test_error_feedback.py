import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hvd_flexcomm.error_feedback import commit_residual, gain, has_nonfinite, squared_norm
from hvd_flexcomm.selectors import star_root, var_root
from hvd_flexcomm.topk import k_for, select_topk


@settings(max_examples=50, deadline=None)
@given(n=st.integers(1, 3000), cr=st.floats(1e-4, 1.0), steps=st.integers(1, 6),
       seed=st.integers(0, 10_000))
def test_residual_plus_sent_equals_error_fed(n, cr, steps, seed):
    g = torch.Generator().manual_seed(seed)
    residual = torch.zeros(n)
    for _ in range(steps):
        grad = torch.randn(n, generator=g)
        fed = grad + residual
        expected = fed.clone()
        idx = select_topk(fed, k_for(cr, n))
        sent = torch.zeros(n).index_copy_(0, idx.long(), fed[idx.long()])
        residual = commit_residual(fed, idx)
        assert torch.equal(residual + sent, expected)
        assert int((residual[idx.long()] != 0).sum()) == 0


def test_gain_and_norms():
    assert gain(1.0, 4.0) == 0.25
    assert gain(0.0, 0.0) == 1.0
    assert gain(5.0, 4.0) == 1.0
    x = torch.tensor([3.0, 4.0])
    assert squared_norm(x) == 25.0
    assert squared_norm(x.half()) == 25.0
    assert squared_norm(torch.empty(0)) == 0.0
    assert not has_nonfinite(x, 25.0)
    y = torch.tensor([1.0, math.nan])
    assert has_nonfinite(y, squared_norm(y))
    big = torch.full((4,), 1e30)  # the float32 sum of squares overflows, the tensor is finite
    assert math.isinf(squared_norm(big)) and not has_nonfinite(big, squared_norm(big))


def test_star_and_var_roots():
    assert [star_root(s, 4) for s in range(6)] == [0, 1, 2, 3, 0, 1]
    assert var_root([1.0, 3.0, 3.0, 2.0]) == 1  # ties to the lowest rank
    assert var_root([math.nan, 0.5]) == 1
    assert var_root([math.nan, math.nan]) == 0
