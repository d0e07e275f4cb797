"""Test bodies that run on every rank under ``horovodrun`` (called through ``tests/harness.py``).

Each body returns plain data (floats, lists, bools) that the pytest side checks.
"""

from __future__ import annotations

import math

import torch

import hvd_flexcomm


def _model(seed: int = 0, wide: int = 64) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(40, wide), torch.nn.Tanh(),
                               torch.nn.Linear(wide, wide * 4), torch.nn.Tanh(),
                               torch.nn.Linear(wide * 4, 3))


def _batch(step: int, rank: int, n: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(n, 40, generator=g), torch.randint(0, 3, (n,), generator=g)


def _train_step(model: torch.nn.Module, opt, step: int, rank: int, n: int = 64) -> torch.Tensor:
    """One training step on this rank's batch of ``step`` (``_batch``); the loss."""
    x, y = _batch(step, rank, n=n)
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return loss


def _flat(params) -> torch.Tensor:
    return torch.cat([p.grad.reshape(-1) if p.grad is not None else torch.zeros(p.numel())
                      for p in params])


def _mode(kind: str, cr: float, granularity: str = "model", bucket_cap_mb: float = 25.0):
    if kind == "ag":
        return hvd_flexcomm.AGTopk(cr=cr, granularity=granularity, bucket_cap_mb=bucket_cap_mb)
    if kind in ("star", "var"):
        return hvd_flexcomm.ARTopk(cr=cr, selector=kind, granularity=granularity,
                                   bucket_cap_mb=bucket_cap_mb)
    if kind == "dense":
        return hvd_flexcomm.Dense()
    if kind in ("flex", "flex_probes"):
        # a budget of 10x the step communication: localhost refreshes every 4 steps, on real
        # steps of the path not in use ("flex") or by timed probes ("flex_probes")
        return hvd_flexcomm.Flexible(cr=cr, hysteresis=0.0, reprobe_interval=4, probe_repeats=1,
                                     probe_budget=10.0,
                                     reprobe_by="probes" if kind == "flex_probes" else "steps")
    raise ValueError(kind)


def _reference_step(kind: str, fed: torch.Tensor, k: int, step: int):
    """Reference aggregation of one message from every rank's error-fed vector ``fed`` (n, numel).
    Returns (sum over ranks of what is sent, new residuals (n, numel), root)."""
    n = fed.shape[0]
    total = torch.zeros(fed.shape[1])
    residuals = fed.clone()
    if kind == "ag":
        for r in range(n):
            idx = torch.topk(fed[r].abs(), k).indices
            total[idx] += fed[r][idx]
            residuals[r][idx] = 0
        return total, residuals, None
    if kind == "star":
        root = step % n
    else:
        norms = [float(fed[r][torch.topk(fed[r].abs(), k).indices].pow(2).sum()) for r in range(n)]
        root = max(range(n), key=lambda r: (norms[r], -r))
    idx = torch.topk(fed[root].abs(), k).indices
    total[idx] = fed[:, idx].sum(0)
    residuals[:, idx] = 0
    return total, residuals, root


def compressed_matches_reference(kind: str, cr: float, steps: int = 6, wide: int = 64,
                                 granularity: str = "model", bucket_cap_mb: float = 25.0,
                                 passes: int = 1) -> dict:
    """Train a few steps; on every step compare the aggregated gradient and this rank's residual
    of every message with a reference computed from all ranks' raw gradients (gathered densely).
    ``passes`` > 1 accumulates that many backward passes per step."""
    import horovod.torch as hvd

    n, rank = hvd.size(), hvd.rank()
    model = _model(wide=wide)
    opt = hvd_flexcomm.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.05), named_parameters=model.named_parameters(),
        compression=_mode(kind, cr, granularity, bucket_cap_mb), backward_passes_per_step=passes)
    messages = opt._flex_messages
    ref_res = [torch.zeros(n, m.numel) for m in messages]
    max_err, max_res_err, roots, stats = 0.0, 0.0, [], []
    for step in range(steps):
        opt.zero_grad()
        for p in range(passes):
            x, y = _batch(step * 10 + p, rank)
            torch.nn.functional.cross_entropy(model(x), y).backward()
        step_roots = []
        candidates = []
        for i, m in enumerate(messages):
            raw = hvd.allgather(_flat(m.params).unsqueeze(0), name=f"ref.raw.{step}.{i}")
            k = hvd_flexcomm.k_for(cr, m.numel)
            kinds = ("ag", "star") if kind.startswith("flex") else (kind,)
            candidates.append({kd: _reference_step(kd, raw + ref_res[i], k, step) for kd in kinds})
        opt.synchronize()
        used = kind
        if kind.startswith("flex"):
            used = "ag" if opt.last_stats["collective"] == "allgather" else "star"
        expected = []
        for i, cand in enumerate(candidates):
            total, ref_res[i], root = cand[used]
            expected.append(total / n)
            step_roots.append(root)
        for i, m in enumerate(messages):
            max_err = max(max_err, float((_flat(m.params) - expected[i]).abs().max()))
            max_res_err = max(max_res_err, float((m.residual - ref_res[i][rank]).abs().max()))
        roots.append((opt.last_stats["root_rank"], step_roots[0]))
        stats.append(dict(opt.last_stats))
        with opt.skip_synchronize():
            opt.step()
    return {"max_err": max_err, "max_res_err": max_res_err, "roots": roots,
            "messages": len(messages), "stats": stats}


