"""Choosing a compression ratio by trading communication time against compression gain.

Pure functions (no Horovod): fit smooth curves through per-candidate measurements, solve the
two-objective problem ``min_c (t(c), 1/gain(c))`` over ``c in [c_low, c_high]`` with pymoo's
NSGA-II, and pick one point of the Pareto front with weights (default 0.6 time / 0.4 gain, as the
paper), by one of two decompositions.

Two ways to pick the point (``pick``):

- ``"asf"`` (the paper's): an ASF with ``weights`` on the front normalised by
  :func:`normalise_front` (below): the point where the weighted, normalised losses of time and
  of gain against their best points balance;
- ``"tta"`` (time to accuracy, :func:`tta_objectives`): the point that minimises
  ``step_time(c)^w_time · (1/gain(c))^w_gain`` (pymoo's weighted-sum decomposition of the two
  objectives in log space), where ``step_time = t(c) + other_ms``. If the steps a run needs grow
  as ``(1/gain)^γ``, its time to a given accuracy is ``step_time · (1/gain)^γ``, and this pick
  minimises it for ``γ = w_gain / w_time`` (2/3 with the default weights). Unlike a
  normalisation by the front's span, it keeps the scale of both objectives: on a link where a
  step at CR 0.1 costs 1.6x one at CR 0.001 it picks a high CR, where it costs 2.5x a low one.
  The objective is flat near its minimum, so small moves of the measured gain curve move the
  pick far; :func:`tta_excess` says what keeping the CR in use would cost, and Adaptive
  announces a new CR only when that exceeds ``min_tta_gain``.

Normalisation (:func:`normalise_front`, for ``pick="asf"``), ``1/gain`` always by the front's
ideal and nadir:

- ``other_ms=None`` (the paper): time by its ideal and nadir too. Blind to the network's scale: a
  time curve ``a + b·c`` normalises to ``(c - c_low)/(c_high - c_low)`` whatever latency and
  bandwidth made ``a`` and ``b``;
- ``other_ms`` given (the step's time outside communication, ms): ``(t - t_ideal) / (other_ms +
  t_nadir)``, the step time a CR adds over the cheapest point, as a fraction of the dearest point's
  whole step. Where communication is most of the step and its cheapest point costs little (a
  bandwidth-bound network) this is the paper's normalisation; where latency or computation
  dominate, lowering the CR saves a smaller part of the step, the time objective spans less, and
  the pick moves to a higher CR (more of the gradient kept for little time).

Curves (``c`` is the CR, a fraction):

- communication time ``t(c) = a + b·c`` ms (bytes are proportional to ``c``; ``a, b >= 0``),
  least squares;
- gain ``g(c) = min(1, A·c^p)`` with ``0 < p <= 1``, least squares in log-log space (the
  energy kept by a top-k grows sub-linearly in k).

If a fit fails (too few points, non-finite parameters, or a relative error above 25% at some
candidate) the curve falls back to monotone piecewise-linear interpolation in ``log c``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np

__all__ = ["GRID_POINTS", "PICKS", "Curve", "MooResult", "fit_comm_curve", "fit_gain_curve",
           "normalise_front", "pick_on_grid", "preload", "solve_cr", "tta_excess", "tta_objectives"]

_FIT_TOLERANCE = 0.25
#: How :func:`solve_cr` picks one point of the front: ASF on the normalised front (the paper's),
#: or the weighted sum of the log objectives (time to accuracy, see :func:`tta_objectives`).
PICKS = ("asf", "tta")


@dataclass
class Curve:
    """A fitted (or interpolated) curve: ``fn`` maps an array of CRs to values; ``kind`` says
    which (``"fit"`` or ``"interpolation"``); ``params`` the fitted parameters, if any."""

    fn: Callable[[np.ndarray], np.ndarray]
    kind: str
    params: dict = field(default_factory=dict)

    def __call__(self, c):
        return self.fn(np.asarray(c, dtype=np.float64))


def _interpolation(crs: np.ndarray, values: np.ndarray, monotone: str) -> Curve:
    order = np.argsort(crs)
    x, y = np.log(crs[order]), values[order].astype(np.float64)
    y = np.maximum.accumulate(y) if monotone == "increasing" else y
    return Curve(lambda c: np.interp(np.log(np.clip(c, 1e-12, None)), x, y), "interpolation",
                 {"log_cr": x.tolist(), "values": y.tolist()})


def _within_tolerance(curve: Curve, crs: np.ndarray, values: np.ndarray) -> bool:
    pred = curve(crs)
    if not np.all(np.isfinite(pred)):
        return False
    return bool(np.all(np.abs(pred - values) <= _FIT_TOLERANCE * np.maximum(np.abs(values), 1e-9)))


def fit_comm_curve(crs: Sequence[float], ms: Sequence[float]) -> Curve:
    """Communication time (ms) as ``a + b·c``, or interpolation if that fits badly."""
    x, y = np.asarray(crs, dtype=np.float64), np.asarray(ms, dtype=np.float64)
    if len(x) >= 2 and np.all(np.isfinite(y)):
        design = np.column_stack([np.ones_like(x), x])
        (a, b), *_ = np.linalg.lstsq(design, y, rcond=None)
        if b < 0:
            a, b = float(np.mean(y)), 0.0
        if a < 0:
            a, b = 0.0, float(np.dot(x, y) / np.dot(x, x))
        curve = Curve(lambda c, a=a, b=b: a + b * c, "fit", {"a_ms": float(a), "b_ms": float(b)})
        if _within_tolerance(curve, x, y):
            return curve
    return _interpolation(x, y, "none")


def fit_gain_curve(crs: Sequence[float], gains: Sequence[float]) -> Curve:
    """Gain (fraction) as ``min(1, A·c^p)``, or monotone interpolation if that fits badly."""
    x, y = np.asarray(crs, dtype=np.float64), np.asarray(gains, dtype=np.float64)
    ok = np.isfinite(y) & (y > 0)
    if ok.sum() >= 2:
        lx, ly = np.log(x[ok]), np.log(np.minimum(y[ok], 1.0))
        p, log_a = np.polyfit(lx, ly, 1)
        if math.isfinite(p) and math.isfinite(log_a) and 0 < p <= 1.5:
            A = math.exp(log_a)
            curve = Curve(lambda c, A=A, p=p: np.minimum(1.0, A * np.power(c, p)), "fit",
                          {"A": A, "p": float(p)})
            if _within_tolerance(curve, x[ok], y[ok]):
                return curve
    return _interpolation(x, np.clip(np.nan_to_num(y, nan=0.0), 1e-6, 1.0), "increasing")


@dataclass
class MooResult:
    """The picked CR and why: its predicted time (ms) and gain, the front, the curves' kinds."""

    cr: float
    time_ms: float
    gain: float
    front: list = field(default_factory=list)  # [(cr, time_ms, gain), ...] sorted by cr
    curves: dict = field(default_factory=dict)
    weights: tuple = (0.6, 0.4)
    other_ms: Optional[float] = None  # the step's time outside communication; None: the paper's
    pick: str = "asf"  # "asf" or "tta" (see PICKS)
    #: the CR in use when the solve started, and (``pick="tta"``, that CR inside the bounds) by
    #: what fraction keeping it is predicted to lengthen the time to accuracy, from the same
    #: fitted curves (see :func:`tta_excess`); None otherwise
    current_cr: Optional[float] = None
    current_excess: Optional[float] = None

    def time_scale(self) -> str:
        if self.pick == "tta":
            return (f"time to accuracy: min step time^{self.weights[0]:g} x (1/gain)^"
                    f"{self.weights[1]:g}, step time = communication + {self.other_ms or 0.0:.1f} ms")
        if self.other_ms is None:
            return "time normalised by the front's span"
        return f"time as a fraction of the dearest step (+{self.other_ms:.1f} ms outside communication)"

    def explain(self) -> str:
        lo, hi = self.front[0], self.front[-1]
        keep = ("" if self.current_excess is None else
                f"; the cr in use, {self.current_cr:.4g}, is predicted to take "
                f"{100 * self.current_excess:.1f}% longer to accuracy")
        return (f"picked cr={self.cr:.4g}: predicted time {self.time_ms:.2f} ms, gain {self.gain:.3f}"
                f" (front from cr={lo[0]:.4g}: {lo[1]:.2f} ms / gain {lo[2]:.3f} to cr={hi[0]:.4g}: "
                f"{hi[1]:.2f} ms / gain {hi[2]:.3f}; weights time {self.weights[0]:g} / gain "
                f"{self.weights[1]:g}; {self.time_scale()}; curves: time "
                f"{self.curves.get('time')}, gain {self.curves.get('gain')}{keep})")


