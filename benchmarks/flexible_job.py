"""The worker of the Flexible benchmarks: runs on every rank under ``horovodrun`` (see
``flexible_driver.py``), one job for many networks.

    flexible_job.py --ctl DIR

``DIR/plan.json`` says what to run (written by the parent, identical for every rank):

- ``{"kind": "grid", ...}``: for each network of ``networks`` (in order), wait until the parent
  has applied it, then for each ``cr`` of ``crs`` measure AG-Topk (``AGTopk(cr)``), AR-Topk
  (``ARTopk(cr, selector="star")``) and a freshly built ``Flexible(cr)`` (start-up calibration on
  this network): ``warmup`` untimed steps each (Flexible's go on until its start-up calibration is
  over, at most ``settle_max``, default 6, more: :func:`warm_up_flexible`), then ``steps`` timed
  steps, interleaved (one step of each method per round) so that machine noise hits every method
  alike. With ``"replicate": true`` a second AG-Topk and AR-Topk optimizer (``"ag2"``, ``"ar2"``)
  run too, interleaved after Flexible: the baseline measured twice in the same window. One
  record per cell.
- ``{"kind": "probe_bias", ...}``: for each network and each ``cr`` of ``crs``, ``rounds``
  times a probe of each collective kind at the size the steps send, then ``steps`` AG-Topk and
  AR-Topk steps (:func:`run_probe_bias`; ``bench_probe_bias.py``). One record per cell.
- ``{"kind": "probe_phases", ...}``: for each network, ``rounds`` times, Adaptive's start-up
  probe (``Adaptive(**adaptive_options)``'s plan for ``numel`` entries, under names new to
  Horovod each round, as at a job's start) through ``probing.run_probes_sharing`` with the
  extra numbers Adaptive's first pick shares: rank 0's wall time of each phase and each timing
  combined over ranks (:func:`run_probe_phases`; ``bench_probe_phases.py``). One record per
  round.
- ``{"kind": "change", ...}``: one ``Flexible`` optimizer (``Adaptive`` with
  ``"adaptive_options"``) runs ``steps`` steps; before step ``s`` of ``changes`` (a list of
  ``[s, network index]``) rank 0 asks the parent to apply that network, and every rank waits
  until it has. One record per step (with the CR in use), and for Adaptive one record of its
  solves at the end; then one record of the controller's counters (drift probes, drifts not
  confirmed, full probes, spans that moved the model).

The model is a single ``torch.nn.Parameter`` of ``numel`` float32 entries per method (no forward or
backward pass); its ``.grad`` is refilled before every step from a small pool of pre-drawn
standard-normal tensors (``pool`` of them, drawn once per rank from a per-rank seed), which costs a
copy instead of a fresh ``randn`` of ~12M entries. Unless the plan says ``"barrier": false``, every
step starts with a tiny allreduce (untimed) so that all ranks enter it together.

Two communication times per step: ``comm_ms`` is rank 0's (``last_stats``): it includes rank 0's
wait for the last rank to enter each collective, i.e. for a rank whose top-k ran late (2 cores, N
ranks), and, under AR-Topk STAR, for the root's selection when rank 0 is not the root.
``net_ms`` is the collectives' own cost: after the step (untimed) every rank's ``timings_ms`` are
allgathered and combined as the library combines them (``sync.combine_timings``: each
collective's minimum over ranks, since the last rank to enter a collective waits for nobody, and
for AR-Topk's index broadcast the time until the indices were delivered), then summed -- the
quantity Flexible's model predicts.

Hand-shake with the parent (files in ``DIR``; the parent runs in the root namespace and applies the
network with ``Emulator.set_link``): rank 0 writes ``ready.<i>`` and polls for ``go.<i>`` (the
parent writes it once network ``i`` is in force), then releases the other ranks with
``hvd.broadcast_object``. Rank 0 appends its results to ``DIR/results.jsonl`` (one JSON object per
line) and writes ``DIR/done`` at the end; it prints progress lines starting with ``[flexible_job]``.
"""

from __future__ import annotations

import gc
import os
import statistics
import sys
import time
from typing import Optional

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)