def flexible_matches_reference(cr: float = 0.05, steps: int = 12) -> dict:
    """Flexible: every step equals the reference of the path it took; paths are the same on
    every rank (gathered from every rank's last_stats). Refreshes on real steps (the default),
    and under ``"by_probes"`` the same with ``reprobe_by="probes"``."""
    import horovod.torch as hvd

    r = compressed_matches_reference("flex", cr, steps)
    r["by_probes"] = compressed_matches_reference("flex_probes", cr, steps)
    for i, run in enumerate((r, r["by_probes"])):
        codes = torch.tensor([1.0 if s["collective"] == "allgather" else 2.0
                              for s in run["stats"]])
        everyone = hvd.allgather(codes.unsqueeze(0), name=f"flex.paths.{i}")
        run["paths_agree"] = bool((everyone == everyone[0]).all())
    r["probe_ops"] = _probe_op_counts(hvd)
    return r


class _CountingHorovod:
    """Real Horovod, with the collectives the probes call counted (``calls[op]``)."""

    def __init__(self, hvd) -> None:
        self._hvd, self.calls = hvd, {}

    def __getattr__(self, name):
        real = getattr(self._hvd, name)
        if name not in ("allgather", "broadcast_", "allreduce_", "allgather_async",
                        "broadcast_async_", "allreduce_async_"):
            return real

        def counted(*args, **kwargs):
            self.calls[name] = self.calls.get(name, 0) + 1
            return real(*args, **kwargs)
        return counted


def _probe_op_counts(hvd) -> list:
    """The same probe plan twice with one ``warmed`` set, then under new names without warm-ups
    and with one count of timings per entry, on real collectives: (ops run, timings returned,
    all positive) each time; only the first pays a warm-up op per size."""
    from hvd_flexcomm.probing import run_probes

    # the first broadcast is timed in pairs with the allreduce after it, the last with a barrier
    plan = [("allgather", 4000), ("broadcast", 400), ("allreduce", 4000), ("allreduce", 400),
            ("broadcast", 4000)]
    warmed: set = set()
    out = []
    for warm_up in (True, True, False):
        counting = _CountingHorovod(hvd)
        results = run_probes(counting, plan, 2 if warm_up else [1, 2, 2, 1, 1], warmed=warmed,
                             tag="test" + str(warm_up), warm_up=warm_up)
        out.append((sum(counting.calls.values()), len(results),
                    all(ms > 0 for _, _, ms in results)))
    return out


def all_modes_match_reference(cr: float = 0.05, steps: int = 5) -> dict:
    """AG, STAR and VAR (model granularity) and AG/STAR with buckets, in one launch."""
    out = {}
    for kind in ("ag", "star", "var"):
        out[kind] = compressed_matches_reference(kind, cr, steps)
    for kind in ("ag", "star"):
        out[kind + "_bucket"] = compressed_matches_reference(kind, cr, steps, granularity="bucket",
                                                             bucket_cap_mb=0.02)
    return out