def preload() -> None:
    """Import pymoo's modules now (about 2 s the first time): a controller calls this when it is
    built, so the first solve in the background thread does not hold the interpreter for the
    import while training runs."""
    import pymoo.algorithms.moo.nsga2  # noqa: F401
    import pymoo.decomposition.asf  # noqa: F401
    import pymoo.optimize  # noqa: F401


def _check_other_ms(other_ms: Optional[float]) -> None:
    if other_ms is not None and not (isinstance(other_ms, (int, float)) and math.isfinite(other_ms)
                                     and other_ms >= 0):
        raise ValueError(f"other_ms must be a finite number >= 0 (ms) or None, got {other_ms!r}")


def normalise_front(F: np.ndarray, other_ms: Optional[float] = None) -> np.ndarray:
    """Objectives ``F`` (rows: points; columns: time in ms, 1/gain) mapped for the ASF: each
    column minus its ideal (so the ideal point is 0), divided by the nadir minus the ideal, except
    the time column when ``other_ms`` (ms, >= 0) is given: divided by ``other_ms`` plus the time
    nadir. Values in [0, 1]; a column without spread maps to 0."""
    _check_other_ms(other_ms)
    F = np.asarray(F, dtype=np.float64)
    ideal, nadir = F.min(axis=0), F.max(axis=0)
    span = nadir - ideal
    if other_ms is not None:
        span[0] = other_ms + nadir[0]
    return (F - ideal) / np.where(span > 1e-12, span, 1.0)


