"""The :class:`Emulator`: N hosts, each a network namespace, joined by emulated links.

Layout (all names unique per emulator instance, see :mod:`.namespaces`)::

    ns hfc<pid>x<k>n0          root namespace                ns hfc<pid>x<k>n1
    [hfc0 10.231.J.1/24] <-TUN-> relay.py (delay, rate) <-TUN-> [hfc0 10.231.J.2/24]

Each namespace has ``lo`` up and one TUN interface of the same name (default ``hfc0``, MTU 1500
bytes) carrying the whole emulated subnet; the relay process in the root namespace holds every TUN
and forwards packets between them through per-direction links (:class:`~.spec.LinkSpec`). Nothing
is routed outside these namespaces: traffic only ever reaches the emulated hosts (or each host's
loopback).

The TUN interfaces do TCP segmentation and checksum offload by default: TCP sees an ordinary
1500-byte MTU (so congestion control behaves as on Ethernet), while the relay moves TCP
"super-packets" of up to 64 KiB and charges the link for every segment they stand for. This keeps a
Python relay fast enough for 1 Gbit/s links (measured here: ~4 Gbit/s unlimited). With
``offload=False`` every packet is one MTU; then use a large MTU (e.g. 65000) for speed, at the price
of TCP dynamics that are poor at low rates (a 64 KB packet takes 26 ms at 20 Mbit/s).

Cleanup is guaranteed on every path: :meth:`Emulator.close` (also from ``__exit__``, a failed
construction, ``atexit`` and SIGINT/SIGTERM handlers) kills what runs in the namespaces, stops the
relay, deletes the namespaces, their ``/etc/netns`` directories and the temporary directory.
"""

from __future__ import annotations

import atexit
import itertools
import json
import os
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from typing import Any, Optional

from . import launch, namespaces
from .spec import LinkSpec

__all__ = ["Emulator", "LAUNCHERS", "parse_host_counters"]

#: What :meth:`Emulator.launcher_argv` starts jobs with.
LAUNCHERS = ("horovodrun", "mpirun")

_HERE = os.path.dirname(os.path.abspath(__file__))
RELAY_SCRIPT = os.path.join(_HERE, "relay.py")
PROBE_SCRIPT = os.path.join(_HERE, "probe.py")

_instance_counter = itertools.count()
_live: set[Emulator] = set()
_live_lock = threading.RLock()  # re-entrant: signal handlers run on the main thread
_prev_handlers: dict[int, Any] = {}
_atexit_registered = False


def parse_host_counters(text: str) -> dict[str, int]:
    """The counters :meth:`Emulator.host_counters` reports, from ``/proc/net/snmp`` followed by
    ``/proc/net/netstat`` (pairs of a header line and a value line per protocol) and a last line
    holding the TUN interface's ``tx_dropped``."""
    lines = [line.split() for line in text.strip().splitlines() if line.strip()]
    table: dict[str, int] = {}
    for head, values in zip(lines, lines[1:]):
        numeric = all(v.lstrip("-").isdigit() for v in values[1:])
        if head[0] == values[0] and head[0].endswith(":") and numeric and not head[1].isdigit():
            for name, value in zip(head[1:], values[1:]):
                table[f"{head[0][:-1]}.{name}"] = int(value)
    if not lines or len(lines[-1]) != 1:
        raise ValueError(f"no tx_dropped line at the end of the counters: {text[-200:]!r}")
    return {"retrans_segs": table.get("Tcp.RetransSegs", 0),
            "tcp_timeouts": table.get("TcpExt.TCPTimeouts", 0),
            "tun_tx_dropped": int(lines[-1][0])}


def _close_all() -> None:
    for emu in list(_live):
        emu.close()


def _on_signal(signum: int, frame: Any) -> None:
    """Clean every live emulator up, then behave as the handler that was there before."""
    prev = _prev_handlers.get(signum, signal.SIG_DFL)
    _close_all()
    if callable(prev):
        prev(signum, frame)
    elif prev != signal.SIG_IGN:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def _register(emu: Emulator) -> None:
    global _atexit_registered
    with _live_lock:
        _live.add(emu)
        if not _atexit_registered:
            atexit.register(_close_all)
            _atexit_registered = True
        if threading.current_thread() is threading.main_thread() and not _prev_handlers:
            for sig in (signal.SIGINT, signal.SIGTERM):
                _prev_handlers[sig] = signal.getsignal(sig)
                signal.signal(sig, _on_signal)


