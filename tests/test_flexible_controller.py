"""FlexibleController logic on synthetic timings (pure: no Horovod, no network)."""

import math
import statistics

import pytest

from hvd_flexcomm import Adaptive, Flexible
from hvd_flexcomm.flexible import PATH_CODES, FlexibleController
from hvd_flexcomm.probing import repeat_counts
from hvd_flexcomm.topk import k_for

NUMEL = 1_000_000


def _probe(ctrl, step, cr, ag_ms_per_byte, ar_ms_per_byte, fixed_ms=1.0, spread=None):
    """Run the due probe on a linear network; ``spread(kind, nbytes)``: one factor per repeat
    on that size's timing (default: every repeat times the line exactly)."""
    plan, repeats, what = ctrl.probe_plan(step, cr)
    counts = repeat_counts(len(plan), repeats)
    results = []
    for (kind, nbytes), count in zip(plan, counts, strict=True):
        slope = ag_ms_per_byte if kind == "allgather" else ar_ms_per_byte
        factors = spread(kind, nbytes) if spread is not None else (1.0,) * count
        results += [(kind, nbytes, f * (fixed_ms + slope * nbytes)) for f in factors]
    ctrl.after_probe(step, results, what, spent_ms=5.0)
    return plan, what


def test_startup_probe_spans_sizes_and_decides_cheaper_path():
    ctrl = FlexibleController(Flexible(cr=0.01), world_size=4, numel=NUMEL)
    plan, repeats, _ = ctrl.probe_plan(0, 0.01)
    sizes_k, sizes_k8 = ctrl.payload_bytes(10_000), ctrl.payload_bytes(1_250)
    # the size in use once (its first warm step replaces that timing), k/8 probe_repeats times
    assert repeats == [1 if b == sizes_k[kind] else 2 for kind, b in plan]
    plan, what = _probe(ctrl, 0, 0.01, ag_ms_per_byte=1e-4, ar_ms_per_byte=1e-6)
    assert what == "full" and {k for k, _ in plan} == {"allgather", "broadcast", "allreduce"}
    for kind in ("allgather", "broadcast", "allreduce"):  # the two ends of k/8 .. k
        assert sorted(b for k, b in plan if k == kind) == sorted({sizes_k8[kind], sizes_k[kind]})
    assert ctrl.decide(0, 0.01) == "allreduce"
    pred = ctrl.predicted_ms
    sizes = ctrl.payload_bytes(10_000)
    assert pred["allgather"] == pytest.approx(1.0 + 1e-4 * sizes["allgather"])
    assert pred["allreduce"] == pytest.approx(2.0 + 1e-6 * (sizes["broadcast"] +
                                                             sizes["allreduce"]))


def test_network_change_triggers_drift_probe_and_switch():
    """Flexible (a fixed CR): drift re-probes only the unused path at the k in use and
    re-anchors the path in use on the step timings that fired the detector."""
    mode = Flexible(cr=0.01, drift_threshold=0.25, drift_patience=3, reprobe_interval=0,
                    reprobe_by="probes")
    ctrl = FlexibleController(mode, world_size=2, numel=NUMEL)
    _probe(ctrl, 0, 0.01, ag_ms_per_byte=1e-6, ar_ms_per_byte=1e-5)
    assert ctrl.decide(0, 0.01) == "allgather"
    ag_ms = ctrl.predicted_ms["allgather"]
    for step in range(1, 10):  # measurements agree with the model: no drift
        ctrl.observe_step([PATH_CODES["allgather"], ag_ms, 0.0, 0.0], 0.01)
        assert not ctrl.probe_due
        assert ctrl.decide(step, 0.01) == "allgather"
    for _ in range(3):  # the allgather suddenly costs 10x
        assert not ctrl.probe_due
        ctrl.observe_step([PATH_CODES["allgather"], 10 * ag_ms, 0.0, 0.0], 0.01)
    assert ctrl.drift_probe_due and not ctrl.full_probe_due
    plan, what = _probe(ctrl, 13, 0.01, ag_ms_per_byte=1e-4, ar_ms_per_byte=1e-5)
    sizes = ctrl.payload_bytes(10_000)
    assert what == "drift" and sorted(plan) == [("allreduce", sizes["allreduce"]),
                                                 ("broadcast", sizes["broadcast"])]
    assert ctrl.n_drift_probes == 1 and ctrl.n_full_probes == 1 and not ctrl.probe_due
    # the allgather fit holds only the three slow steps now: it predicts them at the size in use
    assert ctrl.model.fits["allgather"].n_samples == 3
    assert ctrl.decide(13, 0.01) == "allreduce"
    assert ctrl.predicted_ms["allgather"] == pytest.approx(10 * ag_ms)
    assert ctrl.predicted_ms["allreduce"] == pytest.approx(2.0 + 1e-5 * (sizes["broadcast"]
                                                                         + sizes["allreduce"]))


def _level_switching_run(drift_noise, steps=80):
    """Allgather timings that switch between two levels 60% apart, in runs of 6 to 12 steps
    (TCP at 10 ms one way does this); every drift fires a drift probe that finds the network
    unchanged. Returns the controller and the steps that fired."""
    mode = Flexible(cr=0.01, drift_patience=5, drift_noise=drift_noise, reprobe_interval=0,
                    reprobe_by="probes")
    ctrl = FlexibleController(mode, world_size=2, numel=NUMEL)
    _probe(ctrl, 0, 0.01, ag_ms_per_byte=1e-6, ar_ms_per_byte=1e-5, fixed_ms=100.0)
    assert ctrl.decide(0, 0.01) == "allgather"
    runs = [(100.0, 9), (160.0, 6), (100.0, 12), (160.0, 7), (100.0, 8), (160.0, 10)] * 3
    series = [ms for level, n in runs for ms in [level] * n][:steps]
    fired_at = []
    for step, ms in enumerate(series, start=1):
        ctrl.observe_step([PATH_CODES["allgather"], ms, 0.0, 0.0], 0.01)
        if ctrl.probe_due:
            fired_at.append(step)
            _probe(ctrl, step, 0.01, ag_ms_per_byte=1e-6, ar_ms_per_byte=1e-5, fixed_ms=100.0)
        ctrl.decide(step, 0.01)
    return ctrl, fired_at


def test_drift_noise_keeps_a_level_switching_path_from_probing_on_its_own_noise():
    """The relative threshold alone fires a drift probe at most level switches; with the noise
    band (the default) only the first switch, before the path has shown both levels, can fire;
    a real change (every timing 5x) still fires within drift_patience steps."""
    _, fired_plain = _level_switching_run(drift_noise=0.0)
    ctrl, fired = _level_switching_run(drift_noise=0.1)
    assert len(fired_plain) >= 4
    assert len(fired) <= 1
    for i in range(5):
        assert not ctrl.probe_due
        ctrl.observe_step([PATH_CODES["allgather"], 800.0 + i, 0.0, 0.0], 0.01)
    assert ctrl.drift_probe_due


def test_drift_noise_starts_afresh_on_another_path_or_size():
    ctrl, _ = _level_switching_run(drift_noise=0.1, steps=20)
    assert ctrl.drift.noise_band() is not None
    predicted = ctrl.predict(0.02)["allgather"]
    ctrl.observe_step([PATH_CODES["allgather"], 0.9 * predicted, 0.0, 0.0], 0.02)  # another k
    assert list(ctrl.drift.history) == [0.9 * predicted] and ctrl.drift.noise_band() is None


def test_drift_probe_after_allreduce_drift_times_the_allgather():
    mode = Flexible(cr=0.01, drift_threshold=0.25, drift_patience=2, reprobe_interval=0,
                    reprobe_by="probes")
    ctrl = FlexibleController(mode, world_size=2, numel=NUMEL)
    _probe(ctrl, 0, 0.01, ag_ms_per_byte=1e-4, ar_ms_per_byte=1e-6)
    assert ctrl.decide(0, 0.01) == "allreduce"
    sizes = ctrl.payload_bytes(10_000)
    for _ in range(2):  # broadcast and allreduce 50x slower
        ctrl.observe_step([PATH_CODES["allreduce"], 50 * (1 + 1e-6 * sizes["broadcast"]),
                           50 * (1 + 1e-6 * sizes["allreduce"]), 0.0, 0.0], 0.01)
    plan, what = _probe(ctrl, 3, 0.01, ag_ms_per_byte=1e-4, ar_ms_per_byte=1e-6)
    assert what == "drift" and plan == [("allgather", sizes["allgather"])]
    assert ctrl.decide(3, 0.01) == "allgather"  # ~9 ms against ~104 ms


def test_drift_with_candidate_crs_runs_a_full_probe():
    """Adaptive (candidate CRs) needs every slope after a network change: a full probe."""
    mode = Flexible(cr=0.01, drift_threshold=0.25, drift_patience=2, reprobe_interval=0)
    ctrl = FlexibleController(mode, world_size=2, numel=NUMEL)
    ctrl.probe_crs = (0.1, 0.01, 0.001)
    _probe(ctrl, 0, 0.01, ag_ms_per_byte=1e-6, ar_ms_per_byte=1e-5)
    assert ctrl.decide(0, 0.01) == "allgather"
    for _ in range(2):
        ctrl.observe_step([PATH_CODES["allgather"], 10 * ctrl.predicted_ms["allgather"], 0.0, 0.0],
                          0.01)
    assert ctrl.full_probe_due and not ctrl.drift_probe_due
    plan, what = _probe(ctrl, 3, 0.01, ag_ms_per_byte=1e-5, ar_ms_per_byte=1e-5)
    assert what == "full" and len(plan) == 6 and ctrl.n_full_probes == 2


def test_after_probe_rejects_an_unknown_kind():
    ctrl = FlexibleController(Flexible(cr=0.01), world_size=2, numel=NUMEL)
    with pytest.raises(ValueError, match="'partial'"):
        ctrl.after_probe(0, [], "partial", spent_ms=0.0)


def test_step_timings_refit_the_path_in_use_and_a_slow_allreduce_fires_drift():
    """Step timings (minima over ranks, as delivered) feed both AR fits; agreement keeps the
    model quiet, a 10x allreduce fires a re-probe after ``drift_patience`` steps."""
    mode = Flexible(cr=0.01, drift_threshold=0.25, drift_patience=2, reprobe_interval=0,
                    reprobe_by="probes")
    ctrl = FlexibleController(mode, world_size=2, numel=NUMEL)
    _probe(ctrl, 0, 0.01, ag_ms_per_byte=1e-4, ar_ms_per_byte=1e-6)
    assert ctrl.decide(0, 0.01) == "allreduce"
    sizes = ctrl.payload_bytes(10_000)
    bcast_ms = ctrl.model.predict_ms("broadcast", sizes["broadcast"])
    ar_ms = ctrl.model.predict_ms("allreduce", sizes["allreduce"])
    n_bcast = ctrl.model.fits["broadcast"].n_samples
    for _ in range(6):
        ctrl.observe_step([PATH_CODES["allreduce"], bcast_ms, ar_ms, 0.0, 0.0], 0.01)
        assert not ctrl.probe_due
    # the first step's timings replaced the probe's at that size (one: the size in use is
    # timed once)
    assert ctrl.model.fits["broadcast"].n_samples == n_bcast - 1 + 6
    assert ctrl.model.predict_ms("broadcast", sizes["broadcast"]) == pytest.approx(bcast_ms)
    for _ in range(2):
        assert not ctrl.probe_due
        ctrl.observe_step([PATH_CODES["allreduce"], bcast_ms, 10 * ar_ms, 0.0, 0.0], 0.01)
    assert ctrl.drift_probe_due


