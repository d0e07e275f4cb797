"""Compression modes accepted by :func:`hvd_flexcomm.DistributedOptimizer`.

A compression mode is a small, immutable configuration object; the per-rank state it needs (residual
memories, step counter) lives in the optimizer. Each mode validates its arguments on construction, so
a bad value fails at once with a message naming it, on every rank.

- :class:`Dense` -- plain allreduce of every gradient, exactly as ``horovod.torch.DistributedOptimizer``
  (optionally through one of Horovod's own compressors, e.g. ``hvd.Compression.fp16``).
- :class:`AGTopk` -- every rank sends its own top-k (values + int32 indices) through ``hvd.allgather``.
- :class:`ARTopk` -- one root rank's top-k indices are broadcast; every rank sends its own error-fed
  values at those indices through ``hvd.allreduce`` (k floats, no indices in the reduction). The root is
  chosen by ``selector``: ``"star"`` (round robin, ``step mod N``) or ``"var"`` (the rank whose
  compressed error-fed gradient has the largest squared norm; ties go to the lowest rank).

``cr`` is the compression ratio: the fraction of gradient entries kept, in (0, 1]. ``cr == 1`` sends
every entry and is carried out as a dense allreduce, so it reproduces ``Dense()`` exactly.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Optional

__all__ = ["Adaptive", "Dense", "AGTopk", "ARTopk", "Flexible", "TopkCompression", "SELECTORS",
           "default_probe_top_cr", "starting_cr", "validate_cr"]

#: Root-selection policies of AR-Topk.
SELECTORS = ("star", "var")

#: Granularities: ``"model"`` compresses the whole model as one fused vector (the paper's setting,
#: best compression quality); ``"bucket"`` compresses buckets of parameters as their gradients
#: become ready, overlapping communication with the backward pass.
GRANULARITIES = ("model", "bucket")
#: Flexible.reprobe_by: how the path not in use is re-measured (see Flexible)
REPROBE_BY = ("steps", "probes")


def validate_cr(cr: Any) -> float:
    """Return ``cr`` as a float, or raise ``ValueError`` naming the bad value.

    A valid compression ratio is a real number in (0, 1] (NaN and infinities are rejected).
    """
    if isinstance(cr, bool) or not isinstance(cr, (int, float)):
        raise TypeError(f"cr must be a number in (0, 1], got {cr!r} of type {type(cr).__name__}")
    value = float(cr)
    if math.isnan(value) or not 0.0 < value <= 1.0:
        raise ValueError(f"cr must be in (0, 1] (fraction of entries kept), got {cr!r}")
    return value


def _check_selector(selector: Any) -> str:
    """The selector, lower-cased, or ``ValueError`` naming the bad value."""
    if not isinstance(selector, str) or selector.lower() not in SELECTORS:
        raise ValueError(f"selector must be one of {SELECTORS}, got {selector!r}")
    return selector.lower()


@dataclass(frozen=True)
class Dense:
    """Dense allreduce, identical to ``horovod.torch.DistributedOptimizer``.

    ``compressor`` is one of Horovod's per-tensor compressors (``hvd.Compression.none`` by default,
    or ``hvd.Compression.fp16``); ``None`` means ``Compression.none``.
    """

    compressor: Any = None

    @property
    def cr(self) -> float:
        return 1.0

    def describe(self) -> str:
        name = getattr(self.compressor, "__name__", None) or type(self.compressor).__name__
        return "Dense()" if self.compressor is None else f"Dense(compressor={name})"


@dataclass(frozen=True)
class TopkCompression:
    """Base of the top-k modes: compression ratio, granularity and bucket size.

    ``cr``: fraction of entries kept, in (0, 1]. ``granularity``: ``"model"`` (default) or
    ``"bucket"``. ``bucket_cap_mb``: bucket size in MiB of gradient data when ``granularity="bucket"``.
    """

    cr: float = 0.01
    granularity: str = "model"
    bucket_cap_mb: float = 25.0

    #: name of the collective that carries the payload ("allgather" or "allreduce")
    collective = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "cr", validate_cr(self.cr))
        if self.granularity not in GRANULARITIES:
            raise ValueError(
                f"granularity must be one of {GRANULARITIES}, got {self.granularity!r}"
            )
        _check_positive("bucket_cap_mb", self.bucket_cap_mb, "a positive number of MiB")

    def describe(self) -> str:
        return f"{type(self).__name__}(cr={self.cr:g}, granularity={self.granularity!r})"


@dataclass(frozen=True)
class AGTopk(TopkCompression):
    """Top-k with error feedback sent through ``hvd.allgather`` (values + int32 indices)."""

    collective = "allgather"


@dataclass(frozen=True)
class ARTopk(TopkCompression):
    """Top-k with error feedback on one root's support, values sent through ``hvd.allreduce``.

    ``selector``: ``"star"`` (root = step mod N) or ``"var"`` (root = rank with the largest
    ‖top-k(error-fed gradient)‖², ties to the lowest rank).
    """

    selector: str = "star"
    collective = "allreduce"

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "selector", _check_selector(self.selector))

    def describe(self) -> str:
        return (
            f"ARTopk(cr={self.cr:g}, selector={self.selector!r}, granularity={self.granularity!r})"
        )


@dataclass(frozen=True)
class Flexible(TopkCompression):
    """Top-k with error feedback, routed each step to whichever of AG-Topk and AR-Topk the
    calibrated cost model predicts cheaper on the network as it is now.

    - ``selector``: AR-Topk's root policy when the allreduce path is used (``"star"``/``"var"``).
    - ``hysteresis``: switch only if the other path is predicted cheaper by more than this
      fraction of the current path's prediction (no flapping on near-ties).
    - ``drift_threshold`` / ``drift_patience``: re-probe the network when the measured
      communication time of the path in use is off its prediction by more than this fraction for
      this many consecutive steps.
    - ``drift_noise``: a step counts as off its prediction only when its timing also lies outside the
      ``[drift_noise, 1 - drift_noise]`` quantile range of that path's last 32 step timings at
      this size (once ``drift_patience`` are known): a path whose timings switch between levels
      further apart than ``drift_threshold`` (TCP at 10 ms one way: runs at ~100 ms, then at
      ~160 ms) does not trigger probes with its own noise. 0: the relative threshold alone.
    - ``drift_confirm``: once the detector fires, this many more route steps (at the CR in use,
      on the path in use) must each still be off their prediction, as judged when it fired
      (beyond ``drift_threshold`` and outside that noise range), before the model is
      re-measured; the first step back inside either cancels it (``n_drift_unconfirmed``). A
      transient burst of slow steps then re-measures nothing, and its steps do not become the
      path's new level. No refresh (and under Adaptive no span) starts meanwhile: a confirmed
      drift re-measures the other path anyway. 0 (the default here): re-measure at once;
      Flexible's re-measure by steps costs a step's difference of the paths. Adaptive's
      default is 3 (see there).
    - ``reprobe_interval``: at most every this many steps, re-measure the path *not* in use
      once (a *refresh*, see ``reprobe_by``), so its prediction does not go stale. 0 disables.
    - ``probe_budget``: refreshes run only while their total time (ms; a probe's timed ops, or
      an exploring step's predicted extra over the path in use) stays within this fraction of
      the communication time measured in steps (> 0; 0.02: at most 2%); start-up and drift
      re-measurements are not budgeted (without them the model is wrong).
    - ``probe_repeats``: timed repetitions per probe size at start-up and after drift (two sizes
      per collective kind; a size's first probe also runs one untimed warm-up op). The start-up
      probe times the size in use once whatever this is: the first warm step of each path
      replaces that timing.
    - ``reprobe_by``: how the path *not* in use is re-measured after drift and by the
      refreshes. ``"steps"`` (the default): it runs one real training step (two when its names
      are new to Horovod at this k; the first, cold, is not timed), an *exploring* step as
      after the start-up probe. The gradient still goes through, so the step costs only its
      difference from the path in use (nothing when the network change made it the cheaper
      one), and it measures what steps send, where a probe times each collective alone on
      idle ranks. After drift the route holds until that step's timings arrive, then the
      router decides afresh. Whenever the route leaves a path (after drift, after exploring or
      on the steps' timings), that path gets one more exploring step a few steps later (a
      *recheck*, ``flexible.RECHECK_AFTER_STEPS``), so a transient burst of slow steps does not
      keep the route off it. A refresh runs while its predicted extra time (the predicted
      difference of the paths, per step) fits in ``probe_budget``.
      ``"probes"``: timed probe collectives at the k in use, ``probe_repeats`` per kind after
      drift (a *drift probe*), one per refresh. In ``benchmarks/bench_flexible_change.py`` (N=2,
      11.7M entries, CR 0.1, 110 steps, two network changes; three runs of each mode at 0c52e2f)
      the drift probes took 2.8-3.9% of the steps' time, the re-measuring steps -0.5% to +0.1%,
      and both switched within the 20-step target. Adaptive accepts ``"probes"`` only: its
      candidate CRs need every slope, which spans and probes measure.
    - ``explore_within``: after a start-up or drift probe, when the path not chosen is predicted
      within this factor of the chosen one, the route runs it for one warm step (two when its
      names are new to Horovod) so that a real step, not a probe, measures it; then it decides
      again. Probes time each collective alone, on idle ranks: in the acceptance grid the
      start-up probe predicted AR-Topk's steps 23% too slow (median of 54 cells), and the path
      not in use is not measured otherwise. 0 disables. Adaptive does not explore (its span
      steps measure real steps at other sizes).
    - ``level_steps``: once a warm step has replaced the probe's timing of the size in use, the
      route does not leave its path while that path's level there rests on fewer real steps than
      this (the level of one or two steps is their mean, of three their median). 1 (the
      default): the first warm step's timing can move the route. 3 was tried as the default
      (38164bd): in the acceptance grid at 4e63a08 (N = 2) a slow first warm step (9.4 ms where
      the allgather's steps took 3-4 ms) and a slow step after a normal one (157.5 ms after
      64.4 ms) had each moved a cell to the slower path, but in the grid at 38164bd every hold
      delayed a move to the better path (one cell 1.09 instead of about 1.01), and in an A/B
      of the 27 N = 2 cells (``bench_flexible_grid.py --ab``, both interleaved in each cell)
      the route without it was within 1.05 in 85% of them, with it in 81%: a hold also keeps a
      wrong move for longer. A hold costs at most ``level_steps - 1`` steps on the path in use
      per size. Adaptive's levels keep its probes' timings, so it never holds.

    Decisions are made on rank 0 from its calibrated model and delivered to every rank inside the
    step's own payload (no extra round trip); every rank switches at the same step. Only
    ``granularity="model"`` is supported (the cost model counts one message per step).
    """

    selector: str = "star"
    hysteresis: float = 0.1
    drift_threshold: float = 0.25
    drift_patience: int = 5
    drift_noise: float = 0.1
    drift_confirm: int = 0
    reprobe_interval: int = 100
    probe_budget: float = 0.02
    probe_repeats: int = 2
    explore_within: float = 2.0
    reprobe_by: str = "steps"
    level_steps: int = 1
    collective = "flexible"

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "selector", _check_selector(self.selector))
        if self.granularity != "model":
            raise ValueError("Flexible supports granularity='model' only (the cost model counts "
                             f"one message per step), got {self.granularity!r}")
        _check_fraction("hysteresis", self.hysteresis, allow_zero=True)
        _check_fraction("drift_threshold", self.drift_threshold, allow_zero=False)
        _check_positive("probe_budget", self.probe_budget, "a positive number (a fraction of the "
                        "measured communication time, e.g. 0.02)")
        _check_ints(self, ("drift_patience", "probe_repeats", "level_steps"), minimum=1)
        _check_ints(self, ("reprobe_interval", "drift_confirm"), minimum=0)
        explore = self.explore_within
        numeric = isinstance(explore, (int, float)) and not isinstance(explore, bool)
        if not (numeric and (explore == 0 or 1.0 <= explore < math.inf)):
            raise ValueError(f"explore_within must be 0 (off) or a finite factor >= 1, got "
                             f"{explore!r}")
        if self.reprobe_by not in REPROBE_BY:
            raise ValueError(f"reprobe_by must be one of {REPROBE_BY}, got {self.reprobe_by!r}")
        if not (isinstance(self.drift_noise, (int, float)) and not isinstance(self.drift_noise, bool)
                and 0.0 <= self.drift_noise < 0.5):
            raise ValueError(f"drift_noise must be a fraction in [0, 0.5), got {self.drift_noise!r}")

    def describe(self) -> str:
        return (f"Flexible(cr={self.cr:g}, selector={self.selector!r}, "
                f"hysteresis={self.hysteresis:g})")


def settings_of(mode: Any) -> dict[str, str]:
    """Every setting of a compression mode (a dataclass), field name -> ``repr`` of its value.

    ``describe()`` names only the main settings (for logs); the optimizer's first-step check
    compares this on every rank, so that ranks built with different options of any kind (e.g.
    Adaptive's ``sync_every``, which sets the steps at which every rank takes part in an
    announcement) fail at once with the option named, instead of hanging or diverging later.
    A value whose ``repr`` holds a memory address (an object without a ``repr`` of its own,
    which differs between processes) is named by its type instead."""
    out = {}
    for f in dataclasses.fields(mode):
        value = getattr(mode, f.name)
        text = repr(value)
        out[f.name] = f"<{type(value).__qualname__}>" if " at 0x" in text else text
    return out


def _check_ints(settings: Any, names: tuple, minimum: int) -> None:
    """Each named field of ``settings`` must be an int (not a bool) >= ``minimum``."""
    for name in names:
        value = getattr(settings, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
            raise ValueError(f"{name} must be {what}, got {value!r}")


def _check_positive(name: str, value: Any, what: str) -> None:
    """``value`` must be a finite number > 0 (not a bool); the error says it must be ``what``."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be {what}, got {value!r}")


def _check_fraction(name: str, value: Any, allow_zero: bool) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)
    if not ok or value < 0 or value >= 1 or (value == 0 and not allow_zero):
        bounds = "[0, 1)" if allow_zero else "(0, 1)"
        raise ValueError(f"{name} must be a fraction in {bounds}, got {value!r}")


