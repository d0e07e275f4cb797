"""A small, real network emulator for multi-process jobs on one Linux machine (root only).

Each emulated host is a network namespace with one TUN interface (same name everywhere, ``hfc0``,
MTU 1500 with TCP segmentation offload);
a userspace relay in the root namespace joins them with links of configurable one-way delay (ms) and
rate (Mbit/s), changeable while traffic flows. This kernel has no ``netem`` qdisc, hence the relay.

Example::

    from hvd_flexcomm.netem import Emulator, LinkSpec

    with Emulator(n_hosts=2, link=LinkSpec(delay_ms=5.0, rate_mbit=100.0)) as emu:
        emu.measure_rtt_ms(0, 1)             # ~10.2 ms
        emu.set_link(LinkSpec(delay_ms=1.0)) # unlimited rate, 1 ms each way
        subprocess.run(emu.horovodrun_argv(2, [sys.executable, "train.py"]),
                       env={**os.environ, **emu.env()})

Command line: ``python -m hvd_flexcomm.netem selftest|cleanup|horovod-demo`` (see ``--help``).
Modules: :mod:`.spec` (LinkSpec), :mod:`.relay` (the packet relay process), :mod:`.namespaces`
(iproute2 plumbing and cleanup), :mod:`.probe` (RTT and throughput probes), :mod:`.launch`
(``ssh`` stand-in, horovodrun/mpirun argv), :mod:`.emulator` (the Emulator), :mod:`.hvd_allreduce`
(a Horovod allreduce timing worker).
"""

from .emulator import Emulator
from .spec import LinkSpec

__all__ = ["Emulator", "LinkSpec"]
