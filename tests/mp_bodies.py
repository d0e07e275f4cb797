"""Test bodies that run on every rank under ``horovodrun`` (called through ``tests/harness.py``).

Each body returns plain data (floats, lists, bools) that the pytest side checks.
"""

from __future__ import annotations

import torch

import hvd_flexcomm


def _model(seed: int = 0, wide: int = 64) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(40, wide), torch.nn.Tanh(),
                               torch.nn.Linear(wide, wide * 4), torch.nn.Tanh(),
                               torch.nn.Linear(wide * 4, 3))


def _batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(32, 40, generator=g), torch.randint(0, 3, (32,), generator=g)


def _flat(params) -> torch.Tensor:
    return torch.cat([p.grad.reshape(-1) if p.grad is not None else torch.zeros(p.numel())
                      for p in params])


def _mode(kind: str, cr: float, granularity: str = "model"):
    if kind == "ag":
        return hvd_flexcomm.AGTopk(cr=cr, granularity=granularity)
    if kind in ("star", "var"):
        return hvd_flexcomm.ARTopk(cr=cr, selector=kind, granularity=granularity)
    if kind == "dense":
        return hvd_flexcomm.Dense()
    raise ValueError(kind)


def compressed_matches_reference(kind: str, cr: float, steps: int = 6, wide: int = 64) -> dict:
    """Train a few steps; on every step compare the aggregated gradient and this rank's residual
    with a reference computed from all ranks' raw gradients (gathered densely)."""
    import horovod.torch as hvd

    n, rank = hvd.size(), hvd.rank()
    model = _model(wide=wide)
    params = list(model.parameters())
    opt = hvd_flexcomm.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                            named_parameters=model.named_parameters(),
                                            compression=_mode(kind, cr))
    numel = sum(p.numel() for p in params)
    k = hvd_flexcomm.k_for(cr, numel)
    residuals = torch.zeros(n, numel)  # reference residual of every rank
    max_err, max_res_err, roots, stats = 0.0, 0.0, [], []
    for step in range(steps):
        x, y = _batch(step, rank)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        raw = hvd.allgather(_flat(params).unsqueeze(0), name=f"ref.raw.{step}")  # (n, numel)
        fed = raw + residuals
        expected = torch.zeros(numel)
        if kind == "ag":
            for r in range(n):
                idx = torch.topk(fed[r].abs(), k).indices
                expected[idx] += fed[r][idx]
                residuals[r] = fed[r]
                residuals[r][idx] = 0
            root = None
        else:
            if kind == "star":
                root = step % n
            else:
                norms = [float(fed[r][torch.topk(fed[r].abs(), k).indices].pow(2).sum())
                         for r in range(n)]
                root = max(range(n), key=lambda r: (norms[r], -r))
            idx = torch.topk(fed[root].abs(), k).indices
            expected[idx] = fed[:, idx].sum(0)
            residuals = fed.clone()
            residuals[:, idx] = 0
        expected /= n
        opt.synchronize()
        got = _flat(params)
        max_err = max(max_err, float((got - expected).abs().max()))
        own = opt._flex_messages[0].residual
        max_res_err = max(max_res_err, float((own - residuals[rank]).abs().max()))
        roots.append(opt.last_stats["root_rank"])
        stats.append(dict(opt.last_stats))
        with opt.skip_synchronize():
            opt.step()
    return {"max_err": max_err, "max_res_err": max_res_err, "roots": roots, "k": k,
            "stats": stats, "expected_roots": None}
