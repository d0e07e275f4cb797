"""Parent side of the Flexible benchmarks: one emulator, one ``horovodrun`` job, many networks.

:func:`run_job` starts ``flexible_job.py`` on ``n`` emulated hosts (one rank per host, each in its
own network namespace) and plays the hand-shake described there: when rank 0 writes
``ready.<i>``, the network ``networks[i]`` is applied with ``Emulator.set_link`` (from the root
namespace) and ``go.<i>`` is written. Rank 0's progress lines are echoed; its records are returned.
Needs root (network namespaces); the emulator is always cleaned up (context manager).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any, Callable, Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from benchmarks.jobctl import (  # noqa: E402, F401 - network, parse_*, *_options, options_text: for the drivers
    check_mode_options,
    control_dir,
    follow_job,
    link_of,
    network,
    options_text,
    parse_option,
    parse_rate,
    read_records,
    start_in_emulator,
    stop,
)
from hvd_flexcomm.netem import Emulator  # noqa: E402

JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "flexible_job.py")

#: ResNet-18's parameter count (float32 gradient entries).
RESNET18_NUMEL = 11_689_512


class JobError(RuntimeError):
    """The job failed or timed out; ``records`` holds what rank 0 had written until then."""

    def __init__(self, message: str, records: list[dict[str, Any]]) -> None:
        super().__init__(message)
        self.records = records


def paired_networks(ap: argparse.ArgumentParser, latency_ms: Sequence[float],
                    rates: Sequence[Optional[float]]) -> list[dict[str, Any]]:
    """The networks of a diagnostic's ``--latency-ms`` and ``--bandwidth`` (Mbit/s, None for
    no limit), paired by position, or one rate for every latency; any other count of rates
    stops the program with ``ap.error`` naming both options."""
    if len(rates) == 1:
        rates = list(rates) * len(latency_ms)
    if len(rates) != len(latency_ms):
        ap.error(f"--bandwidth takes one rate, or one per --latency-ms ({len(latency_ms)}), "
                 f"got {len(rates)}")
    return [network(d, b) for d, b in zip(latency_ms, rates)]


def write_report(out: str, stem: str, payload: dict[str, Any], text: str) -> None:
    """Write ``payload`` to ``out/stem.json`` and the markdown ``text`` to ``out/stem.md``
    (creating ``out``), and print the markdown."""
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, stem + ".json"), "w") as fh:
        json.dump(payload, fh, indent=1)
    with open(os.path.join(out, stem + ".md"), "w") as fh:
        fh.write(text)
    print(text)


def run_job(n: int, plan: dict[str, Any], networks: Sequence[dict[str, Any]], timeout_s: float,
            log_path: Optional[str] = None, on_line: Optional[Callable[[str], None]] = print,
            on_network: Optional[Callable[[int, dict], None]] = None) -> list[dict[str, Any]]:
    """Run ``plan`` (see ``flexible_job.py``) on ``n`` emulated hosts; return rank 0's records.

    ``networks[i]`` is applied when the job asks for network ``i`` (the first one is also the
    emulator's initial link). Raises :class:`JobError` (with the job's output tail, and the records
    written so far) if the job fails or ``timeout_s`` passes.
    """
    with control_dir("hfc-flexbench-", {**plan, "networks": list(networks)}) as ctl:
        log_file = log_path or os.path.join(ctl, "job.log")
        with Emulator(n_hosts=n, link=link_of(networks[0])) as emu:
            proc = start_in_emulator(emu, n, JOB, ctl, log_file)
            try:
                error = follow_job(proc, ctl, log_file, timeout_s, "[flexible_job]", emu, networks,
                                   on_line=on_line, on_network=on_network)
            finally:
                stop(proc)
            if error:
                raise JobError(error, read_records(ctl))
        return read_records(ctl)
