"""Model architectures, addressed by name so a saved model can be rebuilt by any step."""

from __future__ import annotations

from typing import Any

from torch import nn


def mlp(num_features: int, num_classes: int, hidden: int = 128, depth: int = 2) -> nn.Module:
    layers: list[nn.Module] = []
    width = num_features
    for _ in range(depth):
        layers += [nn.Linear(width, hidden), nn.ReLU()]
        width = hidden
    layers.append(nn.Linear(width, num_classes))
    return nn.Sequential(*layers)


ARCHITECTURES = {"mlp": mlp}


def build_model(architecture: str, config: dict[str, Any]) -> nn.Module:
    try:
        factory = ARCHITECTURES[architecture]
    except KeyError:
        known = ", ".join(sorted(ARCHITECTURES))
        raise ValueError(f"unknown model architecture '{architecture}' (known: {known})") from None
    return factory(**config)
