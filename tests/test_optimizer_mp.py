"""Multi-process tests of the DistributedOptimizer (real horovodrun, Gloo unless stated)."""

import math

import pytest

from hvd_flexcomm.probing import PHASES
from tests.harness import run_parallel

pytestmark = pytest.mark.slow


def _check_reference(result: dict, n: int, kind: str) -> None:
    assert result["max_err"] < 1e-5, (kind, result["max_err"])
    assert result["max_res_err"] < 1e-5, (kind, result["max_res_err"])
    for step, (got_root, ref_root) in enumerate(r for r in result["roots"]):
        if kind.startswith("star"):
            assert got_root == step % n
        if kind.startswith(("star", "var", "flex")) and result["messages"] == 1:
            assert got_root == ref_root
    for stats in result["stats"]:
        if kind != "flex":
            assert stats["collective"] == ("allgather" if kind.startswith("ag") else "allreduce")
        assert 0.0 < stats["gain"] <= 1.0 and stats["skipped"] is False


@pytest.mark.parametrize("np_", [2, 4])
def test_all_modes_equal_dense_reference(np_):
    results = run_parallel("tests.mp_bodies:all_modes_match_reference", np=np_, timeout=240)
    for result in results:
        for kind, r in result.items():
            _check_reference(r, np_, kind)
        assert result["ag_bucket"]["messages"] > 1  # buckets really were used


def test_reference_under_mpi_controller():
    results = run_parallel("tests.mp_bodies:compressed_matches_reference", np=2,
                           controller="mpi", kind="var", cr=0.02)
    for r in results:
        _check_reference(r, 2, "var")


def test_gradient_accumulation_matches_reference():
    results = run_parallel("tests.mp_bodies:compressed_matches_reference", np=2, kind="star",
                           cr=0.05, passes=3)
    for r in results:
        _check_reference(r, 2, "star")


def test_cr_one_reproduces_horovod_dense():
    for r in run_parallel("tests.mp_bodies:cr_one_equals_horovod", np=2):
        assert all(d <= 1e-6 for d in r["diffs"].values()), r["diffs"]
        assert r["paths"] == {"dense": "dense", "ag1": "dense", "star1": "dense",
                              "var1": "dense"}


@pytest.mark.parametrize("what,needle", [
    ("cr", "ranks disagree on compression"),
    ("compressor", "ranks disagree on compression"),
    ("selector", "ranks disagree on compression"),
    ("sync_every", "ranks disagree on compression settings: sync_every: rank 0 has 1, rank 1 has 2"),
    ("names", "ranks disagree on parameters"),
])
def test_disagreeing_ranks_raise_everywhere(what, needle):
    outcomes = run_parallel("tests.mp_bodies:disagreeing_config", np=2, expect_failure=True,
                            what=what, timeout=90)
    for rank, (status, text) in enumerate(outcomes):
        assert status == "error", (rank, status, text)
        assert "ValueError" in text and needle in text, text
        assert "rank 1 has" in text


def test_too_many_backward_passes_raises():
    for r in run_parallel("tests.mp_bodies:accumulation_overflow_raises", np=2):
        assert r.startswith("step 2: Gradients were computed more than backward_passes_per_step")


@pytest.mark.parametrize("kind", ["ag", "star"])
def test_frozen_unused_sparse_and_clipping(kind):
    for r in run_parallel("tests.mp_bodies:odd_parameters", np=2, kind=kind):
        assert r == {"frozen_unchanged": True, "unused_unchanged": True,
                     "emb_grad_is_sparse": False, "losses_finite": True,
                     "params_equal_across_ranks": True}


