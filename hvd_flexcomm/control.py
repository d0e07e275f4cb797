"""Small control-plane helpers over Horovod collectives (objects, not gradients)."""

from __future__ import annotations

import pickle
from typing import Any

import torch

__all__ = ["allgather_object"]


def allgather_object(obj: Any, name: str, hvd: Any, process_set: Any = None) -> list:
    """Every rank's ``obj``, ordered by rank (within ``process_set``), via two allgathers.

    Horovod 0.28.1's ``hvd.allgather_object`` has no ``process_set`` argument; this one does.
    Objects are pickled: use it for small, rare messages (configuration checks).
    """
    kw = {} if process_set is None else {"process_set": process_set}
    data = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
    sizes = hvd.allgather(torch.tensor([data.numel()], dtype=torch.int64), name=name + ".sizes", **kw)
    payload = hvd.allgather(data, name=name + ".data", **kw)
    out, offset = [], 0
    for size in sizes.tolist():
        out.append(pickle.loads(payload[offset:offset + size].numpy().tobytes()))
        offset += size
    return out
