"""Adaptive CR pieces without Horovod: gains, curves, the Pareto pick, warm-up, triggers."""

import logging
import math
from concurrent.futures import Future

import numpy as np
import pytest
import torch

from hvd_flexcomm import Adaptive
from hvd_flexcomm.adaptive import (
    COMPRESS_CRS,
    COMPRESS_WINDOW,
    OTHER_MS_WINDOW,
    AdaptiveController,
    compression_curve,
    warmup_cr,
)
from hvd_flexcomm.gains import GainTracker, gains_at_crs
from hvd_flexcomm.moo import (
    MooResult,
    fit_comm_curve,
    fit_gain_curve,
    normalise_front,
    pick_on_grid,
    solve_cr,
    tta_objectives,
)
from hvd_flexcomm.probing import repeat_counts
from hvd_flexcomm.topk import k_for

CANDS = (0.1, 0.033, 0.011, 0.004, 0.001)


def test_gains_of_all_candidates_from_one_pass_equal_brute_force():
    g = torch.randn(200_000, generator=torch.Generator().manual_seed(3)) ** 3
    got = gains_at_crs(g, CANDS)
    total = float((g.double() ** 2).sum())
    for cr, gain in zip(CANDS, got):
        top = torch.topk(g.abs(), k_for(cr, g.numel())).values.double()
        assert gain == pytest.approx(float((top ** 2).sum()) / total, rel=1e-5)  # fp32 total
    assert got == sorted(got, reverse=True) and 0 < got[-1] < got[0] < 1
    assert gains_at_crs(torch.zeros(10), CANDS) == [1.0] * 5
    assert all(math.isnan(x) for x in gains_at_crs(torch.tensor([1.0, math.inf]), CANDS))


def test_gain_tracker_smooths_and_measures_change():
    t = GainTracker([0.1, 0.01], smoothing=0.5)
    assert t.relative_change() == 0.0
    t.update([0.8, 0.4])
    assert t.relative_change() == math.inf
    t.mark_reference()
    t.update([0.8, 0.2])  # smoothed 0.3 vs reference 0.4: 25% change
    assert t.relative_change() == pytest.approx(0.25)
    t.update([math.nan, 0.1])  # non-finite measurements are ignored
    assert t.samples == 2


def test_warmup_schedule():
    assert warmup_cr(0, 100, 0.1) == 1.0
    assert warmup_cr(50, 100, 0.1) == pytest.approx(0.55)
    assert warmup_cr(100, 100, 0.1) == 0.1 and warmup_cr(7, 0, 0.1) == 0.1
    assert warmup_cr(54, 100, 0.1, every=10) == warmup_cr(50, 100, 0.1)  # held within a block
    ramp = [warmup_cr(s, 40, 0.01) for s in range(41)]
    assert all(a >= b for a, b in zip(ramp, ramp[1:]))


def test_curves_fit_and_fall_back_to_interpolation():
    crs = np.array(CANDS)
    t = fit_comm_curve(crs, 2 + 300 * crs)
    assert t.kind == "fit" and t.params["a_ms"] == pytest.approx(2) and t(0.05) == pytest.approx(17)
    g = fit_gain_curve(crs, np.minimum(1, 2 * crs ** 0.4))
    assert g.kind == "fit" and g.params["p"] == pytest.approx(0.4, rel=1e-6)
    bumpy = np.array([5.0, 1.0, 9.0, 1.0, 4.0])  # no line fits within 25%
    t2 = fit_comm_curve(crs, bumpy)
    assert t2.kind == "interpolation" and t2(0.011) == pytest.approx(9.0)
    g2 = fit_gain_curve(crs, np.array([0.9, math.nan, 0.5, 0.6, 0.05]))
    assert g2.kind == "interpolation"
    assert np.all(np.diff(g2(np.array(sorted(CANDS)))) >= 0)  # made monotone


def _asf_pick_on_grid(time_fn, gain_fn, weights, lo=0.001, hi=0.1):
    c = np.linspace(lo, hi, 20001)
    F = np.column_stack([time_fn(c), 1 / gain_fn(c)])
    ideal, nadir = F.min(0), F.max(0)
    nF = (F - ideal) / (nadir - ideal)
    return c[np.max(nF * np.asarray(weights), axis=1).argmin()]


@pytest.mark.parametrize("weights", [(0.6, 0.4), (0.9, 0.1), (0.2, 0.8)])
def test_pareto_pick_matches_brute_force_asf(weights):
    crs = np.array(CANDS)
    time_fn = lambda c: 1 + 200 * c  # noqa: E731
    gain_fn = lambda c: np.minimum(1, 2 * c ** 0.4)  # noqa: E731
    res = solve_cr(crs, time_fn(crs), gain_fn(crs), 0.001, 0.1, weights=weights)
    expected = _asf_pick_on_grid(time_fn, gain_fn, weights)
    assert res.cr == pytest.approx(expected, rel=0.1)
    assert 0.001 <= res.cr <= 0.1 and res.curves == {"time": "fit", "gain": "fit"}
    assert "picked cr=" in res.explain()


def test_more_weight_on_time_means_lower_cr():
    crs = np.array(CANDS)
    times, gains = 1 + 200 * crs, np.minimum(1, 2 * crs ** 0.4)
    fast = solve_cr(crs, times, gains, 0.001, 0.1, weights=(0.9, 0.1)).cr
    accurate = solve_cr(crs, times, gains, 0.001, 0.1, weights=(0.1, 0.9)).cr
    assert fast < accurate


def test_pick_depends_on_the_shape_of_the_time_curve_not_its_scale():
    """A documented property of the paper's decomposition (ASF on the front normalised by its
    ideal and nadir, ``other_ms=None``, ``Adaptive(time_scale="front")``): when the time curve is
    fitted as ``a + b·c``, its normalised values are ``(c - c_low) / (c_high - c_low)`` whatever
    ``a`` and ``b`` are, so the network's latency and bandwidth do not move the pick; only a time
    curve of another shape (e.g. the cheaper path changing inside the range, which the line does
    not fit) or the gains do."""
    crs = np.array(CANDS)
    gains = np.minimum(1, 2 * crs ** 0.4)
    picks = {solve_cr(crs, a + b * crs, gains, 0.001, 0.1).cr
             for a, b in [(1, 200), (100, 2500), (5, 10), (300, 30_000)]}
    assert len(picks) == 1
    kinked = np.minimum(5 + 3000 * crs, 60 + 200 * crs)  # AG below c~0.02, AR above
    res = solve_cr(crs, kinked, gains, 0.001, 0.1)
    assert res.curves["time"] == "interpolation"
    assert abs(res.cr - picks.pop()) > 0.002


def test_normalise_front_by_span_or_by_the_dearest_step():
    F = np.array([[10.0, 1.0], [30.0, 4.0], [50.0, 2.0]])  # time ms, 1/gain
    assert normalise_front(F) == pytest.approx(np.array([[0, 0], [0.5, 1], [1, 1 / 3]]))
    # time: (t - 10) / (50 + 150), the dearest point's whole step; 1/gain unchanged
    assert normalise_front(F, other_ms=150.0) == pytest.approx(np.array([[0, 0], [0.1, 1], [0.2, 1 / 3]]))
    assert normalise_front(np.array([[5.0, 2.0], [5.0, 2.0]])) == pytest.approx(np.zeros((2, 2)))
    for bad in (-1.0, math.nan, math.inf, "10"):
        with pytest.raises(ValueError, match="other_ms"):
            normalise_front(F, other_ms=bad)
    with pytest.raises(ValueError, match="other_ms"):
        solve_cr(CANDS, [1, 2, 3, 4, 5], [0.5, 0.4, 0.3, 0.2, 0.1], 0.001, 0.1, other_ms=-5)


