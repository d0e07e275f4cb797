"""Acceptance benchmark of ``Adaptive``: time to reach Dense accuracy - 1 point on Fashion-MNIST over
an emulated constrained network (root only).

    python benchmarks/bench_adaptive.py --quick      # < 3 min smoke run: N=2, small MLP, 4 methods
    python benchmarks/bench_adaptive.py              # N=4, 100 Mbit/s, 5 ms, 7 methods: ~25 min
    python benchmarks/bench_adaptive.py --n 2 --rate-mbit 50 --delay-ms 10 --methods dense adaptive
    python benchmarks/bench_adaptive.py --methods dense ar:0.1 adaptive adaptive:150   # warm-up 150
    python benchmarks/bench_adaptive.py --render results/adaptive/adaptive.json   # tables/plots only
    python benchmarks/bench_adaptive.py --seeds 42 43 44 --methods dense ag:0.01 adaptive:0
    python benchmarks/bench_adaptive.py --launcher mpirun ...   # Open MPI instead of Gloo
    python benchmarks/bench_adaptive.py --delay-ms 0.1 --rate-mbit 1000 \
        --change-at-s 15 --change-to 5 100     # 1 Gbit/s, 0.1 ms, then 100 Mbit/s, 5 ms

Setting: N ranks (``--n``, default 4), one per network namespace of the emulator
(``hvd_flexcomm.netem``), every link ``--delay-ms`` one way (default 5) and ``--rate-mbit``
(default 100); each method trains in its own ``horovodrun --gloo`` job (``adaptive_job.py``) on a
fresh emulator, so that no method inherits TCP state (a congestion window cut by losses) from the
ones before it (``--no-job-per-method``: one job trains every method in turn).
``--change-at-s T --change-to DELAY_MS RATE_MBIT``: the network changes once in every method's job
(Dense's too), after the first step that ends at ``T`` s of its training clock or later: rank 0
asks, the driver switches the links within 50 ms while training goes on (no pause, no
synchronisation: as a real network changes under a job); the table says where each method met it
and the plots mark it. ``--launcher mpirun``: the jobs run under Open MPI's
``mpirun`` over TCP instead (Horovod's MPI controller, and Adaptive announces its CRs with mpi4py).
Model: ``MLP(hidden=768, depth=2)`` = 784-768-768-10, **1,201,162 parameters** (4.8 MB of float32
gradient per step: a dense ring allreduce moves ~7 MB per rank at N=4, ~0.6 s at 100 Mbit/s). SGD,
momentum 0.9, lr 0.01 per rank (x N), batch 64 per rank, the 60 000 training images; accuracy on
the 10 000 test images.

Procedure:

1. Dense (``hvd_flexcomm.Dense()``, i.e. Horovod's own allreduce path) trains ``--dense-steps``
   steps (default 160, 0.68 epoch at N=4); its final test accuracy ``A`` gives the target
   ``A - 1 point`` and its training clock ``T_D`` the budget of the others;
2. every other method trains from the same initial weights until its training clock reaches
   ``--time-factor x T_D`` (default 1.0) or ``--step-factor x`` Dense's steps (default 3),
   whichever comes first; the check happens at evaluations (so a run can overshoot by up to
   ``--eval-every`` steps);
3. the test accuracy is measured every ``--eval-every`` steps (default 20) and at the end;
   evaluation time is **excluded** from the training clock, which runs on rank 0 from each step's
   forward pass to the end of its ``opt.step()`` (computation, compression, probes, communication
   and waiting for slower ranks). Time to target = the training clock at the first evaluation
   whose accuracy is >= the target (resolved to ``--eval-every`` steps).

Methods (``--methods``): ``dense``, ``ag:CR`` (``AGTopk``), ``ar:CR`` (``ARTopk``, STAR),
``flexible:CR`` (``Flexible``), ``adaptive`` (``Adaptive`` with its defaults -- CR 0.1 right after
warm-up, candidates 0.1..0.001, ``[c_low, c_high] = [0.001, 0.1]``, weights (0.6, 0.4), STAR --
plus ``warmup_steps=--warmup-steps``, default 50: the CR falls linearly from 1.0 to 0.1 over the
first 50 steps, in blocks of 10), ``adaptive:W`` (the same with a warm-up of W steps),
``adaptive-step[:W]`` and ``adaptive-front[:W]`` (the same with ``time_scale="step"`` or
``"front"``: an ASF pick, with the time objective normalised by the dearest step or, as the
paper, by the front's span, instead of the default ``"tta"``, the pick that minimises
``step_time^0.6 · (1/gain)^0.4``), ``adaptive-tta[:W]`` (``"tta"`` named explicitly). Any
Adaptive variant may end in ``,OPTION=VALUE`` items, ``Adaptive``'s options (e.g.
``adaptive:0,span_settle_steps=4``), to run a second Adaptive beside the first; the seed summary
then compares each Adaptive with every other method, the other Adaptive included. Default:
Dense, AG-Topk 0.1 / 0.01, AR-Topk 0.1 / 0.01, Flexible 0.01, Adaptive.

Targets (reported, not asserted): Adaptive reaches the target in less training time than every
fixed-CR run (AG/AR/Flexible) and Dense; its final accuracy is never more than 1 point below Dense's.

``--quick``: N=2, ``MLP(hidden=256)`` (269,322 parameters), Dense 20 steps, the others 40 steps (no
time budget), evaluation every 10 steps, Dense / AR-Topk 0.01 / Flexible 0.01 / Adaptive with a
10-step warm-up: a smoke test of the whole pipeline, its numbers mean little.

``--seeds S1 S2 ...``: the whole procedure once per seed (initial weights and data order; each
seed has its own Dense run, target and budget), each under ``--out``/``seed<S>/``, then
``seeds.md`` / ``seeds.json`` / ``seeds_tta.png`` under ``--out``: every method's time to target
per seed, its median over seeds (a method that missed the target counts as slower than any that
reached it), and the targets judged on the medians and seed by seed. Test accuracy swings by
several points between evaluations at this learning rate, so one seed's times to target carry
noise of the order of the differences between methods. The summary also compares Adaptive with
each method seed by seed (in how many seeds it was faster, the median per-seed ratio, and a
two-sided sign test: 5 of 5 seeds gives p = 0.062, so at least 6 seeds are needed to show a
difference at p < 0.05). ``--render-seeds DIR1 DIR2 ... --out O`` pools the seeds of several
``--seeds`` runs with the same settings (refused, naming them, when settings differ or a seed
repeats) into one summary under ``O``, e.g. a run of seeds 47-51 with an earlier one of 42-46;
``--pool-methods NAME NAME=SOURCE ...`` keeps only those methods and takes a run's ``SOURCE`` as
``NAME`` where it has one (arms of two A/B runs that ran the same code under different names).

Writes ``adaptive.json`` (everything, including every step's CR, collective and timings),
``adaptive.md`` (the table), ``accuracy_vs_time.png`` (accuracy vs training time, every method)
and ``adaptive_cr.png`` (Adaptive's CR and collective per step, Flexible's for comparison) under
``--out`` (default ``results/adaptive/``), plus ``job-<i>.log`` (method i's job output; ``job.log``
with ``--no-job-per-method``). The machine has 2
cores shared with other jobs: N=4 ranks oversubscribe it and the collectives wait for the slowest
rank, so step times carry noise; the load average at start and end is recorded.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections import Counter
from typing import Any, Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from benchmarks.jobctl import (  # noqa: E402
    KEEP_FREED_MEMORY_ENV,
    check_mode_options,
    control_dir,
    follow_job,
    link_of,
    network,
    options_text,
    parse_option,
    parse_rate,
    read_records,
    start_in_emulator,
    stop,
)
from hvd_flexcomm.netem.emulator import LAUNCHERS  # noqa: E402
from hvd_flexcomm.waiting import WAIT_ENV  # noqa: E402

JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "adaptive_job.py")
TAG = "[adaptive_job]"

DEFAULT_METHODS = ["dense", "ag:0.1", "ag:0.01", "ar:0.1", "ar:0.01", "flexible:0.01", "adaptive"]
QUICK_METHODS = ["dense", "ar:0.01", "flexible:0.01", "adaptive"]
MODEL = {"kind": "mlp", "hidden": 768, "depth": 2}
QUICK_HIDDEN = 256  # --quick: 269,322 parameters
DEFAULT_DENSE_STEPS = 160  # 0.68 epoch at N=4
DEFAULT_WARMUP = 50
QUICK_DENSE_STEPS = 20
QUICK_WARMUP = 10
TRAIN_IMAGES = 60_000


#: ``--methods`` names of Adaptive's variants: (display name, options beyond the warm-up)
ADAPTIVE_VARIANTS = {
    "adaptive": ("Adaptive", {}),
    "adaptive-step": ("Adaptive (step-normalised ASF)", {"time_scale": "step"}),
    "adaptive-front": ("Adaptive (front-normalised)", {"time_scale": "front"}),
    "adaptive-tta": ("Adaptive (time-to-accuracy pick)", {"time_scale": "tta"}),
}


def split_method_items(text: str) -> list[str]:
    """``text`` split at the commas outside brackets: ``adaptive:0,weights=[0.75,0.25]`` ->
    ``["adaptive:0", "weights=[0.75,0.25]"]``. A ValueError names unbalanced brackets. Pure
    function."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += (ch in "[(") - (ch in "])")
        if depth < 0:
            break
        if ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    if depth != 0:
        raise ValueError(f"bad method {text!r}: unbalanced brackets")
    return items + [text[start:]]


