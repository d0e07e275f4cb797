"""Gradient messages: groups of parameters that are flattened and compressed as one vector.

A :class:`GradMessage` owns the per-rank residual (error-feedback memory) of its parameters. With
``granularity="model"`` there is one message per dtype holding every trainable parameter (the
paper's fused top-k: the best compression quality, one collective per step). With
``granularity="bucket"`` parameters are grouped, in reverse registration order (the order in which
backward produces their gradients), into buckets of at most ``bucket_cap_bytes``; a bucket is sent as
soon as all of its gradients are ready, overlapping communication with the rest of the backward pass.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .topk import TopkWorkspace

__all__ = ["GradMessage", "build_messages"]


class GradMessage:
    """One compressed unit: ``params`` flattened in order into a vector of ``numel`` elements.

    Invariants: ``offsets[i]`` is where ``params[i]`` starts; ``residual`` has ``numel`` elements of
    ``dtype`` and starts at zero; ``name`` is identical on every rank (it names the collectives).
    """

    __slots__ = ("index", "name", "params", "numels", "offsets", "numel", "dtype", "residual",
                 "ready", "workspace")

    def __init__(self, index: int, params: Sequence[torch.nn.Parameter]) -> None:
        if not params:
            raise ValueError("a message needs at least one parameter")
        self.index = index
        self.name = f"hvd_flexcomm.msg{index}"
        self.params = list(params)
        self.numels = [p.numel() for p in self.params]
        self.offsets = []
        offset = 0
        for n in self.numels:
            self.offsets.append(offset)
            offset += n
        self.numel = offset
        self.dtype = self.params[0].dtype
        self.residual = torch.zeros(self.numel, dtype=self.dtype, device=self.params[0].device)
        self.ready = 0  # gradients ready this step (bucket granularity)
        self.workspace = TopkWorkspace()  # scratch buffers of top-k selection, reused every step

    def flat_grads(self) -> torch.Tensor:
        """A new 1-D tensor holding every parameter's gradient (zeros where a gradient is None)."""
        pieces = []
        for p in self.params:
            g = p.grad
            if g is None:
                pieces.append(torch.zeros(p.numel(), dtype=self.dtype, device=p.device))
            else:
                if g.is_sparse:
                    g = g.to_dense()
                pieces.append(g.reshape(-1))
        return torch.cat(pieces)

    def write_grads(self, flat: torch.Tensor) -> None:
        """Make each parameter's ``.grad`` a view of its slice of ``flat`` (no copy)."""
        for p, off, n in zip(self.params, self.offsets, self.numels):
            p.grad = flat[off:off + n].view_as(p)

    def nbytes(self) -> int:
        """Dense size of the message in bytes."""
        return self.numel * self.residual.element_size()


def build_messages(
    params: Sequence[torch.nn.Parameter], granularity: str, bucket_cap_bytes: int
) -> list[GradMessage]:
    """Group ``params`` (in registration order) into messages; see the module docstring.

    Every rank must pass the same parameters in the same order, so every rank builds the same
    messages (checked by the optimizer's first-step consistency check).
    """
    messages: list[GradMessage] = []
    if granularity == "model":
        by_kind: dict[tuple, list] = {}
        for p in params:
            by_kind.setdefault((p.dtype, p.device), []).append(p)
        for group in by_kind.values():
            messages.append(GradMessage(len(messages), group))
        return messages
    if granularity != "bucket":
        raise ValueError(f"granularity must be 'model' or 'bucket', got {granularity!r}")
    bucket: list = []
    size = 0
    for p in reversed(list(params)):
        nbytes = p.numel() * p.element_size()
        kind_changed = bucket and (p.dtype, p.device) != (bucket[0].dtype, bucket[0].device)
        if bucket and (kind_changed or size + nbytes > bucket_cap_bytes):
            messages.append(GradMessage(len(messages), bucket))
            bucket, size = [], 0
        bucket.append(p)
        size += nbytes
    if bucket:
        messages.append(GradMessage(len(messages), bucket))
    return messages
