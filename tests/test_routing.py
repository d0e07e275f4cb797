"""Tests of the per-step path choice with hysteresis."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hvd_flexcomm.routing import PATHS, Router, RoutingDecision, choose_path

ms = st.floats(min_value=0.0, max_value=1e6)
hyst = st.floats(min_value=0.0, max_value=0.9)
current_path = st.sampled_from(PATHS)


def _other(path: str) -> str:
    return "allreduce" if path == "allgather" else "allgather"


def test_first_choice_is_argmin_with_ties_to_allreduce():
    assert choose_path(5.0, 10.0, None) == "allgather"
    assert choose_path(10.0, 5.0, None) == "allreduce"
    assert choose_path(7.0, 7.0, None) == "allreduce"
    assert choose_path(math.inf, math.inf, None) == "allreduce"


def test_hysteresis_band_by_hand():
    # current AG at 10 ms, h = 0.1: switch only if AR < 9 ms.
    assert choose_path(10.0, 9.5, "allgather") == "allgather"
    assert choose_path(10.0, 9.0, "allgather") == "allgather"  # exactly 10% cheaper: stay
    assert choose_path(10.0, 8.9, "allgather") == "allreduce"
    # current AR at 20 ms: switch only if AG < 18 ms; AR getting costlier than AG by < 10%.
    assert choose_path(19.0, 20.0, "allreduce") == "allreduce"
    assert choose_path(17.9, 20.0, "allreduce") == "allgather"
    # zero hysteresis: any strictly cheaper path wins, equal costs stay
    assert choose_path(10.0, 9.99, "allgather", hysteresis=0.0) == "allreduce"
    assert choose_path(10.0, 10.0, "allgather", hysteresis=0.0) == "allgather"


def test_unusable_current_path_is_left():
    assert choose_path(math.inf, 50.0, "allgather") == "allreduce"
    assert choose_path(math.inf, math.inf, "allgather") == "allgather"


@pytest.mark.parametrize(
    "args",
    [
        (float("nan"), 1.0, None),
        (-1.0, 1.0, None),
        (1.0, 1.0, "ar_ring"),
    ],
)
def test_invalid_inputs(args):
    with pytest.raises(ValueError):
        choose_path(*args)


@pytest.mark.parametrize("h", [-0.1, 1.0, 2.0])
def test_invalid_hysteresis(h):
    with pytest.raises(ValueError):
        choose_path(1.0, 2.0, "allgather", hysteresis=h)
    with pytest.raises(ValueError):
        Router(hysteresis=h)


@settings(deadline=None)  # shared, noisy CI machines
@given(ag=ms, ar=ms, current=current_path, h=hyst)
def test_always_takes_a_path_cheaper_by_more_than_the_margin(ag, ar, current, h):
    pred = {"allgather": ag, "allreduce": ar}
    other = _other(current)
    chosen = choose_path(ag, ar, current, h)
    if pred[current] - pred[other] > h * pred[current] and pred[other] < (1 - h) * pred[current]:
        assert chosen == other
    # never switches to a path that is not strictly cheaper
    if chosen != current:
        assert pred[chosen] < pred[current]
    assert chosen in PATHS


@settings(deadline=None)  # shared, noisy CI machines
@given(ag=ms, ar=ms, current=current_path, h=hyst)
def test_stays_when_other_is_not_cheaper_by_the_margin(ag, ar, current, h):
    pred = {"allgather": ag, "allreduce": ar}
    if pred[_other(current)] >= (1 - h) * pred[current]:
        assert choose_path(ag, ar, current, h) == current


@settings(deadline=None)  # shared, noisy CI machines
@given(ag=ms, ar=ms)
def test_no_current_is_argmin(ag, ar):
    chosen = choose_path(ag, ar, None)
    pred = {"allgather": ag, "allreduce": ar}
    assert pred[chosen] == min(ag, ar)
    if ag == ar:
        assert chosen == "allreduce"


@settings(deadline=None)  # shared, noisy CI machines
@given(
    h=st.floats(min_value=0.01, max_value=0.5),
    base=st.lists(st.floats(min_value=0.1, max_value=1e4), min_size=2, max_size=50),
    fractions=st.lists(st.floats(min_value=0.0, max_value=1.0), min_size=50, max_size=50),
)
def test_never_flaps_inside_the_band(h, base, fractions):
    # Each step the two predictions are within each other's band: ar/ag in [1-h, 1/(1-h)].
    # After the first decision the router must never switch.
    router = Router(hysteresis=h)
    # (shrunk by 1e-9 so that floating-point rounding cannot push a ratio onto the boundary)
    lo, hi = (1 - h) * (1 + 1e-9), (1 - 1e-9) / (1 - h)
    for step, (ag, f) in enumerate(zip(base, fractions)):
        router.decide(step, ag, ag * (lo + f * (hi - lo)))
    assert router.n_switches == 0


@settings(deadline=None)  # shared, noisy CI machines
@given(
    h=st.floats(min_value=0.0, max_value=0.5),
    preds=st.lists(st.tuples(ms, ms), min_size=1, max_size=40),
)
def test_router_matches_choose_path(h, preds):
    router = Router(hysteresis=h)
    current = None
    switches = 0
    for step, (ag, ar) in enumerate(preds):
        expected = choose_path(ag, ar, current, h)
        decision = router.decide(step, ag, ar)
        assert decision.path == expected
        assert decision.switched == (current is not None and expected != current)
        switches += decision.switched
        current = expected
    assert router.current == current and router.n_switches == switches


def test_router_decision_record_and_reset():
    router = Router(hysteresis=0.1)
    first = router.decide(0, 10.0, 12.0)
    assert first == RoutingDecision(0, "allgather", {"allgather": 10.0, "allreduce": 12.0}, False)
    assert router.decide(1, 10.0, 9.5).path == "allgather"  # inside the band
    switch = router.decide(2, 10.0, 8.0)
    assert switch.path == "allreduce" and switch.switched and router.n_switches == 1
    router.reset()
    assert router.current is None and router.n_switches == 0
    assert router.decide(3, 10.0, 10.0).path == "allreduce"
