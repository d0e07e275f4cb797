"""End-to-end smoke test of ``benchmarks/bench_adaptive.py --quick`` (root: network emulator).

Runs the quick benchmark (N=2 on the emulator, Fashion-MNIST, 4 methods) with a network change
after 1 s of training, and checks the shape of its JSON: every method trained for a positive time
and met the change after the first step past that clock, and Adaptive's per-step CRs start at 1.0
(warm-up) and stay within ``[c_low, 1]``. No timing or accuracy assertions: the machine is shared.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from hvd_flexcomm.netem import namespaces

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(REPO, "benchmarks", "bench_adaptive.py")
_NO_NETNS = namespaces.require_root_and_iproute()


@pytest.mark.slow
@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0 or _NO_NETNS is not None,
                    reason=f"needs root and the network emulator ({_NO_NETNS or 'not root'})")
@pytest.mark.timeout(300)
def test_quick_benchmark_end_to_end(tmp_path):
    out = tmp_path / "adaptive"
    proc = subprocess.run([sys.executable, BENCH, "--quick", "--out", str(out), "--change-at-s", "1",
                           "--change-to", "0.5", "inf"], cwd=REPO,
                          capture_output=True, text=True, timeout=290)
    assert proc.returncode == 0, f"rc {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    with open(out / "adaptive.json") as fh:
        result = json.load(fh)
    for name in ("adaptive.md", "accuracy_vs_time.png", "adaptive_cr.png"):
        assert (out / name).stat().st_size > 0, name

    assert result["error"] is None
    planned = result["settings"]["methods"]
    for i in range(1, len(planned) + 1):  # one job per method (the default)
        assert (out / f"job-{i}.log").stat().st_size > 0, i
    assert 0 < result["dense_accuracy"] <= 1
    assert len(result["loadavg_start"]) == 3 and len(result["loadavg_end"]) == 3
    planned = [m["name"] for m in planned]
    rows = {r["name"]: r for r in result["rows"]}
    assert list(rows) == planned
    for name, row in rows.items():
        assert row["steps"] > 0, name
        assert row["train_s"] > 0 and row["mean_step_ms"] > 0 and row["median_step_ms"] > 0, name
        assert row["time_to_target_s"] is None or row["time_to_target_s"] > 0, name
        assert 0 < row["final_accuracy"] <= 1, name
        assert row["stall_s"] >= 0, name
        net = row["network"]  # the emulator's real counters, read after the method's job
        assert net["relay_forwarded_packets"] > 0, (name, net)
        assert all(net[k] >= 0 for k in ("tcp_timeouts", "retrans_segs", "tun_tx_dropped")), net
        change = row["network_change"]  # asked for after the first step past 1 s of training
        assert change is not None and change["train_s"] >= 1.0, name
        rec = next(r for r in result["records"] if r["method"]["name"] == name)
        before = sum(rec["per_step"]["ms"][:change["step"] - 1]) / 1e3
        assert before < 1.0, (name, change, before)  # ... and not later
        assert change["step"] < row["steps"], (name, change)
        assert change["network"]["delay_ms"] == 0.5 and change["network"]["rate_mbit"] is None
    assert "Network change to 0.5 ms / unlimited" in (out / "adaptive.md").read_text()
    assert {r["kind"] for r in rows.values()} >= {"dense", "ar", "flexible", "adaptive"}

    c_low = result["settings"]["adaptive_defaults"]["c_low"]
    records = [r for r in result["records"] if r["method"]["kind"] == "adaptive"]
    assert records
    for rec in records:
        crs = rec["per_step"]["cr"]
        assert len(crs) == rec["steps"] and crs[0] == 1.0, crs[:5]
        assert all(c_low <= c <= 1.0 for c in crs), sorted(set(crs))
        assert len(rec["per_step"]["collective"]) == len(crs)
        # drifts the steps after the detector fired did not confirm (Adaptive's drift_confirm)
        assert rec["flexible"]["n_drift_unconfirmed"] >= 0
        assert rows[rec["method"]["name"]]["drifts_unconfirmed"] == rec["flexible"][
            "n_drift_unconfirmed"]


def _seed_result(seed: int, times: dict) -> dict:
    rows = [{"name": name, "kind": kind, "time_to_target_s": t, "delta_vs_dense_pts": d,
             "delta_last_evals_vs_dense_pts": d / 2, "mean_step_ms": 100.0}
            for name, (kind, t, d) in times.items()]
    return {"settings": {"seed": seed, "target_drop": 0.01, "n": 4, "rate_mbit": 100.0,
                         "delay_ms": 5.0, "model_name": "MLP"}, "rows": rows}


def test_seed_summary_takes_medians_with_misses_counted_slowest():
    sys.path.insert(0, os.path.join(REPO, "benchmarks"))
    import bench_adaptive as bench

    results = [
        _seed_result(1, {"Dense": ("dense", 90.0, 0.0), "AG-Topk 0.01": ("ag", 50.0, 1.0),
                         "Adaptive": ("adaptive", 40.0, 0.5)}),
        _seed_result(2, {"Dense": ("dense", 95.0, 0.0), "AG-Topk 0.01": ("ag", 60.0, 1.0),
                         "Adaptive": ("adaptive", None, -0.5)}),
        _seed_result(3, {"Dense": ("dense", None, 0.0), "AG-Topk 0.01": ("ag", 44.0, 1.0),
                         "Adaptive": ("adaptive", 45.0, -1.5)}),
    ]
    summary = bench.seed_summary(results)
    by_name = {m["name"]: m for m in summary["methods"]}
    assert by_name["Adaptive"]["median_tta_s"] == 45.0  # median of (40, miss, 45)
    assert by_name["AG-Topk 0.01"]["median_tta_s"] == 50.0
    assert by_name["Dense"]["median_tta_s"] == 95.0 and by_name["Dense"]["reached"] == 2
    verdict = summary["adaptive"]["Adaptive"]
    assert verdict["median_faster_than_all"] and verdict["best_other"] == "AG-Topk 0.01"
    assert verdict["median_ratio_vs_best_other"] == 45.0 / 50.0
    assert verdict["seeds_faster_than_all"] == 1  # seed 1 only (a miss; 45 > 44)
    assert not verdict["within_1pt_every_seed"]  # seed 3 ended 1.5 points below Dense
    assert verdict["within_1pt_every_seed_last_evals"]  # its last 3 evaluations: 0.75 below
    md = bench.seeds_markdown(summary, results)
    assert "| Adaptive | 40.0 | - | 45.0 | 45.0 | 2/3 |" in md


def test_seed_summary_of_two_adaptives_pairs_each_with_the_other():
    """An A/B (``adaptive`` and ``adaptive,OPTION=VALUE``): each Adaptive is judged against the
    fixed methods and Dense, and paired seed by seed with the other Adaptive as well."""
    sys.path.insert(0, os.path.join(REPO, "benchmarks"))
    import bench_adaptive as bench

    b = "Adaptive (span_settle_steps=4)"
    results = [_seed_result(s, {"Dense": ("dense", 90.0, 0.0), "AG-Topk 0.01": ("ag", ag, 1.0),
                                "Adaptive": ("adaptive", a, 0.5), b: ("adaptive", x, 0.5)})
               for s, ag, a, x in [(1, 50.0, 40.0, 36.0), (2, 60.0, 70.0, 63.0),
                                   (3, 44.0, 45.0, 50.0)]]
    summary = bench.seed_summary(results)
    first, second = summary["adaptive"]["Adaptive"], summary["adaptive"][b]
    assert first["seeds_faster_than_all"] == 1 and second["seeds_faster_than_all"] == 1
    assert first["best_other"] == "AG-Topk 0.01"  # not the other Adaptive
    versus = second["paired"]["tta_s"]["Adaptive"]
    assert (versus["faster"], versus["slower"]) == (2, 1)
    assert versus["median_ratio"] == pytest.approx(0.9)  # 36/40, 63/70, 50/45
    assert first["paired"]["tta_s"][b]["slower"] == 2
    md = bench.seeds_markdown(summary, results)
    assert "fastest of all methods (Adaptive variants aside) in 1/3 seeds" in md
    assert "  - Adaptive: first crossing: faster in 2/3, ratio 0.90" in md


def test_seed_summary_lists_a_method_whose_job_failed_in_the_first_seed():
    """A method with no row in a seed (its job failed) is still listed, shown as ``failed`` there,
    and left out of that seed's comparison and of its median."""
    sys.path.insert(0, os.path.join(REPO, "benchmarks"))
    import bench_adaptive as bench

    results = [
        _seed_result(1, {"Dense": ("dense", 90.0, 0.0), "Adaptive": ("adaptive", 40.0, 0.5)}),
        _seed_result(2, {"Dense": ("dense", 95.0, 0.0), "Flexible 0.01": ("flexible", 30.0, 0.0),
                         "Adaptive": ("adaptive", 45.0, 0.5)}),
        _seed_result(3, {"Dense": ("dense", 99.0, 0.0), "Flexible 0.01": ("flexible", 50.0, 0.0),
                         "Adaptive": ("adaptive", 42.0, 0.5)}),
    ]
    summary = bench.seed_summary(results)
    flex = next(m for m in summary["methods"] if m["name"] == "Flexible 0.01")
    assert flex["ran"] == [False, True, True] and flex["median_tta_s"] == 40.0  # of (30, 50)
    verdict = summary["adaptive"]["Adaptive"]
    assert verdict["seeds_faster_than_all"] == 2  # seeds 1 (Flexible failed) and 3
    assert "| Flexible 0.01 | failed | 30.0 | 50.0 | 40.0 | 2/2 |" in bench.seeds_markdown(summary, results)


