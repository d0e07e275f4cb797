"""End-to-end run of the Flexible acceptance grid's ``--quick`` mode on the network emulator.

Needs root (network namespaces), iproute2, ``/dev/net/tun`` and Horovod; skips otherwise. Checks
only that the benchmark ran and wrote sane results: performance is reported by the benchmark, not
asserted here.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from hvd_flexcomm.netem import launch, namespaces

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GRID = os.path.join(REPO, "benchmarks", "bench_flexible_grid.py")
PATHS = ("allgather", "allreduce")


def _missing() -> str | None:
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    reason = namespaces.require_root_and_iproute()
    if reason is not None:
        return f"emulator {reason}"
    if not os.path.exists(os.path.join(launch.venv_bin(), "horovodrun")):
        return f"no horovodrun in {launch.venv_bin()}"
    try:
        import horovod.torch  # noqa: F401
    except Exception as exc:  # a broken build raises more than ImportError
        return f"horovod.torch does not import: {exc}"
    return None


def _positive(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


@pytest.mark.slow
@pytest.mark.root
@pytest.mark.timeout(240)
def test_grid_quick_runs_end_to_end(tmp_path):
    missing = _missing()
    if missing:
        pytest.skip(missing)
    out = tmp_path / "grid"
    # --reuse-job: one horovodrun launch for the four cells (launches are the slow part on a busy
    # 2-core machine); the cells and the outputs are the same as with one job per network.
    # --hysteresis: a Flexible option that must reach the optimizers the job builds;
    # --replicate: the baseline runs twice per cell (AG-Topk and AR-Topk again, interleaved);
    # --ab: a second Flexible with level_steps=3 (and the hysteresis of the first), interleaved
    proc = subprocess.run([sys.executable, GRID, "--quick", "--reuse-job", "--hysteresis", "0.07",
                           "--replicate", "--ab", "level_steps=3", "--out", str(out)], cwd=REPO,
                          capture_output=True, text=True, timeout=225, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, f"rc {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    for name in ("grid.json", "grid.md", "grid.png"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name

    data = json.loads((out / "grid.json").read_text())
    cells = data["cells"]
    expected = {(2, lat, rate, 0.01) for lat in (0.1, 10.0) for rate in (100.0, None)}
    got = {(c["N"], c["latency_ms"], c["rate_mbit"], c["cr"]) for c in cells}
    assert got == expected and len(cells) == len(expected), sorted(got, key=str)
    for c in cells:
        assert c["choice"] in PATHS, c
        assert set(c["choices"]) <= set(PATHS), c
        for key in ("ag_ms", "ar_ms", "flex_ms", "pred_ag_ms", "pred_ar_ms", "wall_ag_ms",
                    "wall_ar_ms", "wall_flex_ms"):
            assert _positive(c[key]), (key, c)
    assert data["meta"]["flex_options"] == {"hysteresis": 0.07}
    assert "'hysteresis': 0.07" in (out / "grid.md").read_text()
    for rec in data["records"]:
        assert rec["flex_hysteresis"] == 0.07, rec["flex_hysteresis"]
        assert all(len(rec["timed"][m]) == 4
                   for m in ("ag", "ar", "flex", "flexb", "ag2", "ar2")), rec
        assert rec["flex_held_switches"] == 0, rec  # the default, level_steps=1, never holds
        assert isinstance(rec["flexb_held_switches"], int), rec
        for method, coll in (("ag", ("allgather",)), ("ar", ("allreduce",)), ("flex", PATHS),
                             ("flexb", PATHS), ("ag2", ("allgather",)), ("ar2", ("allreduce",))):
            for s in rec["warmup"][method] + rec["timed"][method]:
                assert s["collective"] in coll, (method, s)
                assert _positive(s["comm_ms"]) and _positive(s["wall_ms"]), (method, s)
                if method.startswith("flex"):
                    assert all(_positive(v) for v in s["predicted_ms"].values()), s
    acc = data["acceptance"]
    assert acc["cells"] == len(expected)
    assert 0.0 <= acc["flex_within_5pct_share"] <= 1.0
    assert data["meta"]["replicate"] is True and acc["replicate_cells"] == len(expected)
    assert 0.0 <= acc["replicate_within_5pct_share"] <= 1.0
    assert all(_positive(c["replicate_ratio"]) for c in cells)
    assert data["meta"]["ab_options"] == {"level_steps": 3} and acc["ab_cells"] == len(expected)
    assert all(_positive(c["flexb_ms"]) and set(c["flexb_choices"]) <= set(PATHS) for c in cells)
    text = (out / "grid.md").read_text()
    assert "Acceptance" in text and "(`--replicate`" in text and "(`--ab level_steps=3`" in text


CHANGE = os.path.join(REPO, "benchmarks", "bench_flexible_change.py")


def test_change_analysis_counts_route_switches_not_exploring_steps():
    """An exploring step runs the other path for a step without switching the route: the
    switch after a change is the first *route* step on another path (the change run at 80f9ee7
    explored AR-Topk at steps 37-38 and switched only at step 58)."""
    sys.path.insert(0, os.path.join(REPO, "benchmarks"))
    import bench_flexible_change as bench

    def step(i, coll, exploring=False):
        return {"kind": "step", "step": i, "collective": coll, "exploring": exploring,
                "network": {"label": "net"}}

    records = [step(i, "allgather") for i in range(10)]
    records += [step(10, "allgather"), step(11, "allreduce", True), step(12, "allreduce", True)]
    records += [step(i, "allgather") for i in range(13, 16)]
    records += [step(i, "allreduce") for i in range(16, 40)]
    records += [step(40, "allreduce"), step(41, "allgather")]  # a switch without exploring
    first, second = bench.analyse(records, [5, 40])
    assert first["switch_step"] == 16 and first["steps_to_switch"] == 11
    assert first["first_other_step"] == 11 and first["within_target"]
    assert second["switch_step"] == second["first_other_step"] == 41
    lines = bench.report([first, second], records)
    assert "exploring the other path from step 11" in lines[0]
    assert "exploring" not in lines[1]
    late = bench.analyse(records[:12] + [step(i, "allgather") for i in range(12, 40)], [5])[0]
    assert late["switch_step"] is None and late["first_other_step"] == 11
    assert "NOT met" in bench.report([late], records)[0]


def test_change_report_prices_re_measuring_steps_against_the_route_before_them():
    """A re-measuring step (the path not in use on a real step) costs its wall time minus the
    median of the last 3 route steps on the same link before it (cold, exploring and probe steps
    are not route steps); it can be negative. Probing is priced apart (probe ms)."""
    sys.path.insert(0, os.path.join(REPO, "benchmarks"))
    import bench_flexible_change as bench

    def step(i, wall, link=0, **kw):
        return {"kind": "step", "step": i, "collective": "allgather", "wall_ms": wall,
                "network": {"index": link, "label": f"net{link}"}, **kw}

    records = [step(0, 900.0, probe_ms=800.0, cold=True), step(1, 100.0), step(2, 120.0),
               step(3, 110.0), step(4, 400.0, exploring=True, remeasure="refresh"),
               step(5, 999.0, link=1), step(6, 300.0, link=1), step(7, 200.0, link=1),
               step(8, 100.0, link=1, exploring=True, remeasure="drift"),
               step(9, 50.0, link=2, exploring=True, remeasure="drift")]  # no route step before
    n, extra = bench.remeasure_extra_ms(records)
    assert n == 2 and extra == pytest.approx((400.0 - 110.0) + (100.0 - 300.0))
    share = bench.probe_share(records)
    wall = sum(r["wall_ms"] for r in records)
    assert share["share_after_start"] == 0.0 and share["remeasure_steps"] == 2
    assert share["share_after_start_all"] == pytest.approx(90.0 / wall)
    seg = bench.analyse(records, [0, 5])[0]
    assert seg["remeasure_steps"] == [(8, "drift"), (9, "drift")]
    lines = bench.report([seg], records)
    assert "re-measuring on real steps 8 (drift), 9 (drift)" in lines[0]
    assert "re-measuring on real steps (2 steps): +90 ms" in lines[-1]


@pytest.mark.slow
@pytest.mark.root
@pytest.mark.timeout(300)
def test_adaptive_cr_moves_when_a_network_change_reshapes_the_time_curve(tmp_path):
    """#5's "the CR changes after a simulated network change", on a real emulated network (N=2).

    0.1 ms one way at 100 Mbit/s, then from step 25 10 ms at an unlimited rate. The path in use
    gets slower, so the drift detector fires, a drift probe re-times the size in use and the
    span after it (``span_settle_steps`` later: 4, 10 before 2d3bc92) the far end of the
    candidates, and Adaptive re-solves for the recalibrated network; no solve reads the model
    between the two (``FlexibleController.recalibrating``). TCP settling on the new round trip
    can fire a second drift near step 50 (at 41038d2 this test failed in 2 of 5 suite runs, the
    one whose report was kept on a solve 4 steps after such a drift probe, and in 0 of 18 runs
    alone): its span came near step 60 with the wait of 10, so the run has 80 steps. Gains
    alone hardly trigger solves here (gain_threshold 0.9); the benchmark also solves from the
    old network's times with the new gains, so the network's part of the move is measured, not
    assumed.

    Asserted: the re-solve that the recalibration triggered sees the new network (predicted time
    at the smallest candidate up more than 3x: latency), is scaled by the measured time outside
    communication, and its CR is in use on every rank. How much of the move is the network's is
    reported (``network_moved_pick``), not asserted: 23-95% in most runs at b210f85-90548c4,
    below 10% in 2 of 10 (0% in the one whose report was kept). The first probe after a latency
    change can still catch TCP flows growing their windows on the new round trip (a concave
    curve that pulls the pick down), a settled latency-bound curve pulls it up (those runs used
    ``time_scale="step"``; the default ``"tta"`` keeps the curve's scale and pulls harder), and
    the picks fall on NSGA-II's front points, so two opposite pulls can land on the same point.
    """
    missing = _missing()
    if missing:
        pytest.skip(missing)
    out = tmp_path / "change"
    argv = [sys.executable, CHANGE, "--adaptive", "--n", "2", "--numel", "4000000", "--cr", "0.1",
            "--steps", "80", "--phase", "0", "0.1", "100", "--phase", "25", "10", "inf",
            "--min-interval", "10", "--out", str(out), "--timeout-s", "240"]
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=280,
                          stdin=subprocess.DEVNULL)
    report = proc.stdout[-3000:]
    assert proc.returncode == 0, f"rc {proc.returncode}\n{report}\n{proc.stderr[-4000:]}"
    assert (out / "change.png").stat().st_size > 0
    data = json.loads((out / "change.json").read_text())
    steps = [r for r in data["records"] if r.get("kind") == "step"]
    assert [r["step"] for r in steps] == list(range(80))
    assert steps[0]["cr"] == 0.1  # the starting CR, until the first solve is announced
    (row,) = data["cr_changes"]
    assert row["change_step"] == 25 and row["paths_before"], report
    # drift -> drift probe -> span -> a re-solve for the recalibrated model after the change
    assert row["resolve_step"] is not None and row["resolve_step"] >= 25, report
    assert set(row["paths_after"]) <= set(PATHS), report
    # time_scale="tta" (the default, like "step"): both solves' step times hold the measured
    # time outside communication (the first solve waits for one timed step)
    assert row["other_ms_before"] > 0 and row["other_ms_after"] > 0, report
    # the new CR was announced and is in use (each step's payload carries an agreement hash of
    # the CR: a rank on another CR would fail the step)
    assert row["first_cr_change_step"] is not None and row["cr_end"] != row["cr_before"], report
    # the recalibrated model holds the new latency (0.1 -> 10 ms one way): 5-8 -> 44-86 ms at
    # CR 0.001 in the runs at 03caa85-b65cfd3
    assert row["comm_ms_after"][-1] > 3 * row["comm_ms_before"][-1], report
    assert row["network_moved_pick"] >= 0, report  # computed and reported; see the docstring


PROBE_BIAS = os.path.join(REPO, "benchmarks", "bench_probe_bias.py")


@pytest.mark.slow
@pytest.mark.root
@pytest.mark.timeout(200)
def test_probe_bias_diagnostic_runs_end_to_end(tmp_path):
    """The probe-vs-step diagnostic on a small gradient: one row per collective kind, each with
    as many probe timings and step timings as asked for, all positive."""
    missing = _missing()
    if missing:
        pytest.skip(missing)
    out = tmp_path / "bias"
    argv = [sys.executable, PROBE_BIAS, "--n", "2", "--numel", "200000", "--latency-ms", "1",
            "--bandwidth", "inf", "--cr", "0.1", "--rounds", "2", "--steps", "2", "--repeats", "2",
            "--out", str(out), "--timeout-s", "150"]
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=190,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, f"rc {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    rows = json.loads((out / "probe_bias.json").read_text())["rows"]
    assert [r["kind"] for r in rows] == ["allgather", "broadcast", "allreduce"]
    for r in rows:
        assert r["probe_n"] == 4 and r["step_n"] == 4, r  # 2 rounds x 2 timings / 2 steps
        assert _positive(r["probe_ms"]) and _positive(r["step_ms"]) and _positive(r["ratio"]), r
    assert "| allreduce |" in (out / "probe_bias.md").read_text()


PROBE_PHASES = os.path.join(REPO, "benchmarks", "bench_probe_phases.py")


@pytest.mark.slow
@pytest.mark.root
@pytest.mark.timeout(200)
def test_probe_phases_diagnostic_runs_end_to_end(tmp_path):
    """Adaptive's start-up probe, phase by phase, on a small gradient: one record per round
    with every phase measured and the plan's six timings (two sizes of the allgather, the
    broadcast and the allreduce), and one row per network whose phases sum to at most the
    probe's time."""
    missing = _missing()
    if missing:
        pytest.skip(missing)
    out = tmp_path / "phases"
    argv = [sys.executable, PROBE_PHASES, "--n", "2", "--numel", "200000", "--latency-ms", "1",
            "--bandwidth", "inf", "--rounds", "2", "--out", str(out), "--timeout-s", "150"]
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=190,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, f"rc {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    got = json.loads((out / "probe_phases.json").read_text())
    records = [r for r in got["records"] if r.get("kind") == "probe_phases"]
    assert len(records) == 2, got["records"]
    for rec in records:
        assert sorted(kind for kind, _, _ in rec["timings"]) == sorted(
            ["allgather", "broadcast", "allreduce"] * 2), rec
        assert all(_positive(ms) for _, _, ms in rec["timings"]), rec
        assert all(_positive(ms) for ms in rec["phases_ms"].values()), rec
        assert sum(rec["phases_ms"].values()) <= rec["total_ms"], rec
    (row,) = got["rows"]
    assert row["rounds"] == 2 and row["ops"] == 6, row
    assert row["warm_up_ms"] + row["timed_ms"] + row["combine_ms"] <= 1.01 * row["total_ms"], row
    assert "| 1 ms / unlimited |" in (out / "probe_phases.md").read_text()


