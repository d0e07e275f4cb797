"""Online calibration of collective costs from timed operations.

The textbook alpha-beta forms (:mod:`hvd_flexcomm.cost_model`) do not describe what Horovod, Gloo
and MPI actually do: Horovod adds a fixed cost of about 1-3 ms per operation (its background cycle),
and its allgather costs 2-4x an allreduce of the same bytes (environment.md, "Baseline costs"). So
every collective kind gets its own measured line for the current world size::

    t_ms(bytes) = a_ms + b_ms_per_byte * bytes,      a_ms >= 0, b_ms_per_byte >= 0

Units: sizes are **bytes**, times **milliseconds**, ``b`` is **ms per byte**. For an allgather,
``bytes`` is the payload each rank contributes (not the gathered total); for a broadcast, the
broadcast buffer; for an allreduce, the reduced buffer.

The fitting procedure of :class:`LinearCostFit` is, deliberately, simple:

1. keep the most recent ``window`` samples (``bytes``, ``ms``);
2. **robustness**: collapse repeated measurements at the same byte size to their *interquartile
   mean* (:func:`central_ms`: the mean of what is left after dropping the lowest and the highest
   quarter, at least one each from three samples on). An isolated outlier at a size measured
   three or more times has no effect, as with a median; unlike a median, a path whose steps
   alternate between two levels is charged between them, in proportion (at 0.1 ms one way and
   100 Mbit/s, N = 2, AG-Topk's steps at CR 0.1 took ~800 ms or ~1300 ms, about half each; the
   median sat at ~830 ms until the slow level was the majority of the window, and Flexible kept
   the allgather 28 steps after a change made AR-Topk's ~820 ms the cheaper path);
3. weighted least squares (``np.linalg.lstsq``) of ``a + b·x`` through the per-size values, with
   weight ``count / value²`` on each squared residual, i.e. *relative* errors, counted once per
   sample: a size measured often pins the line, and small sizes (where the fixed cost dominates)
   matter as much as large ones;
4. **constraints** ``a >= 0`` and ``b >= 0``: if the unconstrained ``b < 0``, ``b = 0`` and ``a`` is
   the weighted mean of the values; if ``a < 0``, ``a = 0`` and ``b`` is refitted by weighted least
   squares through the origin (both cannot be negative, since all times are >= 0). A slope
   clamped to 0 holds for this fit only: it is not learned as the slope prior below while an
   earlier fit measured a positive one (noise at two nearby levels, e.g. a latency-bound link,
   would otherwise make every later single-size fit flat: in one run the allgather's line
   predicted 570 ms at every candidate CR from 0.001 to 0.1);
5. **a single distinct size** ``x0`` with value ``y0`` cannot separate ``a`` from ``b``. Then a
   *slope prior* is used if there is one: the slope of the most recent fit that had two or more
   sizes, else the ``prior_b_ms_per_byte`` given to the constructor; ``b = min(prior, y0/x0)`` and
   ``a = y0 - b·x0``. Without a prior, ``a = 0`` and ``b = y0/x0`` (pure ratio); if ``x0 == 0``,
   ``a = y0`` and ``b = 0``. Either way the line passes through the measured point exactly. This
   matters in steady state, when every step measures the same k and the probe sizes have left the
   window: the level keeps tracking the measurements and the split keeps the last known slope.
   **A point below the learned slope** (``y0 < prior·x0``: no fixed cost ``>= 0`` lets that slope
   pass through it) does not flatten the line to one through the origin when the learned fit had
   a fixed cost ``a_l > 0``: the learned line is scaled down to pass through the point, ``a =
   s·a_l``, ``b = s·prior``, ``s = y0 / (a_l + prior·x0)`` (the fall is shared by the fixed cost
   and the per-byte cost in proportion to their parts of the learned line's prediction at
   ``x0``). Through the origin, a measurement at a large size predicted a small one at a fraction
   of its cost: under Open MPI (static link, seed 43 of ``runs/mpi_d23dc39``) a drift probe timed
   the allgather only at CR 0.034, below its learned line, and the line through the origin then
   predicted 5.1 ms at CR 0.001 where span steps had measured 27-60 ms; the CR moved to 0.004
   for 45 steps on it. The same scaling replaces a clamped negative level in 6.
6. **a narrow span** of sizes (largest < ``MIN_SLOPE_SPAN`` × smallest, e.g. steps at CRs 0.016
   and 0.011 once the probe sizes have left the window) cannot pin the slope either: step-to-step
   noise would tilt it, even to zero, which makes every size cost the same. With a slope prior
   the slope is kept and only the level is fitted (weighted mean of ``value - b·x``); the learned
   slope changes only through fits over a wide span (the probes). A level below 0 (the values
   lie below the learned slope through the origin) scales the learned line instead, as in 5, by
   the weighted least-squares factor ``s`` of ``value ≈ s·(a_l + prior·x)``.
7. **a wide base pins the slope**: once the slope was learned over sizes ``LEARN_SPAN`` (8) or
   more apart (the probes span the candidate CRs, 100x), a base narrower than 8x (and than
   that one) fits the level only, as in 6. Steps at two nearby CRs after a CR change (0.0057
   and 0.0216, say: 3.8x) and the last few samples of the old CR as they leave the window had
   set the slope through a short chord in the latency-bound region: on a static 100 Mbit/s,
   5 ms link the allgather's line then predicted 170-230 ms at CR 0.1, where its steps took
   about 330 ms, and the CR went to 0.1 for 50 steps. A network change unpins the slope
   (:meth:`LinearCostFit.unpin_slope`, after a drift probe), so that the spans that follow
   (4x or more from the CR in use) can replace it; so do two routine spans in a row that find
   the model off on the same side, or one whose steps all ran far faster than it predicts
   (``flexible.FlexibleController._close_span``).

Refits happen on every :meth:`LinearCostFit.add` (at most ``window`` points: tens of microseconds).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Optional

import numpy as np

__all__ = [
    "KINDS",
    "CollectiveCostModel",
    "DriftDetector",
    "LinearCostFit",
    "NotCalibratedError",
    "probe_ks",
]

#: Collective kinds that get their own fitted line.
KINDS: tuple[str, str, str] = ("allgather", "broadcast", "allreduce")

#: Per-size levels below this many ms are treated as this value when forming relative weights.
_MIN_MS_FOR_WEIGHT = 1e-6

_DICT_VERSION = 1

#: A fit learns its slope only from sizes spanning at least this ratio (largest / smallest).
MIN_SLOPE_SPAN = 2.0
#: Once a slope was learned over a base this wide (or wider), a narrower base fits the level
#: only (see the module docstring, 7), until :meth:`LinearCostFit.unpin_slope`.
LEARN_SPAN = 8.0


class NotCalibratedError(RuntimeError):
    """A prediction was requested from a fit that has no samples."""


def _check_sample(nbytes: float, ms: float) -> None:
    if not (math.isfinite(nbytes) and nbytes >= 0):
        raise ValueError(f"bytes must be finite and >= 0, got {nbytes!r}")
    if not (math.isfinite(ms) and ms >= 0):
        raise ValueError(f"measured ms must be finite and >= 0, got {ms!r}")


def central_ms(values: Sequence[float]) -> float:
    """The interquartile mean of repeated timings of one size (ms): sorted, the lowest and the
    highest ``max(1, n // 4)`` dropped from ``n >= 3`` values, the rest averaged (one or two
    values: their mean). Equals the median for up to 4 values; never outside
    ``[min, max]``."""
    ordered = np.sort(np.asarray(values, dtype=np.float64))
    n = len(ordered)
    if n == 0:
        raise ValueError("need at least one timing")
    if n >= 3:
        trim = max(1, n // 4)
        ordered = ordered[trim:n - trim]
    return float(ordered.mean())


class LinearCostFit:
    """Robust, constrained line ``t_ms = a_ms + b_ms_per_byte·bytes`` over a bounded window.

    See the module docstring for the procedure. Invariants: ``a_ms >= 0``, ``b_ms_per_byte >= 0``,
    ``n_samples <= window``; :meth:`predict_ms` is non-decreasing in ``bytes``; the learned slope
    (the prior of single-size fits) is the slope of the latest multi-size fit, unless that was
    clamped to 0 after a positive one.
    """

    def __init__(self, window: int = 64, prior_b_ms_per_byte: Optional[float] = None) -> None:
        """``window``: number of most recent samples kept (>= 1). ``prior_b_ms_per_byte``: optional
        slope (ms per byte, >= 0) used only while the window holds a single distinct size and no
        multi-size fit has been seen yet."""
        if int(window) != window or window < 1:
            raise ValueError(f"window must be an integer >= 1, got {window!r}")
        if prior_b_ms_per_byte is not None and not (
            math.isfinite(prior_b_ms_per_byte) and prior_b_ms_per_byte >= 0
        ):
            raise ValueError(
                f"prior_b_ms_per_byte must be finite and >= 0, got {prior_b_ms_per_byte!r}"
            )
        self.window = int(window)
        self.prior_b_ms_per_byte = prior_b_ms_per_byte
        self._samples: deque[tuple[float, float]] = deque(maxlen=self.window)
        self._learned_b: Optional[float] = None  # slope of the latest fit with >= 2 sizes
        self._learned_a: Optional[float] = None  # and that fit's fixed cost (ms)
        #: the base (largest / smallest size) of the fit the learned slope came from
        self._learned_span: Optional[float] = None
        self._a: Optional[float] = None
        self._b: Optional[float] = None

    # -- samples ---------------------------------------------------------------------------------

    def add(self, nbytes: float, ms: float) -> None:
        """Record one measurement (``nbytes`` bytes took ``ms`` milliseconds) and refit."""
        _check_sample(nbytes, ms)
        self._samples.append((float(nbytes), float(ms)))
        self._refit()

    def extend(self, samples: Iterable[tuple[float, float]]) -> None:
        """Record several ``(bytes, ms)`` measurements, oldest first."""
        for nbytes, ms in samples:
            self.add(nbytes, ms)

    @property
    def n_samples(self) -> int:
        """Number of samples in the window."""
        return len(self._samples)

    @property
    def n_sizes(self) -> int:
        """Number of distinct byte sizes in the window."""
        return len({x for x, _ in self._samples})

    def n_samples_at(self, nbytes: float) -> int:
        """Number of samples in the window at exactly ``nbytes`` bytes."""
        return sum(1 for x, _ in self._samples if x == float(nbytes))

    @property
    def samples(self) -> list[tuple[float, float]]:
        """The window's ``(bytes, ms)`` samples, oldest first (a copy)."""
        return list(self._samples)

    @property
    def has_slope(self) -> bool:
        """True when ``a`` and ``b`` are separately identified: two or more sizes in the window, or
        a slope prior (learned from an earlier multi-size fit, or given)."""
        return self.n_sizes >= 2 or self._slope_prior() is not None

    def reset(self) -> None:
        """Forget all samples and the learned slope (the constructor's prior is kept)."""
        self._samples.clear()
        self._learned_b = None
        self._learned_a = None
        self._learned_span = None
        self._a = None
        self._b = None

    def reset_level(self) -> None:
        """Forget the samples but keep the learned slope: the next sample (a single size)
        re-anchors the line through itself with the slope measured before (used when a
        periodic probe refreshes a collective that has not been timed for a while)."""
        self._samples.clear()
        self._a = None
        self._b = None

    def drop_size(self, nbytes: float) -> None:
        """Forget the samples at exactly ``nbytes`` bytes and refit; the learned slope is kept
        (a real step at that size supersedes what the probes timed there, see
        ``flexible.FlexibleController.observe_step``)."""
        kept = [(x, y) for x, y in self._samples if x != float(nbytes)]
        if len(kept) != len(self._samples):
            self._samples.clear()
            self._samples.extend(kept)
            self._refit()

    def unpin_slope(self) -> None:
        """Let the next fit over any base of ``MIN_SLOPE_SPAN`` or more replace the learned
        slope (the network changed: the slope learned over a wide base is the old network's)."""
        self._learned_span = None

    def keep_sizes(self, sizes: Iterable[float]) -> None:
        """Forget the samples at every size not in ``sizes`` (bytes) and refit; the learned slope
        is kept while fewer than two sizes remain. (A span step, ``flexible.py``, measures the
        far end of the candidates on real steps: what a probe measured there before is dropped,
        so the line rests on the steps alone.)"""
        keep = {float(x) for x in sizes}
        kept = [(x, y) for x, y in self._samples if x in keep]
        self._samples.clear()
        self._samples.extend(kept)
        self._refit()

    # -- fit -------------------------------------------------------------------------------------

    def _slope_prior(self) -> Optional[float]:
        return self._learned_b if self._learned_b is not None else self.prior_b_ms_per_byte

    def _refit(self) -> None:
        if not self._samples:
            self._a = self._b = None
            return
        data = np.asarray(self._samples, dtype=np.float64)
        sizes, inverse, counts = np.unique(data[:, 0], return_inverse=True, return_counts=True)
        levels = np.array([central_ms(data[inverse == i, 1]) for i in range(len(sizes))])
        if len(sizes) == 1:
            self._a, self._b = self._fit_single(float(sizes[0]), float(levels[0]))
            return
        prior = self._slope_prior()
        base = float(sizes.max()) / max(float(sizes.min()), 1.0)
        needed = MIN_SLOPE_SPAN
        if self._learned_span is not None:
            needed = max(MIN_SLOPE_SPAN, min(self._learned_span, LEARN_SPAN))
        if prior is not None and base < needed:
            w = counts / np.maximum(levels, _MIN_MS_FOR_WEIGHT) ** 2
            level = float(np.sum(w * (levels - prior * sizes)) / np.sum(w))
            if level < 0.0 and self._learned_line_has_fixed_cost():
                self._a, self._b = self._scaled_learned_line(sizes, levels, w)
            else:
                self._a, self._b = max(level, 0.0), prior
            return
        self._a, self._b = _weighted_constrained_line(sizes, levels, counts)
        if self._b > 0.0 or self._learned_b is None:  # a clamped zero is not a measured slope
            self._learned_b, self._learned_a, self._learned_span = self._b, self._a, base

    def _learned_line_has_fixed_cost(self) -> bool:
        """Whether a slope was learned (it is then the slope prior, :meth:`_slope_prior`) and its
        fit had a fixed cost > 0 (a line that can be scaled, module docstring 5)."""
        return (self._learned_b is not None
                and self._learned_a is not None and self._learned_a > 0.0)

    def _scaled_learned_line(self, sizes: np.ndarray, levels: np.ndarray,
                             weights: np.ndarray) -> tuple[float, float]:
        """The learned line times the weighted least-squares factor ``s`` of ``levels ≈
        s·(a_l + b_l·sizes)``: ``(s·a_l, s·b_l)``, both >= 0 (module docstring 5 and 6)."""
        a_l, b_l = float(self._learned_a), float(self._learned_b)
        shape = a_l + b_l * sizes
        s = float(np.sum(weights * levels * shape) / np.sum(weights * shape * shape))
        return s * a_l, s * b_l

    def _fit_single(self, x0: float, y0: float) -> tuple[float, float]:
        prior = self._slope_prior()
        if x0 <= 0.0:
            return y0, (prior if prior is not None else 0.0)
        ratio = y0 / x0
        if prior is None:
            return 0.0, ratio
        if ratio < prior and self._learned_line_has_fixed_cost():
            return self._scaled_learned_line(np.array([x0]), np.array([y0]), np.ones(1))
        b = min(prior, ratio)
        return max(y0 - b * x0, 0.0), b

    def _require(self) -> tuple[float, float]:
        if self._a is None or self._b is None:
            raise NotCalibratedError("no samples: add measurements before predicting")
        return self._a, self._b

    @property
    def a_ms(self) -> float:
        """Fixed cost per operation, ms (>= 0). Raises :class:`NotCalibratedError` when empty."""
        return self._require()[0]

    @property
    def b_ms_per_byte(self) -> float:
        """Cost per byte, ms/byte (>= 0). Raises :class:`NotCalibratedError` when empty."""
        return self._require()[1]

    def predict_ms(self, nbytes: float) -> float:
        """Predicted time in ms for ``nbytes`` bytes (>= 0)."""
        if not (math.isfinite(nbytes) and nbytes >= 0):
            raise ValueError(f"bytes must be finite and >= 0, got {nbytes!r}")
        a, b = self._require()
        return a + b * float(nbytes)

    # -- checkpoints -----------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable state (window, prior, learned slope, samples)."""
        return {
            "version": _DICT_VERSION,
            "window": self.window,
            "prior_b_ms_per_byte": self.prior_b_ms_per_byte,
            "learned_b_ms_per_byte": self._learned_b,
            "learned_a_ms": self._learned_a,
            "learned_span": self._learned_span,
            "samples": [[x, y] for x, y in self._samples],
        }

    @classmethod
    def from_dict(cls, state: Mapping[str, Any]) -> LinearCostFit:
        """Rebuild a fit saved by :meth:`to_dict`; predictions are identical."""
        if state.get("version") != _DICT_VERSION:
            raise ValueError(f"unsupported LinearCostFit state version {state.get('version')!r}")
        fit = cls(window=int(state["window"]), prior_b_ms_per_byte=state["prior_b_ms_per_byte"])
        for x, y in state["samples"]:
            _check_sample(float(x), float(y))
            fit._samples.append((float(x), float(y)))
        learned = state.get("learned_b_ms_per_byte")
        fit._learned_b = None if learned is None else float(learned)
        learned_a = state.get("learned_a_ms")  # absent in states saved before it was kept
        fit._learned_a = None if learned_a is None else float(learned_a)
        span = state.get("learned_span")
        fit._learned_span = None if span is None else float(span)
        fit._refit()  # with >= 2 sizes this recomputes the same slope; with 1 it uses `learned`
        return fit

    def __repr__(self) -> str:
        if self._a is None:
            return f"LinearCostFit(window={self.window}, empty)"
        return (
            f"LinearCostFit(a_ms={self._a:.4g}, b_ms_per_byte={self._b:.4g}, "
            f"n_samples={self.n_samples}, n_sizes={self.n_sizes})"
        )


