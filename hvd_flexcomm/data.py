"""Real data that ships in a Debian package: Fashion-MNIST (60 000 train / 10 000 test images).

``apt-get install dataset-fashion-mnist`` (done by ``scripts/install.sh``) puts the original idx
files under ``/usr/share/datasets/fashion-mnist/``. This module reads them with numpy only: no
downloads, no torchvision.
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

__all__ = ["FASHION_MNIST_DIR", "FashionMNIST", "load_fashion_mnist", "read_idx", "shard"]

FASHION_MNIST_DIR = Path(os.environ.get("HVD_FLEXCOMM_FASHION_MNIST",
                                        "/usr/share/datasets/fashion-mnist"))
_FILES = {
    "train_images": "train-images-idx3-ubyte.gz",
    "train_labels": "train-labels-idx1-ubyte.gz",
    "test_images": "t10k-images-idx3-ubyte.gz",
    "test_labels": "t10k-labels-idx1-ubyte.gz",
}
_IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}

#: Class names of Fashion-MNIST, by label.
CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker",
           "Bag", "Ankle boot")


class FashionMNIST(NamedTuple):
    """Images as float32 tensors of shape (n, 1, 28, 28), normalised to mean 0 / std 1 over the
    training set; labels as int64 tensors of shape (n,)."""

    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor


def read_idx(path: Path) -> np.ndarray:
    """Read one (optionally gzipped) idx file into a numpy array of its declared type and shape."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rb") as fh:
        raw = fh.read()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise ValueError(f"{path} is not an idx file (bad magic {raw[:4]!r})")
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    data = np.frombuffer(raw, dtype=_IDX_DTYPES[raw[2]], offset=4 + 4 * ndim)
    if data.size != int(np.prod(dims)):
        raise ValueError(f"{path}: header says {dims}, file holds {data.size} values")
    return data.reshape(dims)


def load_fashion_mnist(root: Path | str | None = None) -> FashionMNIST:
    """Load the full data set from ``root`` (default :data:`FASHION_MNIST_DIR`)."""
    root = Path(root) if root is not None else FASHION_MNIST_DIR
    missing = [name for name in _FILES.values() if not (root / name).exists()]
    if missing:
        raise FileNotFoundError(
            f"Fashion-MNIST not found in {root} (missing {', '.join(missing)}). Install it with "
            "`apt-get install dataset-fashion-mnist` (scripts/install.sh does), or point "
            "HVD_FLEXCOMM_FASHION_MNIST at a folder holding the four idx files.")
    arrays = {key: read_idx(root / name) for key, name in _FILES.items()}
    train = arrays["train_images"].astype(np.float32) / 255.0
    test = arrays["test_images"].astype(np.float32) / 255.0
    mean, std = float(train.mean()), float(train.std())

    def images(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy((a - mean) / std).unsqueeze(1).contiguous()

    return FashionMNIST(images(train), torch.from_numpy(arrays["train_labels"].astype(np.int64)),
                        images(test), torch.from_numpy(arrays["test_labels"].astype(np.int64)))


def shard(n: int, rank: int, size: int, seed: int, epoch: int = 0) -> torch.Tensor:
    """Indices of this rank's share of ``n`` examples for one epoch: a permutation drawn from
    ``(seed, epoch)`` (identical on every rank), split round robin like ``DistributedSampler``
    (every rank gets ``n // size`` examples; the remainder is dropped)."""
    if not 0 <= rank < size:
        raise ValueError(f"rank {rank} is not in [0, {size})")
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 100_003 + epoch))
    per_rank = n // size
    return perm[rank:per_rank * size:size]