def _method_record(name: str, kind: str, accs: list) -> dict:
    """A method record of the job, as far as the summary reads it: evaluations every 20 steps."""
    evals = [{"step": 20 * i, "train_s": 2.0 * i, "accuracy": a, "loss": None}
             for i, a in enumerate(accs)]
    n = 20 * (len(accs) - 1)
    per_step = {"ms": [100.0] * n, "probe_ms": [0.0] * n, "cr": [0.01] * n,
                "collective": ["allgather"] * n, "comm_ms": [50.0] * n, "compress_ms": [5.0] * n}
    return {"method": {"name": name, "kind": kind, "cr": 0.01, "options": {"warmup_steps": 0}},
            "describe": name, "steps": n, "train_s": n / 10, "evals": evals,
            "final_accuracy": accs[-1], "per_step": per_step, "epochs_started": 1}


def test_smoothed_final_accuracy_is_the_mean_of_the_last_three_evaluations():
    """One evaluation of these short runs moves by a point or two from the next; the smoothed
    measure averages the last three after step 0 and compares them with Dense's, next to the
    last evaluation (reported, both judged in the assessment)."""
    sys.path.insert(0, os.path.join(REPO, "benchmarks"))
    import bench_adaptive as bench

    assert bench.last_evals_accuracy([{"step": 0, "accuracy": 0.1}]) is None
    assert bench.last_evals_accuracy([{"step": 0, "accuracy": 0.1},
                                      {"step": 20, "accuracy": 0.5}]) == 0.5  # fewer than three
    dense = _method_record("Dense", "dense", [0.1, 0.80, 0.84, 0.83, 0.85])  # last 3: 0.84
    ada = _method_record("Adaptive", "adaptive", [0.1, 0.7, 0.84, 0.83, 0.829, 0.82])  # 0.8263
    rows = bench.summarize_all([dense, ada], target=0.84, dense_acc=0.85)
    assert rows[0]["last_evals_accuracy"] == pytest.approx(0.84)
    assert rows[0]["delta_last_evals_vs_dense_pts"] == pytest.approx(0.0)
    assert rows[1]["delta_vs_dense_pts"] == pytest.approx(-3.0)  # the last evaluation alone
    assert rows[1]["delta_last_evals_vs_dense_pts"] == pytest.approx(100 * ((0.83 + 0.829 + 0.82) / 3 - 0.84))
    verdict = bench.assess(rows, 0.85)
    assert not verdict["target_accuracy_within_1pt"]
    assert not verdict["target_accuracy_within_1pt_last_evals"]  # 1.37 points below
    close = _method_record("Adaptive", "adaptive", [0.1, 0.7, 0.84, 0.84, 0.838, 0.82])  # last 3: 0.8327
    rows = bench.summarize_all([dense, close], target=0.84, dense_acc=0.85)
    verdict = bench.assess(rows, 0.85)
    assert not verdict["target_accuracy_within_1pt"] and verdict["target_accuracy_within_1pt_last_evals"]
    assert "last 3 evals vs Dense (pts)" in bench.markdown({
        "settings": {"target_drop": 0.01, "n": 4, "rate_mbit": 100.0, "delay_ms": 5.0,
                     "model_name": "MLP", "parameters": 1, "batch_size": 64, "lr": 0.01,
                     "momentum": 0.9, "dense_steps": 80, "max_steps_other": 240,
                     "eval_every": 20},
        "rows": rows, "assessment": verdict, "link": {}, "dense_accuracy": 0.85, "target": 0.84,
        "time_budget_s": None, "records": [dense, close], "loadavg_start": [0, 0, 0],
        "loadavg_end": [0, 0, 0], "cpus": 2, "total_s": 1.0})