import horovod.torch as hvd  # noqa: E402
import torch  # noqa: E402

import hvd_flexcomm  # noqa: E402
from benchmarks.jobctl import (  # noqa: E402
    append_record,
    await_network,
    end_job,
    flexible_mode,
    job_plan,
)
from hvd_flexcomm.sync import combine_timings  # noqa: E402

TAG = "[flexible_job]"
METHODS = ("ag", "ar", "flex")
#: the baseline's replicate (plan "replicate"): AG-Topk and AR-Topk again, after Flexible
REPLICATES = ("ag2", "ar2")
#: a second Flexible (plan "ab_options": Flexible's options with these changed), right after the
#: first: the two variants of the router compared step by step in the same window
FLEX_B = "flexb"


class Job:
    def __init__(self, ctl: str, plan: dict) -> None:
        self.ctl = ctl
        self.plan = plan
        self.rank, self.size = hvd.rank(), hvd.size()
        self.numel = int(plan["numel"])
        self.t0 = time.perf_counter()
        gen = torch.Generator().manual_seed(1000 + self.rank)
        self.pool = [torch.randn(self.numel, generator=gen) for _ in range(int(plan.get("pool", 2)))]
        self.n_filled = 0
        self.barrier_buf = torch.zeros(1)

    # -- hand-shake with the parent ------------------------------------------------------------
    def wait_for_network(self, i: int, timeout_s: float = 600.0) -> dict:
        """Every rank returns only after the parent has put network ``i`` in force."""
        spec = await_network(self.ctl, i, timeout_s) if self.rank == 0 else None
        return hvd.broadcast_object(spec, root_rank=0, name=f"flexible_job.go.{i}")

    def emit(self, record: dict) -> None:
        if self.rank == 0:
            append_record(self.ctl, record)

    def say(self, text: str) -> None:
        if self.rank == 0:
            print(f"{TAG} {text} (elapsed {time.perf_counter() - self.t0:.0f} s)", flush=True)

    # -- one optimizer, one step ---------------------------------------------------------------
    def make(self, mode) -> tuple:
        param = torch.nn.Parameter(torch.zeros(self.numel))
        base = torch.optim.SGD([param], lr=1e-3)
        opt = hvd_flexcomm.DistributedOptimizer(base, named_parameters=[("w", param)],
                                                compression=mode)
        return param, opt

    def barrier(self) -> None:
        hvd.allreduce_(self.barrier_buf, op=hvd.Sum, name="flexible_job.barrier")

    def collective_ms(self, stats: dict) -> Optional[list[float]]:
        """Each of the step's collectives' own time (ms; ``[first, second, VAR]`` as in
        ``timings_ms``), combined over ranks as the library combines them
        (``sync.combine_timings``: the minimum, and a broadcast's delivered time; one untimed
        allgather); None without ``timings_ms``."""
        mine = stats.get("timings_ms")
        if mine is None:
            return None
        every = hvd.allgather(torch.tensor([mine], dtype=torch.float64), name="flexible_job.timings")
        return combine_timings(every).tolist()

    def step(self, param, opt) -> dict:
        """One synchronized step on fresh gradient values; rank 0's ``last_stats`` + wall ms."""
        if param.grad is None:
            param.grad = torch.empty_like(param)
        param.grad.copy_(self.pool[self.n_filled % len(self.pool)])
        self.n_filled += 1
        if self.plan.get("barrier", True):
            self.barrier()  # every rank enters the step together: times are the step's own
        t0 = time.perf_counter()
        opt.step()
        wall = 1e3 * (time.perf_counter() - t0)
        st = dict(opt.last_stats)
        per_collective = self.collective_ms(st)
        out = {"net_ms": None if per_collective is None else sum(per_collective),
               "collective_ms": per_collective, "collective": st.get("collective"),
               "comm_ms": st.get("comm_ms"),
               "compress_ms": st.get("compress_ms"), "wall_ms": wall, "k": st.get("k"),
               "bytes_sent": st.get("bytes_sent"), "skipped": st.get("skipped"),
               "root_rank": st.get("root_rank")}
        if "predicted_ms" in st:
            out["predicted_ms"] = st["predicted_ms"]
            out["probe_ms"] = st.get("probe_ms", 0.0)
            out["probe_kind"] = st.get("probe_kind")
            out["cold"], out["exploring"] = st.get("cold"), st.get("exploring")
            out["remeasure"] = st.get("remeasure")
            out["span"] = st.get("span")  # Adaptive's span steps (a few steps at a candidate's end)
        return out