def cr_one_equals_horovod(steps: int = 5) -> dict:
    """cr = 1 (AG and AR) and Dense() train exactly like hvd.DistributedOptimizer."""
    import horovod.torch as hvd

    def run(make):
        model = _model(seed=3)
        opt = make(model)
        for step in range(steps):
            x, y = _batch(step, hvd.rank())
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        return torch.cat([p.detach().reshape(-1) for p in model.parameters()]), opt

    def sgd(model):
        return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    ref, _ = run(lambda m: hvd.DistributedOptimizer(sgd(m), named_parameters=m.named_parameters()))
    diffs, paths = {}, {}
    for name, mode in (("dense", hvd_flexcomm.Dense()), ("ag1", hvd_flexcomm.AGTopk(cr=1.0)),
                       ("star1", hvd_flexcomm.ARTopk(cr=1.0)),
                       ("var1", hvd_flexcomm.ARTopk(cr=1.0, selector="var"))):
        got, opt = run(lambda m, mode=mode: hvd_flexcomm.DistributedOptimizer(
            sgd(m), named_parameters=m.named_parameters(), compression=mode))
        diffs[name] = float((got - ref).abs().max())
        paths[name] = opt.last_stats["collective"]
    return {"diffs": diffs, "paths": paths}


def disagreeing_config(what: str) -> str:
    """Ranks differ in cr / compressor / selector / an Adaptive option / parameter names: every
    rank must raise ValueError."""
    import horovod.torch as hvd

    rank = hvd.rank()
    model = _model()
    named = list(model.named_parameters())
    mode = hvd_flexcomm.ARTopk(cr=0.01)
    if what == "cr":
        mode = hvd_flexcomm.ARTopk(cr=0.01 if rank == 0 else 0.02)
    elif what == "compressor":
        mode = hvd_flexcomm.ARTopk(cr=0.01) if rank == 0 else hvd_flexcomm.AGTopk(cr=0.01)
    elif what == "names":
        named = [((f"r{rank}." if rank == 1 else "") + k, v) for k, v in named]
    elif what == "selector":
        mode = hvd_flexcomm.ARTopk(cr=0.01, selector="star" if rank == 0 else "var")
    elif what == "sync_every":  # an option describe() leaves out
        mode = hvd_flexcomm.Adaptive(sync_every=1 if rank == 0 else 2)
    opt = hvd_flexcomm.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                            named_parameters=named, compression=mode)
    x, y = _batch(0, rank)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    return "no error"


def accumulation_overflow_raises() -> str:
    """More backward passes than backward_passes_per_step raises Horovod's AssertionError."""
    import horovod.torch as hvd

    model = _model()
    hvd_flexcomm.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                      named_parameters=model.named_parameters(),
                                      compression=hvd_flexcomm.AGTopk(cr=0.1),
                                      backward_passes_per_step=2)
    for step in range(3):
        x, y = _batch(step, hvd.rank())
        try:
            torch.nn.functional.cross_entropy(model(x), y).backward()
        except AssertionError as exc:
            return f"step {step}: {exc}"
    return "no error"


