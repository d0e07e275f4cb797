"""Root selection for AR-Topk: whose top-k indices everyone uses this step. Pure functions."""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["star_root", "var_root"]


def star_root(step: int, world_size: int) -> int:
    """STAR: round robin, ``step mod N``. Every rank computes the same root from the same step."""
    if world_size <= 0:
        raise ValueError(f"world_size must be positive, got {world_size}")
    return step % world_size


def var_root(squared_norms: Sequence[float]) -> int:
    """VAR: the rank whose compressed error-fed gradient has the largest squared norm.

    ``squared_norms[r]`` is rank r's ‖top-k(error-fed gradient)‖² (any unit, all ranks alike). Ties
    go to the lowest rank; NaN counts as smaller than any number, so a rank with a non-finite
    gradient is never chosen over a finite one (the step is then skipped anyway).
    """
    if len(squared_norms) == 0:
        raise ValueError("var_root needs at least one rank's norm")
    best_rank, best = 0, -math.inf
    for rank, value in enumerate(squared_norms):
        value = float(value)
        if math.isnan(value):
            continue
        if value > best:
            best_rank, best = rank, value
    return best_rank
