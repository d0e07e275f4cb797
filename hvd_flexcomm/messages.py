"""Gradient messages: groups of parameters that are flattened and compressed as one vector.

A :class:`GradMessage` owns the per-rank residual (error-feedback memory) of its parameters. With
``granularity="model"`` there is one message per dtype holding every trainable parameter (the
paper's fused top-k: the best compression quality, one collective per step). With
``granularity="bucket"`` parameters are grouped, in reverse registration order (the order in which
backward produces their gradients), into buckets of at most ``bucket_cap_bytes``; a bucket is sent as
soon as all of its gradients are ready, overlapping communication with the rest of the backward pass.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Optional

import torch

from .topk import TopkWorkspace

__all__ = ["GradMessage", "build_messages", "message_tag"]


class GradMessage:
    """One compressed unit: ``params`` flattened in order into a vector of ``numel`` elements.

    Invariants: ``offsets[i]`` is where ``params[i]`` starts; ``residual`` has ``numel`` elements of
    ``dtype`` and starts at zero; ``name`` is identical on every rank (it names the collectives);
    ``key`` (``hvd_flexcomm.msg<index>``) names the residual in checkpoints.

    ``tag`` (see :func:`message_tag`) makes ``name`` differ between optimizers of one process:
    two top-k optimizers over different parameters (a GAN's two, or a backbone's and a head's
    with their own learning rates) would otherwise submit collectives of one name with different
    shapes -- concurrently, under ``granularity="bucket"``, which Horovod refuses, and one after
    the other otherwise, which makes every step negotiate its names afresh.
    """

    __slots__ = ("index", "key", "name", "params", "numels", "offsets", "numel", "dtype",
                 "residual", "ready", "workspace")

    def __init__(self, index: int, params: Sequence[torch.nn.Parameter], tag: str = "") -> None:
        if not params:
            raise ValueError("a message needs at least one parameter")
        self.index = index
        self.key = f"hvd_flexcomm.msg{index}"
        self.name = f"{self.key}.{tag}" if tag else self.key
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


def message_tag(params: Sequence[torch.nn.Parameter],
                names: Optional[Mapping[torch.nn.Parameter, str]] = None) -> str:
    """8 hex digits of a SHA-1 over the names (``names[p]``, ``?`` where missing) and shapes of
    ``params``, in order: identical on every rank that passes the same parameter names (checked by
    the optimizer's first-step consistency check), different for different parameter sets.
    Pure function."""
    names = names or {}
    text = "\n".join(f"{names.get(p, '?')}:{tuple(p.shape)}" for p in params)
    return hashlib.sha1(text.encode()).hexdigest()[:8]


def build_messages(
    params: Sequence[torch.nn.Parameter], granularity: str, bucket_cap_bytes: int,
    names: Optional[Mapping[torch.nn.Parameter, str]] = None,
) -> list[GradMessage]:
    """Group ``params`` (in registration order) into messages; see the module docstring.

    Every rank must pass the same parameters in the same order, so every rank builds the same
    messages (checked by the optimizer's first-step consistency check). ``names`` (parameter ->
    name, e.g. the optimizer's ``named_parameters``) tag each message's collective names
    (:func:`message_tag`); without it the tag comes from the shapes alone.
    """
    messages: list[GradMessage] = []

    def add(group: list) -> None:
        messages.append(GradMessage(len(messages), group, message_tag(group, names)))

    if granularity == "model":
        by_kind: dict[tuple, list] = {}
        for p in params:
            by_kind.setdefault((p.dtype, p.device), []).append(p)
        for group in by_kind.values():
            add(group)
        return messages
    if granularity != "bucket":
        raise ValueError(f"granularity must be 'model' or 'bucket', got {granularity!r}")
    bucket: list = []
    size = 0
    for p in reversed(list(params)):
        nbytes = p.numel() * p.element_size()
        kind_changed = bucket and (p.dtype, p.device) != (bucket[0].dtype, bucket[0].device)
        if bucket and (kind_changed or size + nbytes > bucket_cap_bytes):
            add(bucket)
            bucket, size = [], 0
        bucket.append(p)
        size += nbytes
    if bucket:
        add(bucket)
    return messages
