"""benchmarks/step_budget.py: steady prices and overhead parts of a run's steps."""

from __future__ import annotations

import os

import pytest

from benchmarks import step_budget as sb

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAVED_RUN = os.path.join(REPO, "docs", "performance", "runs", "static_eea3726")


def _per_step(ms, crs, spans=None, probes=None):
    n = len(ms)
    return {"ms": list(ms), "cr": list(crs), "span": list(spans or [False] * n),
            "probe_ms": list(probes or [0.0] * n)}


def test_a_fixed_cr_run_splits_into_start_up_stalls_and_noise():
    ms = [500.0, 100.0] + [100.0] * 6 + [400.0] + [90.0, 110.0, 100.0]
    b = sb.budget(_per_step(ms, [0.01] * len(ms)), len(ms))
    assert b["steps"] == 12 and b["steady_s"] == pytest.approx(1.2)  # median 100 ms
    assert b["parts"]["start-up"] == pytest.approx(0.4)  # steps 0 and 1: before the first steady
    assert b["parts"]["stalls"] == pytest.approx(0.3)  # 400 ms > 3 x 100 ms
    assert b["parts"]["rest"] == pytest.approx(0.0)  # -10 and +10 ms
    assert sum(b["parts"].values()) == pytest.approx(b["overhead_s"])
    assert b["overhead_s"] == pytest.approx(b["time_s"] - b["steady_s"])


def test_adaptive_steps_before_the_first_priced_cr_are_priced_at_it():
    """Step 0 holds the probe, steps 1-4 run the starting CR 0.1 (too few steady steps for a
    price: they are priced at the CR that followed), then CR 0.01 with a cold first step, a
    3-step span at 0.001 and a change to 0.02 announced two steps before it."""
    ms = ([2400.0] + [400.0] * 4 + [200.0] + [100.0] * 9 + [80.0] * 3 + [100.0] * 7
          + [130.0, 120.0] + [300.0] + [150.0] * 6)
    crs = [0.1] * 5 + [0.01] * 10 + [0.001] * 3 + [0.01] * 9 + [0.02] * 7
    spans = [False] * 15 + [True] * 3 + [False] * 16
    probes = [2000.0] + [0.0] * 33
    per_step = _per_step(ms, crs, spans, probes)
    assert sb.cr_in_use(crs, spans)[15:18] == [0.01] * 3
    prices = sb.step_prices(per_step, len(ms))
    assert prices[:15] == [100.0] * 15 and prices[15:18] == [100.0] * 3  # span: the CR in use
    assert prices[27:] == [150.0] * 7
    b = sb.budget(per_step, len(ms))
    parts = b["parts"]
    # steps 0-7 come before the first steady step (7: it and the two before it at 0.01)
    assert parts["start-up"] == pytest.approx((2300 + 4 * 300 + 100) / 1e3)
    assert parts["spans"] == pytest.approx(3 * -20 / 1e3)  # the step after the span: +0
    assert parts["CR changes"] == pytest.approx((30 + 20 + 150) / 1e3)  # steps 25, 26, 27
    assert parts["probes"] == 0.0 and parts["stalls"] == 0.0
    assert sum(parts.values()) == pytest.approx(b["overhead_s"])


def test_a_network_change_prices_each_network_by_its_own_steps():
    ms = [300.0] + [100.0] * 9 + [500.0, 400.0] + [250.0] * 8
    crs = [0.01] * len(ms)
    b = sb.budget(_per_step(ms, crs), len(ms), change_step=10)
    assert sb.step_prices(_per_step(ms, crs), len(ms), 10)[9:11] == [100.0, 250.0]
    assert b["steady_s"] == pytest.approx((10 * 100 + 10 * 250) / 1e3)
    assert b["parts"]["network change"] == pytest.approx((250 + 150) / 1e3)  # 12: steady
    without = sb.budget(_per_step(ms, crs), len(ms))  # one price for both networks
    assert without["steady_s"] != pytest.approx(b["steady_s"])


def test_a_run_without_steady_steps_has_no_budget():
    assert sb.budget(_per_step([100.0, 200.0, 300.0, 400.0], [0.1, 0.05, 0.02, 0.01]), 4) is None


