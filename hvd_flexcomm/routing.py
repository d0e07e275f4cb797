"""Per-step choice between the two sparse paths, with hysteresis against flapping.

The two paths are ``"allgather"`` (AG-Topk: every rank's values and indices are gathered) and
``"allreduce"`` (AR-Topk: the root's indices are broadcast, then the values are allreduced). The
inputs are predicted times in **ms** (normally from
:class:`hvd_flexcomm.calibration.CollectiveCostModel`).

Rule (:func:`choose_path`): stay on the current path unless the other one is predicted cheaper by
more than ``hysteresis`` (a fraction) of the current path's prediction, i.e. switch iff
``pred_other < (1 - hysteresis) * pred_current``. With no current path, take the cheaper one (ties
go to ``"allreduce"``). All ranks must feed identical predictions (e.g. decided on rank 0 and
broadcast) so that they choose identically; the function itself is pure and deterministic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

__all__ = ["PATHS", "Router", "RoutingDecision", "choose_path"]

#: The two sparse paths.
PATHS: tuple[str, str] = ("allgather", "allreduce")


def _check_pred(name: str, value: float) -> None:
    if math.isnan(value) or value < 0:
        raise ValueError(f"{name} must be >= 0 (ms; +inf allowed), got {value!r}")


def choose_path(
    pred_ag_ms: float,
    pred_ar_ms: float,
    current: Optional[str],
    hysteresis: float = 0.1,
) -> str:
    """Path to use this step: ``"allgather"`` or ``"allreduce"``.

    ``pred_ag_ms`` / ``pred_ar_ms``: predicted times in ms (>= 0; ``inf`` means "unusable").
    ``current``: the path in use, or None. ``hysteresis``: fraction in ``[0, 1)``.

    - ``current is None``: the argmin; ties (including two infinities) go to ``"allreduce"``.
    - otherwise: switch iff ``pred_other < (1 - hysteresis) * pred_current``, i.e. the other path
      is cheaper by strictly more than ``hysteresis * pred_current``; else keep ``current``.

    Consequences: with ``hysteresis = 0`` this never keeps a strictly costlier path; predictions
    that stay within the band never cause a switch; a switch never leads to a costlier path.
    """
    _check_pred("pred_ag_ms", pred_ag_ms)
    _check_pred("pred_ar_ms", pred_ar_ms)
    if not (0.0 <= hysteresis < 1.0):
        raise ValueError(f"hysteresis must be in [0, 1), got {hysteresis!r}")
    if current is None:
        return "allgather" if pred_ag_ms < pred_ar_ms else "allreduce"
    if current == "allgather":
        return "allreduce" if pred_ar_ms < (1.0 - hysteresis) * pred_ag_ms else "allgather"
    if current == "allreduce":
        return "allgather" if pred_ag_ms < (1.0 - hysteresis) * pred_ar_ms else "allreduce"
    raise ValueError(f"current must be None or one of {PATHS}, got {current!r}")


@dataclass(frozen=True)
class RoutingDecision:
    """One step's routing: ``path`` chosen at ``step`` from ``predicted_ms`` (path -> ms);
    ``switched`` is True when ``path`` differs from the previous step's path (False on the first
    decision)."""

    step: int
    path: str
    predicted_ms: dict[str, float] = field(default_factory=dict)
    switched: bool = False


class Router:
    """Remembers the current path and applies :func:`choose_path` each step.

    State: ``current`` (None before the first decision), ``hysteresis`` (fraction), ``n_switches``.
    """

    def __init__(self, hysteresis: float = 0.1, current: Optional[str] = None) -> None:
        if not (0.0 <= hysteresis < 1.0):
            raise ValueError(f"hysteresis must be in [0, 1), got {hysteresis!r}")
        if current is not None and current not in PATHS:
            raise ValueError(f"current must be None or one of {PATHS}, got {current!r}")
        self.hysteresis = float(hysteresis)
        self.current = current
        self.n_switches = 0

    def decide(self, step: int, pred_ag_ms: float, pred_ar_ms: float) -> RoutingDecision:
        """Choose the path for ``step`` from the two predictions (ms) and remember it."""
        path = choose_path(pred_ag_ms, pred_ar_ms, self.current, self.hysteresis)
        switched = self.current is not None and path != self.current
        if switched:
            self.n_switches += 1
        self.current = path
        return RoutingDecision(
            step=step,
            path=path,
            predicted_ms={"allgather": float(pred_ag_ms), "allreduce": float(pred_ar_ms)},
            switched=switched,
        )

    def reset(self) -> None:
        """Forget the current path (the next decision is a plain argmin)."""
        self.current = None
        self.n_switches = 0
