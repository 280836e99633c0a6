"""The training paradigms, one module each, found by name.

========  =======================================  ==========================================
name      module                                   what the workers do
========  =======================================  ==========================================
sync      :mod:`.sync_sgd`                         all-reduce gradients every step (DDP)
async     :mod:`.parameter_server`                 push/pull to a parameter server (Downpour)
bmuf      :mod:`.bmuf`                             block momentum every ``sync-period`` steps
easgd     :mod:`.easgd`                            elastic pull to a center every period
========  =======================================  ==========================================

:mod:`.base` holds the :class:`Paradigm` interface. A new paradigm is one module here plus one
entry in the one list of the paradigms, :data:`sublimate.components.base.settings.PARADIGMS`
(which :data:`PARADIGMS` here and the ``algorithm`` setting's choices come from), and, where it
has settings of its own, their declarations there. :mod:`.lr_schedule` holds each paradigm's
learning-rate rules. Modules load on demand: a worker imports only its own.
"""

from __future__ import annotations

import importlib

from sublimate.components.base.settings import PARADIGMS as _DECLARED

from .base import (
    Paradigm,
    ParadigmConfig,
    PeriodicAveraging,
    Replicas,
    auto_or,
    flat_parameters,
    load_flat_parameters,
)

__all__ = [
    "PARADIGMS",
    "Paradigm",
    "ParadigmConfig",
    "PeriodicAveraging",
    "Replicas",
    "auto_or",
    "flat_parameters",
    "load_flat_parameters",
    "paradigm_class",
]

# name -> "module:Class", from the one list of the paradigms (``settings.PARADIGMS``, which the
# ``algorithm`` setting's choices come from too).
PARADIGMS: dict[str, str] = {name: f"{__name__}.{target}" for name, target in _DECLARED.items()}


def paradigm_class(name: str) -> type[Paradigm]:
    try:
        module_name, class_name = PARADIGMS[name].split(":")
    except KeyError:
        raise ValueError(f"unknown algorithm '{name}' (known: {', '.join(sorted(PARADIGMS))})") \
            from None
    return getattr(importlib.import_module(module_name), class_name)