def test_paired_networks_pair_rates_with_latencies_or_share_one(capsys):
    """The diagnostics' ``--latency-ms`` / ``--bandwidth`` pairing: by position, or one rate
    for every latency; another count of rates is an error naming both options and the
    counts."""
    import argparse

    sys.path.insert(0, os.path.join(REPO, "benchmarks"))
    import flexible_driver as drv

    ap = argparse.ArgumentParser(prog="diag")
    assert [n["label"] for n in drv.paired_networks(ap, [25.0, 5.0], [None, 100.0])] == [
        "25 ms / unlimited", "5 ms / 100 Mbit"]
    assert [n["rate_mbit"] for n in drv.paired_networks(ap, [1.0, 2.0, 3.0], [10.0])] == [10.0] * 3
    with pytest.raises(SystemExit):
        drv.paired_networks(ap, [1.0, 2.0, 3.0], [10.0, 20.0])
    assert "--bandwidth takes one rate, or one per --latency-ms (3), got 2" in capsys.readouterr().err


def test_probe_phases_summary_takes_medians_per_network_and_path():
    """``bench_probe_phases.summarize``: per network, in order, the medians over its rounds of
    the probe's time, of each phase and of each path's timed ops (AR-Topk: broadcast and
    allreduce together)."""
    sys.path.insert(0, os.path.join(REPO, "benchmarks"))
    import bench_probe_phases as phases

    def rec(label, total, warm, timed, combine, ag, bc, ar):
        return {"kind": "probe_phases", "network": {"label": label}, "N": 4, "total_ms": total,
                "phases_ms": {"warm_up": warm, "timed": timed, "combine": combine},
                "timings": [("allgather", 100, ag), ("broadcast", 40, bc), ("allreduce", 50, ar)]}

    records = [rec("slow", 10, 2, 6, 2, 1, 2, 3), rec("slow", 30, 4, 20, 6, 5, 6, 7),
               rec("slow", 20, 3, 9, 8, 2, 2, 2), {"kind": "other"},
               rec("fast", 5, 1, 3, 1, 1, 1, 1)]
    rows = phases.summarize(records)
    assert [r["network"] for r in rows] == ["slow", "fast"]
    slow = rows[0]
    assert (slow["rounds"], slow["total_ms"], slow["warm_up_ms"], slow["timed_ms"],
            slow["combine_ms"]) == (3, 20, 3, 9, 6)
    assert (slow["AG-Topk"], slow["AR-Topk"], slow["ops"]) == (2, 5, 3)  # AR: 5, 13, 4
    assert "| fast | 5 | 1 | 3 | 1 | 3 | 1 | 2 |" in phases.markdown(
        rows, {"started": "now", "n": 4, "numel": 1000, "options": "", "rounds": 3})