def test_smoothed_target_is_met_by_three_evaluations_in_a_row_on_average(tmp_path):
    """The second ruler: Dense's last-3 mean minus the drop is the smoothed target, and a run
    meets it at the first evaluation whose mean with the two before it reaches it (a single
    lucky evaluation does not); the per-run table and the seed summary report it next to the
    first crossing."""
    sys.path.insert(0, os.path.join(REPO, "benchmarks"))
    import bench_adaptive as bench

    evals = [{"step": 20 * i, "train_s": 2.0 * i, "accuracy": a}
             for i, a in enumerate([0.1, 0.9, 0.5, 0.5, 0.8, 0.8, 0.8])]
    assert bench.smoothed_hit(evals, 0.75)["step"] == 120  # (0.8 + 0.8 + 0.8) / 3
    assert bench.smoothed_hit(evals, 0.65)["step"] == 100  # (0.5 + 0.8 + 0.8) / 3 = 0.7
    assert bench.smoothed_hit(evals, 0.62)["step"] == 60  # (0.9 + 0.5 + 0.5) / 3 = 0.633
    assert bench.smoothed_hit(evals[:3], 0.1) is None  # fewer than three evaluations after 0
    assert bench.smoothed_hit(evals, 0.81) is None
    dense = _method_record("Dense", "dense", [0.1, 0.80, 0.81, 0.83, 0.84, 0.85])  # last 3: 0.84
    # crosses the single-evaluation target (0.84) at step 20, the smoothed one (0.83) at 100
    lucky = _method_record("AG-Topk 0.01", "ag", [0.1, 0.845, 0.78, 0.80, 0.86, 0.87, 0.86])
    steady = _method_record("Adaptive", "adaptive", [0.1, 0.80, 0.83, 0.84, 0.835, 0.83])
    rows = bench.summarize_all([dense, lucky, steady], target=0.84, dense_acc=0.85)
    assert [r["smoothed_target"] for r in rows] == [pytest.approx(0.83)] * 3
    assert [r["steps_to_target"] for r in rows] == [80, 20, 60]
    assert [r["steps_to_smoothed_target"] for r in rows] == [100, 100, 80]
    assert rows[2]["time_to_smoothed_target_s"] == 8.0
    verdict = bench.assess(rows, 0.85)
    assert verdict["ratio_adaptive_vs_best_fixed"] == 6.0 / 2.0
    assert verdict["ratio_adaptive_vs_best_fixed_smoothed"] == 8.0 / 10.0
    assert verdict["target_faster_than_all_smoothed"] and not verdict["target_faster_than_all"]
    result = {"settings": {"seed": 1, "target_drop": 0.01, "n": 4, "rate_mbit": 100.0,
                           "delay_ms": 5.0, "model_name": "MLP", "parameters": 1,
                           "batch_size": 64, "lr": 0.01, "momentum": 0.9, "dense_steps": 80,
                           "max_steps_other": 240, "eval_every": 20},
              "rows": rows, "assessment": verdict, "link": {}, "dense_accuracy": 0.85,
              "target": 0.84, "time_budget_s": None, "records": [dense, lucky, steady],
              "loadavg_start": [0, 0, 0], "loadavg_end": [0, 0, 0], "cpus": 2, "total_s": 1.0}
    md = bench.markdown(result)
    assert "| Adaptive | 6.0 | 60 | 8.0 (step 80) |" in md
    assert "smoothed target" in md and "83.00%" in md
    summary = bench.seed_summary([result])
    by_name = {m["name"]: m for m in summary["methods"]}
    assert by_name["Adaptive"]["median_smoothed_tta_s"] == 8.0
    assert by_name["AG-Topk 0.01"]["smoothed_tta_s"] == [10.0]
    ada = summary["adaptive"]["Adaptive"]
    assert ada["median_smoothed_faster_than_all"] and not ada["median_faster_than_all"]
    assert ada["seeds_smoothed_faster_than_all"] == 1
    assert "| AG-Topk 0.01 | 10.0 | 10.0 |" in bench.seeds_markdown(summary, [result])
    bench.write_seed_summary([result], str(tmp_path))  # the plot gets a panel per ruler
    assert json.loads((tmp_path / "seeds.json").read_text())["methods"][2]["smoothed_tta_s"] == [8.0]
    assert (tmp_path / "seeds_tta.png").stat().st_size > 0


