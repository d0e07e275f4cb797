"""Synthetic throughput benchmark in the style of Horovod's ``pytorch_synthetic_benchmark.py``.

Worker (run it under ``horovodrun``; it prints what Horovod's benchmark prints)::

    horovodrun --gloo -np 4 -H localhost:4 python benchmarks/bench_synthetic.py \
        --model resnet18 --method artopk-star --cr 0.01

Driver (launches the worker on several networks and summarises; emulated networks need root)::

    python benchmarks/bench_synthetic.py --sweep --quick      # < 3 min: N=2, 1M params, CR 0.01
    python benchmarks/bench_synthetic.py --sweep              # N=4, ResNet-18 size, 3 CRs x 3 networks
    python benchmarks/bench_synthetic.py --render results/synthetic/synthetic.json   # no run

**Model.** An MLP whose parameter count is *exactly* the named model's (``--model resnet18``:
11,689,512 = MLP 8812-1024-1024-1024-552; ``resnet50``: 25,557,032 = MLP 22867-1024-1024-1024-40;
``small``: 1,000,000; or a number), see ``synthetic_models.py``. Every step is a forward and a
backward pass of ``--batch-size`` random samples (created once, as Horovod's benchmark does), then
``optimizer.step()`` of SGD wrapped by the method's distributed optimizer.

**Methods** (``--method``, a comma-separated list runs them one after the other in one job):
``horovod`` (``hvd.DistributedOptimizer``, dense), ``dense`` (``hvd_flexcomm`` ``Dense()``),
``agtopk``, ``artopk-star``, ``artopk-var``, ``flexible`` (``AGTopk`` / ``ARTopk`` / ``Flexible`` at
``--cr``) and ``adaptive`` (``Adaptive()``: the CR is chosen online in [0.001, 0.1]; a new one
may be announced every 2 steps here so that it settles during warm-up; ``--cr`` is ignored).

**Timing.** ``--num-warmup-batches`` untimed steps, then ``--num-iters`` iterations of
``--num-batches-per-iter`` steps each; ``Iter #i: X img/sec per rank`` for each, then
``Img/sec per rank: mean +-1.96 std`` and ``Total img/sec on N rank(s)`` (rank 0's rate x N).
Rank 0 also keeps ``opt.last_stats`` of every timed step (``comm_ms``, ``compress_ms``,
``collective``, ``k``, ``bytes_sent``) and appends one JSON record per method to ``--json``.

**Sweep.** Every method x CR (0.1, 0.01, 0.001; Dense/Horovod/Adaptive once) x network (loopback:
plain ``horovodrun -H localhost:N`` in the root namespace; ``1000`` and ``100``: emulated 1 Gbit/s and
100 Mbit/s links with ``--delay-ms`` one-way delay, one rank per network namespace,
``hvd_flexcomm.netem``), one ``horovodrun`` job per network (a launch costs ~20 s here). Writes
``synthetic.json`` (every record, ``os.getloadavg()`` at start and end), ``synthetic.md`` and
``synthetic.png`` (step time vs bandwidth per method, one panel per CR) under ``--out`` and prints
the headline ratios of this run: Flexible vs the better fixed collective, AR-Topk vs Dense at the
slowest network, AG-Topk vs Dense. Target reported (not asserted): at 100 Mbit, N=4, ResNet-18
size, AR-Topk (STAR) at CR 0.01 >= 5x faster per step than Dense.

On this machine (2 cores shared with other jobs) N=4 ranks oversubscribe the CPU: the forward and
backward pass and the top-k selection are slow and noisy, and they count in every step time.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import statistics
import sys
import time
from collections import Counter
from typing import Any, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import synthetic_launch as launch  # noqa: E402
import synthetic_models as models  # noqa: E402

METHODS = ("horovod", "dense", "agtopk", "artopk-star", "artopk-var", "flexible", "adaptive")
#: Methods whose compression ratio is not a parameter (one run per network in a sweep).
NO_CR = ("horovod", "dense", "adaptive")
TOPK = ("agtopk", "artopk-star", "artopk-var", "flexible")
TAG = "[bench_synthetic]"

FULL = {"n": 4, "model": "resnet18", "batch_size": 32, "warmup": 2, "iters": 3, "batches": 2,
        "crs": [0.1, 0.01, 0.001], "networks": ["loopback", "1000", "100"], "timeout_s": 1500}
QUICK = {"n": 2, "model": "small", "batch_size": 32, "warmup": 2, "iters": 2, "batches": 2,
         "crs": [0.01], "networks": ["loopback", "100"], "timeout_s": 240}


# ---------------------------------------------------------------------------------------------------
# worker (one rank, under horovodrun)
# ---------------------------------------------------------------------------------------------------


def _mode(method: str, cr: float) -> Any:
    import hvd_flexcomm

    if method == "dense":
        return hvd_flexcomm.Dense()
    if method == "agtopk":
        return hvd_flexcomm.AGTopk(cr=cr)
    if method == "artopk-star":
        return hvd_flexcomm.ARTopk(cr=cr, selector="star")
    if method == "artopk-var":
        return hvd_flexcomm.ARTopk(cr=cr, selector="var")
    if method == "flexible":
        return hvd_flexcomm.Flexible(cr=cr)
    if method == "adaptive":
        return hvd_flexcomm.Adaptive(sync_every=2, gain_every=2)
    raise ValueError(f"unknown method {method!r}")


def _median(xs: list) -> Optional[float]:
    xs = [x for x in xs if x is not None and isinstance(x, (int, float)) and math.isfinite(x)]
    return statistics.median(xs) if xs else None


def run_one(hvd: Any, args: argparse.Namespace, shape: models.MLPShape, method: str,
            cr: Optional[float]) -> dict[str, Any]:
    """Benchmark one method on this rank; returns the record (meaningful on rank 0)."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    import hvd_flexcomm

    rank, size = hvd.rank(), hvd.size()
    log = (lambda s: print(s, flush=True)) if rank == 0 else (lambda s: None)
    load0 = launch.loadavg()
    t_start = time.perf_counter()
    torch.manual_seed(args.seed)
    model = models.build_mlp(shape)
    base = torch.optim.SGD(model.parameters(), lr=0.01 * size)
    if method == "horovod":
        opt = hvd.DistributedOptimizer(base, named_parameters=model.named_parameters())
    else:
        opt = hvd_flexcomm.DistributedOptimizer(base, named_parameters=model.named_parameters(),
                                                compression=_mode(method, cr if cr is not None else 0.01))
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    gen = torch.Generator().manual_seed(args.seed * 1000 + rank)
    data = torch.randn(args.batch_size, shape.in_features, generator=gen)
    target = torch.randint(0, shape.num_classes, (args.batch_size,), generator=gen)
    stats: list[dict] = []

    def step(keep: bool) -> None:
        opt.zero_grad()
        loss = F.cross_entropy(model(data), target)
        loss.backward()
        opt.step()
        if keep:
            st = getattr(opt, "last_stats", None) or {}
            stats.append({key: st.get(key) for key in ("collective", "cr", "comm_ms", "compress_ms",
                                                        "k", "bytes_sent", "probe_ms", "skipped")})

    label = method if method in NO_CR else f"{method} cr={cr:g}"
    log(f"Method: {label}  ({opt.__class__.__name__} wrapped: "
        f"{'hvd.DistributedOptimizer' if method == 'horovod' else 'hvd_flexcomm.DistributedOptimizer'})")
    log("Running warmup...")
    t_warm = time.perf_counter()
    for _ in range(args.num_warmup_batches):
        step(keep=False)
    warm_s = time.perf_counter() - t_warm
    log("Running benchmark...")
    img_secs: list[float] = []
    step_ms: list[float] = []
    for i in range(args.num_iters):
        t0 = time.perf_counter()
        for _ in range(args.num_batches_per_iter):
            step(keep=True)
        dt = time.perf_counter() - t0
        rate = args.batch_size * args.num_batches_per_iter / dt
        img_secs.append(rate)
        step_ms.append(1e3 * dt / args.num_batches_per_iter)
        log(f"Iter #{i}: {rate:.1f} img/sec per rank")
    mean = float(np.mean(img_secs))
    conf = float(1.96 * np.std(img_secs))
    log(f"Img/sec per rank: {mean:.1f} +-{conf:.1f}")
    log(f"Total img/sec on {size} rank(s): {size * mean:.1f} +-{size * conf:.1f}")
    ctrl = getattr(opt, "_flex_controller", None)
    adaptive = getattr(opt, "_flex_adaptive", None)
    record = {
        "kind": "synthetic", "method": method, "cr": cr, "N": size,
        "model": args.model, "numel": shape.numel, "shape": shape.describe(),
        "batch_size": args.batch_size, "num_warmup_batches": args.num_warmup_batches,
        "num_iters": args.num_iters, "num_batches_per_iter": args.num_batches_per_iter,
        "img_sec": img_secs, "img_sec_mean": mean, "img_sec_conf": conf, "total_img_sec": size * mean,
        "step_ms": step_ms, "step_ms_mean": float(np.mean(step_ms)),
        "comm_ms_median": _median([s["comm_ms"] for s in stats]),
        "compress_ms_median": _median([s["compress_ms"] for s in stats]),
        "k_median": _median([s["k"] for s in stats]),
        "bytes_sent_median": _median([s["bytes_sent"] for s in stats]),
        "collectives": (dict(Counter(str(s["collective"]) for s in stats))
                        if stats and stats[0]["collective"] else {}),
        "crs_used": dict(Counter(f"{s['cr']:g}" for s in stats if s["cr"] is not None)),
        "probe_ms_timed": sum(s["probe_ms"] or 0.0 for s in stats),
        "flex_switches": getattr(ctrl, "n_switches", None),
        "adaptive_changes": list(getattr(adaptive, "changes", []) or []) or None,
        "warmup_s": warm_s, "wall_s": time.perf_counter() - t_start,
        "loadavg_start": load0, "loadavg_end": launch.loadavg(),
        "steps": stats,
    }
    if adaptive is not None:
        adaptive.close()
    return record