class _Odd(torch.nn.Module):
    """A model with a frozen layer, a layer unused in forward, and a sparse embedding."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.emb = torch.nn.Embedding(50, 8, sparse=True)
        self.frozen = torch.nn.Linear(8, 8)
        self.frozen.requires_grad_(False)
        self.head = torch.nn.Linear(8, 3)
        self.unused = torch.nn.Linear(8, 8)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.frozen(self.emb(tokens).mean(1))))


def odd_parameters(kind: str) -> dict:
    """Frozen params stay frozen, unused params get zero grads, sparse grads are handled; the
    gradient-clipping pattern (synchronize, clip, skip_synchronize, step) works."""
    import horovod.torch as hvd

    model = _Odd()
    frozen_before = model.frozen.weight.detach().clone()
    unused_before = model.unused.weight.detach().clone()
    opt = hvd_flexcomm.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                            named_parameters=model.named_parameters(),
                                            compression=_mode(kind, 0.2))
    losses = []
    for step in range(4):
        g = torch.Generator().manual_seed(step * 7 + hvd.rank())
        tokens = torch.randint(0, 50, (16, 5), generator=g)
        y = torch.randint(0, 3, (16,), generator=g)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(tokens), y)
        loss.backward()
        opt.synchronize()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        with opt.skip_synchronize():
            opt.step()
        losses.append(float(loss))
    return {
        "frozen_unchanged": bool(torch.equal(model.frozen.weight, frozen_before)),
        "unused_unchanged": bool(torch.equal(model.unused.weight, unused_before)),
        "emb_grad_is_sparse": bool(model.emb.weight.grad.is_sparse),
        "losses_finite": all(math.isfinite(v) for v in losses),
        "params_equal_across_ranks": _params_agree(model),
    }


def two_optimizers_one_backward(kind: str = "ag", cr: float = 0.05, steps: int = 4) -> dict:
    """A backbone's and a head's parameters under two top-k optimizers (their own learning
    rates, the usual reason), buckets sent during one backward pass: both optimizers' messages
    are in flight together. Every step, each message's aggregate is compared with the reference
    of its own error-fed gradients."""
    import horovod.torch as hvd

    n, rank = hvd.size(), hvd.rank()
    model = _model()
    named = list(model.named_parameters())
    parts = {"backbone": named[:4], "head": named[4:]}
    opts = {part: hvd_flexcomm.DistributedOptimizer(
        torch.optim.SGD([p for _, p in params], lr=0.05), named_parameters=params,
        compression=_mode(kind, cr, "bucket", bucket_cap_mb=0.02))
        for part, params in parts.items()}
    messages = [(part, m) for part, opt in opts.items() for m in opt._flex_messages]
    ref_res = [torch.zeros(n, m.numel) for _, m in messages]
    max_err = 0.0
    for step in range(steps):
        for opt in opts.values():
            opt.zero_grad()
        x, y = _batch(step, rank)
        # the raw gradients, gathered before the optimizers' own collectives complete
        torch.nn.functional.cross_entropy(model(x), y).backward()
        expected = []
        for i, (_, m) in enumerate(messages):
            raw = hvd.allgather(_flat(m.params).unsqueeze(0), name=f"two.raw.{step}.{i}")
            total, ref_res[i], _ = _reference_step(kind, raw + ref_res[i],
                                                   hvd_flexcomm.k_for(cr, m.numel), step)
            expected.append(total / n)
        for opt in opts.values():
            opt.synchronize()
        for i, (_, m) in enumerate(messages):
            max_err = max(max_err, float((_flat(m.params) - expected[i]).abs().max()))
        for opt in opts.values():
            with opt.skip_synchronize():
                opt.step()
    return {"max_err": max_err, "messages": {part: len(opt._flex_messages)
                                             for part, opt in opts.items()},
            "names_distinct": len({m.name for _, m in messages}) == len(messages),
            "params_agree": _params_agree(model)}


def _params_agree(model: torch.nn.Module) -> bool:
    import horovod.torch as hvd

    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    everyone = hvd.allgather(flat.unsqueeze(0), name="agree.check")
    return bool((everyone - everyone[0]).abs().max() == 0)


def nonfinite_step_is_skipped(kind: str) -> dict:
    """A NaN in rank 1's gradient at step 2: every rank skips that step, keeps its residual."""
    import horovod.torch as hvd

    model = _model()
    opt = hvd_flexcomm.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                            named_parameters=model.named_parameters(),
                                            compression=_mode(kind, 0.05))
    out = {"skipped": [], "params_unchanged_on_skip": None, "residual_kept": None}
    for step in range(4):
        x, y = _batch(step, hvd.rank())
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        if step == 2 and hvd.rank() == 1:
            next(model.parameters()).grad[0, 0] = float("nan")
        before = [p.detach().clone() for p in model.parameters()]
        residual_before = opt._flex_messages[0].residual.clone()
        opt.step()
        out["skipped"].append(opt.last_stats["skipped"])
        if step == 2:
            out["nonfinite_ranks"] = opt.last_stats["nonfinite_ranks"]
            out["params_unchanged_on_skip"] = all(
                torch.equal(a, b) for a, b in zip(before, model.parameters()))
            out["residual_kept"] = bool(torch.equal(residual_before,
                                                    opt._flex_messages[0].residual))
    out["params_agree"] = _params_agree(model)
    out["finite"] = all(bool(torch.isfinite(p).all()) for p in model.parameters())
    return out