def starting_up(opt, last: dict) -> bool:
    """True while Flexible's start-up calibration is still under way after the step whose record
    is ``last``: that step was cold (a path's first use) or exploring, or an exploration of the
    path not chosen is still due (``FlexibleController.explore_due`` / ``explore_left``)."""
    ctrl = getattr(opt, "_flex_controller", None)
    if ctrl is None:
        return False
    return bool(last.get("cold") or last.get("exploring") or ctrl.explore_due
                or ctrl.explore_left > 0)


def warm_up_flexible(job: Job, param, opt, warmup: int, settle_max: int) -> list[dict]:
    """Flexible's untimed steps: at least ``warmup``, then on until its start-up calibration is
    over (the start-up probe, the chosen path's first steps, the exploring steps: see
    :func:`starting_up`), at most ``settle_max`` more. Its timed steps are then its steady state;
    the start-up's cost is in these records (``probe_ms`` of the first, each step's ``net_ms``)
    and reported by the grid separately."""
    steps = [job.step(param, opt) for _ in range(warmup)]
    while settle_max > 0 and steps and starting_up(opt, steps[-1]):
        steps.append(job.step(param, opt))
        settle_max -= 1
    return steps


def run_grid(job: Job) -> None:
    plan = job.plan
    crs = [float(c) for c in plan["crs"]]
    networks = plan["networks"]
    warmup, steps = int(plan["warmup"]), int(plan["steps"])
    # "replicate": a second AG-Topk and AR-Topk optimizer ("ag2", "ar2"), interleaved with the
    # others: the baseline measured again in the same window, what a router that always ran the
    # better path would be judged by
    ab = plan.get("ab_options")
    methods = METHODS + ((FLEX_B,) if ab else ()) + (REPLICATES if plan.get("replicate") else ())
    flex_methods = {"flex": plan, FLEX_B: {**plan, "flex_options": {
        **(plan.get("flex_options") or {}), **(ab or {})}}}
    fixed_methods = [m for m in methods if m not in flex_methods]
    fixed = {}
    for cr in crs:  # AG/AR optimizers persist across networks (they have no network state)
        for m in fixed_methods:
            fixed[(m, cr)] = job.make(hvd_flexcomm.AGTopk(cr=cr) if m.startswith("ag")
                                      else hvd_flexcomm.ARTopk(cr=cr, selector="star"))
    total = int(plan.get("cell_total", len(networks) * len(crs)))
    done = int(plan.get("cell_offset", 0))
    for i, _ in enumerate(networks):
        net = job.wait_for_network(i)
        for cr in crs:
            t_cell = time.perf_counter()
            setups = {m: fixed[(m, cr)] for m in fixed_methods}
            warm = {m: [job.step(*setups[m]) for _ in range(warmup)] for m in fixed_methods}
            for m in methods:
                if m in flex_methods:
                    setups[m] = job.make(flexible_mode(flex_methods[m], cr))
                    warm[m] = warm_up_flexible(job, *setups[m], warmup,
                                               int(plan.get("settle_max", 6)))
            timed: dict = {m: [] for m in methods}
            for r in range(steps):
                order = methods if r % 2 == 0 else methods[::-1]
                for m in order:
                    timed[m].append(job.step(*setups[m]))
            flex_opt = setups["flex"][1]
            ctrl = getattr(flex_opt, "_flex_controller", None)
            record = {
                "kind": "cell", "network_index": i + int(plan.get("network_offset", 0)),
                "network": net, "N": job.size, "cr": cr,
                "numel": job.numel, "warmup": warm, "timed": timed,
                "flex_switches": getattr(ctrl, "n_switches", None),
                "flex_full_probes": getattr(ctrl, "n_full_probes", None),
                "flex_drift_probes": getattr(ctrl, "n_drift_probes", None),
                "flex_drift_steps": getattr(ctrl, "n_drift_steps", None),
                "flex_refresh_steps": getattr(ctrl, "n_refresh_steps", None),
                "flex_recheck_steps": getattr(ctrl, "n_recheck_steps", None),
                "flex_held_switches": getattr(ctrl, "n_held_switches", None),
                "flex_hysteresis": getattr(getattr(ctrl, "mode", None), "hysteresis", None),
                "cell_s": time.perf_counter() - t_cell,
            }
            if FLEX_B in setups:
                ctrl_b = setups[FLEX_B][1]._flex_controller
                record.update(flexb_switches=ctrl_b.n_switches,
                              flexb_held_switches=ctrl_b.n_held_switches)
                del ctrl_b
            job.emit(record)
            del setups, flex_opt, ctrl
            gc.collect()
            done += 1
            ag = statistics.median(s["net_ms"] for s in timed["ag"])
            ar = statistics.median(s["net_ms"] for s in timed["ar"])
            fl = statistics.median(s["net_ms"] for s in timed["flex"])
            job.say(f"cell {done}/{total}: N={job.size} {net.get('label')} cr={cr:g}: AG {ag:.1f} ms, "
                    f"AR {ar:.1f} ms, Flexible {fl:.1f} ms ({timed['flex'][-1]['collective']})")