#: the keys ``summary_lines`` reads without a default (a grid's acceptance has them all)
_ACC = {"cells": 3, "median_err_ag": 0.1, "median_err_ar": 0.1, "err_target": 0.15,
        "err_met": True, "median_err0_ag": 0.1, "median_err0_ar": 0.1, "flex_within_5pct": 2,
        "flex_within_5pct_share": 2 / 3, "share_target": 0.9, "share_met": False,
        "median_flex_ratio": 1.0, "choice_is_best_share": 1.0, "wall_within_5pct_share": 1.0,
        "choice_regret_within_5pct_share": 1.0, "rank0_within_5pct_share": 1.0}


def test_half_ratios_judge_baseline_and_flexible_against_the_other_half():
    """The criterion on the halves of the timed steps: min(AG, AR) of one half (whichever path
    is the better one there) against the other half's -- the baseline against itself -- and
    Flexible's half against the baseline's other half; an odd step goes to the second half;
    too few steps give NaN, which the shares leave out."""
    sys.path.insert(0, os.path.join(REPO, "benchmarks"))
    import bench_flexible_grid as grid

    # first half: AG 10 (AR 20), Flexible 12; second half: AR 11 (AG 30), Flexible 10
    got = grid.half_ratios([10, 10, 30, 30], [20, 20, 11, 11], [12, 12, 10, 10])
    assert got == pytest.approx({"retest_later": 1.1, "retest_earlier": 10 / 11,
                                 "flex_later": 1.0, "flex_earlier": 12 / 11})
    # odd count: halves of 1 and 2 steps (medians 10 and 13.5 of AG; AR slower throughout)
    odd = grid.half_ratios([10, 12, 15], [99, 99, 99], [10, 10, 10])
    assert odd["retest_later"] == pytest.approx(1.35)
    assert all(math.isnan(x) for x in grid.half_ratios([10], [10, 10], [10, 10]).values())
    assert all(math.isnan(x) for x in grid.half_ratios([], [], []).values())

    def row(later, earlier):
        return {"halves": {"retest_later": later, "retest_earlier": 1 / later,
                           "flex_later": earlier, "flex_earlier": earlier}}

    rows = [row(1.04, 1.0), row(1.1, 1.2), row(0.9, 1.05), row(float("nan"), 1.0), {}]
    shares = grid.half_shares(rows)
    assert shares["half_cells"] == 3
    # later: 1.04 and 0.9 are within; earlier (1/later): 0.96 and 0.91 and 1.11 -> two within
    assert shares["half_retest_later_share"] == pytest.approx(2 / 3)
    assert shares["half_retest_earlier_share"] == pytest.approx(2 / 3)
    assert shares["half_flex_later_share"] == pytest.approx(2 / 3)  # 1.0 and 1.05
    assert grid.half_shares([{}]) == {"half_cells": 0}
    line = [x for x in grid.summary_lines({**_ACC, **shares}) if "equal footing" in x]
    assert len(line) == 1 and "(3 cells" in line[0] and "67%, 67%" in line[0], line


