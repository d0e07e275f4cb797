"""Fault-injection bodies run on every rank under ``horovodrun`` (see ``tests/test_faults.py``).

Each body returns plain data the pytest side checks, or raises / exits on purpose.
"""

from __future__ import annotations

import os
import sys
import time

import torch

import hvd_flexcomm


def mark(rank: int, event: str) -> None:
    """Write ``fault_bodies: rank R EVENT at t=<unix time>`` to stderr (flushed): the test measures
    how long the job took to end after the fault, independently of the launch's start-up time."""
    sys.stderr.write(f"fault_bodies: rank {rank} {event} at t={time.time():.3f}\n")
    sys.stderr.flush()


def _model(seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.Tanh(), torch.nn.Linear(32, 3))
    return model.to(dtype)


def _batch(step: int, rank: int, dtype: torch.dtype = torch.float32):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(16, 20, generator=g).to(dtype), torch.randint(0, 3, (16,), generator=g)


def _backward(model: torch.nn.Module, step: int, rank: int, dtype: torch.dtype = torch.float32) -> None:
    x, y = _batch(step, rank, dtype)
    torch.nn.functional.cross_entropy(model(x), y).backward()


def _mode(kind: str, cr: float):
    if kind == "ag":
        return hvd_flexcomm.AGTopk(cr=cr)
    if kind in ("star", "var"):
        return hvd_flexcomm.ARTopk(cr=cr, selector=kind)
    raise ValueError(kind)


def _train_with_fault(kind: str, cr: float, steps: int, fault_rank: int, fault_step: int,
                      fault) -> dict:
    """Train ``steps`` steps; ``fault(rank, step)`` runs on ``fault_rank`` at ``fault_step``, after
    its backward pass and right before ``opt.step()`` (the other ranks are already inside the
    step's collectives)."""
    import horovod.torch as hvd

    rank = hvd.rank()
    model = _model()
    opt = hvd_flexcomm.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                            named_parameters=model.named_parameters(),
                                            compression=_mode(kind, cr))
    for step in range(steps):
        opt.zero_grad()
        _backward(model, step, rank)
        if step == fault_step and rank == fault_rank:
            fault(rank, step)
        opt.step()
    return {"completed_steps": steps}


def die_mid_step(kind: str = "star", cr: float = 0.05, die_rank: int = 1, die_step: int = 3,
                 code: int = 3, steps: int = 6) -> dict:
    """Train; ``die_rank`` calls ``os._exit(code)`` right before ``opt.step()`` at ``die_step``."""
    def die(rank: int, step: int) -> None:
        sys.stdout.flush()
        mark(rank, f"exits with code {code} at step {step}")
        os._exit(code)

    return _train_with_fault(kind, cr, steps, die_rank, die_step, die)


def raise_mid_step(kind: str = "star", cr: float = 0.05, bad_rank: int = 1, bad_step: int = 3,
                   steps: int = 6) -> dict:
    """Like :func:`die_mid_step`, but ``bad_rank`` raises a Python exception instead (the rank
    writes its traceback and exits 1 through ``tests/rank_main.py``)."""
    def fail(rank: int, step: int) -> None:
        mark(rank, "raises")
        raise RuntimeError(f"injected failure on rank {rank} at step {step}")

    return _train_with_fault(kind, cr, steps, bad_rank, bad_step, fail)


def bad_construction(case: str) -> str:
    """Build a DistributedOptimizer with a bad argument (identical on every rank)."""
    import horovod.torch as hvd

    model = _model()
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    named = model.named_parameters()
    kwargs: dict = {}
    mark(hvd.rank(), "constructs")
    if case == "cr_nan":
        kwargs["compression"] = hvd_flexcomm.AGTopk(cr=float("nan"))
    elif case == "cr_zero":
        kwargs["compression"] = hvd_flexcomm.AGTopk(cr=0)
    elif case == "cr_1.5":
        kwargs["compression"] = hvd_flexcomm.AGTopk(cr=1.5)
    elif case == "cr_negative":
        kwargs["compression"] = hvd_flexcomm.ARTopk(cr=-0.1)
    elif case == "cr_string":
        kwargs["compression"] = hvd_flexcomm.AGTopk(cr="0.1")
    elif case == "cr_bool":
        kwargs["compression"] = hvd_flexcomm.AGTopk(cr=True)
    elif case == "selector_bogus":
        kwargs["compression"] = hvd_flexcomm.ARTopk(cr=0.1, selector="bogus")
    elif case == "granularity_bogus":
        kwargs["compression"] = hvd_flexcomm.AGTopk(cr=0.1, granularity="layer")
    elif case == "bucket_cap_zero":
        kwargs["compression"] = hvd_flexcomm.AGTopk(cr=0.1, bucket_cap_mb=0)
    elif case == "compression_string":
        kwargs["compression"] = "topk"
    elif case == "bpps_zero":
        kwargs.update(compression=hvd_flexcomm.AGTopk(cr=0.1), backward_passes_per_step=0)
    elif case == "adasum_topk":
        kwargs.update(compression=hvd_flexcomm.ARTopk(cr=0.1), op=hvd.Adasum)
    elif case == "groups_topk":
        kwargs.update(compression=hvd_flexcomm.AGTopk(cr=0.1), groups=2)
    elif case == "predivide_sum":
        kwargs.update(compression=hvd_flexcomm.AGTopk(cr=0.1), op=hvd.Sum,
                      gradient_predivide_factor=2.0)
    elif case == "not_an_optimizer":
        sgd = model
        kwargs["compression"] = hvd_flexcomm.AGTopk(cr=0.1)
    else:
        raise KeyError(case)
    hvd_flexcomm.DistributedOptimizer(sgd, named_parameters=named, **kwargs)
    return "no error"


