"""Launching multi-process jobs (``horovodrun --gloo``, ``mpirun``) across the emulated hosts.

Both launchers reach other hosts through ``ssh HOST COMMAND``. :func:`write_ssh_standin` writes an
``ssh`` script that understands the ssh options these launchers pass, looks the host up in a fixed
table (address or namespace name -> namespace) and runs ``ip netns exec NS bash -c COMMAND``: the
command runs "on" that host, and its traffic to other hosts crosses the emulated links. Put its
directory first on ``PATH`` (see :meth:`Emulator.env`); for ``mpirun`` it is also the rsh agent.

The launcher itself runs inside host 0's namespace (``ip netns exec NS0 ...``): its rendezvous
server (Gloo) or daemon (Open MPI) must be reachable on the emulated interface.
"""

from __future__ import annotations

import math
import os
import shlex
import stat
import sys
from collections.abc import Sequence
from typing import Optional

__all__ = ["write_ssh_standin", "horovodrun_argv", "mpirun_argv", "launch_env", "venv_bin"]

# ssh options that take an argument (OpenSSH 9), either separate ("-p 22") or attached ("-p22").
_SSH_ARG_OPTS = "BbcDEeFIiJLlmOoPpRSWw"

_STANDIN = """#!/bin/bash
# ssh stand-in written by hvd_flexcomm.netem for emulator {tag}: runs COMMAND in HOST's namespace.
# Usage as ssh: ssh [options] HOST [options] [COMMAND...]
host=""
while [ $# -gt 0 ]; do
  case "$1" in
    --) shift; break ;;
    -[{argopts}]) shift; [ $# -gt 0 ] && shift ;;
    -[{argopts}]?*) shift ;;
    -*) shift ;;
    *) if [ -z "$host" ]; then host="$1"; shift; else break; fi ;;
  esac
done
host="${{host#*@}}"
case "$host" in
{cases}
  *) echo "hvd_flexcomm.netem ssh stand-in: unknown host '$host'" >&2; exit 255 ;;
esac
if [ $# -eq 0 ]; then
  exec ip netns exec "$ns" bash
fi
exec ip netns exec "$ns" bash -c "$*"
"""


def venv_bin() -> str:
    """The directory of the running interpreter (where its ``horovodrun`` lives)."""
    return os.path.dirname(os.path.abspath(sys.executable))


def write_ssh_standin(bin_dir: str, hosts: Sequence[str], namespaces: Sequence[str],
                      tag: str) -> str:
    """Write ``bin_dir/ssh`` mapping ``hosts[i]`` and ``namespaces[i]`` to ``namespaces[i]``."""
    os.makedirs(bin_dir, exist_ok=True)
    cases = "\n".join(
        f"  {shlex.quote(h)}|{shlex.quote(ns)}) ns={shlex.quote(ns)} ;;"
        for h, ns in zip(hosts, namespaces)
    )
    path = os.path.join(bin_dir, "ssh")
    with open(path, "w") as f:
        f.write(_STANDIN.format(tag=tag, argopts=_SSH_ARG_OPTS, cases=cases))
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def _host_list(hosts: Sequence[str], np: int) -> str:
    """``-H`` value: ``np`` slots spread over the fewest hosts needed, ``ceil(np/len)`` per host."""
    if np < 1:
        raise ValueError(f"np must be >= 1, got {np}")
    slots = math.ceil(np / len(hosts))
    used = math.ceil(np / slots)
    return ",".join(f"{h}:{slots}" for h in hosts[:used])


def horovodrun_argv(namespace0: str, hosts: Sequence[str], ifname: str, np: int,
                    script_argv: Sequence[str], start_timeout_s: int = 60,
                    extra_args: Optional[Sequence[str]] = None) -> list[str]:
    """argv running ``horovodrun --gloo`` inside ``namespace0`` over ``hosts``.

    ``script_argv`` is the worker command, e.g. ``[sys.executable, "train.py"]`` (use an absolute
    interpreter path: the remote shell's PATH is the launcher's, forwarded by horovodrun).
    """
    horovodrun = os.path.join(venv_bin(), "horovodrun")
    return [
        "ip", "netns", "exec", namespace0,
        horovodrun, "--gloo", "-np", str(np), "-H", _host_list(hosts, np),
        "--network-interfaces", ifname, "--start-timeout", str(start_timeout_s),
        *(extra_args or []), *script_argv,
    ]


def mpirun_argv(namespace0: str, hosts: Sequence[str], ifname: str, np: int,
                script_argv: Sequence[str], ssh_path: str,
                extra_args: Optional[Sequence[str]] = None) -> list[str]:
    """argv running Open MPI's ``mpirun`` inside ``namespace0`` over ``hosts``, TCP only.

    ``--mca btl tcp,self`` keeps shared memory from bypassing the emulated links; ``ssh_path`` (the
    stand-in) is the rsh agent that starts ``orted`` in each host's namespace.
    ``rtc_hwloc_vmhole none``: Open MPI 4.1's rtc/hwloc component then creates no shared-memory
    copy of the hardware topology (it maps one at a "hole" of the address space otherwise); once
    in ~15 launches on this machine (2026-12-03) an ``orted`` crashed in
    ``hwloc_shmem_topology_write`` at start-up. The ranks read the topology themselves instead.
    """
    return [
        "ip", "netns", "exec", namespace0,
        "mpirun", "--allow-run-as-root", "-np", str(np), "-H", _host_list(hosts, np),
        "--mca", "plm_rsh_agent", ssh_path,
        "--mca", "btl", "tcp,self",
        "--mca", "rtc_hwloc_vmhole", "none",
        "--mca", "btl_tcp_if_include", ifname,
        "--mca", "oob_tcp_if_include", ifname,
        "-x", "PATH", "-x", "HOROVOD_GLOO_IFACE",
        *(extra_args or []), *script_argv,
    ]


def launch_env(bin_dir: str, ifname: str) -> dict[str, str]:
    """Environment additions for the launchers: stand-in ``ssh`` first on PATH, then the venv."""
    path = os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin")
    return {
        "PATH": os.pathsep.join([bin_dir, venv_bin(), path]),
        "HOROVOD_GLOO_IFACE": ifname,
        "OMPI_ALLOW_RUN_AS_ROOT": "1",
        "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    }