@pytest.mark.parametrize("kind", ["ag", "star"])
def test_two_top_k_optimizers_in_one_process(kind):
    """Two optimizers (backbone and head) whose buckets are in flight together: their collective
    names differ (before, both used ``hvd_flexcomm.msg<i>``), and each aggregate is right."""
    for r in run_parallel("tests.mp_bodies:two_optimizers_one_backward", np=2, kind=kind):
        assert r["messages"]["backbone"] > 1 and r["messages"]["head"] >= 1, r
        assert r["names_distinct"] and r["params_agree"], r
        assert r["max_err"] < 1e-5, r


@pytest.mark.parametrize("kind", ["ag", "star", "var"])
def test_nonfinite_gradient_skips_step_on_every_rank(kind):
    for r in run_parallel("tests.mp_bodies:nonfinite_step_is_skipped", np=2, kind=kind):
        assert r["skipped"] == [False, False, True, False]
        assert r["nonfinite_ranks"] == [1]
        assert r["params_unchanged_on_skip"] and r["residual_kept"]
        assert r["params_agree"] and r["finite"]


@pytest.mark.parametrize("kind", ["ag", "var"])
def test_checkpoint_resume_is_exact(kind):
    for diff in run_parallel("tests.mp_bodies:checkpoint_resume", np=2, kind=kind):
        assert diff == 0.0


def test_single_process_still_compresses():
    (r,) = run_parallel("tests.mp_bodies:compressed_matches_reference", np=1, kind="ag", cr=0.1)
    _check_reference(r, 1, "ag")


def test_accuracy_within_one_point_of_dense_on_fashion_mnist():
    (r, _) = run_parallel("tests.mp_bodies:train_accuracy", np=2, timeout=600,
                          runs=["horovod:1", "agtopk:0.1", "artopk:0.1"])
    dense = r["horovod:1"]["acc"]
    assert dense > 0.80, r
    for spec in ("agtopk:0.1", "artopk:0.1"):
        assert r[spec]["acc"] >= dense - 0.01, (spec, r)


@pytest.mark.parametrize("np_", [2, 4])
def test_flexible_paths_agree_and_match_reference(np_):
    for r in run_parallel("tests.mp_bodies:flexible_matches_reference", np=np_, timeout=180):
        for run in (r, r["by_probes"]):
            _check_reference(run, np_, "flex")
            assert run["paths_agree"]
            for s in run["stats"]:
                assert set(s["predicted_ms"]) == {"allgather", "allreduce"}
                assert s["measured_ms"] > 0
            assert run["stats"][0]["probe_ms"] > 0  # start-up calibration
            # where its time went: a warm-up round (every name new), the timed ops, the
            # allgather combining the timings, each measured, together within the probe's time
            phases = run["stats"][0]["probe_phases_ms"]
            assert list(phases) == list(PHASES) and all(ms > 0 for ms in phases.values()), phases
            assert sum(phases.values()) <= run["stats"][0]["probe_ms"], phases
            for s in run["stats"][1:]:
                assert (s["probe_phases_ms"] is None) == (s["probe_ms"] == 0), s
            # a fixed CR: a step is cold (its names negotiated afresh, kept out of the fits) on
            # its path's first use only
            seen = set()
            for s in run["stats"]:
                assert s["cold"] == (s["collective"] not in seen), [x["cold"] for x in run["stats"]]
                seen.add(s["collective"])
            # time outside synchronize (here the test's own reference collectives and backward)
            assert run["stats"][0]["other_ms"] is None
            assert all(s["other_ms"] > 0 for s in run["stats"][1:])
        # periodic refreshes (interval 4): on real steps of the path not in use by default, no
        # probe after the start-up one; by timed probes under reprobe_by="probes"
        assert not any(s["probe_ms"] > 0 for s in r["stats"][1:])
        refreshed = [s for s in r["stats"] if s["remeasure"] == "refresh"]
        assert refreshed and all(s["exploring"] for s in refreshed)
        assert any(s["probe_ms"] > 0 for s in r["by_probes"]["stats"][1:])
        # a refresh runs no untimed op: its warm-up phase is empty
        refresh_phases = [s["probe_phases_ms"] for s in r["by_probes"]["stats"]
                          if s["probe_kind"] == "refresh"]
        assert refresh_phases and all(p["warm_up"] < 0.2 * p["timed"] for p in refresh_phases)
        assert not any(s["remeasure"] for s in r["by_probes"]["stats"])
        # run_probes on real collectives: a size's first use adds one warm-up op (and the
        # barrier's name one), later uses and refreshes (warm_up=False) not; the first
        # broadcast is timed in pairs with the allreduce after it (no extra op), each timing of
        # the last is followed by a barrier allreduce, and one allgather combines the timings
        # over ranks; the third run times its entries 1, 2, 2, 1, 1 times
        assert r["probe_ops"] == [(6 + 5 * 2 + 2 + 1, 5 * 2, True),
                                  (5 * 2 + 2 + 1, 5 * 2, True), (7 + 1 + 1, 7, True)]