def tta_objectives(F: np.ndarray, other_ms: float) -> np.ndarray:
    """Objectives ``F`` (rows: points; columns: communication time in ms, 1/gain) as the log
    factors by which each point's time to accuracy exceeds the best point's, per objective:
    ``ln(step(c) / step_min)`` with ``step = time + other_ms`` (ms, >= 0), and
    ``ln((1/gain) / (1/gain)_min)``. Both columns are >= 0 and share one unit (a log factor on
    the run's time), so a weighted sum of them is the log of
    ``step^w_time · (1/gain)^w_gain`` up to a constant."""
    _check_other_ms(other_ms)
    F = np.asarray(F, dtype=np.float64)
    step_ms = np.maximum(F[:, 0] + other_ms, 1e-9)
    inverse_gain = np.maximum(F[:, 1], 1e-12)
    logs = np.column_stack([np.log(step_ms), np.log(inverse_gain)])
    return logs - logs.min(axis=0)


def tta_excess(time_ms: tuple, inverse_gain: tuple, other_ms: float, weights: tuple) -> float:
    """By what fraction (>= -1) a point ``(time_ms[0], inverse_gain[0])`` is predicted to
    lengthen the time to accuracy against a point ``(time_ms[1], inverse_gain[1])``: the ratio
    of ``step · (1/gain)^(w_gain/w_time)`` (``step = time + other_ms``, ms), minus 1. That is the
    time-to-accuracy pick's objective ``step^w_time · (1/gain)^w_gain`` raised to ``1/w_time``,
    so that it reads as wall time (the difference of the two points' weighted
    :func:`tta_objectives`, whose offsets cancel). Pure function."""
    F = np.column_stack([np.asarray(time_ms, dtype=np.float64),
                         np.asarray(inverse_gain, dtype=np.float64)])
    w = np.asarray(weights, dtype=np.float64)
    objective = tta_objectives(F, other_ms) @ w
    return math.exp((objective[0] - objective[1]) / w[0]) - 1.0


