"""Error feedback (residual memory) for top-k compression. Pure tensor functions.

Per rank and per message, the residual ``e`` starts at zero. Each step:

1. ``G = grad + e``                       (the *error-fed* gradient),
2. some entries of ``G`` are sent (indices ``idx``),
3. ``e' = G`` with ``e'[idx] = 0``        (what was not sent waits for later steps).

Invariant (tested): ``e' + scatter(idx, G[idx]) == G`` exactly, element for element.
"""

from __future__ import annotations

import torch

__all__ = ["commit_residual", "gain", "has_nonfinite", "squared_norm"]


def commit_residual(error_fed: torch.Tensor, sent_idx: torch.Tensor) -> torch.Tensor:
    """Turn the error-fed buffer into the next residual **in place**: zero the sent entries.

    Returns ``error_fed`` itself (now the residual). ``sent_idx`` holds unique indices.
    """
    error_fed.index_fill_(0, sent_idx.long(), 0)
    return error_fed


def squared_norm(tensor: torch.Tensor) -> float:
    """‖tensor‖² as a Python float (one pass; half precision is accumulated in float32).

    A non-finite result means the tensor holds NaN/Inf, or (float32 only, |x| > ~1e19) that the
    sum overflowed; :func:`has_nonfinite` tells the two apart.
    """
    if tensor.numel() == 0:
        return 0.0
    flat = tensor.reshape(-1)
    if flat.dtype in (torch.float16, torch.bfloat16):
        flat = flat.float()
    return float(torch.dot(flat, flat))


def has_nonfinite(tensor: torch.Tensor, squared: float) -> bool:
    """True if ``tensor`` holds a NaN or Inf. ``squared`` is its :func:`squared_norm`, which is
    finite for every finite tensor short of overflow, so the full check runs only when it is not."""
    if squared == squared and squared != float("inf"):
        return False
    return not bool(torch.isfinite(tensor).all())


def gain(sent_sq: float, total_sq: float) -> float:
    """Compression gain ‖compressed‖² / ‖error-fed‖², a fraction in [0, 1]; 1.0 for a zero gradient."""
    if total_sq <= 0.0:
        return 1.0
    return min(1.0, max(0.0, sent_sq / total_sq))
