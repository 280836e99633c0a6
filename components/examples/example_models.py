"""Worked examples of bringing your own model: a small CNN for 8x8 images such as digits, and a
1-D CNN for signals such as mnist1d's.

Use one with ``-p model=sublimate.components.examples.example_models:small_cnn`` (or
``:signal_cnn``); your own module works the same way once it is importable in the training image (or
the local environment).
"""

from __future__ import annotations

import math

from torch import nn


class SmallCNN(nn.Module):
    def __init__(self, num_features: int, num_classes: int, channels: int = 16) -> None:
        super().__init__()
        side = math.isqrt(num_features)
        if side * side != num_features:
            raise ValueError(f"small_cnn needs square images; {num_features} features are not")
        self.side = side
        # BatchNorm's running statistics are buffers, not parameters: every paradigm must carry
        # them into the result model (they are averaged where the weights are).
        self.features = nn.Sequential(
            nn.Conv2d(1, channels, 3, padding=1), nn.BatchNorm2d(channels), nn.ReLU(),
            nn.Conv2d(channels, channels, 3, padding=1), nn.BatchNorm2d(channels), nn.ReLU(),
            nn.AdaptiveAvgPool2d(2))
        self.classifier = nn.Linear(channels * 4, num_classes)

    def forward(self, batch):
        images = batch.view(-1, 1, self.side, self.side)
        return self.classifier(self.features(images).flatten(1))


def small_cnn(num_features: int, num_classes: int) -> nn.Module:
    return SmallCNN(num_features, num_classes)


class SignalCNN(nn.Module):
    """Three same-padded 1-D convolutions over the signal, pooled to 4 positions, then a linear
    classifier. About 45x the built-in MLP's arithmetic per example on mnist1d (40 points) for a
    similar parameter count, so a step's compute outweighs its all-reduce: the model for
    showing compute-bound scaling (docs/results.md)."""

    def __init__(self, num_features: int, num_classes: int, channels: int = 64) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv1d(1, channels, 5, padding=2), nn.ReLU(),
            nn.Conv1d(channels, channels, 3, padding=1), nn.ReLU(),
            nn.Conv1d(channels, channels, 3, padding=1), nn.ReLU(),
            nn.AdaptiveAvgPool1d(4))
        self.classifier = nn.Linear(channels * 4, num_classes)

    def forward(self, batch):
        signals = batch.view(batch.shape[0], 1, -1)
        return self.classifier(self.features(signals).flatten(1))


def signal_cnn(num_features: int, num_classes: int) -> nn.Module:
    return SignalCNN(num_features, num_classes)
