"""``hvd_flexcomm.DistributedOptimizer``: Horovod's optimizer with top-k compression paths.

The returned object is built exactly as Horovod builds its own: a new class whose base is the
user's optimizer class, carrying ``horovod.torch.optimizer._DistributedOptimizer``'s methods, with
ours layered on top. So everything Horovod's optimizer does (``named_parameters`` validation,
``backward_passes_per_step``, ``synchronize()`` / ``skip_synchronize()``, ``zero_grad`` checks,
``groups``, sparse gradients, ``hvd.broadcast_optimizer_state``) behaves the same, and ``Dense()``
*is* Horovod's code path.

For the top-k modes (``AGTopk``, ``ARTopk``) the per-parameter hooks only count backward passes (and,
with ``granularity="bucket"``, submit a bucket once all its gradients are ready); ``synchronize()``
submits what is left, runs the second phase of AR-Topk for every message before waiting on any, and
writes the aggregated gradients back into ``p.grad``.
"""

from __future__ import annotations

import hashlib
import logging
import time
import warnings
from collections.abc import Iterable
from contextlib import contextmanager  # noqa: F401  (re-exported behaviour via Horovod's dict)
from typing import Any, NamedTuple, Optional

import torch

from ._horovod import require_horovod
from .compression import Adaptive, Dense, Flexible, TopkCompression, settings_of
from .control import allgather_object
from .messages import GradMessage, build_messages
from .sync import (
    ANNOUNCE_SLOT,
    CONTROL_SLOTS,
    MessageOutcome,
    Pending,
    StepConfig,
    advance,
    finish,
    launch,
    wire_dtype,
)
from .topk import k_for
from .waiting import wait

__all__ = ["DistributedOptimizer"]

log = logging.getLogger("hvd_flexcomm")

_STATE_KEY = "hvd_flexcomm"


def _as_mode(compression: Any, hvd: Any) -> Any:
    """Normalise the ``compression`` argument into one of our mode objects."""
    if compression is None:
        return Dense()
    if isinstance(compression, (Dense, TopkCompression)):
        return compression
    # Horovod's own per-tensor compressors (hvd.Compression.none / .fp16) keep the dense path.
    horovod_compressor = getattr(hvd.compression, "Compressor", None)
    if isinstance(compression, type) and horovod_compressor and issubclass(compression,
                                                                          horovod_compressor):
        return Dense(compressor=compression)
    if horovod_compressor and isinstance(compression, horovod_compressor):
        return Dense(compressor=compression)
    raise TypeError(
        "compression must be hvd_flexcomm.Dense(), AGTopk(...), ARTopk(...) or one of Horovod's "
        f"compressors (hvd.Compression.none / fp16), got {compression!r} of type "
        f"{type(compression).__name__}"
    )


class _SentStep(NamedTuple):
    """A step whose timings ride in the next step's payload, as the controller needs it back:
    its CR (fraction kept), span role (``None``: a route step), and whether it was cold or
    exploring (:meth:`FlexibleController.start_route_step`)."""

    cr: float
    role: Optional[str]
    cold: bool
    exploring: bool


