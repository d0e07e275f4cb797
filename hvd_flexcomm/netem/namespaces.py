"""Create, configure, list and delete the network namespaces of an emulator (iproute2, root only).

Every name this module creates starts with :data:`PREFIX` and follows :data:`NAME_RE`
(``hfc<pid>x<instance>n<host>``), so leftovers of a crashed run can be found and removed by
:func:`cleanup_leftovers` without touching anything else.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from typing import Optional

__all__ = [
    "PREFIX",
    "NAME_RE",
    "namespace_name",
    "netns_path",
    "require_root_and_iproute",
    "create_namespace",
    "configure_interface",
    "write_hosts_file",
    "kill_namespace_processes",
    "delete_namespace",
    "list_namespaces",
    "cleanup_leftovers",
]

PREFIX = "hfc"
#: Namespace names: ``hfc<owner pid>x<instance in that process>n<host index>``.
NAME_RE = re.compile(r"^hfc(\d+)x(\d+)n(\d+)$")
#: Temporary directories: ``/tmp/hfc<owner pid>x<instance>-<random>``.
TMPDIR_RE = re.compile(r"^hfc(\d+)x(\d+)-")
NETNS_DIR = "/var/run/netns"
ETC_NETNS = "/etc/netns"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True, timeout=30)


def namespace_name(owner_pid: int, instance: int, host: int) -> str:
    """The namespace name of host ``host`` of emulator ``instance`` in process ``owner_pid``."""
    return f"{PREFIX}{owner_pid}x{instance}n{host}"


def netns_path(name: str) -> str:
    """The bind-mount file that names namespace ``name`` (what ``setns(2)`` opens)."""
    return os.path.join(NETNS_DIR, name)


_usable = False


def require_root_and_iproute() -> Optional[str]:
    """``None`` when namespaces can be made here, else the reason they cannot (tried once)."""
    global _usable
    if _usable:
        return None
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    if shutil.which("ip") is None:
        return "needs iproute2 ('ip' not on PATH)"
    if not os.path.exists("/dev/net/tun"):
        return "needs /dev/net/tun"
    probe = f"{PREFIX}probe{os.getpid()}t{threading.get_ident() % 100000}"
    res = _ip("netns", "add", probe, check=False)
    if res.returncode != 0:
        return f"'ip netns add' fails: {res.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    _usable = True
    return None


def create_namespace(name: str) -> None:
    """Create namespace ``name`` with ``lo`` up and IPv6 off (no stray router solicitations)."""
    _ip("netns", "add", name)
    _ip("-n", name, "link", "set", "lo", "up")
    subprocess.run(
        ["ip", "netns", "exec", name, "sysctl", "-q", "-w",
         "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1"],
        check=False, capture_output=True, timeout=30,
    )


def configure_interface(name: str, ifname: str, addr: str, prefix_len: int, mtu: int) -> None:
    """Give ``ifname`` in namespace ``name`` the address ``addr/prefix_len``, MTU ``mtu`` bytes,
    and bring it up (the subnet is then routed through it)."""
    _ip("-n", name, "addr", "add", f"{addr}/{prefix_len}", "dev", ifname)
    _ip("-n", name, "link", "set", ifname, "mtu", str(mtu), "txqueuelen", "1000", "up")


def write_hosts_file(name: str, addr: str, extra: dict[str, str]) -> str:
    """Write ``/etc/netns/<name>/hosts`` (``ip netns exec`` mounts it over ``/etc/hosts``).

    It maps this machine's hostname to ``addr``, so programs that bind to "their hostname"
    (Horovod's process-set setup does) bind to the emulated interface instead of 127.0.0.1.
    ``extra`` maps more names to addresses. Returns the directory written.
    """
    d = os.path.join(ETC_NETNS, name)
    os.makedirs(d, exist_ok=True)
    lines = ["127.0.0.1 localhost", f"{addr} {socket.gethostname()}"]
    lines += [f"{a} {n}" for n, a in extra.items()]
    with open(os.path.join(d, "hosts"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return d


def kill_namespace_processes(name: str, grace_s: float = 1.0) -> None:
    """SIGTERM, then after ``grace_s`` seconds SIGKILL, every process inside namespace ``name``.

    Only namespaces this module created are passed here: these are processes the emulator started.
    """
    res = _ip("netns", "pids", name, check=False)
    pids = [int(p) for p in res.stdout.split() if p.isdigit()]
    if not pids:
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            res = _ip("netns", "pids", name, check=False)
            pids = [int(p) for p in res.stdout.split() if p.isdigit()]
            if not pids:
                return
            time.sleep(0.05)


def delete_namespace(name: str) -> None:
    """Kill what runs in ``name``, delete the namespace and its ``/etc/netns`` directory."""
    if os.path.exists(netns_path(name)):
        kill_namespace_processes(name)
        _ip("netns", "del", name, check=False)
    shutil.rmtree(os.path.join(ETC_NETNS, name), ignore_errors=True)


def list_namespaces() -> list[str]:
    """Names of existing namespaces created by this module (any owner)."""
    names = set()
    for d in (NETNS_DIR, ETC_NETNS):
        try:
            names.update(n for n in os.listdir(d) if NAME_RE.match(n))
        except FileNotFoundError:
            pass
    return sorted(names)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def cleanup_leftovers(all_owners: bool = False) -> list[str]:
    """Delete namespaces, ``/etc/netns`` dirs and temp dirs left by emulators.

    By default only those whose owner process is gone (a live emulator in another process, e.g. a
    parallel test run, is left alone); ``all_owners=True`` removes every one. Returns what was
    removed.
    """
    removed = []
    for name in list_namespaces():
        owner = int(NAME_RE.match(name).group(1))  # type: ignore[union-attr]
        if all_owners or not _alive(owner):
            delete_namespace(name)
            removed.append(name)
    tmp = tempfile.gettempdir()
    for entry in os.listdir(tmp):
        m = TMPDIR_RE.match(entry)
        if m and (all_owners or not _alive(int(m.group(1)))):
            shutil.rmtree(os.path.join(tmp, entry), ignore_errors=True)
            removed.append(os.path.join(tmp, entry))
    return removed
