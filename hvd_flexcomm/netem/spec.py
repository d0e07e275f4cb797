"""The parameters of one emulated link.

A link is one *direction* between two hosts (``src -> dst``); every ordered pair of hosts has its
own link, so host 0 sending to host 1 does not share a queue with host 1 sending to host 0, nor
with host 0 sending to host 2.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

__all__ = ["LinkSpec"]


@dataclass(frozen=True)
class LinkSpec:
    """Delay and rate of one direction of a link.

    Attributes:
        delay_ms: one-way propagation delay in milliseconds (>= 0). A round trip over two links with
            this spec therefore takes ``2 * delay_ms`` plus the emulator's own small base cost.
        rate_mbit: link rate in Mbit/s (10**6 bit per second) counted over whole IPv4 packets
            (IP header included), or ``None`` for an unlimited rate (only the delay is applied).
        queue_ms: the drop-tail queue in front of a rate-limited link, as the longest backlog that
            is accepted, in milliseconds of transmission time at ``rate_mbit``; a packet arriving
            while the backlog is longer is dropped. Ignored when ``rate_mbit`` is ``None``.
        loss: fraction of packets dropped at random (0 <= loss < 1), per MTU-sized segment (a TCP
            super-packet standing for n segments is dropped with probability 1 - (1 - loss)^n).
        jitter_ms: extra one-way delay drawn uniformly from [0, jitter_ms] per packet (>= 0);
            packets of a link still leave in order.
    """

    delay_ms: float = 0.0
    rate_mbit: Optional[float] = None
    queue_ms: float = 100.0
    loss: float = 0.0
    jitter_ms: float = 0.0

    def __post_init__(self) -> None:
        if not self.delay_ms >= 0.0:
            raise ValueError(f"LinkSpec.delay_ms must be >= 0 ms, got {self.delay_ms!r}")
        if self.rate_mbit is not None and not self.rate_mbit > 0.0:
            raise ValueError(
                f"LinkSpec.rate_mbit must be > 0 Mbit/s or None, got {self.rate_mbit!r}"
            )
        if not self.queue_ms > 0.0:
            raise ValueError(f"LinkSpec.queue_ms must be > 0 ms, got {self.queue_ms!r}")
        if not 0.0 <= self.loss < 1.0:
            raise ValueError(f"LinkSpec.loss must be a fraction in [0, 1), got {self.loss!r}")
        if not self.jitter_ms >= 0.0:
            raise ValueError(f"LinkSpec.jitter_ms must be >= 0 ms, got {self.jitter_ms!r}")

    def to_message(self) -> dict[str, Any]:
        """The fields as the relay's control protocol spells them (seconds and bit/s)."""
        return {
            "delay_s": self.delay_ms / 1e3,
            "rate_bps": None if self.rate_mbit is None else self.rate_mbit * 1e6,
            "queue_s": self.queue_ms / 1e3,
            "loss": self.loss,
            "jitter_s": self.jitter_ms / 1e3,
        }

    def describe(self) -> str:
        """A short human-readable form, e.g. ``'5 ms, 100 Mbit/s'``."""
        rate = "unlimited" if self.rate_mbit is None else f"{self.rate_mbit:g} Mbit/s"
        extra = ""
        if self.jitter_ms:
            extra += f", jitter {self.jitter_ms:g} ms"
        if self.loss:
            extra += f", loss {100 * self.loss:g}%"
        return f"{self.delay_ms:g} ms, {rate}{extra}"
