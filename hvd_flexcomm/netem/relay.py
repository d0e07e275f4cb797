"""Userspace packet relay: the emulated links between network namespaces.

This kernel has no ``netem`` qdisc, so delay is added here. The relay runs in the root namespace as
its own process (started by :class:`hvd_flexcomm.netem.Emulator`; run this file as a script, it
imports only the standard library). For every emulated host it enters the host's network
namespace with ``setns(2)``, opens ``/dev/net/tun`` there and creates a layer-3 TUN interface (same
name in every namespace), then returns to its own namespace while keeping the file descriptors.

Each IPv4 packet the kernel of host *s* routes into its TUN is read here, its destination address
names host *d*, and the packet goes through the link ``s -> d``:

1. rate (if limited): the link serialises packets one after another at ``rate_bps``; a packet starts
   when the link is free and takes ``8 * len(packet) / rate_bps`` seconds. A packet that would wait
   more than ``queue_s`` seconds for the link is dropped (drop-tail queue).
0. loss (if set): the packet is dropped with probability ``1 - (1 - loss)^segments``;
2. delay: the packet is then held ``delay_s`` seconds (propagation) plus a uniform random jitter in
   ``[0, jitter_s]``, in a heap keyed by release
   time, never released before an earlier packet of the same link (links stay FIFO when the delay
   shrinks).
3. it is written to host *d*'s TUN, and *d*'s kernel receives it.

Packets that are not IPv4, or whose destination is not an emulated host, are dropped.

Control protocol: one JSON object per line on stdin, one JSON reply per line on stdout.

- ``{"cmd": "set", "delay_s": float, "rate_bps": float|null, "queue_s": float, "loss": float,
  "jitter_s": float, "src": int|null, "dst": int|null}`` sets every link (or only those from
  ``src`` / to ``dst``); the change applies to packets read after it, at once.
- ``{"cmd": "stats"}`` replies with packet and byte counters.
- ``{"cmd": "quit"}`` or end of file on stdin stops the relay (its TUN interfaces go with it).

The first line the relay prints is ``{"ready": true, ...}`` once every TUN interface exists.
"""

from __future__ import annotations

import argparse
import ctypes
import fcntl
import heapq
import json
import math
import os
import random
import selectors
import struct
import sys
import time
from typing import Any, Optional

TUNSETIFF = 0x400454CA
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000
IFF_VNET_HDR = 0x4000
TUNSETOFFLOAD = 0x400454D0
TUN_F_CSUM = 0x01
TUN_F_TSO4 = 0x02
TUN_F_TSO6 = 0x04
#: Bytes of ``struct virtio_net_hdr`` in front of each packet when offloads are on.
VNET_HDR_LEN = 10
VIRTIO_NET_HDR_GSO_TCPV4 = 1
CLONE_NEWNET = 0x40000000
PR_SET_TIMERSLACK = 29
#: Largest read from a TUN in bytes (the largest IPv4 packet plus a virtio header).
MAX_PACKET = 65535 + VNET_HDR_LEN
#: Packets read from one TUN before the relay looks at its other work again.
READ_BATCH = 64


def _setns(fd: int) -> None:
    """Move the calling thread into the network namespace that ``fd`` refers to."""
    setns = getattr(os, "setns", None)
    if setns is not None:  # Python >= 3.12
        setns(fd, CLONE_NEWNET)
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


