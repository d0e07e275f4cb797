"""The adaptive compression-ratio controller of :class:`~hvd_flexcomm.compression.Adaptive`.

Who does what:

- **every rank** follows the same CR schedule: the warm-up ramp (a pure function of the step), then
  whatever rank 0 announced. An announcement is one small broadcast from rank 0 (mpi4py's
  ``bcast`` under an MPI controller, ``hvd.broadcast_object`` under Gloo), started at a step that
  is a multiple of ``sync_every`` on every rank and run **in flight** on a helper thread while
  that step's collectives and the next step's computation go on; its CR takes effect at the
  announced step, the first multiple of ``sync_every`` at least :data:`ANNOUNCE_LAG_STEPS` steps
  later, on every rank (each rank waits there for the broadcast, which has long finished). A
  blocking broadcast cost the step 0.23–0.31 s at 5 ms one way and N=4 and about 1.2 s at 25 ms
  one way (``docs/performance/horovod_op_cost.md``, ``adaptive_span_steps.md``). It happens
  **only when rank 0 has a new CR**: rank 0 raises the announce flag in the control entries of
  its step payload (``sync.py``) once a solve has finished, every rank receives the flag with
  that step's collective, and the next multiple of ``sync_every`` after it starts the broadcast
  on every rank (no broadcast, no network round trip, on the other steps). A solved CR within
  ``min_cr_change`` of the current one, or (time pick) predicted to reach accuracy less than
  ``min_tta_gain`` sooner than it, is not announced at all (rank 0 keeps it as
  ``last_result``);
- **the first CR** (``Adaptive(cr=None)``, no warm-up) is picked by every rank at once, right
  after the start-up probe, from rank 0's gains and time outside communication sent in its row of
  the probe's timings allgather (:meth:`AdaptiveController.pick_from_probe`,
  :func:`~hvd_flexcomm.moo.pick_on_grid`): no announcement, no solve in the background;
- **rank 0** measures the gains of all candidate CRs from its real error-fed gradient
  (:func:`~hvd_flexcomm.gains.gains_at_crs`), predicts each candidate's communication time with
  the calibrated cost model (the cheaper path at each CR), adds its compression time (fitted
  through the compression times its steps measured at the CRs they ran, see
  :func:`compression_curve`; once two CRs a factor 2 apart were measured), keeps the median of
  its recent steps' time outside communication (``time_scale="tta"``, the default, adds it to
  each candidate's step, see :func:`~hvd_flexcomm.moo.tta_objectives`; ``"step"`` normalises the
  time objective by it, see :func:`~hvd_flexcomm.moo.normalise_front`), and, when a trigger fires,
  submits the NSGA-II solve (:func:`~hvd_flexcomm.moo.solve_cr`) to a background thread.
  Training never waits for it: the result is picked up at the first announcement after it is
  ready. If the solver fails, training continues on the last CR and the error is logged once.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections import deque
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Optional

import torch

from .compression import Adaptive
from .gains import GainTracker, gains_at_crs
from .moo import Curve, MooResult, fit_comm_curve, pick_on_grid, preload, solve_cr
from .topk import TopkWorkspace

__all__ = ["ANNOUNCE_LAG_STEPS", "RECALIBRATED_MIN_INTERVAL", "AdaptiveController",
           "announced_step", "compression_curve", "warmup_cr"]

#: How many recent steps' time outside communication the median of ``other_ms`` is taken over.
OTHER_MS_WINDOW = 32
#: Rank 0 keeps the compression times of this many recent steps per CR, for this many CRs (the
#: most recently used).
COMPRESS_WINDOW = 16
COMPRESS_CRS = 8
#: A CR's compression times enter the fit once this many of its steps were measured.
COMPRESS_MIN_SAMPLES = 3
#: An announced CR takes effect this many steps (at least; then at a multiple of ``sync_every``)
#: after its broadcast started: the broadcast runs while the step it started at and the next
#: step's computation go on.
ANNOUNCE_LAG_STEPS = 2
#: A solve for a recalibrated network model waits this many steps after the last solve (or
#: ``min_interval``, if shorter), not ``min_interval``: the network changed, and the CR picked
#: for the old one costs every step until the re-solve (in a change from 25 ms to 100 Mbit/s,
#: 5 ms one way, 40 steps at CR 0.1 where 0.02 was picked next). Recalibrations are rare: full
#: probes, the spans after a drift probe (one solve once both are judged), a span off the model
#: twice on one side or once far below it.
RECALIBRATED_MIN_INTERVAL = 10

log = logging.getLogger("hvd_flexcomm.adaptive")


def warmup_cr(step: int, warmup_steps: int, target_cr: float, every: int = 1) -> float:
    """CR of the warm-up ramp at ``step``: linear from 1.0 (dense) at step 0 to ``target_cr`` at
    ``warmup_steps``, held constant within blocks of ``every`` steps (so the message size, and
    Horovod's response cache, changes only every ``every`` steps). ``target_cr`` afterwards."""
    if warmup_steps <= 0 or step >= warmup_steps:
        return target_cr
    block_start = (step // every) * every
    frac = block_start / warmup_steps
    return 1.0 + (target_cr - 1.0) * frac


def announced_step(start_step: int, sync_every: int, lag: int = ANNOUNCE_LAG_STEPS) -> int:
    """The step at which a CR whose broadcast started at ``start_step`` takes effect: the first
    multiple of ``sync_every`` at least ``lag`` steps later. Pure function."""
    if sync_every < 1 or lag < 1:
        raise ValueError(f"need sync_every >= 1 and lag >= 1, got {sync_every}, {lag}")
    return start_step + sync_every * -(-lag // sync_every)


def compression_curve(samples: Mapping[float, Sequence[float]],
                      min_samples: int = COMPRESS_MIN_SAMPLES) -> Optional[Curve]:
    """Compression time per step (ms) as a function of the CR: the line ``a + b·c`` with
    ``a, b >= 0`` (interpolation in ``log c`` if a line fits badly, as
    :func:`~hvd_flexcomm.moo.fit_comm_curve`) through the median of each CR's measured steps
    (``samples``: CR -> the ``compress_ms`` of its steps: error feedback, selection, packing,
    unpacking and the residual update). None until two CRs at least a factor 2 apart have
    ``min_samples`` steps each: one CR says nothing about how the time grows with k."""
    medians = {float(c): statistics.median(v) for c, v in samples.items() if len(v) >= min_samples}
    if len(medians) < 2 or max(medians) < 2 * min(medians):
        return None
    crs = sorted(medians)
    return fit_comm_curve(crs, [medians[c] for c in crs])


def _round_cr(cr: float) -> float:
    """Four significant digits: announced CRs are short and compare exactly on every rank."""
    return float(f"{cr:.4g}")


class AdaptiveController:
    """CR state of an :class:`Adaptive` run. ``predict_ms(cr) -> {path: ms}`` is the calibrated
    cost model (Flexible's); ``model_version()`` counts its recalibrations (drift);
    ``recalibrating()`` (optional) is true while the model is known off and being re-measured
    (``FlexibleController.recalibrating``): no solve starts then."""

    def __init__(self, mode: Adaptive, rank: int, hvd: Any, process_set: Any,
                 predict_ms: Callable[[float], dict], model_version: Callable[[], int],
                 recalibrating: Optional[Callable[[], bool]] = None) -> None:
        self.mode = mode
        self.rank = rank
        self.hvd = hvd
        self.process_set = process_set
        self.predict_ms = predict_ms
        self.model_version = model_version
        self.recalibrating = recalibrating
        self._waiting_for_model = False  # rank 0: solves wait for a recalibration (logged once)
        self.cr = mode.cr if mode.warmup_steps == 0 else 1.0
        self.tracker = GainTracker(mode.candidates, mode.gain_smoothing)
        self.workspace = TopkWorkspace()
        self.announced_cr: Optional[float] = None  # the last CR rank 0 announced (post warm-up)
        self.last_submit_step: Optional[int] = None
        self.last_model_version = -1
        #: rank 0: the ``other_ms`` the last solve was normalised by (None: none yet, or "front")
        self.last_other_ms: Optional[float] = None
        self.last_result: Optional[MooResult] = None
        self.changes: list[tuple[int, float]] = []  # (step, cr) of every change after warm-up
        #: rank 0, one per solve: step, reason, start/end (perf_counter s), its inputs (candidate
        #: ``crs``, predicted ``comm_ms`` of the cheaper path at each and which ``paths``, smoothed
        #: ``gains``), the step's time outside communication ``other_ms`` the time objective was
        #: normalised by (None: the paper's normalisation), the solved ``cr`` (None until done,
        #: or if it failed), the ``current_cr`` in use and, under the time pick, by what fraction
        #: keeping it was predicted to lengthen the time to accuracy (``current_excess``)
        self.solves: list[dict] = []
        #: rank 0: recent steps' time outside communication (ms), see :meth:`note_other_ms`
        self.other_samples_ms: deque = deque(maxlen=OTHER_MS_WINDOW)
        #: rank 0: recent steps' compression time (ms) per CR, see :meth:`note_compress_ms`
        self.compress_samples_ms: dict[float, deque] = {}
        self.failed = False
        #: every rank: the chance to pick the first CR at the start-up probe was taken (or
        #: passed: a warm-up, an explicit ``cr``); see :meth:`starts_probe_pick`
        self.probe_pick_done = False
        self._gains_step: Optional[int] = None  # rank 0: the step whose gains were measured
        self.n_announcements = 0  # broadcasts run (every rank counts the same)
        self.last_announce_step: Optional[int] = None
        #: rank 0: solved CRs not announced (within min_cr_change of the CR, or predicted to
        #: save less than min_tta_gain of the time to accuracy)
        self.n_kept = 0
        self._pending: Optional[float] = None  # rank 0: a solved CR waiting for its announcement
        #: the broadcast of an announcement in flight (every rank) and the step it takes effect
        self._announcement: Optional[Future] = None
        self.announce_effective_step: Optional[int] = None
        self._offered: Optional[float] = None  # rank 0: the CR in flight
        self._announcer: Optional[ThreadPoolExecutor] = None
        self._executor: Optional[ThreadPoolExecutor] = None
        self._future: Optional[Future] = None
        self._mpi_comm = self._mpi_channel()
        if rank == 0 and hvd is not None:
            preload()  # the solver's imports, off the training path

    # -- channel -------------------------------------------------------------------------------
    def _mpi_channel(self) -> Any:
        """mpi4py's COMM_WORLD when Horovod runs on MPI with thread support, else None (Gloo).
        ``hvd=None`` (pure use of the controller, e.g. in unit tests) has no channel."""
        hvd = self.hvd
        if hvd is None:
            return None
        try:
            if not (hvd.mpi_enabled() and hvd.mpi_threads_supported()):
                return None
            if self.process_set is not None and self.process_set != hvd.global_process_set:
                return None
            from mpi4py import MPI

            return MPI.COMM_WORLD
        except (ImportError, ValueError, RuntimeError):
            return None

    @property
    def channel(self) -> str:
        return "mpi4py" if self._mpi_comm is not None else "hvd.broadcast_object"

    def _broadcast(self, obj: Any) -> Any:
        if self._mpi_comm is not None:
            return self._mpi_comm.bcast(obj, root=0)
        kw = {} if self.process_set is None else {"process_set": self.process_set}
        return self.hvd.broadcast_object(obj, root_rank=0, name="hvd_flexcomm.cr", **kw)

    # -- per step ------------------------------------------------------------------------------
    def announce_ready(self) -> bool:
        """Rank 0: whether a solved CR is waiting for an announcement (the flag rank 0 sends in
        its step payload). Takes a finished solve's result first: a failed solve, or a CR kept
        (see :meth:`_take_result`), raises no flag. Always False on other ranks."""
        if self.rank != 0:
            return False
        if self._pending is None and self._future is not None and self._future.done():
            self._pending = self._take_result()
        return self._pending is not None

    def cr_for_step(self, step: int, announce_flag: bool) -> float:
        """The CR of ``step`` (identical on every rank). Takes the CR of an announcement whose
        step has come (waiting for its broadcast if it has not finished), then starts the
        broadcast of a new one when one is due: ``step`` is a multiple of ``sync_every``,
        ``announce_flag`` (rank 0's flag as received with the latest step payload: the same value
        on every rank) is set and no announcement is in flight. The flag is a step late: the
        payload of step ``s`` carries what rank 0 knew at the end of step ``s - 1``, so the flag
        seen at the step right after an announcement started predates it and is ignored."""
        mode = self.mode
        if step < mode.warmup_steps:
            self.cr = warmup_cr(step, mode.warmup_steps, mode.cr, mode.sync_every)
            return self.cr
        if self.announced_cr is None:
            self.cr = mode.cr  # warm-up over (or none): hold the starting CR until a solve
        if self._announcement is not None and step >= self.announce_effective_step:
            self._take_announcement(step)
        # the flag received right after an announcement started at step a was raised at the end
        # of step a - 1, before that announcement took the result: stale, whatever sync_every is
        stale = self.last_announce_step is not None and step == self.last_announce_step + 1
        if (step % mode.sync_every == 0 and announce_flag and not stale
                and self._announcement is None):
            self.n_announcements += 1
            self.last_announce_step = step
            offer = self._ready_result() if self.rank == 0 else None
            self._offered = offer
            self.announce_effective_step = announced_step(step, mode.sync_every)
            if self._announcer is None:
                self._announcer = ThreadPoolExecutor(max_workers=1,
                                                     thread_name_prefix="hvd_flexcomm-announce")
            self._announcement = self._announcer.submit(self._broadcast, offer)
        return self.cr

    def _take_announcement(self, step: int) -> None:
        """The announced CR takes effect at ``step`` (every rank: the broadcast's result). A
        failed broadcast raises here, on every rank (the collective failed everywhere)."""
        future, self._announcement = self._announcement, None
        new_cr = future.result()
        self._offered = None
        if new_cr is not None and new_cr != self.cr:
            log.info("hvd_flexcomm: step %d: compression ratio %g -> %g (announced over %s at "
                     "step %d)", step, self.cr, new_cr, self.channel, self.last_announce_step)
            self.changes.append((step, new_cr))
            self.cr = new_cr
        if new_cr is not None:
            self.announced_cr = new_cr

    def _ready_result(self) -> Optional[float]:
        """Rank 0: the solved CR to announce now (None: nothing new); consumed."""
        self.announce_ready()
        cr, self._pending = self._pending, None
        return cr

    def _take_result(self) -> Optional[float]:
        """Rank 0: the finished solve's CR (rounded), or None when it failed, lies within
        ``min_cr_change`` (fraction) of the current CR, or (time pick, solved for the CR in use)
        keeping the current CR is predicted to take less than ``min_tta_gain`` (fraction) longer
        to accuracy; the future is consumed either way."""
        future, self._future = self._future, None
        try:
            result: MooResult = future.result()
        except Exception as exc:  # noqa: BLE001 - the service must never stop training
            self._fail_once(exc)
            return None
        self.last_result = result
        log.info("hvd_flexcomm: %s", result.explain())
        cr = _round_cr(result.cr)
        current = self._offered if self._offered is not None else self.cr  # in flight: its CR
        why = self._keeps(current, cr, result)
        if why:
            self.n_kept += 1
            log.info("hvd_flexcomm: keeping cr=%g: the solved %g %s, no announcement", current,
                     cr, why)
            return None
        return cr

    def _keeps(self, current: float, cr: float, result: MooResult) -> Optional[str]:
        """Why the CR in use ``current`` is kept against the solved ``cr`` (rounded) of
        ``result``, or None: ``cr`` lies within ``min_cr_change`` (fraction) of it, or (time
        pick, solved for ``current``) keeping it is predicted to take less than
        ``min_tta_gain`` (fraction) longer to accuracy. Pure function of its arguments and the
        settings."""
        mode = self.mode
        if abs(cr - current) < mode.min_cr_change * current:
            return f"is within {100 * mode.min_cr_change:g}% of it (min_cr_change)"
        excess = result.current_excess
        if (excess is not None and result.current_cr == current and mode.min_tta_gain > 0
                and excess < mode.min_tta_gain):
            return ("is predicted to reach accuracy "
                    f"{f'only {100 * excess:.1f}% sooner' if excess > 0 else 'no sooner'} "
                    f"(min_tta_gain {100 * mode.min_tta_gain:g}%)")
        return None

    # -- the first CR, picked at the start-up probe ------------------------------------------
    def starts_probe_pick(self, step: int) -> bool:
        """Called before a full probe at ``step`` (every rank alike): whether the probe picks the
        first CR (``Adaptive(cr=None)``, its first full probe, at or after the end of warm-up).
        The first full probe takes the chance either way (marks it taken): a later one (after
        drift, spans off) never picks. Reads settings and shared state only, so every rank
        returns the same."""
        if self.probe_pick_done:
            return False
        self.probe_pick_done = True
        return self.mode.first_cr_from_probe and step >= self.mode.warmup_steps

    def probe_share(self, step: int, error_fed: Callable[[], torch.Tensor],
                    other_ms: Optional[float]) -> list[float]:
        """What this rank adds to its row of the start-up probe's timings allgather for the
        first pick (:meth:`pick_from_probe`): rank 0, ``[other_ms, gain at each candidate]``
        (its time outside communication before this step, ms, NaN when not measured; the gains
        from ``error_fed()``, this step's error-fed gradient, also folded into the tracker);
        every other rank, zeros of the same length (only rank 0's row is read)."""
        if self.rank != 0:
            return [0.0] * (1 + len(self.mode.candidates))
        gains = gains_at_crs(error_fed(), self.mode.candidates, self.workspace)
        self.tracker.update(gains)
        self._gains_step = step
        return [math.nan if other_ms is None else float(other_ms), *gains]

    def pick_from_probe(self, step: int, shared: Sequence[float]) -> Optional[float]:
        """Every rank, right after the start-up probe: the first CR from rank 0's ``shared`` row
        (:meth:`probe_share`) and the freshly calibrated cost model, by the solver's pick on a
        grid (:func:`~hvd_flexcomm.moo.pick_on_grid`), rounded as an announced CR, unless the
        starting CR ``mode.cr`` is kept by the rule that keeps a CR in use against a solve
        (:meth:`_keeps`: the pick within ``min_cr_change`` of it, or keeping it predicted less
        than ``min_tta_gain`` slower to accuracy). The same numbers on every rank give the same
        CR, so it takes effect at ``step`` without a broadcast. None (the run keeps ``mode.cr``
        until the first solve, which then waits for a measured step) when rank 0's time outside
        communication was not measured or a gain is not finite. On rank 0 the pick counts as the
        first optimisation (``solves``, ``last_result``; the triggers count from it)."""
        mode = self.mode
        other = float(shared[0])
        gains = [float(g) for g in shared[1:1 + len(mode.candidates)]]
        if not (math.isfinite(other) and other >= 0 and all(math.isfinite(g) for g in gains)):
            log.info("hvd_flexcomm: step %d: no pick at the start-up probe (rank 0's %s); cr=%g "
                     "until the first optimisation", step,
                     "time outside communication was not measured" if not math.isfinite(other)
                     else "gradient is not finite", mode.cr)
            return None
        crs = list(mode.candidates)
        comm_ms, paths = self._predicted_comm(crs)
        other_ms = None if mode.time_scale == "front" else other
        record = (self._start_solve(step, "start-up probe", crs, comm_ms, None, paths, gains,
                                    other_ms, mode.cr) if self.rank == 0 else {})
        result = pick_on_grid(crs, comm_ms, gains, mode.c_low, mode.c_high, mode.weights,
                              other_ms=other_ms, pick=self._pick, current_cr=mode.cr)
        record.update(cr=result.cr, current_excess=result.current_excess, end=time.perf_counter())
        cr = _round_cr(result.cr)
        why = self._keeps(mode.cr, cr, result)  # the starting CR is kept as a CR in use would be
        if why:
            cr = mode.cr
            self.n_kept += 1
        self.cr = self.announced_cr = cr
        self.last_result = result
        if self.rank == 0:
            log.info("hvd_flexcomm: step %d: first CR from the start-up probe (rank 0's gains and "
                     "%.1f ms outside communication; time objective: predicted communication): "
                     "%s%s", step, other, result.explain(),
                     f"; keeping the starting cr={cr:g}: the picked {_round_cr(result.cr):g} {why}"
                     if why else "")
        return cr

    def note_other_ms(self, ms: float) -> None:
        """Rank 0: one step's time outside communication (ms): from the end of the previous
        step's synchronisation to the start of this one's (forward, backward, optimizer update,
        data loading)."""
        if self.rank == 0 and ms >= 0:
            self.other_samples_ms.append(float(ms))

    def note_compress_ms(self, cr: float, ms: float) -> None:
        """Rank 0: one sparse step's compression time (ms, ``last_stats["compress_ms"]``) at its
        CR. CRs above ``c_high`` (the warm-up ramp: other selection code) are not kept, nor the
        steps that ran while a solve was in flight: its thread competes with the selection for
        rank 0's cores (in one run the CR 0.1 steps next to the first solve took 34-108 ms,
        against 25 ms in steady state, and steepened the fitted line)."""
        if self.rank != 0 or not self.mode.count_compression or cr > self.mode.c_high:
            return
        if self._future is not None and not self._future.done():
            return  # the solve's thread shares rank 0's cores: this step's time is not the CR's
        if not (math.isfinite(ms) and ms >= 0):
            return
        window = self.compress_samples_ms.pop(cr, None) or deque(maxlen=COMPRESS_WINDOW)
        window.append(float(ms))
        self.compress_samples_ms[cr] = window  # most recently used last
        while len(self.compress_samples_ms) > COMPRESS_CRS:
            del self.compress_samples_ms[next(iter(self.compress_samples_ms))]

    def compress_ms_at(self, crs: Sequence[float]) -> Optional[list[float]]:
        """Predicted compression time (ms) at each of ``crs`` (:func:`compression_curve`), or
        None while it cannot be fitted or ``count_compression`` is off."""
        curve = compression_curve(self.compress_samples_ms) if self.mode.count_compression else None
        if curve is None:
            return None
        return [max(0.0, float(curve(c))) for c in crs]

    def other_ms(self) -> Optional[float]:
        """The time-objective offset of the next solve: the median of the recent steps' time
        outside communication (ms); 0 before any was measured; None with ``time_scale="front"``
        (``"step"`` normalises the time objective by it, ``"tta"`` adds it to each step)."""
        if self.mode.time_scale == "front":
            return None
        return statistics.median(self.other_samples_ms) if self.other_samples_ms else 0.0

    def observe(self, step: int, error_fed: Optional[torch.Tensor]) -> None:
        """Rank 0, after a step's payload is submitted: measure gains (every ``gain_every``
        steps, from ``error_fed``) and submit a solve when a trigger fires."""
        mode = self.mode
        if self.rank != 0 or step < mode.warmup_steps or error_fed is None:
            return
        if step % mode.gain_every == 0 and step != self._gains_step:  # not twice (probe_share)
            self.tracker.update(gains_at_crs(error_fed, mode.candidates, self.workspace))
        reason = self._trigger(step)
        if reason:
            self._submit(step, reason)

    def _trigger(self, step: int) -> Optional[str]:
        """Why a solve should start now (None: it should not)."""
        if self.tracker.smoothed is None or self._future is not None:
            return None
        if self.recalibrating is not None and self.recalibrating():
            if not self._waiting_for_model:
                self._waiting_for_model = True
                log.info("hvd_flexcomm: step %d: no CR optimisation until the network model is "
                         "re-measured (drift)", step)
            return None
        self._waiting_for_model = False
        step_scale = self.mode.time_scale in ("step", "tta")  # both need the time outside comm
        if self.last_submit_step is None:
            if step_scale and not self.other_samples_ms:
                return None  # the step scale needs one measured step's time outside communication
            return "first optimisation after warm-up"
        since = step - self.last_submit_step
        if (self.model_version() != self.last_model_version
                and since >= min(self.mode.min_interval, RECALIBRATED_MIN_INTERVAL)):
            return "network model recalibrated"
        if since < self.mode.min_interval:
            return None
        change = self.tracker.relative_change()
        if change >= self.mode.gain_threshold:
            return f"smoothed gain moved {100 * change:.0f}%"
        if step_scale and self.other_samples_ms and self.last_other_ms is not None:
            now, then = self.other_ms(), self.last_other_ms
            moved = abs(now - then) / max(then, 1.0)  # 1 ms floor: a start from ~0 is a change
            if moved >= self.mode.other_ms_threshold:
                return (f"time outside communication moved {100 * moved:.0f}% "
                        f"({then:.1f} -> {now:.1f} ms per step)")
        return None

    def _fail_once(self, exc: BaseException) -> None:
        if not self.failed:
            log.error("hvd_flexcomm: CR optimisation failed (%s: %s); training continues at "
                      "cr=%g", type(exc).__name__, exc, self.cr)
        self.failed = True

    @property
    def _pick(self) -> str:
        """How a solve picks its point of the front (``moo.PICKS``), from ``time_scale``."""
        return "tta" if self.mode.time_scale == "tta" else "asf"

    def _predicted_comm(self, crs: Sequence[float]) -> tuple[list[float], list[str]]:
        """Predicted communication (ms) of the cheaper path at each of ``crs``, and that path,
        from the calibrated cost model."""
        predicted = [self.predict_ms(c) for c in crs]
        return [min(p.values()) for p in predicted], [min(p, key=p.get) for p in predicted]

    def _start_solve(self, step: int, reason: str, crs: list, comm_ms: list,
                     compress_ms: Optional[list], paths: list, gains: list,
                     other_ms: Optional[float], current_cr: float) -> dict:
        """Rank 0: a solve starts at ``step`` on these inputs: the triggers count from it (step,
        time outside communication, gains, model version), and its record joins ``solves``
        (returned; ``cr``, ``current_excess`` and ``end`` are filled in when it is done)."""
        self.last_submit_step = step
        self.last_other_ms = other_ms
        self.tracker.mark_reference()
        self.last_model_version = self.model_version()
        record = {"step": step, "reason": reason, "start": time.perf_counter(), "end": None,
                  "crs": crs, "comm_ms": comm_ms, "compress_ms": compress_ms, "paths": paths,
                  "gains": gains, "other_ms": other_ms, "cr": None, "current_cr": current_cr,
                  "current_excess": None}
        self.solves.append(record)
        return record

    def _submit(self, step: int, reason: str) -> None:
        mode = self.mode
        crs = list(mode.candidates)
        gains = list(self.tracker.smoothed)
        self.last_submit_step = step
        try:  # read the cost model here, on the training thread that updates it
            comm_ms, paths = self._predicted_comm(crs)
            compress_ms = self.compress_ms_at(crs)
        except Exception as exc:  # noqa: BLE001 - the service must never stop training
            self._fail_once(exc)
            return
        time_ms = comm_ms if compress_ms is None else [a + b for a, b in zip(comm_ms, compress_ms)]
        other_ms = self.other_ms()
        current_cr = self._offered if self._offered is not None else self.cr
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1,
                                                thread_name_prefix="hvd_flexcomm-moo")
        log.info("hvd_flexcomm: step %d: re-optimising the CR (%s); time objective: predicted "
                 "communication%s", step, reason,
                 " + compression" if compress_ms is not None else
                 (" (compression not counted)" if not mode.count_compression else
                  " (compression not measured at two CRs yet)"))
        record = self._start_solve(step, reason, crs, comm_ms, compress_ms, paths, gains,
                                   other_ms, current_cr)

        def job() -> MooResult:
            try:
                result = solve_cr(crs, time_ms, gains, mode.c_low, mode.c_high, mode.weights,
                                  mode.pop_size, mode.n_gen, other_ms=other_ms, pick=self._pick,
                                  current_cr=current_cr)
                record["cr"], record["current_excess"] = result.cr, result.current_excess
                return result
            finally:
                record["end"] = time.perf_counter()

        self._future = self._executor.submit(job)

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
        if self._announcer is not None:  # a broadcast in flight finishes (every rank runs it)
            self._announcer.shutdown(wait=True)

    def _announcement_in_flight(self) -> Optional[list]:
        """``[effective step, cr]`` of the announcement in flight (waits for its broadcast,
        which every rank runs), or None."""
        if self._announcement is None:
            return None
        return [self.announce_effective_step, self._announcement.result()]

    # -- checkpoints ---------------------------------------------------------------------------
    def to_dict(self) -> dict:
        r = self.last_result
        return {"cr": self.cr, "announced_cr": self.announced_cr, "gains": self.tracker.to_dict(),
                "last_submit_step": self.last_submit_step, "changes": list(self.changes),
                "last_other_ms": self.last_other_ms, "other_samples_ms": list(self.other_samples_ms),
                "compress_samples_ms": [[c, list(v)] for c, v in self.compress_samples_ms.items()],
                "last_announce_step": self.last_announce_step,
                "announcement_in_flight": self._announcement_in_flight(),
                "n_announcements": self.n_announcements, "n_kept": self.n_kept,
                "probe_pick_done": self.probe_pick_done,
                "last_result": None if r is None else {"cr": r.cr, "time_ms": r.time_ms,
                                                       "gain": r.gain, "curves": r.curves,
                                                       "front": r.front, "other_ms": r.other_ms,
                                                       "pick": r.pick, "current_cr": r.current_cr,
                                                       "current_excess": r.current_excess}}

    def load_dict(self, state: dict) -> None:
        self.cr = float(state.get("cr", self.cr))
        self.announced_cr = state.get("announced_cr")
        self.tracker.load_dict(state.get("gains", {}))
        self.last_submit_step = state.get("last_submit_step")
        self.last_other_ms = state.get("last_other_ms")
        self.other_samples_ms = deque((float(x) for x in state.get("other_samples_ms", [])),
                                      maxlen=OTHER_MS_WINDOW)
        self.compress_samples_ms = {float(c): deque((float(x) for x in v), maxlen=COMPRESS_WINDOW)
                                    for c, v in state.get("compress_samples_ms", [])}
        self.changes = [tuple(c) for c in state.get("changes", [])]
        self.last_announce_step = state.get("last_announce_step")
        in_flight = state.get("announcement_in_flight")
        self._announcement = self.announce_effective_step = None
        if in_flight is not None:  # it takes effect at its step, as on the ranks that saved it
            self._announcement = Future()
            self._announcement.set_result(in_flight[1])
            self.announce_effective_step = int(in_flight[0])
        self.n_announcements = int(state.get("n_announcements", 0))
        self.n_kept = int(state.get("n_kept", 0))
        self.probe_pick_done = bool(state.get("probe_pick_done", True))  # a resumed run started
