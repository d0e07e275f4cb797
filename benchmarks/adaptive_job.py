"""The worker of ``bench_adaptive.py``: runs on every rank under ``horovodrun`` (one job, every
method in turn, on the same emulated network).

    adaptive_job.py --ctl DIR

``DIR/plan.json`` (written by the parent, read by every rank) says what to train: the model, the
optimiser settings, the methods (in order; the first is Dense unless the plan gives a ``target``),
the budget rules, the evaluation interval. For each method, on every rank:

- a fresh model from the same seed (identical initial weights for every method), SGD with
  momentum (``lr`` per rank, scaled by the number of ranks, as Horovod's examples), wrapped by
  ``hvd_flexcomm.DistributedOptimizer(compression=...)``;
- batches of ``batch_size`` per rank from :func:`hvd_flexcomm.data.shard` (a new permutation per
  epoch; epochs repeat as long as the budget lasts);
- the **training clock** (rank 0's ``perf_counter``) runs from the start of each step's forward
  pass to the end of its ``opt.step()``: it includes computation, compression, communication,
  probing and waiting for slower ranks, and excludes evaluation and bookkeeping;
- every ``eval_every`` steps (and at step 0 and at the end) the test accuracy on the whole 10 000
  test images (each rank scores every N-th image, one allreduce sums the counts). The same
  allreduce carries rank 0's stop flag, so every rank stops at the same step.

Budget: the first method (Dense) runs ``dense_steps`` steps; its final accuracy ``A`` sets the
target ``A - target_drop`` and its training clock ``T_D`` the others' budget: each stops at the
first evaluation where its clock has reached ``time_factor * T_D`` or at ``step_factor *
dense_steps`` steps, whichever comes first.

Network change (``change_at_train_s`` in the plan): after the first step at which rank 0's
training clock has reached it, rank 0 asks the driver for the plan's second network
(``jobctl.request_network``) and training goes on: the driver switches the links within its
polling interval (50 ms), while the ranks train, as a real network would change under a job. Once
per method; the method's record says at which step and clock it was asked for, and when the
driver applied it.

Rank 0 appends one JSON object per method to ``DIR/results.jsonl`` (evaluations, per-step CR,
collective and timings, summaries), writes ``DIR/done`` at the end, and prints progress lines that
start with ``[adaptive_job]``.
"""

from __future__ import annotations

import gc
import os
import sys
import time
from typing import Any, Optional

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)

import horovod.torch as hvd  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import hvd_flexcomm  # noqa: E402
from benchmarks.jobctl import (  # noqa: E402
    append_record,
    applied_network,
    end_job,
    job_plan,
    request_network,
)
from hvd_flexcomm.data import load_fashion_mnist, shard  # noqa: E402
from hvd_flexcomm.models import MLP, LeNet5, count_parameters  # noqa: E402

TAG = "[adaptive_job]"


def build_model(spec: dict) -> torch.nn.Module:
    if spec["kind"] == "mlp":
        return MLP(hidden=int(spec["hidden"]), depth=int(spec["depth"]))
    if spec["kind"] == "lenet5":
        return LeNet5(width=int(spec["width"]))
    raise ValueError(f"unknown model kind {spec['kind']!r}")


def make_mode(method: dict) -> Any:
    """The ``compression=`` argument of a method of the plan."""
    kind = method["kind"]
    opts = dict(method.get("options", {}))
    if kind == "dense":
        return hvd_flexcomm.Dense()
    if kind == "ag":
        return hvd_flexcomm.AGTopk(cr=method["cr"], **opts)
    if kind == "ar":
        return hvd_flexcomm.ARTopk(cr=method["cr"], **opts)
    if kind == "flexible":
        return hvd_flexcomm.Flexible(cr=method["cr"], **opts)
    if kind == "adaptive":
        if "candidates" in opts:
            opts["candidates"] = tuple(opts["candidates"])
        if "weights" in opts:
            opts["weights"] = tuple(opts["weights"])
        return hvd_flexcomm.Adaptive(**opts)
    raise ValueError(f"unknown method kind {kind!r}")