def test_replicate_shares_count_the_cells_of_a_replicate_run():
    """``--replicate`` cells carry min(AG2, AR2) / min(AG, AR); runs without it carry None and
    give no replicate line."""
    sys.path.insert(0, os.path.join(REPO, "benchmarks"))
    import bench_flexible_grid as grid

    shares = grid.replicate_shares([{"replicate_ratio": x} for x in (0.97, 1.02, 1.2, 1.06)]
                                   + [{"replicate_ratio": None}, {}])
    assert shares == {"replicate_cells": 4, "replicate_within_5pct_share": 0.5,
                      "median_replicate_ratio": pytest.approx(1.04)}
    assert grid.replicate_shares([{"replicate_ratio": None}]) == {"replicate_cells": 0}
    lines = grid.summary_lines({**_ACC, **shares})
    assert any("50% of 4 cells (median ratio 1.04)" in x for x in lines), lines
    assert not any("--replicate" in x for x in grid.summary_lines(dict(_ACC)))


def test_route_counts_report_cells_on_both_paths_and_held_switches():
    """Cells whose timed steps ran both paths, and the held switches where the records have
    them (None in runs before they were recorded: no count, no clause)."""
    sys.path.insert(0, os.path.join(REPO, "benchmarks"))
    import bench_flexible_grid as grid

    rows = [{"choices": {"allgather": 16}, "flex_held_switches": 0},
            {"choices": {"allgather": 9, "allreduce": 7}, "flex_held_switches": 2},
            {"choices": {"allreduce": 15, "allgather": 1}, "flex_held_switches": 1}]
    counts = grid.route_counts(rows)
    assert counts == {"both_paths_cells": 2, "held_switches": 3, "held_switch_cells": 2}
    line = [x for x in grid.summary_lines({**_ACC, **counts}) if "both paths" in x]
    assert len(line) == 1 and "in 2 of 3 cells" in line[0] and "3 times in 2 cells" in line[0]
    old = grid.route_counts([{**r, "flex_held_switches": None} for r in rows])
    assert old == {"both_paths_cells": 2}
    line = [x for x in grid.summary_lines({**_ACC, **old}) if "both paths" in x]
    assert len(line) == 1 and "held" not in line[0]