class _FlexMethods(torch.optim.Optimizer):
    """Methods layered over Horovod's ``_DistributedOptimizer`` (see the module docstring)."""

    def __init__(self, params, named_parameters, mode, backward_passes_per_step, op,
                 gradient_predivide_factor, groups, sparse_as_dense, process_set):
        hvd = require_horovod()
        from horovod.torch.optimizer import _DistributedOptimizer

        self._flex_hvd = hvd
        self._flex_mode = mode
        self._flex_messages: list[GradMessage] = []
        self._flex_msg_of: dict = {}
        self._flex_pending: dict[int, Pending] = {}
        self._flex_hooks_registered = False
        self._flex_checked = False
        self._flex_step = 0
        self._flex_skip_next_step = False
        self._flex_controller = None  # FlexibleController, for Flexible() and Adaptive()
        self._flex_adaptive = None  # AdaptiveController, for Adaptive()
        self._flex_cr = getattr(mode, "cr", 1.0)  # the CR of the current step
        self._flex_routed_cr = None  # the CR the current path was decided for
        self._flex_base_cr = self._flex_cr  # the CR in use (a span step runs at another one)
        self._flex_role: Optional[str] = None  # this step's span role (FlexibleController.step_cr)
        self._flex_cold = False  # this step negotiates its route names afresh (start_route_step)
        self._flex_exploring = False  # this step runs the path the router did not choose
        # the step whose timings ride in _flex_control (None: none, or stale after a probe)
        self._flex_sent: Optional[_SentStep] = None
        self._flex_control: tuple = (0.0,) * CONTROL_SLOTS  # sent with the next step's payload
        self._flex_announce_flag = False  # Adaptive: rank 0's announce flag, as last received
        self._flex_probe_ms = 0.0  # probing time spent in the current step
        self._flex_sync_end: Optional[float] = None  # perf_counter s when the last step's sync ended
        self._flex_other_ms: Optional[float] = None  # this step's time outside synchronize (ms)
        # perf_counter s of the last zero_grad() and of this step's first gradient hook, since
        # the last synchronize(): before step 0 they time its forward and backward passes
        self._flex_zero_grad_at: Optional[float] = None
        self._flex_first_hook_at: Optional[float] = None
        self._flex_first_other_ms: Optional[float] = None  # that estimate for the first step
        self._flex_probe_kind: Optional[str] = None  # its kind: "full", "drift" or "refresh"
        self._flex_probe_phases: Optional[dict] = None  # its ms per phase (probing.PHASES)
        self.last_stats: dict = {}
        compressor = mode.compressor if isinstance(mode, Dense) else None
        if compressor is None:
            compressor = hvd.Compression.none
        _DistributedOptimizer.__init__(self, params, named_parameters, compressor,
                                       backward_passes_per_step, op, gradient_predivide_factor,
                                       groups, sparse_as_dense, process_set)
        # Horovod registers hooks only when size() > 1; compression applies at every size, so a
        # single-process run trains with exactly the arithmetic of a multi-process one.
        if self._flex_is_topk() and not self._flex_hooks_registered and process_set.included():
            self._register_hooks()
        log.info("hvd_flexcomm: %s over %d rank(s), %d message(s)", mode.describe(),
                 self.process_set.size(), len(self._flex_messages))

    # -- helpers -------------------------------------------------------------------------------
    def _flex_is_topk(self) -> bool:
        return isinstance(self._flex_mode, TopkCompression)

    def _flex_path(self) -> str:
        mode = self._flex_mode
        if self._flex_cr >= 1.0:
            return "dense"
        if self._flex_controller is not None:
            return self._flex_controller.step_path(self._flex_role)
        return mode.collective

    def _flex_step_config(self) -> StepConfig:
        hvd = self._flex_hvd
        mode = self._flex_mode
        average = self.op == hvd.Average
        return StepConfig(
            step=self._flex_step, rank=self.process_set.rank(), size=self.process_set.size(),
            cr=self._flex_cr, path=self._flex_path(), selector=getattr(mode, "selector", "star"),
            average=average, predivide=self.gradient_predivide_factor if average else 1.0,
            process_set=self.process_set, hvd=hvd, control=self._flex_control,
            agreement=self._flex_agreement_hash(),
            name_suffix="" if self._flex_role is None else
            f".span{k_for(self._flex_cr, self._flex_controller.numel)}")

    def _flex_fingerprint(self) -> dict:
        names = [self._parameter_names.get(p) for m in self._flex_messages for p in m.params]
        digest = hashlib.sha1("\n".join(map(str, names)).encode()).hexdigest()[:16]
        return {
            "compression": self._flex_mode.describe(),
            "compression settings": settings_of(self._flex_mode),
            "op": str(self.op),
            "backward_passes_per_step": self.backward_passes_per_step,
            "parameters": f"{len(names)} names, sha1 {digest}",
            "messages": [(m.numel, str(m.dtype)) for m in self._flex_messages],
        }

    def _flex_check_consistency(self) -> None:
        """First step only: one allgather of each rank's configuration; raise on every rank if
        any rank differs from rank 0 (before any payload collective could hang or mix data)."""
        if self._flex_checked:
            return
        self._flex_checked = True
        mine = self._flex_fingerprint()
        everyone = allgather_object(mine, "hvd_flexcomm.config", self._flex_hvd, self.process_set)
        reference = everyone[0]
        for rank, theirs in enumerate(everyone):
            for key in reference:
                ours, others = reference.get(key), theirs.get(key)
                if others == ours:
                    continue
                if isinstance(ours, dict) and isinstance(others, dict):  # name what differs
                    detail = "; ".join(f"{n}: rank 0 has {ours.get(n)}, rank {rank} has "
                                       f"{others.get(n)}" for n in {**ours, **others}
                                       if ours.get(n) != others.get(n))
                else:
                    detail = f"rank 0 has {ours!r}, rank {rank} has {others!r}"
                raise ValueError(f"hvd_flexcomm: ranks disagree on {key}: {detail}. Every rank "
                                 "must build the same model and pass the same compression "
                                 "settings.")

    def _flex_agreement_hash(self) -> int:
        """A small hash of (settings, step, CR, path) that every rank puts in its payload; the
        receivers compare them (see ``sync.py``), so a rank whose state diverged is caught at the
        step it diverges, at no extra message."""
        text = f"{self._flex_mode.describe()}|{self._flex_step}|{self._flex_cr!r}|{self._flex_path()}"
        return int(hashlib.sha1(text.encode()).hexdigest()[:8], 16)

    # -- Horovod overrides ---------------------------------------------------------------------
    def _register_hooks(self):
        from horovod.torch.optimizer import _DistributedOptimizer

        if not self._flex_is_topk():
            return _DistributedOptimizer._register_hooks(self)
        if self._groups is not None:
            raise ValueError("groups is only supported with Dense(); top-k modes group parameters "
                             "themselves (granularity='model' or 'bucket')")
        trainable = [p for group in self.param_groups for p in group["params"] if p.requires_grad]
        mode = self._flex_mode
        self._flex_messages = build_messages(trainable, mode.granularity,
                                             int(mode.bucket_cap_mb * 1024 * 1024),
                                             names=self._parameter_names)
        for msg in self._flex_messages:
            for p in msg.params:
                self._flex_msg_of[p] = msg
        if isinstance(mode, Flexible):
            from .flexible import FlexibleController

            dtype = self._flex_messages[0].dtype if self._flex_messages else torch.float32
            self._flex_controller = FlexibleController(
                mode, self.process_set.size(), sum(m.numel for m in self._flex_messages),
                dtype.itemsize, wire_dtype(dtype).itemsize)
        if isinstance(mode, Adaptive):
            from .adaptive import AdaptiveController

            ctrl = self._flex_controller
            ctrl.probe_crs = tuple(mode.candidates) + (mode.c_low, mode.c_high)
            ctrl.dense_until_step = mode.warmup_steps  # warm-up CRs may be cheaper dense
            self._flex_adaptive = AdaptiveController(
                mode, self.process_set.rank(), self._flex_hvd, self.process_set,
                predict_ms=ctrl.predict, model_version=lambda: ctrl.model_version,
                recalibrating=lambda: ctrl.recalibrating)
            self._flex_cr = self._flex_adaptive.cr
        for p in trainable:
            self._requires_update.add(p)
            grad_acc = p.expand_as(p).grad_fn.next_functions[0][0]
            grad_acc.register_hook(self._flex_make_hook(p))
            self._grad_accs.append(grad_acc)
        self._flex_hooks_registered = True

    def _flex_make_hook(self, p):
        def hook(*ignore):
            if self._flex_first_hook_at is None:
                self._flex_first_hook_at = time.perf_counter()
            if self._allreduce_delay[p] <= 0:
                raise AssertionError(
                    "Gradients were computed more than backward_passes_per_step times before "
                    "call to step(). Increase backward_passes_per_step to accumulate gradients "
                    "locally.")
            self._allreduce_delay[p] -= 1
            if self._allreduce_delay[p] == 0 and self._flex_mode.granularity == "bucket":
                msg = self._flex_msg_of[p]
                msg.ready += 1
                if msg.ready == len(msg.params) and msg.index not in self._flex_pending:
                    self._flex_launch(msg)
        return hook

    def _flex_launch(self, msg: GradMessage) -> None:
        self._flex_check_consistency()
        self._flex_pending[msg.index] = launch(msg, self._flex_step_config())

    def synchronize(self):
        from horovod.torch.optimizer import _DistributedOptimizer

        if not self._flex_is_topk():
            t0 = time.perf_counter()
            for handle, _ in list(self._handles.values()):  # Horovod's loop would spin on them
                if handle is not None and not callable(handle):
                    wait(self._flex_hvd, handle)
            _DistributedOptimizer.synchronize(self)
            self._flex_step += 1
            numel = sum(p.numel() for p in self._requires_update)
            nbytes = sum(p.numel() * p.element_size() for p in self._requires_update)
            self.last_stats = {"step": self._flex_step - 1, "cr": 1.0, "collective": "dense",
                               "root_rank": None, "k": numel, "bytes_sent": nbytes,
                               "compress_ms": 0.0, "comm_ms": 1e3 * (time.perf_counter() - t0),
                               "gain": 1.0, "skipped": False, "nonfinite_ranks": []}
            return
        if not self.process_set.included():
            self._synchronized = True
            return
        self._flex_probe_ms = 0.0
        self._flex_probe_kind = None
        self._flex_probe_phases = None
        self._flex_role = None
        self._flex_cold = self._flex_exploring = False
        sync_start = time.perf_counter()
        self._flex_other_ms = (None if self._flex_sync_end is None
                               else 1e3 * (sync_start - self._flex_sync_end))
        if self._flex_sync_end is None:  # the first step: forward and backward since zero_grad()
            began = self._flex_zero_grad_at or self._flex_first_hook_at  # (or backward alone)
            self._flex_first_other_ms = None if began is None else 1e3 * (sync_start - began)
        self._flex_zero_grad_at = self._flex_first_hook_at = None
        if self._flex_adaptive is not None:
            if self._flex_other_ms is not None:
                self._flex_adaptive.note_other_ms(self._flex_other_ms)
            self._flex_check_consistency()
            self._flex_cr = self._flex_adaptive.cr_for_step(self._flex_step,
                                                            self._flex_announce_flag)
        if self._flex_controller is not None and self._flex_cr < 1.0:
            self._flex_check_consistency()
            self._flex_route()
        for msg in self._flex_messages:
            if msg.index not in self._flex_pending:
                self._flex_launch(msg)
        pendings = [self._flex_pending[m.index] for m in self._flex_messages]
        if self._flex_adaptive is not None and pendings and pendings[0].cfg.path != "dense":
            # rank 0 measures candidate gains while the first collective is in flight
            self._flex_adaptive.observe(self._flex_step, pendings[0].error_fed)
        for pending in pendings:  # every AR-Topk allreduce is submitted before any wait
            advance(pending)
        outcomes = [finish(pending) for pending in pendings]
        skipped = any(o.skipped for o in outcomes)
        for msg, outcome in zip(self._flex_messages, outcomes):
            msg.write_grads(outcome.result)
            msg.ready = 0
        self._flex_pending.clear()
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = self.backward_passes_per_step
        self._flex_record(outcomes, skipped)
        if self._flex_adaptive is not None and not skipped and self._flex_path() != "dense":
            self._flex_adaptive.note_compress_ms(self._flex_cr, self.last_stats["compress_ms"])
        if self._flex_controller is not None and self._flex_cr < 1.0:
            self._flex_after_step(outcomes)
        self._flex_step += 1
        self._synchronized = True
        self._flex_sync_end = time.perf_counter()

    def _flex_route(self) -> None:
        """Flexible: run the probes that are due (identically on every rank), then make sure the
        path of this step is decided."""
        from .probing import run_probes_sharing

        ctrl, cr, adaptive = self._flex_controller, self._flex_cr, self._flex_adaptive
        plan, repeats, kind = ctrl.probe_plan(self._flex_step, cr)
        if plan:
            # Adaptive(cr=None): rank 0's gains and time outside communication ride with the
            # start-up probe's timings, and every rank picks the first CR from them (not at a
            # full probe after a start-up calibrated on real steps: the first solve picks)
            picking = (adaptive is not None and kind == "full" and ctrl.n_step_starts == 0
                       and adaptive.starts_probe_pick(self._flex_step))
            share = adaptive.probe_share(self._flex_step, self._flex_error_fed,
                                         self._flex_first_other_ms) if picking else ()
            t0 = time.perf_counter()
            warm_up, warmed = ctrl.probe_warm_up(kind)
            phases: dict = {}
            results, shared = run_probes_sharing(self._flex_hvd, plan, repeats, share,
                                                 self.process_set, warmed=warmed, warm_up=warm_up,
                                                 phases_ms=phases)
            spent = 1e3 * (time.perf_counter() - t0)
            ctrl.after_probe(self._flex_step, results, kind, spent)
            if picking:
                picked = adaptive.pick_from_probe(self._flex_step, shared[0])
                if picked is not None:
                    cr = self._flex_cr = picked
            self._flex_probe_ms, self._flex_probe_kind = spent, kind
            self._flex_probe_phases = phases
            log.info("hvd_flexcomm: step %d: %s probe, %d timings, %.1f ms (%s)", self._flex_step,
                     kind, len(results), spent,
                     ", ".join(f"{phase} {ms:.1f}" for phase, ms in phases.items()))
            if kind != "refresh":
                self._flex_control = (0.0,) * CONTROL_SLOTS  # timings before it are stale
                self._flex_sent = None
                ctrl.path = None
        self._flex_base_cr = cr
        if ctrl.path is None or cr != self._flex_routed_cr:
            ctrl.decide(self._flex_step, cr)
            self._flex_routed_cr = cr
        # Adaptive: a span step runs at the far end of the candidates, on the path decided for cr
        self._flex_cr, self._flex_role = ctrl.step_cr(self._flex_step, cr)
        self._flex_cold, self._flex_exploring = (
            ctrl.start_route_step(self._flex_path(), self._flex_cr) if self._flex_role is None
            else (False, False))

    def _flex_error_fed(self) -> torch.Tensor:
        """The error-fed gradient of the first message as this step will send it (a copy)."""
        msg = self._flex_messages[0]
        return msg.flat_grads().add_(msg.residual)

    def _flex_after_step(self, outcomes: list[MessageOutcome]) -> None:
        """Flexible: learn from the previous step's timings (minima over ranks, received in this
        step's payload, identical on every rank) and decide the next step's path."""
        ctrl, cr = self._flex_controller, self._flex_base_cr
        path = self._flex_path()  # this step's (a span step's path may not be the route's)
        # this rank's own times (from _flex_record); the payload delivers each one's minimum over
        # ranks (sync.py)
        timings = tuple(self.last_stats["timings_ms"])
        received = outcomes[0].control if outcomes and outcomes[0].control else None
        sent = self._flex_sent
        if received and sent is not None:
            # the previous step, at its CR and span role
            ctrl.observe_step(received, sent.cr, sent.role, cold=sent.cold,
                              exploring=sent.exploring)
        adaptive = self._flex_adaptive
        if received:
            self._flex_announce_flag = received[ANNOUNCE_SLOT] > 0.5
        self._flex_control = ctrl.outgoing_control(
            path, timings, announce=adaptive is not None and adaptive.announce_ready())
        self._flex_sent = _SentStep(self._flex_cr, self._flex_role, self._flex_cold,
                                    self._flex_exploring)
        self.last_stats["predicted_ms"] = dict(ctrl.predicted_ms)
        self.last_stats["measured_ms"] = self.last_stats["comm_ms"]
        self.last_stats["probe_ms"] = self._flex_probe_ms
        self.last_stats["probe_kind"] = self._flex_probe_kind
        self.last_stats["probe_phases_ms"] = self._flex_probe_phases
        self.last_stats["cold"] = self._flex_cold
        self.last_stats["exploring"] = self._flex_exploring
        # an exploring step that re-measures the path not in use: why ("drift", "refresh",
        # "recheck")
        self.last_stats["remeasure"] = (ctrl.remeasure_why if self._flex_exploring
                                        and path == ctrl.remeasure_path else None)
        if not ctrl.probe_due:
            ctrl.decide(self._flex_step + 1, cr)
            self._flex_routed_cr = cr

    def _flex_record(self, outcomes: list[MessageOutcome], skipped: bool) -> None:
        total = sum(m.numel for m in self._flex_messages)
        path = self._flex_path()
        roots = {o.root for o in outcomes}
        bad = sorted({r for o in outcomes for r in o.nonfinite_ranks})
        weights = [m.numel / total if total else 0.0 for m in self._flex_messages]
        self.last_stats = {
            "step": self._flex_step,
            "cr": self._flex_cr,
            "collective": path,
            "root_rank": roots.pop() if len(roots) == 1 else sorted(roots, key=str),
            "k": sum(o.k for o in outcomes),
            "bytes_sent": sum(o.bytes_sent for o in outcomes),
            "compress_ms": 1e3 * sum(o.compress_s for o in outcomes),
            "comm_ms": 1e3 * sum(o.comm_s for o in outcomes),
            "timings_ms": [sum(o.timings_ms[i] for o in outcomes) for i in range(3)],
            "gain": float(sum(w * o.gain for w, o in zip(weights, outcomes))),
            "other_ms": self._flex_other_ms,
            "span": self._flex_role is not None,
            "skipped": skipped,
            "nonfinite_ranks": bad,
        }
        if skipped:
            self._flex_skip_next_step = True
            log.warning("hvd_flexcomm: step %d skipped: non-finite gradient on rank(s) %s; "
                        "residual memory kept", self._flex_step, bad or "?")

    def step(self, closure=None):
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() "
                              "context after optimizer.synchronize(). This can cause training "
                              "slowdown. You may want to consider using "
                              "optimizer.skip_synchronize() context if you use "
                              "optimizer.synchronize() in your code.", stacklevel=2)
            self.synchronize()
        self._synchronized = False
        if self._flex_skip_next_step:
            self._flex_skip_next_step = False
            return None
        return super(self.__class__, self).step(closure)

    def zero_grad(self, set_to_none: bool = True):
        if self._handles or self._flex_pending:
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but "
                                 "before optimizer.step() or optimizer.synchronize(). This is "
                                 "prohibited as it can cause a race condition.")
        self._flex_zero_grad_at = time.perf_counter()
        return super(self.__class__, self).zero_grad(set_to_none=set_to_none)

    # -- checkpoints ---------------------------------------------------------------------------
    def state_dict(self):
        state = super(self.__class__, self).state_dict()
        state[_STATE_KEY] = {
            "version": 1,
            "compression": self._flex_mode.describe(),
            "step": self._flex_step,
            "rank": self.process_set.rank(),
            "size": self.process_set.size(),
            "residuals": {m.key: m.residual.clone() for m in self._flex_messages},
            "flexible": (self._flex_controller.to_dict() if self._flex_controller is not None
                         else None),
            "adaptive": (self._flex_adaptive.to_dict() if self._flex_adaptive is not None
                         else None),
        }
        return state

    def load_state_dict(self, state_dict):
        from horovod.torch.optimizer import _DistributedOptimizer

        state_dict = dict(state_dict)
        ours = state_dict.pop(_STATE_KEY, None)
        if ours is not None:
            residuals = ours.get("residuals", {})
            for msg in self._flex_messages:
                saved = residuals.get(msg.key)
                if saved is None:
                    continue
                if saved.shape != msg.residual.shape or saved.dtype != msg.residual.dtype:
                    raise ValueError(
                        f"hvd_flexcomm: checkpointed residual {msg.key} has shape "
                        f"{tuple(saved.shape)} {saved.dtype}, this model needs "
                        f"{tuple(msg.residual.shape)} {msg.residual.dtype}")
                msg.residual = saved.clone()
            self._flex_step = int(ours.get("step", 0))
            if self._flex_controller is not None and ours.get("flexible"):
                self._flex_controller.load_dict(ours["flexible"])
            if self._flex_adaptive is not None and ours.get("adaptive"):
                self._flex_adaptive.load_dict(ours["adaptive"])
                self._flex_cr = self._flex_adaptive.cr
            if residuals and ours.get("rank") != self.process_set.rank():
                log.warning("hvd_flexcomm: loading residuals saved by rank %s on rank %d; "
                            "residuals are per rank: save and load one file per rank",
                            ours.get("rank"), self.process_set.rank())
        self._flex_pending.clear()
        _DistributedOptimizer.load_state_dict(self, state_dict)


