"""The launch scripts in mpi_jobs/, run for real.

* quick: every script parses (``bash -n``) and, with ``DRY_RUN=1``, builds the command it documents;
* slow: horovodrun (Gloo), horovodrun (MPI) and plain mpirun each train the Fashion-MNIST example
  on 2 ranks; the Slurm batch script runs outside Slurm (its mpirun path) and, as root, through a
  real single-node Slurm started by ``mpi_jobs/local_slurm.sh`` (Debian's slurm-wlm + munge,
  installed with apt-get when missing).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
JOBS = REPO / "mpi_jobs"
LAUNCHERS = ("horovodrun_gloo.sh", "horovodrun_mpi.sh", "mpirun.sh")
ALL_SCRIPTS = sorted(p.name for p in JOBS.iterdir() if p.suffix in (".sh", ".sbatch"))
# Seconds: each launcher run (the 2-core machine needs 15-45 s when idle), and the Slurm job.
RUN_TIMEOUT = 170
SBATCH_TIMEOUT = 300
EXAMPLE_ARGS = ["--train-size", "2000", "--epochs", "1", "--compression", "artopk", "--cr", "0.05"]
# Open MPI / horovodrun may prefix lines with "[1,0]<stdout>:" or "[0]<stdout>:".
SUMMARY = re.compile(r"SUMMARY\s+compression=artopk cr=0\.05 selector=\w+ ranks=(\d+)")
ACCURACY = re.compile(r"final test accuracy\s+\d+\.\d+%")
# Variables of the scripts' interface that must not leak in from whoever runs the tests.
SCRIPT_VARS = ("NP", "HOSTS", "IFACES", "BTL", "BIND", "MPI_ARGS", "LAUNCHER", "LAUNCHER_ARGS", "DRY_RUN",
               "SRUN_MPI", "SRUN_ARGS", "HOROVODRUN_CONTROLLER", "HVD_FLEXCOMM_REPO", "SLURM_CONF")


def _venv() -> str | None:
    """The venv running these tests, if it has horovodrun (else the scripts ask scripts/install.sh)."""
    if (Path(sys.prefix) / "bin" / "horovodrun").exists():
        return sys.prefix
    return os.environ.get("HVD_FLEXCOMM_VENV")


@pytest.fixture
def env() -> dict[str, str]:
    e = {k: v for k, v in os.environ.items()
         if k not in SCRIPT_VARS and not k.startswith(("SLURM_", "HOROVOD_", "PMI", "OMPI_COMM_"))}
    venv = _venv()
    if venv:
        e["HVD_FLEXCOMM_VENV"] = venv
    e["OMP_NUM_THREADS"] = "1"
    return e


def run(cmd: list[str], *, env: dict[str, str], timeout: float, cwd: Path | str = REPO,
        on_timeout: Callable[[], str] | None = None) -> tuple[int, str]:
    """Run cmd in its own session; on timeout or any interruption kill that whole process group
    (the launcher and the ranks it started), and nothing else. Returns (exit code, stdout+stderr).
    A timeout fails the test; on_timeout() (e.g. log excerpts) is added to the message."""
    proc = subprocess.Popen([str(c) for c in cmd], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, errors="replace", start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except BaseException:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, _ = proc.communicate()
        if isinstance(sys.exc_info()[1], subprocess.TimeoutExpired):
            pytest.fail(f"{' '.join(map(str, cmd))} still running after {timeout} s:\n{out[-4000:]}"
                        f"{on_timeout() if on_timeout else ''}")
        raise
    return proc.returncode, out


def assert_trained(rc: int, out: str, ranks: int = 2) -> None:
    assert rc == 0, f"exit code {rc}:\n{out[-4000:]}"
    found = SUMMARY.findall(out)
    assert found, f"no SUMMARY line:\n{out[-4000:]}"
    assert found == [str(ranks)], f"expected one SUMMARY with ranks={ranks}, got {found}:\n{out[-4000:]}"
    assert ACCURACY.search(out), out[-4000:]


def dry(script: str, env: dict[str, str], *args: str, **extra: str) -> str:
    """The command line a script prints with DRY_RUN=1 (the last '+ ...' line)."""
    rc, out = run(["bash", JOBS / script, *args], env={**env, "DRY_RUN": "1", **extra}, timeout=60)
    assert rc == 0, out
    lines = [ln for ln in out.splitlines() if ln.startswith("+ ")]
    assert lines, out
    return lines[-1]


# ---- quick ------------------------------------------------------------------------------------

@pytest.mark.parametrize("script", ALL_SCRIPTS)
def test_script_syntax(script: str) -> None:
    r = subprocess.run(["bash", "-n", str(JOBS / script)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr


def test_expected_scripts_present_and_executable() -> None:
    for name in (*LAUNCHERS, "slurm_train.sbatch", "local_slurm.sh", "common.sh", "README.md"):
        assert (JOBS / name).is_file(), name
    for name in (*LAUNCHERS, "slurm_train.sbatch", "local_slurm.sh"):
        assert os.access(JOBS / name, os.X_OK), f"{name} is not executable"


needs_venv = pytest.mark.skipif(_venv() is None, reason="no venv with horovodrun (set HVD_FLEXCOMM_VENV)")


@needs_venv
def test_dry_run_horovodrun(env: dict[str, str]) -> None:
    cmd = dry("horovodrun_gloo.sh", env, "--epochs", "1")
    assert re.search(r"^\+ horovodrun -np 2 -H localhost:2 --gloo \S+/bin/python \S+/train_fashion_mnist\.py "
                     r"--epochs 1$", cmd), cmd
    cmd = dry("horovodrun_gloo.sh", env, "--cr", "0.1", NP="3", HOSTS="a:2,b:1", IFACES="lo")
    assert "-np 3 -H a:2\\,b:1 --gloo --network-interfaces lo " in cmd, cmd
    cmd = dry("horovodrun_mpi.sh", env)
    assert "horovodrun -np 2 -H localhost:2 --mpi --mpi-args=--oversubscribe " in cmd, cmd


@needs_venv
def test_dry_run_mpirun(env: dict[str, str]) -> None:
    cmd = dry("mpirun.sh", env, HOROVOD_CYCLE_TIME="2", HOROVOD_FUSION_THRESHOLD="1048576")
    for part in ("mpirun -np 2 -H localhost:2 --bind-to none --map-by slot ", "-x PATH ",
                 "-x OMP_NUM_THREADS ", "-x HOROVOD_CYCLE_TIME ", "-x HOROVOD_FUSION_THRESHOLD ",
                 "--mca pml ob1 --mca btl tcp\\,self "):
        assert part in cmd, (part, cmd)
    cmd = dry("mpirun.sh", env, BTL="vader", BIND="core", IFACES="lo")
    for part in ("--bind-to core --map-by socket ", "--mca btl vader\\,self ",
                 "--mca btl_tcp_if_include lo --mca oob_tcp_if_include lo "):
        assert part in cmd, (part, cmd)
    rc, out = run(["bash", JOBS / "mpirun.sh"], env={**env, "DRY_RUN": "1", "BIND": "socket"}, timeout=60)
    assert rc != 0 and "BIND must be none or core" in out


@needs_venv
def test_dry_run_sbatch_paths(env: dict[str, str]) -> None:
    # outside Slurm: mpirun on localhost, whatever LAUNCHER=auto finds
    cmd = dry("slurm_train.sbatch", env, "--epochs", "1")
    assert "mpirun -np 2 -H localhost:2 " in cmd, cmd
    # a hand-made allocation of 3 nodes, tasks "2(x2),1"; horovodrun gets host:slots from it
    fake = {"SLURM_JOB_ID": "42", "SLURM_NTASKS": "5", "SLURM_JOB_NODELIST": "n1,n2,n3",
            "SLURM_TASKS_PER_NODE": "2(x2),1", "LAUNCHER": "horovodrun"}
    cmd = dry("slurm_train.sbatch", env, **fake)
    assert "horovodrun -np 5 -H n1:2\\,n2:2\\,n3:1 --gloo " in cmd, cmd
    # inside an allocation mpirun takes the hosts from Slurm, so no -H
    cmd = dry("slurm_train.sbatch", env, **{**fake, "LAUNCHER": "mpirun"})
    assert "mpirun -np 5 --bind-to none" in cmd and " -H " not in cmd, cmd
    rc, out = run(["bash", JOBS / "slurm_train.sbatch"],
                  env={**env, "DRY_RUN": "1", "LAUNCHER": "srun"}, timeout=60)
    assert rc != 0 and "needs a Slurm allocation" in out, out


# ---- slow: real training runs -----------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("script", LAUNCHERS)
def test_launcher_trains(script: str, env: dict[str, str], tmp_path: Path) -> None:
    rc, out = run(["bash", JOBS / script, *EXAMPLE_ARGS], env=env, timeout=RUN_TIMEOUT, cwd=tmp_path)
    assert_trained(rc, out)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_sbatch_without_slurm(env: dict[str, str], tmp_path: Path) -> None:
    """The batch script run as a plain script, with a hand-made SLURM_* allocation of this host:
    the mpirun path that does not need srun or the pmix plugin."""
    host = socket.gethostname().split(".")[0]
    fake = {"SLURM_JOB_ID": "4242", "SLURM_JOBID": "4242", "SLURM_NTASKS": "2", "SLURM_NPROCS": "2",
            "SLURM_JOB_NODELIST": host, "SLURM_NODELIST": host, "SLURM_TASKS_PER_NODE": "2",
            "SLURM_JOB_NUM_NODES": "1", "SLURM_NNODES": "1", "SLURM_CPUS_PER_TASK": "1",
            "SLURM_SUBMIT_DIR": str(REPO), "NP": "2", "LAUNCHER": "mpirun"}
    rc, out = run(["bash", JOBS / "slurm_train.sbatch", *EXAMPLE_ARGS], env={**env, **fake},
                  timeout=RUN_TIMEOUT, cwd=tmp_path)
    assert "launcher mpirun" in out, out[-4000:]
    assert_trained(rc, out)


# ---- slow: a real local Slurm -----------------------------------------------------------------

def _slurm_installed() -> bool:
    path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
    return all(shutil.which(b, path=path) for b in ("slurmctld", "slurmd", "sbatch", "srun", "munged"))


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_sbatch_through_local_slurm(env: dict[str, str]) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: mpi_jobs/local_slurm.sh runs munged, slurmctld and slurmd as root "
                    "(and may apt-get install slurm-wlm munge)")
    if not _slurm_installed():
        rc, out = run(["bash", JOBS / "local_slurm.sh", "install"], env=env, timeout=300)
        if rc != 0 or not _slurm_installed():
            pytest.skip(f"Slurm not installable here (local_slurm.sh install, exit {rc}): {out[-1500:]}")
    # short path: munged's unix socket lives in it (108-byte limit)
    cluster = Path(tempfile.mkdtemp(prefix="hvdfc-slurm-", dir="/tmp"))
    slurm_env = {**env, "SLURM_CONF": str(cluster / "slurm.conf")}
    try:
        rc, out = run(["bash", JOBS / "local_slurm.sh", "up", cluster], env=env, timeout=150)
        assert rc == 0, f"local Slurm did not start:\n{out[-4000:]}"
        rc, plugins = run(["srun", "--mpi=list"], env=slurm_env, timeout=30)
        expected = "srun" if re.search(r"^\s*pmix\s*$", plugins, re.M) else "mpirun"
        job_out = cluster / "job.out"

        def job_text() -> str:
            return job_out.read_text(errors="replace") if job_out.exists() else "(no output file)"

        def job_state() -> str:
            r = subprocess.run(["scontrol", "show", "job"], env=slurm_env, capture_output=True, text=True,
                               timeout=30)
            state = "\n".join(ln for ln in r.stdout.splitlines() if "JobState" in ln or "TRES" in ln)
            return f"\nscontrol show job:\n{state}\njob output so far:\n{job_text()[-3000:]}"

        t0 = time.monotonic()
        rc, out = run(["sbatch", "--wait", f"--output={job_out}", JOBS / "slurm_train.sbatch", *EXAMPLE_ARGS],
                      env=slurm_env, timeout=SBATCH_TIMEOUT, cwd=REPO,
                      on_timeout=job_state)
        text = job_text()
        assert rc == 0, f"sbatch --wait exit {rc} after {time.monotonic() - t0:.0f} s:\n{out}\n{text[-4000:]}"
        assert f"launcher {expected}" in text, text[-4000:]
        assert_trained(0, text)
    finally:
        # always: stop the daemons (and any job processes left) and remove the directory
        in_flight = sys.exc_info()[1] is not None
        rc, out = run(["bash", JOBS / "local_slurm.sh", "down", cluster], env=env, timeout=90)
        if not in_flight:  # do not hide the test's own failure behind a teardown one
            assert rc == 0 and not cluster.exists(), f"teardown failed:\n{out}"
