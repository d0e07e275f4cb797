"""Routing state of :class:`~hvd_flexcomm.compression.Flexible`: which collective each step uses.

**Identical decisions from identical inputs.** Every rank holds one :class:`FlexibleController`
and feeds it exactly the same numbers, so every rank computes the same path for the same step
without a decision broadcast:

- probe timings are combined over ranks (:func:`hvd_flexcomm.probing.run_probes`), by the same
  rule as the step timings below;
- step timings are each collective's **own cost**, combined over ranks by
  :func:`hvd_flexcomm.sync.combine_timings`: the minimum over ranks (the time of the last rank
  to enter: without the wait for slower ranks' top-k), and for the AR path's index broadcast the
  time until the indices were delivered (a broadcast's root is done before they arrive),
  delivered to every rank inside the next step's own payload (the control entries of
  :mod:`hvd_flexcomm.sync`), so the cost model lags one step behind;
- probes are scheduled from shared state only (the step counter, the drift detector fed with the
  shared timings), and so are the steps that re-measure the path not in use on real steps after
  drift and at refreshes (``Flexible(reprobe_by="steps")``, the default).

Per step: ``path_for_step()`` → the step runs → ``observe_step(rank0_timings)`` updates the
calibrated model and the drift detector → ``decide()`` picks the next step's path with hysteresis.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Any, Optional, Union

from .calibration import MIN_SLOPE_SPAN, CollectiveCostModel, DriftDetector, probe_ks
from .compression import Flexible
from .probing import BARRIER_BYTES, barriers_needed
from .routing import PATHS, Router, choose_path
from .sync import ANNOUNCE_SLOT, CONTROL_SLOTS, PATH_SLOT, TIMING_SLOTS, ar_extra_entries
from .topk import k_for

__all__ = ["FlexibleController", "CONTROL_SLOTS", "PATH_CODES"]

log = logging.getLogger("hvd_flexcomm.flexible")

# The control entries carried in each step's payload (CONTROL_SLOTS of them) are: [path code,
# first-collective ms, second-collective ms, VAR allgather ms] of the previous step (the timings
# combined over ranks, see sync.combine_timings), and Adaptive's announce flag (1.0: rank 0 has
# a new CR to announce, see adaptive.py).
PATH_CODES = {"allgather": 1.0, "allreduce": 2.0}
_PATH_OF_CODE = {v: k for k, v in PATH_CODES.items()}

#: A span step's size (k) lies at least this factor away from the size in use: a narrower base
#: would not pin the slope (calibration.MIN_SLOPE_SPAN is 2).
SPAN_MIN_RATIO = 4.0

#: A routine span whose every timed step took less than 1/this of the prediction at its CR
#: recalibrates at once, without waiting for a second span off on the same side. Stalls (a TCP
#: retransmission, another job on the link) make a few steps far slower than the model, so a span
#: far above it needs a second look; nothing but a faster network makes every step of a span far
#: faster. (Reverse change, unlimited rate, 25 ms -> 100 Mbit/s, 5 ms one way, seed 42: the steps
#: at the CR in use fell 21%, inside the drift threshold, and the first span after it measured
#: 87-110 ms at CR 0.001 against 323 ms predicted; the off-twice rule kept the 25 ms link's slope
#: 50 steps longer. On the static 100 Mbit/s, 5 ms records, the lowest of 194 routine spans was
#: 0.52x its prediction.)
SPAN_FAR_BELOW = 2.5

#: Bytes per rank of VAR's allgather of squared norms (one float64): AR-Topk's third collective
#: under ``selector="var"``, timed into the allgather fit at this size.
VAR_GATHER_BYTES = 8

#: Payload overheads that ride with the data (bytes), see ``sync.py``: AG packs 4 + CONTROL_SLOTS
#: float64 per rank; AR appends ``ar_extra_entries(size)`` values to the k values it allreduces.
AG_EXTRA_BYTES = 8 * (4 + CONTROL_SLOTS)

#: A re-measure on real steps (``reprobe_by="steps"``) whose timings have not arrived this many
#: steps after its steps were issued is given up (they arrive 1-2 steps later, 3 with a cold step).
REMEASURE_MAX_WAIT = 5

#: After the route moved to the other path (``reprobe_by="steps"``), the path it left is
#: re-measured on one real step this many steps later (a *recheck*). A switch rests on the
#: last steps of the path left, and they can be a transient burst: in the acceptance grid at
#: 9754ac3 (N = 2, 0.1 ms one way, unlimited rate, CR 0.01) Flexible's first AG-Topk steps ran
#: twice the fixed run's median, drift moved the route to AR-Topk (1.47x slower there); at
#: a63dba0 (N = 2, 0.1 ms, 1 Gbit/s, CR 0.01) two slow AG-Topk steps moved it there by an
#: ordinary switch (1.48x). Without a second look the route stays until the refresh, 100
#: steps later. A recheck costs one step's difference of the paths; one that moves the route
#: back is a switch too, so the path it leaves gets its own recheck (each such step costs
#: about nothing where the paths are that close).
RECHECK_AFTER_STEPS = 5

#: Span roles (:meth:`FlexibleController.step_cr`) of the start-up calibration on real steps
#: (``Adaptive(start_by="steps")``): the first step at a size (Horovod negotiates its names; not
#: timed) and the timed one after it.
START_ROLES = ("start-cold", "start")


def _other_path(path: str) -> str:
    """The sparse path that is not ``path``."""
    return PATHS[1 - PATHS.index(path)]


class FlexibleController:
    """Calibrated cost model + router + drift detector for one message of ``numel`` elements.

    ``value_bytes``: bytes per gradient element (4 for float32); ``reduce_value_bytes``: the same
    in the AR-Topk value allreduce, where it differs (bfloat16 is summed as float32). State that
    matters for resuming (the fits, the current path) is in :meth:`to_dict`.
    """

    def __init__(self, mode: Flexible, world_size: int, numel: int, value_bytes: int = 4,
                 reduce_value_bytes: Optional[int] = None) -> None:
        self.mode = mode
        self.world_size = world_size
        self.numel = numel
        self.value_bytes = value_bytes
        #: bytes per value in the AR-Topk allreduce (bfloat16 is reduced as float32)
        self.reduce_value_bytes = reduce_value_bytes or value_bytes
        self.model = CollectiveCostModel(world_size)
        self.router = Router(mode.hysteresis)
        self.drift = DriftDetector(mode.drift_threshold, mode.drift_patience, mode.drift_noise)
        #: (path, k) of the last step fed to the drift detector: its noise allowance holds for
        #: one path at one message size
        self.drift_key: Optional[tuple[str, int]] = None
        self.path: Optional[str] = None
        self.predicted_ms: dict[str, float] = {}
        self.full_probe_due = True  # start-up calibration
        #: drift seen under Flexible (no candidate CRs): the next probe is a drift probe
        self.drift_probe_due = False
        #: route steps still to confirm a drift the detector fired on (``mode.drift_confirm``),
        #: the (path, k) it fired at and the noise band (ms) it judged by; 0: none pending
        self.drift_confirm_left = 0
        self.drift_confirm_key: Optional[tuple[str, int]] = None
        self.drift_confirm_band: Optional[tuple[float, float]] = None
        #: drifts the steps after the detector fired did not confirm (no re-measure ran)
        self.n_drift_unconfirmed = 0
        #: the samples the last ``drift_patience`` steps fed to the fits: [(kind, bytes, ms), ...]
        #: per step, oldest first (the measurements that fired the drift detector, the latest of
        #: them those that confirmed it)
        self.recent_steps: deque = deque(maxlen=mode.drift_patience)
        self.last_probe_step = 0
        self.probe_ms_total = 0.0
        self.n_full_probes = 0
        self.n_drift_probes = 0
        self.n_refreshes = 0
        #: shared sums (ms) behind the refresh budget: refresh-probe timings, and the measured
        #: communication of steps (each collective's minimum over ranks)
        self.refresh_ms_total = 0.0
        self.step_comm_ms_total = 0.0
        self.n_switches = 0
        #: CRs whose k range the full probe spans (Flexible: none, the probe spans k/8 .. k of the
        #: current CR; Adaptive sets its candidates, and a warm-up CR above them is not probed).
        self.probe_crs: tuple = ()
        #: names of the probe ops run so far in this process (their warm-up is done)
        self.warmed_probes: set = set()
        #: Steps before this one may go dense (Adaptive's warm-up, where high CRs cost more
        #: through a sparse path than a dense allreduce): :meth:`decide` takes the dense
        #: allreduce when the allreduce fit predicts it cheaper.
        self.dense_until_step = 0
        # Adaptive's span steps (see :meth:`step_cr`): the CR and steps left of the span under
        # way, its start, the predictions at both ends of the candidates before it, the predicted
        # extra ms of all spans (shared, in the budget with the refreshes), the (path, k) pairs
        # whose names this process used (a new process negotiates them again, so they are not
        # checkpointed), the counts of span steps, of spans that moved the model and of spans
        # whose timings confirmed it
        self.span_cr: Optional[float] = None
        self.span_base_cr: Optional[float] = None  # the CR in use when the span started
        self.span_path: Optional[str] = None  # the path the span runs on
        self.span_left = 0
        self.span_observed = 0  # steps of the open span whose timings arrived (cold included)
        #: the timed samples of the open span's steps: [(kind, bytes, ms), ...] per step
        self.span_samples: list = []
        self.last_span_step: Optional[int] = None
        #: set from a span's start until it is judged or abandoned (see :attr:`span_open`)
        self.span_before_ms: Optional[dict] = None
        self.span_ms_total = 0.0
        self.spanned_ks: set = set()
        self.n_span_steps = 0
        self.n_span_moves = 0
        self.n_span_confirms = 0
        #: routine spans found off the model on one side, with no span after them yet: the side
        #: ("high" or "low") of the last one, None when the last judged span confirmed the model
        #: (or recalibrated it), and the count of such single off spans
        self.span_off_side: Optional[str] = None
        self.n_span_offs = 0
        #: after a drift probe (Adaptive with spans): the step from which a span is due at once,
        #: and whether the span under way is that one (it counts as a recalibration whatever it
        #: measures: the first look at the slopes of the new network)
        self.span_soon_step: Optional[int] = None
        self.span_after_drift = False
        #: after a drift probe, both sparse paths get a span: the first on the path in use,
        #: then one on the other path (``span_second_path``, forced for its steps). The drift
        #: probe times the path not in use at the k in use only, so without it that path kept
        #: the old network's slope (see :meth:`_close_span`).
        self.span_other_due = False
        self.span_second_path: Optional[str] = None
        #: bytes per kind that the last drift probe timed or re-anchored on the recent steps
        #: (the sizes of the k in use then): the spans after it keep these samples too
        self.drift_anchor_bytes: dict[str, int] = {}
        #: the k at which each sparse path's own names (the unsuffixed ones of ``sync.py``; span
        #: steps have names of their own) last ran in this process. Horovod's response cache
        #: holds one shape per name, so a path's first step, and its first at another k (a new
        #: CR), negotiate afresh (see :meth:`start_route_step`). Not checkpointed: a new process
        #: negotiates every name again.
        self.route_ks: dict[str, int] = {}
        self.n_cold_steps = 0
        # Exploration (Flexible, ``mode.explore_within``): after a full or drift probe the path
        # not chosen runs for a step or two when it is predicted close (see :meth:`_explore`):
        # whether one is due, the chosen path's steps still to run before it (None: not counted
        # yet), the path it runs on, its route steps left, and how many ran.
        self.explore_due = False
        self.explore_wait: Optional[int] = None
        self.explore_path: Optional[str] = None
        self.explore_left = 0
        self.n_explorations = 0
        #: (kind, bytes) at which a warm route step's timings have replaced the probe's (Flexible,
        #: :meth:`observe_step`); forgotten where a probe times that kind again
        self.stepped_sizes: set = set()
        # Re-measuring by steps (Flexible with ``reprobe_by="steps"``, see :meth:`_remeasure`):
        # why the path not in use is being re-measured ("drift" or "refresh"; None: it is not),
        # that path, the step its exploring steps were issued at (None: still to be issued,
        # :attr:`remeasure_pending`), the kinds whose levels its timings replace, and the counts.
        self.remeasure_why: Optional[str] = None
        self.remeasure_path: Optional[str] = None
        self.remeasure_step: Optional[int] = None
        self.remeasure_stale: set = set()
        self.n_drift_steps = 0
        self.n_refresh_steps = 0
        #: the step from which the path a switch left is re-measured once more
        #: (:data:`RECHECK_AFTER_STEPS`; None: none due), and the count of such rechecks
        self.recheck_step: Optional[int] = None
        self.n_recheck_steps = 0
        #: decisions where the router would have left the path in use but its level at the size
        #: in use rested on fewer than ``mode.level_steps`` real steps (see :meth:`decide`)
        self.n_held_switches = 0
        # The start-up calibration on real steps (Adaptive(start_by="steps"), see
        # :meth:`_begin_start_steps`): its steps still to run, ``(path, cr, role)`` each; its timed
        # steps whose timings have not arrived; the step the last one ran at; the path of the one
        # under way; whether it was given up for a full probe (timings lost); completed count.
        self.start_plan: list = []
        self.start_timed_left = 0
        self.start_last_step: Optional[int] = None
        self.start_path: Optional[str] = None
        self.start_given_up = False
        self.n_step_starts = 0

    # -- sizes -----------------------------------------------------------------------------------
    def payload_bytes(self, k: int) -> dict[str, int]:
        """Per-rank bytes of each collective for ``k`` kept entries (what probes and the model
        use; it matches what ``sync.py`` sends)."""
        vb, n = self.value_bytes, self.world_size
        return {"allgather": (vb + 4) * k + AG_EXTRA_BYTES, "broadcast": 4 * k,
                "allreduce": self.reduce_value_bytes * (k + ar_extra_entries(n))}

    def predict(self, cr: float) -> dict[str, float]:
        """Predicted ms of each path at compression ratio ``cr`` from the calibrated fits."""
        sizes = self.payload_bytes(k_for(cr, self.numel))
        ag = self.model.predict_ms("allgather", sizes["allgather"])
        ar = self.model.predict_ms("broadcast", sizes["broadcast"]) + self.model.predict_ms(
            "allreduce", sizes["allreduce"])
        if self.mode.selector == "var":
            ar += self.model.predict_ms("allgather", VAR_GATHER_BYTES)
        return {"allgather": ag, "allreduce": ar}

    def _explore_steps(self, path: str, k: int) -> int:
        """Steps an exploration of ``path`` at ``k`` runs: 1 when its names last ran at this k
        in this process, else 2 (the first is cold, :meth:`start_route_step`, and not timed)."""
        return 1 if self.route_ks.get(path) == k else 2

    def _path_kinds(self, path: str) -> set:
        """The collective kinds whose fits ``path``'s prediction reads."""
        if path == "allgather":
            return {"allgather"}
        return {"broadcast", "allreduce"} | ({"allgather"} if self.mode.selector == "var" else set())

    def level_unsettled(self, path: str, cr: float) -> bool:
        """Whether ``path``'s level at the k of ``cr`` rests on real steps (the probe's timings
        there were replaced, :meth:`observe_step`; Flexible only) and on at least one but fewer
        than ``mode.level_steps`` of them for some collective kind of the path (never with the
        default ``level_steps=1``, which returns at once: this runs at every decision)."""
        if self.mode.level_steps <= 1:
            return False
        sizes = self.payload_bytes(k_for(cr, self.numel))
        if path == "allreduce":
            sizes["allgather"] = VAR_GATHER_BYTES
        for kind in self._path_kinds(path):
            nbytes = sizes[kind]
            if ((kind, nbytes) in self.stepped_sizes
                    and 0 < self.model.fits[kind].n_samples_at(nbytes) < self.mode.level_steps):
                return True
        return False

    @property
    def reprobes_by_steps(self) -> bool:
        """Flexible with ``reprobe_by="steps"``: after drift and at refreshes the path not in use
        runs real steps instead of timed probes (Adaptive, whose candidates need every slope,
        always probes)."""
        return not self.probe_crs and getattr(self.mode, "reprobe_by", "probes") == "steps"

    @property
    def start_pending(self) -> bool:
        """The start-up calibration on real steps is under way: steps of it still to run, or
        timings of its timed steps still to arrive."""
        return bool(self.start_plan) or self.start_timed_left > 0

    def _start_crs(self) -> Optional[tuple[float, float]]:
        """``(top, low)``: the CRs whose sizes the start-up steps time (``probe_top_cr`` capped at
        the largest probed CR, and the smallest), or None where ``Adaptive(start_by="steps")``
        does not apply: another mode, or a message so small that the two sizes lie less than
        ``MIN_SLOPE_SPAN`` apart (the start-up probe then widens its range itself)."""
        if not self.probe_crs or getattr(self.mode, "start_by", "probe") != "steps":
            return None
        top = min(max(self.probe_crs), self.mode.probe_top_cr)  # Adaptive: resolved, never None
        low = min(self.probe_crs)
        if k_for(top, self.numel) < MIN_SLOPE_SPAN * k_for(low, self.numel):
            return None
        return top, low

    def _begin_start_steps(self, step: int) -> None:
        """At ``step``, instead of the start-up probe (``Adaptive(start_by="steps")``): schedule
        the start-up calibration on real steps, each sparse path (allgather first) at the sizes
        of the two CRs of :meth:`_start_crs`, the top one first, two steps per size: the first
        negotiates the size's names (role ``"start-cold"``, not timed), the second is timed
        (``"start"``). They run under the span steps' names (``.span<k>``; later spans at the same
        size find their names negotiated). Schedules nothing (the probe runs) where it does not
        apply: a warm-up step (``dense_until_step``), a start that was given up
        (:meth:`_give_up_start_steps`), or no pair of CRs. Same on every rank (shared state)."""
        crs = self._start_crs()
        if crs is None or self.start_given_up or step < self.dense_until_step:
            return
        self.start_plan = [(path, cr, role) for path in PATHS for cr in crs for role in START_ROLES]
        self.start_timed_left = sum(role == "start" for _, _, role in self.start_plan)
        self.spanned_ks |= {(path, k_for(cr, self.numel)) for path in PATHS for cr in crs}
        self.full_probe_due = False
        log.info("hvd_flexcomm: step %d: start-up calibration on %d real steps (no probe): each "
                 "sparse path at cr %s, one negotiating and one timed step per size", step,
                 len(self.start_plan), " and ".join(f"{c:g}" for c in crs))

    def _give_up_start_steps(self, step: int) -> None:
        """The start-up steps' timings did not all arrive :data:`REMEASURE_MAX_WAIT` steps after
        the last of them ran: forget them, and run the full probe at once."""
        log.warning("hvd_flexcomm: step %d: %d timing(s) of the start-up steps never arrived; a "
                    "start-up probe runs instead", step, self.start_timed_left)
        self.start_plan, self.start_timed_left, self.start_given_up = [], 0, True
        for fit in self.model.fits.values():
            fit.reset()
        self.full_probe_due = True

    def _observe_start_step(self, samples: list, role: str) -> None:
        """A start-up step's timings (``role`` from :data:`START_ROLES`): a timed one's go into
        the fits; when the last has arrived the model is calibrated (counted in
        :attr:`model_version`) and the router decides afresh."""
        if role != "start" or self.start_timed_left <= 0:
            return
        for kind, nbytes, ms in samples:
            self.model.observe(kind, nbytes, ms)
        self.start_timed_left -= 1
        if self.start_pending:
            return
        self.n_step_starts += 1
        self.last_probe_step = self.start_last_step or 0  # spans and refreshes count from here
        self.router.reset()
        log.info("hvd_flexcomm: start-up calibration on real steps done: %s", "; ".join(
            f"{kind} {fit.a_ms:.2f} ms + {1e6 * fit.b_ms_per_byte:.2f} ms/MB"
            for kind, fit in self.model.fits.items() if fit.n_samples and fit.has_slope))

    # -- probing ---------------------------------------------------------------------------------
    def probe_plan(self, step: int, cr: float
                   ) -> tuple[list[tuple[str, int]], Union[int, list[int]], str]:
        """``(plan, repeats, kind)`` of the probes due before ``step``, or an empty plan.

        ``"full"`` (start-up; after drift when there are candidate CRs): two sizes per collective
        kind, the ends of the span ``k/8 .. k`` (or of the k of every CR in ``probe_crs``, each
        capped at Adaptive's ``probe_top_cr`` if set),
        ``probe_repeats`` timings each, except Flexible's size in use ``k``, timed once (the first
        warm step of each path replaces the probe's timings at ``k``, see :meth:`observe_step`, so a
        second timing there would cost about one more op of that size for nothing kept). ``repeats``
        is then one count per plan entry. ``"drift"`` (after drift under Flexible, whose CR is fixed):
        the kinds of the path not in use, at the current ``k`` only, ``probe_repeats`` timings each;
        the path in use is re-anchored on the step timings that fired the drift detector. A line
        through the one size in use predicts that size exactly whatever the slope, and it is the only
        size a fixed CR sends: 4 timed ops (allgather in use) or 2 (allreduce in use) instead of a
        full probe's 9, at the default ``probe_repeats=2``. ``"refresh"``: the kinds of the path not
        in use, once each at the current ``k`` (no warm-up op), when ``reprobe_interval`` steps have
        passed since the last probe **and** the refreshes' total time, this one's prediction included,
        stays within ``probe_budget`` of the communication time measured in steps (both sums are of
        shared timings, so every rank decides alike; a refresh counts its timed ops plus the predicted
        allgather that combines their timings over ranks, and a barrier after any broadcast that no
        allreduce follows). Under
        ``reprobe_by="steps"`` (Flexible's default) neither a drift probe nor a refresh is planned:
        the path not in use runs real steps instead (:meth:`_remeasure`). Under
        ``Adaptive(start_by="steps")`` the start-up plans no probe: the plan is empty while the
        start-up steps run and their timings arrive (:meth:`_begin_start_steps`), and a full
        probe follows only if those timings are lost (:meth:`_give_up_start_steps`).
        """
        k = k_for(cr, self.numel)
        if (self.start_pending and not self.start_plan
                and step - (self.start_last_step or 0) > REMEASURE_MAX_WAIT):
            self._give_up_start_steps(step)
        if self.full_probe_due and not self.model.is_calibrated():
            self._begin_start_steps(step)
        if self.start_pending:  # the start-up steps calibrate the model: nothing to probe
            return [], 0, "full"
        if self.full_probe_due:
            crs = [cr]
            if self.probe_crs:
                crs = list(self.probe_crs) + ([cr] if cr <= max(self.probe_crs) else [])
                top = getattr(self.mode, "probe_top_cr", None)
                if top is not None:  # Adaptive: the lines extrapolate above the top size
                    crs = [min(c, top) for c in crs]
            ks = probe_ks(self.numel, crs)
            # per k: AR-Topk's broadcast right before its allreduce, which follows it as in a
            # step (``run_probes`` times them in pairs, no barrier op)
            entries = [(kind, kk) for kk in ks for kind in ("allgather", "broadcast", "allreduce")]
            plan = [(kind, self.payload_bytes(kk)[kind]) for kind, kk in entries]
            # Flexible's size in use is timed once: the first warm step of each path replaces
            # that timing (observe_step); the smaller size keeps the slope, probe_repeats times
            repeats = [1 if not self.probe_crs and kk == max(ks) and len(ks) > 1
                       else self.mode.probe_repeats for _, kk in entries]
            if self.mode.selector == "var":
                plan.append(("allgather", VAR_GATHER_BYTES))
                repeats.append(self.mode.probe_repeats)
            return plan, repeats, "full"
        if self.drift_probe_due:
            plan = self._unused_path_plan(k)
            if self.mode.selector == "var" and self.path == "allgather":
                plan.append(("allgather", VAR_GATHER_BYTES))  # VAR's norm allgather rides on the AG fit
            return plan, self.mode.probe_repeats, "drift"
        interval = self.mode.reprobe_interval
        # no refresh while a drift is being confirmed: if it is, the re-measure covers it
        if (interval and self.path and not self.reprobes_by_steps
                and self.drift_confirm_left == 0 and step - self.last_probe_step >= interval):
            plan = self._unused_path_plan(k)
            cost_ms = (sum(self.model.predict_ms(kind, nbytes) for kind, nbytes in plan)
                       + self._overhead_ms([kind for kind, _ in plan]))
            if self._within_budget(cost_ms):
                return plan, 1, "refresh"
        return [], 0, "refresh"

    def _within_budget(self, cost_ms: float) -> bool:
        """Whether refreshes and span steps, ``cost_ms`` more included, stay within
        ``probe_budget`` of the communication measured in steps (shared sums: every rank
        decides alike)."""
        spent = self.refresh_ms_total + self.span_ms_total + cost_ms
        return spent <= self.mode.probe_budget * self.step_comm_ms_total

    def _overhead_ms(self, kinds: list[str]) -> float:
        """Predicted ms that probes of ``kinds`` (one timing each) add to their timed ops
        (``probing.run_probes``): the allgather that combines their timings over ranks (two
        float64 per timing, per rank) and a barrier allreduce after each broadcast that no
        allreduce follows (:func:`~hvd_flexcomm.probing.barriers_needed`). Part of what a
        refresh costs."""
        return (self.model.predict_ms("allgather", 16 * len(kinds))
                + barriers_needed(kinds) * self.model.predict_ms("allreduce", BARRIER_BYTES))

    def _unused_path_plan(self, k: int) -> list[tuple[str, int]]:
        """The collectives of the sparse path not in use, at ``k`` kept entries."""
        kinds = ["broadcast", "allreduce"] if self.path == "allgather" else ["allgather"]
        return [(kind, self.payload_bytes(k)[kind]) for kind in kinds]

    def probe_warm_up(self, kind: str) -> tuple[bool, Optional[set]]:
        """``(warm_up, warmed)`` for :func:`~hvd_flexcomm.probing.run_probes` of a ``kind`` probe
        (see :meth:`probe_plan`). The start-up probe and drift probes warm up each name on its
        first use only; a refresh runs no untimed op. A **full** probe that follows drift
        (Adaptive's, over every candidate's size) warms up every op of its plan again, in flight
        together: the network just changed, and TCP flows meeting a new round trip are still
        growing their congestion windows, so a size's first transfers cost several times what it
        costs a few steps later (measured on the emulator: 312 / 233 / 207 / 126 / 76 ms at CR
        0.1 ... 0.001 in the first probe after 0.1 ms/100 Mbit -> 10 ms/unlimited, 154 / 86 / 64
        / 57 / 54 ms eight steps later). Flexible's drift probe (one size, the path not in use)
        does not: on a bandwidth-bound link the warm-up moves all its bytes once more (2.48 s
        against 1.69 s without it at 100 Mbit, 11.7M entries, CR 0.1), and its path decisions
        came 6-8 steps after a change either way."""
        if kind == "refresh":
            return False, self.warmed_probes
        after_drift = kind == "full" and self.n_full_probes > 0
        return True, (None if after_drift else self.warmed_probes)

    def after_probe(self, step: int, results: list[tuple[str, int, float]], kind: str,
                    spent_ms: float) -> None:
        """Feed probe results (identical on every rank) of a ``kind`` probe (see
        :meth:`probe_plan`). A full probe starts the probed fits afresh; a drift probe and a
        refresh keep every slope and forget the levels of the fits they re-anchor (a drift
        probe: every fit, the path in use on the recent step timings). ``spent_ms``: this
        rank's wall time in the probes (reported, not used in decisions)."""
        if kind not in ("full", "drift", "refresh"):
            raise ValueError(f"probe kind must be 'full', 'drift' or 'refresh', got {kind!r}")
        probed = {coll for coll, _, _ in results}
        if kind == "full":
            self._end_remeasure()  # whatever was being re-measured, the probe measured it
            for coll in probed:
                self.model.fits[coll].reset()
        elif kind == "refresh":
            for coll in probed:
                self.model.fits[coll].reset_level()
        else:
            recent = self._reanchor_on_recent_steps(probed)
            self.drift_anchor_bytes = {coll: int(nbytes) for coll, nbytes, _ in recent + results}
        for coll, nbytes, ms in results:
            self.model.observe(coll, nbytes, ms)
        self.stepped_sizes = {(coll, size) for coll, size in self.stepped_sizes if coll not in probed}
        if kind == "drift":  # the path in use rests on real steps (its recent ones) again
            self.stepped_sizes |= {(coll, int(nbytes)) for coll, nbytes, _ in recent}
        self.last_probe_step = step
        self.probe_ms_total += spent_ms
        if kind == "refresh":
            self.n_refreshes += 1
            self.refresh_ms_total += (sum(ms for _, _, ms in results)
                                      + self._overhead_ms([kind for kind, _, _ in results]))
            return
        if kind == "full":
            self.full_probe_due = False
            self.n_full_probes += 1
        else:
            self.n_drift_probes += 1
        # after drift under span steps, the slopes of the new network come from two spans once
        # the link settled; a full probe measured them itself
        self.span_soon_step = (step + self.mode.span_settle_steps
                               if kind == "drift" and self.spans_on else None)
        self.span_other_due = kind == "drift" and self.spans_on
        self.span_second_path = None
        self.drift_probe_due = False
        self.drift_confirm_left = 0  # this probe measured whatever the detector had seen
        self.recent_steps.clear()
        self.drift.reset()
        self.router.reset()  # re-decide from scratch on a recalibrated model
        self.explore_due = not self.probe_crs and self.mode.explore_within > 0
        self.explore_wait, self.explore_left = None, 0
        self._end_span()  # a span under way measured the model this probe replaced
        self.span_off_side = None  # and an off span before it, too

    @property
    def probe_due(self) -> bool:
        """A full or drift probe must run before the next step (its path is not decided yet)."""
        return self.full_probe_due or self.drift_probe_due

    @property
    def spans_on(self) -> bool:
        """Adaptive with span steps (candidate CRs and ``span_steps`` > 0)."""
        return bool(self.probe_crs) and int(getattr(self.mode, "span_steps", 0)) > 0

    @property
    def span_open(self) -> bool:
        """A span started and is not judged yet (its last step's timings arrive a step later)."""
        return self.span_before_ms is not None

    @property
    def recalibrating(self) -> bool:
        """The model is known to be off and not re-measured yet: a probe is due, or (under span
        steps) a drift probe ran and the two spans after it (one per sparse path) are not both
        judged yet. Until then only the size in use was timed on the new network, and the line
        through it leans on the old network's slope, or where that slope overshoots the new
        point, runs through the origin: the prediction at the other candidates is a guess.
        Adaptive does not solve meanwhile (a solve reads every candidate, on both paths). (In
        a change from 0.1 ms / 100 Mbit/s to 10 ms one way, a second drift probe, after TCP had
        settled, re-anchored the allgather at CR 0.1 on a slope learned while its windows grew:
        a solve four steps later saw 3.7 ms at CR 0.001, where steps take 44-86 ms. In the
        reverse change, unlimited rate, 25 ms -> 100 Mbit/s, 5 ms, the route moved to AR-Topk at
        the drift probe; a solve after its span alone, with the allgather still on the 25 ms
        link's slope, saw 233 ms at CR 0.001 and kept CR 0.08-0.1, and the solve with both
        slopes, 10 steps later, picked 0.019: the second span came 2 steps after the first.)"""
        return (self.probe_due or self.start_pending or self.span_other_due
                or self.span_second_path is not None or (self.span_open and self.span_after_drift))

    @property
    def model_version(self) -> int:
        """Counts the recalibrations of the model that Adaptive re-optimises on: full probes and
        spans that moved it (a drift probe under spans is followed by two spans, one per sparse
        path, and each counts; Adaptive solves once both are judged, see
        :attr:`recalibrating`), and start-up calibrations on real steps."""
        return self.n_full_probes + self.n_span_moves + self.n_step_starts

    # -- re-measuring by steps (Flexible, reprobe_by="steps") -------------------------------------
    def _remeasure(self, why: str, route: str) -> None:
        """Schedule a re-measure of the path not in use (``why``: "drift", "refresh" or
        "recheck", see :data:`RECHECK_AFTER_STEPS`) on real
        steps: at the next decision it runs for one step (two when its names are new to Horovod
        at this k, the first cold and not timed, :meth:`_explore`); the route holds until that
        step's timings arrive (:meth:`decide`), which replace the levels of the kinds that path
        alone reads (:meth:`observe_step`, :meth:`_remeasured`). Shared state only: every rank
        schedules alike."""
        other = _other_path(route)
        self.remeasure_why, self.remeasure_path, self.remeasure_step = why, other, None
        self.remeasure_stale = self._path_kinds(other) - self._path_kinds(route)
        self.explore_due, self.explore_wait, self.explore_left = False, None, 0

    def _reanchor_on_recent_steps(self, also: set = frozenset()) -> list:
        """After drift (a drift probe, or a re-measure on steps): the kinds of the recent step
        timings that fired (and confirmed) the detector, and ``also``, keep their slopes and forget their
        levels; every slope is unpinned (the new network's slopes may replace them); the recent
        timings are fed back. Returns them ``[(kind, bytes, ms), ...]``."""
        recent = [sample for step_samples in self.recent_steps for sample in step_samples]
        for kind in set(also) | {kind for kind, _, _ in recent}:
            self.model.fits[kind].reset_level()
        for fit in self.model.fits.values():
            fit.unpin_slope()
        for kind, nbytes, ms in recent:
            self.model.observe(kind, nbytes, ms)
        return recent

    def _drift_by_steps(self, path: str) -> None:
        """Drift under ``reprobe_by="steps"``: the path in use is re-anchored on the step timings
        that fired the detector (:meth:`_reanchor_on_recent_steps`) and the other path is
        re-measured on a real step (:meth:`_remeasure`)."""
        recent = self._reanchor_on_recent_steps()
        self.stepped_sizes |= {(kind, int(nbytes)) for kind, nbytes, _ in recent}
        self.recent_steps.clear()
        self.drift.reset()
        self.recheck_step = None  # this drift's re-measure decides whether one is due
        self._remeasure("drift", self.router.current if self.router.current in PATHS else path)

    def _remeasured(self, path: str, measured: float, predicted: float) -> None:
        """The re-measuring step's timings are in the fits: after drift the router decides
        afresh, as after a drift probe."""
        why = self.remeasure_why
        if why == "drift":
            self.n_drift_steps += 1
            self.router.reset()
        elif why == "recheck":
            self.n_recheck_steps += 1
        else:
            self.n_refresh_steps += 1
        log.info("hvd_flexcomm: the %s re-measured (%s) on a real step: %.2f ms, predicted %.2f ms "
                 "before", path, why, measured, predicted)
        self._end_remeasure()

    def _end_remeasure(self) -> None:
        self.remeasure_why, self.remeasure_path = None, None
        self.remeasure_step, self.remeasure_stale = None, set()

    @property
    def remeasure_pending(self) -> bool:
        """A re-measure is scheduled and its exploring steps are not issued yet."""
        return self.remeasure_why is not None and self.remeasure_step is None

    def _remeasure_checks(self, step: int, cr: float) -> None:
        """Before a decision: give up a re-measure whose timings have not arrived
        :data:`REMEASURE_MAX_WAIT` steps after its steps were issued (a step whose timings were
        lost: the route must not hold for ever; after drift the router then decides afresh),
        schedule the recheck of the path a switch left once ``recheck_step`` has come
        (unbudgeted: one step per switch; the router keeps its hysteresis),
        and schedule a refresh on a real step when ``reprobe_interval`` steps have passed since the
        last probe or refresh and its predicted extra time (the predicted difference of the
        paths, per exploring step) keeps refreshes and spans within ``probe_budget``."""
        if self.remeasure_step is not None and step - self.remeasure_step > REMEASURE_MAX_WAIT:
            log.info("hvd_flexcomm: step %d: the %s re-measure of the %s got no timings; the "
                     "route decides without them", step, self.remeasure_why, self.remeasure_path)
            if self.remeasure_why == "drift":
                self.router.reset()
            self._end_remeasure()
        route = self.router.current
        if (self.recheck_step is not None and step >= self.recheck_step
                and self.remeasure_why is None and route in PATHS and self.path in PATHS
                and not self.explore_due and self.explore_left == 0):
            self.recheck_step = None
            self.last_probe_step = step
            self._remeasure("recheck", route)
            return
        interval = self.mode.reprobe_interval
        if (not self.reprobes_by_steps or not interval or self.remeasure_why is not None
                or route not in PATHS or self.path not in PATHS or self.explore_due
                or self.explore_left > 0 or self.drift_confirm_left > 0
                or step - self.last_probe_step < interval):
            return
        other = _other_path(route)
        n_steps = self._explore_steps(other, k_for(cr, self.numel))
        cost_ms = n_steps * max(0.0, self.predicted_ms[other] - self.predicted_ms[route])
        if not self._within_budget(cost_ms):
            return
        self.refresh_ms_total += cost_ms
        self.last_probe_step = step
        self._remeasure("refresh", route)

    # -- span steps (Adaptive) -------------------------------------------------------------------
    def step_cr(self, step: int, cr: float) -> tuple[float, Optional[str]]:
        """``(cr, role)`` of ``step``, whose path is decided for the CR in use ``cr``: ``cr``
        itself and role None, or a span step's CR and role ``"span"`` (``"cold"`` for the first
        step at a size never spanned before: Horovod negotiates its new names, so its timing is
        not fed to the fits). See ``Adaptive.span_steps``; needs candidate CRs (``probe_crs``).
        When the last span step's timings arrive, the span is judged (:meth:`_close_span`): its
        timings either confirm the model (and are dropped) or replace what the probes measured
        at other sizes than the one in use.

        A span starts when ``span_every`` steps have passed since the last probe, the end of
        the warm-up and the last span start, no probe is due, the last span was judged and the
        path is sparse; its CR is the end of ``probe_crs`` at least :data:`SPAN_MIN_RATIO`
        times away from ``cr`` (in k) with the lower predicted extra time on the span's path
        (zero when it is cheaper than ``cr`` on the path in use), and it runs only within the
        budget (:meth:`_within_budget`), except the two spans after a drift probe, which are
        part of that recalibration (like the drift probe, unbudgeted: without them the model
        holds the old network's slopes). Pure function of shared state: every rank returns the
        same.

        The span's path is the path in use, except for the second of the two spans after a drift
        probe, which runs on the other sparse path (``span_second_path``): the drift probe
        timed that path at the k in use only, and its slope was the old network's. (In a run
        from unlimited, 25 ms to 100 Mbit/s, 5 ms one way, the route moved to AR-Topk after the
        drift probe, the spans re-measured AR-Topk only, and the allgather kept the 25 ms link's
        flat slope: the solver saw 313 ms at CR 0.1 and 212 ms at 0.001, where AG-Topk at 0.01
        took 106 ms.) A span step runs on :meth:`step_path`; :attr:`path` stays the route.

        While the start-up calibration on real steps has steps to run
        (:meth:`_begin_start_steps`), each step is the next of them: its CR and role (one of
        :data:`START_ROLES`), and no span starts until its timings are all in."""
        if self.start_plan:
            self.start_path, start_cr, role = self.start_plan.pop(0)
            self.start_last_step = step
            return start_cr, role
        if self.span_left > 0:
            self.span_left -= 1
            self.n_span_steps += 1
            return self.span_cr, "span"
        if (not self.spans_on or self.path not in PATHS or self.probe_due or self.span_open
                or self.start_pending or self.drift_confirm_left > 0
                or step < self.dense_until_step):
            return cr, None
        n = int(self.mode.span_steps)
        since = step - max(self.last_probe_step, self.dense_until_step,
                           -1 if self.last_span_step is None else self.last_span_step)
        soon = self.span_soon_step is not None and step >= self.span_soon_step
        if since < self.mode.span_every and not soon:
            return cr, None
        k = k_for(cr, self.numel)
        path = self.span_second_path or self.path
        now_ms = self.predict(cr)[self.path]
        options = []
        for end in (min(self.probe_crs), max(self.probe_crs)):
            k_end = k_for(end, self.numel)
            if max(k_end, k) < SPAN_MIN_RATIO * min(k_end, k):
                continue
            end_ms = self.predict(end)[path]
            options.append((n * max(0.0, end_ms - now_ms), end, end_ms, k_end))
        if not options:  # every end is within SPAN_MIN_RATIO of the CR in use
            if soon:  # nothing to span after drift: the drift probe's model is what there is
                self.span_soon_step, self.span_other_due, self.span_second_path = None, False, None
            return cr, None
        extra_ms, end, end_ms, k_end = min(options)
        if not soon and not self._within_budget(extra_ms):  # after drift: as the drift probe
            return cr, None
        self.span_ms_total += extra_ms
        self.span_after_drift = soon
        if soon:
            self.span_soon_step = None
        self.span_cr, self.span_left, self.last_span_step = end, n - 1, step
        self.span_base_cr, self.span_path, self.span_second_path = cr, path, None
        self.span_observed, self.span_samples = 0, []
        self.span_before_ms = self._span_ends_ms(path)
        self.n_span_steps += 1
        cold = (path, k_end) not in self.spanned_ks
        self.spanned_ks.add((path, k_end))
        log.info("hvd_flexcomm: step %d: span of %d step(s) at cr %g on the %s%s (cr in use %g; "
                 "predicted %.1f ms against %.1f ms)", step, n, end, path,
                 "" if path == self.path else f", not the {self.path} in use,", cr, end_ms, now_ms)
        return end, ("cold" if cold else "span")

    def start_route_step(self, path: Optional[str], cr: float) -> tuple[bool, bool]:
        """Note that a step on the route (not a span step) starts on ``path`` at ``cr``;
        ``(cold, exploring)``. ``exploring``: the step runs on the path the router did not
        choose (:meth:`_explore`). ``cold``: the path's first step in this process, or its
        first at another k since the last. Horovod then negotiates the step's names again
        (its response cache holds one shape per name), which costs about one more round trip
        of the slowest collective. On 100 Mbit/s, 5 ms one way, N = 4, the first step at each
        new CR of Adaptive took 60-120 ms more than the steps after it
        (docs/performance/runs/static_9a87501), and in the acceptance grid a switch to AR-Topk
        at 0.1 ms one way measured 103 ms on a path that takes 23 ms: fed to the fit, it sent
        the route straight back. :meth:`observe_step` keeps a cold step's timings out of the
        model (``cold=True``). Pure function of shared state (the route and the CR): every rank
        returns the same."""
        if path not in PATHS:
            return False, False
        k = k_for(cr, self.numel)
        cold = self.route_ks.get(path) != k
        self.route_ks[path] = k
        return cold, path != self.router.current

    def step_path(self, role: Optional[str]) -> Optional[str]:
        """The path of a step whose span role (from :meth:`step_cr`) is ``role``: the span's path
        at span steps (the other sparse path for the second span after a drift probe), else the
        path in use (:attr:`path`); a start-up step's own path at start-up steps
        (:meth:`_begin_start_steps`)."""
        if role in START_ROLES:
            return self.start_path
        return self.span_path if role is not None and self.span_path else self.path

    # -- steps -----------------------------------------------------------------------------------
    def decide(self, step: int, cr: float) -> str:
        """Choose (and remember) the path of ``step``: the cheaper sparse path (with hysteresis),
        or ``"dense"`` before ``dense_until_step`` when the allreduce fit, extrapolated to the
        whole gradient, predicts a dense allreduce cheaper by more than the hysteresis (the sparse
        predictions at a warm-up CR are extrapolated from the same fits, so the two compare
        like with like; probing the dense size itself would cost several steps). Before the
        start-up calibration on real steps is in (``Adaptive(start_by="steps")``) there is no
        model: the route steps run the allgather, predicting nothing."""
        if self.start_pending:  # the model is complete only once the start's last timing is in
            self.predicted_ms = {}
            self.path = "allgather"
            return self.path
        self.predicted_ms = self.predict(cr)
        self._remeasure_checks(step, cr)
        current = self.router.current
        if self.remeasure_path is not None and current is not None:
            # the path not in use is being re-measured: the route holds until its timings arrive
            path, switched = current, False
        elif current in PATHS and self.level_unsettled(current, cr):
            # the path in use's level rests on too few real steps: it holds (mode.level_steps)
            path, switched = current, False
            other = _other_path(current)
            if choose_path(self.predicted_ms["allgather"], self.predicted_ms["allreduce"],
                           current, self.mode.hysteresis) == other:
                self.n_held_switches += 1
                log.info("hvd_flexcomm: step %d: staying on the %s at cr %g: predicted %.2f ms "
                         "against %.2f ms on the %s, but its level rests on fewer than %d real "
                         "steps", step, current, cr, self.predicted_ms[current],
                         self.predicted_ms[other], other, self.mode.level_steps)
        else:
            afresh = current is None
            decision = self.router.decide(step, self.predicted_ms["allgather"],
                                          self.predicted_ms["allreduce"])
            path = decision.path
            # after a re-measure for drift the router decides afresh: a new path is a switch;
            # the path a switch leaves gets a second look (a recheck) a few steps later
            after_drift = afresh and self.path in PATHS and path != self.path
            switched = decision.switched or after_drift
            if switched and self.path in PATHS and self.reprobes_by_steps:
                self.recheck_step = step + RECHECK_AFTER_STEPS
        if step < self.dense_until_step:
            dense_ms = self.model.predict_ms("allreduce", self.reduce_value_bytes * self.numel)
            self.predicted_ms["dense"] = dense_ms
            if dense_ms < (1.0 - self.mode.hysteresis) * self.predicted_ms[path]:
                path = "dense"
        path = self._explore(path, cr, step)
        if path != self.path and (switched or "dense" in (path, self.path)):
            if self.path is not None:
                self.n_switches += 1
            log.info("hvd_flexcomm: step %d: switching to %s at cr %g (predicted allgather %.2f "
                     "ms, allreduce %.2f ms, dense %s)", step, path, cr,
                     self.predicted_ms["allgather"], self.predicted_ms["allreduce"],
                     f"{self.predicted_ms['dense']:.2f} ms" if "dense" in self.predicted_ms
                     else "not considered")
        self.path = path
        return path

    def _explore(self, path: str, cr: float, step: int = 0) -> str:
        """The path of the step being decided: ``path`` (the route's choice), or the other
        sparse path while an exploration runs. After a full or drift probe the chosen path runs
        until one of its steps is warm (its names known to Horovod at this k); then, when the
        path not chosen is predicted within ``mode.explore_within`` of it, that path runs for
        one step, or two when its names are new at this k (the first is cold,
        :meth:`start_route_step`). The first warm step of each path replaces what the probe
        timed at its sizes (:meth:`observe_step`), so once the explored step's timings arrive
        the router compares two real steps, not a step with a probe. The router keeps its
        choice meanwhile (hysteresis stays relative to it; not a switch). Probes time each
        collective alone on idle ranks; steps run them back to back while other ranks select
        their top-k: in the acceptance grid the start-up probe predicted AR-Topk 23% slower than
        its steps (median of 54 cells, 46 of them too slow) and AG-Topk at CR 0.1, 10 ms one
        way, up to 1.7x, and 4 of 54 cells kept the slower path on those predictions.

        A re-measure (:meth:`_remeasure`) explores the path not in use at once, whatever its
        prediction (which is stale)."""
        if self.remeasure_pending and path in PATHS:
            k = k_for(cr, self.numel)
            self.remeasure_step = step
            self.last_probe_step = step  # the next refresh counts from here, as from a probe
            self.explore_path = self.remeasure_path
            self.explore_left = self._explore_steps(self.explore_path, k)
            log.info("hvd_flexcomm: step %d: re-measuring the %s (%s) on %d real step(s) at cr %g: "
                     "predicted %.2f ms against %.2f ms on the %s", step, self.explore_path,
                     self.remeasure_why, self.explore_left, cr,
                     self.predicted_ms[self.explore_path], self.predicted_ms[path], path)
        if self.explore_due and path in PATHS:
            k = k_for(cr, self.numel)
            if self.explore_wait is None:
                self.explore_wait = 1 if self.route_ks.get(path) == k else 2
            if self.explore_wait > 0:
                self.explore_wait -= 1
                return path
            self.explore_due, self.explore_wait = False, None
            other = _other_path(path)
            if self.predicted_ms[other] <= self.mode.explore_within * self.predicted_ms[path]:
                self.explore_path = other
                self.explore_left = self._explore_steps(other, k)
                self.n_explorations += 1
                log.info("hvd_flexcomm: exploring the %s for %d step(s) at cr %g: predicted "
                         "%.2f ms against %.2f ms on the %s", other, self.explore_left, cr,
                         self.predicted_ms[other], self.predicted_ms[path], path)
        if self.explore_left > 0:
            self.explore_left -= 1
            return self.explore_path
        return path

    def outgoing_control(self, path: str, timings_ms: tuple, announce: bool = False) -> tuple:
        """The control entries this rank sends with its next step: the path code and the announce
        flag (rank 0's are delivered) and this rank's (first, second, VAR) collective ms (their
        minima over ranks are delivered)."""
        entries = [0.0] * CONTROL_SLOTS
        entries[PATH_SLOT] = PATH_CODES.get(path, 0.0)
        for slot, ms in zip(TIMING_SLOTS, timings_ms, strict=True):
            entries[slot] = float(ms)
        entries[ANNOUNCE_SLOT] = 1.0 if announce else 0.0
        return tuple(entries)

    def observe_step(self, control: list[float], cr: float, role: Optional[str] = None,
                     cold: bool = False, exploring: bool = False) -> None:
        """Feed the previous step's timings (``control`` as received in the payload: path code,
        then the first-collective, second-collective and VAR allgather ms, each the minimum over
        ranks) to the fits and the drift detector. ``role``: the step's role from
        :meth:`step_cr`: a ``"span"`` step's timings are kept for the span's judgement
        (:meth:`_close_span`) and never reach the drift detector, a ``"cold"`` one's are not
        timed into anything (both count in the measured communication). ``cold``: a route step
        that negotiated its names afresh (:meth:`start_route_step`): counted in the measured
        communication, kept out of the fits and the drift detector. ``exploring``: a step on the
        path the router did not choose (:meth:`_explore`): its timings do not reach the drift
        detector, which judges the route's path. Under Flexible (a fixed CR) the first warm
        route step of each kind and size since a probe timed it replaces the probe's timings
        there (probes run each collective alone, on idle ranks, and in the acceptance grid
        over-predicted AR-Topk's steps by 23%, median of 54 cells): the line then runs through
        real steps at the size in use and the probe's other size."""
        code = float(control[PATH_SLOT])
        t1, t2, t_var = (float(control[slot]) for slot in TIMING_SLOTS)
        path = _PATH_OF_CODE.get(code)
        if path is None:
            return  # no previous step (first step after start or a probe)
        k = k_for(cr, self.numel)
        sizes = self.payload_bytes(k)
        if path == "allgather":
            samples = [("allgather", sizes["allgather"], t1)]
        else:
            samples = [("broadcast", sizes["broadcast"], t1), ("allreduce", sizes["allreduce"], t2)]
            if t_var > 0:
                samples.append(("allgather", VAR_GATHER_BYTES, t_var))
        measured = sum(ms for _, _, ms in samples)
        self.step_comm_ms_total += measured
        if role in START_ROLES:
            self._observe_start_step(samples, role)
            return
        if self.start_pending:  # a route step before the start-up steps' timings: no model yet
            return
        predicted = self.predict(cr)[path]
        if role in ("span", "cold"):
            self._observe_span_step(samples, cr, path, role)
            return
        if cold:
            self.n_cold_steps += 1
            log.debug("hvd_flexcomm: %s step at cr %g negotiated its names afresh: %.2f ms "
                      "(predicted %.2f ms) kept out of the model", path, cr, measured, predicted)
            return
        arrived = exploring and self.remeasure_path == path and not self.remeasure_pending
        if arrived:  # the path not in use, re-measured on a real step: the old levels go
            for kind in self.remeasure_stale:
                self.model.fits[kind].reset_level()
        for kind, nbytes, ms in samples:
            if not self.probe_crs and (kind, nbytes) not in self.stepped_sizes:
                self.model.fits[kind].drop_size(nbytes)
                self.stepped_sizes.add((kind, nbytes))
            self.model.observe(kind, nbytes, ms)
        if exploring:
            log.info("hvd_flexcomm: exploring step on the %s at cr %g: %.2f ms (predicted %.2f ms)",
                     path, cr, measured, predicted)
            if arrived:
                self._remeasured(path, measured, predicted)
            return
        self.recent_steps.append(samples)
        if (path, k) != self.drift_key:
            self.drift.clear_history()  # another path or size: its timings have their own range
            self.drift_key = (path, k)
        if self.drift_confirm_left > 0:
            self._confirm_drift(path, k, predicted, measured)
            return
        if self.drift.update(predicted, measured):
            band = self.drift.last_band
            shown = ("" if band is None else
                     f" and outside its recent range {band[0]:.2f}-{band[1]:.2f} ms")
            confirm = self.mode.drift_confirm
            if confirm > 0:
                self.drift_confirm_left = confirm
                self.drift_confirm_key, self.drift_confirm_band = (path, k), band
                log.info("hvd_flexcomm: measured %s time %.2f ms is off its prediction %.2f ms%s "
                         "for %d steps: the model is re-measured if the next %d step(s) are off "
                         "too", path, measured, predicted, shown, self.drift.patience, confirm)
                return
            self._act_on_drift(path, (f"measured {path} time {measured:.2f} ms is off its "
                                      f"prediction {predicted:.2f} ms{shown} for "
                                      f"{self.drift.patience} steps"))

    def _confirm_drift(self, path: str, k: int, predicted: float, measured: float) -> None:
        """One route step after the detector fired (``mode.drift_confirm``): off its prediction
        as judged when it fired (beyond ``drift_threshold`` and outside the noise band of then;
        the threshold alone at another path or size), it counts towards the re-measure;
        otherwise the drift is not confirmed and nothing is re-measured. Either way its timing
        joins the detector's recent range."""
        band = self.drift_confirm_band if (path, k) == self.drift_confirm_key else None
        off = (self.drift.off_prediction(predicted, measured) if band is None
               else self.drift.violates(predicted, measured, band))
        self.drift.remember(measured)
        if not off:
            self.drift_confirm_left = 0
            self.n_drift_unconfirmed += 1
            log.info("hvd_flexcomm: measured %s time %.2f ms is back near its prediction %.2f ms%s"
                     ": drift not confirmed, nothing re-measured", path, measured, predicted,
                     "" if band is None else f" or within {band[0]:.2f}-{band[1]:.2f} ms")
            return
        self.drift_confirm_left -= 1
        if self.drift_confirm_left == 0:
            self._act_on_drift(path, (f"measured {path} time {measured:.2f} ms is still off its "
                                      f"prediction {predicted:.2f} ms, "
                                      f"{self.mode.drift_confirm} step(s) after the drift "
                                      "detector fired"))

    def _act_on_drift(self, path: str, why: str) -> None:
        """Re-measure after drift (``why``: for the log): under ``reprobe_by="steps"`` the
        path in use is re-anchored and the other path re-measured on a real step; otherwise a
        probe falls due: a full one for candidate CRs without span steps, else a drift probe
        (spans follow it under span steps; a fixed CR needs its size only)."""
        self.drift_confirm_left = 0
        if self.reprobes_by_steps:
            log.info("hvd_flexcomm: %s: the %s is re-anchored on its recent steps and the other "
                     "path is re-measured on a real step", why, path)
            self._drift_by_steps(path)
            return
        if self.probe_crs and not self.spans_on:
            self.full_probe_due = True
        else:
            self.drift_probe_due = True
        log.info("hvd_flexcomm: %s: %s probe of the network", why,
                 "full" if self.full_probe_due else "drift")

    def _span_ends_ms(self, path: Optional[str] = None) -> dict:
        """Predicted ms of ``path`` (default: the path in use) at both ends of the candidate
        CRs."""
        path = path or self.path
        return {c: self.predict(c)[path] for c in (min(self.probe_crs), max(self.probe_crs))}

    def _observe_span_step(self, samples: list, cr: float, path: str, role: str) -> None:
        """One span step's timings (``role`` "span" or "cold"): kept until the span's last step
        arrives, then judged (:meth:`_close_span`). Timings of a step that belongs to no open
        span (its span was abandoned by a probe) are dropped."""
        if not self.span_open or cr != self.span_cr:
            return
        self.span_observed += 1
        if role == "span" and path == self.span_path:
            self.span_samples.append(samples)
        if self.span_observed >= int(self.mode.span_steps):
            self._close_span()

    def _close_span(self) -> None:
        """Judge a span from its timed steps, against what the model predicted at its CR (on the
        span's path) when it started:

        - **confirmed**: some timed step lies within ``drift_threshold`` of the prediction, or
          the steps lie on both sides of it. The timings are dropped and the model is kept. A
          line through the recent steps at the CR in use and a few steps at ``c_low`` has a
          short base (the CR in use is a few times ``c_low``, the far end tens of times) and the
          timings on that base are noisy (TCP at 100 Mbit/s, 5 ms one way: the same CR's steps
          took 95-143 ms, and the CR in use and ``c_low`` differ by 10-30 ms), so fitting them
          re-tilted the slope at every span, and the chord over the small sizes, where latency
          dominates, is flatter than the one the start-up probe measured over the whole range;
        - **off once** (every timed step beyond ``drift_threshold`` of the prediction, on the
          same side, in a routine span whose predecessor was not off on that side): counted
          (``n_span_offs``) and kept out of the model. A few steps at ``c_low`` are noisy, and
          the line through them and the CR in use only spans the small sizes: on a static
          100 Mbit/s, 5 ms link one span measured 115 and 99 ms where about 79 ms was
          predicted (the 6 spans after it confirmed), and the refitted line was flat, 112-114 ms at
          every candidate from 0.001 to 0.1 (about 330 ms measured at 0.1). Not when far below;
        - **off twice** (the next routine span off on the same side too), or the spans that
          follow a drift probe (one on each sparse path, the path in use first; they also keep
          the samples at the sizes the drift probe measured, :attr:`drift_anchor_bytes`): the
          span's kinds drop their samples at
          every size but the one in use
          (:meth:`~hvd_flexcomm.calibration.LinearCostFit.keep_sizes`) and take the span's
          timings (the slope learned over a wider base is unpinned first,
          :meth:`~hvd_flexcomm.calibration.LinearCostFit.unpin_slope`): the path's line rests
          on real steps, the CR in use and the span's end. If
          that moved the prediction at either end of the candidates by more than
          ``drift_threshold`` (or the span follows drift), the model counts one change
          (:attr:`model_version`) and Adaptive re-optimises;
        - **far below** (a routine span whose every timed step took less than
          1/:data:`SPAN_FAR_BELOW` of the prediction): as off twice, at once. Only a faster
          network makes every step of a span that much faster; stalls make steps slower."""
        before, timed = self.span_before_ms, self.span_samples
        after_drift, cr, path = self.span_after_drift, self.span_cr, self.span_path
        self._end_span()
        if after_drift and self.span_other_due:  # the other sparse path's span, at once
            self.span_other_due = False
            self.span_second_path = _other_path(path)
            self.span_soon_step = 0
        if not timed:  # its steps ran on another path, or only its cold step was timed
            return
        expected = before[cr]  # a span's CR is an end of the candidates
        measured = [sum(ms for _, _, ms in step_samples) for step_samples in timed]
        thr = self.mode.drift_threshold
        side = ("high" if all(m > (1.0 + thr) * expected for m in measured) else
                "low" if all(m < (1.0 - thr) * expected for m in measured) else None)
        shown = ", ".join(f"{m:.1f}" for m in measured)
        if side is None and not after_drift:
            self.n_span_confirms += 1
            self.span_off_side = None
            log.info("hvd_flexcomm: the span at cr %g confirmed the model: measured %s ms on the "
                     "%s, predicted %.1f ms (within %.0f%% or on both sides)", cr, shown, path,
                     expected, 100 * thr)
            return
        far_below = side == "low" and all(SPAN_FAR_BELOW * m < expected for m in measured)
        if not after_drift and not far_below and self.span_off_side != side:
            self.span_off_side = side
            self.n_span_offs += 1
            log.info("hvd_flexcomm: the span at cr %g measured %s ms on the %s, predicted %.1f ms "
                     "(all %s by more than %.0f%%): kept out of the model unless the next span "
                     "is off on the same side", cr, shown, path, expected,
                     "above" if side == "high" else "below", 100 * thr)
            return
        self.span_off_side = None
        in_use = self.payload_bytes(k_for(self.span_base_cr, self.numel))
        for kind, _, _ in timed[0]:
            if not (kind == "allgather" and path == "allreduce"):  # VAR's norm allgather
                keep = {in_use[kind]}
                if after_drift and kind in self.drift_anchor_bytes:  # the drift probe's size
                    keep.add(self.drift_anchor_bytes[kind])
                # the span's base (4x or more) may be narrower than the probe's, whose slope is
                # pinned against narrower bases; two spans off on one side outweigh it
                self.model.fits[kind].unpin_slope()
                self.model.fits[kind].keep_sizes(keep)
        for step_samples in timed:
            for kind, nbytes, ms in step_samples:
                self.model.observe(kind, nbytes, ms)
        after = self._span_ends_ms(path)
        moved = {c: abs(after[c] - ms) / max(ms, 1e-9) for c, ms in before.items()}
        end = max(moved, key=moved.get)
        if moved[end] > thr or after_drift:
            self.n_span_moves += 1
            why = (" after drift" if after_drift else
                   f" (every step over {SPAN_FAR_BELOW:g}x below: no second span)" if far_below
                   else "")
            log.info("hvd_flexcomm: the span at cr %g (measured %s ms on the %s, predicted %.1f "
                     "ms)%s moved the predicted time at cr %g %.1f -> %.1f ms (%.0f%%): model "
                     "recalibrated", cr, shown, path, expected, why, end, before[end],
                     after[end], 100 * moved[end])

    def _end_span(self) -> None:
        """Close the span state (judged, or abandoned by a probe)."""
        self.span_left = 0
        self.span_samples = []
        self.span_observed = 0
        self.span_before_ms = None
        self.span_after_drift = False

    # -- checkpoints -----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model.to_dict(), "path": self.path,
                "last_probe_step": self.last_probe_step, "probe_ms_total": self.probe_ms_total,
                "n_switches": self.n_switches, "n_full_probes": self.n_full_probes,
                "n_drift_probes": self.n_drift_probes, "n_refreshes": self.n_refreshes,
                "n_drift_steps": self.n_drift_steps, "n_refresh_steps": self.n_refresh_steps,
                "n_recheck_steps": self.n_recheck_steps, "recheck_step": self.recheck_step,
                "n_held_switches": self.n_held_switches,
                "refresh_ms_total": self.refresh_ms_total,
                "step_comm_ms_total": self.step_comm_ms_total,
                "span_ms_total": self.span_ms_total, "last_span_step": self.last_span_step,
                "n_span_steps": self.n_span_steps,
                "n_span_moves": self.n_span_moves, "n_span_confirms": self.n_span_confirms,
                "n_span_offs": self.n_span_offs, "span_off_side": self.span_off_side,
                "n_drift_unconfirmed": self.n_drift_unconfirmed,
                "n_step_starts": self.n_step_starts, **self._after_drift_state()}

    def _after_drift_state(self) -> dict[str, Any]:
        """The spans after drift still due, for a checkpoint: a span under way is not resumed
        (:meth:`load_dict`), so an open span after drift is saved as due again."""
        soon, second = self.span_soon_step, self.span_second_path
        if self.span_open and self.span_after_drift:
            soon = 0
            if not self.span_other_due:  # the second of the two
                second = self.span_path
        return {"span_soon_step": soon, "span_other_due": self.span_other_due,
                "span_second_path": second, "drift_anchor_bytes": dict(self.drift_anchor_bytes)}

    def load_dict(self, state: dict[str, Any]) -> None:
        self.model = CollectiveCostModel.from_dict(state["model"])
        self.path = state.get("path")
        self.router = Router(self.mode.hysteresis,
                             current=self.path if self.path in PATHS else None)

        self.last_probe_step = int(state.get("last_probe_step", 0))
        self.probe_ms_total = float(state.get("probe_ms_total", 0.0))
        self.n_switches = int(state.get("n_switches", 0))
        self.n_full_probes = int(state.get("n_full_probes", 0))
        self.n_drift_probes = int(state.get("n_drift_probes", 0))
        self.n_refreshes = int(state.get("n_refreshes", 0))
        self.n_drift_steps = int(state.get("n_drift_steps", 0))
        self.n_refresh_steps = int(state.get("n_refresh_steps", 0))
        self.n_recheck_steps = int(state.get("n_recheck_steps", 0))
        self.recheck_step = state.get("recheck_step")
        self.n_held_switches = int(state.get("n_held_switches", 0))
        self._end_remeasure()  # a re-measure under way is not resumed (as a drift probe due)
        self.refresh_ms_total = float(state.get("refresh_ms_total", 0.0))
        self.step_comm_ms_total = float(state.get("step_comm_ms_total", 0.0))
        self.span_ms_total = float(state.get("span_ms_total", 0.0))
        self.last_span_step = state.get("last_span_step")
        self.n_span_steps = int(state.get("n_span_steps", 0))
        self.n_span_moves = int(state.get("n_span_moves", 0))
        self.n_span_confirms = int(state.get("n_span_confirms", 0))
        self.n_span_offs = int(state.get("n_span_offs", 0))
        self.span_off_side = state.get("span_off_side")
        # a drift being confirmed is not resumed (as the detector's count): it fires again
        self.n_drift_unconfirmed = int(state.get("n_drift_unconfirmed", 0))
        self.drift_confirm_left = 0
        self._end_span()  # a span under way is not resumed (its timings were this process's)
        self.span_soon_step = state.get("span_soon_step")
        self.span_other_due = bool(state.get("span_other_due", False))
        self.span_second_path = state.get("span_second_path")
        self.drift_anchor_bytes = {k: int(v) for k, v in
                                   state.get("drift_anchor_bytes", {}).items()}
        self.n_step_starts = int(state.get("n_step_starts", 0))
        # a start-up on real steps under way is not resumed: an uncalibrated model starts again
        self.start_plan, self.start_timed_left, self.start_given_up = [], 0, False
        self.full_probe_due = not self.model.is_calibrated()
