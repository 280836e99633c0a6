"""Model architectures: the built-in ``mlp``, or the user's own by entry point.

A model is named ``mlp`` or ``module:function``; the function is called as
``function(num_features=..., num_classes=...)`` and returns a module mapping a float32 batch
``(B, num_features)`` to logits ``(B, num_classes)``. The name and its arguments are saved with
the model, so any step (evaluate, a resumed worker) rebuilds the same architecture.
"""

from __future__ import annotations

import importlib
from typing import Any

from torch import nn

from sublimate.components.base.contract import import_user_code


def mlp(num_features: int, num_classes: int, hidden: int = 128, depth: int = 2) -> nn.Module:
    layers: list[nn.Module] = []
    width = num_features
    for _ in range(depth):
        layers += [nn.Linear(width, hidden), nn.ReLU()]
        width = hidden
    layers.append(nn.Linear(width, num_classes))
    return nn.Sequential(*layers)


ARCHITECTURES = {"mlp": mlp}


def resolve(model: str) -> Any:
    """The factory that ``model`` names; ValueError naming the model when it cannot be found."""
    if model in ARCHITECTURES:
        return ARCHITECTURES[model]
    module_name, separator, function = model.partition(":")
    if not separator or not module_name or not function:
        known = ", ".join(sorted(ARCHITECTURES))
        raise ValueError(f"model '{model}': not a built-in model ({known}) nor module:function")
    import_user_code()  # a local run finds the user's module where they ran `sublimate run`
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ValueError(f"model '{model}': cannot import module '{module_name}': {error}") \
            from None
    factory = getattr(module, function, None)
    if not callable(factory):
        raise ValueError(f"model '{model}': module '{module_name}' has no function '{function}'")
    return factory


def model_spec(model: str, num_features: int, num_classes: int,
               hidden: int) -> tuple[str, dict[str, Any]]:
    """(architecture, config) to build and to save with the weights."""
    config: dict[str, Any] = {"num_features": num_features, "num_classes": num_classes}
    if model == "mlp":
        config["hidden"] = hidden
    return model, config


def build_model(architecture: str, config: dict[str, Any]) -> nn.Module:
    module = resolve(architecture)(**config)
    if not isinstance(module, nn.Module):
        raise ValueError(f"model '{architecture}' returned {type(module).__name__}, "
                         "not a torch.nn.Module")
    return module
