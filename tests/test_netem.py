"""Tests of the network emulator :mod:`hvd_flexcomm.netem` (root, namespaces, TUN; ~1 minute).

The emulator tests need root, iproute2 and ``/dev/net/tun`` and skip with the reason otherwise; the
Horovod test also needs ``horovodrun`` next to this interpreter. Two small tests (LinkSpec checks,
the ``ssh`` stand-in's argument parsing) run anywhere.
"""

from __future__ import annotations

import os
import shutil
import signal
import statistics
import subprocess
import sys
import textwrap
import time

import pytest

from hvd_flexcomm.netem import Emulator, LinkSpec, launch, namespaces

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_NO_NETNS = namespaces.require_root_and_iproute()
needs_netns = pytest.mark.skipif(_NO_NETNS is not None, reason=f"emulator {_NO_NETNS}")


def _netns_names() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def _assert_gone(nss: list[str], tmpdir: str | None) -> None:
    left = _netns_names() & set(nss)
    assert not left, f"namespaces left behind: {left}"
    for ns in nss:
        assert not os.path.exists(os.path.join("/etc/netns", ns)), ns
    if tmpdir is not None:
        assert not os.path.exists(tmpdir), tmpdir


@pytest.fixture(scope="module")
def emu():
    if _NO_NETNS is not None:
        pytest.skip(f"emulator {_NO_NETNS}")
    with Emulator(n_hosts=2, link=LinkSpec()) as e:
        yield e


# -- anywhere --------------------------------------------------------------------------------------


@pytest.mark.timeout(10)
def test_linkspec_validates_and_converts_units():
    spec = LinkSpec(delay_ms=5.0, rate_mbit=100.0, queue_ms=50.0)
    assert spec.to_message() == {"delay_s": 0.005, "rate_bps": 100e6, "queue_s": 0.05,
                                 "loss": 0.0, "jitter_s": 0.0}
    assert LinkSpec().to_message()["rate_bps"] is None
    for bad in ({"delay_ms": -1.0}, {"rate_mbit": 0.0}, {"queue_ms": 0.0}):
        with pytest.raises(ValueError):
            LinkSpec(**bad)


@pytest.mark.timeout(20)
def test_ssh_standin_parses_horovod_and_mpirun_calls(tmp_path):
    """The stand-in must find the host among ssh options (before and after it) and hand the
    command to ``ip netns exec NS bash -c``; a fake ``ip`` prints what it was given."""
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "ip").write_text('#!/bin/bash\nfor a in "$@"; do echo "[$a]"; done\n')
    (fake / "ip").chmod(0o755)
    ssh = launch.write_ssh_standin(str(tmp_path / "bin"), ["10.9.9.1", "10.9.9.2"],
                                   ["nsA", "nsB"], "test")
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"}

    def call(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([ssh, *args], env=env, capture_output=True, text=True, timeout=10)

    # horovodrun: ssh -o .. -o .. HOST -p PORT -i FILE -o ConnectTimeout=T 'COMMAND'
    r = call("-o", "PasswordAuthentication=no", "-o", "StrictHostKeyChecking=no", "10.9.9.2",
             "-p", "22", "-i", "/k", "-o", "ConnectTimeout=5", "cd /x > /dev/null 2>&1 ; echo hi")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:6] == ["[netns]", "[exec]", "[nsB]", "[bash]", "[-c]",
                                        "[cd /x > /dev/null 2>&1 ; echo hi]"]
    # mpirun rsh agent: agent [-x] HOST orted arg arg ... (joined with spaces, like ssh)
    r = call("-x", "root@10.9.9.1", "orted", "-mca", "ess", "env")
    assert r.returncode == 0, r.stderr
    assert "[nsA]" in r.stdout and "[orted -mca ess env]" in r.stdout
    r = call("nsB", "true")
    assert "[nsB]" in r.stdout
    r = call("-o", "A=b", "10.0.0.77", "true")
    assert r.returncode == 255 and "unknown host" in r.stderr


# -- emulated network ------------------------------------------------------------------------------


@pytest.mark.root
@pytest.mark.slow
@needs_netns
@pytest.mark.timeout(60)
def test_rtt_follows_delay_within_10_percent(emu):
    emu.set_link(LinkSpec(delay_ms=0.0))
    base = emu.measure_rtt_ms(0, 1, count=20)
    emu.set_link(LinkSpec(delay_ms=5.0))
    rtt = emu.measure_rtt_ms(0, 1, count=20)
    expect = 2 * 5.0 + base
    assert rtt >= 10.0, f"RTT {rtt:.3f} ms is below 2 x 5 ms: delay not applied"
    assert abs(rtt - expect) <= 0.10 * expect, f"RTT {rtt:.3f} ms, expected {expect:.3f} ms"
    # the reverse direction gets the same delay
    back = emu.measure_rtt_ms(1, 0, count=10)
    assert abs(back - expect) <= 0.10 * expect, f"RTT 1->0 {back:.3f} ms, expected {expect:.3f}"


