"""Launch helpers shared by ``bench_synthetic.py --sweep`` and ``bench_table6.py``.

A *network* is a small JSON-able dict: ``{"kind": "loopback"}`` (plain ``horovodrun --gloo -H
localhost:N`` in the root namespace, no emulator) or ``{"kind": "emulated", "delay_ms": d,
"rate_mbit": r}`` (one rank per namespace of :class:`hvd_flexcomm.netem.Emulator`; ``r = None`` is
an unlimited rate). :func:`run_job` runs one ``horovodrun`` job on one network, echoes rank 0's
lines (prefixed by horovodrun with ``[0]<stdout>:``) and returns the exit status; the output goes
to a log file as well.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any, Callable, Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from benchmarks.jobctl import job_env  # noqa: E402

VENV_BIN = os.path.dirname(os.path.abspath(sys.executable))


def loopback() -> dict[str, Any]:
    return {"kind": "loopback", "delay_ms": 0.0, "rate_mbit": None, "label": "loopback"}


def emulated(rate_mbit: Optional[float], delay_ms: float = 1.0) -> dict[str, Any]:
    if rate_mbit is None:
        rate = "unlimited"
    elif rate_mbit >= 1000:
        rate = f"{rate_mbit / 1000:g} Gbit"
    else:
        rate = f"{rate_mbit:g} Mbit"
    return {"kind": "emulated", "delay_ms": float(delay_ms),
            "rate_mbit": None if rate_mbit is None else float(rate_mbit),
            "label": f"{rate}, {delay_ms:g} ms"}


def parse_network(text: str, delay_ms: float) -> dict[str, Any]:
    """``loopback`` | ``unlimited`` (emulated, no rate limit) | a rate in Mbit/s (``100``, ``1000``)."""
    t = text.strip().lower()
    if t in ("loopback", "lo", "local"):
        return loopback()
    if t in ("unlimited", "inf", "none"):
        return emulated(None, delay_ms)
    if t.endswith("gbit"):
        return emulated(1000.0 * float(t[:-4]), delay_ms)
    if t.endswith("mbit"):
        t = t[:-4]
    return emulated(float(t), delay_ms)


def loadavg() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def netns_available() -> Optional[str]:
    """None if the emulator can run here, else the reason it cannot."""
    from hvd_flexcomm.netem import namespaces

    return namespaces.require_root_and_iproute()


def horovodrun_loopback_argv(n: int, script_argv: Sequence[str], start_timeout_s: int = 120) -> list[str]:
    return [os.path.join(VENV_BIN, "horovodrun"), "--gloo", "-np", str(n), "-H", f"localhost:{n}",
            "--start-timeout", str(start_timeout_s), *script_argv]


def _rank0_line(line: str) -> Optional[str]:
    """The text of a rank-0 line (horovodrun prefixes ``[i]<stdout>:``), None for other ranks."""
    if line.startswith("["):
        head, sep, rest = line.partition(">:")
        if not sep:
            return line
        if head.startswith("[0]<"):
            return rest
        return None
    return line


def run_job(argv: Sequence[str], env: dict[str, str], timeout_s: float, log_path: str,
            on_line: Optional[Callable[[str], None]] = print) -> tuple[int, float]:
    """Run ``argv`` (a horovodrun command line) to completion; ``(exit status, seconds)``.

    Output goes to ``log_path``; rank 0's lines are passed to ``on_line``. On timeout the whole
    process group is killed and the status is 124.
    """
    t0 = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(list(argv), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True, cwd=REPO, text=True,
                                errors="replace", bufsize=1)
        timed_out = threading.Event()

        def watchdog() -> None:
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                timed_out.set()
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

        th = threading.Thread(target=watchdog, daemon=True)
        th.start()
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                log.write(line)
                log.flush()
                text = _rank0_line(line.rstrip("\n"))
                if text is not None and on_line is not None and text.strip():
                    on_line(text)
            rc = proc.wait()
        finally:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()
            else:
                # horovodrun is gone; make sure no rank of its group is left behind
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
    if timed_out.is_set():
        rc = 124
    return rc, time.monotonic() - t0


class NetworkRunner:
    """Runs jobs on a sequence of networks with ``n`` ranks, reusing one emulator for every emulated
    network (``Emulator.set_link`` between them). Use as a context manager."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.emu: Any = None

    def __enter__(self) -> NetworkRunner:
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.emu is not None:
            self.emu.close()
            self.emu = None

    def argv_env(self, net: dict[str, Any], script_argv: Sequence[str]) -> tuple[list[str], dict[str, str]]:
        """Command line and environment of one job of ``script_argv`` on ``net`` (applies it)."""
        if net["kind"] == "loopback":
            return horovodrun_loopback_argv(self.n, script_argv), job_env(VENV_BIN)
        from hvd_flexcomm.netem import Emulator, LinkSpec

        spec = LinkSpec(delay_ms=net["delay_ms"], rate_mbit=net["rate_mbit"])
        if self.emu is None:
            self.emu = Emulator(n_hosts=self.n, link=spec)
        else:
            self.emu.set_link(spec)
        argv = self.emu.horovodrun_argv(self.n, list(script_argv), start_timeout_s=120)
        return argv, {**job_env(VENV_BIN), **self.emu.env()}


def rerender(json_path: str, render: Any) -> int:
    """``--render``: load a saved result and write its summary and plots again, next to it."""
    with open(json_path) as fh:
        result = json.load(fh)
    render(result, os.path.dirname(os.path.abspath(json_path)))
    return 0