def test_stall_seconds_count_only_time_beyond_three_medians():
    sys.path.insert(0, os.path.join(REPO, "benchmarks"))
    from bench_adaptive import stall_s

    assert stall_s([]) == 0.0
    assert stall_s([100.0] * 10) == 0.0
    # median 100 ms: a 1000 ms step lost 700 ms beyond 3 x 100; a 250 ms step lost nothing
    assert abs(stall_s([100.0] * 10 + [250.0, 1000.0]) - 0.7) < 1e-9


def test_stall_ranks_names_the_rank_the_others_waited_for():
    sys.path.insert(0, os.path.join(REPO, "benchmarks"))
    from bench_adaptive import stall_ranks

    ms = [100.0] * 10 + [1000.0, 900.0]
    rec = {"per_step": {"ms": ms, "probe_ms": [0.0] * 12},
           "own_ms_by_rank": [[20.0] * 12, [20.0] * 10 + [880.0, 20.0]]}
    # step 10: rank 1 computed for 880 ms while rank 0 waited; step 11: no rank was slow
    assert stall_ranks(rec, 12) == {"rank 1": 1, "none": 1}
    assert stall_ranks(rec, 10) == {}  # no stall before step 10
    assert stall_ranks({"per_step": rec["per_step"]}, 12) == {}  # older records: no per-rank times
    # the medians are over the counted steps, as stall_s's: slower steps after the target (400 ms)
    # would lift the limit to 1200 ms and hide both stalls
    later = {"per_step": {"ms": ms + [400.0] * 20, "probe_ms": [0.0] * 32},
             "own_ms_by_rank": [r + [20.0] * 20 for r in rec["own_ms_by_rank"]]}
    assert stall_ranks(later, 12) == {"rank 1": 1, "none": 1}
    assert stall_ranks(later, 32) == {}


def test_network_text_names_the_change_and_rates_parse_with_inf():
    sys.path.insert(0, os.path.join(REPO, "benchmarks"))
    from bench_adaptive import network_change_line, network_text
    from jobctl import network, parse_rate

    assert parse_rate("inf") is None and parse_rate("Unlimited") is None
    assert parse_rate("100") == 100.0
    for bad in ("0", "-5", "fast"):
        with pytest.raises(ValueError, match="fast|must be > 0"):
            parse_rate(bad)
    settings = {"rate_mbit": 100.0, "delay_ms": 5.0}
    assert network_text(settings) == "100 Mbit/s, 5 ms one way"
    assert network_change_line([], settings) == []
    settings["network_change"] = {"at_train_s": 20.0, "network": network(0.1, None)}
    assert network_text(settings) == ("100 Mbit/s, 5 ms one way, then unlimited rate, 0.1 ms one "
                                      "way from 20 s of training on")
    rows = [{"name": "Dense", "network_change": {"step": 60, "train_s": 21.5,
                                                 "network": network(0.1, None)}},
            {"name": "AG-Topk 0.1", "network_change": None},
            {"name": "AG-Topk 0.01", "network_change": {"step": 9, "train_s": 20.1, "network": None}}]
    line = network_change_line(rows, settings)[1]
    assert "0.1 ms / unlimited" in line and "Dense after step 60 (21.5 s);" in line
    assert "AG-Topk 0.1 never (it stopped first)" in line
    assert "AG-Topk 0.01 after step 9 (20.1 s), asked for but not applied before the end" in line


