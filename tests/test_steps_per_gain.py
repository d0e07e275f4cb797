"""benchmarks/steps_per_gain.py: the exponent of steps against gain, from saved runs."""

from __future__ import annotations

import math
import os

import pytest

from benchmarks import steps_per_gain as spg

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAVED_RUN = os.path.join(REPO, "docs", "performance", "runs", "reverse_581a89f")
CANDS = [0.1, 0.033, 0.011, 0.004, 0.001]


def test_the_exponent_maps_the_gain_ratio_onto_the_step_ratio():
    # 4x the gain at the higher CR, 2x the steps at the lower one: gamma 0.5
    assert spg.exponent(100, 200, 0.4, 0.1) == pytest.approx(0.5)
    assert spg.exponent(100, 100, 0.4, 0.1) == 0.0  # no more steps: gain does not matter
    # fewer steps at the lower CR: a negative exponent, reported as measured
    assert spg.exponent(200, 100, 0.4, 0.1) == pytest.approx(-0.5)
    with pytest.raises(ValueError, match="equal"):
        spg.exponent(100, 200, 0.3, 0.3)
    with pytest.raises(ValueError, match="> 0"):
        spg.exponent(100, 0, 0.4, 0.1)


def test_gains_are_read_between_candidates_in_log_log():
    gains = [0.5 * (c / 0.1) ** 0.6 for c in CANDS]  # a power law: exact in log-log
    assert spg.gain_at(CANDS, gains, 0.01) == pytest.approx(0.5 * 0.1 ** 0.6)
    assert spg.gain_at(CANDS, gains, 0.02) == pytest.approx(0.5 * 0.2 ** 0.6)
    assert spg.gain_at(CANDS, gains, 0.1) == pytest.approx(0.5)
    assert spg.gain_at(CANDS, gains, 0.5) == pytest.approx(0.5)  # beyond: the nearest end
    assert spg.gain_at(CANDS, gains, 0.0001) == pytest.approx(gains[-1])
    with pytest.raises(ValueError):
        spg.gain_at([0.1], [0.5], 0.1)


def test_weights_for_an_exponent_invert_the_picks_ratio():
    assert spg.weights_for(2 / 3) == pytest.approx((0.6, 0.4))
    assert spg.weights_for(0.0) == (1.0, 0.0)
    with pytest.raises(ValueError, match="gamma"):
        spg.weights_for(-0.1)


def _result(seed, steps_01, steps_001, solves=(), source="run_a", delay=5.0,
            adaptive_steps=200, adaptive_crs=None, spans=None):
    """A saved run with AG-Topk 0.1 and 0.01 rows and an Adaptive record with ``solves``
    (``(step, gains)``), ``adaptive_steps`` to the target at ``adaptive_crs`` per step."""
    settings = {"seed": seed, "n": 4, "model": {"kind": "mlp"}, "dense_steps": 160, "lr": 0.01,
                "momentum": 0.9, "batch_size": 64, "target_drop": 0.01, "eval_every": 20,
                "delay_ms": delay, "adaptive_defaults": {"candidates": CANDS}}
    rows = [{"name": "Dense", "kind": "dense", "cr": 1.0, "steps_to_target": 100},
            {"name": "AG-Topk 0.1", "kind": "ag", "cr": 0.1, "steps_to_target": steps_01},
            {"name": "AG-Topk 0.01", "kind": "ag", "cr": 0.01, "steps_to_target": steps_001},
            {"name": "Adaptive", "kind": "adaptive", "cr": None,
             "steps_to_target": adaptive_steps}]
    crs = adaptive_crs or [0.01] * 300
    records = [{"method": {"name": "AG-Topk 0.1", "kind": "ag"}},
               {"method": {"name": "Adaptive", "kind": "adaptive", "options": {}},
                "adaptive": {"solves": [{"step": s, "gains": list(g)} for s, g in solves]},
                "per_step": {"cr": crs, "span": spans or [False] * len(crs)}}]
    return {"settings": settings, "rows": rows, "records": records, "source": source}