class Job:
    def __init__(self, ctl: str, plan: dict) -> None:
        self.ctl = ctl
        self.plan = plan
        self.rank, self.size = hvd.rank(), hvd.size()
        self.t0 = time.perf_counter()
        self.data = load_fashion_mnist()
        self.n_train = int(plan.get("train_size") or self.data.train_x.shape[0])
        self.test_idx = torch.arange(self.rank, self.data.test_x.shape[0], self.size)

    def say(self, text: str) -> None:
        if self.rank == 0:
            print(f"{TAG} {text} (elapsed {time.perf_counter() - self.t0:.0f} s)", flush=True)

    def emit(self, record: dict) -> None:
        if self.rank == 0:
            append_record(self.ctl, record)

    def evaluate(self, model: torch.nn.Module, stop: bool, name: str) -> tuple[float, bool]:
        """Test accuracy (fraction, all 10 000 images) and rank 0's stop flag, on every rank."""
        model.eval()
        correct = 0
        x, y = self.data.test_x, self.data.test_y
        with torch.no_grad():
            for chunk in self.test_idx.split(2500):
                correct += int((model(x[chunk]).argmax(1) == y[chunk]).sum())
        model.train()
        flag = 1.0 if (self.rank == 0 and stop) else 0.0
        totals = hvd.allreduce(torch.tensor([float(correct), float(self.test_idx.numel()), flag],
                                            dtype=torch.float64), op=hvd.Sum, name=name)
        return float(totals[0] / totals[1]), bool(totals[2] > 0)

    def run_method(self, index: int, method: dict, max_steps: int,
                   time_budget_s: Optional[float], target: Optional[float]) -> dict:
        plan = self.plan
        seed = int(plan["seed"])
        torch.manual_seed(seed)
        model = build_model(plan["model"])
        base = torch.optim.SGD(model.parameters(), lr=float(plan["lr"]) * self.size,
                               momentum=float(plan["momentum"]))
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        mode = make_mode(method)
        opt = hvd_flexcomm.DistributedOptimizer(base, named_parameters=model.named_parameters(),
                                                compression=mode)
        name = method["name"]
        bs = int(plan["batch_size"])
        eval_every = int(plan["eval_every"])
        x, y = self.data.train_x, self.data.train_y
        per_step: dict[str, list] = {"ms": [], "cr": [], "collective": [], "comm_ms": [],
                                     "compress_ms": [], "probe_ms": [], "span": []}
        own_ms: list[float] = []  # this rank's step time outside its collectives and probes
        probes: list[dict] = []  # rank 0's probes: step, kind, ms and ms per phase
        acc0, _ = self.evaluate(model, False, f"eval.{index}.0")
        change_at_s = plan.get("change_at_train_s")  # the network changes once, at this clock
        network_change: Optional[dict] = None  # rank 0: the step at which it asked for it
        evals = [{"step": 0, "train_s": 0.0, "accuracy": acc0, "loss": None}]
        self.say(f"method {index + 1}/{len(plan['methods'])}: {name} ({mode.describe()}), "
                 f"up to {max_steps} steps"
                 + (f" or {time_budget_s:.1f} s of training" if time_budget_s else "")
                 + (f", target {100 * target:.2f}%" if target is not None else ""))
        train_s = 0.0
        step = 0
        epoch = 0
        loss_sum, loss_n = 0.0, 0
        eval_s = 0.0
        stop = False
        wall0 = time.perf_counter()
        while not stop:
            mine = shard(self.n_train, self.rank, self.size, seed, epoch)
            epoch += 1
            for batch in mine.split(bs):
                if batch.numel() < bs:
                    break  # same number of steps on every rank
                t0 = time.perf_counter()
                opt.zero_grad()
                loss = F.cross_entropy(model(x[batch]), y[batch])
                loss.backward()
                opt.step()
                dt = time.perf_counter() - t0
                train_s += dt
                step += 1
                st = opt.last_stats or {}
                per_step["ms"].append(round(1e3 * dt, 3))
                per_step["cr"].append(st.get("cr"))
                per_step["collective"].append(st.get("collective"))
                per_step["comm_ms"].append(_r(st.get("comm_ms")))
                per_step["compress_ms"].append(_r(st.get("compress_ms")))
                per_step["probe_ms"].append(_r(st.get("probe_ms", 0.0)))
                per_step["span"].append(bool(st.get("span", False)))
                if st.get("probe_phases_ms") is not None:
                    probes.append({"step": step - 1, "kind": st.get("probe_kind"),
                                   "ms": _r(st.get("probe_ms")),
                                   "phases_ms": {phase: _r(ms) for phase, ms
                                                 in st["probe_phases_ms"].items()}})
                own_ms.append(round(1e3 * dt - (st.get("comm_ms") or 0.0)
                                    - (st.get("probe_ms") or 0.0), 3))
                if (self.rank == 0 and change_at_s is not None and network_change is None
                        and train_s >= change_at_s):
                    request_network(self.ctl, 1)  # the driver switches the links meanwhile
                    network_change = {"step": step, "train_s": train_s}
                    self.say(f"{name}: network change asked for after step {step} "
                             f"({train_s:.1f} s of training)")
                loss_sum += float(loss.detach())
                loss_n += 1
                if step % eval_every == 0 or step >= max_steps:
                    te = time.perf_counter()
                    want_stop = step >= max_steps or (time_budget_s is not None
                                                      and train_s >= time_budget_s)
                    acc, stop = self.evaluate(model, want_stop, f"eval.{index}.{step}")
                    stop = stop or step >= max_steps
                    evals.append({"step": step, "train_s": train_s, "accuracy": acc,
                                  "loss": loss_sum / max(loss_n, 1)})
                    loss_sum, loss_n = 0.0, 0
                    self.say(f"{name}: step {step} train {train_s:.1f} s acc {100 * acc:.2f}% "
                             f"cr {st.get('cr', 1.0):.4g} {st.get('collective')} "
                             f"step {1e3 * train_s / step:.0f} ms")
                    eval_s += time.perf_counter() - te
                    if stop:
                        break
        wall_s = time.perf_counter() - wall0
        if network_change is not None:  # None: not applied before the method ended
            network_change["network"] = applied_network(self.ctl, 1)
        # every rank's own time per step (outside collectives): at a step where rank 0 waited long
        # in a collective, the rank with a long own time is the one it waited for
        own_by_rank = hvd.allgather_object(own_ms, name=f"own.{index}")
        record = {"kind": "method", "index": index, "method": method, "describe": mode.describe(),
                  "steps": step, "epochs_started": epoch, "train_s": train_s, "wall_s": wall_s,
                  "eval_s": eval_s, "max_steps": max_steps, "time_budget_s": time_budget_s,
                  "final_accuracy": evals[-1]["accuracy"], "evals": evals, "per_step": per_step,
                  "own_ms_by_rank": own_by_rank, "N": self.size, "network_change": network_change}
        ctrl = getattr(opt, "_flex_controller", None)
        if ctrl is not None:
            record["flexible"] = {"n_switches": ctrl.n_switches, "n_full_probes": ctrl.n_full_probes,
                                  "n_drift_probes": ctrl.n_drift_probes,
                                  "n_drift_unconfirmed": ctrl.n_drift_unconfirmed,
                                  "n_refreshes": ctrl.n_refreshes,
                                  "probe_ms_total": ctrl.probe_ms_total,
                                  "n_span_steps": ctrl.n_span_steps,
                                  "n_span_moves": ctrl.n_span_moves,
                                  "n_span_confirms": ctrl.n_span_confirms,
                                  "n_span_offs": ctrl.n_span_offs,
                                  "n_step_starts": ctrl.n_step_starts, "probes": probes}
        ada = getattr(opt, "_flex_adaptive", None)
        if ada is not None:
            res = ada.last_result
            record["adaptive"] = {
                "channel": ada.channel, "changes": [list(c) for c in ada.changes],
                "announcements": ada.n_announcements, "kept": ada.n_kept,
                "solves": [{"step": s["step"], "reason": s["reason"],
                            "seconds": None if s["end"] is None else s["end"] - s["start"],
                            "comm_ms": s["comm_ms"], "paths": s.get("paths"),
                            "compress_ms": s.get("compress_ms"),
                            "gains": s["gains"],
                            "other_ms": s["other_ms"], "cr": s["cr"],
                            "current_cr": s.get("current_cr"),
                            "current_excess": s.get("current_excess")}
                           for s in ada.solves],
                "failed": ada.failed, "last_result": None if res is None else res.explain(),
                "gains": ada.tracker.to_dict()}
            ada.close()
        self.emit(record)
        del opt, base, model
        gc.collect()
        return record


