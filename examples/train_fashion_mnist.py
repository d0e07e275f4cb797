"""Data-parallel training of LeNet-5 on Fashion-MNIST with hvd_flexcomm (Horovod's MNIST example,
with one changed line: the optimizer).

    horovodrun -np 2 -H localhost:2 --gloo python examples/train_fashion_mnist.py \
        --compression artopk --cr 0.01 --selector star --epochs 3

``--compression horovod`` runs ``hvd.DistributedOptimizer`` itself, for comparison.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import asdict, fields

import horovod.torch as hvd
import torch

from hvd_flexcomm.training import COMPRESSIONS, TrainConfig, train


def parse_args(argv: list[str]) -> TrainConfig:
    defaults = TrainConfig()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--compression", choices=COMPRESSIONS, default=defaults.compression)
    p.add_argument("--cr", type=float, default=defaults.cr, help="fraction of entries kept")
    p.add_argument("--selector", choices=("star", "var"), default=defaults.selector)
    p.add_argument("--granularity", choices=("model", "bucket"), default=defaults.granularity)
    for name in ("epochs", "batch_size", "train_size", "seed", "width", "log_interval"):
        p.add_argument("--" + name.replace("_", "-"), type=int, default=getattr(defaults, name))
    for name in ("lr", "momentum"):
        p.add_argument("--" + name, type=float, default=getattr(defaults, name))
    p.add_argument("--json", help="write the run's summary (JSON) to this file on rank 0")
    args = vars(p.parse_args(argv))
    out = args.pop("json")
    cfg = TrainConfig(**{f.name: args[f.name] for f in fields(TrainConfig)})
    cfg.json = out  # type: ignore[attr-defined]
    return cfg


def main(argv: list[str]) -> int:
    cfg = parse_args(argv)
    hvd.init()
    torch.set_num_threads(1)
    logging.basicConfig(level=logging.INFO if hvd.rank() == 0 else logging.WARNING,
                        format="%(asctime)s %(name)s %(message)s", datefmt="%H:%M:%S")
    result = train(cfg)
    if hvd.rank() == 0:
        print(f"\nSUMMARY  compression={cfg.compression} cr={cfg.cr:g} selector={cfg.selector} "
              f"ranks={result.ranks} parameters={result.parameters}")
        print(f"  final test accuracy {100 * result.final_test_accuracy:.2f}%  "
              f"wall {result.wall_s:.1f} s  steps {result.steps}  "
              f"comm {result.mean_comm_ms:.2f} ms/step  compress {result.mean_compress_ms:.2f} "
              f"ms/step  collectives {result.collectives}")
        if getattr(cfg, "json", None):
            with open(cfg.json, "w") as fh:
                json.dump(asdict(result), fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
