"""Synthetic stand-ins for the paper's models: plain MLPs whose parameter count equals a target.

torchvision does not import beside this CPU torch, and only the *size* of the gradient matters for
communication, so the synthetic benchmark uses an MLP

    in_features -> hidden -> hidden ... -> hidden -> num_classes      (``depth`` hidden layers)

whose parameter count is exactly the target. The count is

    in·h + h  +  (depth - 1)·(h² + h)  +  c·(h + 1)

for input width ``in``, hidden width ``h`` and ``c`` outputs. With ``h`` and ``depth`` fixed, ``c`` is
chosen so that the rest divides by ``h`` (``c ≡ rest (mod h)``) and ``in`` takes the quotient, which
hits any target large enough exactly. The "images" are random vectors of ``in`` floats.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

#: Parameter counts (float32 gradient entries) of the paper's models (torchvision definitions).
PAPER_SIZES = {
    "resnet18": 11_689_512,
    "resnet50": 25_557_032,
    "alexnet": 61_100_840,
    "vit_l_16": 304_326_632,
}

#: Small sizes for quick runs and tests.
SMALL_SIZES = {"small": 1_000_000, "tiny": 200_000}


@dataclass(frozen=True)
class MLPShape:
    """The widths of an exact-size MLP (see the module docstring)."""

    in_features: int
    hidden: int
    depth: int
    num_classes: int

    @property
    def numel(self) -> int:
        h = self.hidden
        return (self.in_features * h + h + (self.depth - 1) * (h * h + h)
                + self.num_classes * (h + 1))

    def describe(self) -> str:
        widths = [self.in_features] + [self.hidden] * self.depth + [self.num_classes]
        return "MLP " + "-".join(str(w) for w in widths)


def exact_mlp_shape(target: int, hidden: int = 1024, depth: int = 3, min_classes: int = 10) -> MLPShape:
    """An :class:`MLPShape` with exactly ``target`` parameters (hidden width shrunk if needed)."""
    if target <= 0 or hidden <= 0 or depth <= 0:
        raise ValueError("target, hidden and depth must be positive")
    h = hidden
    while h >= 8:
        fixed = h + (depth - 1) * (h * h + h)
        rest = target - fixed
        if rest > 0:
            c = rest % h
            while c < min_classes:
                c += h
            in_features = (rest - c * (h + 1)) // h
            if in_features >= 1 and (rest - c * (h + 1)) % h == 0:
                shape = MLPShape(in_features, h, depth, c)
                assert shape.numel == target
                return shape
        h //= 2
    raise ValueError(f"no exact MLP shape for {target} parameters")


def size_of(name_or_count: str) -> int:
    """Parameter count of a size name (``resnet18``, ``small`` ...) or a plain integer string."""
    key = name_or_count.lower().replace("-", "").replace("_", "")
    for table in (PAPER_SIZES, SMALL_SIZES):
        for name, count in table.items():
            if key == name.replace("_", ""):
                return count
    try:
        return int(name_or_count.replace(",", "").replace("_", ""))
    except ValueError:
        raise ValueError(f"unknown model size {name_or_count!r}; use one of "
                         f"{sorted(PAPER_SIZES) + sorted(SMALL_SIZES)} or a number") from None


def build_mlp(shape: MLPShape) -> nn.Module:
    """The MLP of ``shape`` (Linear + ReLU; the last layer has no activation)."""
    layers: list[nn.Module] = []
    width = shape.in_features
    for _ in range(shape.depth):
        layers += [nn.Linear(width, shape.hidden), nn.ReLU()]
        width = shape.hidden
    layers.append(nn.Linear(width, shape.num_classes))
    return nn.Sequential(*layers)