def _op_name(hvd: Any, op: Any) -> str:
    """``op`` as a person would write it (Horovod's ops are plain ints: Adasum is 2)."""
    for name in ("Average", "Sum", "Adasum", "Min", "Max", "Product"):
        if getattr(hvd, name, object()) == op and not isinstance(op, bool):
            return f"hvd.{name}"
    return repr(op)


def DistributedOptimizer(
    optimizer: torch.optim.Optimizer,
    named_parameters: Optional[Iterable[tuple[str, torch.nn.Parameter]]] = None,
    compression: Any = None,
    backward_passes_per_step: int = 1,
    op: Any = None,
    gradient_predivide_factor: float = 1.0,
    num_groups: int = 0,
    groups: Any = None,
    sparse_as_dense: bool = False,
    process_set: Any = None,
) -> torch.optim.Optimizer:
    """Wrap ``optimizer`` like ``horovod.torch.DistributedOptimizer``, with top-k compression.

    Same arguments as Horovod's (``compression`` also accepts Horovod's ``hvd.Compression.none``
    / ``fp16``, which select the dense path). ``compression``:

    - ``hvd_flexcomm.Dense()`` (default): Horovod's dense allreduce, unchanged;
    - ``hvd_flexcomm.AGTopk(cr=...)``: top-k + error feedback through ``hvd.allgather``;
    - ``hvd_flexcomm.ARTopk(cr=..., selector="star"|"var")``: top-k on one root's support,
      values through ``hvd.allreduce``.

    The top-k modes support ``op=hvd.Average`` (default) and ``hvd.Sum``; ``groups`` is
    Dense-only. After each synchronized step ``optimizer.last_stats`` describes it: ``step``,
    ``cr``, ``collective`` (``"allgather"``, ``"allreduce"`` or ``"dense"``), ``root_rank``,
    ``k`` (entries sent), ``bytes_sent`` (this rank's payload bytes), ``compress_ms``,
    ``comm_ms``, ``timings_ms`` (top-k only: this rank's ms in the first collective, the second
    one and VAR's norm allgather; each includes the wait for the last rank to enter it),
    ``gain`` (‖compressed‖² / ‖error-fed‖², a fraction), ``skipped`` (a non-finite
    gradient on some rank: the step was skipped on every rank, residuals kept),
    ``nonfinite_ranks`` and ``other_ms`` (top-k only: ms from the end of the previous step's
    synchronisation to the start of this one's, i.e. time outside communication; None at the
    first step). Flexible/Adaptive add ``predicted_ms`` (per path), ``measured_ms``,
    ``probe_ms`` (this rank's ms in the probe run before the step, 0 without one), ``probe_kind``
    and ``probe_phases_ms`` (that probe's ms per phase, ``probing.PHASES``: the warm-up round,
    the timed ops, the allgather combining the timings; None without a probe); ``span`` is
    True at Adaptive's span steps (``Adaptive.span_steps``: a few steps at the end of the
    candidate CRs that keep the time curve's slope measured; ``cr`` is then the span's CR).

    Every top-k payload carries a small hash of (settings, step, CR, path); if the ranks' hashes
    differ (their state diverged), every rank raises the same ``RuntimeError`` at that step.
    """
    hvd = require_horovod()
    from horovod.torch.optimizer import _DistributedOptimizer

    if op is None:
        op = hvd.Average
    if process_set is None:
        process_set = hvd.global_process_set
    mode = _as_mode(compression, hvd)
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    if isinstance(backward_passes_per_step, bool) or not isinstance(backward_passes_per_step, int) \
            or backward_passes_per_step <= 0:
        raise ValueError(f"backward_passes_per_step must be a positive integer, got "
                         f"{backward_passes_per_step!r}")
    if gradient_predivide_factor != 1.0 and op != hvd.Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if num_groups != 0:
        warnings.warn("Parameter `num_groups` has been replaced by `groups`.", DeprecationWarning,
                      stacklevel=2)
        if groups is None:
            groups = num_groups
    if isinstance(mode, TopkCompression):
        if op not in (hvd.Average, hvd.Sum):
            raise ValueError("top-k compression supports op=hvd.Average or hvd.Sum, got "
                             f"op={_op_name(hvd, op)}")
        if groups is not None:
            raise ValueError("groups is only supported with Dense(); top-k modes group "
                             "parameters themselves (granularity='model' or 'bucket')")
    elif op == hvd.Adasum:
        return hvd.DistributedOptimizer(optimizer, named_parameters=named_parameters,
                                        compression=mode.compressor or hvd.Compression.none,
                                        backward_passes_per_step=backward_passes_per_step,
                                        op=op, process_set=process_set)

    members = dict(_DistributedOptimizer.__dict__)
    members.update({k: v for k, v in _FlexMethods.__dict__.items()
                    if k not in ("__dict__", "__weakref__", "__doc__")})
    # Keep Horovod's module name: hvd.broadcast_optimizer_state() recognises a distributed
    # optimizer by it and then initialises state with the base class's step(), without a
    # collective. Our class must be treated the same way.
    members["__module__"] = _DistributedOptimizer.__module__
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,), members)
    return cls(optimizer.param_groups, named_parameters, mode, backward_passes_per_step, op,
               gradient_predivide_factor, groups, sparse_as_dense, process_set)