def test_first_cr_change_after_the_network_change_counts_steps_and_training_time():
    """The steps run at the old CR between the change (after ``step`` steps) and the first step
    at a new CR, and their time; CR changes before the change, a change asked for but never
    applied, and no CR change after it give None."""
    sys.path.insert(0, os.path.join(REPO, "benchmarks"))
    from bench_adaptive import _fmt_after_change, cr_change_after_network_change

    step_ms = [500.0] * 6 + [400.0] * 10  # the change came after 6 steps
    change = {"step": 6, "train_s": 3.0, "network": {"label": "5 ms / 100 Mbit"}}
    after = cr_change_after_network_change([[2, 0.1], [9, 0.02], [12, 0.04]], change, step_ms)
    assert after == {"step": 9, "cr": 0.02, "steps": 3, "s": pytest.approx(1.2)}
    assert _fmt_after_change(after) == ("CR 0.02 from step 9, 3 steps (1.2 s of training) after "
                                        "the change")
    assert cr_change_after_network_change([[6, 0.03]], change, step_ms)["steps"] == 0
    assert cr_change_after_network_change([[2, 0.1]], change, step_ms) is None
    assert cr_change_after_network_change([[9, 0.02]], dict(change, network=None), step_ms) is None
    assert cr_change_after_network_change([[9, 0.02]], None, step_ms) is None
    assert cr_change_after_network_change(None, change, step_ms) is None
    assert _fmt_after_change(None) == "none"
    # with the solve records: a CR solved before the change that took effect after it is skipped
    solves = [{"step": 5, "cr": 0.0200004}, {"step": 7, "cr": 0.04}, {"step": 8, "cr": None}]
    late = cr_change_after_network_change([[7, 0.02], [10, 0.04]], change, step_ms, solves)
    assert (late["step"], late["cr"], late["steps"]) == (10, 0.04, 4)
    assert cr_change_after_network_change([[7, 0.02]], change, step_ms, solves) is None


def test_network_hand_shake_files_request_answer_and_time_out(tmp_path):
    """The job's side of the hand-shake on real files: a request returns at once, the answer is
    what the driver wrote, and a driver that never answers is named in the error."""
    import threading

    sys.path.insert(0, os.path.join(REPO, "benchmarks"))
    from jobctl import applied_network, await_network, network, request_network, write_atomic

    ctl = str(tmp_path)
    request_network(ctl, 1)
    assert (tmp_path / "ready.1").exists() and applied_network(ctl, 1) is None
    net = {**network(25.0, None), "index": 2, "applied_s": 1.5}
    answer = threading.Timer(0.2, write_atomic, (os.path.join(ctl, "go.2"), json.dumps(net)))
    answer.start()
    try:
        assert await_network(ctl, 2, timeout_s=30) == net
    finally:
        answer.cancel()
    assert (tmp_path / "ready.2").exists() and applied_network(ctl, 2) == net
    with pytest.raises(TimeoutError, match="network 3 within 0.1 s"):
        await_network(ctl, 3, timeout_s=0.1)


def test_methods_parse_to_plan_entries_and_bad_ones_are_named():
    sys.path.insert(0, os.path.join(REPO, "benchmarks"))
    from bench_adaptive import parse_method

    assert parse_method("adaptive", 50)["options"] == {"warmup_steps": 50}
    front = parse_method("adaptive-front:0", 50)
    assert front["kind"] == "adaptive" and front["options"] == {"warmup_steps": 0, "time_scale": "front"}
    assert front["name"] == "Adaptive (front-normalised) (warm-up 0)"
    step = parse_method("adaptive-step", 50)
    assert step["options"] == {"warmup_steps": 50, "time_scale": "step"}
    assert parse_method("adaptive-tta:5", 50)["options"] == {"warmup_steps": 5, "time_scale": "tta"}
    assert parse_method("ag:0.01", 50) == {"name": "AG-Topk 0.01", "kind": "ag", "cr": 0.01}
    for bad in ("adaptive-slow", "ag", "ag:2"):
        with pytest.raises(ValueError, match=bad):
            parse_method(bad, 50)
    # an Adaptive beside the first, with options of its own (checked before any job starts)
    ab = parse_method("adaptive:0,span_settle_steps=4,time_scale=step", 50)
    assert ab["options"] == {"warmup_steps": 0, "span_settle_steps": 4, "time_scale": "step"}
    assert ab["name"] == "Adaptive (warm-up 0) (span_settle_steps=4, time_scale=step)"
    # a list value: its commas are inside brackets
    weighted = parse_method("adaptive:0,weights=[0.75,0.25],span_steps=2", 50)
    assert weighted["options"] == {"warmup_steps": 0, "weights": [0.75, 0.25], "span_steps": 2}
    assert weighted["name"] == "Adaptive (warm-up 0) (weights=[0.75, 0.25], span_steps=2)"
    for bad, needle in (("adaptive,span_settle_steps=0", "span_settle_steps must be"),
                        ("adaptive:0,weights=[0.75,0.25", "unbalanced brackets"),
                        ("adaptive:0,weights=0.75]", "unbalanced brackets"),
                        ("adaptive:0,weights=[2,-1]", "weights"),
                        ("adaptive,no_such_option=1", "no_such_option"),
                        ("adaptive,span_settle_steps", "OPTION=VALUE"),
                        ("ag:0.01,span_settle_steps=4", "Adaptive only")):
        with pytest.raises(ValueError, match=needle):
            parse_method(bad, 50)


