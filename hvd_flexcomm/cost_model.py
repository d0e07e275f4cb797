"""Textbook alpha-beta cost model of dense and sparse (top-k) collectives.

These are the closed forms of the paper's Table I and §3-D (method.md §3, §4). They are
*textbook* forms: a binomial tree, a recursive-doubling allgather, one message per phase, no fixed
per-operation cost. Horovod, Gloo and MPI do not behave like this (Horovod adds a ~1-3 ms cycle cost
per op and its allgather costs 2-4x an allreduce of equal bytes), so the runtime decisions use the
measured fits of :mod:`hvd_flexcomm.calibration`; this module documents the method and serves as a
prior and a test oracle.

Units and symbols, used by every function here:

- ``alpha_s``: per-message latency, **seconds**.
- ``beta_s_per_byte``: transfer time per byte, **seconds per byte** (``1 / bandwidth``; a link of
  ``G`` Gbit/s has ``beta = 1 / (G * 1.25e8)``).
- ``n``: number of workers (``n >= 1``); ``log`` is base 2.
- ``message_bytes`` / ``model_bytes``: **bytes**. ``model_bytes`` (``M``) is the dense gradient size
  in the value dtype, ``numel * value_bytes`` (``4 * numel`` for fp32).
- ``cr``: compression ratio ``c``, the **fraction of elements kept**, in ``(0, 1]``.
- ``value_bytes`` / ``index_bytes``: bytes per kept value / per index. Both default to 4: we send
  int32 indices (the research code sends int64, method.md §8 item 8).
- The number of kept elements is ``k = c * M / value_bytes`` (a real number here: the model is
  continuous). ``M * c`` is therefore the byte size of the kept values and
  ``k * index_bytes = M * c * index_bytes / value_bytes`` that of the indices.

Every cost function returns **seconds** and is non-negative and monotone non-decreasing in
``alpha_s``, ``beta_s_per_byte`` and the message size. With ``n == 1`` every collective costs 0.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

__all__ = [
    "SPARSE_PATHS",
    "SwitchingThresholds",
    "ag_topk_s",
    "allgather_s",
    "ar_topk_ring_s",
    "ar_topk_tree_s",
    "broadcast_s",
    "dense_ring_allreduce_s",
    "dense_tree_allreduce_s",
    "sparse_costs_s",
    "switching_thresholds",
    "textbook_choice",
    "y_ratio",
]

#: Names of the three sparse paths, in the order used to break exact ties in ``textbook_choice``.
SPARSE_PATHS: tuple[str, str, str] = ("ar_ring", "ar_tree", "allgather")


def _check_common(alpha_s: float, beta_s_per_byte: float, n: int) -> None:
    if not (alpha_s >= 0.0 and math.isfinite(alpha_s)):
        raise ValueError(f"alpha_s must be finite and >= 0, got {alpha_s!r}")
    if not (beta_s_per_byte >= 0.0 and math.isfinite(beta_s_per_byte)):
        raise ValueError(f"beta_s_per_byte must be finite and >= 0, got {beta_s_per_byte!r}")
    if int(n) != n or n < 1:
        raise ValueError(f"n must be an integer >= 1, got {n!r}")


def _check_bytes(name: str, value: float) -> None:
    if not (value >= 0.0 and math.isfinite(value)):
        raise ValueError(f"{name} must be finite and >= 0, got {value!r}")


def _check_sparse(model_bytes: float, cr: float, value_bytes: float, index_bytes: float) -> None:
    _check_bytes("model_bytes", model_bytes)
    if not (0.0 < cr <= 1.0):
        raise ValueError(f"cr (fraction kept) must be in (0, 1], got {cr!r}")
    if not value_bytes > 0:
        raise ValueError(f"value_bytes must be > 0, got {value_bytes!r}")
    _check_bytes("index_bytes", index_bytes)


# ----------------------------------------------------------------------------------------------
# Dense collectives (Table I), message of m bytes
# ----------------------------------------------------------------------------------------------


def dense_ring_allreduce_s(
    alpha_s: float, beta_s_per_byte: float, n: int, message_bytes: float
) -> float:
    """Ring allreduce of ``message_bytes`` bytes: ``2(N-1)α + 2((N-1)/N)·m·β`` seconds."""
    _check_common(alpha_s, beta_s_per_byte, n)
    _check_bytes("message_bytes", message_bytes)
    return 2.0 * (n - 1) * alpha_s + 2.0 * ((n - 1) / n) * message_bytes * beta_s_per_byte


def dense_tree_allreduce_s(
    alpha_s: float, beta_s_per_byte: float, n: int, message_bytes: float
) -> float:
    """Binomial-tree allreduce (reduce + broadcast): ``2α·log N + 2·log N·m·β`` seconds."""
    _check_common(alpha_s, beta_s_per_byte, n)
    _check_bytes("message_bytes", message_bytes)
    log_n = math.log2(n)
    return 2.0 * alpha_s * log_n + 2.0 * log_n * message_bytes * beta_s_per_byte


def broadcast_s(alpha_s: float, beta_s_per_byte: float, n: int, message_bytes: float) -> float:
    """Binomial-tree broadcast of ``message_bytes`` bytes: ``α·log N + log N·m·β`` seconds."""
    _check_common(alpha_s, beta_s_per_byte, n)
    _check_bytes("message_bytes", message_bytes)
    log_n = math.log2(n)
    return alpha_s * log_n + log_n * message_bytes * beta_s_per_byte


def allgather_s(alpha_s: float, beta_s_per_byte: float, n: int, message_bytes: float) -> float:
    """Allgather where every rank contributes ``message_bytes`` bytes: ``α·log N + (N-1)·m·β`` s."""
    _check_common(alpha_s, beta_s_per_byte, n)
    _check_bytes("message_bytes", message_bytes)
    return alpha_s * math.log2(n) + (n - 1) * message_bytes * beta_s_per_byte


# ----------------------------------------------------------------------------------------------
# Sparse (top-k) paths, §3-D
# ----------------------------------------------------------------------------------------------


def _kept_bytes(
    model_bytes: float, cr: float, value_bytes: float, index_bytes: float
) -> tuple[float, float]:
    """(value bytes, index bytes) of the ``k = c·M/value_bytes`` kept elements."""
    k = cr * model_bytes / value_bytes
    return k * value_bytes, k * index_bytes


def ag_topk_s(
    alpha_s: float,
    beta_s_per_byte: float,
    n: int,
    model_bytes: float,
    cr: float,
    value_bytes: float = 4,
    index_bytes: float = 4,
) -> float:
    """AG-Topk: one allgather of each rank's ``k`` values and ``k`` indices, in seconds.

    ``α·log N + (value_bytes + index_bytes)·k·β·(N-1)`` with ``k = c·M/value_bytes``; with 4-byte
    values and indices this is the paper's ``α·log N + 2Mcβ(N-1)``.
    """
    _check_common(alpha_s, beta_s_per_byte, n)
    _check_sparse(model_bytes, cr, value_bytes, index_bytes)
    v_bytes, i_bytes = _kept_bytes(model_bytes, cr, value_bytes, index_bytes)
    return allgather_s(alpha_s, beta_s_per_byte, n, v_bytes + i_bytes)


def _ar_topk_s(allreduce_s: Callable[[float, float, int, float], float], alpha_s: float,
               beta_s_per_byte: float, n: int, model_bytes: float, cr: float, value_bytes: float,
               index_bytes: float) -> float:
    """AR-Topk in seconds: broadcast of the root's ``k`` indices + ``allreduce_s`` of ``k``
    values (the ring or the tree form)."""
    _check_common(alpha_s, beta_s_per_byte, n)
    _check_sparse(model_bytes, cr, value_bytes, index_bytes)
    v_bytes, i_bytes = _kept_bytes(model_bytes, cr, value_bytes, index_bytes)
    return broadcast_s(alpha_s, beta_s_per_byte, n, i_bytes) + allreduce_s(
        alpha_s, beta_s_per_byte, n, v_bytes)


def ar_topk_ring_s(
    alpha_s: float,
    beta_s_per_byte: float,
    n: int,
    model_bytes: float,
    cr: float,
    value_bytes: float = 4,
    index_bytes: float = 4,
) -> float:
    """ART-Ring (Eq. 4a): broadcast of the root's ``k`` indices + ring allreduce of ``k`` values.

    Seconds. With 4-byte values and indices this is
    ``α[2(N-1) + log N] + Mcβ[2(N-1)/N + log N]``.
    """
    return _ar_topk_s(dense_ring_allreduce_s, alpha_s, beta_s_per_byte, n, model_bytes, cr,
                      value_bytes, index_bytes)


def ar_topk_tree_s(
    alpha_s: float,
    beta_s_per_byte: float,
    n: int,
    model_bytes: float,
    cr: float,
    value_bytes: float = 4,
    index_bytes: float = 4,
) -> float:
    """ART-Tree (Eq. 4b): broadcast of ``k`` indices + tree allreduce of ``k`` values, in seconds.

    With 4-byte values and indices this is ``3α·log N + 3Mcβ·log N``.
    """
    return _ar_topk_s(dense_tree_allreduce_s, alpha_s, beta_s_per_byte, n, model_bytes, cr,
                      value_bytes, index_bytes)


def sparse_costs_s(
    alpha_s: float,
    beta_s_per_byte: float,
    n: int,
    model_bytes: float,
    cr: float,
    value_bytes: float = 4,
    index_bytes: float = 4,
) -> dict[str, float]:
    """Costs in seconds of the three sparse paths, keyed ``"ar_ring"``, ``"ar_tree"``,
    ``"allgather"``."""
    args = (alpha_s, beta_s_per_byte, n, model_bytes, cr, value_bytes, index_bytes)
    return {
        "ar_ring": ar_topk_ring_s(*args),
        "ar_tree": ar_topk_tree_s(*args),
        "allgather": ag_topk_s(*args),
    }


def textbook_choice(
    alpha_s: float,
    beta_s_per_byte: float,
    n: int,
    model_bytes: float,
    cr: float,
    value_bytes: float = 4,
    index_bytes: float = 4,
) -> str:
    """The cheapest sparse path under the textbook model: ``"allgather"``, ``"ar_ring"`` or
    ``"ar_tree"`` (argmin of :func:`sparse_costs_s`).

    Exact ties are broken in the order of :data:`SPARSE_PATHS` (ring, then tree, then allgather).
    Equivalent to comparing :func:`y_ratio` with :func:`switching_thresholds` (Eq. 5).
    """
    costs = sparse_costs_s(alpha_s, beta_s_per_byte, n, model_bytes, cr, value_bytes, index_bytes)
    return min(SPARSE_PATHS, key=lambda path: costs[path])


# ----------------------------------------------------------------------------------------------
# Switching thresholds (Eq. 5)
# ----------------------------------------------------------------------------------------------


class SwitchingThresholds(NamedTuple):
    """Eq. 5 thresholds on ``y = α·B/(M·c)`` (dimensionless; ``B = 1/β`` in bytes/s).

    The first-named path is strictly cheaper than the second exactly when ``y`` is below the value:

    - ``ring_vs_tree``: ART-Ring < ART-Tree iff ``y < ring_vs_tree`` (``inf`` for N = 2: Ring never
      loses to Tree);
    - ``ring_vs_ag``: ART-Ring < AG-Topk iff ``y < ring_vs_ag``;
    - ``tree_vs_ag``: ART-Tree < AG-Topk iff ``y < tree_vs_ag``.

    A negative threshold means the first path never wins.
    """

    ring_vs_tree: float
    ring_vs_ag: float
    tree_vs_ag: float


def switching_thresholds(
    n: int, value_bytes: float = 4, index_bytes: float = 4
) -> SwitchingThresholds:
    """Thresholds of Eq. 5 for ``n >= 2`` workers, on ``y = α·B/(M·c)``.

    With ``L = log2 N`` and ``r = index_bytes / value_bytes`` (1 for the paper's 4/4 bytes):

    - Ring vs Tree: ``(L - (N-1)/N) / (N-1-L)`` (independent of ``r``; Eq. 5a);
    - Ring vs AG: ``((1+r)(N-1) - 2(N-1)/N - r·L) / (2(N-1))``, i.e. ``1 - 1/N - L/(2(N-1))`` for
      ``r = 1`` (Eq. 5b);
    - Tree vs AG: ``((1+r)(N-1) - (2+r)·L) / (2L)``, i.e. ``(N-1)/L - 3/2`` for ``r = 1`` (Eq. 5c).

    For N = 8 and r = 1: 0.53125, 0.6607 and 0.8333, giving the rule "Ring if y < 0.53, Tree if
    0.53 <= y < 0.83, AG otherwise" of method.md §4.
    """
    if int(n) != n or n < 2:
        raise ValueError(f"switching thresholds need n >= 2 workers, got {n!r}")
    if not value_bytes > 0:
        raise ValueError(f"value_bytes must be > 0, got {value_bytes!r}")
    _check_bytes("index_bytes", index_bytes)
    r = index_bytes / value_bytes
    log_n = math.log2(n)
    denom = (n - 1) - log_n
    if denom <= 1e-12:  # N = 2: log2 N == N - 1, the latency terms are equal
        ring_vs_tree = math.inf
    else:
        ring_vs_tree = (log_n - (n - 1) / n) / denom
    ring_vs_ag = ((1 + r) * (n - 1) - 2 * (n - 1) / n - r * log_n) / (2 * (n - 1))
    tree_vs_ag = ((1 + r) * (n - 1) - (2 + r) * log_n) / (2 * log_n)
    return SwitchingThresholds(ring_vs_tree, ring_vs_ag, tree_vs_ag)


def y_ratio(alpha_s: float, beta_s_per_byte: float, model_bytes: float, cr: float) -> float:
    """``y = α·B/(M·c) = α / (β·M·c)``: latency in bytes, relative to the kept value bytes.

    Dimensionless. ``inf`` when ``β == 0`` (infinite bandwidth) and ``α > 0``.
    """
    _check_common(alpha_s, beta_s_per_byte, 1)
    _check_sparse(model_bytes, cr, 4, 4)
    denom = beta_s_per_byte * model_bytes * cr
    if denom == 0.0:
        return math.inf if alpha_s > 0 else 0.0
    return alpha_s / denom