def test_ab_shares_compare_the_second_flexible_with_the_first_in_the_same_cells():
    sys.path.insert(0, os.path.join(REPO, "benchmarks"))
    import bench_flexible_grid as grid

    from benchmarks.jobctl import parse_option

    assert parse_option("level_steps=1") == ("level_steps", 1)
    assert parse_option("hysteresis=0.05") == ("hysteresis", 0.05)
    assert parse_option("reprobe_by=probes") == ("reprobe_by", "probes")
    for bad in ("level_steps", "=1"):
        with pytest.raises(ValueError, match="OPTION=VALUE"):
            parse_option(bad)

    def row(ag, ar, a, b, a_paths=1, b_paths=1):
        paths = ({"allgather": 16}, {"allgather": 8, "allreduce": 8})
        best = min(ag, ar)  # the flags as summarize() sets them
        return {"ag_ms": ag, "ar_ms": ar, "flex_ms": a, "flexb_ms": b,
                "flex_ok": a <= 1.05 * best, "flexb_ok": b <= 1.05 * best,
                "choices": paths[a_paths - 1], "flexb_choices": paths[b_paths - 1]}

    rows = [row(10, 20, 10, 10), row(10, 20, 11, 9.9, b_paths=2), row(10, 20, 10, 12, 2, 2),
            {"ag_ms": 1, "ar_ms": 1, "flex_ms": 1, "choices": {"allgather": 16}}]
    got = grid.ab_shares(rows)
    assert got == {"ab_cells": 3, "ab_b_within_5pct_share": pytest.approx(2 / 3),
                   "ab_a_within_5pct_share": pytest.approx(2 / 3),
                   "ab_median_ratio": pytest.approx(1.0), "ab_b_faster_cells": 1,
                   "ab_b_slower_cells": 1, "ab_b_both_paths_cells": 2, "ab_a_both_paths_cells": 1}
    assert grid.ab_shares(rows[-1:]) == {"ab_cells": 0}
    lines = [x for x in grid.summary_lines({**_ACC, **got, "ab_label": "level_steps=1"})
             if "A/B" in x]
    assert len(lines) == 1 and "`--ab level_steps=1`" in lines[0] and "67% of them" in lines[0]


