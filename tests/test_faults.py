"""Multi-process fault tests (real ``horovodrun``, Gloo and MPI controllers).

- a rank dies (``os._exit``) or raises in the middle of a step: the job ends, well within a stated
  deadline, and the launcher names the failed process;
- bad arguments raise at construction on every rank with the right exception type and a message
  naming the bad value; a bad value on one rank only does not hang the others;
- every rank passing a different ``cr``: every rank raises ``ValueError`` ("ranks disagree");
- non-finite gradients under the MPI controller: the step is skipped on every rank;
- dtypes other than float32 on 1 and 2 ranks.

The bodies are in ``tests/fault_bodies.py``. Every launch has a hard timeout (the process group is
killed), so a hang fails the test instead of blocking the suite.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest

from tests.harness import Launch, launch, run_parallel

pytestmark = pytest.mark.slow

#: After a rank fails, the whole job must be over within this many seconds. Measured from the
#: failing rank's own timestamp (``fault_bodies.mark``) to the launcher's exit, so that start-up
#: time, which grows a lot on a loaded 2-core machine, does not count. On an idle machine a whole
#: 2-rank job (start-up included) takes about 5 s under Gloo and 8-18 s under MPI.
DEADLINE_S = 60
#: Hard kill of the launcher's process group (a hang shows as a failure, never blocks the suite).
KILL_S = 300


@dataclass
class _Fault:
    """A launch (:class:`tests.harness.Launch`) plus the fault tests' timing helper."""

    run: Launch

    def __getattr__(self, name: str):
        return getattr(self.run, name)

    def after(self, event: str) -> float:
        """Seconds from the first ``fault_bodies.mark(rank, event)`` to the launcher's exit."""
        stamps = [float(t) for t in re.findall(
            rf"fault_bodies: rank \d+ {re.escape(event)} at t=(\d+\.\d+)", self.output)]
        assert stamps, f"no '{event}' mark in the output:\n{self.output[-3000:]}"
        return self.ended_at - min(stamps)


def _launch(target: str, np: int = 2, controller: str = "gloo", timeout: float = KILL_S,
            **kwargs) -> _Fault:
    """``harness.launch``: per-rank outcomes, the launcher's output, exit code and wall time."""
    run = launch(target, np, controller, timeout, **kwargs)
    print(f"\n[fault timing] {target} {kwargs} np={np} {controller}: job {run.elapsed_s:.1f} s, "
          f"exit {run.returncode}, outcomes {[o[0] for o in run.outcomes]}")
    return _Fault(run)


def _assert_ends_soon(run: _Fault, event: str) -> None:
    latency = run.after(event)
    print(f"[fault timing]   from '{event}' to the launcher's exit: {latency:.1f} s")
    assert latency < DEADLINE_S, (event, latency, run.output[-3000:])


def _failed_process_named(output: str, controller: str, rank: int, code: int) -> bool:
    """Whether the launcher's summary names ``rank`` as the process that failed with ``code``."""
    if controller == "gloo":  # horovodrun's own summary
        return (re.search(rf"Process {rank} exit with status code {code}\b", output) is not None
                and re.search(rf"Process name: {rank}\s+Exit code: {code}\b", output) is not None)
    # Open MPI's summary: "Process name: [[jobid,1],RANK]" then "Exit code:    CODE"
    return re.search(rf"Process name:\s+\[\[\d+,\d+\],{rank}\]\s+Exit code:\s+{code}\b",
                     output) is not None


def _survivor_ok(outcome: tuple) -> bool:
    """A surviving rank was either killed by the launcher (no result) or stopped with Horovod's
    shutdown error; it never finishes its training loop."""
    status, text = outcome
    if status == "missing":
        return True
    return status == "error" and "HorovodInternalError" in text and "Horovod has been shut down" in text


# --------------------------------------------------------------------------------------------
# a rank dies / raises in the middle of a step
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("controller", ["gloo", pytest.param("mpi", marks=pytest.mark.mpi)])
def test_rank_exits_right_before_step_ends_the_job(controller):
    """ARTopk(cr=0.05), np=2: rank 1 calls os._exit(3) right before opt.step() at step 3 (rank 1
    is STAR's root that step: rank 0 waits for its index broadcast)."""
    run = _launch("tests.fault_bodies:die_mid_step", np=2, controller=controller,
                  kind="star", cr=0.05, die_rank=1, die_step=3, code=3)
    _assert_ends_soon(run, "exits with code 3 at step 3")
    assert run.returncode != 0
    assert run.outcomes[1] == ("missing", None)  # os._exit: no result written
    assert _survivor_ok(run.outcomes[0]), run.outcomes[0]
    assert "rank 1 exits with code 3 at step 3" in run.output
    assert _failed_process_named(run.output, controller, rank=1, code=3), run.output[-3000:]


