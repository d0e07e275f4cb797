import gzip
import struct

import numpy as np
import pytest
import torch

from hvd_flexcomm.data import FASHION_MNIST_DIR, load_fashion_mnist, read_idx, shard


def test_read_idx_roundtrip(tmp_path):
    arr = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    path = tmp_path / "x-idx3-ubyte.gz"
    with gzip.open(path, "wb") as fh:
        fh.write(bytes([0, 0, 0x08, 3]) + struct.pack(">III", 2, 3, 4) + arr.tobytes())
    assert np.array_equal(read_idx(path), arr)
    bad = tmp_path / "bad"
    bad.write_bytes(b"\x01\x02\x03\x04")
    with pytest.raises(ValueError, match="not an idx file"):
        read_idx(bad)


def test_missing_dataset_message(tmp_path):
    with pytest.raises(FileNotFoundError, match="apt-get install dataset-fashion-mnist"):
        load_fashion_mnist(tmp_path)


@pytest.mark.skipif(not (FASHION_MNIST_DIR / "t10k-labels-idx1-ubyte.gz").exists(),
                    reason="Debian package dataset-fashion-mnist not installed")
def test_real_fashion_mnist():
    d = load_fashion_mnist()
    assert d.train_x.shape == (60000, 1, 28, 28) and d.test_x.shape == (10000, 1, 28, 28)
    assert torch.bincount(d.train_y).tolist() == [6000] * 10
    assert abs(float(d.train_x.mean())) < 1e-3


def test_shard_is_disjoint_and_equal_sized():
    parts = [shard(103, r, 4, seed=1, epoch=2) for r in range(4)]
    assert all(p.numel() == 25 for p in parts)
    assert torch.unique(torch.cat(parts)).numel() == 100
    assert not torch.equal(shard(103, 0, 4, 1, 0), shard(103, 0, 4, 1, 1))
    with pytest.raises(ValueError, match="rank 4"):
        shard(10, 4, 4, 0)