def parse_method(text: str, warmup_steps: int) -> dict[str, Any]:
    """``dense`` / ``ag:CR`` / ``ar:CR`` / ``flexible:CR`` / ``adaptive[:W]`` /
    ``adaptive-step[:W]`` / ``adaptive-front[:W]`` / ``adaptive-tta[:W]`` -> a plan entry. An
    Adaptive variant may end in ``,OPTION=VALUE`` items (``Adaptive``'s options, e.g.
    ``adaptive:0,span_settle_steps=4``): a second Adaptive beside the first in the same run,
    named after them; a list value in brackets, e.g. ``weights=[0.75,0.25]``. A ValueError
    names a bad method or option."""
    head, *extra = split_method_items(text)
    kind, _, arg = head.lower().partition(":")
    if extra and kind not in ADAPTIVE_VARIANTS:
        raise ValueError(f"bad method {text!r}: ',OPTION=VALUE' items apply to Adaptive only")
    if kind == "dense":
        return {"name": "Dense", "kind": "dense", "cr": 1.0}
    if kind in ADAPTIVE_VARIANTS:  # ":W": a warm-up of W steps instead of the default
        name, options = ADAPTIVE_VARIANTS[kind]
        if arg:
            warmup_steps = int(arg)
            name = f"{name} (warm-up {warmup_steps})"
        chosen = dict(parse_option(item) for item in extra)
        if chosen:
            name = f"{name} ({options_text(chosen, ', ')})"
        options = {"warmup_steps": warmup_steps, **options, **chosen}
        from hvd_flexcomm import Adaptive

        check_mode_options(Adaptive, options, f"bad method {text!r}")
        return {"name": name, "kind": "adaptive", "cr": None, "options": options}
    if kind not in ("ag", "ar", "flexible") or not arg:
        raise ValueError(f"bad method {text!r}: use dense, ag:CR, ar:CR, flexible:CR or one of "
                         f"{', '.join(ADAPTIVE_VARIANTS)}")
    cr = float(arg)
    if not 0 < cr <= 1:
        raise ValueError(f"bad CR in {text!r}")
    if kind == "ag":
        return {"name": f"AG-Topk {cr:g}", "kind": "ag", "cr": cr}
    if kind == "ar":
        return {"name": f"AR-Topk {cr:g}", "kind": "ar", "cr": cr, "options": {"selector": "star"}}
    return {"name": f"Flexible {cr:g}", "kind": "flexible", "cr": cr}


def adaptive_defaults() -> dict[str, Any]:
    """The Adaptive options the benchmark relies on (its defaults), recorded in the JSON."""
    from hvd_flexcomm import Adaptive

    a = Adaptive()
    return {"cr": a.cr, "c_low": a.c_low, "c_high": a.c_high, "candidates": list(a.candidates),
            "weights": list(a.weights), "gain_every": a.gain_every, "sync_every": a.sync_every,
            "min_interval": a.min_interval, "gain_threshold": a.gain_threshold,
            "selector": a.selector, "min_cr_change": a.min_cr_change, "time_scale": a.time_scale}


# -- running the job ------------------------------------------------------------------------------


def run_job(n: int, networks: list[dict[str, Any]], plan: dict[str, Any], timeout_s: float,
            log_path: str, check_link: bool) -> tuple[list[dict], dict, Optional[str]]:
    """Run ``adaptive_job.py`` on ``n`` emulated hosts, starting on ``networks[0]`` (the job
    asks for ``networks[1]`` when the plan's network change is due); (records, link check of the
    first network, error or None)."""
    from hvd_flexcomm.netem import Emulator

    link: dict[str, Any] = {}
    with control_dir("hfc-adaptive-", plan) as ctl:
        with Emulator(n_hosts=n, link=link_of(networks[0])) as emu:
            link["rtt_ms"] = emu.measure_rtt_ms(0, 1)
            if check_link:
                link["throughput_mbit"] = emu.measure_throughput_mbit(0, 1, seconds=1.0)
            print(f"[bench_adaptive] emulated link: RTT {link['rtt_ms']:.2f} ms"
                  + (f", TCP {link['throughput_mbit']:.1f} Mbit/s" if check_link else ""), flush=True)
            steal_before = cpu_steal_s()
            proc = start_in_emulator(emu, n, JOB, ctl, log_path,
                                     launcher=plan.get("launcher", "horovodrun"))
            try:
                error = follow_job(proc, ctl, log_path, timeout_s, TAG, emu, networks, first=1,
                                   on_line=lambda line: print(line, flush=True), poll_s=0.05)
            finally:
                stop(proc)
            network = network_counters(emu)
            network["cpu_steal_s"] = cpu_steal_s() - steal_before
        records = read_records(ctl)
        for rec in records:
            if rec.get("kind") == "method":
                rec["network"] = network
        return records, link, error