def _unregister(emu: Emulator) -> None:
    with _live_lock:
        _live.discard(emu)
        if not _live and _prev_handlers and \
                threading.current_thread() is threading.main_thread():
            for sig, prev in _prev_handlers.items():
                if signal.getsignal(sig) is _on_signal:
                    signal.signal(sig, prev)
            _prev_handlers.clear()


class Emulator:
    """``n_hosts`` emulated hosts joined by links with delay ``link.delay_ms`` (ms, one way) and
    rate ``link.rate_mbit`` (Mbit/s per direction of each host pair, ``None`` = unlimited).

    Needs root, iproute2 and ``/dev/net/tun``. Use as a context manager; see the package docstring.

    Args:
        n_hosts: number of hosts (namespaces), 2..253.
        link: initial spec of every link.
        mtu: MTU of the TUN interfaces in bytes (TCP's segment size follows it).
        offload: TCP segmentation/checksum offload on the TUN interfaces (see the module doc).
        ifname: the interface name, identical in every namespace (<= 15 characters).
    """

    def __init__(self, n_hosts: int = 2, link: Optional[LinkSpec] = None, *, mtu: int = 1500,
                 offload: bool = True, ifname: str = "hfc0") -> None:
        if not 2 <= n_hosts <= 253:
            raise ValueError(f"n_hosts must be in 2..253, got {n_hosts}")
        if not 1 <= len(ifname) <= 15:
            raise ValueError(f"ifname must have 1..15 characters, got {ifname!r}")
        reason = namespaces.require_root_and_iproute()
        if reason is not None:
            raise RuntimeError(f"hvd_flexcomm.netem.Emulator {reason}")
        pid, k = os.getpid(), next(_instance_counter)
        self.tag = f"{namespaces.PREFIX}{pid}x{k}"
        self.ifname = ifname
        self.mtu = mtu
        self.offload = offload
        self.link = link if link is not None else LinkSpec()
        job = (pid * 31 + k) % 250 + 1
        #: IPv4 address of each host, ``10.231.<job>.<i+1>`` (a /24 only inside the namespaces).
        self.hosts: list[str] = [f"10.231.{job}.{i + 1}" for i in range(n_hosts)]
        #: Network namespace name of each host.
        self.namespaces: list[str] = [namespaces.namespace_name(pid, k, i) for i in range(n_hosts)]
        self.tmpdir: Optional[str] = None
        self._relay: Optional[subprocess.Popen] = None
        self._relay_buf = b""
        self._relay_lock = threading.Lock()
        self._procs: list[subprocess.Popen] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._closed = False
        self._ports = itertools.count(20000)
        #: ``(seconds since start, LinkSpec, src, dst)`` for every change applied.
        self.link_log: list[tuple[float, LinkSpec, Optional[int], Optional[int]]] = []
        self._t0 = time.monotonic()
        _register(self)
        try:
            self._setup()
        except BaseException:
            self.close()
            raise

    # -- lifecycle -----------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:  # closed by a signal handler while being built
            raise RuntimeError("emulator closed during setup")

    def _setup(self) -> None:
        self.tmpdir = tempfile.mkdtemp(prefix=f"{self.tag}-")
        for i, ns in enumerate(self.namespaces):
            self._check_open()
            namespaces.create_namespace(ns)
            names = {f"hfc-h{j}": a for j, a in enumerate(self.hosts)}
            namespaces.write_hosts_file(ns, self.hosts[i], names)
        argv = [sys.executable, RELAY_SCRIPT, "--ifname", self.ifname]
        if not self.offload:
            argv.append("--no-offload")
        for ns, addr in zip(self.namespaces, self.hosts):
            argv += ["--host", namespaces.netns_path(ns), addr]
        log = open(os.path.join(self.tmpdir, "relay.log"), "wb")
        try:
            self._relay = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                           stderr=log, close_fds=True)
        finally:
            log.close()
        ready = self._relay_read(timeout_s=30.0)
        if not ready.get("ready"):
            raise RuntimeError(f"relay did not start: {ready}")
        for ns, addr in zip(self.namespaces, self.hosts):
            self._check_open()
            namespaces.configure_interface(ns, self.ifname, addr, 24, self.mtu)
        launch.write_ssh_standin(self.bin_dir, self.hosts, self.namespaces, self.tag)
        self.set_link(self.link)

    def close(self) -> None:
        """Stop everything and delete every namespace, directory and process this emulator made.

        Safe to call more than once and from signal handlers.
        """
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        for p in self._procs:
            if p.poll() is None:
                p.kill()
        relay = self._relay
        if relay is not None:
            try:
                if relay.stdin is not None:
                    relay.stdin.close()  # end of file: the relay exits
                relay.wait(timeout=3.0)
            except (OSError, subprocess.TimeoutExpired):
                relay.kill()
                relay.wait(timeout=3.0)
            if relay.stdout is not None:
                relay.stdout.close()
        for ns in self.namespaces:
            namespaces.delete_namespace(ns)
        if self.tmpdir is not None:
            shutil.rmtree(self.tmpdir, ignore_errors=True)
        for p in self._procs:
            try:
                p.wait(timeout=3.0)
            except subprocess.TimeoutExpired:
                pass
        _unregister(self)

    def __enter__(self) -> Emulator:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def bin_dir(self) -> str:
        """Directory holding the ``ssh`` stand-in (put first on PATH, see :meth:`env`)."""
        assert self.tmpdir is not None
        return os.path.join(self.tmpdir, "bin")

    # -- relay control -------------------------------------------------------------------------

    def _relay_read(self, timeout_s: float) -> dict[str, Any]:
        relay = self._relay
        assert relay is not None and relay.stdout is not None
        fd = relay.stdout.fileno()
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._relay_buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError(f"relay gave no answer in {timeout_s} s ({self._relay_log()})")
            data = os.read(fd, 65536)
            if not data:
                raise RuntimeError(f"relay exited ({self._relay_log()})")
            self._relay_buf += data
        line, self._relay_buf = self._relay_buf.split(b"\n", 1)
        return json.loads(line)

    def _relay_log(self) -> str:
        if self.tmpdir is None:
            return ""
        try:
            with open(os.path.join(self.tmpdir, "relay.log"), errors="replace") as f:
                return f.read()[-2000:]
        except OSError:
            return ""

    def _relay_call(self, msg: dict[str, Any]) -> dict[str, Any]:
        if self._closed or self._relay is None or self._relay.stdin is None:
            raise RuntimeError("emulator is closed")
        with self._relay_lock:
            self._relay.stdin.write((json.dumps(msg) + "\n").encode())
            self._relay.stdin.flush()
            reply = self._relay_read(timeout_s=10.0)
        if not reply.get("ok"):
            raise RuntimeError(f"relay refused {msg}: {reply}")
        return reply

    def set_link(self, spec: LinkSpec, src: Optional[int] = None,
                 dst: Optional[int] = None) -> None:
        """Change every link (or those from host ``src`` / to host ``dst``) to ``spec`` now.

        Packets already inside the emulator keep the delay they got; later ones get the new one.
        """
        self._relay_call({"cmd": "set", "src": src, "dst": dst, **spec.to_message()})
        if src is None and dst is None:
            self.link = spec
        self.link_log.append((time.monotonic() - self._t0, spec, src, dst))

    def apply_schedule(self, schedule: Sequence[tuple[float, LinkSpec]]) -> threading.Thread:
        """Apply ``(t_seconds, spec)`` changes in a background thread, ``t_seconds`` after now.

        Returns the (daemon) thread; it stops early when the emulator closes. Every change applied
        is recorded in :attr:`link_log`.
        """
        steps = sorted(schedule, key=lambda s: s[0])
        start = time.monotonic()

        def worker() -> None:
            for t, spec in steps:
                if self._stop.wait(max(0.0, start + t - time.monotonic())):
                    return
                try:
                    self.set_link(spec)
                except RuntimeError:
                    return

        th = threading.Thread(target=worker, name=f"{self.tag}-schedule", daemon=True)
        th.start()
        self._threads.append(th)
        return th

    def relay_stats(self) -> dict[str, Any]:
        """Relay counters: packets/bytes forwarded; drops (queue full, unknown host, write)."""
        return self._relay_call({"cmd": "stats"})

    def host_counters(self) -> list[dict[str, int]]:
        """Per host, the kernel's counters that tell a network stall from a slow computation:
        TCP segments retransmitted (``retrans_segs``), retransmission timeouts (``tcp_timeouts``:
        a sender that heard nothing for an RTO, at least 200 ms, then doubling), and packets the
        kernel dropped in front of the TUN interface because the relay had not read them yet
        (``tun_tx_dropped``). Counts since the namespace was made."""
        out = []
        for i in range(len(self.namespaces)):
            res = self.run_in(i, ["cat", "/proc/net/snmp", "/proc/net/netstat",
                                  f"/sys/class/net/{self.ifname}/statistics/tx_dropped"],
                              capture_output=True, text=True, timeout=30)
            if res.returncode != 0:
                raise RuntimeError(f"reading host {i}'s counters failed: {res.stderr.strip()}")
            out.append(parse_host_counters(res.stdout))
        return out

    # -- running things on hosts ---------------------------------------------------------------

    def _wrap(self, i: int, argv: Sequence[str]) -> list[str]:
        if not 0 <= i < len(self.namespaces):
            raise IndexError(f"host index {i} out of range 0..{len(self.namespaces) - 1}")
        return ["ip", "netns", "exec", self.namespaces[i], *argv]

    def run_in(self, i: int, argv: Sequence[str], **kw: Any) -> subprocess.CompletedProcess:
        """``subprocess.run(argv, **kw)`` inside host ``i``'s namespace."""
        return subprocess.run(self._wrap(i, argv), **kw)

    def popen_in(self, i: int, argv: Sequence[str], **kw: Any) -> subprocess.Popen:
        """``subprocess.Popen(argv, **kw)`` inside host ``i``'s namespace; close() kills it."""
        p = subprocess.Popen(self._wrap(i, argv), **kw)
        self._procs = [q for q in self._procs if q.poll() is None]
        self._procs.append(p)
        return p

    @staticmethod
    def _last_json(text: str) -> dict[str, Any]:
        for line in reversed(text.strip().splitlines()):
            if line.startswith("{"):
                return json.loads(line)
        raise RuntimeError(f"probe printed no result: {text!r}")

    def rtt_samples_ms(self, src: int = 0, dst: int = 1, count: int = 20, gap_ms: float = 5.0,
                       timeout_s: float = 60.0) -> list[float]:
        """``count`` UDP round-trip times ``src -> dst -> src`` in milliseconds, in order.

        64-byte datagrams, one at a time, the next ``gap_ms`` ms after the previous reply.
        """
        port = str(next(self._ports))
        server = self.popen_in(dst, [sys.executable, PROBE_SCRIPT, "udp-echo", "--port", port,
                                     "--idle-s", str(timeout_s)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            res = self.run_in(src, [sys.executable, PROBE_SCRIPT, "udp-ping", "--host",
                                    self.hosts[dst], "--port", port, "--count", str(count),
                                    "--gap-ms", str(gap_ms)],
                              capture_output=True, text=True, timeout=timeout_s)
        finally:
            server.kill()
            server.wait()
        if res.returncode != 0:
            raise RuntimeError(f"udp-ping failed: {res.stderr.strip()}")
        return [float(x) for x in self._last_json(res.stdout)["rtts_ms"]]

    def measure_rtt_ms(self, src: int = 0, dst: int = 1, count: int = 20,
                       timeout_s: float = 60.0) -> float:
        """Median UDP round-trip time ``src -> dst -> src`` in milliseconds (64-byte datagrams).

        With delay ``d`` ms on both directions this is ``2 * d`` plus a base cost (relay, kernel,
        Python wake-ups) of roughly 0.1-0.5 ms, which can be measured with ``delay_ms=0``.
        """
        return statistics.median(self.rtt_samples_ms(src, dst, count, timeout_s=timeout_s))

    def measure_throughput(self, src: int = 0, dst: int = 1, seconds: float = 2.0,
                           bin_s: float = 0.25, timeout_s: float = 60.0) -> dict[str, Any]:
        """One TCP bulk transfer ``src -> dst`` of ``seconds`` of sending, seen by the receiver.

        Returns ``bytes`` (payload), ``seconds`` (first to last byte), ``mbit`` (their ratio,
        Mbit/s of payload) and ``timeline_mbit`` (Mbit/s in each ``bin_s``-second bin after the
        first byte).
        """
        port = str(next(self._ports))
        sink = self.popen_in(dst, [sys.executable, PROBE_SCRIPT, "tcp-sink", "--port", port,
                                   "--timeout-s", str(timeout_s), "--bin-s", str(bin_s)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            res = self.run_in(src, [sys.executable, PROBE_SCRIPT, "tcp-source", "--host",
                                    self.hosts[dst], "--port", port, "--seconds", str(seconds)],
                              capture_output=True, text=True, timeout=timeout_s)
            out, err = sink.communicate(timeout=timeout_s)
        finally:
            if sink.poll() is None:
                sink.kill()
                sink.wait()
        if res.returncode != 0 or sink.returncode != 0:
            raise RuntimeError(f"throughput probe failed: {res.stderr.strip()} {err.strip()}")
        return self._last_json(out)

    def measure_throughput_mbit(self, src: int = 0, dst: int = 1, seconds: float = 2.0,
                                timeout_s: float = 60.0) -> float:
        """TCP bulk throughput ``src -> dst`` in Mbit/s of payload, over ``seconds`` of sending.

        The receiver divides the bytes it got by the time from its first to its last byte.
        """
        return float(self.measure_throughput(src, dst, seconds, timeout_s=timeout_s)["mbit"])

    # -- launchers -----------------------------------------------------------------------------

    def env(self) -> dict[str, str]:
        """Environment additions for :meth:`horovodrun_argv` / :meth:`mpirun_argv` (merge into
        ``os.environ``): the ``ssh`` stand-in first on PATH, then this interpreter's bin directory,
        ``HOROVOD_GLOO_IFACE`` and Open MPI's run-as-root permission."""
        return launch.launch_env(self.bin_dir, self.ifname)

    def horovodrun_argv(self, np: int, script_argv: Sequence[str],
                        extra_args: Optional[Sequence[str]] = None,
                        start_timeout_s: int = 60) -> list[str]:
        """argv of ``horovodrun --gloo -np np -H h1:s,h2:s,...`` run inside host 0's namespace.

        Run it with ``env={**os.environ, **emu.env()}``. ``script_argv`` should start with an
        absolute interpreter path (e.g. ``sys.executable``).
        """
        return launch.horovodrun_argv(self.namespaces[0], self.hosts, self.ifname, np,
                                      script_argv, start_timeout_s, extra_args)

    def mpirun_argv(self, np: int, script_argv: Sequence[str],
                    extra_args: Optional[Sequence[str]] = None) -> list[str]:
        """argv of Open MPI ``mpirun`` (TCP only) run inside host 0's namespace; use :meth:`env`."""
        return launch.mpirun_argv(self.namespaces[0], self.hosts, self.ifname, np, script_argv,
                                  os.path.join(self.bin_dir, "ssh"), extra_args)

    def launcher_argv(self, launcher: str, np: int, script_argv: Sequence[str],
                      start_timeout_s: int = 60) -> list[str]:
        """argv of :meth:`horovodrun_argv` (``launcher="horovodrun"``, ``start_timeout_s`` in s)
        or :meth:`mpirun_argv` (``"mpirun"``); any other ``launcher`` raises ValueError."""
        if launcher == "horovodrun":
            return self.horovodrun_argv(np, script_argv, start_timeout_s=start_timeout_s)
        if launcher == "mpirun":
            return self.mpirun_argv(np, script_argv)
        raise ValueError(f"launcher must be one of {LAUNCHERS}, got {launcher!r}")