def test_default_adaptive_picks_its_first_cr_at_the_start_up_probe():
    """``Adaptive()``: step 0 (the start-up probe's step) already runs the CR every rank picked
    from rank 0's gains and time outside communication, sent with the probe's timings; no step
    runs at the fallback starting CR and no announcement is needed for it."""
    results = run_parallel("tests.mp_bodies:adaptive_first_cr", np=2, timeout=180)
    r0 = results[0]
    for r in results:
        assert r["crs"] == r0["crs"] and r["changes"] == r0["changes"]
        assert r["announced_cr"] == r0["crs"][0]
    assert r0["probes"][0] == "full" and not r0["spans"][0]
    first = r0["solves"][0]
    assert first["step"] == 0 and first["reason"] == "start-up probe"
    assert first["other_ms"] > 0  # forward and backward since zero_grad(), on rank 0
    assert float(f"{first['cr']:.4g}") == r0["recomputed_cr"]
    # the pick, or the starting CR where the pick was predicted to save too little (kept)
    assert r0["crs"][0] == (r0["starting_cr"] if r0["kept"] else r0["recomputed_cr"])
    # the picked CR holds on every route step until a change is announced
    until = r0["changes"][0][0] if r0["changes"] else len(r0["crs"])
    assert all(cr == r0["crs"][0] for cr, span in zip(r0["crs"][:until], r0["spans"]) if not span)


def test_adaptive_start_by_steps_calibrates_on_training_steps_alike_on_every_rank():
    """``Adaptive(start_by="steps")``: no probe; steps 0-7 train on AG-Topk then AR-Topk at
    ``probe_top_cr`` and ``c_low`` (span steps), step 8 at the starting CR; every rank reports
    the same steps and ends with the same model, calibrated once, and rank 0's first solve
    waits for it."""
    results = run_parallel("tests.mp_bodies:adaptive_start_by_steps", np=2, timeout=180)
    r0 = results[0]
    for r in results:
        assert r["rows"] == r0["rows"] and r["fits"] == r0["fits"]
    want = [(cr, path, True, None) for path in ("allgather", "allreduce")
            for cr in (0.033, 0.033, 0.001, 0.001)]
    assert r0["rows"][:8] == want
    assert r0["rows"][8] == (r0["starting_cr"], "allgather", False, None)
    assert all(row[3] is None for row in r0["rows"][:9])  # no start-up probe
    # no full probe later either (a drift probe may fire on a loaded machine's timings)
    assert all(row[3] != "full" for row in r0["rows"])
    assert r0["calibrated"] and r0["n_step_starts"] == 1 and r0["n_full_probes"] == 0
    assert r0["solves"] and r0["solves"][0][0] >= 9  # after step 7's timings (step 8's payload)