def bad_constructions(cases: list) -> dict:
    """:func:`bad_construction` for every case; returns ``{case: (exception type, message)}``
    (or ``("none", "no error")``). No collective runs at construction, so catching is safe."""
    out = {}
    for case in cases:
        try:
            out[case] = ("none", bad_construction(case))
        except Exception as exc:  # noqa: BLE001 - reported to the test
            out[case] = (type(exc).__name__, str(exc))
    return out


def bad_cr_on_one_rank(bad_rank: int = 1, steps: int = 3) -> dict:
    """Only ``bad_rank`` passes cr=NaN: it raises at construction; the others reach the first
    step's configuration check, whose peer is gone."""
    import horovod.torch as hvd

    rank = hvd.rank()
    model = _model()
    cr = float("nan") if rank == bad_rank else 0.05
    mark(rank, "constructs")
    opt = hvd_flexcomm.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                            named_parameters=model.named_parameters(),
                                            compression=hvd_flexcomm.AGTopk(cr=cr))
    for step in range(steps):
        opt.zero_grad()
        _backward(model, step, rank)
        opt.step()
    return {"completed_steps": steps}


def every_rank_disagrees(kind: str = "star") -> str:
    """Every rank passes a different cr (0.01 * (rank + 1)): every rank must raise ValueError at
    the first step's configuration check."""
    import horovod.torch as hvd

    rank = hvd.rank()
    model = _model()
    opt = hvd_flexcomm.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                            named_parameters=model.named_parameters(),
                                            compression=_mode(kind, 0.01 * (rank + 1)))
    _backward(model, 0, rank)
    mark(rank, "steps")
    opt.step()
    return "no error"


def nonfinite_at_step(kind: str = "ag", nan_rank: int = 0, nan_step: int = 1, steps: int = 4,
                      value: str = "nan") -> dict:
    """Put a NaN (or +inf) into ``nan_rank``'s gradient at ``nan_step``; record every step's
    ``last_stats`` and whether the skipped step left parameters and residuals alone."""
    import horovod.torch as hvd

    rank = hvd.rank()
    model = _model()
    opt = hvd_flexcomm.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                            named_parameters=model.named_parameters(),
                                            compression=_mode(kind, 0.05))
    out: dict = {"skipped": [], "nonfinite_ranks": [], "params_unchanged_on_skip": None,
                 "residual_kept": None}
    for step in range(steps):
        opt.zero_grad()
        _backward(model, step, rank)
        if step == nan_step and rank == nan_rank:
            next(model.parameters()).grad[0, 0] = float(value)
        before = [p.detach().clone() for p in model.parameters()]
        residuals = [m.residual.clone() for m in opt._flex_messages]
        opt.step()
        out["skipped"].append(opt.last_stats["skipped"])
        out["nonfinite_ranks"].append(opt.last_stats["nonfinite_ranks"])
        if step == nan_step:
            out["params_unchanged_on_skip"] = all(
                torch.equal(a, b) for a, b in zip(before, model.parameters()))
            out["residual_kept"] = all(torch.equal(a, m.residual)
                                       for a, m in zip(residuals, opt._flex_messages))
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    everyone = hvd.allgather(flat.unsqueeze(0), name="fault.agree")
    out["params_agree"] = bool(torch.equal(everyone, everyone[0].expand_as(everyone)))
    out["finite"] = bool(torch.isfinite(flat).all())
    out["size"] = hvd.size()
    return out


def nonfinite_cases(cases: list, nan_rank: int = 0, nan_step: int = 1, steps: int = 4) -> dict:
    """:func:`nonfinite_at_step` for each ``"kind:value"`` in ``cases``, one after the other."""
    out = {}
    for case in cases:
        kind, value = case.split(":")
        out[case] = nonfinite_at_step(kind, nan_rank, nan_step, steps, value)
    return out


def train_in_dtype(dtype: str = "float64", kind: str = "ag", cr: float = 0.05, steps: int = 3) -> dict:
    """Train a small model whose parameters are ``dtype`` for a few steps; return each step's k and
    whether the parameters stay finite (and, gathered from every rank, equal)."""
    import horovod.torch as hvd

    dt = getattr(torch, dtype)
    rank = hvd.rank()
    model = _model(dtype=dt)
    opt = hvd_flexcomm.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                            named_parameters=model.named_parameters(),
                                            compression=_mode(kind, cr))
    ks = []
    mark(rank, f"trains {dtype}:{kind}")
    for step in range(steps):
        opt.zero_grad()
        _backward(model, step, rank, dt)
        opt.step()
        ks.append(opt.last_stats["k"])
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).double()
    everyone = hvd.allgather(flat.unsqueeze(0), name=f"fault.dtype.{dtype}.{kind}")
    return {"k": ks, "finite": bool(torch.isfinite(flat).all()),
            "agree": bool(torch.equal(everyone, flat.unsqueeze(0).expand_as(everyone))),
            "size": hvd.size()}


def train_dtypes(combos: list, cr: float = 0.05, steps: int = 3) -> dict:
    """:func:`train_in_dtype` for each ``"dtype:kind"`` in ``combos``; a failure is recorded as
    ``"TypeName: message"`` and the next combination runs. Use only where a failure happens on
    every rank alike after the step's collectives (or before any), so no collective is left
    half-submitted."""
    out = {}
    for combo in combos:
        dtype, kind = combo.split(":")
        try:
            out[combo] = train_in_dtype(dtype, kind, cr, steps)
        except Exception as exc:  # noqa: BLE001 - reported to the test
            out[combo] = f"{type(exc).__name__}: {exc}"
    return out


def noop() -> str:
    """Nothing: the launcher's own start-up and teardown time, for comparison."""
    return "ok"
