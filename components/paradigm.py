"""The interface every training paradigm implements, and the registry that finds them by name.

A paradigm decides how workers cooperate: how the model is wrapped for the backward pass and what
happens after each local optimizer step (nothing for synchronous SGD, periodic averaging for
model-averaging methods, ...). The step loop in :mod:`sublimate.components.worker` is shared, so a
new paradigm is one new module that subclasses :class:`Paradigm` and registers itself in
:data:`PARADIGMS`.
"""

from __future__ import annotations

import importlib
from typing import Any, ClassVar

from torch import nn

# name -> "module:Class"; modules are imported on demand so a worker loads only its own paradigm.
PARADIGMS: dict[str, str] = {
    "sync": "sublimate.components.sync_sgd:SyncSGD",
}


class Paradigm:
    """Base class: a paradigm sees the model and optimizer and hooks into the step loop."""

    name: ClassVar[str]

    def __init__(self, model: nn.Module, hyperparameters: dict[str, Any]) -> None:
        self.model = model
        self.hyperparameters = hyperparameters

    def training_model(self) -> nn.Module:
        """The module to run forward/backward on (e.g. a DDP wrapper around ``self.model``)."""
        return self.model

    def after_step(self, step: int) -> None:
        """Called after every local optimizer step with the 1-based global step count."""

    def state_dict(self) -> dict[str, Any]:
        """Paradigm state beyond model and optimizer, saved in every checkpoint."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        del state


def paradigm_class(name: str) -> type[Paradigm]:
    try:
        module_name, class_name = PARADIGMS[name].split(":")
    except KeyError:
        raise ValueError(f"unknown algorithm '{name}' (known: {', '.join(sorted(PARADIGMS))})") \
            from None
    return getattr(importlib.import_module(module_name), class_name)