def run_probe_bias(job: Job) -> None:
    """For each network and CR: ``rounds`` times, a probe of the three collective kinds at the
    sizes the steps send (``repeats`` timings each, ``probing.run_probes``), then ``steps``
    AG-Topk and ``steps`` AR-Topk steps, interleaved. One record per cell with every probe
    timing and every step's per-collective times combined over ranks (``Job.collective_ms``,
    as Flexible learns them): what a start-up probe predicts
    against what the steps take, collective by collective."""
    from hvd_flexcomm.flexible import FlexibleController
    from hvd_flexcomm.probing import run_probes

    plan = job.plan
    rounds, steps, repeats = int(plan["rounds"]), int(plan["steps"]), int(plan["repeats"])
    warmed: set = set()
    for i, _ in enumerate(plan["networks"]):
        net = job.wait_for_network(i)
        for cr in [float(c) for c in plan["crs"]]:
            ag = job.make(hvd_flexcomm.AGTopk(cr=cr))
            ar = job.make(hvd_flexcomm.ARTopk(cr=cr, selector="star"))
            ctrl = FlexibleController(hvd_flexcomm.Flexible(cr=cr), job.size, job.numel, 4, 4)
            sizes = ctrl.payload_bytes(hvd_flexcomm.k_for(cr, job.numel))
            for setup in (ag, ar, ag, ar):  # the step names are warm before anything is timed
                job.step(*setup)
            probes, ag_steps, ar_steps = [], [], []
            for _ in range(rounds):
                probes += run_probes(hvd, [(kind, sizes[kind]) for kind in
                                           ("allgather", "broadcast", "allreduce")],
                                     repeats, tag="bias", warmed=warmed)
                for _ in range(steps):
                    for setup, out in ((ag, ag_steps), (ar, ar_steps)):
                        out.append(job.step(*setup)["collective_ms"])
            job.emit({"kind": "probe_bias", "network": net, "N": job.size, "cr": cr,
                      "sizes": sizes, "probes": probes, "ag_steps": ag_steps,
                      "ar_steps": ar_steps})
            job.say(f"probe bias: {net.get('label')} cr={cr:g} done")