def default_probe_top_cr(candidates: Sequence[float], c_low: float, c_high: float) -> float:
    """Adaptive's default ``probe_top_cr``: the largest of ``candidates`` strictly between
    ``c_low`` and ``c_high``, or ``c_high`` when none is. Pure function; the result lies in
    ``(c_low, c_high]`` for ``c_low < c_high``."""
    inside = [float(c) for c in candidates if c_low < c < c_high]
    return max(inside) if inside else float(c_high)


#: Candidate CRs of the paper (0.1 / 3^i, rounded as published).
DEFAULT_CANDIDATES = (0.1, 0.033, 0.011, 0.004, 0.001)


def starting_cr(c_low: float, c_high: float) -> float:
    """Adaptive's default starting CR: the geometric centre ``sqrt(c_low·c_high)`` of the range
    the solver searches, to four significant digits (what an announced CR is rounded to), so
    that it reads and compares the same on every rank. Invariant: ``c_low <= result <= c_high``
    for ``0 < c_low <= c_high <= 1``; a ValueError naming a bad end otherwise. Pure function."""
    for name, value in (("c_low", c_low), ("c_high", c_high)):
        try:
            validate_cr(value)
        except (TypeError, ValueError):
            raise ValueError(f"{name} must be a CR in (0, 1], got {value!r}") from None
    lo, hi = float(c_low), float(c_high)
    if not lo <= hi:
        raise ValueError(f"need c_low <= c_high, got c_low={c_low!r}, c_high={c_high!r}")
    return min(hi, max(lo, float(f"{math.sqrt(lo * hi):.4g}")))