def worker(args: argparse.Namespace) -> int:
    import horovod.torch as hvd
    import torch

    torch.set_num_threads(1)
    hvd.init()
    methods = [m.strip() for m in args.method.split(",") if m.strip()]
    for m in methods:
        if m not in METHODS:
            raise SystemExit(f"unknown --method {m!r}; choose from {', '.join(METHODS)}")
    shape = models.exact_mlp_shape(models.size_of(args.model))
    if hvd.rank() == 0:
        print(f"Model: {args.model} stand-in, {shape.describe()}, {shape.numel:,} parameters", flush=True)
        print(f"Batch size: {args.batch_size}", flush=True)
        print(f"Number of ranks: {hvd.size()}", flush=True)
    configs = []
    for m in methods:
        if m in NO_CR:
            configs.append((m, None))
        else:
            configs.extend((m, float(c)) for c in args.cr)
    for i, (m, cr) in enumerate(configs):
        if hvd.rank() == 0:
            print(f"{TAG} config {i + 1}/{len(configs)}: {m}" + ("" if cr is None else f" cr={cr:g}"),
                  flush=True)
        record = run_one(hvd, args, shape, m, cr)
        if hvd.rank() == 0 and args.json:
            with open(args.json, "a") as fh:
                fh.write(json.dumps(record) + "\n")
        gc.collect()
        hvd.allreduce(torch.zeros(1), name=f"bench_synthetic.barrier.{i}")
    hvd.shutdown()
    return 0


