"""Command line: ``python -m hvd_flexcomm.netem {selftest,cleanup,horovod-demo}`` (root only).

``selftest`` builds a 2-host emulator and checks it against its configuration:

- RTT: first the base RTT ``b`` is measured with delay 0 (same rate); then, with the configured
  one-way delay ``d``, the median UDP RTT ``m`` (64-byte datagrams) must satisfy
  ``|m - (2*d + b)| <= tol * (2*d + b)``.
- throughput: the TCP payload rate ``t`` of one bulk transfer (``--seconds`` of sending, measured by
  the receiver from first to last byte) must satisfy ``|t - r| <= tol * r`` for the configured rate
  ``r`` (Mbit/s). With an unlimited rate it is only reported.

``tol`` is ``--tolerance`` (default 0.10). The exit status is 1 if a check fails.

``cleanup`` removes namespaces, ``/etc/netns`` dirs and temp dirs left by emulators whose process
is gone (``--all``: of every emulator, also live ones).

``horovod-demo`` runs ``horovodrun --gloo`` with 2 ranks across the emulator: a 25 MB allreduce at
``--rate-mbit`` vs unlimited, and a 4-byte allreduce at ``--delay-ms`` vs 0 ms; exit status 1
unless both limited runs are slower. ``--launcher mpirun`` uses Open MPI instead.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Optional

from . import namespaces
from .emulator import LAUNCHERS, Emulator
from .spec import LinkSpec


def _rate(text: str) -> Optional[float]:
    return None if text.lower() in ("none", "inf", "unlimited", "0") else float(text)


def selftest(delay_ms: float, rate_mbit: Optional[float], tolerance: float, count: int,
             seconds: float) -> int:
    """Measure a 2-host emulator against ``delay_ms``/``rate_mbit``; 0 if within ``tolerance``."""
    with Emulator(2, LinkSpec(delay_ms=0.0, rate_mbit=rate_mbit)) as emu:
        base = emu.measure_rtt_ms(0, 1, count=count)
        emu.set_link(LinkSpec(delay_ms=delay_ms, rate_mbit=rate_mbit))
        rtt = emu.measure_rtt_ms(0, 1, count=count)
        tput = emu.measure_throughput_mbit(0, 1, seconds=seconds)
        stats = emu.relay_stats()
    expect_rtt = 2 * delay_ms + base
    rtt_err = abs(rtt - expect_rtt) / expect_rtt
    rtt_ok = rtt_err <= tolerance
    print(f"link: {LinkSpec(delay_ms=delay_ms, rate_mbit=rate_mbit).describe()} each way")
    print(f"RTT: base (delay 0) {base:.3f} ms; configured 2*{delay_ms:g} + base = "
          f"{expect_rtt:.3f} ms; measured median {rtt:.3f} ms; error {100 * rtt_err:.1f}% "
          f"-> {'OK' if rtt_ok else 'FAIL'}")
    tput_ok = True
    if rate_mbit is None:
        print(f"throughput: configured unlimited; measured {tput:.1f} Mbit/s (not checked)")
    else:
        tput_err = abs(tput - rate_mbit) / rate_mbit
        tput_ok = tput_err <= tolerance
        print(f"throughput: configured {rate_mbit:g} Mbit/s; measured {tput:.1f} Mbit/s; "
              f"error {100 * tput_err:.1f}% -> {'OK' if tput_ok else 'FAIL'}")
    print(f"relay: {json.dumps({k: v for k, v in stats.items() if k != 'ok'})}")
    print(f"tolerance {100 * tolerance:g}%: {'PASS' if rtt_ok and tput_ok else 'FAIL'}")
    return 0 if rtt_ok and tput_ok else 1


def horovod_demo(delay_ms: float, rate_mbit: float, launcher: str, big_elements: int,
                 timeout_s: float) -> int:
    """Time 2-rank allreduces across the emulator; 0 if rate and delay both slow them down."""
    from .hvd_allreduce import run_job

    rows = []
    with Emulator(2) as emu:
        cases = [
            ("big", LinkSpec(), big_elements, 3),
            ("big", LinkSpec(rate_mbit=rate_mbit), big_elements, 3),
            ("tiny", LinkSpec(), 1, 20),
            ("tiny", LinkSpec(delay_ms=delay_ms), 1, 20),
        ]
        for kind, spec, elements, iters in cases:
            emu.set_link(spec)
            res = run_job(emu, 2, elements, iters, launcher=launcher, timeout_s=timeout_s)
            rows.append((kind, spec, res))
            print(f"{launcher} 2 ranks, allreduce {4 * elements / 1e6:.6g} MB over "
                  f"{spec.describe()}: median {1e3 * res['median_s']:.1f} ms "
                  f"(of {len(res['seconds'])}), correct={res['ok']}, job {res['wall_s']:.1f} s",
                  flush=True)
    big_ok = rows[1][2]["median_s"] > 1.5 * rows[0][2]["median_s"]
    tiny_ok = rows[3][2]["median_s"] > rows[2][2]["median_s"] + 2 * delay_ms / 1e3
    correct = all(r[2]["ok"] for r in rows)
    print(f"rate slows the big allreduce: {big_ok}; delay slows the tiny allreduce: {tiny_ok}; "
          f"results correct: {correct}")
    return 0 if big_ok and tiny_ok and correct else 1


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hvd_flexcomm.netem",
                                 description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("selftest", help="measure RTT and throughput against the configuration")
    p.add_argument("--delay-ms", type=float, default=5.0, help="one-way delay, ms (default 5)")
    p.add_argument("--rate-mbit", type=_rate, default=100.0,
                   help="rate in Mbit/s, or 'none' for unlimited (default 100)")
    p.add_argument("--tolerance", type=float, default=0.10, help="relative (default 0.10)")
    p.add_argument("--count", type=int, default=20, help="RTT samples (default 20)")
    p.add_argument("--seconds", type=float, default=2.0, help="bulk transfer, s (default 2)")
    p = sub.add_parser("cleanup", help="remove leftovers of emulators")
    p.add_argument("--all", action="store_true", help="also of emulators still running")
    p = sub.add_parser("horovod-demo", help="time allreduces under rate and delay")
    p.add_argument("--delay-ms", type=float, default=5.0)
    p.add_argument("--rate-mbit", type=float, default=100.0)
    p.add_argument("--launcher", choices=LAUNCHERS, default="horovodrun")
    p.add_argument("--big-elements", type=int, default=6_553_600,
                   help="float32 entries of the big allreduce (default 6553600 = 26.2 MB)")
    p.add_argument("--timeout-s", type=float, default=300.0, help="per job")
    a = ap.parse_args(argv)
    if a.cmd == "selftest":
        return selftest(a.delay_ms, a.rate_mbit, a.tolerance, a.count, a.seconds)
    if a.cmd == "cleanup":
        removed = namespaces.cleanup_leftovers(all_owners=a.all)
        for r in removed:
            print(f"removed {r}")
        print(f"{len(removed)} removed")
        return 0
    return horovod_demo(a.delay_ms, a.rate_mbit, a.launcher, a.big_elements, a.timeout_s)


if __name__ == "__main__":
    sys.exit(main())