def test_repick_solves_finds_the_time_to_accuracy_optimum_of_exact_curves():
    """``repick_solves.py`` on one recorded solve with exact curves ``t = a + b·c`` and
    ``g = A·c^p``: the "tta" pick is the closed-form minimum of ``(t + other)^0.6 · g^-0.4``
    (within the grid's spacing), and on this latency-heavy line the ASF picks lie below it."""
    sys.path.insert(0, os.path.join(REPO, "benchmarks"))
    from repick_solves import repick

    crs = [0.1, 0.033, 0.011, 0.004, 0.001]
    a, b, p, other = 400.0, 2800.0, 0.5, 30.0
    solve = {"comm_ms": [a + b * c for c in crs], "compress_ms": None,
             "gains": [0.8 * (c / 0.1) ** p for c in crs], "other_ms": other}
    want = 0.4 * p * (a + other) / (b * (0.6 - 0.4 * p))  # 0.0768
    picks = repick(solve, crs)
    assert picks["tta"] == pytest.approx(want, rel=0.02)
    assert picks["step"] < picks["tta"] and picks["front"] < picks["tta"]


def _gain_solves(spec):
    """Solves whose gains follow ``A·c^p`` exactly at the default candidates: [(step, A, p)]."""
    from hvd_flexcomm.compression import DEFAULT_CANDIDATES

    return [{"step": step, "gains": [a * c ** p for c in DEFAULT_CANDIDATES]} for step, a, p in spec]


def test_estimate_gamma_recovers_the_exponent_of_synthetic_progress():
    """Steps at CR c make progress gain(c)^γ: with gains 0.5·c^0.5 (the ratio to CR 0.01 is
    (c / 0.01)^0.5), the γ that made the reference's steps equal the estimator recovers it; a
    later solve's curve applies from its step on; no positive γ when Adaptive needed more steps."""
    sys.path.insert(0, os.path.join(REPO, "benchmarks"))
    import estimate_gamma as eg

    rec = {"adaptive": {"solves": _gain_solves([(0, 0.5, 0.5)])},
           "per_step": {"cr": [0.005] * 20 + [0.04] * 100}}
    ratios = eg.gain_ratios(rec, 0.01, 120)
    assert ratios[:20] == [pytest.approx(0.5 ** 0.5)] * 20 and ratios[20:] == [pytest.approx(2.0)] * 100
    for gamma in (0.3, 0.6, 1.2):
        ref_steps = 20 * 0.5 ** (0.5 * gamma) + 100 * 2.0 ** gamma
        assert eg.solve_gamma(ratios, ref_steps) == pytest.approx(gamma, abs=1e-6)
    assert eg.solve_gamma(ratios, 120) is None and eg.solve_gamma(ratios, 100) is None
    assert eg.solve_gamma(ratios, 1e9) is None  # beyond GAMMA_BOUND
    # the second solve's curve (p = 1: ratio 4 at CR 0.04) from its step on
    rec["adaptive"]["solves"] = _gain_solves([(0, 0.5, 0.5), (70, 0.3, 1.0)])
    ratios = eg.gain_ratios(rec, 0.01, 120)
    assert ratios[69] == pytest.approx(2.0) and ratios[70] == pytest.approx(4.0)
    assert eg.gain_ratios(rec, 0.01, 30) == ratios[:30]


def test_estimate_gamma_reads_both_rulers_of_a_run():
    """``estimate_run`` takes Adaptive's and the reference's steps to the target and to the
    smoothed target from the run's own summary."""
    sys.path.insert(0, os.path.join(REPO, "benchmarks"))
    import estimate_gamma as eg

    def record(name, kind, cr, accs, crs=None):
        rec = _method_record(name, kind, accs)
        rec["method"]["cr"] = cr
        if crs is not None:
            rec["per_step"]["cr"] = crs
            rec["adaptive"] = {"solves": _gain_solves([(0, 0.5, 0.5)])}
        return rec

    dense = record("Dense", "dense", 1.0, [0.1, 0.80, 0.81, 0.83, 0.84, 0.85])
    ag = record("AG-Topk 0.01", "ag", 0.01, [0.1, 0.7, 0.75, 0.80, 0.82, 0.84, 0.85, 0.85, 0.85])
    ada = record("Adaptive", "adaptive", None, [0.1, 0.75, 0.84, 0.85, 0.85, 0.85, 0.85],
                 crs=[0.04] * 120)  # ratio 2 at every step
    result = {"records": [dense, ag, ada], "target": 0.84, "dense_accuracy": 0.85,
              "settings": {"seed": 7}}
    (est,) = eg.estimate_run(result, "AG-Topk 0.01")
    assert est["steps_first"] == (40, 100) and est["steps_smoothed"] == (80, 120)
    assert est["gamma_first"] == pytest.approx(math.log2(100 / 40))
    assert est["gamma_smoothed"] == pytest.approx(math.log2(120 / 80))
    with pytest.raises(ValueError, match="'AG-Topk 0.1'"):
        eg.estimate_run(result, "AG-Topk 0.1")