# ---------------------------------------------------------------------------------------------------
# sweep (driver)
# ---------------------------------------------------------------------------------------------------


def _bandwidth_key(net: dict) -> float:
    if net["kind"] == "loopback":
        return float("inf")
    return float("inf") if net["rate_mbit"] is None else net["rate_mbit"]


def sweep(args: argparse.Namespace) -> int:
    preset = QUICK if args.quick else FULL
    n = args.n or preset["n"]
    model = args.model_sweep or preset["model"]
    crs = args.cr_sweep or preset["crs"]
    nets = [launch.parse_network(t, args.delay_ms) for t in (args.networks or preset["networks"])]
    methods = [m.strip() for m in (args.methods or ",".join(METHODS)).split(",") if m.strip()]
    why = launch.netns_available()
    if why is not None:
        dropped = [x["label"] for x in nets if x["kind"] != "loopback"]
        nets = [x for x in nets if x["kind"] == "loopback"]
        if dropped:
            print(f"{TAG} emulator unavailable ({why}): skipping {dropped}", flush=True)
    if not nets:
        print(f"{TAG} nothing to run", flush=True)
        return 2
    os.makedirs(args.out, exist_ok=True)
    runs_dir = os.path.join(args.out, "runs")
    os.makedirs(runs_dir, exist_ok=True)
    warmup = args.num_warmup_batches_sweep or preset["warmup"]
    iters = args.num_iters_sweep or preset["iters"]
    batches = args.num_batches_per_iter_sweep or preset["batches"]
    batch_size = args.batch_size_sweep or preset["batch_size"]
    timeout_s = args.timeout_s or preset["timeout_s"]
    shape = models.exact_mlp_shape(models.size_of(model))
    meta = {
        "argv": sys.argv, "quick": bool(args.quick), "N": n, "model": model, "numel": shape.numel,
        "shape": shape.describe(), "batch_size": batch_size, "crs": crs, "methods": methods,
        "num_warmup_batches": warmup, "num_iters": iters, "num_batches_per_iter": batches,
        "networks": nets, "delay_ms": args.delay_ms, "loadavg_start": launch.loadavg(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"), "cpus": os.cpu_count(), "jobs": [],
    }
    print(f"{TAG} N={n}, {model} stand-in ({shape.describe()}, {shape.numel:,} params), batch "
          f"{batch_size}, CRs {crs}, networks {[x['label'] for x in nets]}, methods {methods}; "
          f"loadavg {meta['loadavg_start']}", flush=True)
    t0 = time.monotonic()
    records: list[dict] = []
    with launch.NetworkRunner(n) as runner:
        for j, net in enumerate(nets):
            name = f"net{j}"
            jsonl = os.path.join(runs_dir, f"{name}.jsonl")
            if os.path.exists(jsonl):
                os.remove(jsonl)
            script = [sys.executable, os.path.abspath(__file__), "--model", model,
                      "--batch-size", str(batch_size), "--num-warmup-batches", str(warmup),
                      "--num-iters", str(iters), "--num-batches-per-iter", str(batches),
                      "--method", ",".join(methods), "--cr", *[f"{c:g}" for c in crs],
                      "--json", os.path.abspath(jsonl)]
            argv, env = runner.argv_env(net, script)
            print(f"{TAG} network {j + 1}/{len(nets)}: {net['label']} (elapsed "
                  f"{time.monotonic() - t0:.0f} s)", flush=True)
            rc, secs = launch.run_job(argv, env, timeout_s, os.path.join(runs_dir, f"{name}.log"),
                                      on_line=lambda s, lab=net["label"]: print(f"  [{lab}] {s}", flush=True))
            got = []
            if os.path.exists(jsonl):
                with open(jsonl) as fh:
                    got = [json.loads(line) for line in fh if line.strip()]
            for r in got:
                r["network"] = net
            records.extend(got)
            meta["jobs"].append({"network": net, "rc": rc, "seconds": secs, "records": len(got),
                                 "log": os.path.join("runs", f"{name}.log")})
            if rc != 0:
                print(f"{TAG} job on {net['label']} failed (rc {rc}); see {runs_dir}/{name}.log",
                      flush=True)
    meta["loadavg_end"] = launch.loadavg()
    meta["duration_s"] = time.monotonic() - t0
    result = {"meta": meta, "runs": records}
    path = os.path.join(args.out, "synthetic.json")
    with open(path, "w") as fh:
        json.dump(result, fh, indent=1)
    render(result, args.out)
    failed = [j for j in meta["jobs"] if j["rc"] != 0]
    print(f"{TAG} wrote {path} ({len(records)} records, {meta['duration_s']:.0f} s; loadavg "
          f"{meta['loadavg_start']} -> {meta['loadavg_end']})", flush=True)
    return 1 if failed or not records else 0


# ---------------------------------------------------------------------------------------------------
# summary
# ---------------------------------------------------------------------------------------------------


def _find(runs: list[dict], net_label: str, method: str, cr: Optional[float]) -> Optional[dict]:
    for r in runs:
        if r["network"]["label"] != net_label or r["method"] != method:
            continue
        if method in NO_CR or (r["cr"] is not None and cr is not None and math.isclose(r["cr"], cr)):
            return r
    return None


def _fmt(x: Optional[float], digits: int = 1) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{x:.{digits}f}"


def headlines(result: dict) -> dict[str, Any]:
    """The ratios of the summary, computed from this run's records only."""
    runs, meta = result["runs"], result["meta"]
    nets = sorted({json.dumps(r["network"], sort_keys=True) for r in runs})
    nets = sorted((json.loads(x) for x in nets), key=_bandwidth_key)
    crs = sorted({r["cr"] for r in runs if r["cr"] is not None}, reverse=True)
    out: dict[str, Any] = {"flexible_vs_best_fixed": [], "artopk_vs_dense": [], "agtopk_vs_dense": []}
    for net in nets:
        lab = net["label"]
        dense = _find(runs, lab, "horovod", None) or _find(runs, lab, "dense", None)
        for cr in crs:
            ag, ar = _find(runs, lab, "agtopk", cr), _find(runs, lab, "artopk-star", cr)
            fl = _find(runs, lab, "flexible", cr)
            if fl and ag and ar:
                best = min(ag["step_ms_mean"], ar["step_ms_mean"])
                out["flexible_vs_best_fixed"].append({
                    "network": lab, "cr": cr, "ratio": fl["step_ms_mean"] / best,
                    "best_fixed": "agtopk" if ag["step_ms_mean"] <= ar["step_ms_mean"] else "artopk-star",
                    "flexible_collectives": fl["collectives"]})
            if dense and ar:
                out["artopk_vs_dense"].append({"network": lab, "cr": cr, "dense": dense["method"],
                                               "speedup": dense["step_ms_mean"] / ar["step_ms_mean"]})
            if dense and ag:
                out["agtopk_vs_dense"].append({"network": lab, "cr": cr, "dense": dense["method"],
                                               "speedup": dense["step_ms_mean"] / ag["step_ms_mean"]})
    slowest = nets[0]["label"] if nets and nets[0]["kind"] != "loopback" else None
    target = None
    if slowest is not None:
        for row in out["artopk_vs_dense"]:
            if row["network"] == slowest and math.isclose(row["cr"], 0.01):
                target = row["speedup"]
    out["target"] = {
        "text": "AR-Topk (STAR) at CR 0.01 >= 5x faster per step than Dense at the slowest network "
                "(100 Mbit), N=4, ResNet-18 size",
        "network": slowest, "speedup": target, "met": None if target is None else target >= 5.0,
        "applies": bool(meta.get("N") == 4 and meta.get("numel") == models.PAPER_SIZES["resnet18"]),
    }
    return out


def render(result: dict, out_dir: str) -> None:
    runs, meta = result["runs"], result["meta"]
    h = headlines(result)
    result["headlines"] = h
    nets = sorted({json.dumps(r["network"], sort_keys=True) for r in runs})
    nets = sorted((json.loads(x) for x in nets), key=_bandwidth_key)
    lines = [
        "# Synthetic throughput benchmark (Horovod style)",
        "",
        f"N = {meta['N']} ranks, model: {meta['model']} stand-in ({meta['shape']}, {meta['numel']:,} "
        f"parameters, float32), batch {meta['batch_size']} per rank, {meta['num_warmup_batches']} "
        f"warm-up steps, {meta['num_iters']} iterations x {meta['num_batches_per_iter']} steps. "
        f"Emulated links: one-way delay {meta['delay_ms']:g} ms. Started {meta['started']}, "
        f"{meta.get('duration_s', 0):.0f} s; loadavg {meta['loadavg_start']} -> "
        f"{meta.get('loadavg_end')} on {meta.get('cpus')} CPUs.",
        "",
        "Step time = wall time of one forward + backward + `optimizer.step()` (mean over the "
        "iterations); comm/compress = median `last_stats` of rank 0 over the timed steps "
        "(Horovod's optimizer has none). Speedup = Horovod dense step time / this step time, same "
        "network.",
        "",
        "| network | method | CR | step ms | img/s per rank | total img/s | comm ms | compress ms | "
        "collectives | speedup vs dense |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for net in nets:
        lab = net["label"]
        dense = _find(runs, lab, "horovod", None) or _find(runs, lab, "dense", None)
        rows = [r for r in runs if r["network"]["label"] == lab]
        rows.sort(key=lambda r: (METHODS.index(r["method"]), -(r["cr"] or 2)))
        for r in rows:
            sp = dense["step_ms_mean"] / r["step_ms_mean"] if dense else None
            cr = "auto (" + ", ".join(sorted(r["crs_used"])) + ")" if r["method"] == "adaptive" else (
                "1" if r["cr"] is None else f"{r['cr']:g}")
            coll = ", ".join(f"{k} {v}" for k, v in sorted(r["collectives"].items())) or "-"
            lines.append(
                f"| {lab} | {r['method']} | {cr} | {_fmt(r['step_ms_mean'])} | "
                f"{r['img_sec_mean']:.1f} +-{r['img_sec_conf']:.1f} | {r['total_img_sec']:.1f} | "
                f"{_fmt(r['comm_ms_median'])} | {_fmt(r['compress_ms_median'])} | {coll} | {_fmt(sp, 2)} |")
    lines += ["", "## Headline ratios (this run)", ""]
    if h["flexible_vs_best_fixed"]:
        lines.append("Flexible step time / min(AG-Topk, AR-Topk STAR) step time (1.00 = as fast as the "
                     "better fixed collective):")
        lines.append("")
        for row in h["flexible_vs_best_fixed"]:
            coll = ", ".join(f"{k} {v}" for k, v in sorted(row["flexible_collectives"].items()))
            lines.append(f"- {row['network']}, CR {row['cr']:g}: {row['ratio']:.2f} "
                         f"(better fixed: {row['best_fixed']}; Flexible used {coll})")
        ratios = [row["ratio"] for row in h["flexible_vs_best_fixed"]]
        lines += [f"- median {statistics.median(ratios):.2f}, worst {max(ratios):.2f}", ""]
    for key, name in (("artopk_vs_dense", "AR-Topk (STAR)"), ("agtopk_vs_dense", "AG-Topk")):
        if h[key]:
            lines.append(f"{name} speedup over dense (dense step / {name} step):")
            lines.append("")
            for row in h[key]:
                lines.append(f"- {row['network']}, CR {row['cr']:g}: {row['speedup']:.2f}x "
                             f"(vs {row['dense']})")
            lines.append("")
    t = h["target"]
    if t["speedup"] is not None:
        verdict = "met" if t["met"] else "NOT met"
        applies = "" if t["applies"] else " (this run is not the target's configuration: N/size differ)"
        lines.append(f"Target: {t['text']}: measured {t['speedup']:.2f}x at {t['network']}: "
                     f"**{verdict}**{applies}.")
    else:
        lines.append(f"Target: {t['text']}: not measured in this run.")
    failed = [j for j in meta.get("jobs", []) if j["rc"] != 0]
    if failed:
        lines += ["", "Failed jobs: " + "; ".join(f"{j['network']['label']} rc {j['rc']} ({j['log']})"
                                                  for j in failed)]
    md = "\n".join(lines) + "\n"
    with open(os.path.join(out_dir, "synthetic.md"), "w") as fh:
        fh.write(md)
    with open(os.path.join(out_dir, "synthetic.json"), "w") as fh:
        json.dump(result, fh, indent=1)
    _plot(result, nets, os.path.join(out_dir, "synthetic.png"))
    print(md, flush=True)


def _plot(result: dict, nets: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = result["runs"]
    crs = sorted({r["cr"] for r in runs if r["cr"] is not None}, reverse=True) or [None]
    fig, axes = plt.subplots(1, len(crs), figsize=(5.2 * len(crs), 4.2), squeeze=False, sharey=True)
    xs = list(range(len(nets)))
    styles = {"horovod": ("k", "--", "s"), "dense": ("0.5", "--", "D"), "agtopk": ("C0", "-", "o"),
              "artopk-star": ("C1", "-", "^"), "artopk-var": ("C2", "-", "v"),
              "flexible": ("C3", "-", "*"), "adaptive": ("C4", ":", "P")}
    for ax, cr in zip(axes[0], crs):
        for method in METHODS:
            ys = []
            for net in nets:
                r = _find(runs, net["label"], method, cr)
                ys.append(r["step_ms_mean"] if r else float("nan"))
            if all(math.isnan(y) for y in ys):
                continue
            color, ls, marker = styles[method]
            ax.plot(xs, ys, color=color, linestyle=ls, marker=marker, label=method)
        ax.set_xticks(xs)
        ax.set_xticklabels([n["label"].replace(", ", "\n") for n in nets], fontsize=8)
        ax.set_yscale("log")
        ax.set_xlabel("network (bandwidth increases to the right)")
        ax.set_title("CR " + (f"{cr:g}" if cr is not None else "-") + " (dense/adaptive: no CR)",
                     fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("step time (ms, log)")
    axes[0][-1].legend(fontsize=7, loc="best")
    meta = result["meta"]
    fig.suptitle(f"Synthetic benchmark: N={meta['N']}, {meta['model']} stand-in "
                 f"({meta['numel']:,} params), batch {meta['batch_size']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------------


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    w = ap.add_argument_group("worker (under horovodrun)")
    w.add_argument("--model", default="resnet18",
                   help="stand-in size: resnet18, resnet50, alexnet, small, tiny or a parameter count")
    w.add_argument("--batch-size", type=int, default=32, help="input batch size per rank")
    w.add_argument("--num-warmup-batches", type=int, default=10)
    w.add_argument("--num-batches-per-iter", type=int, default=10)
    w.add_argument("--num-iters", type=int, default=10)
    w.add_argument("--method", default="dense", help=f"one or more (comma-separated) of {', '.join(METHODS)}")
    w.add_argument("--cr", type=float, nargs="+", default=[0.01],
                   help="compression ratio(s) of the top-k methods")
    w.add_argument("--seed", type=int, default=42)
    w.add_argument("--json", default=None, help="rank 0 appends one JSON record per method here")
    s = ap.add_argument_group("sweep (driver)")
    s.add_argument("--sweep", action="store_true", help="launch the worker on each network and summarise")
    s.add_argument("--quick", action="store_true", help="small sweep (< 3 min): N=2, 1M params, CR 0.01")
    s.add_argument("--render", metavar="JSON", help="only re-render the summary of a saved synthetic.json")
    s.add_argument("--out", default=os.path.join(launch.REPO, "results", "synthetic"))
    s.add_argument("--n", type=int, default=None, help="ranks (default 4, quick 2)")
    s.add_argument("--networks", nargs="+", default=None,
                   help="loopback | unlimited | a rate in Mbit/s (default: loopback 1000 100; "
                        "quick: loopback 100)")
    s.add_argument("--delay-ms", type=float, default=1.0, help="one-way delay of emulated links")
    s.add_argument("--methods", default=None, help="comma-separated subset of the methods (default: all)")
    s.add_argument("--model-sweep", default=None,
                   help="model size of the sweep (default resnet18, quick small)")
    s.add_argument("--cr-sweep", type=float, nargs="+", default=None, help="CRs (default 0.1 0.01 0.001)")
    s.add_argument("--batch-size-sweep", type=int, default=None)
    s.add_argument("--num-warmup-batches-sweep", type=int, default=None)
    s.add_argument("--num-iters-sweep", type=int, default=None)
    s.add_argument("--num-batches-per-iter-sweep", type=int, default=None)
    s.add_argument("--timeout-s", type=float, default=None, help="per network job (default 1500, quick 240)")
    return ap.parse_args(argv)


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    if args.render:
        return launch.rerender(args.render, render)
    if args.sweep or args.quick:
        return sweep(args)
    return worker(args)


if __name__ == "__main__":
    sys.exit(main())