def test_seeds_pool_their_runs_and_solves_and_skip_early_gains():
    late = [0.5, 0.3, 0.125, 0.07, 0.03]  # gain 0.125 at 0.011, 0.5 at 0.1
    early = [0.9, 0.8, 0.7, 0.6, 0.5]
    results = [
        _result(42, 140, 280, [(0, early), (60, late)], "run_a"),
        # the same seed on another network: steps agree up to an evaluation, gains the same
        _result(42, 140, 300, [(100, late)], "run_b", delay=25.0),
        _result(42, 160, None, [], "run_c"),  # missed at 0.01: counts as more than any
        _result(43, 180, 300, [], "run_d"),  # no gain curve: no estimate
    ]
    (est,) = spg.seed_estimates(results)
    assert est["seed"] == 42 and est["runs"] == ["run_a", "run_b", "run_c"]
    assert est["steps"] == {0.1: 140, 0.01: 300}  # medians of [140,140,160] and [280,300,inf]
    assert est["n_solves"] == 2  # the step-0 solve left out
    g_01 = spg.gain_at(CANDS, late, 0.01)
    assert est["gains"][0.1] == pytest.approx(0.5) and est["gains"][0.01] == pytest.approx(g_01)
    ((hi, lo, gamma),) = est["pairs"]
    assert (hi, lo) == (0.1, 0.01)
    assert gamma == pytest.approx(math.log(300 / 140) / math.log(0.5 / g_01))
    # with the step-0 solve in, the curve is the median of three: the late one still
    (est0,) = spg.seed_estimates(results, from_step=0)
    assert est0["n_solves"] == 3 and est0["gains"][0.1] == pytest.approx(0.5)


def test_a_seed_whose_runs_all_missed_a_cr_has_no_pair():
    late = [0.5, 0.3, 0.125, 0.07, 0.03]
    assert spg.seed_estimates([_result(44, 140, None, [(60, late)])]) == []


def test_the_command_reads_a_saved_run(tmp_path, capsys):
    out = tmp_path / "gamma.md"
    png = tmp_path / "gamma.png"
    assert spg.main([SAVED_RUN, "--out", str(out), "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = out.read_text()
    assert md == capsys.readouterr().out.rstrip("\n") + "\n"
    assert "| 0.1 / 0.01 | 3 |" in md and "assumes γ = 0.67" in md
    assert "Adaptive against AG-Topk 0.01 of the same run and seed" in md
    from benchmarks.bench_adaptive import read_seed_runs

    for est, res in zip(spg.seed_estimates(read_seed_runs([SAVED_RUN])),
                        read_seed_runs([SAVED_RUN])):
        rows = {r["cr"]: r["steps_to_target"] for r in res["rows"] if r["kind"] == "ag"}
        assert est["steps"] == rows  # one run per seed: its own steps
        assert 0 < est["gains"][0.01] < est["gains"][0.1] <= 1
    with pytest.raises(SystemExit):
        spg.main([SAVED_RUN, "--from-step", "-1"])
    with pytest.raises(SystemExit):
        spg.main([SAVED_RUN, "--reference-cr", "0"])


def test_adaptive_runs_give_points_against_the_fixed_cr_of_their_own_run():
    gains = [0.5 * (c / 0.1) ** 0.6 for c in CANDS]  # ln gain is 0.6 ln c + const
    # 100 steps at 0.033 with 5 span steps at 0.001 among them, target at step 100
    crs = [0.033] * 50 + [0.001] * 5 + [0.033] * 45 + [0.01] * 50
    spans = [False] * 50 + [True] * 5 + [False] * 95
    results = [_result(50, 100, 300, [(60, gains)], "run_a", adaptive_steps=100,
                       adaptive_crs=crs, spans=spans),
               _result(50, 100, None, [], "run_b"),  # its AG-Topk 0.01 missed: no point
               _result(51, 100, 200, [(60, gains)], "run_c", adaptive_steps=200)]
    points = spg.adaptive_points(results)
    assert sorted(len(v) for v in points.values()) == [1, 1]
    (x, y), = points[spg.training_key(results[0]["settings"])]
    # the 95 steps outside spans at 0.033 (the spans left out)
    assert x == pytest.approx(0.6 * math.log(0.033 / 0.01))
    assert y == pytest.approx(math.log(300 / 100))
    (x2, y2), = points[spg.training_key(results[2]["settings"])]
    assert x2 == pytest.approx(0.0) and y2 == pytest.approx(0.0)  # at 0.01 throughout, as fast
    assert spg.slope_through_origin([(x, y), (x2, y2)]) == pytest.approx(y / x)
    with pytest.raises(ValueError, match="no slope"):
        spg.slope_through_origin([(0.0, 1.0)])


def test_the_bootstrap_resamples_seeds_and_is_repeatable():
    exact = {("a",): [(1.0, 0.4), (2.0, 0.8)], ("b",): [(0.5, 0.2)]}
    assert spg.bootstrap_interval(exact) == pytest.approx((0.4, 0.4))  # every seed on one line
    noisy = {(str(i),): [(1.0, 0.4 + 0.1 * (i - 2))] for i in range(5)}  # slopes 0.2 .. 0.6
    lo, hi = spg.bootstrap_interval(noisy)
    assert 0.2 <= lo < 0.4 < hi <= 0.6
    assert spg.bootstrap_interval(noisy) == (lo, hi)
