"""Models used by the demo, the tests and the benchmarks (torchvision does not import beside the
CPU torch here, so they are defined in the project)."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["LeNet5", "MLP", "count_parameters"]


class LeNet5(nn.Module):
    """LeNet-5 style CNN for 1x28x28 images (about 61 k parameters at width 1)."""

    def __init__(self, num_classes: int = 10, width: int = 1) -> None:
        super().__init__()
        c1, c2, f1, f2 = 6 * width, 16 * width, 120 * width, 84 * width
        self.features = nn.Sequential(
            nn.Conv2d(1, c1, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(c1, c2, 5), nn.ReLU(), nn.MaxPool2d(2))
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Linear(c2 * 5 * 5, f1), nn.ReLU(), nn.Linear(f1, f2), nn.ReLU(),
            nn.Linear(f2, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


class MLP(nn.Module):
    """Fully connected network: ``in_features -> hidden x depth -> num_classes``. Its parameter
    count is easy to dial to a target size (benchmarks use it to match ResNet sizes)."""

    def __init__(self, in_features: int = 784, hidden: int = 256, depth: int = 2,
                 num_classes: int = 10) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Flatten()]
        width = in_features
        for _ in range(depth):
            layers += [nn.Linear(width, hidden), nn.ReLU()]
            width = hidden
        layers.append(nn.Linear(width, num_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def count_parameters(model: nn.Module) -> int:
    """Number of trainable parameters (elements)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