@pytest.mark.parametrize("controller", ["gloo", "mpi"])
def test_adaptive_cr_identical_on_every_rank_and_never_blocks(controller):
    results = run_parallel("tests.mp_bodies:adaptive_run", np=2, controller=controller,
                           timeout=300)
    r0 = results[0]
    assert r0["channel"] == ("mpi4py" if controller == "mpi" else "hvd.broadcast_object")
    for r in results:
        assert r["crs_agree"] and r["crs"] == r0["crs"] and r["changes"] == r0["changes"]
        assert r["announcements"] == r0["announcements"]
        assert r["spans"] == r0["spans"] and r["span_moves"] == r0["span_moves"]
        assert r["span_confirms"] == r0["span_confirms"] and r["span_offs"] == r0["span_offs"]
    crs, spans = r0["crs"], r0["spans"]
    # span steps: runs of 3 real steps at an end of the candidates, every rank at the same steps
    span_steps = [i for i, s in enumerate(spans) if s]
    runs = [i for i in span_steps if i - 1 not in span_steps]  # first step of each span
    assert runs, "no span step ran"
    for first in runs:  # 3 steps each, unless the end of the run or a drift probe cut it short
        length = 1
        while first + length < len(spans) and spans[first + length]:
            length += 1
        cut = first + length == len(spans) or r0["probes"][first + length] in ("drift", "full")
        assert length == 3 or cut, (first, length, r0["probes"][first:first + 4])
    assert all(crs[i] in (0.001, 0.1) for i in span_steps), [crs[i] for i in span_steps]
    # each span was judged once its last timings arrived (one cut by the run's end, or by a probe,
    # is not)
    assert 1 <= r0["span_moves"] + r0["span_confirms"] + r0["span_offs"] <= len(runs)
    assert min(span_steps) >= 30  # not in the warm-up
    # a route step is cold when its path's names last ran at another CR (or never): the first
    # sparse step and the first at each new CR; span steps have names of their own
    last_cr = {}
    for i, (cr, path, span) in enumerate(zip(crs, r0["paths"], spans)):
        if span or path == "dense":
            assert not r0["colds"][i], i
            continue
        assert r0["colds"][i] == (last_cr.get(path) != cr), (i, cr, path, last_cr)
        last_cr[path] = cr
    assert sum(r0["colds"]) >= 2  # the first sparse step and the solver's CR
    assert crs[0] == 1.0 and r0["paths"][0] == "dense"  # warm-up starts dense
    assert all(a >= b for a, b in zip(crs[:30], crs[1:30]))  # and ramps down
    # the starting CR once the warm-up ends, unless a drift during the warm-up made a span due
    # (its drift probe schedules one span_settle_steps later, and spans wait for the warm-up)
    assert crs[30] == 0.1 or spans[30]
    assert r0["solves"] >= 1 and not r0["failed"]
    assert r0["changes"], "the solver's CR was never announced"
    # a broadcast only when rank 0 had a finished solve to offer, not at every sync step
    assert len(r0["changes"]) <= r0["announcements"] <= r0["submitted"], r0
    step, cr = r0["changes"][0]
    assert step % 5 == 0 and 0.001 <= cr <= 0.1 and (crs[step] == cr or spans[step])
    # training went on while rank 0 solved: steps completed inside every solve window
    assert all(n > 0 for n in r0["steps_during_solves"]), r0
    assert r0["state_has_gains"] and r0["last_result"]["front"]
    # rank 0 kept its steps' compression times at the sparse CRs it ran (not the warm-up's above
    # c_high); a solve counts them once two CRs a factor 2 apart have 3 steps each
    kept = r0["compress_steps"]
    assert kept and set(kept) <= set(crs[30:]), kept
    assert results[1]["compress_steps"] == {}
    # the first solve ran at the end of the warm-up, on no sparse step's compression time; unless
    # a drift probe made it wait for the span after it (no solve reads a model re-timed at one
    # size, FlexibleController.recalibrating): then on the steps at CR 0.1 and the span's end
    first = r0["solve_steps"][0]
    drift_at = [i for i, kind in enumerate(r0["probes"][:first + 1]) if kind == "drift"]
    if drift_at:
        assert any(spans[drift_at[-1]:first]), (drift_at, first, r0["probes"][:first + 1])
    else:
        assert first == 30 and r0["solves_compress_ms"][0] is None, (first, r0["probes"][:31])