def test_step_time_scale_moves_the_pick_with_latency_and_computation():
    """``time_scale="step"`` (``other_ms`` given): the same line ``a + b·c`` normalised by the
    dearest step, so a network whose cost is mostly latency (large ``a``), or a step that is
    mostly computation (large ``other_ms``), makes a lower CR save a smaller part of the step and
    the pick moves to a higher CR. A bandwidth-bound line through 0 with nothing else in the step
    normalises as the paper's does."""
    crs = np.array(CANDS)
    gains = np.minimum(1, 2 * crs ** 0.8)
    bandwidth_bound, latency_bound = 2500 * crs, 60 + 600 * crs
    paper = solve_cr(crs, bandwidth_bound, gains, 0.001, 0.1).cr
    assert solve_cr(crs, latency_bound, gains, 0.001, 0.1).cr == paper  # blind to the scale
    same = solve_cr(crs, bandwidth_bound, gains, 0.001, 0.1, other_ms=0.0).cr
    assert same == pytest.approx(paper, rel=0.02)
    on_latency = solve_cr(crs, latency_bound, gains, 0.001, 0.1, other_ms=0.0)
    assert on_latency.cr > 1.1 * paper
    assert "fraction of the dearest step" in on_latency.explain()
    picks = [solve_cr(crs, bandwidth_bound, gains, 0.001, 0.1, other_ms=o).cr
             for o in (0.0, 100.0, 1000.0, 1e6)]
    assert all(b > a for a, b in zip(picks, picks[1:])), picks
    assert picks[-1] > 0.09  # communication negligible in the step: the most gain
    # a uniformly slower network with nothing else in the step keeps the pick (the ratio of
    # the time a CR adds to the dearest step is unchanged)
    assert solve_cr(crs, 3 * latency_bound, gains, 0.001, 0.1, other_ms=0.0).cr == pytest.approx(
        on_latency.cr, rel=1e-6)


def _tta_optimum(a_ms, b_ms, p, weights=(0.6, 0.4)):
    """The CR that minimises ``(a + b·c)^w_t · (A·c^p)^-w_g`` over c > 0 (setting the derivative
    of its log to 0): ``w_t·b·c = w_g·p·(a + b·c)``."""
    wt, wg = weights
    return wg * p * a_ms / (b_ms * (wt - wg * p))


@pytest.mark.parametrize("a_ms,b_ms,p,other_ms", [
    (100.0, 2000.0, 0.5, 30.0),  # 5 ms one way, 100 Mbit/s: a low-ish CR
    (420.0, 2800.0, 0.5, 30.0),  # 25 ms one way: a higher CR
    (60.0, 9000.0, 0.4, 0.0),    # bandwidth-bound
])
def test_tta_pick_is_the_time_to_accuracy_optimum(a_ms, b_ms, p, other_ms):
    """``pick="tta"``: on exact curves ``t = a + b·c`` and ``g = A·c^p`` the pick is the
    analytic minimum of ``(t + other)^0.6 · (1/g)^0.4`` (inside the bounds), whatever ``A``."""
    crs = np.array(CANDS)
    want = _tta_optimum(a_ms + other_ms, b_ms, p)
    assert 0.0015 < want < 0.09  # the cases are chosen to have it inside [c_low, c_high]
    for A in (0.5, 3.0):
        res = solve_cr(crs, a_ms + b_ms * crs, np.minimum(1, A * crs ** p) if A < 1 else
                       A * crs ** p / (A * 0.1 ** p), 0.001, 0.1, other_ms=other_ms, pick="tta")
        assert res.cr == pytest.approx(want, rel=0.05), (A, res.cr, want)
        assert res.pick == "tta" and "time to accuracy" in res.explain()


def test_tta_excess_is_the_predicted_time_to_accuracy_ratio():
    """``tta_excess``: ``step · (1/gain)^(w_g/w_t)`` of the first point over the second, minus 1
    (step = time + other_ms); and solve_cr reports it for the CR in use, from its fitted curves:
    about 0 at the optimum, the closed form elsewhere, None outside the bounds or for the ASF."""
    from hvd_flexcomm.moo import tta_excess

    # 2x the step at 1/4 of the inverse gain: 2 · 0.25^(2/3) = 0.794
    assert tta_excess((170.0, 70.0), (0.5, 2.0), 30.0, (0.6, 0.4)) == pytest.approx(
        2 * 0.25 ** (2 / 3) - 1)
    assert tta_excess((70.0, 70.0), (2.0, 2.0), 0.0, (0.5, 0.5)) == 0.0
    a_ms, b_ms, p, other = 100.0, 2000.0, 0.5, 30.0
    crs = np.array(CANDS)
    gains = crs ** p / 0.1 ** p
    best = _tta_optimum(a_ms + other, b_ms, p)

    def time_to_acc(c):
        return (a_ms + b_ms * c + other) * (0.1 ** p / c ** p) ** (0.4 / 0.6)

    for current in (best, 0.1, 0.001):
        res = solve_cr(crs, a_ms + b_ms * crs, gains, 0.001, 0.1, other_ms=other, pick="tta",
                       current_cr=current)
        assert res.current_cr == current
        assert res.current_excess == pytest.approx(time_to_acc(current) / time_to_acc(res.cr) - 1,
                                                   rel=1e-3, abs=1e-3)
        assert res.current_excess >= -1e-3  # the pick is the optimum
    assert res.current_excess > 0.1 and "predicted to take" in res.explain()
    outside = solve_cr(crs, a_ms + b_ms * crs, gains, 0.001, 0.1, other_ms=other, pick="tta",
                       current_cr=1.0)  # the warm-up's dense CR
    asf = solve_cr(crs, a_ms + b_ms * crs, gains, 0.001, 0.1, other_ms=other, current_cr=0.1)
    assert outside.current_excess is None and asf.current_excess is None


def test_tta_pick_follows_latency_and_is_blind_to_a_uniform_slowdown():
    """A line with a larger offset (latency, or computation) makes a higher CR cheap relative to
    its step, and the time-to-accuracy pick moves up; multiplying the whole step time by a
    constant (network and computation alike) keeps it, since only ratios of step times enter."""
    crs = np.array(CANDS)
    gains = np.minimum(1, 2 * crs ** 0.5)
    bandwidth_bound = solve_cr(crs, 20 + 3000 * crs, gains, 0.001, 0.1, other_ms=10.0, pick="tta")
    latency_bound = solve_cr(crs, 450 + 3000 * crs, gains, 0.001, 0.1, other_ms=10.0, pick="tta")
    assert latency_bound.cr > 5 * bandwidth_bound.cr
    slower = solve_cr(crs, 3 * (20 + 3000 * crs), gains, 0.001, 0.1, other_ms=30.0, pick="tta")
    assert slower.cr == pytest.approx(bandwidth_bound.cr, rel=1e-6)
    computation_only = solve_cr(crs, 3000 * crs, gains, 0.001, 0.1, other_ms=1e6, pick="tta")
    assert computation_only.cr > 0.09  # communication negligible: the most gain
    asf = solve_cr(crs, 450 + 3000 * crs, gains, 0.001, 0.1, other_ms=10.0)
    assert asf.pick == "asf" and latency_bound.cr > 1.5 * asf.cr  # the ASF balances, lower


def test_tta_objectives_are_log_factors_over_the_best_point():
    F = np.array([[100.0, 2.0], [50.0, 4.0], [20.0, 10.0]])
    got = tta_objectives(F, other_ms=30.0)
    assert got == pytest.approx(np.array([[math.log(130 / 50), 0.0],
                                          [math.log(80 / 50), math.log(2.0)],
                                          [0.0, math.log(5.0)]]))
    with pytest.raises(ValueError, match="other_ms.*-1"):
        tta_objectives(F, other_ms=-1.0)