def _check_pick(c_low: float, c_high: float, other_ms: Optional[float], pick: str) -> None:
    if not 0 < c_low < c_high <= 1:
        raise ValueError(f"need 0 < c_low < c_high <= 1, got {c_low}, {c_high}")
    _check_other_ms(other_ms)
    if pick not in PICKS:
        raise ValueError(f"pick must be one of {PICKS}, got {pick!r}")
    if pick == "tta" and other_ms is None:
        raise ValueError("pick='tta' needs other_ms (the step's time outside communication, ms)")


def _objectives(time_curve: Curve, gain_curve: Curve, c: np.ndarray) -> np.ndarray:
    """Rows ``(time ms, 1/gain)`` of the CRs ``c``: the two objectives."""
    return np.column_stack([time_curve(c), 1.0 / np.maximum(gain_curve(c), 1e-9)])


def _pick_point(X: np.ndarray, F: np.ndarray, time_curve: Curve, gain_curve: Curve,
                c_low: float, c_high: float, weights: tuple, other_ms: Optional[float], pick: str,
                current_cr: Optional[float]) -> MooResult:
    """One point of the front ``(X, F)`` (CRs, objective rows) by ``pick`` (see :func:`solve_cr`),
    as a :class:`MooResult`."""
    from pymoo.decomposition.asf import ASF
    from pymoo.decomposition.weighted_sum import WeightedSum

    w = np.asarray(weights, dtype=np.float64)
    if pick == "tta":
        chosen = int(WeightedSum().do(tta_objectives(F, other_ms), w).argmin())
    else:
        chosen = int(ASF().do(normalise_front(F, other_ms), 1.0 / w).argmin())
    order = np.argsort(X[:, 0])
    front = [(float(X[i, 0]), float(F[i, 0]), float(1.0 / F[i, 1])) for i in order]
    excess = None
    if pick == "tta" and current_cr is not None and c_low <= current_cr <= c_high:
        now = np.array([float(current_cr)])
        excess = tta_excess((float(time_curve(now)[0]), float(F[chosen, 0])),
                            (1.0 / max(float(gain_curve(now)[0]), 1e-9), float(F[chosen, 1])),
                            other_ms, weights)
    return MooResult(cr=float(X[chosen, 0]), time_ms=float(F[chosen, 0]),
                     gain=float(1.0 / F[chosen, 1]), front=front,
                     curves={"time": time_curve.kind, "gain": gain_curve.kind},
                     weights=tuple(weights), other_ms=other_ms, pick=pick,
                     current_cr=current_cr, current_excess=excess)