def test_sign_test_and_seed_by_seed_comparison():
    """The paired comparison counts, over the seeds where both methods ran, the seeds in which
    Adaptive was faster (a miss is slower than any time), takes the ratios where both reached
    the target, and gives the two-sided sign test of the split."""
    sys.path.insert(0, os.path.join(REPO, "benchmarks"))
    import bench_adaptive as bench

    assert bench.sign_test_p(5, 0) == pytest.approx(2 / 32)  # 5 of 5 seeds: not below 0.05
    assert bench.sign_test_p(0, 5) == pytest.approx(2 / 32)
    assert bench.sign_test_p(9, 1) == pytest.approx(2 * 11 / 1024)
    assert bench.sign_test_p(3, 3) == 1.0 and bench.sign_test_p(0, 0) == 1.0
    with pytest.raises(ValueError, match="wins=-1"):
        bench.sign_test_p(-1, 2)
    ada = {"tta_s": [40.0, None, 45.0, 30.0, None], "ran": [True] * 5}
    other = {"tta_s": [50.0, 60.0, 44.0, None, None], "ran": [True, True, True, False, True]}
    c = bench.paired_against(ada, other, "tta_s")
    assert (c["seeds"], c["faster"], c["slower"], c["ties"]) == (4, 1, 2, 1)  # seed 4: other failed
    assert c["ratios"] == [0.8, 45.0 / 44.0]
    assert c["median_ratio"] == pytest.approx((0.8 + 45.0 / 44.0) / 2)
    assert c["sign_test_p"] == 1.0

    results = [_seed_result(s, {"Dense": ("dense", 90.0, 0.0), "AG-Topk 0.01": ("ag", ag, 1.0),
                                "Adaptive": ("adaptive", a, 0.5)})
               for s, ag, a in [(1, 50.0, 40.0), (2, 60.0, None), (3, 44.0, 45.0)]]
    for res in results:  # runs saved before the smoothed ruler: no smoothed times
        for row in res["rows"]:
            row["time_to_smoothed_target_s"] = None
    summary = bench.seed_summary(results)
    paired = summary["adaptive"]["Adaptive"]["paired"]
    assert paired["tta_s"]["AG-Topk 0.01"]["faster"] == 1
    assert paired["tta_s"]["Dense"]["faster"] == 2  # seed 2: Adaptive missed
    assert paired["smoothed_tta_s"]["Dense"]["ties"] == 3
    md = bench.seeds_markdown(summary, results)
    assert "  - AG-Topk 0.01: first crossing: faster in 1/3, ratio 0.91, p = 1.000" in md


def _saved_run(seed: int, delay_ms: float = 5.0) -> dict:
    """A saved run (``adaptive.json``) of one seed, with the records the summary recomputes from."""
    dense = _method_record("Dense", "dense", [0.1, 0.80, 0.81, 0.83, 0.84, 0.85])
    ag = _method_record("AG-Topk 0.01", "ag", [0.1, 0.845, 0.78, 0.80, 0.86, 0.87, 0.86])
    ada = _method_record("Adaptive", "adaptive", [0.1, 0.80, 0.83, 0.84, 0.835, 0.83])
    return {"settings": {"seed": seed, "target_drop": 0.01, "n": 4, "rate_mbit": 100.0,
                         "delay_ms": delay_ms, "model_name": "MLP", "parameters": 1,
                         "batch_size": 64, "lr": 0.01, "momentum": 0.9, "dense_steps": 80,
                         "max_steps_other": 240, "eval_every": 20},
            "rows": [], "assessment": {}, "link": {}, "dense_accuracy": 0.85, "target": 0.84,
            "time_budget_s": None, "records": [dense, ag, ada], "loadavg_start": [0, 0, 0],
            "loadavg_end": [0, 0, 0], "cpus": 2, "total_s": 1.0}


def test_render_seeds_pools_runs_of_one_setting_and_names_what_differs(tmp_path):
    """``--render-seeds A B --out O`` pools the seeds of two runs with the same settings into one
    summary under O; a run with other settings, or a seed in both, is refused with a message
    that names them."""
    sys.path.insert(0, os.path.join(REPO, "benchmarks"))
    import bench_adaptive as bench

    def save(run_dir, seed, **kw):
        (run_dir / f"seed{seed}").mkdir(parents=True)
        (run_dir / f"seed{seed}" / "adaptive.json").write_text(json.dumps(_saved_run(seed, **kw)))

    save(tmp_path / "a", 1)
    save(tmp_path / "a", 2)
    save(tmp_path / "b", 3)
    save(tmp_path / "c", 4, delay_ms=25.0)
    save(tmp_path / "d", 2)
    pooled = bench.load_seed_runs([str(tmp_path / "b"), str(tmp_path / "a")])
    assert [r["settings"]["seed"] for r in pooled] == [1, 2, 3]
    assert pooled[0]["rows"][2]["time_to_smoothed_target_s"] == 8.0  # recomputed from records
    with pytest.raises(ValueError, match=r"seed 4\) was run with other settings .*: delay_ms"):
        bench.load_seed_runs([str(tmp_path / "a"), str(tmp_path / "c")])
    with pytest.raises(ValueError, match=r"seed\(s\) \[2\] appear in more than one run"):
        bench.load_seed_runs([str(tmp_path / "a"), str(tmp_path / "d")])
    with pytest.raises(ValueError, match="no seed"):
        bench.load_seed_runs([str(tmp_path / "a"), str(tmp_path / "missing")])
    out = tmp_path / "pooled"
    assert bench.main(["--render-seeds", str(tmp_path / "a"), str(tmp_path / "b"),
                       "--out", str(out)]) == 0
    md = (out / "seeds.md").read_text()
    assert "over 3 seeds" in md and "Pooled from runs with the same settings" in md
    assert f"`{tmp_path / 'a'}` (seeds 1, 2)" in md
    assert json.loads((out / "seeds.json").read_text())["seeds"] == [1, 2, 3]
    assert not (tmp_path / "a" / "seeds.md").exists()  # one DIR: written into it; several: --out