DRIFT_BURST = os.path.join(REPO, "benchmarks", "bench_drift_burst.py")


def _burst_records(confirm_probe: bool) -> list:
    """Synthetic records of the ``change`` job for a burst at steps 10-15 of 30: CR 0.02, a span
    at step 5, a drift probe at step 15 and a CR change at step 20 when ``confirm_probe``."""
    steps = []
    for s in range(30):
        rec = {"kind": "step", "step": s, "cr": 0.02, "net_ms": 100.0, "probe_ms": 0.0,
               "probe_kind": None, "span": s == 5,
               "collective": "allreduce" if confirm_probe and s >= 16 else "allgather"}
        if s == 5:
            rec.update(cr=0.001, net_ms=40.0)
        if 10 <= s < 16:
            rec["net_ms"] = 400.0
        if confirm_probe and s == 15:
            rec.update(probe_ms=300.0, probe_kind="drift")
        if confirm_probe and s >= 20:
            rec.update(cr=0.005, net_ms=70.0)
        steps.append(rec)
    solves = [{"step": 1, "crs": [0.1, 0.001], "comm_ms": [300.0, 60.0]},
              {"step": 19, "crs": [0.1, 0.001], "comm_ms": [900.0 if confirm_probe else 310.0,
                                                            60.0]}]
    return steps + [{"kind": "solves", "solves": solves},
                    {"kind": "controller", "n_drift_probes": int(confirm_probe),
                     "n_drift_unconfirmed": int(not confirm_probe)}]