@pytest.mark.root
@pytest.mark.slow
@needs_netns
@pytest.mark.timeout(60)
def test_throughput_follows_rate_within_10_percent(emu):
    emu.set_link(LinkSpec(delay_ms=1.0, rate_mbit=100.0))
    mbit = emu.measure_throughput_mbit(0, 1, seconds=2.0)
    assert abs(mbit - 100.0) <= 10.0, f"measured {mbit:.1f} Mbit/s at 100 Mbit/s"
    emu.set_link(LinkSpec(delay_ms=1.0, rate_mbit=50.0))
    mbit = emu.measure_throughput_mbit(1, 0, seconds=2.0)
    assert abs(mbit - 50.0) <= 5.0, f"measured {mbit:.1f} Mbit/s at 50 Mbit/s"


@pytest.mark.root
@pytest.mark.slow
@needs_netns
@pytest.mark.timeout(60)
def test_host_counters_see_the_losses_of_a_short_queue(emu):
    # a 1 ms drop-tail queue at 20 Mbit/s holds under two full-size packets: a bulk TCP transfer
    # overflows it, and the sender's kernel retransmits what the relay dropped
    emu.set_link(LinkSpec(delay_ms=2.0, rate_mbit=20.0))
    before, relay_before = emu.host_counters(), emu.relay_stats()
    emu.set_link(LinkSpec(delay_ms=2.0, rate_mbit=20.0, queue_ms=1.0))
    emu.measure_throughput(0, 1, seconds=1.0)
    after, relay_after = emu.host_counters(), emu.relay_stats()
    emu.set_link(LinkSpec(delay_ms=1.0))
    assert len(after) == 2 and all(set(h) == {"retrans_segs", "tcp_timeouts", "tun_tx_dropped"}
                                   for h in after), after
    dropped = relay_after["dropped_queue"] - relay_before["dropped_queue"]
    resent = after[0]["retrans_segs"] - before[0]["retrans_segs"]
    assert dropped > 0, relay_after
    assert resent > 0, f"the sender retransmitted nothing after {dropped} queue drops: {after}"
    assert all(a[k] >= b[k] for a, b in zip(after, before) for k in a), (before, after)


def test_parse_host_counters_reads_snmp_netstat_and_tx_dropped():
    text = textwrap.dedent("""\
        Ip: Forwarding DefaultTTL InReceives
        Ip: 1 64 100
        Tcp: RtoAlgorithm RtoMin RtoMax MaxConn ActiveOpens RetransSegs InErrs
        Tcp: 1 200 120000 -1 19 37 0
        Udp: InDatagrams NoPorts
        Udp: 5 0
        TcpExt: SyncookiesSent TCPTimeouts TCPLossProbes
        TcpExt: 0 4 9
        IpExt: InNoRoutes InTruncatedPkts
        IpExt: 0 0
        12
        """)
    from hvd_flexcomm.netem.emulator import parse_host_counters

    assert parse_host_counters(text) == {"retrans_segs": 37, "tcp_timeouts": 4,
                                         "tun_tx_dropped": 12}
    with pytest.raises(ValueError, match="tx_dropped"):
        parse_host_counters(text.rsplit("12", 1)[0])


@pytest.mark.root
@pytest.mark.slow
@needs_netns
@pytest.mark.timeout(60)
def test_set_link_changes_delay_and_rate_mid_run(emu):
    # delay: 1 ms -> 10 ms one way while a ping series runs (schedule thread, 1 s in)
    emu.set_link(LinkSpec(delay_ms=1.0))
    n_log = len(emu.link_log)
    emu.apply_schedule([(1.0, LinkSpec(delay_ms=10.0))])
    rtts = emu.rtt_samples_ms(0, 1, count=60, gap_ms=20.0)
    assert len(emu.link_log) == n_log + 1 and emu.link.delay_ms == 10.0
    early, late = rtts[:5], rtts[-5:]
    assert statistics.median(early) < 5.0, f"before the change: {early}"
    assert 19.0 < statistics.median(late) < 25.0, f"after the change: {late}"

    # rate: 20 -> 100 Mbit/s during one TCP transfer (change 1.5 s in, 0.25 s bins)
    emu.set_link(LinkSpec(delay_ms=1.0, rate_mbit=20.0))
    emu.apply_schedule([(1.5, LinkSpec(delay_ms=1.0, rate_mbit=100.0))])
    res = emu.measure_throughput(0, 1, seconds=3.5, bin_s=0.25)
    tl = res["timeline_mbit"]
    early, late = tl[1:3], tl[9:13]
    assert len(tl) >= 13, tl
    assert 15.0 < statistics.median(early) < 25.0, f"at 20 Mbit/s: {early} (all {tl})"
    assert 75.0 < statistics.median(late) < 125.0, f"at 100 Mbit/s: {late} (all {tl})"


