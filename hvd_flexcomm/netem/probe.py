"""Tiny network probes run inside the emulated hosts: a UDP ping and a TCP bulk transfer.

Run as a script (``python probe.py COMMAND ...``); it imports only the standard library so it starts
fast and does not import the ``hvd_flexcomm`` package. Results are printed as one JSON line.

- ``udp-echo --port P``: echo UDP datagrams until ``--idle-s`` seconds pass without one.
- ``udp-ping --host H --port P --count N``: send N sequenced 64-byte datagrams one at a time (the
  next after the reply, plus ``--gap-ms``); prints the round-trip times in ms and their median.
- ``tcp-sink --port P``: accept one connection, read to end of stream; prints payload bytes
  received, the seconds from first to last byte, their ratio in Mbit/s (10**6 bit/s of TCP
  payload), and the Mbit/s in each ``--bin-s`` second bin after the first byte.
- ``tcp-source --host H --port P --seconds S``: connect and send as fast as possible for S seconds.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import struct
import sys
import time
from typing import Optional

#: How long clients retry while the server in the other namespace is still starting, in seconds.
CONNECT_RETRY_S = 15.0


def udp_echo(port: int, idle_s: float) -> dict:
    """Echo datagrams on ``port`` until ``idle_s`` seconds of silence; returns the count echoed."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("0.0.0.0", port))
    s.settimeout(idle_s)
    n = 0
    print(json.dumps({"listening": port}), flush=True)
    while True:
        try:
            data, peer = s.recvfrom(65535)
        except socket.timeout:
            break
        s.sendto(data, peer)
        n += 1
    return {"echoed": n}


def udp_ping(host: str, port: int, count: int, gap_ms: float, timeout_s: float) -> dict:
    """Round-trip times to an echo server in milliseconds, and their median (after a warm-up)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.connect((host, port))
    seq = 0

    def once(wait_s: float) -> Optional[float]:
        nonlocal seq
        seq += 1
        t0 = time.perf_counter()
        s.send(struct.pack("!Q", seq) + b"\0" * 56)
        s.settimeout(wait_s)
        while True:
            try:
                data = s.recv(65535)
            except (socket.timeout, ConnectionRefusedError):
                return None
            if len(data) >= 8 and struct.unpack("!Q", data[:8])[0] == seq:
                return (time.perf_counter() - t0) * 1e3
            remaining = wait_s - (time.perf_counter() - t0)
            if remaining <= 0:
                return None
            s.settimeout(remaining)

    deadline = time.monotonic() + CONNECT_RETRY_S
    while once(0.2) is None:  # warm-up: wait for the server and fill any caches
        if time.monotonic() > deadline:
            raise SystemExit(f"udp-ping: no echo from {host}:{port} in {CONNECT_RETRY_S} s")
        time.sleep(0.05)
    rtts = []
    lost = 0
    while len(rtts) < count:
        r = once(timeout_s)
        if r is None:
            lost += 1
            if lost > count:
                raise SystemExit(f"udp-ping: {lost} datagrams lost")
        else:
            rtts.append(r)
        time.sleep(gap_ms / 1e3)
    return {"rtts_ms": rtts, "median_ms": statistics.median(rtts), "lost": lost}


def tcp_sink(port: int, accept_timeout_s: float, bin_s: float = 0.25) -> dict:
    """Receive one TCP stream; returns payload bytes, seconds first→last byte, Mbit/s, and the
    Mbit/s of each ``bin_s``-second bin after the first byte (``timeline_mbit``)."""
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("0.0.0.0", port))
    srv.listen(1)
    srv.settimeout(accept_timeout_s)
    print(json.dumps({"listening": port}), flush=True)
    conn, _ = srv.accept()
    conn.settimeout(accept_timeout_s)
    buf = bytearray(1 << 20)
    total = 0
    t_first = t_last = None
    bins: list[int] = []  # payload bytes per bin_s since the first byte
    while True:
        n = conn.recv_into(buf)
        if n == 0:
            break
        t_last = time.perf_counter()
        if t_first is None:
            t_first = t_last
        total += n
        b = int((t_last - t_first) / bin_s)
        while len(bins) <= b:
            bins.append(0)
        bins[b] += n
    conn.close()
    secs = (t_last - t_first) if t_first is not None else 0.0
    return {
        "bytes": total,
        "seconds": secs,
        "mbit": total * 8 / secs / 1e6 if secs > 0 else 0.0,
        "bin_s": bin_s,
        "timeline_mbit": [x * 8 / bin_s / 1e6 for x in bins],
    }


def tcp_source(host: str, port: int, seconds: float) -> dict:
    """Send zeros to ``host:port`` for ``seconds``; returns payload bytes handed to the kernel."""
    deadline = time.monotonic() + CONNECT_RETRY_S
    while True:
        try:
            s = socket.create_connection((host, port), timeout=5.0)
            break
        except (ConnectionRefusedError, socket.timeout):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    chunk = b"\0" * (1 << 18)
    total = 0
    s.settimeout(max(30.0, 4 * seconds))
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        total += s.send(chunk)
    s.shutdown(socket.SHUT_WR)
    s.recv(1)  # wait until the sink has read everything and closed
    s.close()
    return {"bytes": total}


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("udp-echo")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--idle-s", type=float, default=10.0)
    p = sub.add_parser("udp-ping")
    p.add_argument("--host", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--count", type=int, default=20)
    p.add_argument("--gap-ms", type=float, default=5.0)
    p.add_argument("--timeout-s", type=float, default=2.0)
    p = sub.add_parser("tcp-sink")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--timeout-s", type=float, default=30.0)
    p.add_argument("--bin-s", type=float, default=0.25)
    p = sub.add_parser("tcp-source")
    p.add_argument("--host", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--seconds", type=float, default=2.0)
    a = ap.parse_args(argv)
    if a.cmd == "udp-echo":
        out = udp_echo(a.port, a.idle_s)
    elif a.cmd == "udp-ping":
        out = udp_ping(a.host, a.port, a.count, a.gap_ms, a.timeout_s)
    elif a.cmd == "tcp-sink":
        out = tcp_sink(a.port, a.timeout_s, a.bin_s)
    else:
        out = tcp_source(a.host, a.port, a.seconds)
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
