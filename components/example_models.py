"""A worked example of bringing your own model: a small CNN for 8x8 images such as digits.

Use it with ``-p model=sublimate.components.example_models:small_cnn``; your own module works the
same way once it is importable in the training image (or the local environment).
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
