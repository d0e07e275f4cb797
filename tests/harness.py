"""Run a test body on N Horovod ranks with ``horovodrun`` and collect each rank's result.

``run_parallel("tests.mp_bodies:ag_matches_reference", np=2, cr=0.1)`` launches
``horovodrun -np 2 -H localhost:2 --gloo python -m tests.rank_main ...``; every rank calls the named
function with the keyword arguments and pickles its return value (or its traceback) to a file. The
helper returns the list of per-rank results, ordered by rank, or fails the test with every rank's
error and the launcher's output. A hard timeout kills the whole process group, so no test hangs.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def horovod_env(extra: dict | None = None) -> dict:
    """Environment for launching ranks: the venv first on PATH, Open MPI allowed as root, one
    compute thread per rank (2 cores here), and the repository importable."""
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = f"{REPO_ROOT}{os.pathsep}{env.get('PYTHONPATH', '')}"
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("HOROVOD_LOG_LEVEL", "warning")
    if extra:
        env.update(extra)
    return env


def launcher_argv(np: int, controller: str) -> list[str]:
    if controller == "gloo":
        return [str(BIN / "horovodrun"), "-np", str(np), "-H", f"localhost:{np}", "--gloo"]
    if controller == "mpi":
        return [str(BIN / "horovodrun"), "-np", str(np), "-H", f"localhost:{np}", "--mpi",
                "--mpi-args=--oversubscribe --bind-to none"]
    if controller == "mpirun":
        return ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
                "-np", str(np), "-x", "PATH", "-x", "PYTHONPATH", "-x", "OMP_NUM_THREADS"]
    raise ValueError(f"unknown controller {controller!r}")


@dataclass
class Launch:
    """One finished launch: per-rank ``outcomes`` (``("ok", value)`` / ``("error", traceback)`` /
    ``("missing", None)``), the launcher's ``output`` (stdout + stderr), its ``returncode``, the
    job's wall time ``elapsed_s`` and ``ended_at`` (``time.time()`` at the launcher's exit)."""

    outcomes: list
    output: str
    returncode: int
    elapsed_s: float
    ended_at: float


def launch(target: str, np: int = 2, controller: str = "gloo", timeout: float = 120,
           env: dict | None = None, wrap: Any = None, **kwargs: Any) -> Launch:
    """Run ``module:function(**kwargs)`` on ``np`` ranks and collect whatever they report; fail
    the test (after killing the process group) if the job outlives ``timeout`` seconds.

    ``wrap(np, rank_argv) -> argv`` replaces the local launcher (e.g. an emulated network's
    ``Emulator.horovodrun_argv``).
    """
    with tempfile.TemporaryDirectory(prefix="hvdfc-test-") as outdir:
        os.chmod(outdir, 0o777)
        rank_argv = [sys.executable, "-m", "tests.rank_main", target, outdir, json.dumps(kwargs)]
        argv = (wrap(np, rank_argv) if wrap is not None
                else launcher_argv(np, controller) + rank_argv)
        t0 = time.monotonic()
        proc = subprocess.Popen(argv, cwd=REPO_ROOT, env=horovod_env(env), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            output, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            output, _ = proc.communicate()
            pytest.fail(f"{target} on {np} ranks ({controller}) hung: killed after {timeout:.0f} s; "
                        f"output:\n{output[-6000:]}")
        elapsed, ended_at = time.monotonic() - t0, time.time()
        outcomes = []
        for rank in range(np):
            path = Path(outdir) / f"rank{rank}.pkl"
            if path.exists():
                with open(path, "rb") as fh:
                    outcomes.append(pickle.load(fh))
            else:
                outcomes.append(("missing", None))
    return Launch(outcomes, output, proc.returncode, elapsed, ended_at)


def run_parallel(target: str, np: int = 2, controller: str = "gloo", timeout: float = 120,
                 expect_failure: bool = False, env: dict | None = None,
                 wrap: Any = None, **kwargs: Any) -> list:
    """Run ``module:function(**kwargs)`` on ``np`` ranks; return the per-rank results.

    With ``expect_failure=True`` the ranks are expected to raise: the per-rank outcomes are then
    returned as ``("error", traceback_text)`` / ``("ok", value)`` tuples instead of failing.
    ``wrap``: as in :func:`launch`.
    """
    run = launch(target, np, controller, timeout, env, wrap, **kwargs)
    if expect_failure:
        return run.outcomes
    errors = [(r, o) for r, o in enumerate(run.outcomes) if o[0] != "ok"]
    if errors or run.returncode != 0:
        details = "\n".join(f"--- rank {r}: {o[0]}\n{o[1]}" for r, o in errors)
        pytest.fail(f"{target} on {np} ranks ({controller}) failed (exit {run.returncode}):\n"
                    f"{details}\n--- launcher output:\n{run.output[-6000:]}")
    return [o[1] for o in run.outcomes]