TIME_SCALES = ("step", "front", "tta")  # Adaptive.time_scale: see moo.normalise_front, moo.PICKS
START_BY = ("probe", "steps")  # Adaptive.start_by: how the cost model is first calibrated


@dataclass(frozen=True)
class Adaptive(Flexible):
    """Flexible routing plus a compression ratio chosen online by a multi-objective controller.

    Rank 0 measures the compression gain of every candidate CR from the real error-fed gradient
    (every ``gain_every`` steps, one selection + one sort), predicts each candidate's
    communication time with the calibrated cost model (cheaper path at each CR), fits smooth
    curves, and solves ``min (time, 1/gain)`` over ``[c_low, c_high]`` with NSGA-II
    (``pop_size``, ``n_gen``) in a background thread, picking one point with ``weights`` (time,
    gain): by default the point of least predicted time to accuracy, ``step_time^0.6 ·
    (1/gain)^0.4`` (``time_scale="tta"``); ``"step"`` and ``"front"`` pick with an ASF, as the
    paper. A new CR is announced at the first multiple of ``sync_every``
    after rank 0 flagged it in a step payload (one broadcast: mpi4py under MPI,
    ``hvd.broadcast_object`` under Gloo; none while there is nothing new). The broadcast runs
    in flight, on a helper thread, while training goes on, and the CR takes effect on every rank
    at the first multiple of ``sync_every`` at least 2 steps later
    (``adaptive.ANNOUNCE_LAG_STEPS``). The CR changes only at multiples of ``sync_every``
    (steps): announcements and the blocks of the warm-up ramp; with the default 1 a solved CR
    is in use 3 steps after it is ready (the flag rides in the step payload, so waiting costs
    nothing).

    - ``cr``: the starting CR. Default (None): **picked at the start-up probe**, before step 0's
      collectives: rank 0 measures every candidate's gain from step 0's error-fed gradient and its
      time outside communication (from the last ``zero_grad()`` before step 0's ``synchronize()``,
      or the backward pass's since its first gradient hook), sends them in its row of the
      allgather that already combines the probe's timings over ranks, and every rank makes the
      same pick from the same numbers: the solver's pick on the same fitted curves, evaluated on a
      grid of CRs instead of by NSGA-II (:func:`~hvd_flexcomm.moo.pick_on_grid`; milliseconds, no
      random numbers), held to the rule that keeps a CR in use against a solve: the fallback below
      stays unless the pick lies beyond ``min_cr_change`` of it and is predicted at least
      ``min_tta_gain`` sooner to accuracy. No first announcement, no CR change a few steps in, and
      no solve in the background during the first steps (its thread shares rank 0's cores with
      training). The next solve (NSGA-II, on rank 0) follows the triggers below. On a 25 ms link
      the picks (0.080-0.097, predicted 18-24% sooner than 0.01) cut the start-up from 8.5 s to
      7.7 s; on 100 Mbit/s, 5 ms one way, the picks (0.0068-0.0083) were predicted only 0.2-1.2%
      sooner, and taking them saved no start-up (``docs/performance/adaptive_step_budget.md``). If
      rank 0's gradient is not finite there, or a warm-up runs (the probe then comes during the
      ramp), the run starts at :func:`starting_cr`, the geometric centre ``sqrt(c_low·c_high)`` of
      the range (0.01 for the defaults), until the first solve, as an explicit ``cr`` does: an
      explicit ``cr`` is used right after warm-up until the first optimisation (after one measured
      step). Before 2026-12-06 the start was ``c_high``, then (fca9ec1) ``starting_cr``: at 100
      Mbit/s, 5 ms one way and N=4 the four steps at ``c_high`` before the first solved CR was in
      force cost 400-500 ms each against 120-170 ms at the CR then picked; on a 25 ms link, where
      the first pick is near ``c_high``, ``starting_cr`` cost a change at step 5 (about 1 s there)
      (``docs/performance/adaptive_step_budget.md``).
    - ``candidates``: the CRs whose gains are measured (at least two different ones); they must
      cover ``[c_low, c_high]``, the range the solver searches (the gain curve is fitted over
      them and not extrapolated).
    - ``warmup_steps``: CR falls linearly from 1.0 (dense) to ``cr`` over this many steps.
    - Re-optimise when the smoothed gain moves by ``gain_threshold`` (fraction) since the last
      optimisation, when the network model was recalibrated (drift), or (``time_scale="tta"``
      or ``"step"``) when rank 0's median time outside communication per step moves by
      ``other_ms_threshold`` (fraction) from the value the last optimisation used; at most every
      ``min_interval`` steps (a recalibrated model: every 10 steps,
      ``adaptive.RECALIBRATED_MIN_INTERVAL``, if ``min_interval`` is longer). With ``"tta"``
      or ``"step"`` the first optimisation waits for one measured step (step 1 without a
      warm-up), so that no pick is made blind to computation.
      The default 0.5 lies above the noise: at 5 ms one way and N=4 on a 2-core machine the
      median over 32 steps moved between 19.7 and 28.2 ms with nothing changed, and a threshold
      of 0.25 fired on that once in 480 steps.
    - ``min_cr_change`` (fraction of the current CR): a solved CR closer than this to the current
      one is kept on rank 0 and not announced. A change costs Horovod's renegotiation of the
      new message sizes plus the broadcast, which now runs in flight but still slows the steps
      around it: 0.7–1.2 s per change at 25 ms one way and N=4, against 1.4–1.6 s blocking, and
      0.3–0.4 s blocking at 5 ms one way (``docs/performance/horovod_op_cost.md``,
      ``adaptive_span_steps.md``), for a CR a few percent off; 0 announces every solve.
    - ``min_tta_gain`` (fraction; ``time_scale="tta"`` only): a solved CR is announced only if
      keeping the CR in use is predicted to take at least this much longer to accuracy, on
      the solve's own curves (:func:`~hvd_flexcomm.moo.tta_excess`). The time pick's objective
      is flat near its minimum, so the argmin follows every re-measurement of the gain curve:
      on a static 100 Mbit/s, 5 ms link it went 0.0085, 0.018, 0.023, 0.076, 0.016, 0.034, 0.065,
      0.023, 0.019 in one run (9 announcements, each 0.3-0.4 s). 0 announces every solve that
      passes ``min_cr_change``.
    - ``time_scale``: how the front's point is picked. ``"tta"`` (the default) is described
      last. ``"step"`` and ``"front"`` normalise the time objective for an ASF pick
      (:func:`~hvd_flexcomm.moo.normalise_front`). ``"step"``: the step time a CR adds as a
      fraction of the dearest candidate's whole step (rank 0's median time outside communication
      per step, plus that candidate's predicted communication), so the pick follows the network:
      where latency or computation dominate the step, a lower CR saves less and the pick moves
      up. ``"front"``: the paper's ideal-nadir normalisation, blind to the time curve's offset
      and scale (only its shape moves the pick). ``"tta"`` (time to accuracy): no ASF; the pick
      minimises ``step_time^w_time · (1/gain)^w_gain``, with ``step_time`` the candidate's
      predicted communication (and compression) plus the same median time outside
      communication as ``"step"`` (:func:`~hvd_flexcomm.moo.tta_objectives`): the run's time to
      a given accuracy if the steps it needs grow as ``(1/gain)^(w_gain/w_time)``. It keeps
      both objectives' scales, so on a latency-bound link, where a high CR costs a step little
      more than a low one, it picks a high CR. On the 100 Mbit/s, 5 ms link changing to 25 ms
      one way (``benchmarks/bench_adaptive.py``, ``docs/performance/adaptive_tta.md``) it ran
      CR 0.008-0.02 before the change and 0.07-0.1 after it, where ``"step"`` stayed at
      0.018-0.024 after it.
    - ``count_compression``: the time objective adds each candidate's compression time (error
      feedback, selection, packing, unpacking: ``last_stats["compress_ms"]``) to its predicted
      communication, from a line fitted through rank 0's measured steps at the CRs it ran, once
      two CRs a factor 2 apart have 3 steps each (until then, communication alone). On 2 cores
      with N=4 it was 11.4-13.8 ms per step at CR 0.01 and 24.6-26.5 ms at CR 0.1 (medians of
      the AG-Topk runs in ``docs/performance/adaptive_regimes.md``), next to 100-400 ms of
      communication at 100 Mbit/s and 5 ms one way. With ``granularity="model"`` the
      compression runs inside ``synchronize()``, so ``other_ms`` does not hold it (no double
      count). False: communication alone, as the paper (whose code measured the compression time
      and discarded it).
    - ``span_steps`` / ``span_every``: the **span steps** that keep the time curve's slope
      measured. Steps at one CR only re-measure the level of the path in use at that size; its
      slope (how the time grows with the CR) would otherwise come from probes alone, and a probe
      right after a network change can meet a link that has not settled yet (TCP windows still
      growing on a new round trip) and leave a wrong slope for the rest of the run. So, at most
      every ``span_every`` steps after the last probe or span, ``span_steps`` consecutive real
      training steps run at an end of the candidate range (``c_low`` or ``c_high``: of those at
      least 4x away from the CR in use, the one predicted cheaper; usually ``c_low``, which
      costs no time) on the path in use, under their own collective names (no renegotiation of
      the regular message). Their timings never reach the drift detector. The first step at a
      new size pays Horovod's negotiation and is not timed. When the span's last timings arrive
      it is judged against the prediction at its CR: if some timed step lies within
      ``drift_threshold`` of it, or the steps lie on both sides of it, the span confirms the
      model and its timings are dropped (a few noisy steps near ``c_low`` would re-tilt the
      slope the probe measured over the whole range). If every step is off on the same side in
      two routine spans in a row, or every step of one span took under 1/2.5 of the prediction
      (``flexible.SPAN_FAR_BELOW``: only a faster network does that, where stalls make a lone
      span slow), the span's timings replace what the probes measured at other sizes than the
      one in use: the path's line then rests on real steps (the span's steps at its end, the
      recent steps at the CR in use). A span that moves the prediction at either end of the
      candidates by more than ``drift_threshold`` counts as a recalibration and triggers a
      re-optimisation. A span whose predicted extra time (over steps at the CR in use) would
      take refreshes and spans together past ``probe_budget`` of the measured communication
      waits. The error feedback keeps what a span step at ``c_low`` does not send. With span
      steps, drift runs Flexible's drift probe (the path not in use at the k in use; the path in
      use re-anchored on its recent steps) instead of a full probe over every candidate's size
      (13.2 s at 25 ms one way in one run), and a span follows ``span_settle_steps`` steps
      later, then one on the other sparse path (the drift probe timed
      it at the k in use only, so its slope was the old network's); these two spans run outside
      the budget and each recalibrates whatever it measures. From the drift (a probe due) until
      both are judged, no re-optimisation starts, whatever its trigger: until then the model
      has been re-timed at the size in use only on at least one path, and its line through
      that size leans on the old network's slope (``FlexibleController.recalibrating``); then
      one re-optimisation reads both new slopes. ``span_steps=0`` turns span steps off (drift
      then runs a full probe).
    - ``span_settle_steps``: the steps from a drift probe to the first span after it (the TCP
      flows meet the new link for a few steps first). With the drift detector's
      ``drift_patience`` steps before the probe, the spans' own steps and the announcement, the
      CR for a changed network is in force this many steps plus about 18 after the change. The
      default was 10 until the A/B in ``docs/performance/adaptive_span_settle.md`` (N=4, both
      network changes of ``benchmarks/bench_adaptive.py``, three seeds each, 10 and 4 in the
      same run): with 4 the CR for the new link was in force 22 steps after the change in all
      six pairs instead of 28-31, 1.1-5.7 s of training sooner; the re-solve's predicted times
      lay within 13% of those of the run with 10 at every candidate, and its pick was the same
      end of the range after the change to the slower link (``c_high``) and 0.0115-0.015
      against 0.013-0.016 after the change to the faster one.
    - ``drift_confirm`` defaults to 3 here (Flexible: 0): after the drift detector fires, three
      more steps must still be off the model before the drift probe. Adaptive re-anchors the
      path in use on the recent steps and refits its line on the spans after the probe, so a
      transient burst of slow steps taken for drift moves the whole time curve: on a static
      100 Mbit/s, 5 ms link (N=4, 2 cores; seed 112 of ``runs/static_107_112_41bdae1``) five
      steps after a span at ``c_low`` took 242-307 ms where about 140 ms was predicted and the
      steps before mostly 130-200 ms; the drift probe re-anchored on them, the spans after it
      refitted the line, and the re-solve saw 684 ms at CR 0.1 (268 ms at the start-up probe)
      and moved the CR to 0.0073; the run needed 400 steps where AG-Topk 0.01 needed 300. The
      three steps after the burst took 193-204 ms, inside the 139-209 ms range the detector
      judged by (reconstructed from the run's step timings). The price, measured: after a
      change from 5 ms to 25 ms one way the CR for the new link was in force 25 steps after
      the change instead of 22, about 2 s of training later (three seeds,
      ``docs/performance/adaptive_status.md``).
    - ``probe_repeats`` defaults to 1 here (Flexible: 2): the start-up probe times 6 ops
      instead of 12 (each broadcast followed by the allreduce of its k, no barrier op; see
      ``probing.py``), and a Horovod op costs several round trips before any data moves (the
      start-up probe took 3.1-3.4 s at 5 ms one way and about 10 s at 25 ms, N=4, against runs
      of 40-110 s). A second timing per size only averaged two samples; the spans (on real
      steps) and the steps at the CR in use check the model afterwards. With one timing and
      the top at 0.033 the start-up probe takes 1.3 s at 5 ms and 5.5 s at 25 ms (N=4,
      ``benchmarks/bench_probe_phases.py``: at 25 ms the warm-up round 1.4 s, the six timed
      ops 3.5 s, AR-Topk's two pairs 2.4 s of them, the allgather combining the timings 0.6 s).
    - ``probe_top_cr``: the largest CR whose size a **full probe** times. Default (None): the
      largest candidate strictly between ``c_low`` and ``c_high`` (0.033 with the default
      candidates; ``c_high`` when there is none), set in ``__post_init__``; ``c_high`` times the
      whole range, as before. The probe's top size moves the most bytes, twice (its warm-up op
      and its timed op), while an op's fixed cost is paid at every size: one third of the top
      still gives each line a base 33x wide and extrapolates it to the CRs above. In the A/B of
      ``docs/performance/adaptive_status.md`` (N=4, 100 Mbit/s, 5 ms one way, six seeds in one
      run) the start-up probe took 1.28-1.51 s instead of 1.85-2.21 s, and its extrapolation to
      CR 0.1 lay 1-8% below the full range's prediction there (11% in the seed whose timing at
      0.1 came out high). Spans still run at the ends of the candidates, so steps at
      ``c_high`` check the extrapolation. Must lie in ``(c_low, c_high]``.
    - ``start_by``: how the cost model is first calibrated. ``"probe"`` (the default): the
      start-up probe above, before step 0, during which no training happens. ``"steps"``: on the
      first real training steps instead, as the spans re-measure it later: each sparse path
      (AG-Topk, then AR-Topk) runs two steps at ``probe_top_cr`` and two at ``c_low`` under the
      span steps' own collective names (the first step at each size pays Horovod's negotiation
      and is not timed; the second is), 8 steps in all, which train like any other step (the
      error feedback keeps what a step at ``c_low`` does not send). Each step's timings arrive
      with the next step's payload, so the model is calibrated one step after the last of them;
      that step runs at ``cr`` on AG-Topk. Until then no optimisation starts
      (``FlexibleController.recalibrating``); the first CR then comes from the first
      optimisation (an announcement) instead of the start-up probe, and a later drift with
      ``span_steps=0`` still runs a full probe. With a warm-up (``warmup_steps`` > 0), or a
      message too small for the two sizes to lie ``calibration.MIN_SLOPE_SPAN`` apart, the
      start-up probe runs as with ``"probe"``. If the start steps' timings have not all arrived
      ``flexible.REMEASURE_MAX_WAIT`` steps after the last of them, a full probe runs instead.
      Measured (N=4, ``docs/performance/adaptive_status.md``): the start-up cost 0.46 s a run
      less than the probe's at 100 Mbit/s, 5 ms one way, and about 1 s less at 25 ms one way
      (where the probe took 5.4-5.6 s, but an AR-Topk step is two Horovod ops, each dear
      there); the times to the target did not differ beyond the seeds' spread, so the probe
      stays the default.
    """

    cr: Optional[float] = None  # None: starting_cr(c_low, c_high), set in __post_init__
    candidates: tuple = DEFAULT_CANDIDATES
    c_low: float = 0.001
    c_high: float = 0.1
    weights: tuple = (0.6, 0.4)
    warmup_steps: int = 0
    gain_every: int = 10
    gain_smoothing: float = 0.3
    gain_threshold: float = 0.1
    min_interval: int = 50
    sync_every: int = 1
    pop_size: int = 40
    n_gen: int = 40
    min_cr_change: float = 0.1
    min_tta_gain: float = 0.03
    time_scale: str = "tta"
    other_ms_threshold: float = 0.5
    count_compression: bool = True
    span_steps: int = 3
    span_every: int = 50
    span_settle_steps: int = 4
    probe_repeats: int = 1
    drift_confirm: int = 3
    probe_top_cr: Optional[float] = None
    start_by: str = "probe"
    reprobe_by: str = "probes"
    #: True when ``cr`` was not given: the first CR is picked at the start-up probe (see ``cr``);
    #: ``cr`` then holds :func:`starting_cr`, the fallback. Set from ``cr``, not an argument.
    first_cr_from_probe: bool = dataclasses.field(default=False, init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "first_cr_from_probe", self.cr is None)
        if self.cr is None:
            object.__setattr__(self, "cr", starting_cr(self.c_low, self.c_high))
        super().__post_init__()
        if self.reprobe_by != "probes":
            raise ValueError(f"Adaptive re-measures by probes and span steps only (its candidate "
                             f"CRs need every slope): reprobe_by must be 'probes', got "
                             f"{self.reprobe_by!r}")
        if self.start_by not in START_BY:
            raise ValueError(f"start_by must be one of {START_BY}, got {self.start_by!r}")
        cands = tuple(sorted({validate_cr(c) for c in self.candidates}, reverse=True))
        if len(cands) < 2:
            raise ValueError(f"candidates needs at least two different CRs, got {self.candidates!r}")
        object.__setattr__(self, "candidates", cands)
        lo, hi = validate_cr(self.c_low), validate_cr(self.c_high)
        if not lo < hi:
            raise ValueError(f"need c_low < c_high, got c_low={self.c_low!r}, c_high={self.c_high!r}")
        if lo < cands[-1] or hi > cands[0]:  # the gains are measured at the candidates only
            raise ValueError(f"candidates {cands} must cover [c_low, c_high] = [{lo:g}, {hi:g}]: "
                             "the gain curve is measured at the candidates only, and is not "
                             "extrapolated beyond them")
        if self.probe_top_cr is None:
            object.__setattr__(self, "probe_top_cr", default_probe_top_cr(cands, lo, hi))
        else:
            try:
                top = validate_cr(self.probe_top_cr)
            except (TypeError, ValueError):
                top = None
            if top is None or not lo < top <= hi:
                raise ValueError(f"probe_top_cr must be None or a CR in (c_low, c_high] = "
                                 f"({lo:g}, {hi:g}], got {self.probe_top_cr!r}")
            object.__setattr__(self, "probe_top_cr", top)
        w = self.weights
        if (not isinstance(w, (tuple, list)) or len(w) != 2
                or not all(isinstance(x, (int, float)) and x > 0 and math.isfinite(x) for x in w)):
            raise ValueError(f"weights must be two positive numbers (time, gain), got {w!r}")
        object.__setattr__(self, "weights", (float(w[0]), float(w[1])))
        _check_ints(self, ("gain_every", "sync_every", "pop_size", "n_gen"), minimum=1)
        _check_ints(self, ("warmup_steps", "min_interval", "span_steps"), minimum=0)
        _check_ints(self, ("span_every", "span_settle_steps"), minimum=1)
        _check_fraction("gain_threshold", self.gain_threshold, allow_zero=False)
        _check_fraction("min_cr_change", self.min_cr_change, allow_zero=True)
        _check_fraction("min_tta_gain", self.min_tta_gain, allow_zero=True)
        _check_fraction("other_ms_threshold", self.other_ms_threshold, allow_zero=False)
        if not 0 < self.gain_smoothing <= 1:
            raise ValueError(f"gain_smoothing must be in (0, 1], got {self.gain_smoothing!r}")
        if not isinstance(self.count_compression, bool):
            raise ValueError(f"count_compression must be True or False, got {self.count_compression!r}")
        if self.time_scale not in TIME_SCALES:
            raise ValueError(f"time_scale must be one of {TIME_SCALES}, got {self.time_scale!r}")

    def describe(self) -> str:
        cr = (f"from the start-up probe, else {self.cr:g}"
              if self.first_cr_from_probe and self.start_by == "probe" else f"{self.cr:g}")
        start = "" if self.start_by == "probe" else f"start_by={self.start_by!r}, "
        return (f"Adaptive(cr={cr}, {start}c_low={self.c_low:g}, c_high={self.c_high:g}, "
                f"weights={self.weights}, warmup_steps={self.warmup_steps}, "
                f"time_scale={self.time_scale!r}, selector={self.selector!r})")