@pytest.mark.root
@pytest.mark.slow
@needs_netns
@pytest.mark.timeout(60)
def test_cleanup_leaves_nothing_also_after_exception():
    with Emulator(2, LinkSpec(delay_ms=1.0)) as e:
        nss, tmpdir, relay = list(e.namespaces), e.tmpdir, e._relay
        assert set(nss) <= _netns_names()
        assert all(os.path.exists(os.path.join("/etc/netns", ns, "hosts")) for ns in nss)
    _assert_gone(nss, tmpdir)
    assert relay is not None and relay.poll() is not None

    with pytest.raises(RuntimeError, match="boom"):
        with Emulator(3, LinkSpec(delay_ms=1.0)) as e:
            nss, tmpdir = list(e.namespaces), e.tmpdir
            sleeper = e.popen_in(2, ["sleep", "60"])
            raise RuntimeError("boom")
    _assert_gone(nss, tmpdir)
    assert sleeper.poll() is not None


@pytest.mark.root
@pytest.mark.slow
@needs_netns
@pytest.mark.timeout(60)
def test_cleanup_on_signals_and_cleanup_command():
    """SIGTERM or SIGINT to a process holding an emulator removes it (SIGINT still raises
    KeyboardInterrupt there); after SIGKILL the ``cleanup`` command removes it."""
    code = textwrap.dedent("""
        import sys, time
        from hvd_flexcomm.netem import Emulator
        e = Emulator(2)
        print(" ".join(e.namespaces), e.tmpdir, flush=True)
        try:
            time.sleep(60)
        except KeyboardInterrupt:
            print("KeyboardInterrupt", flush=True)
            raise
    """)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGKILL):
        p = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True)
        *nss, tmpdir = p.stdout.readline().split()
        assert set(nss) <= _netns_names()
        p.send_signal(sig)
        rest = p.communicate(timeout=30)[0]
        assert p.returncode != 0
        if sig == signal.SIGINT:
            assert "KeyboardInterrupt" in rest
        if sig == signal.SIGKILL:
            assert set(nss) <= _netns_names()  # nobody could clean up
            time.sleep(0.5)  # the orphaned relay sees end of file on stdin and exits
            r = subprocess.run([sys.executable, "-m", "hvd_flexcomm.netem", "cleanup"], cwd=REPO,
                               capture_output=True, text=True, timeout=60)
            assert r.returncode == 0, r.stderr
        _assert_gone(nss, tmpdir)


def _horovodrun_missing() -> str | None:
    if shutil.which("horovodrun", path=launch.venv_bin()) is None:
        return f"no horovodrun in {launch.venv_bin()}"
    try:
        import horovod.torch  # noqa: F401
    except Exception as exc:  # a broken build raises more than ImportError
        return f"horovod.torch does not import: {exc}"
    return None


@pytest.mark.root
@pytest.mark.slow
@needs_netns
@pytest.mark.timeout(180)
def test_horovodrun_gloo_allreduce_across_namespaces():
    missing = _horovodrun_missing()
    if missing:
        pytest.skip(missing)
    from hvd_flexcomm.netem.hvd_allreduce import run_job

    with Emulator(2, LinkSpec(delay_ms=5.0)) as e:
        before = e.relay_stats()["forwarded_packets"]
        res = run_job(e, np=2, elements=1000, iters=5, timeout_s=150)
        after = e.relay_stats()["forwarded_packets"]
    assert res["size"] == 2 and res["ok"], res
    # the ranks talked through the emulated link, and paid its round trip
    assert after - before > 20
    assert res["median_s"] >= 2 * 5.0e-3, res


@pytest.mark.root
@pytest.mark.slow
@needs_netns
@pytest.mark.timeout(120)
def test_mpirun_allreduce_across_namespaces():
    missing = _horovodrun_missing()
    if missing or shutil.which("mpirun") is None:
        pytest.skip(missing or "no mpirun on PATH")
    from hvd_flexcomm.netem.hvd_allreduce import run_job

    with Emulator(2, LinkSpec(delay_ms=5.0)) as e:
        before = e.relay_stats()["forwarded_packets"]
        res = run_job(e, np=2, elements=1000, iters=5, launcher="mpirun", timeout_s=100)
        after = e.relay_stats()["forwarded_packets"]
    assert res["size"] == 2 and res["ok"], res
    assert after - before > 20
    assert res["median_s"] >= 2 * 5.0e-3, res