def checkpoint_resume(kind: str, steps: int = 8) -> float:
    """Run 8 steps; vs run 4, save (per rank), rebuild model + optimizer, load, run 4: the
    parameters are identical."""
    import io

    import horovod.torch as hvd

    def build():
        model = _model(seed=5)
        opt = hvd_flexcomm.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
            named_parameters=model.named_parameters(), compression=_mode(kind, 0.05))
        return model, opt

    def run(model, opt, first, last):
        for step in range(first, last):
            x, y = _batch(step, hvd.rank())
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()

    model, opt = build()
    run(model, opt, 0, steps)
    straight = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    model, opt = build()
    run(model, opt, 0, steps // 2)
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, buf)
    buf.seek(0)
    model, opt = build()
    saved = torch.load(buf, weights_only=False)
    model.load_state_dict(saved["model"])
    opt.load_state_dict(saved["optimizer"])
    run(model, opt, steps // 2, steps)
    resumed = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return float((straight - resumed).abs().max())


def train_accuracy(runs: list, epochs: int = 2, train_size: int = 0) -> dict:
    """Train LeNet-5 on real Fashion-MNIST once per compression in ``runs``; final accuracies."""
    from hvd_flexcomm.training import TrainConfig, train

    out = {}
    for spec in runs:
        kind, cr = spec.split(":")
        cfg = TrainConfig(compression=kind, cr=float(cr), epochs=epochs, train_size=train_size,
                          lr=0.01, batch_size=64)
        res = train(cfg)
        out[spec] = {"acc": res.final_test_accuracy, "collectives": res.collectives,
                     "wall_s": res.wall_s}
    return out


def adaptive_run(steps: int = 160, warmup: int = 30, n_gen: int = 300) -> dict:
    """Adaptive on a small model: per-step CRs (every rank reports its own), solver windows and
    step completion times on rank 0, the controller's channel."""
    import time

    import horovod.torch as hvd

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(40, 256), torch.nn.Tanh(), torch.nn.Linear(256, 3))
    mode = hvd_flexcomm.Adaptive(cr=0.1, warmup_steps=warmup, gain_every=5, min_interval=40,
                                 sync_every=5, n_gen=n_gen, reprobe_interval=0, probe_repeats=1,
                                 min_cr_change=0, min_tta_gain=0,  # every solve announced: the
                                 # channel is tested
                                 span_every=20)
    opt = hvd_flexcomm.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                            named_parameters=model.named_parameters(),
                                            compression=mode)
    crs, paths, spans, colds, probes, step_end = [], [], [], [], [], []
    ctrl = opt._flex_adaptive
    step = 0
    # a fixed number of steps, then on until the solver's CR is announced and has run one route
    # step (a busy machine may need longer; the step a CR takes effect at can be a span step,
    # which runs at an end of the candidates under names of its own); ``ctrl.changes`` and the
    # span flags are the same on every rank, so every rank stops together
    def solved_cr_ran() -> bool:
        return bool(ctrl.changes) and not all(spans[ctrl.changes[0][0]:])

    while step < steps or (not solved_cr_ran() and step < 40 * steps):
        _train_step(model, opt, step, hvd.rank())
        crs.append(opt.last_stats["cr"])
        paths.append(opt.last_stats["collective"])
        spans.append(opt.last_stats["span"])
        colds.append(opt.last_stats.get("cold", False))
        probes.append(opt.last_stats.get("probe_kind"))
        step_end.append(time.perf_counter())
        step += 1
    everyone = hvd.allgather(torch.tensor([crs], dtype=torch.float64), name="adaptive.crs")
    solves = [dict(s) for s in ctrl.solves if s["end"] is not None]  # finished ones
    steps_during = [sum(1 for t in step_end if s["start"] < t < s["end"]) for s in solves]
    state = opt.state_dict()["hvd_flexcomm"]["adaptive"]
    return {"crs": crs, "paths": paths, "spans": spans, "colds": colds, "probes": probes,
            "span_moves": opt._flex_controller.n_span_moves,
            "span_confirms": opt._flex_controller.n_span_confirms,
            "span_offs": opt._flex_controller.n_span_offs,
            "crs_agree": bool((everyone == everyone[0]).all()),
            "channel": ctrl.channel, "changes": ctrl.changes, "solves": len(solves),
            "submitted": len(ctrl.solves), "announcements": ctrl.n_announcements,
            "solve_s": [s["end"] - s["start"] for s in solves],
            "steps_during_solves": steps_during, "failed": ctrl.failed,
            "state_has_gains": state["gains"]["smoothed"] is not None if hvd.rank() == 0 else None,
            "compress_steps": {c: len(v) for c, v in ctrl.compress_samples_ms.items()},
            "solves_compress_ms": [s["compress_ms"] for s in ctrl.solves],
            "solve_steps": [s["step"] for s in ctrl.solves],
            "last_result": state["last_result"]}