def _weighted_constrained_line(
    sizes: np.ndarray, levels: np.ndarray, counts: np.ndarray
) -> tuple[float, float]:
    """Constrained (a >= 0, b >= 0) weighted least-squares line through per-size levels (central_ms).

    Weight on each squared residual: ``count / max(level, tiny)²`` (relative error).
    """
    w = counts / np.maximum(levels, _MIN_MS_FOR_WEIGHT) ** 2
    sw = np.sqrt(w)
    x_scale = float(sizes.max())  # > 0: at least two distinct non-negative sizes
    xs = sizes / x_scale
    design = np.column_stack([np.ones_like(xs), xs]) * sw[:, None]
    coef, *_ = np.linalg.lstsq(design, levels * sw, rcond=None)
    a, b_scaled = float(coef[0]), float(coef[1])
    if b_scaled < 0.0:
        return float(np.sum(w * levels) / np.sum(w)), 0.0
    if a < 0.0:
        b_scaled = float(np.sum(w * xs * levels) / np.sum(w * xs * xs))
        return 0.0, max(b_scaled, 0.0) / x_scale
    return a, b_scaled / x_scale


class CollectiveCostModel:
    """One :class:`LinearCostFit` per collective kind (``KINDS``), for one world size.

    Horovod's allgather cost depends on the bytes each rank contributes *and* on the number of
    ranks; the fits hold for the ``world_size`` they were measured at, so the model is tied to it
    (predictions for another ``n`` raise ``ValueError``; after an elastic resize, build a new
    model). All sizes are bytes, all times ms.
    """

    def __init__(
        self,
        world_size: int,
        window: int = 64,
        prior_b_ms_per_byte: Optional[Mapping[str, float]] = None,
    ) -> None:
        """``prior_b_ms_per_byte``: optional per-kind slope priors (see :class:`LinearCostFit`)."""
        if int(world_size) != world_size or world_size < 1:
            raise ValueError(f"world_size must be an integer >= 1, got {world_size!r}")
        priors = dict(prior_b_ms_per_byte or {})
        unknown = set(priors) - set(KINDS)
        if unknown:
            raise ValueError(f"unknown collective kinds in priors: {sorted(unknown)}")
        self.world_size = int(world_size)
        self.window = int(window)
        self.fits: dict[str, LinearCostFit] = {
            kind: LinearCostFit(window, priors.get(kind)) for kind in KINDS
        }

    def _fit(self, kind: str) -> LinearCostFit:
        try:
            return self.fits[kind]
        except KeyError:
            raise ValueError(f"unknown collective kind {kind!r}; expected one of {KINDS}") from None

    def observe(self, kind: str, nbytes: float, ms: float) -> None:
        """Record that one ``kind`` operation on ``nbytes`` bytes (per rank) took ``ms`` ms."""
        self._fit(kind).add(nbytes, ms)

    def predict_ms(self, kind: str, nbytes: float) -> float:
        """Predicted ms of one ``kind`` operation on ``nbytes`` bytes."""
        return self._fit(kind).predict_ms(nbytes)

    def predict_ag_topk_ms(
        self,
        k: int,
        n: int,
        value_bytes: int = 4,
        index_bytes: int = 4,
        extra_bytes: int = 0,
    ) -> float:
        """AG-Topk: **one** allgather whose per-rank payload packs ``k`` values, ``k`` indices and
        ``extra_bytes`` of metadata, i.e. ``allgather((value_bytes + index_bytes)·k + extra)`` ms.

        ``n`` must equal ``world_size`` (the fit is per world size). An implementation that sends
        values and indices as two allgathers pays one more fixed cost than this predicts.
        """
        if n != self.world_size:
            raise ValueError(f"model calibrated for world size {self.world_size}, asked for n={n}")
        _check_k(k, value_bytes, index_bytes, extra_bytes)
        return self.predict_ms("allgather", (value_bytes + index_bytes) * k + extra_bytes)

    def predict_ar_topk_ms(
        self, k: int, value_bytes: int = 4, index_bytes: int = 4, extra_bytes: int = 0
    ) -> float:
        """AR-Topk: broadcast of the root's ``k`` indices (plus ``extra_bytes`` of metadata packed
        into the same message) + allreduce of ``k`` values, in ms:
        ``broadcast(index_bytes·k + extra) + allreduce(value_bytes·k)``."""
        _check_k(k, value_bytes, index_bytes, extra_bytes)
        return self.predict_ms("broadcast", index_bytes * k + extra_bytes) + self.predict_ms(
            "allreduce", value_bytes * k
        )

    def predict_dense_ms(self, numel: int, value_bytes: int = 4) -> float:
        """Dense allreduce of ``numel`` elements of ``value_bytes`` bytes each, in ms."""
        if numel < 0 or value_bytes <= 0:
            raise ValueError(f"need numel >= 0 and value_bytes > 0, got {numel}, {value_bytes}")
        return self.predict_ms("allreduce", value_bytes * numel)

    def is_calibrated(self) -> bool:
        """True when every kind has samples and an identified slope (``LinearCostFit.has_slope``:
        two or more sizes in its window, or a learned/given slope prior)."""
        return all(fit.n_samples > 0 and fit.has_slope for fit in self.fits.values())

    def reset(self) -> None:
        """Forget all measurements of every kind."""
        for fit in self.fits.values():
            fit.reset()

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable state of all fits."""
        return {
            "version": _DICT_VERSION,
            "world_size": self.world_size,
            "window": self.window,
            "fits": {kind: fit.to_dict() for kind, fit in self.fits.items()},
        }

    @classmethod
    def from_dict(cls, state: Mapping[str, Any]) -> CollectiveCostModel:
        """Rebuild a model saved by :meth:`to_dict`."""
        if state.get("version") != _DICT_VERSION:
            raise ValueError(
                f"unsupported CollectiveCostModel state version {state.get('version')!r}"
            )
        model = cls(world_size=int(state["world_size"]), window=int(state["window"]))
        fits = state["fits"]
        missing = set(KINDS) - set(fits)
        if missing:
            raise ValueError(f"state lacks fits for {sorted(missing)}")
        model.fits = {kind: LinearCostFit.from_dict(fits[kind]) for kind in KINDS}
        return model


def _check_k(k: int, value_bytes: int, index_bytes: int, extra_bytes: int) -> None:
    if k < 0 or value_bytes <= 0 or index_bytes < 0 or extra_bytes < 0:
        raise ValueError(
            "need k >= 0, value_bytes > 0, index_bytes >= 0, extra_bytes >= 0; got "
            f"{k}, {value_bytes}, {index_bytes}, {extra_bytes}"
        )


def probe_ks(numel: int, crs: Iterable[float], widen: int = 8) -> list[int]:
    """The element counts a full probe times for each collective kind: the two ends of the k range
    of ``crs`` (``k = min(numel, max(1, round(c·numel)))``, as :func:`hvd_flexcomm.topk.k_for`).

    Two sizes fix a line ``a + b·bytes``; the ends give the slope its widest base. When every CR
    gives the same k the range is widened down to ``max(1, k // widen)`` so that the fixed and
    per-byte costs can still be told apart (one size, ``[1]``, when k = 1). Returns a sorted list
    of distinct positive ints; empty when ``numel`` is 0. Pure function.
    """
    crs = [float(c) for c in crs]
    if not crs:
        raise ValueError("need at least one compression ratio")
    if any(not (0.0 < c <= 1.0) for c in crs):
        raise ValueError(f"compression ratios must be in (0, 1], got {crs}")
    if numel < 0 or widen < 2:
        raise ValueError(f"need numel >= 0 and widen >= 2, got numel={numel}, widen={widen}")
    if numel == 0:
        return []
    ks = [min(numel, max(1, int(round(c * numel)))) for c in crs]
    k_min, k_max = min(ks), max(ks)
    if k_min == k_max:
        k_min = max(1, k_max // widen)
    return sorted({k_min, k_max})


class DriftDetector:
    """Flags a sustained mismatch between predicted and measured times.

    A step *violates* when ``|measured - predicted| / predicted > threshold`` (relative error; a
    non-positive prediction counts as a violation whenever ``measured > 0``) **and**, with
    ``noise_quantile > 0`` and at least ``patience`` earlier measurements in :attr:`history`,
    the measurement lies outside their ``[noise_quantile, 1 - noise_quantile]`` quantile range:
    a timing the path has itself produced lately is noise, not drift. This keeps a path whose
    timings switch between levels further apart than ``threshold`` (e.g. TCP at 10 ms one way,
    which runs for a few to tens of steps at about 100 ms, then at about 160 ms) from firing on
    its own noise, while a real change, which moves the timings out of their recent range,
    still fires. :meth:`update` returns True on the step that completes ``patience``
    consecutive violations, and then starts counting afresh (so a persistent drift fires again
    every ``patience`` steps until the model is recalibrated). Any non-violating step resets the
    count: isolated outliers never fire.

    The history holds the last ``noise_window`` measurements since :meth:`clear_history`
    (callers clear it when the measured quantity changes: another path or message size), except
    those of the current run of violations, which join it when the run ends or fires. A probe
    does not clear it (:meth:`reset`): after a run of one level fired once, that level is part
    of the path's range. The price: when the network moves the path to a new level and the path
    stays in use, a return to the old level within ``noise_window`` steps reads as noise (the
    periodic refreshes still re-measure the other path).
    """

    def __init__(self, threshold: float = 0.25, patience: int = 5, noise_quantile: float = 0.0,
                 noise_window: int = 32) -> None:
        """``threshold``: relative error (fraction, > 0). ``patience``: consecutive steps (>= 1).
        ``noise_quantile``: fraction in [0, 0.5) of the recent measurements allowed beyond a
        measurement that still counts as noise (0: the relative threshold alone).
        ``noise_window``: recent measurements kept (>= patience)."""
        if not (math.isfinite(threshold) and threshold > 0):
            raise ValueError(f"threshold must be finite and > 0, got {threshold!r}")
        if int(patience) != patience or patience < 1:
            raise ValueError(f"patience must be an integer >= 1, got {patience!r}")
        if not (0.0 <= noise_quantile < 0.5):
            raise ValueError(f"noise_quantile must be a fraction in [0, 0.5), got {noise_quantile!r}")
        if int(noise_window) != noise_window or noise_window < patience:
            raise ValueError(f"noise_window must be an integer >= patience = {patience}, "
                             f"got {noise_window!r}")
        self.threshold = float(threshold)
        self.patience = int(patience)
        self.noise_quantile = float(noise_quantile)
        self.count = 0
        self.history: deque[float] = deque(maxlen=int(noise_window))
        self._streak: list[float] = []  # measurements of the current run of violations
        self.last_band: Optional[tuple[float, float]] = None

    def noise_band(self) -> Optional[tuple[float, float]]:
        """``(low, high)`` quantiles (ms) of the recent measurements within which a measurement is
        noise; None while fewer than ``patience`` are known or without a noise quantile."""
        if self.noise_quantile <= 0.0 or len(self.history) < self.patience:
            return None
        low, high = np.quantile(np.asarray(self.history, dtype=np.float64),
                                [self.noise_quantile, 1.0 - self.noise_quantile])
        return float(low), float(high)

    def violates(self, predicted_ms: float, measured_ms: float,
                 band: Optional[tuple[float, float]] = None) -> bool:
        """Whether one (prediction, measurement) pair is off: beyond ``threshold`` of the
        prediction and outside the noise band (``band``, when the caller has it already, else
        :meth:`noise_band`)."""
        band = self.noise_band() if band is None else band
        return (self.off_prediction(predicted_ms, measured_ms)
                and (band is None or not band[0] <= measured_ms <= band[1]))

    def off_prediction(self, predicted_ms: float, measured_ms: float) -> bool:
        """Whether a measurement is beyond ``threshold`` of its prediction (relative error; a
        non-positive prediction: whenever ``measured_ms > 0``), whatever the noise band."""
        if not (math.isfinite(predicted_ms) and math.isfinite(measured_ms)):
            raise ValueError(f"non-finite times: predicted={predicted_ms}, measured={measured_ms}")
        if predicted_ms <= 0.0:
            return measured_ms > 0.0
        return abs(measured_ms - predicted_ms) / predicted_ms > self.threshold

    def update(self, predicted_ms: float, measured_ms: float) -> bool:
        """Feed one step (both in ms); True when this step completes ``patience`` violations.

        The measurements of a run of violations are held back from :attr:`history` while the
        run lasts (a real change must not widen the band it is judged by); they join it when the
        run ends or fires. :attr:`last_band` is the noise band this measurement was judged by."""
        self.last_band = self.noise_band()
        if self.violates(predicted_ms, measured_ms, self.last_band):
            self.count += 1
            self._streak.append(float(measured_ms))
        else:
            self.count = 0
            self._release()
            self.history.append(float(measured_ms))
        if self.count >= self.patience:
            self.count = 0
            self._release()
            return True
        return False

    def remember(self, measured_ms: float) -> None:
        """Add a measurement (ms) to the recent range without judging it (a step judged
        elsewhere, e.g. one confirming a drift this detector fired on)."""
        self.history.append(float(measured_ms))

    def _release(self) -> None:
        self.history.extend(self._streak)
        self._streak.clear()

    def clear_history(self) -> None:
        """Forget the recent measurements (the measured quantity changed: another path or
        message size); the violation count goes on."""
        self.history.clear()
        self._streak.clear()

    def reset(self) -> None:
        """Clear the consecutive-violation count (after a probe recalibrated the model)."""
        self.count = 0
        self._release()