def solve_cr(crs: Sequence[float], comm_ms: Sequence[float], gains: Sequence[float],
             c_low: float, c_high: float, weights: tuple = (0.6, 0.4), pop_size: int = 40,
             n_gen: int = 40, seed: int = 1, other_ms: Optional[float] = None,
             pick: str = "asf", current_cr: Optional[float] = None) -> MooResult:
    """NSGA-II over ``c in [c_low, c_high]`` on the fitted curves, then one point of the front:
    ``pick="asf"``, the ASF with ``weights`` on the front normalised by :func:`normalise_front`
    (``other_ms``: the step's time outside communication, ms, or None for the paper's
    normalisation); ``pick="tta"``, the least weighted sum of :func:`tta_objectives` (needs
    ``other_ms``). ``current_cr``: the CR in use; with ``pick="tta"`` and ``current_cr`` within
    the bounds, the result says by what fraction keeping it would lengthen the time to accuracy
    (``current_excess``, :func:`tta_excess` of the fitted curves at both CRs)."""
    from pymoo.algorithms.moo.nsga2 import NSGA2
    from pymoo.core.problem import Problem
    from pymoo.operators.crossover.sbx import SBX
    from pymoo.operators.mutation.pm import PM
    from pymoo.operators.sampling.rnd import FloatRandomSampling
    from pymoo.optimize import minimize

    _check_pick(c_low, c_high, other_ms, pick)
    time_curve = fit_comm_curve(crs, comm_ms)
    gain_curve = fit_gain_curve(crs, gains)

    class _Problem(Problem):
        def __init__(self) -> None:
            super().__init__(n_var=1, n_obj=2, xl=np.array([c_low]), xu=np.array([c_high]))

        def _evaluate(self, x, out, *args, **kwargs):
            out["F"] = _objectives(time_curve, gain_curve, x[:, 0])

    algorithm = NSGA2(pop_size=pop_size, n_offsprings=max(2, pop_size // 4),
                      sampling=FloatRandomSampling(), crossover=SBX(prob=0.9, eta=15),
                      mutation=PM(eta=20), eliminate_duplicates=True)
    res = minimize(_Problem(), algorithm, ("n_gen", n_gen), seed=seed, verbose=False)
    X, F = np.atleast_2d(res.X).reshape(-1, 1), np.atleast_2d(res.F)
    return _pick_point(X, F, time_curve, gain_curve, c_low, c_high, weights, other_ms, pick,
                       current_cr)


#: CRs of the grid :func:`pick_on_grid` evaluates, log-spaced over ``[c_low, c_high]``, ends
#: included: adjacent points 1.2% apart for the default range (a factor 100).
GRID_POINTS = 401


def _non_dominated(F: np.ndarray) -> np.ndarray:
    """Indices of the rows of ``F`` (both objectives minimised) that no other row dominates."""
    keep = []
    for i, row in enumerate(F):
        dominated = np.all(F <= row, axis=1) & np.any(F < row, axis=1)
        if not dominated.any():
            keep.append(i)
    return np.asarray(keep, dtype=np.int64)


def pick_on_grid(crs: Sequence[float], comm_ms: Sequence[float], gains: Sequence[float],
                 c_low: float, c_high: float, weights: tuple = (0.6, 0.4),
                 other_ms: Optional[float] = None, pick: str = "asf",
                 current_cr: Optional[float] = None, points: int = GRID_POINTS) -> MooResult:
    """The point :func:`solve_cr` picks, from the same fitted curves, without the solver: the
    objectives on ``points`` CRs log-spaced over ``[c_low, c_high]`` (ends included), their
    non-dominated ones as the front, then the same pick. No randomness and a few milliseconds,
    so every rank computes the same CR from the same inputs at once (Adaptive's first CR, see
    ``adaptive.AdaptiveController.pick_from_probe``). The ``"tta"`` pick is a weighted sum of
    the objectives, whose minimum over the front is its minimum over all ``c``: the grid finds
    it to within one grid step (about 1.2% in ``c`` over a factor 100). Arguments as
    :func:`solve_cr`; ``points`` >= 2."""
    _check_pick(c_low, c_high, other_ms, pick)
    if points < 2:
        raise ValueError(f"points must be >= 2, got {points!r}")
    time_curve = fit_comm_curve(crs, comm_ms)
    gain_curve = fit_gain_curve(crs, gains)
    grid = np.exp(np.linspace(math.log(c_low), math.log(c_high), int(points)))
    grid[0], grid[-1] = c_low, c_high
    F = _objectives(time_curve, gain_curve, grid)
    front = _non_dominated(F)
    return _pick_point(grid[front].reshape(-1, 1), F[front], time_curve, gain_curve, c_low,
                       c_high, weights, other_ms, pick, current_cr)