def test_drift_burst_summary_reads_each_arm():
    """The burst benchmark's numbers per arm: drift probes and unconfirmed drifts (the job's
    counters), the CR path from the burst on with span steps left out, both solves' ends, and
    the route steps' median communication after the burst; the report's ratio is against the
    first arm."""
    sys.path.insert(0, os.path.join(REPO, "benchmarks"))
    import bench_drift_burst as burst

    held = burst.summarize_arm(_burst_records(False), burst_at=10, burst_steps=6, settle=2)
    assert (held["n_drift_probes"], held["n_drift_unconfirmed"], held["drift_probe_steps"]) == (
        0, 1, [])
    assert held["cr_before_burst"] == held["cr_end"] == 0.02 and held["cr_changes_after_burst"] == []
    assert held["solve_before_burst"] == {"c_low": 60.0, "c_high": 300.0}
    assert held["last_solve"] == {"c_low": 60.0, "c_high": 310.0} and held["last_solve_step"] == 19
    assert held["after_ms"] == 100.0 and held["after_steps"] == 12  # steps 18-29
    assert held["paths_after_burst"] == {"allgather": 14}
    moved = burst.summarize_arm(_burst_records(True), burst_at=10, burst_steps=6, settle=2)
    assert moved["drift_probe_steps"] == [15] and moved["cr_changes_after_burst"] == [[20, 0.005]]
    assert moved["after_ms"] == 70.0 and moved["last_solve"]["c_high"] == 900.0
    assert moved["paths_after_burst"] == {"allreduce": 14}
    meta = {"n": 2, "numel": 1000, "cr": 0.02, "steps": 30, "link": {"label": "5 ms / 100 Mbit"},
            "burst": {"label": "25 ms / unlimited"}, "burst_at": 10, "burst_steps": 6, "settle": 2,
            "started": "now", "elapsed_s": 1.0}
    text = burst.markdown(meta, {"3": held, "0": moved})
    assert ("| 3 | 0 (-) | 1 | 0.02 → 0.02 | - | allgather 14 | 60 / 300; 60 / 310 (19) | 100.0 "
            "| 1.00 |") in text
    assert "| 0 | 1 (15) | 0 | 0.02 → 0.005 | [[20, 0.005]] | allreduce 14 |" in text
    assert "| 70.0 | 0.70 |" in text