def test_solve_cr_rejects_a_bad_pick():
    with pytest.raises(ValueError, match="pick.*'best'"):
        solve_cr(CANDS, [9, 5, 3, 2, 1], [0.8, 0.5, 0.3, 0.2, 0.1], 0.001, 0.1, pick="best")
    with pytest.raises(ValueError, match="tta.*other_ms"):
        solve_cr(CANDS, [9, 5, 3, 2, 1], [0.8, 0.5, 0.3, 0.2, 0.1], 0.001, 0.1, pick="tta")


def test_tta_controller_solves_with_the_step_time_and_waits_for_one_step():
    ctrl, _ = _controller(time_scale="tta", n_gen=5, pop_size=8)
    ctrl.tracker.update([0.5, 0.3, 0.15, 0.07, 0.02])
    assert ctrl._trigger(1) is None  # no step measured yet: its time outside comm is unknown
    ctrl.note_other_ms(40.0)
    assert ctrl._trigger(1) == "first optimisation after warm-up"
    ctrl._submit(1, "test")
    ctrl._future.result(timeout=60)
    assert ctrl._ready_result() is not None
    result = ctrl.last_result
    assert result.pick == "tta" and result.other_ms == 40.0 and ctrl.solves[-1]["other_ms"] == 40.0
    assert ctrl.to_dict()["last_result"]["pick"] == "tta"
    ctrl.close()


def test_solver_survives_unfittable_inputs():
    res = solve_cr(CANDS, [3, 3, 3, 3, 3], [math.nan, math.nan, 0.4, math.nan, 0.0], 0.001, 0.1)
    assert 0.001 <= res.cr <= 0.1 and res.curves["gain"] == "interpolation"


def _controller(**kw):
    mode = Adaptive(**{"cr": 0.1, "gain_every": 1, "min_interval": 10, "min_cr_change": 0,
                       "min_tta_gain": 0, **kw})
    version = {"v": 0}
    ctrl = AdaptiveController(mode, rank=0, hvd=None, process_set=None,
                              predict_ms=lambda c: {"allgather": 1 + 100 * c, "allreduce": 2 + 50 * c},
                              model_version=lambda: version["v"])
    return ctrl, version


def test_controller_state_round_trip_keeps_the_announcement_bookkeeping():
    """A resumed run keeps the CR, gains, changes and the announcement bookkeeping (the step of
    the last announcement decides whether the next flag is stale)."""
    ctrl, _ = _controller()
    g = torch.randn(50_000, generator=torch.Generator().manual_seed(1))
    ctrl.tracker.update(gains_at_crs(g, ctrl.mode.candidates))
    ctrl.cr, ctrl.announced_cr, ctrl.changes = 0.02, 0.02, [(40, 0.02)]
    ctrl.last_submit_step, ctrl.last_announce_step = 35, 40
    ctrl.n_announcements, ctrl.n_kept = 3, 2
    for ms in (30.0, 31.0, 29.0):
        ctrl.note_other_ms(ms)
        ctrl.note_compress_ms(0.02, ms / 2)
    ctrl.last_other_ms = 30.0
    other, _ = _controller()
    other.load_dict(ctrl.to_dict())
    assert other.to_dict() == ctrl.to_dict()
    # the step-time window resumes: no spurious "moved" trigger from an empty window
    assert other.other_ms() == 30.0 and other.last_other_ms == 30.0
    assert other.other_samples_ms.maxlen == OTHER_MS_WINDOW
    assert other.last_announce_step == 40 and other.n_announcements == 3 and other.n_kept == 2
    assert other.tracker.smoothed == ctrl.tracker.smoothed
    assert list(other.compress_samples_ms[0.02]) == [15.0, 15.5, 14.5]
    assert other.compress_samples_ms[0.02].maxlen == COMPRESS_WINDOW
    old = ctrl.to_dict()
    for key in ("last_announce_step", "n_announcements", "n_kept", "last_other_ms",
                "other_samples_ms", "compress_samples_ms"):  # a state saved before them
        del old[key]
    fresh, _ = _controller()
    fresh.load_dict(old)
    assert fresh.last_announce_step is None and fresh.n_announcements == 0 and fresh.cr == 0.02


def test_solves_are_normalised_by_rank0s_median_time_outside_communication():
    ctrl, _ = _controller(n_gen=5, pop_size=8)
    assert ctrl.other_ms() == 0.0  # nothing measured yet
    for ms in [40.0, 41.0, 5000.0, 39.0, 42.0]:  # one slow step (e.g. an evaluation) is ignored
        ctrl.note_other_ms(ms)
    assert ctrl.other_ms() == 41.0
    for ms in range(100 + OTHER_MS_WINDOW):  # only the recent window counts
        ctrl.note_other_ms(float(ms))
    assert ctrl.other_ms() == pytest.approx(100 + (OTHER_MS_WINDOW - 1) / 2)
    ctrl.tracker.update([0.5, 0.3, 0.15, 0.07, 0.02])
    ctrl._submit(0, "test")
    ctrl._future.result(timeout=60)
    assert ctrl.solves[-1]["other_ms"] == ctrl.other_ms()
    assert ctrl._ready_result() is not None and ctrl.last_result.other_ms == ctrl.other_ms()
    assert ctrl.to_dict()["last_result"]["other_ms"] == ctrl.other_ms()
    ctrl.close()
    paper, _ = _controller(time_scale="front")
    paper.note_other_ms(40.0)
    assert paper.other_ms() is None  # the paper's normalisation ignores it
    other_rank = AdaptiveController(ctrl.mode, rank=1, hvd=None, process_set=None,
                                    predict_ms=ctrl.predict_ms, model_version=lambda: 0)
    other_rank.note_other_ms(40.0)
    assert not other_rank.other_samples_ms  # only rank 0 solves


def test_triggers_first_gain_change_network_change_and_min_interval():
    """Gains (and the step time) re-solve after ``min_interval`` steps; a recalibrated network
    model after RECALIBRATED_MIN_INTERVAL (10) steps already."""
    from hvd_flexcomm.adaptive import RECALIBRATED_MIN_INTERVAL

    assert RECALIBRATED_MIN_INTERVAL == 10
    ctrl, version = _controller(min_interval=50)
    g = torch.randn(50_000, generator=torch.Generator().manual_seed(0))
    assert ctrl._trigger(0) is None  # no gains yet
    ctrl.tracker.update(gains_at_crs(g, ctrl.mode.candidates))
    assert ctrl._trigger(0) is None  # the step scale waits for one measured step
    ctrl.note_other_ms(30.0)
    assert ctrl._trigger(1) == "first optimisation after warm-up"
    paper, _ = _controller(time_scale="front")  # the paper's scale needs no step time
    paper.tracker.update(ctrl.tracker.smoothed)
    assert paper._trigger(0) == "first optimisation after warm-up"
    ctrl.last_submit_step, ctrl.last_model_version = 0, 0
    ctrl.tracker.mark_reference()
    assert ctrl._trigger(5) is None  # nothing changed
    version["v"] = 1
    assert ctrl._trigger(9) is None  # 10 steps not over
    assert ctrl._trigger(10) == "network model recalibrated"
    ctrl.last_model_version = 1
    ctrl.tracker.update([x * 0.5 for x in ctrl.tracker.smoothed])
    assert ctrl._trigger(11) is None  # gains wait for min_interval
    assert ctrl._trigger(50).startswith("smoothed gain moved")
    short, version = _controller(min_interval=3)  # a shorter min_interval holds for both
    short.tracker.update(ctrl.tracker.smoothed)
    short.last_submit_step, short.last_model_version = 0, 0
    version["v"] = 1
    assert short._trigger(2) is None and short._trigger(3) == "network model recalibrated"


