"""Step-time overhead of ``hvd_flexcomm.DistributedOptimizer`` against ``hvd.DistributedOptimizer``.

    horovodrun -np 2 -H localhost:2 --gloo python benchmarks/bench_overhead.py [--quick]

Trains an MLP (about 1.3M parameters by default) on random data with Horovod's own optimizer and
with ours (``Dense()``, and the top-k modes for reference), alternating short timed blocks so that
machine noise hits every method alike. Prints the median step time of each and its ratio to
Horovod's, measured in this run. Rank 0 prints; every rank runs the same steps.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import horovod.torch as hvd
import torch

import hvd_flexcomm
from hvd_flexcomm.models import MLP, count_parameters


def make(name: str, model: torch.nn.Module):
    base = torch.optim.SGD(model.parameters(), lr=0.01)
    named = model.named_parameters()
    if name == "horovod":
        return hvd.DistributedOptimizer(base, named_parameters=named)
    mode = {"dense": hvd_flexcomm.Dense(), "agtopk-0.01": hvd_flexcomm.AGTopk(cr=0.01),
            "artopk-0.01": hvd_flexcomm.ARTopk(cr=0.01)}[name]
    return hvd_flexcomm.DistributedOptimizer(base, named_parameters=named, compression=mode)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--steps", type=int, default=10, help="timed steps per block")
    ap.add_argument("--json")
    args = ap.parse_args()
    hvd.init()
    torch.set_num_threads(1)
    rounds = 3 if args.quick else args.rounds
    methods = ["horovod", "dense", "agtopk-0.01", "artopk-0.01"]
    setups = {}
    for name in methods:
        torch.manual_seed(0)
        model = MLP(hidden=args.hidden, depth=2)
        setups[name] = (model, make(name, model))
    g = torch.Generator().manual_seed(hvd.rank())
    x, y = torch.randn(64, 784, generator=g), torch.randint(0, 10, (64,), generator=g)
    times = {name: [] for name in methods}

    def block(name: str, steps: int) -> float:
        model, opt = setups[name]
        t0 = time.perf_counter()
        for _ in range(steps):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        return (time.perf_counter() - t0) / steps

    for name in methods:  # warm-up: response caches, allocations
        block(name, 3)
    for r in range(rounds):
        order = methods if r % 2 == 0 else methods[::-1]
        for name in order:
            times[name].append(block(name, args.steps))
    if hvd.rank() == 0:
        base = statistics.median(times["horovod"])
        params = count_parameters(setups["horovod"][0])
        print(f"{hvd.size()} ranks, MLP with {params} parameters, {rounds} rounds x {args.steps} "
              f"steps, median step time")
        print(f"{'method':<16}{'ms/step':>10}{'vs horovod':>12}")
        rows = []
        for name in methods:
            med = statistics.median(times[name])
            rows.append({"method": name, "ms_per_step": 1e3 * med, "ratio_vs_horovod": med / base})
            print(f"{name:<16}{1e3 * med:>10.2f}{med / base:>12.3f}")
        if args.json:
            with open(args.json, "w") as fh:
                json.dump({"parameters": params, "ranks": hvd.size(), "rows": rows}, fh, indent=2)


if __name__ == "__main__":
    main()
