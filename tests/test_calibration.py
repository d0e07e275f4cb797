"""Tests of the online least-squares calibration (LinearCostFit, CollectiveCostModel, probes,
drift detection)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hvd_flexcomm.calibration import (
    KINDS,
    CollectiveCostModel,
    DriftDetector,
    LinearCostFit,
    NotCalibratedError,
    central_ms,
    probe_ks,
)

A_MS, B_MS_PER_BYTE = 2.0, 1e-5  # 2 ms fixed cost, 100 MB/s
SIZES = np.geomspace(400, 4e6, 5)  # 100 .. 1e6 fp32 elements


def _line(x, a=A_MS, b=B_MS_PER_BYTE):
    return a + b * x


# ---------------------------------------------------------------------------------------------
# LinearCostFit
# ---------------------------------------------------------------------------------------------


def test_noiseless_recovery():
    fit = LinearCostFit()
    for x in SIZES:
        fit.add(x, _line(x))
    assert fit.a_ms == pytest.approx(A_MS, rel=1e-9)
    assert fit.b_ms_per_byte == pytest.approx(B_MS_PER_BYTE, rel=1e-9)
    assert fit.predict_ms(1e7) == pytest.approx(_line(1e7), rel=1e-9)
    assert fit.n_samples == 5 and fit.n_sizes == 5 and fit.has_slope


def test_samples_are_counted_per_size():
    fit = LinearCostFit(window=4)
    for x, ms in [(100, 1.0), (200, 2.0), (100, 1.1), (100, 0.9)]:
        fit.add(x, ms)
    assert fit.n_samples_at(100) == 3 and fit.n_samples_at(200.0) == 1
    assert fit.n_samples_at(300) == 0
    fit.add(300, 3.0)  # the window drops the oldest sample, one at 100 bytes
    assert fit.n_samples_at(100) == 2 and fit.n_samples_at(300) == 1


@pytest.mark.parametrize("seed", range(20))
def test_noisy_recovery_within_tolerance(seed):
    # +-5% multiplicative uniform noise, 5 repeats at each of 5 sizes (25 samples).
    # Stated tolerance: a and b within 10%, predictions at the probed sizes within 5%.
    # (Over 200 seeds the worst errors observed were 3.5%, 3.9% and 3.6%.)
    rng = np.random.default_rng(seed)
    fit = LinearCostFit(window=64)
    for _ in range(5):
        for x in SIZES:
            fit.add(x, _line(x) * (1 + rng.uniform(-0.05, 0.05)))
    assert fit.a_ms == pytest.approx(A_MS, rel=0.10)
    assert fit.b_ms_per_byte == pytest.approx(B_MS_PER_BYTE, rel=0.10)
    for x in SIZES:
        assert fit.predict_ms(x) == pytest.approx(_line(x), rel=0.05)


def test_isolated_outliers_are_ignored():
    # One 10x outlier among 3 repeats at every size: the per-size value (the interquartile
    # mean, here the median) removes it entirely.
    fit = LinearCostFit()
    for x in SIZES:
        fit.extend([(x, _line(x)), (x, 10 * _line(x)), (x, _line(x))])
    assert fit.a_ms == pytest.approx(A_MS, rel=1e-9)
    assert fit.b_ms_per_byte == pytest.approx(B_MS_PER_BYTE, rel=1e-9)


def test_central_ms_is_the_interquartile_mean():
    assert central_ms([7.0]) == 7.0
    assert central_ms([2.0, 4.0]) == 3.0
    assert central_ms([1.0, 100.0, 2.0]) == 2.0  # the median of three
    assert central_ms([1.0, 3.0, 100.0, 2.0]) == 2.5  # the median of four
    # eight: the lowest and highest two dropped, the middle four averaged
    assert central_ms([9.0, 1.0, 5.0, 4.0, 6.0, 3.0, 100.0, 0.0]) == pytest.approx(4.5)
    with pytest.raises(ValueError, match="at least one"):
        central_ms([])


def test_a_path_alternating_between_two_levels_is_charged_between_them():
    """Steps at one size that take ~800 or ~1300 ms (AG-Topk at 100 Mbit/s, N = 2, in the change
    run at 80f9ee7): a median sits on whichever level holds the majority; the fit follows the
    mix, so 10 of each give their mean and 6 slow ones in 16 already move it by a quarter of the
    gap."""
    fit = LinearCostFit(prior_b_ms_per_byte=1e-4)
    fit.extend([(4e6, 800.0), (4e6, 1300.0)] * 10)
    assert fit.predict_ms(4e6) == pytest.approx(1050.0)
    mostly_fast = LinearCostFit(prior_b_ms_per_byte=1e-4)
    mostly_fast.extend([(4e6, 800.0)] * 10 + [(4e6, 1300.0)] * 6)
    # sorted: 10 fast, 6 slow; 4 dropped at each end: 6 fast and 2 slow remain
    assert mostly_fast.predict_ms(4e6) == pytest.approx((6 * 800 + 2 * 1300) / 8)
    assert np.median([800.0] * 10 + [1300.0] * 6) == 800.0


def test_negative_intercept_is_clipped_and_slope_refitted_through_origin():
    # Points (2000 B, 1 ms) and (4000 B, 3 ms): the exact line is -1 + 1e-3 x, so a < 0.
    # Clip a = 0; b = sum(w x y) / sum(w x^2) with w = count / y^2 = (1, 1/9):
    # b = (2000*1 + 4000*3/9) / (2000^2 + 4000^2/9) = 3333.33 / 5.7778e6 = 5.7692e-4 ms/B.
    fit = LinearCostFit()
    fit.extend([(2000, 1.0), (4000, 3.0)])
    assert fit.a_ms == 0.0
    expected_b = (2000 * 1 + 4000 * 3 / 9) / (2000**2 + 4000**2 / 9)
    assert fit.b_ms_per_byte == pytest.approx(expected_b, rel=1e-9)
    assert fit.b_ms_per_byte == pytest.approx(5.7692e-4, rel=1e-4)


def test_negative_slope_is_clipped_to_constant():
    # Times that fall with size (noise at small sizes): b = 0 and a = weighted mean of the
    # medians with w = 1/y^2: (5/25 + 4/16) / (1/25 + 1/16) = 0.45 / 0.1025 = 4.3902 ms.
    fit = LinearCostFit()
    fit.extend([(100, 5.0), (1000, 4.0)])
    assert fit.b_ms_per_byte == 0.0
    assert fit.a_ms == pytest.approx(0.45 / 0.1025, rel=1e-9)


def test_a_clamped_slope_is_not_learned_over_a_measured_one():
    """A window whose sizes fall with size is flat while it lasts (b = 0), but its zero is not
    learned: when the window collapses to one size, the last positive slope splits it again. A
    clamped zero with no earlier slope is learned (there is nothing better)."""
    fit = LinearCostFit(window=4)
    fit.extend([(1000, 2.0), (9000, 10.0)])  # 1 + 1e-3 x
    assert fit.b_ms_per_byte == pytest.approx(1e-3)
    fit.extend([(1000, 20.0), (1000, 20.0)])  # medians 20 and 10: falling
    assert fit.b_ms_per_byte == 0.0 and fit.n_sizes == 2
    fit.extend([(9000, 11.0)] * 4)  # one size left: the slope measured before splits it
    assert fit.n_sizes == 1 and fit.b_ms_per_byte == pytest.approx(1e-3)
    assert fit.predict_ms(9000) == pytest.approx(11.0) and fit.predict_ms(1000) == pytest.approx(3.0)
    fresh = LinearCostFit(window=4)
    fresh.extend([(100, 5.0), (1000, 4.0), (1000, 4.0), (1000, 4.0), (1000, 4.0)])
    assert fresh.n_sizes == 1 and fresh.b_ms_per_byte == 0.0  # learned from the clamp


def test_a_wide_base_pins_the_slope_against_short_chords():
    """The probe learns the slope over a 100x base; steps at two CRs 3.8x apart whose noise
    runs against the size (the old CR's last samples slow) fit the level only, and the high
    end stays where the probe put it; a base of LEARN_SPAN or more sets the slope again; after
    unpin_slope (a network change) a 4x base may set it; a checkpoint keeps the pin."""
    from hvd_flexcomm.calibration import LEARN_SPAN

    assert LEARN_SPAN == 8.0
    fit = LinearCostFit(window=16)
    fit.extend([(1000, _line(1000)), (100_000, _line(100_000))])  # the probe: the true slope
    small, big = 6_000, 23_000  # CRs 0.0057 and 0.0216: 3.8x
    fit.extend([(small, _line(small))] * 11 + [(small, _line(small) * 1.3)] * 3)  # full window
    assert fit.b_ms_per_byte == pytest.approx(B_MS_PER_BYTE, rel=0.01)
    fit.extend([(big, _line(big) * 0.9)] * 13)  # the probe and most of the old CR's steps leave
    # left: the old CR's 3 slow steps and the new CR's: the medians fall with the size, and a
    # chord through them would be flat (clamped); the pinned slope keeps the high end
    # (the last fits over the probe's base, with a few of the new steps in, moved it a little)
    assert fit.n_sizes == 2 and fit.b_ms_per_byte == pytest.approx(B_MS_PER_BYTE, rel=0.1)
    assert fit.predict_ms(100_000) > 2.5
    wide = LinearCostFit.from_dict(fit.to_dict())
    assert wide.predict_ms(100_000) == fit.predict_ms(100_000)
    fit.extend([(2_000, _line(2_000, b=3e-5))] * 8 + [(20_000, _line(20_000, b=3e-5))] * 8)
    assert fit.b_ms_per_byte == pytest.approx(3e-5)  # 10x: a wide enough base
    fit.reset_level()  # a drift probe: the old network's samples go, its slope is unpinned
    fit.unpin_slope()
    fit.extend([(5_000, _line(5_000, b=5e-5))] * 8 + [(20_000, _line(20_000, b=5e-5))] * 8)
    assert fit.b_ms_per_byte == pytest.approx(5e-5)  # 4x, once unpinned
    fit.keep_sizes({20_000})
    fit.extend([(10_000, _line(10_000, b=9e-5))] * 8 + [(20_000, _line(20_000, b=9e-5))] * 8)
    assert fit.b_ms_per_byte == pytest.approx(5e-5)  # 2x: pinned by the 4x one


def test_single_size_without_prior_uses_the_ratio():
    fit = LinearCostFit()
    fit.extend([(4000, 3.0), (4000, 5.0), (4000, 4.0)])  # median 4 ms
    assert fit.n_sizes == 1 and not fit.has_slope
    assert fit.a_ms == 0.0
    assert fit.b_ms_per_byte == pytest.approx(4.0 / 4000)
    assert fit.predict_ms(4000) == pytest.approx(4.0)


def test_single_size_with_prior_splits_at_the_measured_point():
    fit = LinearCostFit(prior_b_ms_per_byte=5e-4)
    fit.add(4000, 4.0)  # b = min(5e-4, 1e-3) = 5e-4, a = 4 - 2 = 2
    assert fit.has_slope
    assert fit.b_ms_per_byte == pytest.approx(5e-4)
    assert fit.a_ms == pytest.approx(2.0)
    # A prior steeper than the ratio is capped by it (a would go negative): b = y/x, a = 0.
    steep = LinearCostFit(prior_b_ms_per_byte=1.0)
    steep.add(4000, 4.0)
    assert steep.a_ms == 0.0 and steep.b_ms_per_byte == pytest.approx(1e-3)


def test_a_point_below_the_learned_slope_scales_the_learned_line():
    """Seed 43 of runs/mpi_d23dc39: the allgather's line, learned over CRs 0.001 .. 0.034
    (8 kB .. 268 kB a rank: 31 ms at 8 kB, 53 ms at 32 kB), lost its samples to a drift probe
    that timed it at 268 kB only, at 150 ms: below the learned slope (246 ms from the slope
    alone). A line through the origin there predicted 4.5 ms at 8 kB; the learned line scaled
    to pass through the point keeps its fixed cost's share: 0.557 x 31 ms."""
    small, mid, big = 8_000, 32_000, 268_000
    b_l = 22.0 / (mid - small)
    a_l = 31.0 - b_l * small
    fit = LinearCostFit(window=16)
    fit.extend([(small, 31.0), (mid, 53.0)])
    assert (fit.a_ms, fit.b_ms_per_byte) == (pytest.approx(a_l), pytest.approx(b_l))
    fit.reset_level()  # the drift probe: the old samples go, the learned line stays
    fit.unpin_slope()
    fit.add(big, 150.0)
    s = 150.0 / (a_l + b_l * big)
    assert s == pytest.approx(0.557, abs=1e-3)
    assert fit.predict_ms(big) == pytest.approx(150.0)  # through the measured point
    assert fit.a_ms == pytest.approx(s * a_l) and fit.b_ms_per_byte == pytest.approx(s * b_l)
    assert fit.predict_ms(small) == pytest.approx(s * 31.0)
    assert fit.predict_ms(small) > 3 * 150.0 * small / big  # not the line through the origin
    # a point above the learned slope's origin line keeps the slope and moves the level only
    fit.reset_level()
    fit.add(big, 300.0)
    assert fit.b_ms_per_byte == pytest.approx(b_l) and fit.a_ms == pytest.approx(300.0 - b_l * big)
    # a checkpoint keeps the learned fixed cost; a state saved before it was kept has none, and
    # falls back to the line through the origin
    fit.reset_level()
    fit.add(big, 150.0)
    clone = LinearCostFit.from_dict(json.loads(json.dumps(fit.to_dict())))
    assert clone.predict_ms(small) == pytest.approx(fit.predict_ms(small))
    old_state = {k: v for k, v in fit.to_dict().items() if k != "learned_a_ms"}
    assert LinearCostFit.from_dict(old_state).predict_ms(small) == pytest.approx(150.0 * small / big)


def test_a_narrow_base_below_the_learned_slope_scales_the_learned_line():
    """Two nearby sizes whose level, at the learned slope, would be negative: the learned line
    is scaled by the weighted least-squares factor, not clamped to a = 0 with the old slope
    (which would predict above both measured sizes)."""
    fit = LinearCostFit(window=8)
    fit.extend([(1_000, 12.0), (100_000, 210.0)])  # a_l = 10, b_l = 2e-3
    a_l, b_l = fit.a_ms, fit.b_ms_per_byte
    assert (a_l, b_l) == (pytest.approx(10.0), pytest.approx(2e-3))
    fit.reset_level()
    fit.extend([(80_000, 100.0), (100_000, 125.0)] * 4)  # 1.25x: a narrow base, far below
    assert fit.n_sizes == 2
    shape = np.array([a_l + b_l * 80_000, a_l + b_l * 100_000])
    levels = np.array([100.0, 125.0])
    w = 4 / levels**2
    s = float(np.sum(w * levels * shape) / np.sum(w * shape**2))
    assert fit.a_ms == pytest.approx(s * a_l) and fit.b_ms_per_byte == pytest.approx(s * b_l)
    assert 95.0 < fit.predict_ms(80_000) < 105.0 and 120.0 < fit.predict_ms(100_000) < 130.0
    assert fit.predict_ms(1_000) == pytest.approx(s * 12.0)


def test_single_size_zero_bytes_is_pure_latency():
    fit = LinearCostFit()
    fit.add(0, 1.5)
    assert fit.a_ms == 1.5 and fit.b_ms_per_byte == 0.0


def test_window_eviction_keeps_only_recent_samples():
    fit = LinearCostFit(window=4)
    for x in SIZES[:4]:
        fit.add(x, _line(x))
    for x in SIZES[:4]:  # the network got slower: new line 3 + 2e-5 x
        fit.add(x, _line(x, 3.0, 2e-5))
    assert fit.n_samples == 4
    assert fit.a_ms == pytest.approx(3.0, rel=1e-9)
    assert fit.b_ms_per_byte == pytest.approx(2e-5, rel=1e-9)


def test_window_collapsing_to_one_size_keeps_learned_slope():
    # Steady state at one size, consistent with the line: the slope survives the collapse.
    fit = LinearCostFit(window=3)
    fit.extend([(1000, _line(1000)), (100_000, _line(100_000))])
    for _ in range(3):
        fit.add(100_000, _line(100_000))
    assert fit.n_sizes == 1 and fit.has_slope
    assert fit.b_ms_per_byte == pytest.approx(B_MS_PER_BYTE)
    assert fit.a_ms == pytest.approx(A_MS)


def test_window_collapse_uses_the_last_multi_size_slope_and_tracks_the_level():
    fit = LinearCostFit(window=3)
    fit.extend([(1000, _line(1000)), (100_000, _line(100_000))])
    last_multi_size_b = None
    for _ in range(3):  # 1 ms slower than before, at one size
        fit.add(100_000, _line(100_000) + 1.0)
        if fit.n_sizes >= 2:
            last_multi_size_b = fit.b_ms_per_byte
    # The last two-size window was [(1000, 2.01), (1e5, 3), (1e5, 4)]: medians 2.01 and 3.5,
    # b = (3.5 - 2.01) / 99000 = 1.50505e-5 ms/B.
    assert last_multi_size_b == pytest.approx(1.49 / 99_000)
    assert fit.n_sizes == 1
    assert fit.b_ms_per_byte == pytest.approx(last_multi_size_b)
    # The line goes through the measured level: a = 4 - 1.50505 = 2.49495 ms.
    assert fit.predict_ms(100_000) == pytest.approx(4.0)
    assert fit.a_ms == pytest.approx(4.0 - 1.49 / 0.99)


def test_narrow_span_keeps_the_learned_slope():
    """Steps at two nearby sizes (CR 0.0156 then 0.0112) whose noise runs against the size must
    not flatten the line: with a probe-learned slope only the level is refitted."""
    fit = LinearCostFit(window=16)
    fit.extend((x, _line(x)) for x in SIZES)  # the probe: a wide span, the true slope
    assert fit.b_ms_per_byte == pytest.approx(B_MS_PER_BYTE)
    big, small = 1.5e5, 1.1e5  # span 1.36 < MIN_SLOPE_SPAN
    for _ in range(8):  # the probe sizes leave the window; the larger size happens to be faster
        fit.add(big, _line(big) * 0.9)
        fit.add(small, _line(small) * 1.1)
    assert fit.n_sizes == 2
    # not clipped to 0: the slope is the last wide-span fit's (probe sizes mixed with the first
    # steps, hence not exactly the true one), and it stays put while the span is narrow
    learned = fit.b_ms_per_byte
    assert learned == pytest.approx(B_MS_PER_BYTE, rel=0.15)
    fit.add(big, _line(big) * 0.8)
    assert fit.b_ms_per_byte == learned
    # the level follows the measurements: the line passes between the two sizes' medians
    assert _line(big) * 0.9 < fit.predict_ms(big) < _line(big) * 1.1
    assert fit.predict_ms(1e6) > 5 * fit.predict_ms(1e5) / 2  # a CR 10x larger still costs more
    # a wide span again (a re-probe) relearns the slope
    fit.extend((x, _line(x, b=2 * B_MS_PER_BYTE)) for x in list(SIZES) * 4)  # fills the window
    assert fit.b_ms_per_byte == pytest.approx(2 * B_MS_PER_BYTE, rel=0.05)


def test_empty_fit_and_reset():
    fit = LinearCostFit()
    with pytest.raises(NotCalibratedError):
        fit.predict_ms(10)
    fit.extend([(10, 1.0), (20, 2.0)])
    fit.reset()
    assert fit.n_samples == 0 and not fit.has_slope
    with pytest.raises(NotCalibratedError):
        _ = fit.a_ms


@pytest.mark.parametrize("bad", [(-1, 1.0), (1, -1.0), (float("nan"), 1.0), (1, float("inf"))])
def test_invalid_samples(bad):
    with pytest.raises(ValueError):
        LinearCostFit().add(*bad)


def test_fit_round_trip_through_json():
    rng = np.random.default_rng(0)
    fit = LinearCostFit(window=16, prior_b_ms_per_byte=1e-6)
    for x in rng.choice(SIZES, size=30):
        fit.add(float(x), _line(x) * (1 + rng.uniform(-0.05, 0.05)))
    clone = LinearCostFit.from_dict(json.loads(json.dumps(fit.to_dict())))
    assert clone.samples == fit.samples
    assert clone.window == 16 and clone.prior_b_ms_per_byte == 1e-6
    assert (clone.a_ms, clone.b_ms_per_byte) == (fit.a_ms, fit.b_ms_per_byte)


def test_fit_round_trip_preserves_learned_slope_after_collapse():
    fit = LinearCostFit(window=2)
    fit.extend([(1000, _line(1000)), (100_000, _line(100_000))])
    fit.extend([(100_000, 5.0), (100_000, 5.0)])
    clone = LinearCostFit.from_dict(fit.to_dict())
    assert (clone.a_ms, clone.b_ms_per_byte) == (fit.a_ms, fit.b_ms_per_byte)
    assert clone.has_slope


@settings(max_examples=300, deadline=None)
@given(
    sizes=st.lists(st.floats(min_value=1.0, max_value=1e8), min_size=2, max_size=6, unique=True),
    levels=st.lists(st.floats(min_value=0.01, max_value=1e4), min_size=6, max_size=6),
    counts=st.lists(st.integers(min_value=1, max_value=8), min_size=6, max_size=6),
)
def test_constrained_line_is_the_non_negative_least_squares_optimum(sizes, levels, counts):
    """The closed-form constrained line (a >= 0, b >= 0; the boundary it takes when the free
    fit's intercept or slope is negative) reaches the weighted objective of SciPy's
    non-negative least squares on the same problem, at any number of sizes."""
    from scipy.optimize import nnls

    from hvd_flexcomm.calibration import _MIN_MS_FOR_WEIGHT, _weighted_constrained_line

    x = np.asarray(sorted(sizes))
    y = np.asarray(levels[:len(x)])
    n = np.asarray(counts[:len(x)], dtype=float)
    a, b = _weighted_constrained_line(x, y, n)
    assert a >= 0.0 and b >= 0.0
    w = n / np.maximum(y, _MIN_MS_FOR_WEIGHT) ** 2
    scale = float(x.max())
    (ref_a, ref_b), _ = nnls(np.column_stack([np.ones_like(x), x / scale]) * np.sqrt(w)[:, None],
                             y * np.sqrt(w))

    def objective(a_ms, b_scaled):
        return float(np.sum(w * (y - a_ms - b_scaled * x / scale) ** 2))

    assert objective(a, b * scale) <= objective(ref_a, ref_b) * (1 + 1e-7) + 1e-9


@settings(deadline=None)  # shared, noisy CI machines
@given(
    a=st.floats(min_value=0.0, max_value=50.0),
    b=st.floats(min_value=0.0, max_value=1e-3),
    sizes=st.lists(st.integers(min_value=0, max_value=10**8), min_size=1, max_size=20),
    noise=st.lists(st.floats(min_value=-0.5, max_value=0.5), min_size=20, max_size=20),
)
def test_fit_invariants(a, b, sizes, noise):
    fit = LinearCostFit(window=8)
    for x, e in zip(sizes, noise):
        fit.add(x, max(0.0, (a + b * x) * (1 + e)))
    assert fit.a_ms >= 0.0 and fit.b_ms_per_byte >= 0.0
    assert fit.n_samples == min(8, len(sizes))
    assert fit.predict_ms(10**6) <= fit.predict_ms(10**7)


# ---------------------------------------------------------------------------------------------
# CollectiveCostModel
# ---------------------------------------------------------------------------------------------

LINES = {"allgather": (3.0, 4e-5), "broadcast": (1.5, 1e-5), "allreduce": (1.0, 2e-5)}


def _calibrated_model(world_size: int = 4) -> CollectiveCostModel:
    model = CollectiveCostModel(world_size)
    for kind, (a, b) in LINES.items():
        for x in SIZES:
            model.observe(kind, x, a + b * x)
    return model


def test_model_predictions_by_hand():
    model = _calibrated_model()
    assert model.is_calibrated()
    k = 10_000
    # AG: one allgather of (4 + 4) * 1e4 + 16 = 80016 bytes: 3 + 4e-5 * 80016 = 6.20064 ms
    assert model.predict_ag_topk_ms(k, 4, extra_bytes=16) == pytest.approx(6.20064)
    # AR: broadcast of 4e4 + 16 bytes (1.5 + 0.40016) + allreduce of 4e4 bytes (1 + 0.8)
    assert model.predict_ar_topk_ms(k, extra_bytes=16) == pytest.approx(3.70016)
    # int64 indices: AG payload (4 + 8) * 1e4 = 1.2e5 bytes: 3 + 4.8 = 7.8 ms
    assert model.predict_ag_topk_ms(k, 4, index_bytes=8) == pytest.approx(7.8)
    # dense: allreduce of 4e6 bytes: 1 + 80 = 81 ms
    assert model.predict_dense_ms(1_000_000) == pytest.approx(81.0)


def test_model_is_tied_to_world_size_and_kinds():
    model = _calibrated_model(world_size=4)
    with pytest.raises(ValueError):
        model.predict_ag_topk_ms(100, 8)
    with pytest.raises(ValueError):
        model.observe("reduce_scatter", 10, 1.0)
    with pytest.raises(ValueError):
        CollectiveCostModel(0)


def test_is_calibrated_needs_every_kind_with_a_slope():
    model = CollectiveCostModel(2)
    assert not model.is_calibrated()
    for kind in KINDS:
        model.observe(kind, 1000, 2.0)
    assert not model.is_calibrated()  # a single size per kind: slope not identified
    for kind in KINDS:
        model.observe(kind, 100_000, 5.0)
    assert model.is_calibrated()
    model.reset()
    assert not model.is_calibrated()
    with pytest.raises(NotCalibratedError):
        model.predict_dense_ms(10)


def test_model_round_trip_through_json():
    model = _calibrated_model(world_size=8)
    clone = CollectiveCostModel.from_dict(json.loads(json.dumps(model.to_dict())))
    assert clone.world_size == 8 and clone.is_calibrated()
    for kind in KINDS:
        assert clone.fits[kind].samples == model.fits[kind].samples
    assert clone.predict_ag_topk_ms(1234, 8) == model.predict_ag_topk_ms(1234, 8)
    assert clone.predict_ar_topk_ms(1234) == model.predict_ar_topk_ms(1234)


def test_horovod_like_costs_order_the_paths():
    # Shape of environment.md's MPI baseline (2 ranks): ~1 ms fixed cost per op, allgather about
    # twice an allreduce of equal bytes. Per element (4 B values, 4 B indices):
    # AG = 1 + 2b * 8k, AR = (1 + b * 4k) + (1 + b * 4k) = 2 + 8bk, so AR wins only when
    # 16bk - 8bk > 1 ms, i.e. k > 1 / (8b).
    b = 2e-6  # ms per byte
    model = CollectiveCostModel(2)
    for kind, slope in (("allgather", 2 * b), ("broadcast", b), ("allreduce", b)):
        for x in SIZES:
            model.observe(kind, x, 1.0 + slope * x)
    k_star = 1 / (8 * b)  # 62500 elements
    assert model.predict_ag_topk_ms(int(k_star / 2), 2) < model.predict_ar_topk_ms(int(k_star / 2))
    assert model.predict_ag_topk_ms(int(k_star * 2), 2) > model.predict_ar_topk_ms(int(k_star * 2))


# ---------------------------------------------------------------------------------------------
# probe_ks
# ---------------------------------------------------------------------------------------------


def test_probe_ks_are_the_ends_of_the_k_range():
    # 1e6 elements, CRs 0.1 / 0.01 / 0.001: k from 1000 to 100000; the middle is not timed
    assert probe_ks(1_000_000, [0.1, 0.01, 0.001]) == [1_000, 100_000]
    assert probe_ks(1_000_000, [0.001, 0.1]) == [1_000, 100_000]  # order does not matter
    assert probe_ks(1_201_162, [0.01]) == [1_501, 12_012]  # one CR: widened to k // 8


def test_probe_ks_edge_cases():
    assert probe_ks(1_000_000, [0.01, 0.01], widen=10) == [1_000, 10_000]
    assert probe_ks(0, [0.1]) == []
    assert probe_ks(10, [0.001]) == [1]  # k = 1 cannot be widened
    assert probe_ks(10, [0.001, 0.05]) == [1]  # both round to k = 1
    for bad in ([], [0.0], [1.5]):
        with pytest.raises(ValueError, match="compression ratio"):
            probe_ks(100, bad)
    with pytest.raises(ValueError, match="widen"):
        probe_ks(100, [0.1], widen=1)


@settings(deadline=None)  # shared, noisy CI machines
@given(
    numel=st.integers(min_value=1, max_value=10**9),
    crs=st.lists(st.floats(min_value=1e-4, max_value=1.0), min_size=1, max_size=6),
)
def test_probe_ks_properties(numel, crs):
    ks = probe_ks(numel, crs)
    assert ks == sorted(set(ks)) and 1 <= len(ks) <= 2
    assert all(1 <= k <= numel for k in ks)
    k_of = [min(numel, max(1, round(c * numel))) for c in crs]
    assert ks[-1] == max(k_of)
    assert ks[0] == (min(k_of) if min(k_of) < max(k_of) else max(1, max(k_of) // 8))


# ---------------------------------------------------------------------------------------------
# DriftDetector
# ---------------------------------------------------------------------------------------------


def test_drift_fires_exactly_after_patience_violations():
    det = DriftDetector(threshold=0.25, patience=5)
    fired = [det.update(10.0, 13.0) for _ in range(5)]  # 30% off each step
    assert fired == [False, False, False, False, True]
    assert det.count == 0  # counter reset after firing
    assert [det.update(10.0, 13.0) for _ in range(5)] == [False] * 4 + [True]


def test_drift_ignores_isolated_outliers_and_in_band_noise():
    det = DriftDetector(threshold=0.25, patience=5)
    for _ in range(50):
        assert not det.update(10.0, 20.0)  # outlier
        assert not det.update(10.0, 12.4)  # within 25%
        assert not det.update(10.0, 7.6)
    # four violations then one good step then four more: never fires
    seq = [30.0] * 4 + [10.0] + [30.0] * 4
    assert not any(det.update(10.0, m) for m in seq)


def test_drift_threshold_is_strict_and_handles_zero_prediction():
    det = DriftDetector(threshold=0.25, patience=1)
    assert not det.update(8.0, 10.0)  # exactly 25%: not a violation
    assert det.update(8.0, 10.01)
    assert det.update(0.0, 1.0)
    assert not det.update(0.0, 0.0)
    with pytest.raises(ValueError):
        det.update(float("nan"), 1.0)
    with pytest.raises(ValueError):
        DriftDetector(patience=0)


def test_drift_noise_band_is_the_quantile_range_of_earlier_measurements():
    det = DriftDetector(threshold=0.25, patience=4, noise_quantile=0.1, noise_window=8)
    assert det.noise_band() is None
    for ms in (100.0, 170.0, 100.0):  # fewer than patience: the relative threshold alone
        assert not det.update(135.0, ms)
    assert det.noise_band() is None and det.violates(100.0, 170.0)
    assert det.update(135.0, 170.0)  # four violations: fires; the run joins the history
    low, high = det.noise_band()
    assert low == pytest.approx(100.0) and high == pytest.approx(170.0)
    # 70% off the prediction but a level the path has shown lately: noise
    assert not det.violates(100.0, 170.0) and not det.violates(170.0, 100.0)
    # off the prediction and outside the recent range: a violation
    assert det.violates(135.0, 255.0) and det.violates(135.0, 60.0)
    # inside the range but within the threshold is fine either way
    assert not det.violates(135.0, 140.0)
    # a measurement is judged by the range before it: one huge value does not excuse itself
    det2 = DriftDetector(threshold=0.25, patience=1, noise_quantile=0.1, noise_window=4)
    assert not det2.update(100.0, 100.0)
    assert det2.update(100.0, 1000.0)
    # nor does a run of violations widen the band it is judged by before it ends
    det3 = DriftDetector(threshold=0.25, patience=5, noise_quantile=0.1, noise_window=8)
    for _ in range(8):
        det3.update(100.0, 100.0)
    assert [det3.update(100.0, 600.0) for _ in range(5)] == [False] * 4 + [True]


def test_drift_with_noise_band_ignores_level_switching_and_catches_a_real_change():
    levels = ([100.0] * 9 + [160.0] * 6 + [100.0] * 12 + [160.0] * 7) * 3
    plain = DriftDetector(threshold=0.25, patience=5)
    banded = DriftDetector(threshold=0.25, patience=5, noise_quantile=0.1)
    assert sum(plain.update(110.0, ms) for ms in levels) == 6  # every run at 160
    # the first run at 160 fires (the path has not shown that level yet), then it is noise
    assert sum(banded.update(110.0, ms) for ms in levels) == 1
    fired = [banded.update(110.0, 600.0) for _ in range(5)]
    assert fired == [False] * 4 + [True]


def test_drift_reset_keeps_the_history_and_clear_history_keeps_the_count():
    det = DriftDetector(threshold=0.25, patience=3, noise_quantile=0.1)
    for _ in range(6):
        det.update(10.0, 10.0)
    det.update(10.0, 20.0)
    det.clear_history()
    assert det.count == 1 and len(det.history) == 0
    det.update(10.0, 20.0)
    det.reset()
    assert det.count == 0 and list(det.history) == [20.0]


@pytest.mark.parametrize("kwargs,needle", [
    ({"noise_quantile": -0.1}, "noise_quantile"), ({"noise_quantile": 0.5}, "noise_quantile"),
    ({"noise_quantile": float("nan")}, "noise_quantile"),
    ({"patience": 5, "noise_window": 4}, "noise_window"), ({"noise_window": 10.5}, "noise_window"),
])
def test_drift_rejects_bad_noise_settings(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        DriftDetector(**kwargs)


@settings(deadline=None)  # shared, noisy CI machines
@given(
    violations=st.lists(st.booleans(), max_size=60),
    patience=st.integers(min_value=1, max_value=7),
)
def test_drift_matches_run_length_reference(violations, patience):
    det = DriftDetector(threshold=0.25, patience=patience)
    run = 0
    for v in violations:
        run = run + 1 if v else 0
        expected = run > 0 and run % patience == 0
        assert det.update(10.0, 20.0 if v else 10.0) == expected


def test_keep_sizes_drops_the_other_sizes_and_keeps_the_learned_slope():
    fit = LinearCostFit(window=16)
    fit.extend([(100.0, 2.0), (100.0, 2.0), (1000.0, 11.0), (10.0, 1.1)])  # 1 + 0.01 x
    assert fit.b_ms_per_byte == pytest.approx(0.01)
    fit.keep_sizes({100.0})
    assert fit.samples == [(100.0, 2.0), (100.0, 2.0)] and fit.n_sizes == 1
    assert fit.b_ms_per_byte == pytest.approx(0.01)  # one size left: the learned slope holds
    fit.add(1000.0, 5.6)  # a new measurement at the far end re-learns it: 1.6 + 0.004 x
    assert fit.b_ms_per_byte == pytest.approx(0.004, rel=1e-6)


def test_drop_size_forgets_one_size_and_keeps_the_learned_slope():
    fit = LinearCostFit()
    fit.extend([(1000, 2.0), (1000, 2.0), (8000, 9.0), (8000, 9.0)])  # a = 1, b = 1e-3
    assert fit.b_ms_per_byte == pytest.approx(1e-3)
    fit.drop_size(8000)
    assert fit.n_sizes == 1 and fit.n_samples == 2
    fit.add(8000, 5.0)  # a real step at the dropped size: the line runs through it alone
    assert fit.predict_ms(8000) == pytest.approx(5.0)
    fit.drop_size(123)  # no sample there: nothing changes
    assert fit.n_samples == 3
