"""Waiting for a Horovod handle without taking the CPU from the rank everyone waits for.

``horovod.torch.synchronize(handle)`` waits in a loop that polls the handle and yields the CPU
between polls, on the calling (training) thread. Where ranks share cores -- more ranks than
cores, as on this project's 2-core test bed with N = 4 -- the ranks already waiting in a
collective keep that loop running (almost all of it kernel time), and the one rank still
computing (the rank the collective waits for) gets a small share of the CPU: on the test bed
some steps' 30 ms of forward and backward on one rank stretched to 1-19 s, and in the stalls
sampled the other three ranks' training threads took 75-87% of both cores meanwhile, the
stalled rank's under 1% (``docs/performance/stalls.md``).

:func:`wait` polls instead with ``time.sleep`` between polls, from :data:`FIRST_SLEEP_S`
doubling to :data:`MAX_SLEEP_S`: a waiting rank sleeps, and the straggler and Horovod's
background threads get the cores. It adds at most :data:`MAX_SLEEP_S` (1 ms) to a wait, against
collectives of 10-1000 ms here. :func:`synchronize` is ``wait`` then Horovod's ``synchronize``
(which then returns at once). The environment variable ``HVD_FLEXCOMM_WAIT=horovod`` turns the
polling off (Horovod's own loop; read at each wait), for comparison. An ``hvd`` without
``poll`` (a stand-in in unit tests) is synchronized directly.
"""

from __future__ import annotations

import os
import time
from typing import Any

__all__ = ["FIRST_SLEEP_S", "MAX_SLEEP_S", "WAIT_ENV", "polls", "synchronize", "wait"]

#: The first sleep between polls (s); doubled after each poll that found the handle unfinished.
FIRST_SLEEP_S = 50e-6
#: The longest sleep between polls (s): the most a finished handle waits to be noticed.
MAX_SLEEP_S = 1e-3
#: ``horovod``: wait in Horovod's own loop; anything else (or unset): poll and sleep.
WAIT_ENV = "HVD_FLEXCOMM_WAIT"


def polls(hvd: Any) -> bool:
    """Whether :func:`wait` polls with sleeps for this ``hvd`` (it has ``poll``, and
    :data:`WAIT_ENV` is not ``horovod``)."""
    return hasattr(hvd, "poll") and os.environ.get(WAIT_ENV, "poll").strip().lower() != "horovod"


def wait(hvd: Any, handle: Any) -> None:
    """Return once ``handle`` (of an async Horovod op) has finished, sleeping between polls
    (see the module docstring); does nothing when :func:`polls` is False."""
    if not polls(hvd):
        return
    sleep_s = FIRST_SLEEP_S
    while not hvd.poll(handle):
        time.sleep(sleep_s)
        sleep_s = min(MAX_SLEEP_S, 2 * sleep_s)


def synchronize(hvd: Any, handle: Any) -> Any:
    """``hvd.synchronize(handle)`` after :func:`wait`: the op's output, and its error raised
    as Horovod raises it."""
    wait(hvd, handle)
    return hvd.synchronize(handle)