def adaptive_first_cr(steps: int = 12) -> dict:
    """``Adaptive()`` (no starting CR, no warm-up) on real collectives: the CR of each step as
    every rank reports it, and rank 0's record of the pick at the start-up probe."""
    import horovod.torch as hvd

    from hvd_flexcomm.moo import pick_on_grid

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(40, 256), torch.nn.Tanh(), torch.nn.Linear(256, 3))
    mode = hvd_flexcomm.Adaptive(reprobe_interval=0)
    opt = hvd_flexcomm.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                            named_parameters=model.named_parameters(),
                                            compression=mode)
    ctrl = opt._flex_adaptive
    crs, spans, probes = [], [], []
    for step in range(steps):
        _train_step(model, opt, step, hvd.rank())
        crs.append(opt.last_stats["cr"])
        spans.append(opt.last_stats["span"])
        probes.append(opt.last_stats.get("probe_kind"))
    out = {"crs": crs, "spans": spans, "probes": probes, "changes": ctrl.changes,
           "starting_cr": mode.cr, "announced_cr": ctrl.announced_cr, "solves": []}
    if hvd.rank() == 0:
        first = ctrl.solves[0]
        again = pick_on_grid(first["crs"], first["comm_ms"], first["gains"], mode.c_low,
                             mode.c_high, mode.weights, other_ms=first["other_ms"], pick="tta")
        out["solves"] = [{k: s[k] for k in ("step", "reason", "cr", "other_ms")}
                         for s in ctrl.solves]
        out["recomputed_cr"] = float(f"{again.cr:.4g}")
        out["kept"] = ctrl.n_kept
    return out


def adaptive_start_by_steps(steps: int = 16) -> dict:
    """``Adaptive(start_by="steps")`` on real collectives: per step, the CR, path, span flag and
    probe kind every rank reports; the controller's start count and fitted lines; rank 0's
    solves."""
    import horovod.torch as hvd

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(40, 256), torch.nn.Tanh(), torch.nn.Linear(256, 3))
    mode = hvd_flexcomm.Adaptive(start_by="steps", reprobe_interval=0)
    opt = hvd_flexcomm.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                            named_parameters=model.named_parameters(),
                                            compression=mode)
    rows = []
    for step in range(steps):
        _train_step(model, opt, step, hvd.rank())
        stats = opt.last_stats
        rows.append((stats["cr"], stats["collective"], stats["span"], stats.get("probe_kind")))
    flex, adaptive = opt._flex_controller, opt._flex_adaptive
    return {"rows": rows, "starting_cr": mode.cr, "n_step_starts": flex.n_step_starts,
            "calibrated": flex.model.is_calibrated(), "n_full_probes": flex.n_full_probes,
            "fits": {kind: (fit.a_ms, fit.b_ms_per_byte) for kind, fit in flex.model.fits.items()},
            "solves": [(s["step"], s["reason"]) for s in adaptive.solves]}


def spans_after_drift(steps: int = 70, drift_at: int = 30) -> dict:
    """Adaptive on real collectives, with the state a drift probe leaves (``span_other_due``, a
    span due at ``drift_at``) set alike on every rank at ``drift_at``: the span on the path in
    use, then the span on the other sparse path. Per step: CR, the path it ran on, the route
    (``ctrl.path``), the span flag; the loss, the model version."""
    import horovod.torch as hvd

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(40, 256), torch.nn.Tanh(), torch.nn.Linear(256, 3))
    mode = hvd_flexcomm.Adaptive(cr=0.01, warmup_steps=0, gain_every=5, min_interval=10_000,
                                 reprobe_interval=0, probe_repeats=1, span_every=10_000,
                                 probe_budget=1.0,  # the spans' extra time never waits here
                                 drift_threshold=0.99, drift_patience=32)  # no real drift
    opt = hvd_flexcomm.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                            named_parameters=model.named_parameters(),
                                            compression=mode)
    ctrl = opt._flex_controller
    # no real drift: a drift probe of its own (a loaded machine can time its steps at twice the
    # start-up probe's prediction for drift_patience steps) would re-route at its step, and the
    # test's spans would start on a path the rows do not show
    ctrl.drift.threshold = math.inf
    rows, losses, versions, probes, base_crs = [], [], [], [], []
    for step in range(steps):
        if step == drift_at:
            ctrl.span_other_due, ctrl.span_soon_step = True, step
        loss = _train_step(model, opt, step, hvd.rank())
        stats = opt.last_stats
        rows.append((stats["cr"], stats["collective"], ctrl.path, stats["span"]))
        losses.append(float(loss))
        versions.append(ctrl.model_version)
        probes.append(stats["probe_kind"])
        base_crs.append(opt._flex_base_cr)  # the CR in use (a span step's row shows the span's)
    params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    everyone = hvd.allgather(params[None], name="spans_after_drift.params")
    return {"rows": rows, "losses": losses, "versions": versions, "probes": probes,
            "base_crs": base_crs,
            "params_agree": bool((everyone == everyone[0]).all()),
            "span_moves": ctrl.n_span_moves}


