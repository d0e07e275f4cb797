"""Plumbing shared by the benchmark drivers and the Horovod jobs they launch.

A driver writes ``plan.json`` into a control directory, launches a job (``horovodrun`` on
loopback or inside the network emulator) with :func:`job_env`, and reads back what the job's
rank 0 appended to ``results.jsonl`` (one JSON record per line) with :func:`read_records`. A job
finds its plan with :func:`job_plan`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Callable, Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: The records a job's rank 0 appends, one JSON object per line, in the control directory.
RECORDS = "results.jsonl"


def flexible_mode(settings: dict[str, Any], cr: float) -> Any:
    """The optimizer mode a Flexible benchmark's plan describes: ``Flexible(cr=cr,
    **flex_options)``, or, with ``adaptive_options`` in ``settings``, ``Adaptive(cr=cr,
    **flex_options, **adaptive_options)`` (``cr``: its CR until the first solve). One place for
    the job, which trains with it, and the driver, which re-solves with the same settings."""
    import hvd_flexcomm

    flex = settings.get("flex_options") or {}
    if settings.get("adaptive_options") is not None:
        return hvd_flexcomm.Adaptive(cr=cr, **flex, **settings["adaptive_options"])
    return hvd_flexcomm.Flexible(cr=cr, **flex)


#: glibc malloc settings that keep the memory a rank frees inside the rank (no ``munmap`` of large
#: blocks, no trim of the heap's top), so that the next allocation reuses pages already mapped.
#: On this VM a page handed back to the kernel costs a slow fault the next time it is touched
#: (``benchmarks/bench_page_faults.py``: 256 MB allocated and written 27x slower than from a
#: heap that kept it). It was a suspect for the stalled steps and not their cause (those were
#: CPU starvation, ``docs/performance/stalls.md``); it stays to keep that cost out of the steps.
KEEP_FREED_MEMORY = {"MALLOC_MMAP_THRESHOLD_": str(1 << 34), "MALLOC_TRIM_THRESHOLD_": str(1 << 34)}
#: Set to ``0`` in a driver's environment to launch jobs with glibc's default malloc settings.
KEEP_FREED_MEMORY_ENV = "HVD_FLEXCOMM_BENCH_KEEP_FREED_MEMORY"


def keep_freed_memory() -> bool:
    """Whether launched jobs get :data:`KEEP_FREED_MEMORY` (default yes; ``0`` in
    :data:`KEEP_FREED_MEMORY_ENV` turns it off)."""
    return os.environ.get(KEEP_FREED_MEMORY_ENV, "1") != "0"


def job_env(venv_bin: Optional[str] = None) -> dict[str, str]:
    """The environment of a launched job: this repository importable first, one compute thread
    per rank (ranks share 2 cores), Horovod's warnings only, ``venv_bin`` first on PATH, and
    (unless turned off, see :func:`keep_freed_memory`) freed memory kept in each rank
    (:data:`KEEP_FREED_MEMORY`; values already in the environment win)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([REPO, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["OMP_NUM_THREADS"] = "1"
    if keep_freed_memory():
        for name, value in KEEP_FREED_MEMORY.items():
            env.setdefault(name, value)
    if venv_bin:
        env["PATH"] = os.pathsep.join([venv_bin, env.get("PATH", "/usr/bin:/bin")])
    env.setdefault("HOROVOD_LOG_LEVEL", "warning")
    return env


def append_record(ctl: str, record: dict[str, Any]) -> None:
    """Append one record to the control directory's :data:`RECORDS` (rank 0 only calls it)."""
    with open(os.path.join(ctl, RECORDS), "a") as fh:
        fh.write(json.dumps(record) + "\n")


def read_records(ctl: str) -> list[dict[str, Any]]:
    """Every record the job wrote so far (an empty list before the first)."""
    path = os.path.join(ctl, RECORDS)
    if not os.path.exists(path):
        return []
    with open(path) as fh:
        return [json.loads(line) for line in fh if line.strip()]


def tail(path: str, n: int = 4000) -> str:
    """The last ``n`` characters of a log file ("" if it cannot be read)."""
    try:
        with open(path, errors="replace") as fh:
            return fh.read()[-n:]
    except OSError:
        return ""


def job_plan(description: str, argv: Optional[list[str]] = None) -> tuple[str, dict[str, Any]]:
    """A job's ``--ctl`` directory and the ``plan.json`` its driver wrote there."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--ctl", required=True, help="control directory shared with the parent")
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    with open(os.path.join(args.ctl, "plan.json")) as fh:
        return args.ctl, json.load(fh)


def write_atomic(path: str, text: str) -> None:
    """Write ``text`` so that a reader polling for ``path`` never sees it half-written."""
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


#: How often the two sides of the network hand-shake poll for each other's file (s).
POLL_S = 0.01


def parse_rate(text: str) -> Optional[float]:
    """A link rate from the command line (Mbit/s): a number, or ``inf`` / ``unlimited`` /
    ``none`` for no limit (None)."""
    if text.lower() in ("inf", "unlimited", "none"):
        return None
    rate = float(text)
    if not rate > 0:
        raise ValueError(f"a link rate must be > 0 Mbit/s or 'inf', got {text!r}")
    return rate


def parse_option(text: str) -> tuple[str, Any]:
    """``OPTION=VALUE`` from the command line (a compression mode's option): the value read as
    JSON (numbers, true/false), else as a string. Pure function; a ValueError names the text
    without ``=``."""
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise ValueError(f"expected OPTION=VALUE, got {text!r}")
    try:
        return name, json.loads(value)
    except json.JSONDecodeError:
        return name, value


def options_text(options: dict[str, Any], sep: str = " ") -> str:
    """Options as the command line gave them: ``OPTION=VALUE`` items joined by ``sep``."""
    return sep.join(f"{k}={v}" for k, v in options.items())


def check_mode_options(mode_cls: Callable[..., Any], options: dict[str, Any], what: str) -> None:
    """Build ``mode_cls(**options)`` once in the driver, so that a bad option is refused before
    any job starts rather than on every rank: a ValueError that starts with ``what`` and says
    what the mode refused (an unknown option or a bad value)."""
    try:
        mode_cls(**options)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{what}: {exc}") from exc


def network(delay_ms: float, rate_mbit: Optional[float]) -> dict[str, Any]:
    """A network as plans and records carry it (JSON): one-way delay (ms), rate (Mbit/s; None =
    unlimited) and a label."""
    rate = "unlimited" if rate_mbit is None else (f"{rate_mbit / 1000:g} Gbit" if rate_mbit >= 1000
                                                  else f"{rate_mbit:g} Mbit")
    return {"delay_ms": float(delay_ms), "rate_mbit": None if rate_mbit is None else float(rate_mbit),
            "label": f"{delay_ms:g} ms / {rate}"}


def link_of(net: dict[str, Any]) -> Any:
    """The emulator's ``LinkSpec`` of a network made by :func:`network`."""
    from hvd_flexcomm.netem import LinkSpec

    return LinkSpec(delay_ms=net["delay_ms"], rate_mbit=net["rate_mbit"])


def request_network(ctl: str, index: int) -> None:
    """Rank 0 of a job: ask the driver to put network ``index`` of the plan in force
    (``ready.<index>``); returns at once (see :func:`applied_network`, :func:`await_network`)."""
    write_atomic(os.path.join(ctl, f"ready.{index}"), "{}")


def applied_network(ctl: str, index: int) -> Optional[dict[str, Any]]:
    """Network ``index`` as the driver applied it (``go.<index>``, written by
    :func:`serve_network_request`, with ``applied_s``, the driver's ``time.time()``), or None
    while it has not."""
    go = os.path.join(ctl, f"go.{index}")
    if not os.path.exists(go):
        return None
    with open(go) as fh:
        return json.load(fh)


def await_network(ctl: str, index: int, timeout_s: float = 600.0) -> dict[str, Any]:
    """Rank 0 of a job: request network ``index`` and return once it is in force (the applied
    network, see :func:`applied_network`). The other ranks must wait for rank 0 (e.g. in a
    broadcast of the result)."""
    request_network(ctl, index)
    deadline = time.monotonic() + timeout_s
    while (net := applied_network(ctl, index)) is None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the driver did not apply network {index} within {timeout_s:g} s")
        time.sleep(POLL_S)
    return net


def mark_done(ctl: str) -> None:
    """Rank 0, at the very end of a job: tell the driver that every record is written."""
    write_atomic(os.path.join(ctl, "done"), "{}")


def end_job(hvd: Any, ctl: str, say: Any) -> int:
    """The end of every job: wait for all ranks, let rank 0 mark the records complete, shut
    Horovod down. Returns the process exit code (0)."""
    import torch

    hvd.allreduce(torch.zeros(1), name="jobctl.end")
    if hvd.rank() == 0:
        mark_done(ctl)
    say("done")
    hvd.shutdown()
    return 0


# -- the driver's side -----------------------------------------------------------------------------


@contextmanager
def control_dir(prefix: str, plan: dict[str, Any]) -> Iterator[str]:
    """A fresh control directory holding ``plan.json`` (readable by the ranks, which may run as
    another user inside the emulator's namespaces); removed afterwards."""
    ctl = tempfile.mkdtemp(prefix=prefix)
    os.chmod(ctl, 0o777)
    try:
        with open(os.path.join(ctl, "plan.json"), "w") as fh:
            json.dump(plan, fh)
        yield ctl
    finally:
        shutil.rmtree(ctl, ignore_errors=True)


def start_in_emulator(emu: Any, n: int, job_script: str, ctl: str,
                      log_path: str, launcher: str = "horovodrun") -> subprocess.Popen:
    """Launch ``job_script --ctl ctl`` on ``n`` hosts of the network emulator ``emu`` through
    ``horovodrun --gloo`` or Open MPI's ``mpirun`` (``launcher``; its own process group), output
    to ``log_path``."""
    argv = emu.launcher_argv(launcher, n, [sys.executable, job_script, "--ctl", ctl],
                             start_timeout_s=120)
    with open(log_path, "w") as log:
        return subprocess.Popen(argv, env={**job_env(), **emu.env()}, stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, cwd=REPO)


def serve_network_request(emu: Any, ctl: str, networks: Sequence[dict[str, Any]], nxt: int) -> int:
    """The driver's side of :func:`await_network`: if the job asked for network ``nxt``, put
    ``networks[nxt]`` in force on every link of ``emu`` and answer; returns the index of the next
    network to wait for (``nxt`` again if no request was pending)."""
    if nxt >= len(networks) or not os.path.exists(os.path.join(ctl, f"ready.{nxt}")):
        return nxt
    net = networks[nxt]
    emu.set_link(link_of(net))
    write_atomic(os.path.join(ctl, f"go.{nxt}"),
                 json.dumps({**net, "index": nxt, "applied_s": time.time()}))
    return nxt + 1


def follow_job(proc: subprocess.Popen, ctl: str, log_path: str, timeout_s: float, tag: str,
               emu: Any, networks: Sequence[dict[str, Any]], first: int = 0,
               on_line: Optional[Callable[[str], None]] = print,
               on_network: Optional[Callable[[int, dict], None]] = None,
               poll_s: float = 0.02) -> Optional[str]:
    """The driver's loop while a job runs: pass rank 0's progress lines (those holding ``tag``)
    to ``on_line``, serve the job's requests for ``networks[first:]`` in order
    (:func:`serve_network_request`; ``on_network(i, network)`` after each), until the job ends.
    Returns None when it exited 0 after :func:`mark_done`, else the error text (failure or
    ``timeout_s`` passed, with the output tail)."""
    deadline = time.monotonic() + timeout_s
    progress = TaggedLines(log_path, tag)
    nxt = first
    while True:
        if on_line is not None:
            for line in progress.read():
                on_line(line)
        rc = proc.poll()
        if rc is not None:
            return failure(rc, ctl, log_path)
        applied = serve_network_request(emu, ctl, networks, nxt)
        if applied > nxt:
            if on_network is not None:
                on_network(nxt, networks[nxt])
            nxt = applied
            continue
        if time.monotonic() > deadline:
            return timed_out(timeout_s, log_path)
        time.sleep(poll_s)


def stop(proc: subprocess.Popen) -> None:
    """Stop a launcher: SIGTERM first (horovodrun then stops its ranks), SIGKILL after 10 s."""
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


class TaggedLines:
    """The complete lines a growing log gained since the last :meth:`read` that hold ``tag``
    (each from the tag on: rank 0's progress lines, without the launcher's prefix)."""

    def __init__(self, path: str, tag: str) -> None:
        self.path, self.tag, self.pos = path, tag, 0

    def read(self) -> list[str]:
        with open(self.path, "rb") as fh:
            fh.seek(self.pos)
            chunk = fh.read()
        cut = chunk.rfind(b"\n") + 1
        self.pos += cut
        return [line[line.index(self.tag):]
                for line in chunk[:cut].decode(errors="replace").splitlines() if self.tag in line]


def failure(rc: int, ctl: str, log_path: str) -> Optional[str]:
    """Why a job that exited with ``rc`` failed (None: it exited 0 after :func:`mark_done`)."""
    if rc != 0 or not os.path.exists(os.path.join(ctl, "done")):
        return f"job failed (rc {rc}); output tail:\n{tail(log_path)}"
    return None


def timed_out(timeout_s: float, log_path: str) -> str:
    return f"job timed out after {timeout_s:.0f} s; output tail:\n{tail(log_path)}"