def run_probe_phases(job: Job) -> None:
    """For each network, ``rounds`` start-up probes of Adaptive, each under new names (a job's
    first probe negotiates every name: the warm-up round runs in full), with as many extra
    numbers in the timings' row as Adaptive's first pick sends (each candidate's gain and the
    time outside communication). One record per round: rank 0's ms per phase
    (``probing.PHASES``) and in all, and every timing combined over ranks."""
    from hvd_flexcomm.flexible import FlexibleController
    from hvd_flexcomm.probing import run_probes_sharing

    plan = job.plan
    mode = hvd_flexcomm.Adaptive(**plan.get("adaptive_options", {}))
    ctrl = FlexibleController(mode, job.size, job.numel, 4, 4)
    ctrl.probe_crs = tuple(mode.candidates) + (mode.c_low, mode.c_high)  # as the optimizer
    probe, repeats, _ = ctrl.probe_plan(0, mode.cr)
    extra = [0.0] * (len(mode.candidates) + 1)
    for i, _ in enumerate(plan["networks"]):
        net = job.wait_for_network(i)
        for r in range(int(plan["rounds"])):
            hvd.allreduce(torch.zeros(1), name=f"flexible_job.phases.{i}.{r}")  # enter together
            phases: dict = {}
            t0 = time.perf_counter()
            results, _ = run_probes_sharing(hvd, probe, repeats, extra, tag=f"phases.{i}.{r}",
                                            warmed=set(), phases_ms=phases)
            total_ms = 1e3 * (time.perf_counter() - t0)
            job.emit({"kind": "probe_phases", "network": net, "N": job.size, "round": r,
                      "plan": probe, "total_ms": total_ms, "phases_ms": phases,
                      "timings": results})
            job.say(f"probe phases: {net.get('label')} round {r + 1}: {total_ms:.0f} ms ("
                    + ", ".join(f"{k} {v:.0f}" for k, v in phases.items()) + ")")


def _solves(opt) -> list[dict]:
    """Adaptive's finished solves on rank 0 (step, reason, inputs including the time outside
    communication the time objective was normalised by, solved CR); [] otherwise."""
    ada = getattr(opt, "_flex_adaptive", None)
    if ada is None:
        return []
    keep = ("step", "reason", "crs", "comm_ms", "paths", "gains", "other_ms", "cr")
    return [{k: s[k] for k in keep} for s in ada.solves if s["end"] is not None]


def run_change(job: Job) -> None:
    plan = job.plan
    cr = float(plan["cr"])
    steps = int(plan["steps"])
    changes = {int(s): int(i) for s, i in plan["changes"]}
    param, opt = job.make(flexible_mode(plan, cr))
    net = None
    for s in range(steps):
        if s in changes:
            net = job.wait_for_network(changes[s])
            job.say(f"step {s}: network {net.get('label')} in force")
        rec = job.step(param, opt)
        rec.update({"kind": "step", "step": s, "network": net, "cr": opt.last_stats.get("cr")})
        job.emit(rec)
        if job.rank == 0 and (s % 10 == 0 or s == steps - 1):
            pred = rec.get("predicted_ms") or {}
            ag, ar = pred.get("allgather", float("nan")), pred.get("allreduce", float("nan"))
            job.say(f"step {s + 1}/{steps}: {rec['collective']} at cr {rec['cr']:g} "
                    f"{rec['comm_ms']:.1f} ms (predicted AG {ag:.1f}, AR {ar:.1f})")
    solves = _solves(opt)
    if solves:
        job.emit({"kind": "solves", "solves": solves})
    ctrl = getattr(opt, "_flex_controller", None)
    if ctrl is not None:  # the counters a run's report names (shared state: rank 0 = any rank)
        job.emit({"kind": "controller", "n_drift_probes": ctrl.n_drift_probes,
                  "n_drift_unconfirmed": ctrl.n_drift_unconfirmed,
                  "n_full_probes": ctrl.n_full_probes, "n_span_moves": ctrl.n_span_moves})


def main() -> int:
    ctl, plan = job_plan(__doc__.splitlines()[0])
    torch.set_num_threads(1)
    hvd.init()
    job = Job(ctl, plan)
    job.say(f"{job.size} ranks, {job.numel} elements, plan {plan['kind']}")
    if plan["kind"] == "grid":
        run_grid(job)
    elif plan["kind"] == "change":
        run_change(job)
    elif plan["kind"] == "probe_bias":
        run_probe_bias(job)
    elif plan["kind"] == "probe_phases":
        run_probe_phases(job)
    else:
        raise ValueError(f"unknown plan kind {plan['kind']!r}")
    return end_job(hvd, ctl, job.say)


if __name__ == "__main__":
    sys.exit(main())