def _r(v: Any) -> Any:
    return None if v is None else round(float(v), 3)


def main() -> int:
    ctl, plan = job_plan(__doc__.splitlines()[0])
    torch.set_num_threads(1)
    hvd.init()
    job = Job(ctl, plan)
    params = count_parameters(build_model(plan["model"]))
    job.say(f"{job.size} ranks, model {plan['model']} ({params} parameters), "
            f"{len(plan['methods'])} methods")
    target = plan.get("target")
    dense_steps = int(plan["dense_steps"])
    time_budget = plan.get("time_budget_s")
    for i, method in enumerate(plan["methods"]):
        if i == 0 and target is None:
            rec = job.run_method(i, method, dense_steps, None, None)
            target = rec["final_accuracy"] - float(plan["target_drop"])
            if time_budget is None and float(plan["time_factor"]) > 0:
                time_budget = float(plan["time_factor"]) * rec["train_s"]  # rank 0's clock
            job.emit({"kind": "target", "reference": method["name"],
                      "reference_accuracy": rec["final_accuracy"], "target": target,
                      "reference_train_s": rec["train_s"], "time_budget_s": time_budget})
            continue
        max_steps = int(round(float(plan["step_factor"]) * dense_steps))
        job.run_method(i, method, max_steps, time_budget, target)
    return end_job(hvd, ctl, job.say)


if __name__ == "__main__":
    sys.exit(main())