def test_hysteresis_keeps_path_on_near_ties():
    mode = Flexible(cr=0.01, hysteresis=0.2, explore_within=0)
    ctrl = FlexibleController(mode, world_size=2, numel=NUMEL)
    _probe(ctrl, 0, 0.01, ag_ms_per_byte=1e-6, ar_ms_per_byte=1e-6, fixed_ms=0.0)
    first = ctrl.decide(0, 0.01)
    for step in range(1, 20):
        assert ctrl.decide(step, 0.01) == first
    assert ctrl.n_switches == 0


def test_periodic_refresh_probes_only_the_unused_path_within_its_budget():
    """A refresh is due after ``reprobe_interval`` steps only while the refreshes' time, this
    one's prediction included, fits in ``probe_budget`` of the measured step communication."""
    mode = Flexible(cr=0.01, reprobe_interval=10, probe_budget=0.05, reprobe_by="probes")
    ctrl = FlexibleController(mode, world_size=2, numel=NUMEL)
    _probe(ctrl, 0, 0.01, ag_ms_per_byte=1e-6, ar_ms_per_byte=1e-5)
    assert ctrl.decide(0, 0.01) == "allgather"
    ag_ms = ctrl.predicted_ms["allgather"]
    sizes = ctrl.payload_bytes(10_000)
    # run_probes' own op: the allgather of two timings and their two "following op" slots
    # (float64, 32 bytes per rank); the allreduce follows the broadcast, so no barrier op
    combine_ms = ctrl.model.predict_ms("allgather", 32)
    refresh_ms = (ctrl.model.predict_ms("broadcast", sizes["broadcast"])
                  + ctrl.model.predict_ms("allreduce", sizes["allreduce"]) + combine_ms)
    # communication measured so far: one step; 5% of it is far below the refresh's cost
    ctrl.observe_step([PATH_CODES["allgather"], ag_ms, 0.0, 0.0, 0.0], 0.01)
    assert ctrl.probe_plan(5, 0.01)[0] == []  # interval not reached
    assert ctrl.probe_plan(10, 0.01)[0] == []  # interval reached, budget not
    steps_needed = math.ceil(refresh_ms / (0.05 * ag_ms))
    for _ in range(steps_needed - 1):
        ctrl.observe_step([PATH_CODES["allgather"], ag_ms, 0.0, 0.0, 0.0], 0.01)
    assert ctrl.step_comm_ms_total == pytest.approx(steps_needed * ag_ms)
    plan, repeats, what = ctrl.probe_plan(10, 0.01)
    assert what == "refresh" and repeats == 1 and {k for k, _ in plan} == {"broadcast", "allreduce"}
    # the allreduce path got cheap meanwhile: the refresh re-anchors its fits (slope kept)
    ctrl.after_probe(10, [(k, b, 0.1) for k, b in plan], "refresh", spent_ms=1.0)
    assert ctrl.n_refreshes == 1
    assert ctrl.refresh_ms_total == pytest.approx(0.2 + ctrl.model.predict_ms("allgather", 32))
    assert ctrl.decide(10, 0.01) == "allreduce"
    assert ctrl.probe_plan(15, 0.01)[0] == []  # the interval counts from the refresh


def test_state_round_trip():
    ctrl = FlexibleController(Flexible(cr=0.01), world_size=2, numel=NUMEL)
    _probe(ctrl, 0, 0.01, 1e-6, 1e-5)
    ctrl.decide(0, 0.01)
    other = FlexibleController(Flexible(cr=0.01), world_size=2, numel=NUMEL)
    other.load_dict(ctrl.to_dict())
    assert other.path == ctrl.path and not other.probe_due
    assert other.predict(0.01) == ctrl.predict(0.01)


