"""hvd_flexcomm: flexible top-k gradient compression for Horovod + PyTorch.

Swap one line of a Horovod training script::

    import horovod.torch as hvd
    import hvd_flexcomm

    optimizer = hvd_flexcomm.DistributedOptimizer(
        optimizer, named_parameters=model.named_parameters(),
        compression=hvd_flexcomm.ARTopk(cr=0.01, selector="star"))

Importing this package does not import or initialise Horovod; ``DistributedOptimizer`` does, and
raises a clear ``ImportError`` when Horovod (with its PyTorch extension) is missing.
"""

from __future__ import annotations

from typing import Any

from .compression import Adaptive, AGTopk, ARTopk, Dense, Flexible, validate_cr
from .topk import k_for, select_topk

__version__ = "0.1.0"

__all__ = [
    "__version__",
    "Adaptive",
    "AGTopk",
    "ARTopk",
    "Dense",
    "DistributedOptimizer",
    "Flexible",
    "k_for",
    "select_topk",
    "validate_cr",
]


def __getattr__(name: str) -> Any:
    # Lazy: the optimizer module imports Horovod, which must not happen at package import time.
    if name == "DistributedOptimizer":
        from .optimizer import DistributedOptimizer

        return DistributedOptimizer
    raise AttributeError(f"module 'hvd_flexcomm' has no attribute {name!r}")