def test_render_seeds_pools_renamed_arms_with_pool_methods(tmp_path):
    """``--pool-methods NAME NAME=SOURCE`` keeps only the named methods of every run, takes a
    run's ``SOURCE`` as ``NAME`` where the run has it (else its ``NAME``), says so in the summary,
    and refuses, naming them, a run with neither and a name given twice."""
    sys.path.insert(0, os.path.join(REPO, "benchmarks"))
    import bench_adaptive as bench

    def save(run_dir, seed, arm_names):
        run = _saved_run(seed)
        ada = run["records"][2]
        run["records"][2] = dict(ada, method=dict(ada["method"], name=arm_names[0]))
        for extra in arm_names[1:]:  # a second arm, slower: it reaches 0.84 one evaluation later
            rec = _method_record(extra, "adaptive", [0.1, 0.80, 0.83, 0.835, 0.84, 0.83])
            run["records"].append(rec)
        run["settings"]["methods"] = [r["method"] for r in run["records"]]
        (run_dir / f"seed{seed}").mkdir(parents=True)
        (run_dir / f"seed{seed}" / "adaptive.json").write_text(json.dumps(run))

    save(tmp_path / "old", 1, ["Adaptive", "Adaptive (cap=2)"])  # the cap a later default
    save(tmp_path / "new", 2, ["Adaptive", "Adaptive (other=1)"])
    with pytest.raises(ValueError, match="other settings"):  # different method lists
        bench.load_seed_runs([str(tmp_path / "old"), str(tmp_path / "new")])
    pool = bench.parse_pool_methods(["Dense", "AG-Topk 0.01", "Adaptive=Adaptive (cap=2)"])
    assert pool[2] == ("Adaptive", "Adaptive (cap=2)") and pool[0] == ("Dense", "Dense")
    pooled = bench.load_seed_runs([str(tmp_path / "old"), str(tmp_path / "new")], pool)
    assert [[r["name"] for r in res["rows"]] for res in pooled] == [["Dense", "AG-Topk 0.01",
                                                                    "Adaptive"]] * 2
    # seed 1's Adaptive is the renamed (slower) arm, seed 2's its own Adaptive
    assert pooled[0]["settings"]["pooled_as"]["Adaptive"] == "Adaptive (cap=2)"
    assert pooled[1]["settings"]["pooled_as"]["Adaptive"] == "Adaptive"
    assert pooled[0]["rows"][2]["time_to_target_s"] != pooled[1]["rows"][2]["time_to_target_s"]
    out = tmp_path / "pooled"
    assert bench.main(["--render-seeds", str(tmp_path / "old"), str(tmp_path / "new"), "--out",
                       str(out), "--pool-methods", "Dense", "AG-Topk 0.01",
                       "Adaptive=Adaptive (cap=2)"]) == 0
    md = (out / "seeds.md").read_text()
    assert f"**Adaptive** is `Adaptive (cap=2)` in `{tmp_path / 'old'}` (seeds 1)" in md
    assert "other=1" not in md
    with pytest.raises(ValueError, match="has no method 'Nope' or 'Gone'"):
        bench.load_seed_runs([str(tmp_path / "old")], bench.parse_pool_methods(["Gone=Nope"]))
    with pytest.raises(ValueError, match="names 'Dense' twice"):
        bench.parse_pool_methods(["Dense", "Dense=AG-Topk 0.01"])


def test_job_env_keeps_freed_memory_unless_turned_off(monkeypatch):
    sys.path.insert(0, os.path.join(REPO, "benchmarks"))
    from jobctl import KEEP_FREED_MEMORY, KEEP_FREED_MEMORY_ENV, job_env

    for name in KEEP_FREED_MEMORY:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv(KEEP_FREED_MEMORY_ENV, raising=False)
    env = job_env()
    assert {name: env[name] for name in KEEP_FREED_MEMORY} == KEEP_FREED_MEMORY
    assert env["OMP_NUM_THREADS"] == "1"
    monkeypatch.setenv(KEEP_FREED_MEMORY_ENV, "0")
    assert not set(KEEP_FREED_MEMORY) & set(job_env())
    monkeypatch.setenv(KEEP_FREED_MEMORY_ENV, "1")
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "12345")  # a value already set wins
    assert job_env()["MALLOC_TRIM_THRESHOLD_"] == "12345"
