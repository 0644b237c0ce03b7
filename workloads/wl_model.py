"""The model the digit workloads (mnist.py, ddp.py) train."""

from __future__ import annotations

import torch
from torch import nn


class DigitNet(nn.Module):
    """A small CNN for 1-channel digits of any size from 8x8 (sklearn digits) to 28x28 (MNIST)."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(),
            nn.AdaptiveAvgPool2d(4),
        )
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(64 * 16, 128), nn.ReLU(), nn.Linear(128, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))