def test_compare_takes_each_runs_fastest_fixed_cr():
    def entry(kind, time_s, steady_s):
        parts = dict.fromkeys(sb.PARTS, 0.0)
        parts["rest"] = time_s - steady_s
        return {"name": kind, "kind": kind, "steps": 10, "time_s": time_s, "steady_s": steady_s,
                "overhead_s": time_s - steady_s, "parts": parts}

    runs = [("a", [entry("adaptive", 50.0, 40.0), entry("ag", 45.0, 44.0), entry("ar", 60.0, 58.0)]),
            ("b", [entry("adaptive", 30.0, 27.0), entry("ag", 40.0, 36.0)]),
            ("c", [entry("ag", 40.0, 36.0)])]  # no Adaptive: left out
    got = sb.compare(runs)
    assert [p["run"] for p in got["pairs"]] == ["a", "b"]
    assert got["pairs"][0]["best"]["kind"] == "ag"
    assert got["median_time_ratio"] == pytest.approx((50 / 45 + 30 / 40) / 2)
    assert got["geo_steady_ratio"] == pytest.approx(((40 / 44) * (27 / 36)) ** 0.5)
    assert got["adaptive_parts_s"]["rest"] == pytest.approx((10 + 3) / 2)
    assert "Adaptive against the best fixed CR of each run (2 runs)" in sb.markdown(
        runs, [("Adaptive", got)], "target")
    ab = [("a", [entry("adaptive", 50.0, 40.0) | {"name": "A"},
                 entry("adaptive", 40.0, 38.0) | {"name": "B"}, entry("ag", 45.0, 44.0)])]
    assert sb.adaptive_names(ab) == ["A", "B"]
    assert sb.compare(ab, "B")["median_time_ratio"] == pytest.approx(40 / 45)
    assert sb.compare(ab)["median_time_ratio"] == pytest.approx(50 / 45)  # the first


def test_the_command_line_reads_saved_runs(tmp_path, capsys):
    out, png = tmp_path / "budget.md", tmp_path / "budget.png"
    assert sb.main([SAVED_RUN, "--out", str(out), "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = out.read_text()
    assert text == capsys.readouterr().out.rstrip("\n") + "\n"
    for seed in (52, 53, 54):
        assert f"static_eea3726 seed {seed} | Adaptive" in text
        assert f"static_eea3726 seed {seed} | AG-Topk 0.01" in text
    assert "Adaptive against the best fixed CR of each run (3 runs)" in text
    for _, result in sb.load_runs([SAVED_RUN]):
        for e in sb.run_budgets(result):
            assert sum(e["parts"].values()) == pytest.approx(e["overhead_s"])
            row = next(r for r in result["rows"] if r["name"] == e["name"])
            assert e["time_s"] == pytest.approx(row["time_to_target_s"], rel=1e-3)


def test_the_command_line_names_a_directory_without_runs(tmp_path, capsys):
    with pytest.raises(SystemExit):
        sb.main([str(tmp_path)])
    assert str(tmp_path) in capsys.readouterr().err


def test_pool_methods_keeps_one_arm_of_an_ab_run_under_another_name(tmp_path, capsys):
    """``--pool-methods`` keeps only the named methods and takes an A/B run's other arm under
    the name given: the budget then has one Adaptive, with that arm's steps, and says so."""
    ab_run = os.path.join(REPO, "docs", "performance", "runs", "probe_top_ab_3340691")
    arm = "Adaptive (warm-up 0) (probe_top_cr=0.033)"
    out = tmp_path / "budget.md"
    assert sb.main([ab_run, "--out", str(out), "--pool-methods", "AG-Topk 0.01",
                    f"Adaptive={arm}"]) == 0
    text = out.read_text()
    assert "Adaptive against the best fixed CR of each run (6 runs)" in text
    assert "Dense" not in text and "(warm-up 0) |" not in text
    assert f"**Adaptive** is `{arm}` in probe_top_ab_3340691" in text
    whole = dict(sb.load_runs([ab_run]))
    for label, result in sb.load_runs([ab_run], [("Adaptive", arm)]):
        (kept,) = sb.run_budgets(result)
        (original,) = [e for e in sb.run_budgets(whole[label]) if e["name"] == arm]
        assert kept["name"] == "Adaptive" and kept["time_s"] == original["time_s"]