def cpu_steal_s() -> float:
    """CPU seconds, summed over this virtual machine's CPUs, that the hypervisor gave to others
    since boot (``steal`` in ``/proc/stat``; 0 where unreadable): ranks stall while it grows."""
    try:
        with open("/proc/stat") as fh:
            fields = fh.readline().split()
        return int(fields[8]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def network_counters(emu: Any) -> dict[str, Any]:
    """What the emulated network did during a job, summed over hosts: TCP retransmissions and
    retransmission timeouts, packets the kernel dropped before the relay read them, and the
    relay's own drops and mean lateness (us) of delayed packets. Diagnostic: {} if unreadable."""
    try:
        hosts = emu.host_counters()
        relay = emu.relay_stats()
    except (RuntimeError, OSError, ValueError, subprocess.SubprocessError) as exc:
        print(f"[bench_adaptive] network counters unavailable: {exc}", flush=True)
        return {}
    out = {key: sum(h[key] for h in hosts) for key in hosts[0]} if hosts else {}
    for key in ("dropped_queue", "dropped_write", "forwarded_packets"):
        out[f"relay_{key}"] = relay.get(key, 0)
    released = relay.get("released", 0)
    out["relay_mean_late_us"] = relay.get("late_us_sum", 0.0) / released if released else 0.0
    out["relay_max_late_ms"] = relay.get("late_us_max", 0.0) / 1e3
    return out


def run_methods(n: int, networks: list[dict[str, Any]], plan: dict[str, Any],
                timeout_s: float, out: str, check_link: bool,
                job_per_method: bool) -> tuple[list[dict], dict, Optional[str]]:
    """Every method of ``plan`` (Dense first): in one job (``job.log``), or, with
    ``job_per_method``, each in its own job on a fresh emulator (``job-<i>.log``): Dense's job
    yields the target and time budget, which the plans of the later jobs carry. Fresh jobs give
    every method fresh TCP connections (no congestion state, e.g. a reduced window after losses,
    inherited from the methods before it) and the same start-up for all. Records are in method
    order, ``index`` = the method's position; (records, link check of the first job, errors)."""
    if not job_per_method:
        return run_job(n, networks, plan, timeout_s, os.path.join(out, "job.log"), check_link)
    methods = plan["methods"]
    records, link, error = run_job(n, networks, {**plan, "methods": methods[:1]},
                                   timeout_s, os.path.join(out, "job-1.log"), check_link)
    errors = [error] if error else []
    tgt = next((r for r in records if r.get("kind") == "target"), None)
    for i, method in enumerate(methods[1:], start=1):
        if tgt is None:
            break  # no Dense result: nothing to aim at
        more, _, error = run_job(n, networks,
                                 {**plan, "methods": [method], "target": tgt["target"],
                                  "time_budget_s": tgt["time_budget_s"]},
                                 timeout_s, os.path.join(out, f"job-{i + 1}.log"), False)
        for rec in more:
            rec["index"] = i
        records += more
        errors += [f"{method['name']}: {error}"] if error else []
    return records, link, "; ".join(errors) or None


# -- summaries ------------------------------------------------------------------------------------


def _mean(xs: list) -> Optional[float]:
    xs = [float(x) for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


STALL_FACTOR = 3.0


def stall_s(step_ms: list[float]) -> float:
    """Seconds that steps spent beyond ``STALL_FACTOR`` x the median step (0 for no steps): time
    lost to stalls (a TCP retransmission timeout, a starved process, a rank that waits for
    another). Callers pass step times without probing (reported on its own)."""
    if not step_ms:
        return 0.0
    limit = STALL_FACTOR * statistics.median(step_ms)
    return sum(ms - limit for ms in step_ms if ms > limit) / 1e3


def stall_ranks(rec: dict[str, Any], n_steps: int) -> dict[str, int]:
    """At each stalled step of the first ``n_steps`` (rank 0's time beyond ``STALL_FACTOR`` x its
    median over those steps, probing excluded: the steps and median of :func:`stall_s`): the rank
    whose own time (outside collectives) was beyond ``STALL_FACTOR`` x its median over the same
    steps and the largest, counted as ``"rank r"``, or ``"none"`` when no rank's own time was
    (everyone waited in a collective: the network or Horovod). {} when the record has no per-rank
    times."""
    own = [r[:n_steps] for r in rec.get("own_ms_by_rank") or []]
    step_ms = probe_free_ms(rec["per_step"])[:n_steps]
    if not own or not step_ms:
        return {}
    limit = STALL_FACTOR * statistics.median(step_ms)
    own_limits = [STALL_FACTOR * statistics.median(r) if r else math.inf for r in own]
    counts: Counter = Counter()
    for i, ms in enumerate(step_ms):
        if ms <= limit:
            continue
        slow = [(r[i], k) for k, r in enumerate(own) if i < len(r) and r[i] > own_limits[k]]
        counts["none" if not slow else f"rank {max(slow)[1]}"] += 1
    return dict(counts)


def probe_free_ms(per_step: dict[str, list]) -> list[float]:
    """Rank 0's step times (ms) without the probing they held."""
    return [ms - (probe or 0.0) for ms, probe in zip(per_step["ms"], per_step["probe_ms"])]


def row_steps(hit: Optional[dict], rec: dict[str, Any]) -> int:
    """Steps that count towards the time to target: up to the hit, or every step (none hit)."""
    return rec["steps"] if hit is None else int(hit["step"])


#: How many of a run's last evaluations its smoothed final accuracy averages: one evaluation of
#: this short a run moves by a point or two from the next (SGD's own noise, not the test set's).
LAST_EVALS = 3


def last_evals_accuracy(evals: list[dict[str, Any]], n: int = LAST_EVALS) -> Optional[float]:
    """Mean accuracy (fraction) of the last ``n`` evaluations after step 0 (fewer if the run has
    fewer; None if it has none)."""
    trained = [e["accuracy"] for e in evals if e["step"] > 0][-n:]
    return sum(trained) / len(trained) if trained else None


def smoothed_hit(evals: list[dict[str, Any]], target: float,
                 n: int = LAST_EVALS) -> Optional[dict[str, Any]]:
    """The first evaluation (after step 0) at which the mean accuracy of it and the ``n - 1``
    evaluations before it reaches ``target`` (fraction), or None. A second ruler for the time
    to target: the first single evaluation over the target is decided by swings of 1-2.5 points
    between evaluations 20 steps apart, the mean of ``n`` much less (it lags by about
    ``(n - 1) / 2`` evaluations, alike for every method)."""
    trained = [e for e in evals if e["step"] > 0]
    for i in range(n - 1, len(trained)):
        if sum(e["accuracy"] for e in trained[i - n + 1:i + 1]) / n >= target:
            return trained[i]
    return None


def summarize_all(records: list[dict[str, Any]], target: float,
                  dense_acc: float) -> list[dict[str, Any]]:
    """The table's rows, one per method record, with each row's smoothed final accuracy
    (:func:`last_evals_accuracy`) against Dense's and its time to the smoothed target: Dense's
    mean over its last :data:`LAST_EVALS` evaluations minus the same drop as the target
    (:func:`smoothed_hit`); None without a Dense row."""
    rows = [summarize(r, target, dense_acc) for r in records]
    dense = next((r for r in rows if r["kind"] == "dense"), None)
    dense_last = None if dense is None else dense["last_evals_accuracy"]
    smoothed_target = None if dense_last is None else dense_last - (dense_acc - target)
    for row, rec in zip(rows, records, strict=True):
        row["delta_last_evals_vs_dense_pts"] = (
            None if dense_last is None or row["last_evals_accuracy"] is None
            else 100 * (row["last_evals_accuracy"] - dense_last))
        hit = None if smoothed_target is None else smoothed_hit(rec["evals"], smoothed_target)
        row["smoothed_target"] = smoothed_target
        row["time_to_smoothed_target_s"] = None if hit is None else hit["train_s"]
        row["steps_to_smoothed_target"] = None if hit is None else hit["step"]
    return rows


def cr_change_after_network_change(changes: Optional[list], change: Optional[dict[str, Any]],
                                   step_ms: list[float],
                                   solves: Optional[list] = None) -> Optional[dict[str, Any]]:
    """Adaptive's first CR change solved after the network change: ``{"step", "cr", "steps",
    "s"}``: the step the new CR took effect at, the CR, how many steps ran between the change
    and it, and their training time (s). ``changes``: ``[(step, cr), ...]`` (the step that
    first ran the CR, the CR rounded); ``change``: the record's ``network_change`` (its
    ``step``: steps run before the change); ``step_ms``: each step's ms, step 0 first;
    ``solves``: the solve records (``step`` submitted, ``cr`` solved): a change counts only if
    its CR is one solved at or after the change's step (a solve from before the change can take
    effect after it). Without ``solves``, the first change at or after the change's step. None
    without an applied change or such a CR change."""
    if not change or not change.get("network") or not changes:
        return None
    at = int(change["step"])
    later = None if solves is None else [float(sv["cr"]) for sv in solves
                                         if sv.get("cr") is not None and int(sv["step"]) >= at]

    def solved_after(cr: float) -> bool:
        return later is None or any(math.isclose(cr, c, rel_tol=1e-3) for c in later)

    step, cr = next(((int(s), float(c)) for s, c in changes
                     if int(s) >= at and solved_after(float(c))), (None, None))
    if step is None:
        return None
    return {"step": step, "cr": cr, "steps": step - at,
            "s": sum(step_ms[at:step]) / 1e3}


def summarize(rec: dict[str, Any], target: float, reference_acc: float) -> dict[str, Any]:
    """One row of the table from one method record of the job."""
    hit = next((e for e in rec["evals"] if e["accuracy"] >= target), None)
    ps = rec["per_step"]
    n_counted = row_steps(hit, rec)
    row = {
        "name": rec["method"]["name"], "kind": rec["method"]["kind"], "cr": rec["method"]["cr"],
        "describe": rec["describe"],
        "time_to_target_s": None if hit is None else hit["train_s"],
        "steps_to_target": None if hit is None else hit["step"],
        "final_accuracy": rec["final_accuracy"],
        "last_evals_accuracy": last_evals_accuracy(rec["evals"]),
        "best_accuracy": max(e["accuracy"] for e in rec["evals"]),
        "delta_vs_dense_pts": 100 * (rec["final_accuracy"] - reference_acc),
        "steps": rec["steps"], "train_s": rec["train_s"],
        "mean_step_ms": 1e3 * rec["train_s"] / max(rec["steps"], 1),
        "median_step_ms": statistics.median(ps["ms"]) if ps["ms"] else None,
        "mean_comm_ms": _mean(ps["comm_ms"]), "mean_compress_ms": _mean(ps["compress_ms"]),
        "probe_ms_total": sum(x for x in ps["probe_ms"] if x),
        "full_probes": rec.get("flexible", {}).get("n_full_probes"),
        "drift_probes": rec.get("flexible", {}).get("n_drift_probes"),
        "drifts_unconfirmed": rec.get("flexible", {}).get("n_drift_unconfirmed"),
        "refresh_probes": rec.get("flexible", {}).get("n_refreshes"),
        "collectives": dict(Counter(c for c in ps["collective"] if c is not None)),
        "epochs_started": rec["epochs_started"],
        "stall_s": stall_s(probe_free_ms(ps)[:n_counted]),
        "network": rec.get("network", {}),
        "stall_ranks": stall_ranks(rec, n_counted),
        "network_change": rec.get("network_change"),
    }
    if rec["method"]["kind"] == "adaptive":
        spans = ps.get("span") or [False] * len(ps["cr"])  # older records have no span flags
        all_crs = [c for c in ps["cr"] if c is not None]
        # the CR in use: span steps (a few steps at an end of the candidates) left out
        crs = [c for c, span in zip(ps["cr"], spans) if c is not None and not span]
        warm = rec["method"]["options"]["warmup_steps"]
        after = crs[warm:]
        row["cr_first"] = all_crs[0] if all_crs else None
        row["cr_last"] = crs[-1] if crs else None
        row["span_steps"] = sum(bool(x) for x in spans)
        row["span_moves"] = rec.get("flexible", {}).get("n_span_moves")
        row["span_confirms"] = rec.get("flexible", {}).get("n_span_confirms")
        row["span_offs"] = rec.get("flexible", {}).get("n_span_offs")
        row["cr_min"] = min(crs) if crs else None
        row["cr_max"] = max(crs) if crs else None
        row["cr_mean_after_warmup"] = _mean(after)
        row["cr_changes"] = rec.get("adaptive", {}).get("changes")
        row["cr_after_change"] = cr_change_after_network_change(
            row["cr_changes"], rec.get("network_change"), ps["ms"],
            rec.get("adaptive", {}).get("solves"))
        row["announcements"] = rec.get("adaptive", {}).get("announcements")
        row["kept"] = rec.get("adaptive", {}).get("kept")
    return row


def _faster(t: Optional[float], other: Optional[float]) -> bool:
    """A time to target ``t`` beats ``other`` (a miss, None, is slower than any time; two misses
    tie)."""
    return _tta_key(t) < _tta_key(other)


def _against_fixed(ada: dict[str, Any], fixed: list[dict[str, Any]], others: list[dict[str, Any]],
                   key: str) -> tuple[Optional[dict[str, Any]], Optional[float], bool]:
    """On the ruler ``key`` (a row's time to target): the fastest fixed-CR row that reached the
    target, Adaptive's time over its time, and whether Adaptive beat every one of ``others``."""
    t_ada = ada[key]
    best = min((r for r in fixed if r[key] is not None), key=lambda r: r[key], default=None)
    ratio = t_ada / best[key] if t_ada is not None and best is not None else None
    return best, ratio, bool(others) and all(_faster(t_ada, r[key]) for r in others)


def assess(rows: list[dict[str, Any]], dense_acc: float) -> dict[str, Any]:
    """The acceptance targets (reported, not asserted) and the Adaptive-vs-best-fixed ratio."""
    ada = next((r for r in rows if r["kind"] == "adaptive"), None)
    dense = next((r for r in rows if r["kind"] == "dense"), None)
    fixed = [r for r in rows if r["kind"] in ("ag", "ar", "flexible")]
    out: dict[str, Any] = {"adaptive": None if ada is None else ada["name"]}
    if ada is None:
        return out
    t_ada = ada["time_to_target_s"]
    others = fixed + ([dense] if dense is not None else [])
    best, ratio, faster_all = _against_fixed(ada, fixed, others, "time_to_target_s")
    out["best_fixed"] = None if best is None else best["name"]
    out["best_fixed_time_s"] = None if best is None else best["time_to_target_s"]
    out["adaptive_time_s"] = t_ada
    out["ratio_adaptive_vs_best_fixed"] = ratio
    t_dense = None if dense is None else dense["time_to_target_s"]
    out["ratio_adaptive_vs_dense"] = t_ada / t_dense if t_ada and t_dense else None
    out["faster_than"] = {r["name"]: _faster(t_ada, r["time_to_target_s"]) for r in others}
    out["target_faster_than_all"] = faster_all
    out["target_accuracy_within_1pt"] = ada["final_accuracy"] >= dense_acc - 0.01
    if ada.get("smoothed_target") is not None:  # the second ruler (see smoothed_hit)
        best, ratio, faster_all = _against_fixed(ada, fixed, others, "time_to_smoothed_target_s")
        out["smoothed_target"] = ada["smoothed_target"]
        out["best_fixed_smoothed"] = None if best is None else best["name"]
        out["ratio_adaptive_vs_best_fixed_smoothed"] = ratio
        out["target_faster_than_all_smoothed"] = faster_all
    smoothed = ada.get("delta_last_evals_vs_dense_pts")
    out["target_accuracy_within_1pt_last_evals"] = None if smoothed is None else smoothed >= -1.0
    return out


# -- outputs ---------------------------------------------------------------------------------------


def _fmt_s(x: Optional[float]) -> str:
    return "not reached" if x is None else f"{x:.1f}"


def _fmt_smoothed(row: dict[str, Any]) -> str:
    """Time to the smoothed target and its step, ``-`` for runs rendered without a Dense row."""
    if row.get("smoothed_target") is None:
        return "-"
    t = row["time_to_smoothed_target_s"]
    return "not reached" if t is None else f"{t:.1f} (step {row['steps_to_smoothed_target']})"


def _fmt_pts(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:+.2f}"


def _fmt_met(ok: Optional[bool]) -> str:
    return "n/a" if ok is None else f"**{'met' if ok else 'not met'}**"


def _fmt_probes(row: dict[str, Any]) -> str:
    """Probing time of a run (s), then its full probes (start-up; after drift under Adaptive),
    drift probes (after drift under Flexible) and refreshes; ``-`` for a count a run did not
    record (older runs)."""
    if row.get("full_probes") is None:
        return "-"
    counts = [row.get(key) for key in ("full_probes", "drift_probes", "refresh_probes")]
    return (f"{row['probe_ms_total'] / 1e3:.1f} ("
            + "/".join("-" if c is None else str(c) for c in counts) + ")")


def _launcher(settings: dict[str, Any]) -> str:
    """How the jobs were launched (runs saved before ``--launcher`` existed used horovodrun)."""
    if settings.get("launcher", "horovodrun") == "mpirun":
        return "mpirun over TCP, Horovod's MPI controller"
    return "horovodrun --gloo"


def _rate_text(rate_mbit: Optional[float]) -> str:
    return "unlimited rate" if rate_mbit is None else f"{rate_mbit:g} Mbit/s"


def network_text(settings: dict[str, Any]) -> str:
    """The emulated network of a run, e.g. ``100 Mbit/s, 5 ms one way``, and its change, if any
    (``settings["network_change"]``: ``at_train_s`` and the second ``network``)."""
    text = f"{_rate_text(settings['rate_mbit'])}, {settings['delay_ms']:g} ms one way"
    change = settings.get("network_change")
    if change:
        net = change["network"]
        text += (f", then {_rate_text(net['rate_mbit'])}, {net['delay_ms']:g} ms one way from "
                 f"{change['at_train_s']:g} s of training on")
    return text


def _change_where(row: dict[str, Any]) -> str:
    change = row.get("network_change")
    if not change:
        return "never (it stopped first)"
    where = f"after step {change['step']} ({change['train_s']:.1f} s)"
    return where if change.get("network") else where + ", asked for but not applied before the end"


def network_change_line(rows: list[dict[str, Any]], settings: dict[str, Any]) -> list[str]:
    """Where each method's network changed (after the first step that ended past the change's
    clock)."""
    change = settings.get("network_change")
    if not change:
        return []
    return ["", f"Network change to {change['network']['label']} after the first step ending at "
            f"{change['at_train_s']:g} s of training or later: "
            + "; ".join(f"{r['name']} {_change_where(r)}" for r in rows) + "."]


def _fmt_after_change(after: Optional[dict[str, Any]]) -> str:
    """:func:`cr_change_after_network_change` as text."""
    if after is None:
        return "none"
    return (f"CR {after['cr']:g} from step {after['step']}, {after['steps']} steps "
            f"({after['s']:.1f} s of training) after the change")


def _adaptive_settings(records: list[dict[str, Any]]) -> str:
    warmups = sorted({f"{r['method']['options']['warmup_steps']} steps"
                      for r in records if r["method"]["kind"] == "adaptive"})
    return f"Adaptive: warm-up {', '.join(warmups)}, defaults otherwise." if warmups else ""


def markdown(result: dict[str, Any]) -> str:
    s = result["settings"]
    rows = result["rows"]
    a = result["assessment"]
    lines = [
        f"# Adaptive CR: time to Dense accuracy - {100 * s['target_drop']:g} point",
        "",
        f"N = {s['n']} ranks ({_launcher(s)}), {network_text(s)} "
        f"(measured RTT {result['link'].get('rtt_ms', float('nan')):.2f} ms"
        + (f", TCP {result['link']['throughput_mbit']:.1f} Mbit/s" if "throughput_mbit" in result["link"]
           else "") + f"); model {s['model_name']} ({s['parameters']:,} parameters); batch "
        f"{s['batch_size']}/rank, lr {s['lr']:g}/rank x N, momentum {s['momentum']:g}; Fashion-MNIST "
        f"(60 000 train, 10 000 test).",
        "",
        f"Dense: {s['dense_steps']} steps; final accuracy **{100 * result['dense_accuracy']:.2f}%**, "
        f"target **{100 * result['target']:.2f}%**; budget of the others: "
        + (f"{result['time_budget_s']:.1f} s of training or " if result["time_budget_s"] else "")
        + f"{s['max_steps_other']} steps. "
        f"Accuracy measured every {s['eval_every']} steps, evaluation excluded from the clock. "
        + ("Each method ran in its own job on a fresh emulator (fresh TCP connections). "
           if s.get("job_per_method") else "One job trained the methods in this order. ")
        + _adaptive_settings(result["records"]),
        "",
        f"| method | time to target (s) | steps to target | time to smoothed target (s) | "
        f"final acc (%) | vs Dense (pts) | last {LAST_EVALS} evals vs Dense (pts) | steps | "
        "train time (s) | mean step (ms) | median step (ms) | mean comm (ms) | "
        "probes (s, full/drift/refresh) | collectives |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        coll = ", ".join(f"{k} {v}" for k, v in sorted(r["collectives"].items()))
        comm = "-" if r["mean_comm_ms"] is None else f"{r['mean_comm_ms']:.1f}"
        lines.append(
            f"| {r['name']} | {_fmt_s(r['time_to_target_s'])} | "
            f"{r['steps_to_target'] if r['steps_to_target'] is not None else '-'} | "
            f"{_fmt_smoothed(r)} | "
            f"{100 * r['final_accuracy']:.2f} | {r['delta_vs_dense_pts']:+.2f} | "
            f"{_fmt_pts(r.get('delta_last_evals_vs_dense_pts'))} | {r['steps']} | "
            f"{r['train_s']:.1f} | {r['mean_step_ms']:.0f} | {r['median_step_ms']:.0f} | {comm} | "
            f"{_fmt_probes(r)} | {coll} |")
    lines += network_change_line(rows, s)
    lines += [f"{r['name']}'s first CR change solved after it: "
              f"{_fmt_after_change(r['cr_after_change'])}."
              for r in rows if r["kind"] == "adaptive" and r.get("network_change")]
    lines += stall_lines(rows)
    for ada in (r for r in rows if r["kind"] == "adaptive"):
        lines += ["", f"{ada['name']}'s CR: first {ada['cr_first']:g}, last {ada['cr_last']:g}, range "
                  f"[{ada['cr_min']:g}, {ada['cr_max']:g}], mean after warm-up "
                  f"{ada['cr_mean_after_warmup'] or float('nan'):.4g}; changes after warm-up "
                  f"(step, CR): {ada['cr_changes']}; {ada.get('announcements', '?')} announcement "
                  "broadcasts"
                  + ("." if ada.get("kept") is None else
                     f"; {ada['kept']} solved CR(s) not announced (within min_cr_change of the CR, "
                     "or predicted to save less than min_tta_gain of the time to accuracy).")
                  + (f" Span steps (left out of the range and mean): {ada['span_steps']}, "
                     f"{ada.get('span_moves') or 0} span(s) moved the model"
                     + ("" if ada.get("span_confirms") is None else
                        f", {ada['span_confirms']} confirmed it")
                     + ("." if ada.get("span_offs") is None else
                        f", {ada['span_offs']} off it once, kept out of it.")
                     if ada.get("span_steps") else "")
                  + (f" Drifts the steps after them did not confirm (nothing re-measured): "
                     f"{ada['drifts_unconfirmed']}." if ada.get("drifts_unconfirmed") else "")]
    if a.get("adaptive"):
        ratio = a.get("ratio_adaptive_vs_best_fixed")
        faster = ", ".join(f"{k}: {'yes' if v else 'no'}" for k, v in a["faster_than"].items())
        lines += [
            "",
            "Targets (reported, not asserted):",
            "- Adaptive faster to target than every fixed-CR run and Dense: "
            + _fmt_met(a["target_faster_than_all"]) + " "
            f"({faster})",
            "- Adaptive final accuracy >= Dense - 1 point: "
            + _fmt_met(a["target_accuracy_within_1pt"]) + " (last evaluation); "
            + _fmt_met(a.get("target_accuracy_within_1pt_last_evals"))
            + f" (mean of the last {LAST_EVALS} evaluations, against Dense's)",
            "- Adaptive / best fixed-CR time to target: "
            + ("n/a" if ratio is None else f"{ratio:.2f} (best fixed: {a['best_fixed']}, "
                                            f"{a['best_fixed_time_s']:.1f} s)"),
        ]
        if "target_faster_than_all_smoothed" in a:
            ratio_s = a["ratio_adaptive_vs_best_fixed_smoothed"]
            lines += [
                f"- The same on the smoothed target (mean of {LAST_EVALS} evaluations in a row "
                f">= Dense's last-{LAST_EVALS} mean - {100 * s['target_drop']:g} point, "
                f"{100 * a['smoothed_target']:.2f}%): faster than every other method "
                + _fmt_met(a["target_faster_than_all_smoothed"]) + "; Adaptive / best fixed-CR "
                + ("n/a" if ratio_s is None else
                   f"{ratio_s:.2f} (best fixed: {a['best_fixed_smoothed']})"),
            ]
    la0, la1 = result["loadavg_start"], result["loadavg_end"]
    lines += ["", f"Load average (1/5/15 min) at start {la0[0]:.2f}/{la0[1]:.2f}/{la0[2]:.2f}, at end "
              f"{la1[0]:.2f}/{la1[1]:.2f}/{la1[2]:.2f} on {result['cpus']} CPUs: other jobs share the "
              "machine, so step times (and thus times to target) carry noise of this order; the "
              f"ranks ran one torch thread each. Total run {result['total_s']:.0f} s."]
    if result.get("error"):
        lines += ["", "**The job failed** (partial results):", "", "```", result["error"][-1500:], "```"]
    return "\n".join(lines) + "\n"


def stall_lines(rows: list[dict[str, Any]]) -> list[str]:
    """Per method: time lost to stalls before the target, and what the network counted (TCP
    retransmission timeouts and retransmitted segments, packets dropped at the TUN interfaces or
    by the relay, the relay's mean lateness) and the CPU time the hypervisor took (steal) over
    the whole job."""
    lines = ["", f"Stalls and network counters (stall: time steps spent beyond {STALL_FACTOR:g} x "
             "the method's median step, up to the target, probing excluded; the counters cover "
             "the whole job, all hosts):", "",
             "| method | stall (s) | TCP RTOs | retransmitted segments | TUN drops | relay drops | "
             "relay lateness, mean (us) / max (ms) | CPU steal (s) | stalled steps by slow rank |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        net = r.get("network") or {}
        counts = " | ".join(str(net.get(key, "-")) for key in (
            "tcp_timeouts", "retrans_segs", "tun_tx_dropped", "relay_dropped_queue"))
        late, late_max = net.get("relay_mean_late_us"), net.get("relay_max_late_ms")
        steal = net.get("cpu_steal_s")
        slow = ", ".join(f"{k}: {v}" for k, v in sorted(r.get("stall_ranks", {}).items())) or "-"
        lines.append(f"| {r['name']} | {r.get('stall_s', 0.0):.1f} | {counts} | "
                     f"{'-' if late is None else f'{late:.0f}'}"
                     f"{'' if late_max is None else f' / {late_max:.1f}'} | "
                     f"{'-' if steal is None else f'{steal:.1f}'} | "
                     f"{slow} |")
    return lines


def plots(result: dict[str, Any], out: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    fig, ax = plt.subplots(figsize=(9, 5.5))
    ada_colors = iter(("black", "dimgray", "darkviolet", "saddlebrown"))
    for rec in result["records"]:
        xs = [e["train_s"] for e in rec["evals"]]
        ys = [100 * e["accuracy"] for e in rec["evals"]]
        style = ({"lw": 2.4, "color": next(ada_colors, None)} if rec["method"]["kind"] == "adaptive"
                 else {"lw": 1.3})
        ax.plot(xs, ys, marker=".", ms=3, label=rec["method"]["name"], **style)
    ax.axhline(100 * result["target"], color="red", ls="--", lw=1,
               label=f"target {100 * result['target']:.2f}%")
    lo = max(0.0, 100 * result["target"] - 15)
    ax.set_ylim(lo, min(100.0, 100 * result["dense_accuracy"] + 4))
    ax.set_xlabel("training time (s, rank 0, evaluation excluded)")
    ax.set_ylabel("test accuracy (%)")
    s = result["settings"]
    ax.set_title(f"Fashion-MNIST, {s['model_name']}, N={s['n']}, {network_text(s)}", fontsize=9)
    if s.get("network_change"):
        ax.axvline(s["network_change"]["at_train_s"], color="gray", ls=":", lw=1.2,
                   label="network change (clock)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    p = os.path.join(out, "accuracy_vs_time.png")
    fig.savefig(p, dpi=120)
    plt.close(fig)
    paths.append(p)

    recs = [r for r in result["records"] if r["method"]["kind"] in ("adaptive", "flexible")]
    if recs:
        fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(9, 6), sharex=True,
                                       gridspec_kw={"height_ratios": [2, 1]})
        levels = {"dense": 0, "allreduce": 1, "allgather": 2}
        ada_colors = iter(("black", "darkorange", "darkviolet", "saddlebrown"))
        for i, rec in enumerate(recs):
            ps = rec["per_step"]
            steps = list(range(1, len(ps["cr"]) + 1))
            is_ada = rec["method"]["kind"] == "adaptive"
            color = next(ada_colors, None) if is_ada else f"C{i}"
            ax1.step(steps, ps["cr"], where="post", color=color, lw=2 if is_ada else 1,
                     label=rec["method"]["name"])
            ys = [levels.get(c, -1) + (0.0 if is_ada else 0.15) + 0.1 * i for c in ps["collective"]]
            ax2.scatter(steps, ys, s=4, color=color, label=rec["method"]["name"])
            if rec.get("network_change"):
                for ax in (ax1, ax2):
                    ax.axvline(rec["network_change"]["step"], color=color, ls=":", lw=1)
        ax1.set_yscale("log")
        ax1.set_ylabel("compression ratio")
        ax1.grid(alpha=0.3, which="both")
        ax1.legend(fontsize=8)
        flexible = any(r["method"]["kind"] == "flexible" for r in recs)
        ax1.set_title("Adaptive's CR and collective per step"
                      + (" (Flexible for comparison)" if flexible else "")
                      + ("; dotted: the network change" if any(r.get("network_change") for r in recs)
                         else ""))
        ax2.set_yticks(list(levels.values()), list(levels.keys()))
        ax2.set_ylim(-0.5, 2.6)
        ax2.set_xlabel("step")
        ax2.grid(alpha=0.3)
        fig.tight_layout()
        p = os.path.join(out, "adaptive_cr.png")
        fig.savefig(p, dpi=120)
        plt.close(fig)
        paths.append(p)
    return paths


def build_result(records: list[dict], settings: dict, link: dict, loadavg_start: tuple,
                 loadavg_end: tuple, total_s: float, error: Optional[str]) -> dict[str, Any]:
    methods = [r for r in records if r.get("kind") == "method"]
    tgt = next((r for r in records if r.get("kind") == "target"), None)
    if tgt is None:
        raise RuntimeError("the job produced no Dense result (no target): " + (error or "?"))
    dense_acc = tgt["reference_accuracy"]
    rows = summarize_all(methods, tgt["target"], dense_acc)
    return {
        "settings": settings, "link": link, "cpus": os.cpu_count(),
        "loadavg_start": list(loadavg_start), "loadavg_end": list(loadavg_end),
        "total_s": total_s, "dense_accuracy": dense_acc, "target": tgt["target"],
        "time_budget_s": tgt["time_budget_s"], "rows": rows,
        "assessment": assess(rows, dense_acc), "records": methods, "error": error,
    }


def resummarize(result: dict[str, Any]) -> dict[str, Any]:
    """A saved run's rows and assessment recomputed from its records with this version's summary
    (e.g. columns added since it ran, such as the smoothed target); ``result`` is updated."""
    result["rows"] = summarize_all(result["records"], result["target"], result["dense_accuracy"])
    result["assessment"] = assess(result["rows"], result["dense_accuracy"])
    return result


def write_outputs(result: dict[str, Any], out: str) -> None:
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "adaptive.json"), "w") as fh:
        json.dump(result, fh)
    md = markdown(result)
    with open(os.path.join(out, "adaptive.md"), "w") as fh:
        fh.write(md)
    for p in plots(result, out):
        print(f"[bench_adaptive] wrote {p}")
    print(md)


# -- several seeds ---------------------------------------------------------------------------------


def _tta_key(t: Optional[float]) -> float:
    """Order of times to target: a miss is slower than any time."""
    return math.inf if t is None else t


def _within_1pt(deltas: list[Optional[float]]) -> Optional[bool]:
    """Every seed within 1 point of Dense (a seed without a value fails it); None when no seed
    has a value (runs saved before the measure existed)."""
    if all(d is None for d in deltas):
        return None
    return all(d is not None and d >= -1.0 for d in deltas)


def _median_verdict(ada: dict[str, Any], others: list[dict[str, Any]], times_key: str,
                    median_key: str) -> dict[str, Any]:
    """Adaptive against ``others`` on one ruler (per-seed times ``times_key``, their median
    ``median_key``): its median below every other median, its ratio to the best other median
    and that method's name, and the seeds in which it beat every method that ran there."""
    t_ada = _tta_key(ada[median_key])
    best = min(others, key=lambda m: _tta_key(m[median_key]), default=None)
    per_seed = [all(_tta_key(a) < _tta_key(m[times_key][i]) for m in others if m["ran"][i])
                for i, a in enumerate(ada[times_key])]
    return {"faster_than_all": all(t_ada < _tta_key(m[median_key]) for m in others),
            "ratio": (None if best is None or best[median_key] is None or math.isinf(t_ada)
                      else t_ada / best[median_key]),
            "best": None if best is None else best["name"], "seeds_faster": sum(per_seed)}


def sign_test_p(wins: int, losses: int) -> float:
    """Two-sided exact sign test: the probability, if each seed were equally likely to favour
    either method, of a split at least as uneven as ``wins`` : ``losses`` (ties left out
    before). 1.0 with no untied seed. Pure function."""
    if wins < 0 or losses < 0:
        raise ValueError(f"counts must be >= 0, got wins={wins}, losses={losses}")
    n = wins + losses
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(wins, losses) + 1)) / 2 ** n
    return min(1.0, 2.0 * tail)


def paired_against(ada: dict[str, Any], other: dict[str, Any], times_key: str) -> dict[str, Any]:
    """Adaptive against one ``other`` method seed by seed, on the ruler ``times_key``, over the
    seeds where both ran: in how many it was faster / slower / tied (a miss is slower than any
    time; two misses tie), the per-seed ratios Adaptive / other (seeds where both reached the
    target) and their median, and :func:`sign_test_p` of the split."""
    wins = losses = ties = 0
    ratios: list[float] = []
    for a, o, ran_a, ran_o in zip(ada[times_key], other[times_key], ada["ran"], other["ran"]):
        if not (ran_a and ran_o):
            continue
        win, loss = _faster(a, o), _faster(o, a)
        wins, losses, ties = wins + win, losses + loss, ties + (not (win or loss))
        if a is not None and o is not None:
            ratios.append(a / o)
    return {"seeds": wins + losses + ties, "faster": wins, "slower": losses, "ties": ties,
            "ratios": ratios, "median_ratio": statistics.median(ratios) if ratios else None,
            "sign_test_p": sign_test_p(wins, losses)}


def seed_summary(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Per method: time to target and final accuracy (vs Dense) per seed and their medians; the
    Adaptive targets judged on the medians and seed by seed. A method whose job failed in a seed
    (no row) counts in neither that seed's comparison nor its median (``ran`` is False)."""
    names: list[str] = [m["name"] for m in results[0]["settings"].get("methods", [])]  # plan order
    for res in results:  # and any other method a seed ran
        names += [r["name"] for r in res["rows"] if r["name"] not in names]
    names = [n for n in names if any(r["name"] == n for res in results for r in res["rows"])]
    methods = []
    for name in names:
        rows = [next((r for r in res["rows"] if r["name"] == name), None) for res in results]
        ttas = [None if r is None else r["time_to_target_s"] for r in rows]
        median = statistics.median(_tta_key(t) for t, r in zip(ttas, rows) if r is not None)
        smooth = [None if r is None else r.get("time_to_smoothed_target_s") for r in rows]
        median_smooth = statistics.median(_tta_key(t) for t, r in zip(smooth, rows) if r is not None)
        methods.append({
            "name": name, "kind": next(r["kind"] for r in rows if r is not None),
            "tta_s": ttas, "ran": [r is not None for r in rows],
            "median_tta_s": None if math.isinf(median) else median,
            "smoothed_tta_s": smooth,
            "median_smoothed_tta_s": None if math.isinf(median_smooth) else median_smooth,
            "reached": sum(t is not None for t in ttas),
            "delta_vs_dense_pts": [None if r is None else r["delta_vs_dense_pts"] for r in rows],
            "delta_last_evals_vs_dense_pts": [None if r is None
                                              else r.get("delta_last_evals_vs_dense_pts")
                                              for r in rows],
            "mean_step_ms": [None if r is None else r["mean_step_ms"] for r in rows],
            "cr_after_change": [None if r is None else r.get("cr_after_change") for r in rows],
        })
    out: dict[str, Any] = {"seeds": [res["settings"]["seed"] for res in results], "methods": methods}
    for ada in (m for m in methods if m["kind"] == "adaptive"):
        others = [m for m in methods if m["kind"] != "adaptive"]
        paired_with = [m for m in methods if m is not ada]  # another Adaptive too (an A/B)
        first = _median_verdict(ada, others, "tta_s", "median_tta_s")
        smooth = _median_verdict(ada, others, "smoothed_tta_s", "median_smoothed_tta_s")
        out.setdefault("adaptive", {})[ada["name"]] = {
            "median_smoothed_faster_than_all": smooth["faster_than_all"],
            "median_smoothed_ratio_vs_best_other": smooth["ratio"],
            "best_other_smoothed": smooth["best"],
            "seeds_smoothed_faster_than_all": smooth["seeds_faster"],
            "median_faster_than_all": first["faster_than_all"],
            "median_ratio_vs_best_other": first["ratio"],
            "best_other": first["best"],
            "seeds_faster_than_all": first["seeds_faster"],
            "within_1pt_every_seed": _within_1pt(ada["delta_vs_dense_pts"]),
            "within_1pt_every_seed_last_evals": _within_1pt(ada["delta_last_evals_vs_dense_pts"]),
            "paired": {ruler: {m["name"]: paired_against(ada, m, ruler) for m in paired_with}
                       for ruler in ("tta_s", "smoothed_tta_s")},
        }
    return out


def _seed_cells(times: list[Optional[float]], ran: list[bool], median: Optional[float]) -> str:
    """A method's per-seed times and their median as table cells (``-``: not reached,
    ``failed``: its job failed in that seed)."""
    cells = [_fmt_s(t).replace("not reached", "-") if r else "failed" for t, r in zip(times, ran)]
    return " | ".join(cells + [_fmt_s(median).replace("not reached", "-")])


def seeds_markdown(summary: dict[str, Any], results: list[dict[str, Any]]) -> str:
    seeds = summary["seeds"]
    s = results[0]["settings"]
    lines = [f"# Adaptive CR over {len(seeds)} seeds: time to Dense accuracy - "
             f"{100 * s['target_drop']:g} point", "",
             f"N = {s['n']} ({_launcher(s)}), {network_text(s)}; "
             f"{s['model_name']}; "
             f"seeds {', '.join(map(str, seeds))} (initial weights and data order; each seed has "
             "its own Dense run, target and time budget, see `seed<S>/adaptive.md`). Times in s of "
             "training clock; `-` = target not reached within the budget (counted as slower than "
             "any time when taking medians); `failed` = the method's job failed in that seed (left "
             "out of that seed and of the median).", ""]
    sources: dict[str, list] = {}
    for res in results:
        if res.get("source"):
            sources.setdefault(res["source"], []).append(res["settings"]["seed"])
    if len(sources) > 1:
        lines += ["Pooled from runs with the same settings: " + "; ".join(
            f"`{src}` (seeds {', '.join(map(str, seeds_of))})" for src, seeds_of in sources.items())
            + ".", ""]
    renamed = renamed_arms(results)
    if renamed:
        lines += ["Methods pooled under one name (`--pool-methods`): " + "; ".join(
            f"**{name}** is `{taken}` in `{src}` (seeds {', '.join(map(str, seeds_of))})"
            for (name, taken, src), seeds_of in renamed.items()) + ".", ""]
    lines += ["| method | " + " | ".join(f"seed {x} (s)" for x in seeds)
              + f" | median (s) | reached | final acc vs Dense (pts) | last {LAST_EVALS} evals vs "
              "Dense (pts) | mean step (ms) |",
              "|---|" + "---:|" * len(seeds) + "---:|---:|---|---|---|"]
    for m in summary["methods"]:
        lines.append(
            f"| {m['name']} | {_seed_cells(m['tta_s'], m['ran'], m['median_tta_s'])} | "
            f"{m['reached']}/{sum(m['ran'])}"
            + " | " + ", ".join(_fmt_pts(d) for d in m["delta_vs_dense_pts"])
            + " | " + ", ".join(_fmt_pts(d) for d in m.get("delta_last_evals_vs_dense_pts")
                                or [None] * len(seeds))
            + " | " + ", ".join("-" if x is None else f"{x:.0f}" for x in m["mean_step_ms"]) + " |")
    if any(t is not None for m in summary["methods"] for t in m.get("smoothed_tta_s") or []):
        lines += ["", f"Time to the **smoothed target** (the first evaluation at which the mean of "
                  f"it and the {LAST_EVALS - 1} before it reaches Dense's mean over its last "
                  f"{LAST_EVALS} evaluations - {100 * s['target_drop']:g} point; a second ruler, "
                  "less moved by the swings between evaluations):", "",
                  "| method | " + " | ".join(f"seed {x} (s)" for x in seeds) + " | median (s) |",
                  "|---|" + "---:|" * (len(seeds) + 1)]
        for m in summary["methods"]:
            lines.append(f"| {m['name']} | "
                         f"{_seed_cells(m['smoothed_tta_s'], m['ran'], m['median_smoothed_tta_s'])} |")
    others_note = " (Adaptive variants aside)" if len(summary.get("adaptive", {})) > 1 else ""
    for name, a in summary.get("adaptive", {}).items():
        ratio = a["median_ratio_vs_best_other"]
        lines += ["", f"{name} (reported, not asserted):",
                  "- median time to target below every other method's median: "
                  + _fmt_met(a["median_faster_than_all"])
                  + ("" if ratio is None else f" (ratio to the best other, {a['best_other']}: "
                                              f"{ratio:.2f})"),
                  f"- fastest of all methods{others_note} in {a['seeds_faster_than_all']}/{len(seeds)} "
                  "seeds",
                  "- on the smoothed target: median below every other method's "
                  + _fmt_met(a.get("median_smoothed_faster_than_all"))
                  + ("" if a.get("median_smoothed_ratio_vs_best_other") is None else
                     f" (ratio to the best other, {a['best_other_smoothed']}: "
                     f"{a['median_smoothed_ratio_vs_best_other']:.2f})")
                  + f"; fastest in {a.get('seeds_smoothed_faster_than_all', '-')}/{len(seeds)} seeds",
                  "- final accuracy >= Dense - 1 point in every seed: "
                  + _fmt_met(a["within_1pt_every_seed"]) + " (last evaluation); "
                  + _fmt_met(a.get("within_1pt_every_seed_last_evals"))
                  + f" (mean of the last {LAST_EVALS} evaluations, against Dense's)"]
        lines += _paired_lines(a.get("paired") or {})
        if s.get("network_change"):
            ada = next(m for m in summary["methods"] if m["name"] == name)
            lines.append("- first CR change solved after the network change: " + "; ".join(
                f"seed {seed}: {_fmt_after_change(after)}"
                for seed, after in zip(seeds, ada["cr_after_change"])))
    return "\n".join(lines) + "\n"


def _paired_lines(paired: dict[str, dict[str, dict[str, Any]]]) -> list[str]:
    """The seed-by-seed comparisons of :func:`paired_against` as bullet lines, one per other
    method, both rulers on the line."""
    names = list(paired.get("tta_s", {}))
    if not names:
        return []
    lines = ["- seed by seed against each method (faster in / seeds both ran; median of the "
             "per-seed ratios Adaptive / method; two-sided sign test p: the chance of a split "
             "at least this uneven if neither were faster; p > 0.05 = no difference shown):"]
    for name in names:
        parts = []
        for ruler, label in (("tta_s", "first crossing"), ("smoothed_tta_s", "smoothed")):
            c = paired.get(ruler, {}).get(name)
            if c is None or c["seeds"] == 0:
                continue
            ratio = "-" if c["median_ratio"] is None else f"{c['median_ratio']:.2f}"
            tied = f", {c['ties']} tied" if c["ties"] else ""
            parts.append(f"{label}: faster in {c['faster']}/{c['seeds']}{tied}, ratio {ratio}, "
                         f"p = {c['sign_test_p']:.3f}")
        lines.append(f"  - {name}: " + "; ".join(parts))
    return lines


def seeds_plot(summary: dict[str, Any], path: str) -> None:
    """Bars of each method's time to target per seed (black: the median), on the first-crossing
    ruler and, where the runs have it, on the smoothed one (:func:`smoothed_hit`) beside it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods, seeds = summary["methods"], summary["seeds"]
    rulers = [("tta_s", "median_tta_s", "first evaluation over the target")]
    if any(t is not None for m in methods for t in m.get("smoothed_tta_s") or []):
        rulers.append(("smoothed_tta_s", "median_smoothed_tta_s",
                       f"smoothed target ({LAST_EVALS} evaluations in a row)"))
    fig, axes = plt.subplots(1, len(rulers), figsize=(9 * len(rulers), 4.8), squeeze=False)
    width = 0.8 / len(seeds)
    budget = max((t for m in methods for key, _, _ in rulers for t in m.get(key) or []
                  if t is not None), default=1.0) * 1.1
    for ax, (key, median_key, title) in zip(axes[0], rulers):
        for j, seed in enumerate(seeds):
            xs = [i + (j - (len(seeds) - 1) / 2) * width for i in range(len(methods))]
            ys = [(budget if m[key][j] is None else m[key][j]) if m["ran"][j] else 0.0
                  for m in methods]
            bars = ax.bar(xs, ys, width, label=f"seed {seed}")
            for bar, m in zip(bars, methods):
                if m[key][j] is None:
                    bar.set_hatch("//")
                    bar.set_alpha(0.35)
        for i, m in enumerate(methods):
            if m[median_key] is not None:
                ax.plot([i - 0.45, i + 0.45], [m[median_key]] * 2, color="black", lw=2)
        ax.set_xticks(range(len(methods)))
        ax.set_xticklabels([m["name"] for m in methods], rotation=20, ha="right")
        ax.set_ylabel("time to target (s of training); hatched: not reached")
        ax.set_ylim(0, budget * 1.05)
        ax.set_title(f"Time to Dense accuracy - 1 point: {title}\n(per seed; black: median)",
                     fontsize=10)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


#: settings that may differ between pooled runs (each run's seed is its own)
POOL_FREE_SETTINGS = ("seed",)


def read_seed_runs(dirs: list[str],
                   pool_methods: Optional[list[tuple[str, str]]] = None) -> list[dict[str, Any]]:
    """Every ``seed*/adaptive.json`` under each of ``dirs``, re-summarised (:func:`resummarize`),
    in the order of ``dirs`` and of the seed directories' names, each with ``source`` (the
    directory it came from). ``pool_methods``: keep only these methods of every run, a run's
    ``SOURCE`` taken as ``NAME`` (:func:`select_methods`). Raises ``ValueError`` naming a
    directory that holds no run."""
    results: list[dict[str, Any]] = []
    for d in dirs:
        found = sorted(glob.glob(os.path.join(d, "seed*", "adaptive.json")))
        if not found:
            raise ValueError(f"no seed*/adaptive.json under {d!r}")
        for path in found:
            with open(path) as fh:
                res = resummarize(json.load(fh))
            res["source"] = d
            results.append(select_methods(res, pool_methods) if pool_methods else res)
    return results


def renamed_arms(results: list[dict[str, Any]]) -> dict[tuple[str, str, str], list]:
    """The arms :func:`select_methods` took under another name: ``(NAME, SOURCE, run
    directory)`` -> the seeds, in the order of ``results``. Empty without ``--pool-methods``
    (or where every ``NAME`` was the run's own). Pure function."""
    renamed: dict[tuple[str, str, str], list] = {}
    for res in results:
        for name, taken in (res["settings"].get("pooled_as") or {}).items():
            if taken != name:
                renamed.setdefault((name, taken, res.get("source", "?")), []).append(
                    res["settings"]["seed"])
    return renamed


def parse_pool_methods(specs: list[str]) -> list[tuple[str, str]]:
    """``--pool-methods`` entries, each ``NAME`` or ``NAME=SOURCE``, as ``(NAME, SOURCE)`` pairs
    (``SOURCE`` is ``NAME`` where not given). Raises ``ValueError`` naming an empty or repeated
    ``NAME``. Pure function."""
    pairs: list[tuple[str, str]] = []
    for spec in specs:
        name, _, source = spec.partition("=")
        name, source = name.strip(), (source.strip() or name.strip())
        if not name:
            raise ValueError(f"--pool-methods entry {spec!r} names no method")
        if name in (n for n, _ in pairs):
            raise ValueError(f"--pool-methods names {name!r} twice")
        pairs.append((name, source))
    return pairs


def select_methods(result: dict[str, Any], pairs: list[tuple[str, str]]) -> dict[str, Any]:
    """The run ``result`` with only the methods of ``pairs`` (:func:`parse_pool_methods`), in
    that order: for each ``(NAME, SOURCE)`` the run's method named ``SOURCE``, renamed ``NAME``,
    where the run has one, else its method named ``NAME``; every other method dropped; rows and
    assessment re-summarised. For pooling arms that ran the same code under different names
    (an option spelled out in one run that is the default in a later one). ``settings["methods"]``
    keeps the kept entries, renamed, and ``pooled_as`` maps each ``NAME`` to the method it came
    from. Raises ``ValueError`` naming the run's seed and ``NAME`` where it has neither."""
    by_name = {rec["method"]["name"]: rec for rec in result["records"]}
    records, plan, pooled_as = [], [], {}
    for name, source in pairs:
        taken = source if source in by_name else name
        if taken not in by_name:
            raise ValueError(f"seed {result['settings'].get('seed')} ({result.get('source', '?')!r}) "
                             f"has no method {source!r} or {name!r}; it has {sorted(by_name)}")
        rec = dict(by_name[taken], method=dict(by_name[taken]["method"], name=name))
        records.append(rec)
        plan.append(rec["method"])
        pooled_as[name] = taken
    settings = dict(result["settings"], methods=plan, pooled_as=pooled_as)
    return resummarize(dict(result, records=records, settings=settings))


def load_seed_runs(dirs: list[str],
                   pool_methods: Optional[list[tuple[str, str]]] = None) -> list[dict[str, Any]]:
    """Every ``seed*/adaptive.json`` under each of ``dirs`` (:func:`read_seed_runs`), in seed
    order. Pools runs of one setting: raises ``ValueError`` naming the directory and the
    settings when a run's settings differ from the first's (other than
    :data:`POOL_FREE_SETTINGS`), when a seed appears twice, or when a directory holds no run.
    ``pool_methods``: keep only these methods of every run (:func:`select_methods`); the
    methods' options are then not compared (the caller vouches that each ``NAME`` ran the same
    code in every run), their names and kinds are."""
    results = read_seed_runs(dirs, pool_methods)
    free = POOL_FREE_SETTINGS + (("pooled_as",) if pool_methods else ())

    def setting(res: dict[str, Any]) -> dict[str, Any]:
        kept = {k: v for k, v in res["settings"].items() if k not in free}
        if pool_methods:
            kept["methods"] = [(m["name"], m["kind"]) for m in kept.get("methods", [])]
        return kept

    first = setting(results[0])
    for res in results[1:]:
        theirs = setting(res)
        differ = sorted(k for k in set(first) | set(theirs) if first.get(k) != theirs.get(k))
        if differ:
            raise ValueError(f"{res['source']!r} (seed {res['settings'].get('seed')}) was run with "
                             f"other settings than {results[0]['source']!r}: {', '.join(differ)}")
    seeds = Counter(res["settings"]["seed"] for res in results)
    twice = sorted(seed for seed, count in seeds.items() if count > 1)
    if twice:
        raise ValueError(f"seed(s) {twice} appear in more than one run: pool distinct seeds")
    return sorted(results, key=lambda res: res["settings"]["seed"])


def write_seed_summary(results: list[dict[str, Any]], out: str) -> dict[str, Any]:
    summary = seed_summary(results)
    with open(os.path.join(out, "seeds.json"), "w") as fh:
        json.dump(summary, fh, indent=1)
    md = seeds_markdown(summary, results)
    with open(os.path.join(out, "seeds.md"), "w") as fh:
        fh.write(md)
    seeds_plot(summary, os.path.join(out, "seeds_tta.png"))
    print(md)
    return summary


# -- main ------------------------------------------------------------------------------------------


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="< 3 min smoke run: N=2, MLP 784-256-256-10, "
                    "20 Dense steps, 40 for the others, 4 methods, warm-up 10 steps")
    ap.add_argument("--n", type=int, default=None, help="ranks (default 4; --quick: 2)")
    ap.add_argument("--rate-mbit", type=parse_rate, default=100.0,
                    help="link rate, Mbit/s, or inf (default 100)")
    ap.add_argument("--delay-ms", type=float, default=5.0, help="one-way delay, ms (default 5)")
    ap.add_argument("--change-at-s", type=float, default=None, metavar="T",
                    help="change the network once per method, after the first step that ends at "
                         "T s of training clock or later (needs --change-to)")
    ap.add_argument("--change-to", nargs=2, metavar=("DELAY_MS", "RATE_MBIT"), default=None,
                    help="the network from --change-at-s on: one-way delay (ms) and rate (Mbit/s "
                         "or inf)")
    ap.add_argument("--methods", nargs="+", default=None,
                    help=f"methods, Dense first (default {' '.join(DEFAULT_METHODS)})")
    ap.add_argument("--dense-steps", type=int, default=None,
                    help=f"Dense's budget in steps (default {DEFAULT_DENSE_STEPS}; --quick: "
                         f"{QUICK_DENSE_STEPS})")
    ap.add_argument("--dense-epochs", type=float, default=None,
                    help="Dense's budget in epochs instead (60 000 / (N x batch) steps each)")
    ap.add_argument("--time-factor", type=float, default=None,
                    help="other methods stop after this x Dense's training time (default 1.0; "
                         "--quick: 0 = no time limit, steps only)")
    ap.add_argument("--step-factor", type=float, default=None,
                    help="... or after this x Dense's steps (default 3; --quick: 2)")
    ap.add_argument("--target-drop", type=float, default=0.01, help="target = Dense acc - this")
    ap.add_argument("--eval-every", type=int, default=None, help="steps between evaluations "
                    "(default 20; --quick: 10)")
    ap.add_argument("--warmup-steps", type=int, default=None,
                    help=f"Adaptive's warm-up steps (default {DEFAULT_WARMUP}; --quick: {QUICK_WARMUP})")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.01, help="per rank (scaled by N)")
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--seeds", type=int, nargs="+", help="run once per seed and summarise (see above)")
    ap.add_argument("--hidden", type=int, default=None, help="MLP width (default 768; --quick: 256)")
    ap.add_argument("--depth", type=int, default=MODEL["depth"], help="MLP hidden layers")
    ap.add_argument("--timeout-s", type=float, default=None, help="job timeout (default 45 min; "
                    "--quick: 240 s)")
    ap.add_argument("--launcher", choices=LAUNCHERS, default="horovodrun",
                    help="horovodrun --gloo (default; Adaptive announces over hvd.broadcast_object) or "
                         "Open MPI's mpirun over TCP (Horovod's MPI controller; announcements over mpi4py)")
    ap.add_argument("--job-per-method", action=argparse.BooleanOptionalAction, default=True,
                    help="each method in its own job on a fresh emulator (default; "
                         "--no-job-per-method: one job trains them all in turn)")
    ap.add_argument("--keep-freed-memory", action=argparse.BooleanOptionalAction, default=True,
                    help="launch the ranks with glibc malloc keeping freed memory (default; "
                         "jobctl.KEEP_FREED_MEMORY: on this VM a page returned to the kernel "
                         "costs a slow fault when reused; docs/performance/stalls.md)")
    ap.add_argument("--wait", choices=("poll", "horovod"), default="poll",
                    help="how hvd_flexcomm waits for its collectives in the jobs: poll with "
                         "sleeps (default) or Horovod's own loop (HVD_FLEXCOMM_WAIT=horovod; "
                         "see hvd_flexcomm/waiting.py), for an A/B")
    ap.add_argument("--out", default=os.path.join(REPO, "results", "adaptive"))
    ap.add_argument("--render", metavar="JSON", help="re-render the table and plots of a saved run")
    ap.add_argument("--render-seeds", metavar="DIR", nargs="+",
                    help="re-render the summary of a --seeds run (written into DIR); several "
                         "DIRs: pool their seeds (same settings, distinct seeds) into one "
                         "summary under --out")
    ap.add_argument("--pool-methods", metavar="NAME[=SOURCE]", nargs="+", default=None,
                    help="with --render-seeds: keep only these methods of every run; NAME=SOURCE "
                         "takes a run's method SOURCE as NAME where the run has it (arms that ran "
                         "the same code under other names), else its method NAME")
    args = ap.parse_args(argv)
    # every job this run launches (jobctl.job_env) reads it; set either way, so each run says
    os.environ[KEEP_FREED_MEMORY_ENV] = "1" if args.keep_freed_memory else "0"
    os.environ[WAIT_ENV] = args.wait

    if args.pool_methods and not args.render_seeds:
        ap.error("--pool-methods goes with --render-seeds")
    if args.render_seeds:
        try:
            pool = parse_pool_methods(args.pool_methods) if args.pool_methods else None
            loaded = load_seed_runs(args.render_seeds, pool)
        except ValueError as exc:
            ap.error(str(exc))
        out = args.render_seeds[0] if len(args.render_seeds) == 1 else args.out
        os.makedirs(out, exist_ok=True)
        write_seed_summary(loaded, out)
        return 0
    if args.render:
        with open(args.render) as fh:
            result = resummarize(json.load(fh))
        write_outputs(result, os.path.dirname(os.path.abspath(args.render)))
        return 0
    if os.geteuid() != 0:
        print("bench_adaptive needs root (network namespaces)", file=sys.stderr)
        return 2

    if (args.change_at_s is None) != (args.change_to is None):
        ap.error("--change-at-s and --change-to go together")
    change = None
    if args.change_to is not None:
        if not args.change_at_s >= 0:
            ap.error(f"--change-at-s must be >= 0 s, got {args.change_at_s:g}")
        if not args.job_per_method:
            ap.error("--change-at-s needs --job-per-method (each method's job starts on the first "
                     "network)")
        try:
            change = {"at_train_s": args.change_at_s,
                      "network": network(float(args.change_to[0]), parse_rate(args.change_to[1]))}
        except ValueError as exc:
            ap.error(f"--change-to {' '.join(args.change_to)}: {exc}")
    networks = [network(args.delay_ms, args.rate_mbit)] + ([change["network"]] if change else [])

    quick = args.quick
    n = args.n or (2 if quick else 4)
    warmup = args.warmup_steps if args.warmup_steps is not None else (
        QUICK_WARMUP if quick else DEFAULT_WARMUP)
    eval_every = args.eval_every or (10 if quick else 20)
    try:
        methods = [parse_method(m, warmup) for m in (args.methods or (QUICK_METHODS if quick
                                                                       else DEFAULT_METHODS))]
    except ValueError as exc:
        ap.error(str(exc))
    twice = sorted(name for name, n in Counter(m["name"] for m in methods).items() if n > 1)
    if twice:
        ap.error(f"a method is named twice: {', '.join(twice)}")
    if methods[0]["kind"] != "dense":
        ap.error("the first method must be dense (it sets the target)")
    if args.dense_steps:
        dense_steps = args.dense_steps
    elif args.dense_epochs:
        dense_steps = int(args.dense_epochs * (TRAIN_IMAGES // n) // args.batch_size)
    else:
        dense_steps = QUICK_DENSE_STEPS if quick else DEFAULT_DENSE_STEPS
    step_factor = args.step_factor or (2.0 if quick else 3.0)
    time_factor = args.time_factor if args.time_factor is not None else (0.0 if quick else 1.0)
    timeout_s = args.timeout_s or (240.0 if quick else 2700.0)
    hidden = args.hidden or (QUICK_HIDDEN if quick else MODEL["hidden"])
    model = {"kind": "mlp", "hidden": hidden, "depth": args.depth}

    from hvd_flexcomm.models import MLP, count_parameters

    params = count_parameters(MLP(hidden=hidden, depth=args.depth))
    settings = {
        "quick": quick, "n": n, "rate_mbit": args.rate_mbit, "delay_ms": args.delay_ms,
        "network_change": change,
        "model": model, "model_name": f"MLP(784-{'-'.join([str(hidden)] * args.depth)}-10)",
        "parameters": params, "batch_size": args.batch_size, "lr": args.lr,
        "momentum": args.momentum, "seed": args.seed, "dense_steps": dense_steps,
        "job_per_method": args.job_per_method, "launcher": args.launcher,
        "keep_freed_memory": args.keep_freed_memory, "wait": args.wait,
        "time_factor": time_factor, "step_factor": step_factor,
        "max_steps_other": int(round(step_factor * dense_steps)),
        "target_drop": args.target_drop, "eval_every": eval_every, "warmup_steps": warmup,
        "methods": methods, "adaptive_defaults": adaptive_defaults(),
        "clock": "rank 0 perf_counter from each step's forward pass to the end of opt.step(); "
                 "evaluation excluded",
    }
    plan = {"model": model, "batch_size": args.batch_size, "lr": args.lr,
            "momentum": args.momentum, "seed": args.seed, "methods": methods,
            "dense_steps": dense_steps, "time_factor": time_factor,
            "step_factor": step_factor, "target_drop": args.target_drop,
            "eval_every": eval_every, "launcher": args.launcher,
            "change_at_train_s": None if change is None else change["at_train_s"]}
    seeds = args.seeds or [args.seed]
    results, failed = [], False
    for seed in seeds:
        out = args.out if args.seeds is None else os.path.join(args.out, f"seed{seed}")
        os.makedirs(out, exist_ok=True)
        load0 = os.getloadavg()
        t0 = time.monotonic()
        print(f"[bench_adaptive] seed {seed}: N={n}, {network_text(settings)}; "
              f"{settings['model_name']} ({params:,} parameters); Dense {dense_steps} steps; methods "
              f"{', '.join(m['name'] for m in methods)}; load average {load0[0]:.2f}", flush=True)
        records, link, error = run_methods(n, networks, {**plan, "seed": seed},
                                           timeout_s, out, not quick, args.job_per_method)
        load1 = os.getloadavg()
        if error:
            print(f"[bench_adaptive] {error}", file=sys.stderr)
            failed = True
        result = build_result(records, {**settings, "seed": seed}, link, load0, load1,
                              time.monotonic() - t0, error)
        write_outputs(result, out)
        results.append(result)
    if args.seeds is not None:
        write_seed_summary(results, args.out)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
