import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hvd_flexcomm.topk import k_for, sampled_threshold, select_topk


def _assert_exact_topk(x: torch.Tensor, idx: torch.Tensor, k: int) -> None:
    assert idx.dtype == torch.int32
    assert idx.numel() == k
    assert torch.unique(idx).numel() == k
    if k:
        assert int(idx.min()) >= 0 and int(idx.max()) < x.numel()
    chosen = x.abs()[idx.long()].sort(descending=True).values
    best = torch.topk(x.abs(), k).values.sort(descending=True).values
    assert torch.equal(chosen, best)  # same magnitudes as torch.topk (ties may pick other slots)


@pytest.mark.parametrize("cr,numel,k", [(0.01, 1000, 10), (0.001, 10, 1), (1.0, 7, 7),
                                        (0.5, 3, 2), (0.1, 0, 0), (1e-9, 5, 1), (0.25, 2, 0 + 1)])
def test_k_for(cr, numel, k):
    assert k_for(cr, numel) == k


@pytest.mark.parametrize("n", [10, 1000, 70_000, 300_000])
@pytest.mark.parametrize("cr", [0.1, 0.01, 0.001])
def test_select_topk_is_exact(n, cr):
    g = torch.Generator().manual_seed(n)
    x = torch.randn(n, generator=g) * torch.rand(n, generator=g).pow(4)  # heavy-ish tail
    k = k_for(cr, n)
    _assert_exact_topk(x, select_topk(x, k, torch.Generator().manual_seed(1)), k)


@pytest.mark.parametrize("dist", ["zeros", "constant", "sparse", "one_huge", "ramp"])
def test_select_topk_on_adversarial_inputs(dist):
    n = 200_000
    x = {"zeros": torch.zeros(n), "constant": torch.full((n,), -3.0),
         "sparse": torch.zeros(n).index_fill_(0, torch.arange(0, n, 997), 1.0),
         "one_huge": torch.ones(n).index_fill_(0, torch.tensor([12345]), 1e30),
         "ramp": torch.arange(n, dtype=torch.float32)}[dist]
    for k in (1, 150, 2000, n // 3):
        _assert_exact_topk(x, select_topk(x, k), k)


def test_select_topk_edges():
    x = torch.randn(100)
    assert select_topk(x, 0).numel() == 0
    assert torch.equal(select_topk(x, 100), torch.arange(100, dtype=torch.int32))
    with pytest.raises(ValueError, match="1-D"):
        select_topk(torch.randn(3, 3), 1)
    with pytest.raises(ValueError, match="k must be"):
        select_topk(x, 101)


def test_sampled_threshold_keeps_at_least_fraction():
    g = torch.Generator().manual_seed(0)
    pop = torch.randn(1_000_000, generator=g).abs()
    for frac in (0.1, 0.01, 0.001):
        sample = pop[torch.randint(0, pop.numel(), (8192,), generator=g)]
        thr = sampled_threshold(sample, frac)
        kept = float((pop >= thr).float().mean())
        assert frac <= kept <= frac * 2 + 0.01, (frac, kept)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 5000), frac=st.floats(0.0, 1.0), seed=st.integers(0, 2**31 - 1),
       dtype=st.sampled_from([torch.float32, torch.float64, torch.float16]))
def test_select_topk_property(n, frac, seed, dtype):
    x = torch.randn(n, generator=torch.Generator().manual_seed(seed)).to(dtype)
    k = min(n, math.floor(frac * n))
    _assert_exact_topk(x, select_topk(x, k), k)


@pytest.mark.parametrize("dist", ["normal", "quantised", "heavy_tail"])
@pytest.mark.parametrize("cr", [0.05, 0.1, 0.2])
def test_band_trim_for_large_k_is_exact(dist, cr, monkeypatch):
    """Large k takes the two-threshold path (entries above the upper sampled threshold kept
    outright, ``torch.topk`` over the band below it); the result is still the exact top-k, also
    when many magnitudes tie (quantised values)."""
    import hvd_flexcomm.topk as topk_mod

    calls = []
    real = topk_mod._band_trim
    monkeypatch.setattr(topk_mod, "_band_trim", lambda *a: calls.append(1) or real(*a))
    g = torch.Generator().manual_seed(7)
    n = 1_500_000
    x = torch.randn(n, generator=g)
    if dist == "quantised":
        x = torch.round(x * 4) / 4  # a few dozen distinct magnitudes: ties at every threshold
    elif dist == "heavy_tail":
        x = x ** 3
    k = k_for(cr, n)
    idx = select_topk(x, k, torch.Generator().manual_seed(1))
    assert idx.dtype == torch.int32 and idx.numel() == k and idx.unique().numel() == k
    got = torch.sort(x.abs()[idx.long()]).values
    want = torch.sort(torch.topk(x.abs(), k).values).values
    assert torch.equal(got, want)
    assert calls, "the band path was not taken"