@pytest.mark.slow
@pytest.mark.root
@pytest.mark.timeout(300)
def test_drift_burst_runs_end_to_end_and_a_confirmed_drift_needs_more_than_a_burst(tmp_path):
    """A real burst on the emulator (N=2: 5 ms one way, steps 15-20 at 40 ms): without the
    confirmation the detector's five slow steps run a drift probe; with ``drift_confirm=3`` the
    first step back on the steady link cancels it, and nothing is re-measured. (At 0.5 ms one
    way, steps of a few ms, a loaded machine's noise confirmed the drift once in a suite run:
    the steady link's steps must be latency-bound, not CPU-bound.)"""
    missing = _missing()
    if missing:
        pytest.skip(missing)
    out = tmp_path / "burst"
    argv = [sys.executable, DRIFT_BURST, "--n", "2", "--numel", "200000", "--steps", "34",
            "--link", "5", "inf", "--burst", "40", "inf", "--burst-at", "15",
            "--burst-steps", "6", "--settle", "4", "--confirm", "3", "0", "--out", str(out),
            "--timeout-s", "120"]
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=280,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, f"rc {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    got = json.loads((out / "drift_burst.json").read_text())
    held, probed = got["arms"]["3"], got["arms"]["0"]
    report = (out / "drift_burst.md").read_text()
    assert held["steps"] > 0 and probed["steps"] > 0, report
    assert held["n_drift_unconfirmed"] >= 1 and held["drift_probe_steps"] == [], report
    assert probed["n_drift_probes"] >= 1 and probed["n_drift_unconfirmed"] == 0, report
    assert all(15 <= s <= 34 for s in probed["drift_probe_steps"]), report
    assert (out / "drift_burst.png").stat().st_size > 0