def test_a_moved_step_time_triggers_a_solve_normalised_by_the_new_one():
    """``time_scale="step"``: when rank 0's median time outside communication moves by
    ``other_ms_threshold`` from the value the last solve used (e.g. the model's computation or the
    input pipeline changed), the next solve is due (after ``min_interval``) and uses the new value;
    a smaller move is not a trigger, and the paper's scale ignores the step time."""
    ctrl, _ = _controller(n_gen=5, pop_size=8, other_ms_threshold=0.25)
    ctrl.tracker.update([0.5, 0.3, 0.15, 0.07, 0.02])
    for _ in range(OTHER_MS_WINDOW):
        ctrl.note_other_ms(40.0)
    ctrl._submit(1, ctrl._trigger(1))
    ctrl._future.result(timeout=60)
    ctrl._ready_result()
    assert ctrl.last_other_ms == 40.0
    for _ in range(OTHER_MS_WINDOW):
        ctrl.note_other_ms(48.0)  # +20%: under the threshold
    assert ctrl._trigger(20) is None
    for _ in range(OTHER_MS_WINDOW):
        ctrl.note_other_ms(60.0)  # +50%
    assert ctrl._trigger(5) is None  # min_interval (10) not over
    reason = ctrl._trigger(20)
    assert reason == "time outside communication moved 50% (40.0 -> 60.0 ms per step)"
    ctrl._submit(20, reason)
    ctrl._future.result(timeout=60)
    assert ctrl.solves[-1]["other_ms"] == 60.0 and ctrl.last_other_ms == 60.0
    assert ctrl._trigger(40) is None  # nothing moved since
    ctrl.close()
    paper, _ = _controller(time_scale="front")
    paper.tracker.update([0.5, 0.3, 0.15, 0.07, 0.02])
    paper._submit(0, "first")
    paper._future.result(timeout=60)
    for _ in range(OTHER_MS_WINDOW):
        paper.note_other_ms(500.0)
    assert paper._trigger(20) is None and paper.last_other_ms is None
    paper.close()


def test_compression_curve_needs_two_crs_a_factor_two_apart_and_fits_their_medians():
    assert compression_curve({}) is None
    assert compression_curve({0.1: [30.0] * 5}) is None  # one CR: no slope
    assert compression_curve({0.1: [30.0] * 5, 0.06: [22.0] * 5}) is None  # under a factor 2
    assert compression_curve({0.1: [30.0] * 5, 0.02: [14.0, 14.0]}) is None  # too few steps
    # a slow step (a stall) does not move a median; the line 10 + 200 c through the medians
    curve = compression_curve({0.1: [30.0, 29.0, 31.0, 900.0, 30.0], 0.02: [14.0, 14.5, 13.5]})
    assert curve.kind == "fit"
    assert curve(np.array([0.1, 0.02, 0.001])) == pytest.approx([30.0, 14.0, 10.2])


def test_compression_times_are_kept_per_cr_on_rank0_and_join_the_time_objective():
    """Rank 0 keeps each sparse step's compression time under its CR (not the warm-up's CRs above
    ``c_high``, not on other ranks, not with ``count_compression=False``), the most recent
    ``COMPRESS_CRS`` CRs; a solve adds the fitted compression time to each candidate's predicted
    communication. On a latency-bound network (the same communication time at every CR) the
    compression time is all that a lower CR saves, and the pick moves down from ``c_high``."""
    # the ASF pick of "step": it weighs what a CR adds to the step against the gain's span, so
    # 25 ms of compression on a 585 ms step moves it; the time-to-accuracy pick ("tta") weighs
    # the same 4% of step time against a 9x gain and stays at c_high (both see the same inputs)
    flat, _ = _controller(n_gen=20, pop_size=20, time_scale="step")
    flat.predict_ms = lambda c: {"allgather": 500.0, "allreduce": 600.0}
    flat.tracker.update([0.9, 0.6, 0.4, 0.25, 0.1])
    flat.note_other_ms(50.0)
    flat.note_compress_ms(0.5, 80.0)  # warm-up CR above c_high: not kept
    for _ in range(3):
        flat.note_compress_ms(0.1, 35.0)
    flat._submit(1, "test")
    assert flat.solves[-1]["compress_ms"] is None  # one CR measured: communication alone
    blind = flat._future.result(timeout=60).cr
    for ms in (12.0, 13.0, 12.5):
        flat.note_compress_ms(0.01, ms)
    assert list(flat.compress_samples_ms) == [0.1, 0.01]
    flat._submit(60, "test")
    record = flat.solves[-1]
    assert record["compress_ms"] == pytest.approx([35.0, 18.25, 12.75, 11.0, 10.25])  # 10 + 250 c
    aware = flat._future.result(timeout=60).cr
    assert blind == pytest.approx(0.1, rel=0.05) and aware < 0.07, (blind, aware)
    flat.close()
    for i in range(COMPRESS_CRS + 2):  # the oldest CRs give way; each keeps a bounded window
        for _ in range(COMPRESS_WINDOW + 1):
            flat.note_compress_ms(0.05 - 0.001 * i, 20.0)
    assert len(flat.compress_samples_ms) == COMPRESS_CRS and 0.1 not in flat.compress_samples_ms
    assert all(len(v) == COMPRESS_WINDOW for v in flat.compress_samples_ms.values())
    from concurrent.futures import Future

    flat._future = Future()  # a solve in flight: its thread shares rank 0's cores
    flat.note_compress_ms(0.001, 5.0)
    assert 0.001 not in flat.compress_samples_ms
    flat._future = None
    off, _ = _controller(count_compression=False)
    off.note_compress_ms(0.1, 30.0)
    assert not off.compress_samples_ms and off.compress_ms_at([0.1]) is None
    other_rank = AdaptiveController(flat.mode, rank=1, hvd=None, process_set=None,
                                    predict_ms=flat.predict_ms, model_version=lambda: 0)
    other_rank.note_compress_ms(0.1, 30.0)
    assert not other_rank.compress_samples_ms


def test_observe_runs_solver_in_background_and_failure_is_contained():
    ctrl, _ = _controller(n_gen=5, pop_size=8)
    g = torch.randn(20_000, generator=torch.Generator().manual_seed(1))
    ctrl.observe(0, g)
    assert not ctrl.solves  # step 0: no step time measured yet
    ctrl.note_other_ms(25.0)
    ctrl.observe(1, g)
    assert ctrl.solves and ctrl._future is not None and ctrl.solves[0]["other_ms"] == 25.0
    ctrl._future.result(timeout=60)
    cr = ctrl._ready_result()
    assert 0.001 <= cr <= 0.1 and ctrl.last_result is not None
    ctrl.close()


def test_solver_failures_are_contained(caplog):
    ctrl, _ = _controller()
    ctrl.tracker.update([0.9, 0.7, 0.5, 0.3, 0.1])
    cr_before = ctrl.cr

    def broken_model(c):
        raise RuntimeError("cost model exploded")

    ctrl.predict_ms = broken_model
    ctrl._submit(1, "test")  # does not raise: logged, training goes on
    assert ctrl.failed and ctrl._future is None and ctrl.cr == cr_before
    # a solve that raises in the background thread is contained too, and logged only once
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        ctrl._future = pool.submit(broken_model, 0.1)
        ctrl._future.exception(timeout=10)
    assert ctrl._ready_result() is None and ctrl.cr == cr_before
    assert sum("CR optimisation failed" in r.message for r in caplog.records) == 1


