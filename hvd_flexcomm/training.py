"""A complete, small data-parallel training loop (Horovod's MNIST example, on Fashion-MNIST).

Used by the demo (``examples/train_fashion_mnist.py``), the accuracy tests and the benchmarks. Call
:func:`train` on every rank after ``hvd.init()``. Rank 0 logs one line per epoch; every rank returns
the same summary (metrics are averaged over ranks with named allreduces).
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

import torch
import torch.nn.functional as F

from .compression import AGTopk, ARTopk, Dense
from .data import load_fashion_mnist, shard
from .models import LeNet5, count_parameters

__all__ = ["TrainConfig", "make_compression", "train"]

log = logging.getLogger("hvd_flexcomm.training")

COMPRESSIONS = ("horovod", "dense", "agtopk", "artopk")


@dataclass
class TrainConfig:
    """Settings of one run. ``lr`` is per rank and is scaled by the number of ranks, as in
    Horovod's examples. ``train_size`` limits the training examples used (0 = all 60 000)."""

    compression: str = "artopk"
    cr: float = 0.01
    selector: str = "star"
    granularity: str = "model"
    epochs: int = 3
    batch_size: int = 64
    lr: float = 0.01
    momentum: float = 0.9
    train_size: int = 0
    seed: int = 42
    width: int = 1
    log_interval: int = 0  # steps between progress lines on rank 0 (0 = once per epoch only)


@dataclass
class TrainResult:
    """What :func:`train` returns (identical on every rank)."""

    config: dict
    ranks: int
    parameters: int
    epochs: list = field(default_factory=list)  # per epoch: loss, train/test accuracy, seconds
    final_test_accuracy: float = 0.0
    wall_s: float = 0.0
    steps: int = 0
    mean_comm_ms: float = 0.0
    mean_compress_ms: float = 0.0
    collectives: dict = field(default_factory=dict)


def make_compression(cfg: TrainConfig) -> Optional[Any]:
    """The ``compression=`` argument for a config (``None`` for Horovod's own optimizer)."""
    if cfg.compression == "horovod":
        return None
    if cfg.compression == "dense":
        return Dense()
    if cfg.compression == "agtopk":
        return AGTopk(cr=cfg.cr, granularity=cfg.granularity)
    if cfg.compression == "artopk":
        return ARTopk(cr=cfg.cr, selector=cfg.selector, granularity=cfg.granularity)
    raise ValueError(f"compression must be one of {COMPRESSIONS}, got {cfg.compression!r}")


def _evaluate(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, rank: int, size: int,
              hvd: Any, name: str) -> float:
    """Accuracy (fraction) over the whole set, each rank scoring its own share."""
    model.eval()
    idx = torch.arange(rank, x.shape[0], size)
    correct = 0
    with torch.no_grad():
        for chunk in idx.split(1000):
            correct += int((model(x[chunk]).argmax(1) == y[chunk]).sum())
    model.train()
    totals = hvd.allreduce(torch.tensor([float(correct), float(idx.numel())]), op=hvd.Sum,
                           name=name)
    return float(totals[0] / totals[1])


def train(cfg: TrainConfig) -> TrainResult:
    """Train LeNet-5 on Fashion-MNIST with ``cfg``; Horovod must be initialised."""
    import horovod.torch as hvd

    from .optimizer import DistributedOptimizer

    rank, size = hvd.rank(), hvd.size()
    data = load_fashion_mnist()
    n_train = cfg.train_size or data.train_x.shape[0]
    torch.manual_seed(cfg.seed)
    model = LeNet5(width=cfg.width)
    base = torch.optim.SGD(model.parameters(), lr=cfg.lr * size, momentum=cfg.momentum)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    compression = make_compression(cfg)
    if compression is None:
        opt = hvd.DistributedOptimizer(base, named_parameters=model.named_parameters())
    else:
        opt = DistributedOptimizer(base, named_parameters=model.named_parameters(),
                                   compression=compression)
    result = TrainResult(config=asdict(cfg), ranks=size, parameters=count_parameters(model))
    if rank == 0:
        log.info("training LeNet-5 (%d parameters) on %d Fashion-MNIST examples, %d rank(s), "
                 "compression=%s", result.parameters, n_train, size,
                 compression.describe() if compression is not None else "hvd.DistributedOptimizer")
    comm_ms = compress_ms = 0.0
    collectives: dict = {}
    start = time.perf_counter()
    step = 0
    for epoch in range(cfg.epochs):
        t_epoch = time.perf_counter()
        mine = shard(n_train, rank, size, cfg.seed, epoch)
        loss_sum, seen = 0.0, 0
        for batch in mine.split(cfg.batch_size):
            if batch.numel() < cfg.batch_size:
                break  # same number of steps on every rank
            opt.zero_grad()
            loss = F.cross_entropy(model(data.train_x[batch]), data.train_y[batch])
            loss.backward()
            opt.step()
            loss_sum += float(loss.detach()) * batch.numel()
            seen += batch.numel()
            step += 1
            stats = getattr(opt, "last_stats", None) or {}
            comm_ms += stats.get("comm_ms", 0.0)
            compress_ms += stats.get("compress_ms", 0.0)
            kind = stats.get("collective", "horovod")
            collectives[kind] = collectives.get(kind, 0) + 1
            if cfg.log_interval and rank == 0 and step % cfg.log_interval == 0:
                log.info("epoch %d step %d loss %.4f", epoch + 1, step, float(loss.detach()))
        train_loss = float(hvd.allreduce(torch.tensor(loss_sum / max(seen, 1)),
                                         name=f"train.loss.{epoch}"))
        test_acc = _evaluate(model, data.test_x, data.test_y, rank, size, hvd, f"test.{epoch}")
        seconds = time.perf_counter() - t_epoch
        result.epochs.append({"epoch": epoch + 1, "train_loss": train_loss,
                              "test_accuracy": test_acc, "seconds": seconds})
        if rank == 0:
            log.info("epoch %d/%d  train loss %.4f  test accuracy %.2f%%  (%.1f s)", epoch + 1,
                     cfg.epochs, train_loss, 100 * test_acc, seconds)
    result.wall_s = time.perf_counter() - start
    result.steps = step
    result.final_test_accuracy = result.epochs[-1]["test_accuracy"] if result.epochs else 0.0
    result.mean_comm_ms = comm_ms / max(step, 1)
    result.mean_compress_ms = compress_ms / max(step, 1)
    result.collectives = collectives
    return result
