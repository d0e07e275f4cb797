"""Parent side of the Flexible benchmarks: one emulator, one ``horovodrun`` job, many networks.

:func:`run_job` starts ``flexible_job.py`` on ``n`` emulated hosts (one rank per host, each in its
own network namespace) and plays the hand-shake described there: when rank 0 writes
``ready.<i>``, the network ``networks[i]`` is applied with ``Emulator.set_link`` (from the root
namespace) and ``go.<i>`` is written. Rank 0's progress lines are echoed; its records are returned.
Needs root (network namespaces); the emulator is always cleaned up (context manager).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any, Callable, Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from benchmarks.jobctl import job_env, read_records, tail, write_atomic  # noqa: E402
from hvd_flexcomm.netem import Emulator, LinkSpec  # noqa: E402

JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "flexible_job.py")

#: ResNet-18's parameter count (float32 gradient entries).
RESNET18_NUMEL = 11_689_512


def network(delay_ms: float, rate_mbit: Optional[float]) -> dict[str, Any]:
    """A network as the plan and the records carry it (JSON): delay, rate (None = unlimited)."""
    rate = "unlimited" if rate_mbit is None else (f"{rate_mbit / 1000:g} Gbit" if rate_mbit >= 1000
                                                  else f"{rate_mbit:g} Mbit")
    return {"delay_ms": float(delay_ms), "rate_mbit": None if rate_mbit is None else float(rate_mbit),
            "label": f"{delay_ms:g} ms / {rate}"}


def link_of(net: dict[str, Any]) -> LinkSpec:
    return LinkSpec(delay_ms=net["delay_ms"], rate_mbit=net["rate_mbit"])


class JobError(RuntimeError):
    """The job failed or timed out; ``records`` holds what rank 0 had written until then."""

    def __init__(self, message: str, records: list[dict[str, Any]]) -> None:
        super().__init__(message)
        self.records = records


def run_job(n: int, plan: dict[str, Any], networks: Sequence[dict[str, Any]], timeout_s: float,
            log_path: Optional[str] = None, on_line: Optional[Callable[[str], None]] = print,
            on_network: Optional[Callable[[int, dict], None]] = None) -> list[dict[str, Any]]:
    """Run ``plan`` (see ``flexible_job.py``) on ``n`` emulated hosts; return rank 0's records.

    ``networks[i]`` is applied when the job asks for network ``i`` (the first one is also the
    emulator's initial link). Raises :class:`JobError` (with the job's output tail, and the records
    written so far) if the job fails or ``timeout_s`` passes.
    """
    plan = {**plan, "networks": list(networks)}
    ctl = tempfile.mkdtemp(prefix="hfc-flexbench-")
    os.chmod(ctl, 0o777)
    log_file = log_path or os.path.join(ctl, "job.log")
    try:
        with open(os.path.join(ctl, "plan.json"), "w") as fh:
            json.dump(plan, fh)
        with Emulator(n_hosts=n, link=link_of(networks[0])) as emu:
            argv = emu.horovodrun_argv(n, [sys.executable, JOB, "--ctl", ctl], start_timeout_s=120)
            with open(log_file, "w") as log:
                proc = subprocess.Popen(argv, env={**job_env(), **emu.env()}, stdout=log,
                                        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        start_new_session=True, cwd=REPO)
            try:
                _play(emu, proc, ctl, networks, timeout_s, log_file, on_line, on_network)
            except RuntimeError as exc:
                raise JobError(str(exc), read_records(ctl)) from None
            finally:
                _stop(proc)
        return read_records(ctl)
    finally:
        shutil.rmtree(ctl, ignore_errors=True)


def _stop(proc: subprocess.Popen) -> None:
    """Stop the launcher: SIGTERM first (horovodrun then stops its ranks), SIGKILL after 10 s."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        proc.wait()


def _play(emu: Emulator, proc: subprocess.Popen, ctl: str, networks: Sequence[dict[str, Any]],
          timeout_s: float, log_file: str, on_line: Optional[Callable[[str], None]],
          on_network: Optional[Callable[[int, dict], None]]) -> None:
    deadline = time.monotonic() + timeout_s
    nxt = 0
    pos = 0
    while True:
        if on_line is not None:  # echo rank 0's progress lines
            with open(log_file, "rb") as fh:
                fh.seek(pos)
                chunk = fh.read()
            cut = chunk.rfind(b"\n") + 1
            pos += cut
            for line in chunk[:cut].decode(errors="replace").splitlines():
                if "[flexible_job]" in line:
                    on_line(line[line.index("[flexible_job]"):])
        rc = proc.poll()
        if rc is not None:
            if rc != 0 or not os.path.exists(os.path.join(ctl, "done")):
                raise RuntimeError(f"job failed (rc {rc}); output tail:\n{tail(log_file)}")
            break
        if nxt < len(networks) and os.path.exists(os.path.join(ctl, f"ready.{nxt}")):
            net = networks[nxt]
            emu.set_link(link_of(net))
            if on_network is not None:
                on_network(nxt, net)
            write_atomic(os.path.join(ctl, f"go.{nxt}"),
                         json.dumps({**net, "index": nxt, "applied_s": time.time()}))
            nxt += 1
            continue
        if time.monotonic() > deadline:
            raise RuntimeError(f"job timed out after {timeout_s:.0f} s; output tail:\n{tail(log_file)}")
        time.sleep(0.02)