def test_rank_zero_exits_during_allgather_step_ends_the_job():
    """AGTopk, np=2, Gloo: rank 0 (the coordinator) dies before its step-2 allgather."""
    run = _launch("tests.fault_bodies:die_mid_step", np=2, controller="gloo",
                  kind="ag", cr=0.05, die_rank=0, die_step=2, code=7)
    _assert_ends_soon(run, "exits with code 7 at step 2")
    assert run.returncode != 0
    assert run.outcomes[0] == ("missing", None)
    assert _survivor_ok(run.outcomes[1]), run.outcomes[1]
    assert _failed_process_named(run.output, "gloo", rank=0, code=7), run.output[-3000:]


def test_rank_raises_mid_step_ends_the_job():
    """A Python exception on rank 1 right before opt.step() (the rank reports its traceback and
    exits 1); rank 0, inside the step's collectives, does not hang. Both ranks exit 1, so the
    launcher may name either as the first failure."""
    run = _launch("tests.fault_bodies:raise_mid_step", np=2, controller="gloo", kind="star")
    _assert_ends_soon(run, "raises")
    assert run.returncode != 0
    status, text = run.outcomes[1]
    assert status == "error" and "injected failure on rank 1 at step 3" in text
    assert _survivor_ok(run.outcomes[0]), run.outcomes[0]
    assert any(_failed_process_named(run.output, "gloo", rank=r, code=1) for r in (0, 1)), \
        run.output[-3000:]


# --------------------------------------------------------------------------------------------
# bad arguments
# --------------------------------------------------------------------------------------------
#: case -> (exception type, substrings the message must contain)
BAD_INPUTS = {
    "cr_nan": ("ValueError", ["cr must be in (0, 1]", "nan"]),
    "cr_zero": ("ValueError", ["cr must be in (0, 1]", "got 0"]),
    "cr_1.5": ("ValueError", ["cr must be in (0, 1]", "1.5"]),
    "cr_negative": ("ValueError", ["cr must be in (0, 1]", "-0.1"]),
    "cr_string": ("TypeError", ["cr must be a number", "'0.1'", "str"]),
    "cr_bool": ("TypeError", ["cr must be a number", "True", "bool"]),
    "selector_bogus": ("ValueError", ["selector", "'bogus'"]),
    "granularity_bogus": ("ValueError", ["granularity", "'layer'"]),
    "bucket_cap_zero": ("ValueError", ["bucket_cap_mb", "got 0"]),
    "compression_string": ("TypeError", ["compression must be", "'topk'", "of type str"]),
    "bpps_zero": ("ValueError", ["backward_passes_per_step", "got 0"]),
    "adasum_topk": ("ValueError", ["op=hvd.Average or hvd.Sum", "got op=hvd.Adasum"]),
    "groups_topk": ("ValueError", ["groups is only supported with Dense()"]),
    "predivide_sum": ("ValueError", ["gradient_predivide_factor"]),
    "not_an_optimizer": ("TypeError", ["torch.optim.Optimizer", "Sequential"]),
}


@pytest.fixture(scope="module")
def bad_construction_results() -> list:
    """Every bad case, caught one after the other on each of 2 ranks (one launch)."""
    return run_parallel("tests.fault_bodies:bad_constructions", np=2, timeout=KILL_S,
                        cases=list(BAD_INPUTS))


def test_bad_arguments_raise_at_construction_on_every_rank(bad_construction_results):
    for rank, per_case in enumerate(bad_construction_results):
        assert set(per_case) == set(BAD_INPUTS)
        for case, (etype, needles) in BAD_INPUTS.items():
            got_type, message = per_case[case]
            assert got_type == etype, (rank, case, got_type, message)
            for needle in needles:
                assert needle in message, (rank, case, needle, message)


def test_adasum_error_names_adasum(bad_construction_results):
    for per_case in bad_construction_results:
        assert "Adasum" in per_case["adasum_topk"][1], per_case["adasum_topk"]