def _tight_timers() -> None:
    """Ask for 1 microsecond timer slack (default 50) so held packets leave on time."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_TIMERSLACK, 1000, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def open_tun(netns_path: str, ifname: str, offload: bool) -> int:
    """Create TUN interface ``ifname`` inside the namespace at ``netns_path``; return its fd.

    The fd is non-blocking and stays valid in the caller's namespace; the interface lives as long as
    the fd is open. With ``offload`` the interface does TCP segmentation offload and checksum
    offload: the kernel hands over TCP "super-packets" of up to 64 KiB (each read starts with a
    10-byte ``virtio_net_hdr``) that the receiving kernel accepts as they are, so TCP works with
    MTU-sized segments while the relay moves few, large packets.
    """
    own = os.open("/proc/self/ns/net", os.O_RDONLY)
    target = os.open(netns_path, os.O_RDONLY)
    try:
        _setns(target)
        try:
            fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
            try:
                flags = IFF_TUN | IFF_NO_PI | (IFF_VNET_HDR if offload else 0)
                ifr = struct.pack("16sH22x", ifname.encode(), flags)
                fcntl.ioctl(fd, TUNSETIFF, ifr)
                if offload:
                    fcntl.ioctl(fd, TUNSETOFFLOAD, TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6)
            except OSError:
                os.close(fd)
                raise
        finally:
            _setns(own)
    finally:
        os.close(target)
        os.close(own)
    return fd


class Link:
    """State of one direction ``src -> dst``: its parameters and when it is next free (seconds)."""

    __slots__ = ("delay_s", "rate_bps", "queue_s", "loss", "jitter_s", "free_at", "last_release")

    def __init__(self) -> None:
        self.delay_s = 0.0
        self.rate_bps: Optional[float] = None
        self.queue_s = 0.1
        self.loss = 0.0
        self.jitter_s = 0.0
        self.free_at = 0.0
        self.last_release = 0.0


class Relay:
    """The relay loop over ``fds`` (one TUN per host) with host addresses ``addrs``."""

    def __init__(self, fds: list[int], addrs: list[str], vnet_hdr: bool) -> None:
        self.fds = fds
        self.h = VNET_HDR_LEN if vnet_hdr else 0
        self.n = len(fds)
        self.index = {bytes(map(int, a.split("."))): i for i, a in enumerate(addrs)}
        self.links = [[Link() for _ in range(self.n)] for _ in range(self.n)]
        self.heap: list[tuple[float, int, int, bytes]] = []
        self.seq = 0
        self.stats = {
            "forwarded_packets": 0,
            "forwarded_bytes": 0,
            "dropped_queue": 0,
            "dropped_loss": 0,
            "dropped_unknown": 0,
            "dropped_write": 0,
            "released": 0,  # packets that waited in the heap
            "late_us_sum": 0.0,  # sum over them of (time written - release time), microseconds
            "late_us_max": 0.0,  # the largest of those (a relay that stalled shows here)
        }
        self.ctl_buf = b""
        self.rng = random.Random(12345)
        self.running = True
        self.sel = selectors.DefaultSelector()
        for i, fd in enumerate(fds):
            self.sel.register(fd, selectors.EVENT_READ, i)
        os.set_blocking(0, False)
        self.sel.register(0, selectors.EVENT_READ, -1)

    # -- control -------------------------------------------------------------------------------

    def _reply(self, obj: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()

    def _control(self, msg: dict[str, Any]) -> None:
        cmd = msg.get("cmd")
        if cmd == "set":
            src, dst = msg.get("src"), msg.get("dst")
            rate = msg.get("rate_bps")
            for s in range(self.n):
                for d in range(self.n):
                    if (src is not None and s != src) or (dst is not None and d != dst):
                        continue
                    link = self.links[s][d]
                    link.delay_s = float(msg["delay_s"])
                    link.rate_bps = None if rate is None else float(rate)
                    link.queue_s = float(msg.get("queue_s", 0.1))
                    link.loss = float(msg.get("loss", 0.0))
                    link.jitter_s = float(msg.get("jitter_s", 0.0))
            self._reply({"ok": True})
        elif cmd == "stats":
            self._reply({"ok": True, **self.stats, "queued": len(self.heap)})
        elif cmd == "quit":
            self._reply({"ok": True})
            self.running = False
        else:
            self._reply({"ok": False, "error": f"unknown command {cmd!r}"})

    def _read_control(self) -> None:
        try:
            data = os.read(0, 65536)
        except BlockingIOError:
            return
        if not data:  # the emulator went away
            self.running = False
            return
        self.ctl_buf += data
        while b"\n" in self.ctl_buf:
            line, self.ctl_buf = self.ctl_buf.split(b"\n", 1)
            if line.strip():
                try:
                    self._control(json.loads(line))
                except (ValueError, KeyError, TypeError) as exc:
                    self._reply({"ok": False, "error": repr(exc)})

    # -- data path -----------------------------------------------------------------------------

    def _write(self, dst: int, pkt: bytes) -> None:
        try:
            os.write(self.fds[dst], pkt)
        except OSError:
            self.stats["dropped_write"] += 1
            return
        self.stats["forwarded_packets"] += 1
        self.stats["forwarded_bytes"] += len(pkt)

    def _segments(self, pkt: bytes) -> tuple[int, int]:
        """``(wire bytes, segments)`` of a packet: its IPv4 length and 1, or for a TCP
        super-packet the sum over the MTU-sized segments it stands for (each repeats the IP and
        TCP headers) and their number."""
        h = self.h
        n = len(pkt) - h
        nseg = 1
        if h and pkt[1] == VIRTIO_NET_HDR_GSO_TCPV4:
            gso_size = pkt[4] | (pkt[5] << 8)
            ihl = (pkt[h] & 0x0F) * 4
            hdrs = ihl + (pkt[h + ihl + 12] >> 4) * 4
            if gso_size > 0 and n > hdrs:
                nseg = -(-(n - hdrs) // gso_size)
                n += (nseg - 1) * hdrs
        return n, nseg

    def _wire_bytes(self, pkt: bytes) -> int:
        """Bytes this packet occupies on the link (see :meth:`_segments`)."""
        return self._segments(pkt)[0]

    def _accept(self, src: int, pkt: bytes, now: float) -> None:
        h = self.h
        if len(pkt) < h + 20 or pkt[h] >> 4 != 4:
            self.stats["dropped_unknown"] += 1
            return
        dst = self.index.get(pkt[h + 16:h + 20])
        if dst is None or dst == src:
            self.stats["dropped_unknown"] += 1
            return
        link = self.links[src][dst]
        if link.loss > 0.0:
            nseg = self._segments(pkt)[1]
            if self.rng.random() < 1.0 - (1.0 - link.loss) ** nseg:
                self.stats["dropped_loss"] += 1
                return
        done = now
        if link.rate_bps is not None:
            start = link.free_at if link.free_at > now else now
            if start - now > link.queue_s:
                self.stats["dropped_queue"] += 1
                return
            done = start + 8.0 * self._wire_bytes(pkt) / link.rate_bps
            link.free_at = done
        release = done + link.delay_s
        if link.jitter_s > 0.0:
            release += self.rng.uniform(0.0, link.jitter_s)
        if release < link.last_release:
            release = link.last_release
        link.last_release = release
        if release <= now and not self.heap:
            self._write(dst, pkt)
            return
        self.seq += 1
        heapq.heappush(self.heap, (release, self.seq, dst, pkt))

    def _read_tun(self, src: int) -> None:
        fd = self.fds[src]
        for _ in range(READ_BATCH):
            try:
                pkt = os.read(fd, MAX_PACKET)
            except BlockingIOError:
                return
            self._accept(src, pkt, time.monotonic())

    def _release_due(self) -> None:
        heap = self.heap
        now = time.monotonic()
        stats = self.stats
        while heap and heap[0][0] <= now:
            release, _, dst, pkt = heapq.heappop(heap)
            late_us = (now - release) * 1e6
            stats["late_us_sum"] += late_us
            if late_us > stats["late_us_max"]:
                stats["late_us_max"] = late_us
            stats["released"] += 1
            self._write(dst, pkt)

    def _timeout(self) -> Optional[float]:
        """Seconds to wait in epoll: whole milliseconds, never past the next release.

        epoll rounds its timeout up to whole milliseconds; the sub-millisecond rest is slept with
        ``time.sleep`` (nanosecond clock) so packets leave within tens of microseconds.
        """
        if not self.heap:
            return None
        wait = self.heap[0][0] - time.monotonic()
        if wait <= 0.0:
            return 0.0
        whole_ms = math.floor(wait * 1e3)
        if whole_ms == 0:
            time.sleep(wait)
            return 0.0
        return (whole_ms - 0.5) / 1e3  # rounds up to exactly whole_ms

    def run(self) -> None:
        """Serve until told to quit or stdin closes."""
        while self.running:
            self._release_due()
            for key, _ in self.sel.select(self._timeout()):
                if key.data < 0:
                    self._read_control()
                else:
                    self._read_tun(key.data)


def main(argv: Optional[list[str]] = None) -> int:
    """Entry point: ``relay.py --ifname hfc0 --host NETNS_PATH ADDR [--host ...]``."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ifname", required=True, help="TUN interface name in every namespace")
    ap.add_argument("--host", nargs=2, action="append", required=True,
                    metavar=("NETNS_PATH", "IPV4"), help="one emulated host")
    ap.add_argument("--no-offload", action="store_true",
                    help="plain TUN: every packet at most one MTU, no virtio header")
    ap.add_argument("--nice", type=int, default=-5, help="scheduling priority change (root only)")
    args = ap.parse_args(argv)
    try:
        os.nice(args.nice)
    except OSError:
        pass
    _tight_timers()
    offload = not args.no_offload
    fds = [open_tun(path, args.ifname, offload) for path, _ in args.host]
    relay = Relay(fds, [addr for _, addr in args.host], vnet_hdr=offload)
    relay._reply({"ready": True, "pid": os.getpid(), "hosts": len(fds), "offload": offload})
    try:
        relay.run()
    finally:
        for fd in fds:
            os.close(fd)
    return 0


if __name__ == "__main__":
    sys.exit(main())