@pytest.mark.parametrize("kwargs,needle", [
    ({"candidates": (0.1,)}, "candidates"), ({"c_low": 0.2, "c_high": 0.1}, "c_low"),
    ({"candidates": (0.1, 0.1)}, "two different CRs.*0.1, 0.1"),
    ({"c_low": 0.0005}, r"must cover \[c_low, c_high\] = \[0.0005, 0.1\]"),
    ({"candidates": (0.05, 0.001)}, r"candidates \(0.05, 0.001\) must cover"),
    ({"weights": (1, -1)}, "weights"), ({"gain_every": 0}, "gain_every"),
    ({"warmup_steps": -1}, "warmup_steps"), ({"gain_threshold": 0}, "gain_threshold"),
    ({"candidates": (0.1, 2.0)}, "cr must be in"), ({"min_cr_change": 1.0}, "min_cr_change"),
    ({"min_cr_change": -0.1}, "min_cr_change"), ({"time_scale": "wall"}, "time_scale.*'wall'"),
    ({"min_tta_gain": 1.5}, "min_tta_gain.*1.5"),
    ({"other_ms_threshold": 0}, "other_ms_threshold.*0"),
    ({"other_ms_threshold": 1.5}, "other_ms_threshold.*1.5"),
    ({"count_compression": "yes"}, "count_compression.*'yes'"),
    ({"span_steps": -1}, "span_steps.*-1"), ({"span_every": 0}, "span_every.*0"),
    ({"span_settle_steps": 0}, "span_settle_steps.*0"),
    ({"span_settle_steps": 2.5}, "span_settle_steps.*2.5"),
])
def test_adaptive_rejects_bad_settings(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        Adaptive(**kwargs)


def test_starting_cr_is_the_geometric_centre_of_the_searched_range():
    """Without ``cr`` Adaptive starts at ``sqrt(c_low·c_high)`` to four significant digits (0.01
    for the defaults, 10x from either end); an explicit ``cr`` is kept as given; bad ends are
    named."""
    from hvd_flexcomm.compression import starting_cr

    assert Adaptive().cr == 0.01 and Adaptive(cr=0.1).cr == 0.1
    assert Adaptive(c_low=0.004, c_high=0.1).cr == 0.02  # sqrt(4e-4)
    assert Adaptive(c_low=0.004, candidates=(0.1, 0.033, 0.011, 0.004)).cr == 0.02
    assert Adaptive(c_high=0.033).cr == 0.005745  # sqrt(3.3e-5) = 0.0057446..., 4 digits
    assert starting_cr(0.02, 0.02) == 0.02
    for lo, hi in [(0.001, 0.1), (0.0003, 0.7), (1e-6, 1.0), (0.0049, 0.005)]:
        assert lo <= starting_cr(lo, hi) <= hi
    with pytest.raises(ValueError, match="c_low must be a CR in \\(0, 1\\], got 0"):
        starting_cr(0, 0.1)
    with pytest.raises(ValueError, match="c_high must be a CR.*'x'"):
        starting_cr(0.001, "x")
    with pytest.raises(ValueError, match="c_low <= c_high.*c_low=0.5"):
        starting_cr(0.5, 0.1)


def test_announcements_run_only_when_rank0_flags_a_finished_solve():
    """Broadcasts happen at multiples of ``sync_every`` and only with the announce flag set (the
    channel is replaced by a recorder here; the multi-process tests use the real one)."""
    ctrl, _ = _controller(sync_every=5, n_gen=5, pop_size=8)
    sent = []
    ctrl._broadcast = lambda obj: sent.append(obj) or obj
    assert not ctrl.announce_ready()  # nothing submitted yet
    for step in range(12):
        assert ctrl.cr_for_step(step, announce_flag=False) == 0.1
    assert sent == [] and ctrl.n_announcements == 0
    ctrl.note_other_ms(30.0)
    ctrl.observe(12, torch.randn(20_000, generator=torch.Generator().manual_seed(2)))
    ctrl._future.result(timeout=60)
    assert ctrl.announce_ready()
    assert ctrl.cr_for_step(14, announce_flag=True) == 0.1  # not a multiple of sync_every
    assert ctrl.cr_for_step(15, announce_flag=True) == 0.1  # the broadcast starts, in flight
    ctrl._announcement.result(timeout=10)
    assert len(sent) == 1 and ctrl.n_announcements == 1 and ctrl.announce_effective_step == 20
    assert not ctrl.announce_ready()  # the result was consumed by the announcement
    # it takes effect at the next multiple of sync_every at least ANNOUNCE_LAG_STEPS later
    assert all(ctrl.cr_for_step(s, announce_flag=True) == 0.1 for s in range(16, 20))
    new_cr = ctrl.cr_for_step(20, announce_flag=False)
    assert new_cr == sent[0] and ctrl.changes == ([(20, new_cr)] if new_cr != 0.1 else [])
    assert ctrl.n_announcements == 1  # the flags while in flight started no second broadcast
    ctrl.close()


def test_flag_raised_before_an_announcement_does_not_announce_again():
    """sync_every=1: rank 0's flag reaches every rank one step late, so the flag seen right after
    an announcement was raised before it (no second, empty broadcast); a later solve's flag is
    honoured at once."""
    ctrl, version = _controller(sync_every=1, n_gen=5, pop_size=8, min_interval=0)
    sent = []
    ctrl._broadcast = lambda obj: sent.append(obj) or obj
    g = torch.randn(20_000, generator=torch.Generator().manual_seed(2))
    ctrl.note_other_ms(30.0)
    ctrl.observe(1, g)
    ctrl._future.result(timeout=60)
    ctrl.cr_for_step(3, announce_flag=True)  # the flag raised at the end of step 1
    ctrl.cr_for_step(4, announce_flag=True)  # raised at the end of step 2: stale
    assert ctrl.cr_for_step(5, announce_flag=False) == sent[0]  # in effect 2 steps after 3
    assert len(sent) == 1 and sent[0] is not None and ctrl.n_announcements == 1
    version["v"] += 1  # the network was recalibrated: a new solve
    ctrl.observe(5, g)
    ctrl._future.result(timeout=60)
    ctrl.cr_for_step(7, announce_flag=True)
    ctrl._announcement.result(timeout=10)
    assert len(sent) == 2 and sent[1] is not None and ctrl.n_announcements == 2
    ctrl.close()


def _finished(cr: float) -> Future:
    """A finished solve whose pick is ``cr``."""
    future: Future = Future()
    future.set_result(MooResult(cr=cr, time_ms=1.0, gain=0.5, front=[(0.001, 1.0, 0.1), (0.1, 2.0, 0.9)]))
    return future


def test_solved_cr_close_to_the_current_one_is_not_announced(caplog):
    """min_cr_change=0.1: a solve within 10% of the current CR raises no flag (no broadcast, no
    renegotiation of message sizes); one further away is announced and taken at that step."""
    caplog.set_level(logging.INFO, logger="hvd_flexcomm.adaptive")
    ctrl, _ = _controller(min_cr_change=0.1)
    sent = []
    ctrl._broadcast = lambda obj: sent.append(obj) or obj
    assert ctrl.cr_for_step(0, announce_flag=False) == 0.1
    ctrl._future = _finished(0.0912)  # 8.8% below 0.1
    assert not ctrl.announce_ready()
    assert ctrl.n_kept == 1 and ctrl._future is None and ctrl.last_result.cr == 0.0912
    assert "keeping cr=0.1: the solved 0.0912" in caplog.text
    assert ctrl.cr_for_step(1, announce_flag=False) == 0.1 and sent == []
    ctrl._future = _finished(0.0899)  # 10.1% below: announced
    assert ctrl.announce_ready() and ctrl.announce_ready()  # stays raised until announced
    assert ctrl.cr_for_step(2, announce_flag=True) == 0.1  # its broadcast starts
    assert not ctrl.announce_ready()
    # a solve that finishes while the announcement is in flight is compared with its CR
    ctrl._future = _finished(0.0981)  # +9.1% from the CR in flight: kept
    assert not ctrl.announce_ready() and ctrl.n_kept == 2
    assert ctrl.cr_for_step(3, announce_flag=False) == 0.1
    assert ctrl.cr_for_step(4, announce_flag=False) == 0.0899  # announced at 2, in effect at 4
    assert sent == [0.0899] and ctrl.changes == [(4, 0.0899)]
    ctrl.cr_for_step(5, announce_flag=False)
    assert ctrl.cr == 0.0899 and ctrl.n_announcements == 1


def test_a_solve_that_saves_little_time_to_accuracy_is_not_announced(caplog):
    """min_tta_gain=0.03: a solved CR far from the current one, but predicted to reach accuracy
    less than 3% sooner, raises no flag; one that saves more is announced; a result computed
    for another CR than the one now in use is judged by min_cr_change alone."""
    caplog.set_level(logging.INFO, logger="hvd_flexcomm.adaptive")
    ctrl, _ = _controller(min_cr_change=0.1, min_tta_gain=0.03)
    assert ctrl.cr_for_step(0, announce_flag=False) == 0.1

    def finished(cr, current_cr, excess):
        future: Future = Future()
        future.set_result(MooResult(cr=cr, time_ms=1.0, gain=0.5, front=[(0.001, 1.0, 0.1)],
                                    pick="tta", other_ms=0.0, current_cr=current_cr,
                                    current_excess=excess))
        return future

    ctrl._future = finished(0.03, 0.1, 0.021)
    assert not ctrl.announce_ready() and ctrl.n_kept == 1
    assert "keeping cr=0.1: the solved 0.03 is predicted to reach accuracy only 2.1% sooner" in (
        caplog.text)
    ctrl._future = finished(0.03, 0.1, 0.045)
    assert ctrl.announce_ready() and ctrl.n_kept == 1
    ctrl._pending = None
    ctrl._future = finished(0.03, 0.05, 0.0)  # solved for another CR in use: not comparable
    assert ctrl.announce_ready()
    off, _ = _controller(min_cr_change=0.1, min_tta_gain=0.0)
    off.cr_for_step(0, announce_flag=False)
    off._future = finished(0.03, 0.1, 0.001)
    assert off.announce_ready()


def test_announced_step_is_the_next_multiple_of_sync_every_after_the_lag():
    from hvd_flexcomm.adaptive import ANNOUNCE_LAG_STEPS, announced_step

    assert ANNOUNCE_LAG_STEPS == 2
    assert [announced_step(s, 1) for s in (0, 3, 10)] == [2, 5, 12]
    assert [announced_step(s, 5) for s in (0, 15)] == [5, 20]
    assert announced_step(4, 2) == 6 and announced_step(4, 3, lag=4) == 10
    with pytest.raises(ValueError, match="sync_every"):
        announced_step(3, 0)


def test_a_checkpoint_keeps_the_announcement_in_flight():
    """A state saved while an announcement's broadcast is in flight holds its CR and step: the
    resumed run takes it at that step, as the ranks that did not stop."""
    ctrl, _ = _controller(sync_every=1, min_cr_change=0.0)
    ctrl._broadcast = lambda obj: obj
    ctrl._future = _finished(0.02)
    assert ctrl.announce_ready()
    ctrl.cr_for_step(7, announce_flag=True)
    state = ctrl.to_dict()
    assert state["announcement_in_flight"] == [9, 0.02]
    other, _ = _controller(sync_every=1)
    other.load_dict(state)
    assert other.cr_for_step(8, announce_flag=False) == 0.1
    assert other.cr_for_step(9, announce_flag=False) == 0.02 and other.changes == [(9, 0.02)]
    assert ctrl.cr_for_step(9, announce_flag=False) == 0.02 and ctrl.changes == other.changes
    assert other.to_dict()["announcement_in_flight"] is None
    ctrl.close()


def _timed_plan(flex, step, cr, lines):
    """Run ``flex``'s due probe on a synthetic network: ``lines[kind] = (fixed ms, ms per byte)``."""
    plan, repeats, kind = flex.probe_plan(step, cr)
    counts = repeat_counts(len(plan), repeats)
    results = [(k, b, lines[k][0] + lines[k][1] * b) for (k, b), count in zip(plan, counts)
               for _ in range(count)]
    flex.after_probe(step, results, kind, spent_ms=1.0)
    return kind


def _step_control(flex, cr, lines, path=None):
    """The control entries a step on ``path`` (default ``flex.path``) would deliver on this
    synthetic network."""
    from hvd_flexcomm.flexible import PATH_CODES

    path = path or flex.path
    sizes = flex.payload_bytes(k_for(cr, flex.numel))
    if path == "allgather":
        t = (lines["allgather"][0] + lines["allgather"][1] * sizes["allgather"], 0.0)
    else:
        t = tuple(lines[k][0] + lines[k][1] * sizes[k] for k in ("broadcast", "allreduce"))
    return [PATH_CODES[path], t[0], t[1], 0.0]


_FAST_GATHER = {"allgather": (1.0, 1e-5), "broadcast": (5.0, 1e-5), "allreduce": (5.0, 1e-5)}


def _adaptive_on_synthetic_network(mode, probe_crs):
    """A FlexibleController and rank 0's AdaptiveController wired as the optimizer wires them,
    without Horovod (the announcement channel is tested with real ranks)."""
    from hvd_flexcomm.flexible import FlexibleController

    flex = FlexibleController(mode, world_size=4, numel=1_000_000)
    flex.probe_crs = probe_crs
    ada = AdaptiveController(mode, rank=0, hvd=None, process_set=None, predict_ms=flex.predict,
                             model_version=lambda: flex.model_version,
                             recalibrating=lambda: flex.recalibrating)
    ada._broadcast = lambda obj: obj
    return flex, ada


def _run_steps(flex, ada, g, steps, lines_at):
    """Adaptive's loop on a synthetic network (``lines_at(step)``: that step's lines, see
    :func:`_timed_plan`): the due probe, the step's CR and span role, its timings, the gains of
    ``g`` and any solve (waited for). Returns ``{step: (probe kind or None, flex.recalibrating
    once the step's timings are in, the step's span role, the step's path)}``."""
    seen = {}
    for step in steps:
        lines = lines_at(step)
        kind = _timed_plan(flex, step, ada.cr, lines) if flex.probe_due else None
        if step > 0:
            ada.note_other_ms(0.0)  # nothing else in the step: communication is the step
        cr = ada.cr_for_step(step, ada.announce_ready())
        flex.decide(step, cr)
        step_cr, role = flex.step_cr(step, cr)
        flex.observe_step(_step_control(flex, step_cr, lines, flex.step_path(role)), step_cr, role)
        seen[step] = (kind, flex.recalibrating, role, flex.step_path(role))
        ada.observe(step, g)
        if ada._future is not None:
            ada._future.result(timeout=60)
    return seen


@pytest.mark.parametrize("after,moves", [
    # the allgather's per-byte cost x10: the cheaper path changes inside [c_low, c_high]
    ({"allgather": (1.0, 1e-4), "broadcast": (5.0, 1e-5), "allreduce": (5.0, 1e-5)}, True),
    # every cost x3 (a uniformly slower network): same shape, same pick
    ({k: (3 * a, 3 * b) for k, (a, b) in _FAST_GATHER.items()}, False),
])
def test_network_change_recalibrates_and_the_pick_moves_only_with_the_shape(after, moves):
    """Adaptive's loop without Horovod: a network change fires the drift detector, a full probe
    recalibrates the model and triggers the next solve. The CR moves when the cheaper path now
    changes inside [c_low, c_high] (the time line no longer fits), not when every cost scales
    (see ``test_pick_depends_on_the_shape_of_the_time_curve_not_its_scale``)."""
    mode = Adaptive(cr=0.1, gain_every=1, min_interval=5, min_cr_change=0, min_tta_gain=0,
                    reprobe_interval=0, drift_patience=3, n_gen=20, pop_size=16,
                    span_steps=0)  # drift: full probe
    flex, ada = _adaptive_on_synthetic_network(mode, mode.candidates)
    g = torch.randn(200_000, generator=torch.Generator().manual_seed(4)) ** 3
    _run_steps(flex, ada, g, range(0, 20), lambda step: _FAST_GATHER)
    assert flex.path == "allgather" and ada.changes and ada.last_result.curves["time"] == "fit"
    first_cr = ada.cr
    _run_steps(flex, ada, g, range(20, 40), lambda step: after)
    assert flex.n_full_probes == 2  # start-up, then the drift the change caused
    assert [s["reason"] for s in ada.solves][-1] == "network model recalibrated"
    last = ada.solves[-1]  # a solve's record holds its inputs and result
    assert last["crs"] == list(mode.candidates) and len(last["gains"]) == len(last["crs"])
    assert last["comm_ms"] == pytest.approx([min(flex.predict(c).values()) for c in mode.candidates])
    assert last["cr"] == ada.last_result.cr
    assert (len(set(last["paths"])) > 1) == moves  # the cheaper path changes inside the candidates
    if moves:
        assert ada.last_result.curves["time"] == "interpolation"
        assert abs(ada.cr - first_cr) > 0.1 * first_cr, (first_cr, ada.cr)
    else:
        assert ada.last_result.curves["time"] == "fit" and ada.cr == first_cr
    ada.close()


def test_no_solve_reads_the_model_between_a_drift_probe_and_the_span_after_it():
    """Under span steps a drift probe re-times the size in use only; until the span after it
    (``span_settle_steps`` later) measures the new slope, a line through that one size leans on
    the old network's slope, and where that overshoots the new point it runs through the origin.
    A recalibrated-model solve still due from the first change's spans must wait for the second
    change's span (``FlexibleController.recalibrating``), not read that guess. Here the allgather
    turns steep, then flat (latency-bound): without the wait, a solve four steps after the
    second drift probe read the old slope through the size in use (CR 0.00112), 42 ms at CR 0.1
    where steps take 20 ms. The wait lasts until the span on the other sparse path is judged
    too: without that, the solve came right after the first span (step 54, the other path's
    span at 55-56)."""
    mode = Adaptive(cr=0.01, gain_every=1, min_interval=50, min_cr_change=0, min_tta_gain=0,
                    reprobe_interval=0, drift_patience=3, n_gen=20, pop_size=16, span_steps=2,
                    span_every=1000)
    flex, ada = _adaptive_on_synthetic_network(
        mode, tuple(mode.candidates) + (mode.c_low, mode.c_high))
    g = torch.randn(200_000, generator=torch.Generator().manual_seed(4)) ** 3
    dear_ar = {"broadcast": (50.0, 1e-4), "allreduce": (50.0, 1e-4)}  # the allgather stays cheaper
    phases = [(0, {"allgather": (1.0, 1e-5), **dear_ar}),
              (20, {"allgather": (1.0, 1e-4), **dear_ar}),  # per byte x10
              (40, {"allgather": (20.0, 1e-7), **dear_ar})]  # latency-bound
    seen = _run_steps(flex, ada, g, range(90),
                      lambda step: [lines for start, lines in phases if step >= start][-1])
    drift_probes = [step for step, (kind, *_) in seen.items() if kind == "drift"]
    recalibrating = {step: on for step, (_, on, *_) in seen.items()}
    assert flex.path == "allgather"
    assert len(drift_probes) == 2 and 40 <= drift_probes[1] < 50, drift_probes
    held = [s for s, on in recalibrating.items() if on]
    assert set(range(drift_probes[1], drift_probes[1] + mode.span_settle_steps)) <= set(held)
    assert not recalibrating[89]
    assert [s["step"] for s in ada.solves if recalibrating[s["step"]]] == []
    # the first solve after the second change waited for its span, and sees the new level
    first = next(s for s in ada.solves if s["step"] > drift_probes[1])
    assert first["reason"] == "network model recalibrated"
    assert first["step"] > drift_probes[1] + mode.span_settle_steps
    # ... for both spans after it, one per sparse path: the one on the path not in use too
    # (the drift probe timed that path at the size in use only)
    spans = {path: [s for s, (_, _, role, p) in seen.items()
                    if role is not None and p == path and s > drift_probes[1]]
             for path in ("allgather", "allreduce")}
    assert spans["allgather"] and spans["allreduce"], spans
    # (this loop feeds a step's timings in the step itself: the last span step is judged, and
    # the solve starts, at that step)
    assert first["step"] >= max(spans["allreduce"]) > max(spans["allgather"]), (first, spans)
    assert first["comm_ms"] == pytest.approx([20.0] * len(first["crs"]), rel=0.1)
    ada.close()


# -- the first CR, picked at the start-up probe ---------------------------------------------------
@pytest.mark.parametrize("a_ms,b_ms,p,other_ms", [
    (100.0, 2000.0, 0.5, 30.0), (420.0, 2800.0, 0.5, 30.0), (60.0, 9000.0, 0.4, 0.0)])
def test_grid_pick_is_the_solvers_pick_without_the_solver(a_ms, b_ms, p, other_ms):
    """``pick_on_grid`` evaluates the same fitted curves as ``solve_cr``: the tta pick is the
    analytic optimum to within a grid step, the ASF pick the solver's, and it is the same number
    every time (every rank computes it)."""
    crs = np.array(CANDS)
    comm, gains = a_ms + b_ms * crs, np.minimum(1, 0.8 * crs ** p / 0.1 ** p)
    tta = pick_on_grid(crs, comm, gains, 0.001, 0.1, other_ms=other_ms, pick="tta")
    assert tta.cr == pytest.approx(_tta_optimum(a_ms + other_ms, b_ms, p), rel=0.015)
    assert tta.pick == "tta" and tta.curves == {"time": "fit", "gain": "fit"}
    again = pick_on_grid(list(crs), list(comm), list(gains), 0.001, 0.1, other_ms=other_ms,
                         pick="tta")
    assert again.cr == tta.cr and again.time_ms == tta.time_ms
    c = np.linspace(0.001, 0.1, 20001)  # the ASF pick, brute force on the exact curves
    F = np.column_stack([a_ms + b_ms * c, 1 / np.minimum(1, 0.8 * c ** p / 0.1 ** p)])
    for scale in (None, other_ms):
        asf = pick_on_grid(crs, comm, gains, 0.001, 0.1, other_ms=scale)
        want = c[np.max(normalise_front(F, scale) * np.array([0.6, 0.4]), axis=1).argmin()]
        assert asf.cr == pytest.approx(want, rel=0.015), (scale, asf.cr, want)
    # the front is non-dominated and sorted by CR: time rises with it, the gain too
    front = np.array(tta.front)
    assert np.all(np.diff(front[:, 0]) > 0) and np.all(np.diff(front[:, 1]) >= 0)
    assert front[0, 0] == 0.001 and front[-1, 0] == 0.1
    with pytest.raises(ValueError, match="points must be >= 2, got 1"):
        pick_on_grid(crs, comm, gains, 0.001, 0.1, points=1)
    with pytest.raises(ValueError, match="needs other_ms"):
        pick_on_grid(crs, comm, gains, 0.001, 0.1, pick="tta")


def _probe_controller(rank=0, **kw):
    mode = Adaptive(**{"gain_every": 1, "min_interval": 10, **kw})
    return AdaptiveController(mode, rank=rank, hvd=None, process_set=None,
                              predict_ms=lambda c: {"allgather": 100 + 2000 * c,
                                                    "allreduce": 150 + 3000 * c},
                              model_version=lambda: 1)


def test_only_the_default_cr_picks_at_the_first_full_probe_after_warm_up():
    assert Adaptive().first_cr_from_probe and not Adaptive(cr=0.01).first_cr_from_probe
    assert "cr=from the start-up probe, else 0.01" in Adaptive().describe()
    ctrl = _probe_controller()
    assert ctrl.starts_probe_pick(0)
    assert not ctrl.starts_probe_pick(0)  # one chance: a later full probe (drift) never picks
    assert not _probe_controller(cr=0.01).starts_probe_pick(0)  # an explicit starting CR
    warm = _probe_controller(warmup_steps=20)
    assert not warm.starts_probe_pick(1)  # the probe ran during the ramp
    assert not warm.starts_probe_pick(25)
    restored = _probe_controller()
    restored.load_dict({"cr": 0.02})  # a checkpoint from before the key: the run had started
    assert not restored.starts_probe_pick(0)


def test_first_cr_from_rank0s_shared_row_is_the_grid_pick_and_holds_until_a_solve():
    g = torch.randn(50_000, generator=torch.Generator().manual_seed(5)) ** 3
    rank0, rank1 = (_probe_controller(rank=r, min_cr_change=0, min_tta_gain=0) for r in (0, 1))
    row0 = rank0.probe_share(0, lambda: g, 35.0)
    assert rank1.probe_share(0, lambda: g, 12.0) == [0.0] * 6  # other ranks send zeros
    assert row0[0] == 35.0 and row0[1:] == pytest.approx(gains_at_crs(g, CANDS))
    assert rank0.tracker.smoothed == pytest.approx(row0[1:])  # the gains joined the tracker
    picks = [ctrl.pick_from_probe(0, row0) for ctrl in (rank0, rank1)]
    assert picks[0] == picks[1]  # every rank: the same CR from the same row
    comm = [100 + 2000 * c for c in CANDS]  # the cheaper path at every candidate
    want = pick_on_grid(CANDS, comm, row0[1:], 0.001, 0.1, (0.6, 0.4), other_ms=35.0, pick="tta")
    assert picks[0] == float(f"{want.cr:.4g}") and picks[0] != 0.01
    solve = rank0.solves[-1]
    assert solve["reason"] == "start-up probe" and solve["other_ms"] == 35.0
    assert solve["comm_ms"] == pytest.approx(comm) and solve["paths"] == ["allgather"] * 5
    assert rank1.solves == []  # the record of solves is rank 0's
    for ctrl in (rank0, rank1):
        assert [ctrl.cr_for_step(s, False) for s in range(1, 5)] == [picks[0]] * 4
        assert ctrl.changes == [] and ctrl.n_announcements == 0
    # rank 0: the pick counts as the first optimisation; the next waits for a trigger
    rank0.note_other_ms(30.0)
    rank0.observe(0, g)  # the gains of step 0 are not measured twice
    assert rank0.tracker.samples == 1
    assert rank0._trigger(1) is None and rank0._trigger(9) is None
    state = rank0.to_dict()
    assert state["probe_pick_done"] is False  # starts_probe_pick was not called here
    assert state["announced_cr"] == picks[0] and state["last_result"]["pick"] == "tta"


def test_the_starting_cr_is_kept_against_a_pick_that_saves_little(caplog):
    """The pick at the probe is held to the rule that keeps a CR in use against a solve: a CR
    predicted to reach accuracy less than ``min_tta_gain`` sooner than the starting CR, or
    within ``min_cr_change`` of it, is not taken (the time objective is flat near its minimum,
    and the probe's single timings are noisy)."""
    row = [30.0, 0.74, 0.55, 0.41, 0.33, 0.24]  # gains of step 0 in a static run
    free = _probe_controller(min_cr_change=0, min_tta_gain=0)
    picked = free.pick_from_probe(0, row)
    excess = free.last_result.current_excess
    assert picked != 0.01 and 0 < excess < 0.5
    below = _probe_controller(min_cr_change=0, min_tta_gain=excess * 1.01)
    with caplog.at_level(logging.INFO, logger="hvd_flexcomm.adaptive"):
        assert below.pick_from_probe(0, row) == 0.01
    assert f"keeping the starting cr=0.01: the picked {picked:g} is predicted" in caplog.text
    assert below.n_kept == 1 and below.solves[-1]["cr"] == pytest.approx(free.solves[-1]["cr"])
    assert below.cr_for_step(1, False) == 0.01 and below.last_submit_step == 0
    above = _probe_controller(min_cr_change=0, min_tta_gain=excess * 0.99)
    assert above.pick_from_probe(0, row) == picked and above.n_kept == 0
    near = _probe_controller(min_tta_gain=0, min_cr_change=abs(picked - 0.01) / 0.01 * 1.01)
    assert near.pick_from_probe(0, row) == 0.01


@pytest.mark.parametrize("row,why", [
    ([math.nan, 0.5, 0.3, 0.2, 0.1, 0.05], "time outside communication was not measured"),
    ([30.0, math.nan, math.nan, math.nan, math.nan, math.nan], "gradient is not finite")])
def test_no_pick_without_rank0s_numbers_falls_back_to_the_first_solve(row, why, caplog):
    ctrl = _probe_controller()
    with caplog.at_level(logging.INFO, logger="hvd_flexcomm.adaptive"):
        assert ctrl.pick_from_probe(0, row) is None
    assert why in caplog.text and "cr=0.01 until the first optimisation" in caplog.text
    assert ctrl.cr_for_step(0, False) == 0.01 and ctrl.last_submit_step is None
    ctrl.tracker.update([0.5, 0.3, 0.2, 0.1, 0.05])
    assert ctrl._trigger(1) is None  # as before: the first solve waits for a measured step
    ctrl.note_other_ms(30.0)
    assert ctrl._trigger(1) == "first optimisation after warm-up"


def test_the_probe_row_carries_each_ranks_extra_numbers():
    """``run_probes_sharing`` appends ``extra`` to the row of the allgather that combines the
    timings and returns every rank's by rank; the timings are combined as before."""
    from hvd_flexcomm.probing import run_probes_sharing

    class TwoRanks:  # the ops run locally; the allgather stacks two ranks' rows
        Sum = "sum"

        def allreduce_async_(self, buf, **kw):
            return buf

        allgather_async = broadcast_async_ = allreduce_async_

        def synchronize(self, handle):
            return handle

        def allgather(self, tensor, name, **kw):
            other = tensor.clone()
            other[0, -2:] = torch.tensor([7.0, 8.0])
            return torch.cat([tensor, other])

    phases: dict = {}
    results, extras = run_probes_sharing(TwoRanks(), [("allgather", 64)], 1, [1.5, 2.5],
                                         phases_ms=phases)
    assert [(kind, nbytes) for kind, nbytes, _ in results] == [("allgather", 64)]
    assert extras == [[1.5, 2.5], [7.0, 8.0]]
    assert list(phases) == ["warm_up", "timed", "combine"] and min(phases.values()) >= 0
    empty: dict = {}
    assert run_probes_sharing(TwoRanks(), [], 1, phases_ms=empty) == ([], [])
    assert list(empty) == ["warm_up", "timed", "combine"] and empty["combine"] == 0.0