def test_after_drift_a_span_runs_on_each_sparse_path_on_every_rank():
    """After a drift probe, Adaptive spans the path in use and then the other sparse path (whose
    slope the drift probe did not measure): on real collectives every rank runs the same span
    steps on the same paths, the second span's steps take the other path, the step after a span
    takes the route, training goes on (the payload's agreement hash checks step, CR and path on
    every step), and each span counts as a recalibration of the model (the version Adaptive
    re-solves on)."""
    results = run_parallel("tests.mp_bodies:spans_after_drift", np=2, timeout=180)
    r0 = results[0]
    for r in results[1:]:
        assert r["rows"] == r0["rows"] and r["versions"] == r0["versions"]
    assert all(r["params_agree"] for r in results)
    rows = r0["rows"]
    # the start-up probe only (the body turns drift off): nothing re-routes between a row and
    # the next step
    assert [i for i, kind in enumerate(r0["probes"]) if kind] == [0], r0["probes"]
    span_steps = [i for i, (_, _, _, span) in enumerate(rows) if span]
    assert span_steps[0] >= 30 and len(span_steps) == 6, rows
    first, second = span_steps[:3], span_steps[3:]
    assert first == list(range(first[0], first[0] + 3))
    assert second == list(range(second[0], second[0] + 3))
    around = {i: rows[i] for i in range(first[0] - 2, min(len(rows), second[-1] + 3))}
    # the first span runs on the route of its first step: a row's route is ctrl.path after the
    # step, the route decided for the next step, unless a new CR takes effect at the next step
    # (Adaptive's solves run in the background and land at any step): it is routed afresh there
    base = r0["base_crs"]
    first_path = (rows[first[0] - 1][2] if base[first[0]] == base[first[0] - 1]
                  else rows[first[0]][1])
    assert all(rows[i][1] == first_path for i in first), around
    other = ({"allgather", "allreduce"} - {first_path}).pop()
    assert all(rows[i][1] == other for i in second), around  # the second on the other path
    assert all(rows[i][0] in (0.001, 0.1) for i in span_steps)  # an end of the candidates
    # each span counts as a recalibration
    assert r0["span_moves"] == 2 and r0["versions"][-1] == r0["versions"][span_steps[0] - 1] + 2
    assert r0["versions"][second[0]] == r0["versions"][span_steps[0] - 1] + 1
    # a span step never moves the route: the step after a span takes the route decided then
    # (unless a new CR takes effect at that step: it is routed afresh)
    for end in (first[-1], second[-1]):
        if base[end + 1] == base[end]:
            assert rows[end + 1][1] == rows[end][2], around
    assert all(math.isfinite(v) for v in r0["losses"])


@pytest.mark.parametrize("kind", ["ag", "var"])
def test_diverged_ranks_are_stopped_by_agreement_check(kind):
    outcomes = run_parallel("tests.mp_bodies:desynchronised_step_is_caught", np=2,
                            expect_failure=True, timeout=90, kind=kind)
    for status, text in outcomes:
        assert status == "error" and "ranks disagree on step / CR / collective" in text, text
        assert "step 5" in text or "step 6" in text


@pytest.mark.parametrize("kind", ["star", "ag"])
def test_resume_in_new_processes_repeats_uninterrupted_run(kind, tmp_path):
    straight = run_parallel("tests.mp_bodies:checkpoint_save", np=2, kind=kind, folder=str(tmp_path))
    assert (tmp_path / "optimizer-rank1.pt").exists() and (tmp_path / "model.pt").exists()
    resumed = run_parallel("tests.mp_bodies:checkpoint_load", np=2, kind=kind, folder=str(tmp_path))
    for a, b in zip(straight, resumed):
        assert a == b  # bit for bit