def test_uncaught_bad_argument_fails_every_rank_without_hanging():
    """AGTopk(cr=NaN) on every rank, not caught: the job ends; every rank that reports back (the
    launcher may kill the second one first) reports the ValueError."""
    etype, needles = BAD_INPUTS["cr_nan"]
    run = _launch("tests.fault_bodies:bad_construction", np=2, controller="gloo", case="cr_nan")
    _assert_ends_soon(run, "constructs")
    assert run.returncode != 0
    # a rank killed by the launcher after the other failed first is "missing"; one at least errors
    statuses = [o[0] for o in run.outcomes]
    assert "ok" not in statuses and "error" in statuses, statuses
    for status, text in run.outcomes:
        if status == "error":
            assert etype in text and all(n in text for n in needles), text


def test_bad_cr_on_one_rank_does_not_hang_the_others():
    """Only rank 1 passes cr=NaN: it raises at construction; rank 0 goes on to the first step's
    configuration allgather, whose peer is gone. The job must still end."""
    run = _launch("tests.fault_bodies:bad_cr_on_one_rank", np=2, controller="gloo", bad_rank=1)
    _assert_ends_soon(run, "constructs")
    assert run.returncode != 0
    status, text = run.outcomes[1]
    assert status == "error" and "ValueError" in text and "nan" in text
    assert _survivor_ok(run.outcomes[0]), run.outcomes[0]


# --------------------------------------------------------------------------------------------
# every rank disagrees
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("np_,controller", [
    (4, "gloo"),
    pytest.param(4, "mpi", marks=pytest.mark.mpi),
    pytest.param(2, "mpi", marks=pytest.mark.mpi),
])
def test_every_rank_with_a_different_cr_raises_everywhere(np_, controller):
    run = _launch("tests.fault_bodies:every_rank_disagrees", np=np_, controller=controller)
    _assert_ends_soon(run, "steps")
    for rank, (status, text) in enumerate(run.outcomes):
        assert status == "error", (rank, status, text)
        assert "ValueError" in text and "ranks disagree on compression" in text, text
        assert re.search(r"rank 0 has .ARTopk\(cr=0\.01,.*rank 1 has .ARTopk\(cr=0\.02,", text), text


# --------------------------------------------------------------------------------------------
# non-finite gradients under the MPI controller
# --------------------------------------------------------------------------------------------
@pytest.mark.mpi
def test_nonfinite_gradient_under_mpi_skips_the_step_everywhere():
    """NaN (AGTopk) and then +inf (ARTopk STAR) in rank 0's gradient at step 1, np=2, MPI."""
    cases = ["ag:nan", "star:inf"]
    results = run_parallel("tests.fault_bodies:nonfinite_cases", np=2, controller="mpi",
                           timeout=KILL_S, cases=cases, nan_rank=0, nan_step=1, steps=4)
    for per_case in results:
        for case in cases:
            r = per_case[case]
            assert r["size"] == 2
            assert r["skipped"] == [False, True, False, False], (case, r)
            assert r["nonfinite_ranks"][1] == [0], (case, r)
            assert r["params_unchanged_on_skip"] and r["residual_kept"], (case, r)
            assert r["params_agree"] and r["finite"], (case, r)


# --------------------------------------------------------------------------------------------
# dtypes
# --------------------------------------------------------------------------------------------
def test_half_and_double_models_on_two_ranks():
    """float64 / float16 / bfloat16 with AG, STAR and VAR (k = 39, odd) train, and every rank ends
    with the same finite parameters. Horovod 0.28.1 has no bfloat16 allreduce on CPU, so
    bfloat16 values travel as float32 in the AR-Topk value allreduce."""
    combos = ["float64:ag", "float64:star", "float16:ag", "float16:var", "bfloat16:ag",
              "bfloat16:star", "bfloat16:var"]
    results = run_parallel("tests.fault_bodies:train_dtypes", np=2, timeout=KILL_S, combos=combos)
    for r in results:
        for combo in combos:
            got = r[combo]
            assert isinstance(got, dict), (combo, got)
            assert got["k"] == [39, 39, 39] and got["finite"] and got["agree"], (combo, got)


def test_single_process_agtopk_trains_half_and_double_models():
    combos = ["float64:ag", "float16:ag", "bfloat16:ag"]
    (r,) = run_parallel("tests.fault_bodies:train_dtypes", np=1, timeout=KILL_S, combos=combos)
    failures = {c: v for c, v in r.items() if not isinstance(v, dict)}
    assert not failures, failures