def desynchronised_step_is_caught(kind: str = "ag") -> str:
    """Rank 1's step counter jumps (as a bug would make it): the periodic agreement check must
    stop every rank with the same error before gradients mix."""
    import horovod.torch as hvd

    model = _model()
    opt = hvd_flexcomm.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                            named_parameters=model.named_parameters(),
                                            compression=_mode(kind, 0.05))
    for step in range(12):
        if step == 5 and hvd.rank() == 1:
            opt._flex_step += 1
        x, y = _batch(step, hvd.rank())
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return "no error"


def _resume_build(kind: str):
    model = _model(seed=5)
    opt = hvd_flexcomm.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        named_parameters=model.named_parameters(), compression=_mode(kind, 0.05))
    return model, opt


def _resume_run(model, opt, first: int, last: int) -> None:
    import horovod.torch as hvd

    for step in range(first, last):
        x, y = _batch(step, hvd.rank())
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()


def checkpoint_save(kind: str, folder: str, steps: int = 8) -> list:
    """Launch 1: an uninterrupted run of ``steps`` steps (its parameters are returned), then a
    fresh run of half as many steps saved the Horovod way: rank 0 saves the model, every rank
    saves its own optimizer state (residuals are per rank)."""
    import horovod.torch as hvd

    model, opt = _resume_build(kind)
    _resume_run(model, opt, 0, steps)
    straight = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).tolist()
    model, opt = _resume_build(kind)
    _resume_run(model, opt, 0, steps // 2)
    if hvd.rank() == 0:
        torch.save(model.state_dict(), f"{folder}/model.pt")
    torch.save(opt.state_dict(), f"{folder}/optimizer-rank{hvd.rank()}.pt")
    return straight


def checkpoint_load(kind: str, folder: str, steps: int = 8) -> list:
    """Launch 2 (new processes): load rank 0's model (broadcast) and this rank's optimizer
    state, run the remaining steps, return the parameters."""
    import horovod.torch as hvd

    model, opt = _resume_build(kind)
    if hvd.rank() == 0:
        model.load_state_dict(torch.load(f"{folder}/model.pt"))
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt.load_state_dict(torch.load(f"{folder}/optimizer-rank{hvd.rank()}.pt", weights_only=False))
    _resume_run(model, opt, steps // 2, steps)
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).tolist()


def flexible_training_on_lossy_link(steps: int = 60) -> dict:
    """Flexible training over a lossy, jittery link: it must still train correctly (TCP
    retransmits), agree across ranks, and not flap between collectives."""
    model = _model(wide=128)
    opt = hvd_flexcomm.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters(),
        compression=hvd_flexcomm.Flexible(cr=0.05, probe_repeats=2))
    import horovod.torch as hvd

    losses, paths, exploring = [], [], []
    x, y = _batch(0, hvd.rank(), n=128)  # a fixed batch: the loss must fall
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(float(loss))
        paths.append(opt.last_stats["collective"])
        exploring.append(bool(opt.last_stats["exploring"]))
    # flapping is the route's: an exploring step (after start-up, a recheck, a re-measure) runs
    # the other path by design and is not a switch of the route
    route = [p for p, e in zip(paths, exploring) if not e]
    switches = sum(a != b for a, b in zip(route, route[1:]))
    return {"first_loss": losses[0], "last_loss": losses[-1], "switches": switches,
            "paths": paths, "exploring": exploring, "params_agree": _params_agree(model),
            "probes": opt._flex_controller.n_full_probes}