@pytest.mark.parametrize("kwargs,needle", [
    ({"hysteresis": 1.0}, "hysteresis"), ({"hysteresis": -0.1}, "hysteresis"),
    ({"drift_threshold": 0}, "drift_threshold"), ({"drift_patience": 0}, "drift_patience"),
    ({"reprobe_interval": -1}, "reprobe_interval"), ({"granularity": "bucket"}, "model"),
    ({"probe_budget": 0}, "probe_budget"), ({"probe_budget": float("inf")}, "probe_budget"),
    ({"selector": "x"}, "selector"), ({"cr": 0}, "cr"),
    ({"drift_noise": -0.1}, "drift_noise"), ({"drift_noise": 0.5}, "drift_noise"),
    ({"drift_noise": float("nan")}, "drift_noise"), ({"drift_noise": True}, "drift_noise"),
    ({"reprobe_by": "ops"}, "reprobe_by.*'ops'"), ({"reprobe_by": None}, "reprobe_by"),
    ({"level_steps": 0}, "level_steps.*0"), ({"level_steps": 2.5}, "level_steps"),
    ({"level_steps": True}, "level_steps"),
    ({"drift_confirm": -1}, "drift_confirm.*-1"), ({"drift_confirm": 1.5}, "drift_confirm"),
])
def test_flexible_rejects_bad_settings(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        Flexible(**kwargs)


def test_adaptive_re_measures_by_probes_only():
    assert Adaptive().reprobe_by == "probes" and Flexible().reprobe_by == "steps"
    with pytest.raises(ValueError, match="reprobe_by must be 'probes', got 'steps'"):
        Adaptive(reprobe_by="steps")


def test_warmup_goes_dense_when_the_dense_allreduce_is_cheaper():
    """Adaptive's warm-up: the full probe spans the candidate CRs only (not a warm-up CR of 0.8,
    whose top-k would make a huge probe); steps before ``dense_until_step`` go dense while the
    allreduce fit, extrapolated to the whole gradient, predicts that cheaper than both sparse
    paths."""
    ctrl = FlexibleController(Flexible(cr=0.1, hysteresis=0.1), world_size=4, numel=NUMEL)
    ctrl.probe_crs = (0.1, 0.01, 0.001)
    ctrl.dense_until_step = 20
    plan, _, what = ctrl.probe_plan(3, 0.8)
    assert what == "full" and {kind for kind, _ in plan} == {"allgather", "broadcast", "allreduce"}
    assert max(b for k, b in plan if k == "allgather") == ctrl.payload_bytes(100_000)["allgather"]
    ctrl.after_probe(3, [(kind, nbytes, 0.5 + 1e-5 * nbytes) for kind, nbytes in plan],
                     "full", spent_ms=1.0)
    dense_ms = 0.5 + 1e-5 * 4 * NUMEL  # 40.5 ms
    assert ctrl.decide(3, 0.8) == "dense"  # AR at 0.8: 8 bytes per kept entry, 64 ms + 1 ms
    assert ctrl.predicted_ms["dense"] == pytest.approx(dense_ms)
    assert ctrl.decide(10, 0.1) in ("allgather", "allreduce")  # 0.1: about 9 ms sparse
    assert ctrl.decide(25, 0.8) != "dense"  # warm-up over: sparse, as asked
    assert "dense" not in ctrl.predicted_ms
    ctrl.decide(4, 0.8)
    again = FlexibleController(Flexible(cr=0.1), world_size=4, numel=NUMEL)
    again.load_dict(ctrl.to_dict())  # a checkpoint taken on a dense step loads
    assert again.path == "dense" and again.router.current in ("allgather", "allreduce", None)


def test_full_probes_after_drift_warm_up_every_op_again():
    """The start-up probe and drift probes warm up each op name on its first use, a refresh runs
    no untimed op, and a full probe that follows drift (Adaptive's) warms up every op of its plan
    again (the network changed; TCP flows on the new round trip have not grown their windows)."""
    flex = FlexibleController(Flexible(cr=0.01), world_size=2, numel=100_000)
    for kind in ("full", "drift"):  # start-up; Flexible's one-size drift probe
        warm_up, warmed = flex.probe_warm_up(kind)
        assert warm_up and warmed is flex.warmed_probes
    warm_up, warmed = flex.probe_warm_up("refresh")
    assert not warm_up and warmed is flex.warmed_probes
    flex.n_full_probes = 1  # a full probe after that one follows drift (Adaptive)
    assert flex.probe_warm_up("full") == (True, None)


def _span_ctrl(ag_ms_per_byte=1e-6, **kw):
    """A controller with Adaptive's candidate CRs, calibrated on allgather ``1 + 1e-6·bytes`` ms
    (AR 10^4 times dearer per byte), at CR 0.01 on the allgather. Drift acts as soon as the
    detector fires unless ``drift_confirm`` is given."""
    from hvd_flexcomm import Adaptive

    kw.setdefault("drift_confirm", 0)
    kw.setdefault("drift_patience", 3)
    kw.setdefault("reprobe_interval", 0)
    mode = Adaptive(cr=0.01, **kw)
    ctrl = FlexibleController(mode, world_size=2, numel=NUMEL)
    ctrl.probe_crs = (0.1, 0.01, 0.001)
    _probe(ctrl, 0, 0.01, ag_ms_per_byte=ag_ms_per_byte, ar_ms_per_byte=1e-2)
    assert ctrl.decide(0, 0.01) == "allgather"
    return ctrl


@pytest.mark.parametrize("kinds, counts, barriers", [
    (["broadcast", "allreduce"], None, 0),  # AR-Topk's pair: the allreduce follows
    (["allreduce", "broadcast"], None, 1),  # nothing after the broadcast
    (["broadcast", "allgather", "allreduce"], [2, 2, 2], 2),
    (["broadcast", "allreduce"], [2, 1], 2),  # counts differ: not paired
    (["allgather", "broadcast", "allreduce", "allgather", "broadcast", "allreduce"], None, 0)])
def test_barriers_only_where_no_allreduce_follows_a_broadcast(kinds, counts, barriers):
    from hvd_flexcomm.probing import barriers_needed

    assert barriers_needed(kinds, counts) == barriers


def test_flexible_start_up_plan_pairs_each_broadcast_with_its_allreduce():
    from hvd_flexcomm.probing import barriers_needed

    ctrl = FlexibleController(Flexible(cr=0.01), world_size=4, numel=NUMEL)
    plan, repeats, _ = ctrl.probe_plan(0, 0.01)
    assert barriers_needed([kind for kind, _ in plan], repeats) == 0
    adaptive = FlexibleController(Adaptive(cr=0.01), world_size=4, numel=NUMEL)
    adaptive.probe_crs = (0.1, 0.01, 0.001)
    plan, repeats, _ = adaptive.probe_plan(0, 0.01)
    assert barriers_needed([kind for kind, _ in plan], repeats) == 0


@pytest.mark.parametrize("repeats", [0, [1, 2], [2, 0, 1]])
def test_run_probes_rejects_bad_repeat_counts(repeats):
    from hvd_flexcomm.probing import run_probes

    plan = [("allgather", 400), ("broadcast", 40), ("allreduce", 400)]
    with pytest.raises(ValueError, match="repeats must be"):
        run_probes(None, plan, repeats)  # checked before any collective


def test_adaptive_times_each_probe_size_once():
    """Adaptive's probes time each size once (``probe_repeats=1``; Flexible's default is 2): the
    start-up probe is 6 timed ops, the two ends of the candidates for each kind."""
    from hvd_flexcomm import Adaptive

    assert Adaptive().probe_repeats == 1 and Flexible().probe_repeats == 2
    ctrl = FlexibleController(Adaptive(cr=0.01), world_size=2, numel=NUMEL)
    ctrl.probe_crs = (0.1, 0.01, 0.001)
    plan, repeats, what = ctrl.probe_plan(0, 0.01)
    assert what == "full" and repeats == [1] * 6 and len(plan) == 6


def _ag_control(ms):
    return [PATH_CODES["allgather"], ms, 0.0, 0.0, 0.0]


def test_span_steps_run_at_the_cheaper_far_end_every_span_every_steps():
    """After ``span_every`` steps since the start-up probe, ``span_steps`` steps run at the end of
    the candidates that costs no extra time (c_low here), then the CR in use again; the first
    span at a size is "cold" (its names are negotiated), later ones are not."""
    ctrl = _span_ctrl(span_steps=2, span_every=10)
    crs = []
    for step in range(0, 25):
        crs.append(ctrl.step_cr(step, 0.01))
        if step > 0:  # the previous step's timings arrive with this one, as predicted
            cr, role = crs[-2]
            ctrl.observe_step(_ag_control(ctrl.predict(cr)["allgather"]), cr, role)
    assert crs[:10] == [(0.01, None)] * 10
    assert crs[10:12] == [(0.001, "cold"), (0.001, "span")]
    assert crs[12:20] == [(0.01, None)] * 8
    assert crs[20:22] == [(0.001, "span"), (0.001, "span")]
    assert ctrl.n_span_steps == 4 and ctrl.span_ms_total == 0.0  # c_low is cheaper: free
    assert (ctrl.n_span_confirms, ctrl.n_span_moves, ctrl.span_open) == (2, 0, False)
    # a span whose last timings have not arrived keeps the next one from starting
    late = _span_ctrl(span_steps=2, span_every=10)
    assert [late.step_cr(s, 0.01)[1] for s in (10, 11)] == ["cold", "span"]
    assert all(late.step_cr(s, 0.01) == (0.01, None) for s in range(12, 40))
    # at c_low the far end is c_high (k 100x away), and it costs extra time: it waits for the
    # budget (2% of the measured communication; none measured yet)
    ctrl2 = _span_ctrl(span_steps=2, span_every=10)
    assert ctrl2.step_cr(10, 0.001) == (0.001, None)
    for _ in range(10_000):
        ctrl2.observe_step(_ag_control(ctrl2.predict(0.001)["allgather"]), 0.001)
    assert ctrl2.step_cr(11, 0.001) == (0.1, "cold")
    extra = 2 * (ctrl2.predict(0.1)["allgather"] - ctrl2.predict(0.001)["allgather"])
    assert ctrl2.span_ms_total == pytest.approx(extra)
    assert ctrl2.span_ms_total <= 0.02 * ctrl2.step_comm_ms_total


def test_span_steps_need_candidates_and_can_be_turned_off():
    ctrl = FlexibleController(Flexible(cr=0.01), world_size=2, numel=NUMEL)  # no candidates
    _probe(ctrl, 0, 0.01, ag_ms_per_byte=1e-6, ar_ms_per_byte=1e-4)
    ctrl.decide(0, 0.01)
    assert all(ctrl.step_cr(s, 0.01) == (0.01, None) for s in range(200))
    off = _span_ctrl(span_steps=0, span_every=1)
    assert all(off.step_cr(s, 0.01) == (0.01, None) for s in range(200))


@pytest.mark.parametrize("in_use", [0.01, 0.005])
def test_span_timings_relearn_the_slope_without_firing_drift(in_use):
    """The network changed and a probe left a steep slope (the allgather predicted 3x dearer
    per byte than it is): a span at c_low measures the true cost there. One span off the model
    is only counted; the next one off on the same side refits the line, the prediction at the
    span's CR moves, and the model counts one recalibration. The spans' timings never reach the
    drift detector; the cold step's feed nothing. At CR 0.005 in use, the two spans' base (5x)
    is narrower than the probe's (100x), whose slope is pinned against narrower bases
    (``calibration.LEARN_SPAN``): two spans off on the same side unpin it."""
    ctrl = _span_ctrl(span_steps=2, span_every=5)
    size = {c: ctrl.payload_bytes(round(c * NUMEL))["allgather"] for c in (0.1, in_use, 0.001)}
    truth = {c: 20.0 + 1e-4 * size[c] for c in size}  # fixed cost 20 ms, 1e-4 ms/byte
    # a probe after the change measured a line 3x as steep, right at the CR in use (no drift)
    steep = {c: truth[in_use] + 3e-4 * (size[c] - size[in_use]) for c in size}
    ctrl.after_probe(1, [("allgather", size[c], steep[c]) for c in (0.1, 0.001) for _ in range(2)],
                     "full", spent_ms=1.0)
    assert ctrl.decide(1, in_use) == "allgather"
    version = ctrl.model_version
    for step in range(2, 6):  # steps at the CR in use measure the truth there, as the probe did
        assert ctrl.step_cr(step, in_use) == (in_use, None)
        ctrl.observe_step(_ag_control(truth[in_use]), in_use)
    assert ctrl.model.fits["allgather"].b_ms_per_byte == pytest.approx(3e-4, rel=1e-6)
    steep_at_high, steep_at_low = ctrl.predict(0.1)["allgather"], ctrl.predict(0.001)["allgather"]
    drift_state = (list(ctrl.drift.history), ctrl.drift.count, ctrl.drift_key)
    roles = [ctrl.step_cr(step, in_use) for step in (6, 7)]
    assert roles == [(0.001, "cold"), (0.001, "span")]
    ctrl.observe_step(_ag_control(5 * truth[0.001]), 0.001, "cold")  # negotiation: not fed
    assert ctrl.predict(0.001)["allgather"] == pytest.approx(steep_at_low)
    assert ctrl.predict(0.1)["allgather"] == pytest.approx(steep_at_high)
    ctrl.observe_step(_ag_control(truth[0.001]), 0.001, "span")
    # off once: counted, the model untouched
    assert (ctrl.n_span_offs, ctrl.span_off_side, ctrl.n_span_moves) == (1, "high", 0)
    assert ctrl.predict(0.1)["allgather"] == pytest.approx(steep_at_high)
    assert ctrl.model_version == version
    assert (list(ctrl.drift.history), ctrl.drift.count, ctrl.drift_key) == drift_state
    for step in range(8, 11):
        assert ctrl.step_cr(step, in_use) == (in_use, None)
        ctrl.observe_step(_ag_control(truth[in_use]), in_use)
    drift_state = (list(ctrl.drift.history), ctrl.drift.count, ctrl.drift_key)
    assert [ctrl.step_cr(step, in_use) for step in (11, 12)] == [(0.001, "span")] * 2
    ctrl.observe_step(_ag_control(truth[0.001]), 0.001, "span")
    ctrl.observe_step(_ag_control(truth[0.001]), 0.001, "span")
    # off twice on the same side: the probe's samples are gone, the line runs through the steps
    # at the CR in use and the span
    assert ctrl.model.fits["allgather"].n_sizes == 2 and ctrl.span_off_side is None
    for c in (0.1, in_use, 0.001):
        assert ctrl.predict(c)["allgather"] == pytest.approx(truth[c], rel=1e-6)
    assert steep_at_high > 1.5 * truth[0.1]
    assert ctrl.model_version == version + 1 and ctrl.n_span_moves == 1 and ctrl.n_span_offs == 1
    ctrl.observe_step(_ag_control(truth[0.001]), 0.001, "span")  # counted once per span
    assert ctrl.model_version == version + 1
    assert not ctrl.probe_due
    assert (list(ctrl.drift.history), ctrl.drift.count, ctrl.drift_key) == drift_state


def test_span_state_round_trip():
    ctrl = _span_ctrl(span_steps=2, span_every=5)
    ctrl.step_cr(5, 0.01)
    other = FlexibleController(ctrl.mode, world_size=2, numel=NUMEL)
    other.load_dict(ctrl.to_dict())
    assert (other.last_span_step, other.n_span_steps, other.span_ms_total) == (5, 1, 0.0)
    assert other.spanned_ks == set()  # a new process negotiates the span's names again


QUIET = [1.05, 0.95] * 6  # step timings within 5% of the prediction


def _fire_after_noise(ctrl, noise, burst):
    """Feed route steps at ``noise`` (factors of the prediction at CR 0.01: the path's recent
    range), then ``drift_patience`` steps at ``burst`` x: the detector fires. Returns the
    prediction (ms)."""
    predicted = ctrl.predict(0.01)["allgather"]
    for factor in noise:
        ctrl.observe_step(_ag_control(factor * predicted), 0.01)
    assert ctrl.drift_confirm_left == 0 and not ctrl.probe_due
    for _ in range(ctrl.mode.drift_patience):
        ctrl.observe_step(_ag_control(burst * predicted), 0.01)
    assert ctrl.drift_confirm_left == ctrl.mode.drift_confirm
    return predicted


def test_a_burst_the_next_step_does_not_confirm_re_measures_nothing():
    """``drift_confirm``: after the detector fires, the next route step back within
    ``drift_threshold`` of the prediction cancels the drift: no probe, no re-anchoring on the
    burst's steps, the model as it was; a span is held while the drift is being confirmed."""
    ctrl = _span_ctrl(span_steps=2, span_every=10, drift_confirm=3)
    quiet = _span_ctrl(span_steps=2, span_every=10, drift_patience=30)  # never fires here
    predicted = _fire_after_noise(ctrl, QUIET, burst=2.5)
    assert ctrl.drift_confirm_left == 3 and not ctrl.probe_due and not ctrl.recalibrating
    assert ctrl.step_cr(20, 0.01) == (0.01, None)  # a span would be due: held meanwhile
    ctrl.observe_step(_ag_control(2.5 * predicted), 0.01)  # still off: 2 to go
    assert ctrl.drift_confirm_left == 2 and not ctrl.probe_due
    ctrl.observe_step(_ag_control(1.1 * predicted), 0.01)  # back within the threshold
    assert ctrl.drift_confirm_left == 0 and ctrl.n_drift_unconfirmed == 1
    assert not ctrl.probe_due and ctrl.n_drift_probes == 0
    for speed in QUIET + [2.5] * 4 + [1.1]:  # the same steps
        quiet.observe_step(_ag_control(speed * predicted), 0.01)
    assert quiet.drift.count < quiet.mode.drift_patience and not quiet.probe_due
    # the model is what the steps alone make of it: nothing re-anchored on the burst
    assert ctrl.predict(0.01) == quiet.predict(0.01)
    assert ctrl.step_cr(21, 0.01) == (0.001, "cold")  # the span runs now
    assert ctrl.to_dict()["n_drift_unconfirmed"] == 1


def test_a_confirming_step_is_judged_by_the_range_the_detector_fired_on():
    """A step off by more than ``drift_threshold`` but inside the recent range the detector
    judged the burst by is the path's own noise: it does not confirm the drift."""
    ctrl = _span_ctrl(drift_confirm=2)
    # a range widening step by step: each step off the level returns inside it the next step
    predicted = _fire_after_noise(ctrl, [1.2, 0.8] * 3 + [1.8, 0.8] * 10, burst=4.0)
    unconfirmed, band = ctrl.n_drift_unconfirmed, ctrl.drift_confirm_band
    now = ctrl.predict(0.01)["allgather"]
    measured = 1.7 * predicted
    assert band is not None and band[0] < measured < band[1]
    assert ctrl.drift.off_prediction(now, measured)  # beyond the threshold
    ctrl.observe_step(_ag_control(measured), 0.01)
    assert ctrl.n_drift_unconfirmed == unconfirmed + 1 and not ctrl.probe_due


def test_a_drift_the_next_steps_confirm_re_anchors_on_the_latest_steps():
    """A real change: every step after the detector fired is off too, so after ``drift_confirm``
    of them the drift probe falls due (not before), and the path in use is re-anchored on the
    latest ``drift_patience`` steps, the settled ones, not on the first steps after the
    change."""
    ctrl = _span_ctrl(span_steps=2, span_every=50, drift_confirm=3)
    predicted = _fire_after_noise(ctrl, QUIET, burst=4.0)
    for left in (2, 1):
        ctrl.observe_step(_ag_control(2.0 * predicted), 0.01)
        assert ctrl.drift_confirm_left == left and not ctrl.probe_due
    ctrl.observe_step(_ag_control(2.0 * predicted), 0.01)
    assert ctrl.drift_probe_due and ctrl.drift_confirm_left == 0 and ctrl.recalibrating
    _, what = _probe(ctrl, 20, 0.01, ag_ms_per_byte=1e-6, ar_ms_per_byte=1e-2)
    assert what == "drift" and ctrl.n_drift_unconfirmed == 0
    assert ctrl.predict(0.01)["allgather"] == pytest.approx(2.0 * predicted)


def test_no_refresh_while_a_drift_is_being_confirmed():
    """A refresh due during the confirmation waits: if the drift is confirmed, its drift probe
    re-times the path not in use anyway (in the change runs of 385b113 a refresh ran one step
    before the drift probe in 2 of 3 seeds)."""
    ctrl = _span_ctrl(span_steps=0, reprobe_interval=5, drift_confirm=2)
    ctrl.step_comm_ms_total = 1e9  # any refresh fits the budget
    _fire_after_noise(ctrl, QUIET, burst=2.5)
    assert ctrl.probe_plan(30, 0.01) == ([], 0, "refresh")
    ctrl.observe_step(_ag_control(ctrl.predict(0.01)["allgather"]), 0.01)  # not confirmed
    plan, repeats, what = ctrl.probe_plan(31, 0.01)
    assert what == "refresh" and plan and repeats == 1


def test_drift_confirm_is_not_resumed_from_a_checkpoint():
    """A checkpoint keeps the count of unconfirmed drifts; a drift being confirmed is not
    resumed (as the detector's count: a lasting change fires it again)."""
    ctrl = _span_ctrl(drift_confirm=3)
    predicted = _fire_after_noise(ctrl, QUIET, burst=2.5)
    ctrl.observe_step(_ag_control(predicted), 0.01)
    _fire_after_noise(ctrl, QUIET, burst=2.5)
    assert (ctrl.n_drift_unconfirmed, ctrl.drift_confirm_left) == (1, 3)
    other = _span_ctrl(drift_confirm=3)
    other.load_dict(ctrl.to_dict())
    assert (other.n_drift_unconfirmed, other.drift_confirm_left) == (1, 0)


def test_drift_under_span_steps_runs_a_drift_probe_then_a_span_that_recalibrates():
    """With span steps, Adaptive's drift runs the cheap drift probe (the path not in use at the k
    in use), not a full probe over every candidate's size; a span follows ``span_settle_steps``
    later, then one on the other sparse path, outside the budget (AR-Topk costs far more than
    the allgather here), and each counts as a recalibration even when they find the slopes
    unchanged; ``recalibrating`` (no Adaptive solve) holds until both are judged."""
    ctrl = _span_ctrl(span_steps=2, span_every=50)
    version = ctrl.model_version
    for _ in range(3):  # the allgather suddenly costs 10x at the size in use
        ctrl.observe_step(_ag_control(10 * ctrl.predict(0.01)["allgather"]), 0.01)
    assert ctrl.drift_probe_due and not ctrl.full_probe_due and ctrl.recalibrating
    plan, what = _probe(ctrl, 4, 0.01, ag_ms_per_byte=1e-5, ar_ms_per_byte=1e-2)
    sizes = ctrl.payload_bytes(10_000)
    assert what == "drift" and sorted(plan) == [("allreduce", sizes["allreduce"]),
                                                 ("broadcast", sizes["broadcast"])]
    assert ctrl.model_version == version  # not yet: the slopes are the old network's
    assert all(fit._learned_span is None for fit in ctrl.model.fits.values())  # unpinned
    ctrl.decide(4, 0.01)
    assert ctrl.span_soon_step == 4 + ctrl.mode.span_settle_steps
    assert all(ctrl.step_cr(s, 0.01) == (0.01, None) for s in range(5, 4 + ctrl.mode.span_settle_steps))
    assert ctrl.step_cr(4 + ctrl.mode.span_settle_steps, 0.01) == (0.001, "cold")
    assert ctrl.step_cr(5 + ctrl.mode.span_settle_steps, 0.01) == (0.001, "span")
    ctrl.observe_step(_ag_control(1.0), 0.001, "cold")
    assert ctrl.model_version == version and ctrl.recalibrating  # Adaptive does not solve yet
    ctrl.observe_step(_ag_control(ctrl.predict(0.001)["allgather"]), 0.001, "span")  # as predicted
    # counted, but Adaptive waits for the other path's span too (its slope is the old one's)
    assert ctrl.model_version == version + 1 and ctrl.recalibrating
    assert ctrl.n_full_probes == 1 and ctrl.n_drift_probes == 1
    assert (ctrl.span_second_path, ctrl.span_soon_step, ctrl.span_other_due) == ("allreduce", 0,
                                                                                  False)
    extra = 2 * (ctrl.predict(0.001)["allreduce"] - ctrl.predict(0.01)["allgather"])
    assert extra > 0.02 * ctrl.step_comm_ms_total  # beyond the budget: it runs all the same
    first = 6 + ctrl.mode.span_settle_steps
    assert [ctrl.step_cr(s, 0.01) for s in (first, first + 1)] == [(0.001, "cold"),
                                                                  (0.001, "span")]
    assert ctrl.step_path("span") == "allreduce" and ctrl.path == "allgather"
    assert ctrl.span_ms_total == pytest.approx(extra)
    ar = [PATH_CODES["allreduce"], 1.0, 1.0, 0.0, 0.0]
    assert ctrl.recalibrating  # the second span under way
    ctrl.observe_step(ar, 0.001, "cold")
    ctrl.observe_step(ar, 0.001, "span")
    assert ctrl.model_version == version + 2 and ctrl.span_soon_step is None
    assert ctrl.span_second_path is None and not ctrl.span_open and not ctrl.recalibrating


@pytest.mark.parametrize("settle", [1, 10])
def test_the_span_after_a_drift_probe_waits_span_settle_steps(settle):
    """``Adaptive(span_settle_steps=...)`` sets the wait from a drift probe to its first span
    (the default is the test above): steps at the CR in use until then, then the span."""
    ctrl = _span_ctrl(span_steps=2, span_every=50, span_settle_steps=settle)
    for _ in range(3):  # the allgather suddenly costs 10x at the size in use
        ctrl.observe_step(_ag_control(10 * ctrl.predict(0.01)["allgather"]), 0.01)
    _probe(ctrl, 4, 0.01, ag_ms_per_byte=1e-5, ar_ms_per_byte=1e-2)
    ctrl.decide(4, 0.01)
    assert ctrl.span_soon_step == 4 + settle
    assert all(ctrl.step_cr(s, 0.01) == (0.01, None) for s in range(5, 4 + settle))
    assert ctrl.step_cr(4 + settle, 0.01) == (0.001, "cold")
    assert ctrl.step_cr(5 + settle, 0.01) == (0.001, "span")


def test_after_drift_with_no_span_in_reach_the_drift_probe_model_stands():
    """Candidates too close to the CR in use for a span (every end within SPAN_MIN_RATIO): the
    spans after drift cannot run, so once they fall due the model counts as re-measured
    (``recalibrating`` clears; Adaptive would otherwise never solve again)."""
    ctrl = _span_ctrl(span_steps=2, span_every=50)
    ctrl.probe_crs = (0.02, 0.01, 0.005)
    for _ in range(3):
        ctrl.observe_step(_ag_control(10 * ctrl.predict(0.01)["allgather"]), 0.01)
    _probe(ctrl, 4, 0.01, ag_ms_per_byte=1e-5, ar_ms_per_byte=1e-2)
    ctrl.decide(4, 0.01)
    assert ctrl.recalibrating and ctrl.span_other_due
    assert all(ctrl.step_cr(s, 0.01) == (0.01, None) for s in range(5, 5 + ctrl.mode.span_settle_steps))
    assert not ctrl.recalibrating and ctrl.span_soon_step is None and not ctrl.span_open
    assert ctrl.step_cr(30, 0.01) == (0.01, None)  # and no span later either


def test_after_drift_the_path_not_in_use_gets_a_span_of_its_own():
    """The reverse of a latency-bound link: the allgather in use was nearly flat per byte, the
    network turns bandwidth-bound and AR-Topk cheaper. The drift probe times AR-Topk at the k in
    use and the route moves to it; the span after drift re-slopes AR-Topk (the path in use), and
    a second span, on the allgather, re-slopes the path that is no longer in use. Before that
    second span the allgather's line is the old network's (flat through the size in use)."""
    ctrl = _span_ctrl(span_steps=2, span_every=500)
    truth_slope = {"allgather": 1e-4, "broadcast": 1e-5, "allreduce": 1e-5}
    truth_fixed = {"allgather": 5.0, "broadcast": 2.0, "allreduce": 2.0}

    def true_ms(kind, nbytes):
        return truth_fixed[kind] + truth_slope[kind] * nbytes

    def control(path, cr):
        sizes = ctrl.payload_bytes(round(cr * NUMEL))
        if path == "allgather":
            return _ag_control(true_ms("allgather", sizes["allgather"]))
        return [PATH_CODES["allreduce"], true_ms("broadcast", sizes["broadcast"]),
                true_ms("allreduce", sizes["allreduce"]), 0.0, 0.0]

    def true_path_ms(path, cr):
        sizes = ctrl.payload_bytes(round(cr * NUMEL))
        kinds = ("allgather",) if path == "allgather" else ("broadcast", "allreduce")
        return sum(true_ms(kind, sizes[kind]) for kind in kinds)

    for _ in range(3):  # the allgather now costs its new, steep price at the k in use
        ctrl.observe_step(control("allgather", 0.01), 0.01)
    assert ctrl.drift_probe_due
    plan, repeats, what = ctrl.probe_plan(1, 0.01)
    assert what == "drift" and {kind for kind, _ in plan} == {"broadcast", "allreduce"}
    ctrl.after_probe(1, [(kind, nbytes, true_ms(kind, nbytes)) for kind, nbytes in plan
                         for _ in range(repeats)], what, spent_ms=1.0)
    assert ctrl.decide(1, 0.01) == "allreduce"
    stale_ag = {c: ctrl.predict(c)["allgather"] for c in (0.1, 0.001)}
    assert stale_ag[0.001] > 2 * true_path_ms("allgather", 0.001)  # the old, flat slope
    version, step, paths = ctrl.model_version, 2, []
    while ctrl.n_span_moves < 2 and step < 2000:
        cr, role = ctrl.step_cr(step, 0.01)
        path = ctrl.step_path(role)
        paths.append((step, cr, path, role))
        ctrl.observe_step(control(path, cr), cr, role)
        ctrl.decide(step + 1, 0.01)
        step += 1
    spans = [(s, cr, path, role) for s, cr, path, role in paths if role is not None]
    assert [(cr, path, role) for _, cr, path, role in spans] == [
        (0.001, "allreduce", "cold"), (0.001, "allreduce", "span"),
        (0.001, "allgather", "cold"), (0.001, "allgather", "span")]
    assert spans[0][0] == 1 + ctrl.mode.span_settle_steps
    assert spans[2][0] == spans[1][0] + 1  # at once after the first span is judged
    assert ctrl.path == "allreduce"  # the route: span steps do not move it
    assert all(path == "allreduce" for _, _, path, role in paths if role is None)
    assert ctrl.model_version == version + 2 and ctrl.span_second_path is None
    for c in (0.1, 0.01, 0.001):  # both lines now rest on the new network's steps
        for path in ("allgather", "allreduce"):
            assert ctrl.predict(c)[path] == pytest.approx(true_path_ms(path, c), rel=1e-6)


def test_a_checkpoint_keeps_the_spans_after_drift_that_are_due():
    """A span under way is not resumed from a checkpoint, so one after drift is saved as due
    again: the first of the two (the path in use, then the other), or the second (its path);
    the drift probe's sizes, which those spans keep, are saved too. A full probe cancels them
    (it measured every slope)."""
    ctrl = _span_ctrl(span_steps=2, span_every=500)
    ctrl.drift_probe_due = True
    _probe(ctrl, 1, 0.01, ag_ms_per_byte=1e-6, ar_ms_per_byte=1e-2)
    ctrl.decide(1, 0.01)
    assert set(ctrl.drift_anchor_bytes) == {"broadcast", "allreduce"}
    start = ctrl.span_soon_step
    assert ctrl.step_cr(start, 0.01)[1] == "cold" and ctrl.span_open
    for state in (ctrl.to_dict(), ctrl.to_dict()):  # saving changes nothing
        resumed = FlexibleController(ctrl.mode, world_size=2, numel=NUMEL)
        resumed.load_dict(state)
        assert (resumed.span_soon_step, resumed.span_other_due, resumed.span_second_path) == (
            0, True, None)
        assert resumed.drift_anchor_bytes == ctrl.drift_anchor_bytes
    assert ctrl.span_open and ctrl.span_soon_step is None
    ctrl.step_cr(start + 1, 0.01)
    ctrl.observe_step(_ag_control(1.0), 0.001, "cold")
    ctrl.observe_step(_ag_control(ctrl.predict(0.001)["allgather"]), 0.001, "span")
    assert ctrl.step_cr(start + 2, 0.01)[1] == "cold" and ctrl.step_path("cold") == "allreduce"
    resumed = FlexibleController(ctrl.mode, world_size=2, numel=NUMEL)
    resumed.probe_crs = ctrl.probe_crs  # as the optimizer sets them from the candidates
    resumed.load_dict(ctrl.to_dict())
    assert (resumed.span_soon_step, resumed.span_other_due, resumed.span_second_path) == (
        0, False, "allreduce")
    assert resumed.step_cr(start + 2, 0.01) == (0.001, "cold")
    assert resumed.step_path("cold") == "allreduce"
    resumed.full_probe_due = True
    _probe(resumed, start + 3, 0.01, ag_ms_per_byte=1e-6, ar_ms_per_byte=1e-2)
    assert (resumed.span_soon_step, resumed.span_other_due, resumed.span_second_path) == (
        None, False, None)


def _span_ctrl_at_step_5(**kw):
    """:func:`_span_ctrl` with ``span_every=5`` after steps 1-4 at CR 0.01, each as predicted:
    the first span starts at step 5."""
    ctrl = _span_ctrl(span_every=5, **kw)
    for _ in range(1, 5):
        ctrl.observe_step(_ag_control(ctrl.predict(0.01)["allgather"]), 0.01)
    return ctrl


def _run_span(ctrl, start, measured_ms):
    """Run one span from ``start`` (its steps' CR from step_cr), feeding ``measured_ms`` per
    timed step (the first step at a new size is cold: fed something absurd, never used)."""
    roles = []
    for i in range(ctrl.mode.span_steps):
        cr, role = ctrl.step_cr(start + i, 0.01)
        roles.append(role)
    timed = iter(measured_ms)
    for role in roles:
        ms = 1e6 if role == "cold" else next(timed)
        ctrl.observe_step(_ag_control(ms), cr, role)
    return cr, roles


@pytest.mark.parametrize("factors, confirmed", [
    ((0.85, 1.2), True),           # within drift_threshold (25%) of the prediction
    ((2.2, 0.9, 0.8), True),       # one outlier: the others are within
    ((1.6, 0.6, 1.5), True),       # off on both sides: noise
    ((1.5, 1.4, 1.6), False),      # every step off on the same side: the model was wrong there
    ((0.5, 0.6), False),
])
def test_a_span_confirms_the_model_or_recalibrates_it(factors, confirmed):
    """A span's timings are judged against the prediction at its CR: when they confirm it (some
    step within drift_threshold, or steps on both sides) they are dropped and the probe's slope
    (measured over the whole range) stays; when every step is off on the same side, the span is
    counted as off and kept out of the model, and only when the next span is off on the same
    side too is the line refitted through the steps at the CR in use and that span's end, and a
    move counted."""
    ctrl = _span_ctrl_at_step_5(ag_ms_per_byte=1e-4, span_steps=len(factors) + 1)
    fit = ctrl.model.fits["allgather"]
    before = {c: ctrl.predict(c)["allgather"] for c in (0.1, 0.01, 0.001)}
    slope, n_samples = fit.b_ms_per_byte, fit.n_samples
    expected = before[0.001]
    cr, roles = _run_span(ctrl, 5, [f * expected for f in factors])
    assert cr == 0.001 and roles == ["cold"] + ["span"] * len(factors)
    assert not ctrl.span_open and ctrl.n_span_steps == len(factors) + 1
    unchanged = fit.n_samples == n_samples and fit.b_ms_per_byte == slope and {
        c: ctrl.predict(c)["allgather"] for c in before} == before
    if confirmed:
        assert (ctrl.n_span_confirms, ctrl.n_span_moves, ctrl.n_span_offs) == (1, 0, 0)
        assert unchanged
    else:
        assert (ctrl.n_span_confirms, ctrl.n_span_moves, ctrl.n_span_offs) == (0, 0, 1)
        assert unchanged and ctrl.span_off_side == ("high" if factors[0] > 1 else "low")
        step = 5 + len(roles)
        while ctrl.step_cr(step, 0.01) == (0.01, None):  # steps at the CR in use, as predicted
            ctrl.observe_step(_ag_control(before[0.01]), 0.01)
            step += 1
        # the span has started at ``step`` (warm now: every step timed); off again, same side
        for i in range(1, ctrl.mode.span_steps):
            assert ctrl.step_cr(step + i, 0.01) == (0.001, "span")
        for f in list(factors) + [factors[-1]]:
            ctrl.observe_step(_ag_control(f * expected), 0.001, "span")
        assert ctrl.n_span_moves == 1 and ctrl.span_off_side is None
        assert fit.n_sizes == 2  # the steps at 0.01 and the span's end: the probe's are gone
        # the line runs through the span's median at its end and the steps at the CR in use
        median = statistics.median(list(factors) + [factors[-1]]) * expected
        assert ctrl.predict(0.001)["allgather"] == pytest.approx(median, rel=1e-6)
        assert ctrl.predict(0.01)["allgather"] == pytest.approx(before[0.01], rel=1e-6)
    assert not ctrl.probe_due and ctrl.drift.count == 0


@pytest.mark.parametrize("factors, at_once", [
    ((0.3, 0.35), True),    # every step far below: only a faster network does that
    ((0.3, 0.45), False),   # one step within SPAN_FAR_BELOW: off once, as any off span
    ((3.0, 3.5), False),    # far above: stalls do that, so a second span must agree
])
def test_a_span_far_below_the_prediction_recalibrates_at_once(factors, at_once):
    """A routine span whose every timed step took less than 1/SPAN_FAR_BELOW of the prediction
    refits the line through the steps at the CR in use and the span's end at once (a move, no
    off span counted); anything less, or as far above, is off once and kept out of the model."""
    from hvd_flexcomm.flexible import SPAN_FAR_BELOW

    assert SPAN_FAR_BELOW == 2.5  # the bounds of the cases above: 1/2.5 = 0.4
    ctrl = _span_ctrl_at_step_5(span_steps=len(factors) + 1)
    version = ctrl.model_version
    before = {c: ctrl.predict(c)["allgather"] for c in (0.1, 0.01, 0.001)}
    cr, roles = _run_span(ctrl, 5, [f * before[0.001] for f in factors])
    assert cr == 0.001 and roles == ["cold"] + ["span"] * len(factors)
    if at_once:
        assert (ctrl.n_span_moves, ctrl.n_span_offs, ctrl.span_off_side) == (1, 0, None)
        assert ctrl.model_version == version + 1
        median = statistics.median(factors) * before[0.001]
        assert ctrl.predict(0.001)["allgather"] == pytest.approx(median, rel=1e-6)
        assert ctrl.predict(0.01)["allgather"] == pytest.approx(before[0.01], rel=1e-6)
    else:
        side = "low" if factors[0] < 1 else "high"
        assert (ctrl.n_span_moves, ctrl.n_span_offs, ctrl.span_off_side) == (0, 1, side)
        assert ctrl.model_version == version
        for c, ms in before.items():
            assert ctrl.predict(c)["allgather"] == pytest.approx(ms, rel=1e-9)


def test_off_spans_recalibrate_only_twice_in_a_row_on_the_same_side():
    """Off high, then off low: neither refits (noise on both sides over two spans); a confirm
    in between forgets an off span; a probe forgets it too; the state survives a checkpoint."""
    ctrl = _span_ctrl_at_step_5(ag_ms_per_byte=1e-4, span_steps=3)
    expected = ctrl.predict(0.001)["allgather"]
    before = {c: ctrl.predict(c)["allgather"] for c in (0.1, 0.01, 0.001)}

    def span(start, factor, n_timed):
        step = start
        while ctrl.step_cr(step, 0.01) == (0.01, None):
            ctrl.observe_step(_ag_control(before[0.01]), 0.01)
            step += 1
        for i in range(1, ctrl.mode.span_steps):
            ctrl.step_cr(step + i, 0.01)
        if n_timed < ctrl.mode.span_steps:
            ctrl.observe_step(_ag_control(1e6), 0.001, "cold")
        for _ in range(n_timed):
            ctrl.observe_step(_ag_control(factor * expected), 0.001, "span")
        return step + ctrl.mode.span_steps

    step = span(5, 1.6, 2)
    assert (ctrl.n_span_offs, ctrl.span_off_side) == (1, "high")
    step = span(step, 0.5, 3)
    assert (ctrl.n_span_offs, ctrl.span_off_side, ctrl.n_span_moves) == (2, "low", 0)
    step = span(step, 1.0, 3)  # confirms: the off span before it is forgotten
    assert (ctrl.n_span_confirms, ctrl.span_off_side) == (1, None)
    step = span(step, 1.6, 3)
    assert ctrl.span_off_side == "high"
    other = FlexibleController(ctrl.mode, world_size=2, numel=NUMEL)
    other.load_dict(ctrl.to_dict())
    assert (other.n_span_offs, other.span_off_side) == (3, "high")
    for c, ms in before.items():  # never refitted (the steps at 0.01 re-anchor it in place)
        assert ctrl.predict(c)["allgather"] == pytest.approx(ms, rel=1e-9)
    assert ctrl.n_span_moves == 0
    ctrl.drift_probe_due = True
    assert _probe(ctrl, step, 0.01, ag_ms_per_byte=1e-4, ar_ms_per_byte=1e-2)[1] == "drift"
    assert ctrl.span_off_side is None


def test_a_probe_abandons_the_span_under_way():
    """A drift probe while a span is open (its last timings not in yet) ends the span unjudged;
    timings of its steps that arrive later are dropped, and spans resume afterwards."""
    ctrl = _span_ctrl(span_steps=3, span_every=5)
    assert [ctrl.step_cr(s, 0.01)[1] for s in (5, 6)] == ["cold", "span"]
    ctrl.drift_probe_due = True  # as when the step before the span fired the drift detector
    _probe(ctrl, 7, 0.01, ag_ms_per_byte=1e-6, ar_ms_per_byte=1e-2)
    assert not ctrl.span_open and ctrl.span_left == 0
    fit = ctrl.model.fits["allgather"]
    state = fit.samples
    ctrl.observe_step(_ag_control(1e3), 0.001, "span")  # a straggler of the abandoned span
    assert fit.samples == state and ctrl.n_span_moves == ctrl.n_span_confirms == 0
    ctrl.decide(7, 0.01)
    assert ctrl.step_cr(7, 0.01) == (0.01, None)  # the span after drift waits to settle
    roles = [ctrl.step_cr(s, 0.01)[1] for s in range(8, 40)]
    assert "span" in roles


def test_a_route_step_is_cold_on_its_names_first_use_at_a_size():
    """Horovod negotiates a name afresh on its first use and on a new shape: a path's first step,
    and its first at another k; a return to a path at the k it last ran at is warm."""
    ctrl = FlexibleController(Flexible(cr=0.01), world_size=4, numel=NUMEL)
    assert ctrl.start_route_step("allgather", 0.01)[0]
    assert not ctrl.start_route_step("allgather", 0.01)[0]
    assert ctrl.start_route_step("allreduce", 0.01)[0]
    assert not ctrl.start_route_step("allgather", 0.01)[0]  # its names kept their shape
    assert ctrl.start_route_step("allgather", 0.02)[0]
    assert ctrl.start_route_step("allgather", 0.01)[0]  # the shape changed in between
    assert not ctrl.start_route_step("dense", 0.01)[0]  # one size only, never fitted
    assert not ctrl.start_route_step(None, 0.01)[0]


@pytest.mark.parametrize("cold", [True, False])
def test_a_cold_step_stays_out_of_the_model(cold):
    """The acceptance grid at 0.1 ms one way: the route moved to the allreduce, whose first step
    took ~4x its steady time while Horovod negotiated its names; fed to the fit, that one step
    (with the probe's noisy timings at that size) sent the route straight back. Kept out, the
    route stays and the fits and the drift detector see only warm steps (the measured
    communication still counts it). ``cold=False`` shows the step moving the fit."""
    mode = Flexible(cr=0.01, drift_threshold=0.25, drift_patience=3, reprobe_interval=0,
                    explore_within=0)
    ctrl = FlexibleController(mode, world_size=4, numel=NUMEL)
    sizes = ctrl.payload_bytes(10_000)
    repeats = mode.probe_repeats

    def spread(kind, nbytes):  # the probe's two timings of the allreduce kinds at k: 0.6x, 1.4x
        return (0.6, 1.4) if kind != "allgather" and nbytes == sizes[kind] else (1.0, 1.0)

    _probe(ctrl, 0, 0.01, ag_ms_per_byte=1e-6, ar_ms_per_byte=1.1e-6, fixed_ms=0.0, spread=spread)
    assert ctrl.decide(0, 0.01) == "allgather"
    assert ctrl.start_route_step("allgather", 0.01)[0]  # step 0: cold, as every first step
    ag_ms = ctrl.predicted_ms["allgather"]
    ctrl.observe_step([PATH_CODES["allgather"], 5 * ag_ms, 0.0, 0.0], 0.01, cold=True)
    assert ctrl.model.fits["allgather"].n_samples == 2 * repeats  # the probe's only
    step = 1
    while ctrl.decide(step, 0.01) == "allgather":  # the allgather runs slower than predicted
        assert not ctrl.start_route_step("allgather", 0.01)[0]
        ctrl.observe_step([PATH_CODES["allgather"], 1.3 * ag_ms, 0.0, 0.0], 0.01)
        step += 1
        assert step < 20 and not ctrl.probe_due
    assert ctrl.start_route_step("allreduce", 0.01)[0]  # the switch: the allreduce's first step
    bcast_ms = ctrl.model.predict_ms("broadcast", sizes["broadcast"])
    ar_ms = ctrl.model.predict_ms("allreduce", sizes["allreduce"])
    n_ar, comm_before = ctrl.model.fits["allreduce"].n_samples, ctrl.step_comm_ms_total
    ctrl.observe_step([PATH_CODES["allreduce"], 4 * bcast_ms, 4 * ar_ms, 0.0, 0.0], 0.01,
                      cold=cold)
    assert ctrl.step_comm_ms_total == pytest.approx(comm_before + 4 * (bcast_ms + ar_ms))
    if cold:
        assert ctrl.model.fits["allreduce"].n_samples == n_ar and ctrl.n_cold_steps == 2
        assert ctrl.decide(step + 1, 0.01) == "allreduce"
        assert ctrl.predicted_ms["allreduce"] == pytest.approx(bcast_ms + ar_ms)
    else:  # what a cold step did before it was kept out: as the path's first warm step, it
        # replaced the probe's two timings at that size
        assert ctrl.model.fits["allreduce"].n_samples == n_ar - 2 + 1 and ctrl.n_cold_steps == 1
        ctrl.decide(step + 1, 0.01)
        assert ctrl.predicted_ms["allreduce"] > 1.05 * (bcast_ms + ar_ms)


def _route_steps(ctrl, steps, warm_ms, cr=0.01, cold_factor=4.0):
    """Route steps as the optimizer runs them: the step's path (decided at the end of the step
    before, or now after a probe), its start, then the timings of the step before (they ride in
    this step's payload) and the next decision. ``warm_ms(path)``: (first, second) collective ms
    of a warm step; a cold one takes ``cold_factor`` times that. Returns the paths and the
    exploring flags, per step. ``warm_ms`` may take the step as a second argument (a network
    that changes). No probe may fall due (the caller runs none)."""
    paths, flags, sent, path = [], [], None, None
    for step in steps:
        if path is None:
            path = ctrl.decide(step, cr)
        cold, exploring = ctrl.start_route_step(path, cr)
        t1, t2 = warm_ms(path, step)
        factor = cold_factor if cold else 1.0
        if sent is not None:
            ctrl.observe_step(sent[0], cr, cold=sent[1], exploring=sent[2])
        sent = ([PATH_CODES[path], factor * t1, factor * t2, 0.0], cold, exploring)
        paths.append(path)
        flags.append(exploring)
        assert not ctrl.probe_due, step
        path = ctrl.decide(step + 1, cr)
    return paths, flags


@pytest.mark.parametrize("probe_factor, explores, level_steps", [
    (1.5, True, 1), (3.0, False, 1), (1.5, True, 3)])
def test_exploring_measures_the_path_not_chosen_with_real_steps(probe_factor, explores,
                                                                 level_steps):
    """The start-up probe times AR-Topk ``probe_factor`` times slower than its steps run (the
    grid's probes over-predicted it by 23% in the median cell, up to 2.3x). Within
    ``explore_within`` (2) of the chosen allgather, the allreduce runs for a cold and a warm
    step once the allgather has run a warm one; each path's warm step replaces the probe's
    timings at that size, and the route moves to the allreduce, which is faster; beyond it, the
    route never looks. With ``level_steps=3`` the move waits until three allgather steps are
    in."""
    mode = Flexible(cr=0.01, reprobe_interval=0, level_steps=level_steps)
    ctrl = FlexibleController(mode, world_size=4, numel=NUMEL)
    ar_true = 0.75e-6  # ms per byte of the allreduce path's steps; the allgather: 1e-6
    _probe(ctrl, 0, 0.01, ag_ms_per_byte=1e-6, ar_ms_per_byte=probe_factor * ar_true,
           fixed_ms=0.0)
    sizes = ctrl.payload_bytes(10_000)

    def warm_ms(path, step=None):
        if path == "allgather":
            return 1e-6 * sizes["allgather"], 0.0
        return ar_true * sizes["broadcast"], ar_true * sizes["allreduce"]

    paths, exploring = _route_steps(ctrl, range(14), warm_ms)
    if not explores:
        assert paths == ["allgather"] * 14 and not any(exploring)
        assert ctrl.n_explorations == 0
        return
    # steps 0-1 run the route's choice (cold, then warm), steps 2-3 explore (cold, then warm);
    # step 4 is decided before the warm exploring step's timings arrive, step 5 after: the
    # router then compares two real steps and moves to the allreduce -- or, with level_steps=3,
    # holds while the allgather's level rests on one warm step (step 1), at step 6 on two
    # (steps 1, 4), and moves at step 7, with three
    switch = 5 if level_steps == 1 else 7
    assert paths[:switch] == ["allgather", "allgather", "allreduce", "allreduce"] + [
        "allgather"] * (switch - 4)
    assert exploring[:switch] == [False, False, True, True] + [False] * (switch - 4)
    assert ctrl.n_held_switches == (0 if level_steps == 1 else 2)
    # the switch leaves the allgather: RECHECK_AFTER_STEPS later it runs one warm step (still
    # slower), and the route stays
    after = ["allreduce"] * 5 + ["allgather"] + ["allreduce"] * (14 - switch - 6)
    assert paths[switch:] == after, paths
    assert exploring[switch:] == [False] * 5 + [True] + [False] * (14 - switch - 6)
    assert ctrl.n_explorations == 1 and ctrl.router.current == "allreduce"
    assert ctrl.n_recheck_steps == 1 and ctrl.recheck_step is None
    assert ctrl.predicted_ms["allreduce"] == pytest.approx(sum(warm_ms("allreduce")))
    assert not ctrl.probe_due  # the exploring steps did not reach the drift detector


@pytest.mark.parametrize("slow_steps, level_steps, moves, holds", [
    ({1}, 3, False, 2), ({2}, 3, False, 1), (set(range(1, 40)), 3, True, 2),
    ({1}, 1, True, 0), ({2}, 1, True, 0)])
def test_one_slow_step_among_the_first_three_does_not_move_the_route(slow_steps, level_steps,
                                                                      moves, holds):
    """The allgather in use (AR-Topk 1.28x slower; no exploring, no refresh) takes 2.5x its
    time at ``slow_steps``. Its level at the size in use rests on real steps from its first warm
    step on (step 1; step 0 is cold); while one or two are in, the route does not leave it
    (``level_steps``, 3): one slow step, the first (a level of 2.5x, then 1.75x: two holds) or
    the second (1.75x: one hold), leaves the route alone once the third is in (their median);
    a network that stays slow moves it then (step 5, decided on the timings of steps 1-3).
    With ``level_steps=1`` the one slow step moves the route at once (step 3 or 4)."""
    mode = Flexible(cr=0.01, reprobe_interval=0, explore_within=0, level_steps=level_steps)
    ctrl = FlexibleController(mode, world_size=2, numel=NUMEL)
    sizes = ctrl.payload_bytes(10_000)
    # latency-bound, as the grid's 0.1 ms cells: each op costs 1 ms plus 1 ms per MB
    true_ms = {"allgather": lambda b: 1.0 + 1e-6 * b,
               "broadcast": lambda b: 0.65 + 1e-6 * b, "allreduce": lambda b: 0.65 + 1e-6 * b}
    plan, repeats, what = ctrl.probe_plan(0, 0.01)
    ctrl.after_probe(0, [(kind, nbytes, true_ms[kind](nbytes))
                         for (kind, nbytes), count in zip(plan, repeat_counts(len(plan), repeats))
                         for _ in range(count)], what, spent_ms=5.0)

    def warm_ms(path, step):
        if path == "allgather":
            factor = 2.5 if step in slow_steps else 1.0
            return factor * true_ms["allgather"](sizes["allgather"]), 0.0
        return (true_ms["broadcast"](sizes["broadcast"]),
                true_ms["allreduce"](sizes["allreduce"]))

    paths, _ = _route_steps(ctrl, range(8), warm_ms)
    if moves and level_steps == 1:  # the step after the slow one's timings arrived; it may
        first = 2 + min(slow_steps)  # move back once a normal step is in (not asserted)
        assert paths[:first + 1] == ["allgather"] * first + ["allreduce"], paths
    elif moves:
        assert paths == ["allgather"] * 5 + ["allreduce"] * 3, paths
    else:
        assert paths == ["allgather"] * 8, paths
    assert ctrl.n_held_switches == holds, ctrl.n_held_switches
    assert ctrl.to_dict()["n_held_switches"] == ctrl.n_held_switches


def test_levels_of_probes_or_of_candidate_crs_never_hold_the_route():
    """Before a warm step has replaced the probe's timings at the size in use, and under
    Adaptive (whose sizes are never marked as stepped, whatever its ``level_steps``), the route
    follows the predictions."""
    ctrl = FlexibleController(Flexible(cr=0.01, level_steps=3), world_size=2, numel=NUMEL)
    _probe(ctrl, 0, 0.01, ag_ms_per_byte=1e-6, ar_ms_per_byte=1e-5, fixed_ms=0.0)
    assert ctrl.decide(0, 0.01) == "allgather"
    assert not ctrl.level_unsettled("allgather", 0.01)
    adaptive = FlexibleController(Adaptive(level_steps=3, probe_top_cr=0.1), world_size=2,
                                  numel=NUMEL)  # the probe times the size the step runs
    adaptive.probe_crs = (0.1, 0.001)
    _probe(adaptive, 0, 0.1, ag_ms_per_byte=1e-6, ar_ms_per_byte=1e-5, fixed_ms=1.0)
    assert adaptive.decide(0, 0.1) == "allgather"
    sizes = adaptive.payload_bytes(k_for(0.1, NUMEL))  # one step 50x slower moves the route
    adaptive.observe_step([PATH_CODES["allgather"], 50 * (1.0 + 1e-6 * sizes["allgather"]),
                           0.0, 0.0], 0.1)
    assert not adaptive.level_unsettled("allgather", 0.1)
    assert adaptive.decide(1, 0.1) == "allreduce" and adaptive.n_held_switches == 0


def test_exploring_follows_full_and_drift_probes_of_flexible_only():
    ctrl = FlexibleController(Flexible(cr=0.01, reprobe_interval=0), world_size=4, numel=NUMEL)
    _probe(ctrl, 0, 0.01, ag_ms_per_byte=1e-6, ar_ms_per_byte=1.1e-6, fixed_ms=0.0)
    assert ctrl.explore_due
    ctrl.drift_probe_due = True
    _probe(ctrl, 5, 0.01, ag_ms_per_byte=1e-6, ar_ms_per_byte=1.1e-6, fixed_ms=0.0)
    assert ctrl.explore_due  # a drift probe times the path not in use again
    adaptive = FlexibleController(Adaptive(), world_size=4, numel=NUMEL)
    adaptive.probe_crs = (0.1, 0.001)
    _probe(adaptive, 0, 0.1, ag_ms_per_byte=1e-6, ar_ms_per_byte=1.1e-6, fixed_ms=0.0)
    assert not adaptive.explore_due  # its spans measure real steps
    off = FlexibleController(Flexible(cr=0.01, explore_within=0), world_size=4, numel=NUMEL)
    _probe(off, 0, 0.01, ag_ms_per_byte=1e-6, ar_ms_per_byte=1.1e-6, fixed_ms=0.0)
    assert not off.explore_due


def _allgather_slows_down(ag_factor_at):
    """A controller after its start-up probe (two ranks, CR 0.01, the allreduce path 10x the
    allgather's ms per byte, drift after 3 steps off by 25%, no exploring, no refresh), and
    ``warm_ms(path, step)`` of a network where the allgather's steps take ``ag_factor_at(step)``
    times their probed time (for :func:`_route_steps`)."""
    mode = Flexible(cr=0.01, drift_threshold=0.25, drift_patience=3, reprobe_interval=0,
                    explore_within=0)
    ctrl = FlexibleController(mode, world_size=2, numel=NUMEL)
    _probe(ctrl, 0, 0.01, ag_ms_per_byte=1e-6, ar_ms_per_byte=1e-5, fixed_ms=0.0)
    sizes = ctrl.payload_bytes(10_000)

    def warm_ms(path, step):
        if path == "allgather":
            return ag_factor_at(step) * 1e-6 * sizes["allgather"], 0.0
        return 1e-5 * sizes["broadcast"], 1e-5 * sizes["allreduce"]

    return ctrl, warm_ms


@pytest.mark.parametrize("ag_factor, switches", [(20.0, True), (2.0, False)])
def test_drift_re_measures_the_path_not_in_use_on_a_real_step(ag_factor, switches):
    """``reprobe_by="steps"`` (the default): at step 10 the allgather in use gets ``ag_factor``
    times slower. Its timings reach the fits a step late, so the detector fires (3 steps) with
    the timings of step 12, while step 13 runs; step 14 then runs the allreduce, new to Horovod
    (explore_within=0: it never ran), for a cold and a warm step, no probe; step 16 holds the
    allgather while the warm step's timings are in flight; from step 17 the router decides
    afresh on real steps of both paths: the allgather re-anchored on its slow steps, the
    allreduce on its step."""
    ctrl, warm_ms = _allgather_slows_down(lambda step: ag_factor if step >= 10 else 1.0)
    paths, exploring = _route_steps(ctrl, range(30), warm_ms)
    assert paths[:14] == ["allgather"] * 14 and not any(exploring[:14])
    assert paths[14:17] == ["allreduce", "allreduce", "allgather"], paths
    assert exploring[14:17] == [True, True, False]
    if switches:  # the allgather left gets a second look RECHECK_AFTER_STEPS later: still slow
        assert paths[17:22] == ["allreduce"] * 5 and not any(exploring[17:22]), paths
        assert paths[22] == "allgather" and exploring[22]
        assert paths[23:] == ["allreduce"] * 7 and not any(exploring[23:]), paths
    else:
        assert paths[17:] == ["allgather"] * 13 and not any(exploring[17:]), paths
    assert ctrl.n_drift_steps == 1 and ctrl.n_drift_probes == 0 and ctrl.n_full_probes == 1
    assert ctrl.n_recheck_steps == (1 if switches else 0) and ctrl.recheck_step is None
    assert ctrl.remeasure_why is None and ctrl.n_switches == (1 if switches else 0)
    assert ctrl.predicted_ms["allgather"] == pytest.approx(sum(warm_ms("allgather", 20)))
    assert ctrl.predicted_ms["allreduce"] == pytest.approx(sum(warm_ms("allreduce", 20)))


def test_a_path_left_after_a_transient_burst_gets_a_second_look():
    """The allgather in use runs 20x slower for steps 10-15 only (a burst, not a new network).
    Drift re-anchors it on the burst, the allreduce (10x the allgather's normal time) is
    re-measured and the route moves there at step 17; RECHECK_AFTER_STEPS later the allgather
    runs one exploring step, now at its normal time, and the route moves back."""
    from hvd_flexcomm.flexible import RECHECK_AFTER_STEPS

    ctrl, warm_ms = _allgather_slows_down(lambda step: 20.0 if 10 <= step < 16 else 1.0)
    paths, exploring = _route_steps(ctrl, range(40), warm_ms)
    back = 17 + RECHECK_AFTER_STEPS
    assert paths[17:back] == ["allreduce"] * RECHECK_AFTER_STEPS, paths
    assert paths[back] == "allgather" and exploring[back]
    assert paths[back + 1] == "allreduce"  # decided before the recheck's timings arrived
    # the route moved back at back + 2, a switch too: the allreduce it left gets its own
    # recheck, which finds it slower, and the route stays
    again = back + 2 + RECHECK_AFTER_STEPS
    assert paths[back + 2:again] == ["allgather"] * RECHECK_AFTER_STEPS, paths
    assert paths[again] == "allreduce" and exploring[again]
    assert paths[again + 1:] == ["allgather"] * (40 - again - 1), paths
    assert not any(exploring[back + 1:again]) and not any(exploring[again + 1:])
    assert ctrl.n_recheck_steps == 2 and ctrl.recheck_step is None and ctrl.n_switches == 2
    state = ctrl.to_dict()
    assert state["n_recheck_steps"] == 2 and state["recheck_step"] is None


def test_a_due_recheck_survives_a_checkpoint():
    ctrl = FlexibleController(Flexible(cr=0.01), world_size=2, numel=NUMEL)
    _probe(ctrl, 0, 0.01, ag_ms_per_byte=1e-6, ar_ms_per_byte=1e-5, fixed_ms=0.0)
    ctrl.recheck_step, ctrl.n_recheck_steps = 42, 3
    again = FlexibleController(Flexible(cr=0.01), world_size=2, numel=NUMEL)
    again.load_dict(ctrl.to_dict())
    assert again.recheck_step == 42 and again.n_recheck_steps == 3


def test_refreshes_on_real_steps_stay_within_the_budget():
    """A refresh under ``reprobe_by="steps"`` is an exploring step on the path not in use, due
    ``reprobe_interval`` steps after the last one once its predicted extra time (the predicted
    difference of the paths; twice for a path whose names are new, its first step cold) fits
    in ``probe_budget`` of the measured communication. At step 30 the allreduce path gets 4x
    cheaper than the probe measured: the first refresh finds it and the route moves (with its
    hysteresis; no reset); from then the allgather is the path refreshed."""
    mode = Flexible(cr=0.01, reprobe_interval=10, probe_budget=0.05, explore_within=0)
    ctrl = FlexibleController(mode, world_size=2, numel=NUMEL)
    _probe(ctrl, 0, 0.01, ag_ms_per_byte=1e-6, ar_ms_per_byte=2e-6, fixed_ms=0.0)
    sizes = ctrl.payload_bytes(10_000)
    ag_ms = 1e-6 * sizes["allgather"]

    def warm_ms(path, step):
        if path == "allgather":
            return ag_ms, 0.0
        slope = 0.5e-6 if step >= 30 else 2e-6
        return slope * sizes["broadcast"], slope * sizes["allreduce"]

    first_extra = 2 * (ctrl.predict(0.01)["allreduce"] - ctrl.predict(0.01)["allgather"])
    paths, exploring = _route_steps(ctrl, range(120), warm_ms)
    runs = [i for i in range(len(paths)) if exploring[i] and (i == 0 or not exploring[i - 1])]
    # the budget: when step s + 1 is decided, the measured communication holds steps 0 to s - 1
    # (the timings lag a step), step 0 cold (4x): s + 3 warm steps' worth
    assert runs[0] == math.ceil(first_extra / (0.05 * ag_ms)) - 2, runs
    assert exploring[runs[0]:runs[0] + 3] == [True, True, False]  # cold + warm allreduce
    assert paths[runs[0] + 3] == "allreduce" and not exploring[runs[0] + 3]
    assert all(paths[i] == ("allgather" if exploring[i] else "allreduce")
               for i in range(runs[0] + 3, len(paths)))
    # the switch at runs[0] + 3 left the allgather: its recheck comes RECHECK_AFTER_STEPS
    # later, and the refreshes count their interval from it
    from hvd_flexcomm.flexible import RECHECK_AFTER_STEPS

    assert runs[1] == runs[0] + 3 + RECHECK_AFTER_STEPS, runs
    assert all(b - a >= mode.reprobe_interval for a, b in zip(runs[1:], runs[2:])), runs
    assert ctrl.n_refresh_steps == len(runs) - 1 >= 3 and ctrl.n_refreshes == 0
    assert ctrl.n_recheck_steps == 1
    assert ctrl.refresh_ms_total <= mode.probe_budget * ctrl.step_comm_ms_total
    assert ctrl.predicted_ms["allgather"] == pytest.approx(ag_ms)


def test_a_re_measure_whose_timings_never_arrive_is_given_up():
    """The route holds while the path not in use is re-measured; if that step's timings never
    arrive (a step lost), the route decides again REMEASURE_MAX_WAIT steps after it."""
    from hvd_flexcomm.flexible import REMEASURE_MAX_WAIT

    ctrl = FlexibleController(Flexible(cr=0.01, reprobe_interval=0), world_size=2, numel=NUMEL)
    _probe(ctrl, 0, 0.01, ag_ms_per_byte=1e-6, ar_ms_per_byte=1e-5, fixed_ms=0.0)
    assert ctrl.decide(0, 0.01) == "allgather"
    ctrl.explore_due = False
    ctrl._remeasure("drift", "allgather")
    assert ctrl.decide(1, 0.01) == "allreduce" and ctrl.route_ks.get("allreduce") is None
    assert [ctrl.decide(s, 0.01) for s in range(2, 2 + REMEASURE_MAX_WAIT)] == (
        ["allreduce"] + ["allgather"] * (REMEASURE_MAX_WAIT - 1))  # cold + warm, then held
    assert ctrl.remeasure_why == "drift"
    assert ctrl.decide(2 + REMEASURE_MAX_WAIT, 0.01) == "allgather"
    assert ctrl.remeasure_why is None and ctrl.router.current == "allgather"


def test_probe_top_cr_caps_the_full_probe_sizes():
    """``Adaptive(probe_top_cr=0.033)``: the start-up probe's top size is k(0.033), not k(c_high)
    (``probe_top_cr=0.1``; its bottom stays k(c_low)); the lines fitted through it predict the
    CRs above it by extrapolation, exactly on a linear network."""
    capped = FlexibleController(Adaptive(cr=0.01, probe_top_cr=0.033), world_size=4, numel=NUMEL)
    full = FlexibleController(Adaptive(cr=0.01, probe_top_cr=0.1), world_size=4, numel=NUMEL)
    for ctrl in (capped, full):
        ctrl.probe_crs = (0.1, 0.033, 0.011, 0.004, 0.001)
    plan, _, what = capped.probe_plan(0, 0.01)
    assert what == "full"
    for kind in ("allgather", "broadcast", "allreduce"):
        assert sorted(b for k, b in plan if k == kind) == sorted(
            {capped.payload_bytes(k_for(c, NUMEL))[kind] for c in (0.001, 0.033)})
    assert max(b for _, b in plan) < max(b for _, b in full.probe_plan(0, 0.01)[0])
    _probe(capped, 0, 0.01, ag_ms_per_byte=1e-4, ar_ms_per_byte=1e-6, fixed_ms=100.0)
    want_ms = 100.0 + 1e-4 * capped.payload_bytes(k_for(0.1, NUMEL))["allgather"]
    assert capped.predict(0.1)["allgather"] == pytest.approx(want_ms, rel=1e-6)


@pytest.mark.parametrize("top", [0.001, 0.0005, 0.2, 0.0, "0.033", True])
def test_probe_top_cr_must_lie_in_the_searched_range(top):
    with pytest.raises(ValueError, match=f"probe_top_cr must be None or a CR in .*{top!r}"):
        Adaptive(probe_top_cr=top)


@pytest.mark.parametrize("candidates, c_low, c_high, top", [
    ((0.1, 0.033, 0.011, 0.004, 0.001), 0.001, 0.1, 0.033),  # the default: the second candidate
    ((0.1, 0.033, 0.011, 0.004, 0.001), 0.001, 0.02, 0.011),  # below a lower c_high
    ((0.1, 0.001), 0.001, 0.1, 0.1),  # no candidate inside: the whole range
    ((0.5, 0.05, 0.01), 0.01, 0.05, 0.05),  # c_high itself a candidate, none strictly inside
])
def test_default_probe_top_cr_is_the_largest_candidate_inside_the_range(candidates, c_low, c_high,
                                                                       top):
    from hvd_flexcomm.compression import default_probe_top_cr

    assert default_probe_top_cr(candidates, c_low, c_high) == top
    assert Adaptive(candidates=candidates, c_low=c_low, c_high=c_high).probe_top_cr == top


# -- the start-up calibration on real steps (Adaptive(start_by="steps")) ------------------------
CANDIDATE_CRS = (0.1, 0.033, 0.011, 0.004, 0.001)


def _linear_step_ms(path, cr, cold, numel=NUMEL, world_size=4):
    """(first, second) collective ms of a step on a linear network (allgather 10 ms + 1e-4
    ms/byte, broadcast 5 + 1e-5, allreduce 5 + 2e-5); a cold step 4x that."""
    sizes = FlexibleController(Flexible(cr=cr), world_size, numel).payload_bytes(k_for(cr, numel))
    factor = 4.0 if cold else 1.0
    if path == "allgather":
        return factor * (10.0 + 1e-4 * sizes["allgather"]), 0.0
    return factor * (5.0 + 1e-5 * sizes["broadcast"]), factor * (5.0 + 2e-5 * sizes["allreduce"])


def _drive(ctrl, steps, cr=0.01, step_ms=_linear_step_ms, lost=()):
    """The optimizer's calls for each of ``steps``: the due probe (none may be due), the route
    decision, the step's CR and role, its start; then the timings of the step before (they ride
    in this step's payload; those of the steps in ``lost`` never arrive) and the next decision.
    Returns ``[(path, cr, role), ...]`` and the recalibrating flag after each step."""
    ran, flags, sent = [], [], None
    for step in steps:
        plan, _, _ = ctrl.probe_plan(step, cr)
        if plan:
            return ran, flags, plan
        if ctrl.path is None:
            ctrl.decide(step, cr)
        step_cr, role = ctrl.step_cr(step, cr)
        path = ctrl.step_path(role)
        cold = ctrl.start_route_step(path, step_cr)[0] if role is None else role == "start-cold"
        t1, t2 = step_ms(path, step_cr, cold)
        if sent is not None:
            ctrl.observe_step(*sent[:3], cold=sent[3])
        sent = None if step in lost else ([PATH_CODES[path], t1, t2, 0.0], step_cr, role,
                                          cold and role is None)
        ran.append((path, step_cr, role))
        if not ctrl.probe_due:
            ctrl.decide(step + 1, cr)
        flags.append(ctrl.recalibrating)
    return ran, flags, []


def _start_ctrl(numel=NUMEL, **kw):
    ctrl = FlexibleController(Adaptive(cr=0.01, start_by="steps", **kw), world_size=4, numel=numel)
    ctrl.probe_crs = CANDIDATE_CRS + (0.001, 0.1)  # as the optimizer sets them
    return ctrl


def test_start_by_steps_calibrates_both_paths_on_real_steps_without_a_probe():
    """``start_by="steps"``: no probe; steps 0-7 run each sparse path at k(probe_top_cr) and
    k(c_low), a negotiating (cold) step then a timed one per size, under span names; step 8 runs
    the CR in use on the allgather; the model is calibrated when step 7's timings arrive (with
    step 8's payload), from the timed steps alone, and exactly on a linear network; the route
    then takes the cheaper path."""
    ctrl = _start_ctrl()
    ran, recalibrating, plan = _drive(ctrl, range(12))
    assert plan == []  # no probe at any step
    want = [(path, cr, role) for path in ("allgather", "allreduce") for cr in (0.033, 0.001)
            for role in ("start-cold", "start")]
    assert ran[:8] == want
    assert ran[8] == ("allgather", 0.01, None)  # before the model: the allgather
    assert ran[9:] == [("allreduce", 0.01, None)] * 3  # the cheaper path on this network
    assert recalibrating[:8] == [True] * 8 and recalibrating[8:] == [False] * 4
    assert ctrl.n_step_starts == 1 and ctrl.model_version == 1 and ctrl.n_full_probes == 0
    assert ctrl.last_probe_step == 7  # spans and refreshes count from the last start step
    for cr in (0.1, 0.01, 0.001):  # the cold steps' 4x timings are not in the fits
        ag, bc_ar = _linear_step_ms("allgather", cr, False), _linear_step_ms("allreduce", cr, False)
        assert ctrl.predict(cr)["allgather"] == pytest.approx(ag[0], rel=1e-6)
        assert ctrl.predict(cr)["allreduce"] == pytest.approx(sum(bc_ar), rel=1e-6)
    assert {("allgather", k_for(0.001, NUMEL)), ("allreduce", k_for(0.033, NUMEL))} <= ctrl.spanned_ks


@pytest.mark.parametrize("why", ["probe", "warm-up", "small message"])
def test_start_by_steps_falls_back_to_the_start_up_probe(why):
    """The start-up probe runs instead: the default ``start_by="probe"``, a warm-up step
    (``dense_until_step``), or a message whose two sizes lie under MIN_SLOPE_SPAN apart."""
    if why == "probe":
        ctrl = FlexibleController(Adaptive(cr=0.01), world_size=4, numel=NUMEL)
        ctrl.probe_crs = CANDIDATE_CRS
    elif why == "warm-up":
        ctrl = _start_ctrl()
        ctrl.dense_until_step = 5
    else:
        ctrl = _start_ctrl(numel=40)  # k(0.033) = 1 = k(0.001)
    plan, _, kind = ctrl.probe_plan(0, 0.01)
    assert plan and kind == "full" and not ctrl.start_pending


def test_start_steps_whose_timings_never_arrive_give_way_to_a_probe():
    """Step 5's timings are lost: REMEASURE_MAX_WAIT steps after the last start step (7) the
    start is given up, the fits start afresh and the full probe runs (once: not the steps
    again)."""
    ctrl = _start_ctrl()
    ran, recalibrating, plan = _drive(ctrl, range(30), lost={5})
    assert len(ran) == 8 + 5 and all(recalibrating)  # steps 8-12 wait for the lost timing
    assert plan and ctrl.full_probe_due and ctrl.start_given_up and not ctrl.start_pending
    _probe(ctrl, 13, 0.01, ag_ms_per_byte=1e-4, ar_ms_per_byte=1e-5)
    assert ctrl.n_full_probes == 1 and not ctrl.recalibrating


def test_a_start_on_steps_under_way_starts_again_after_a_checkpoint():
    """A checkpoint taken during the start steps holds no model: the loaded controller runs
    the start steps from the first; one taken after them keeps the model and the count."""
    ctrl = _start_ctrl()
    _drive(ctrl, range(4))
    fresh = _start_ctrl()
    fresh.load_dict(ctrl.to_dict())
    assert fresh.full_probe_due and not fresh.start_pending
    ran, _, plan = _drive(fresh, range(4, 14))
    assert plan == [] and ran[0] == ("allgather", 0.033, "start-cold")
    assert fresh.n_step_starts == 1
    again = _start_ctrl()
    again.load_dict(fresh.to_dict())
    assert again.n_step_starts == 1 and not again.full_probe_due
    assert again.predict(0.1) == fresh.predict(0.1)


def test_start_by_must_be_probe_or_steps():
    with pytest.raises(ValueError, match="start_by must be one of .*'probes'"):
        Adaptive(start_by="probes")
