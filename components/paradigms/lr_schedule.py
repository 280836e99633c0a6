"""The learning rate a paradigm's optimizer steps with: ``lr-scaling`` and ``warmup-epochs``.

Goyal et al. (2017) scale the learning rate linearly with the batch that one update averages
over, reached by gradual warmup. Which batch that is depends on the paradigm:

========  ==========================================  =========================================
paradigm  scale ``learning-rate`` by                  why
========  ==========================================  =========================================
sync      global batch / reference                    one update averages the whole global batch
easgd     global batch / reference                    the workers step on local batches and are
                                                      averaged into the center: local SGD, which
                                                      with one step per round *is* mini-batch SGD
                                                      on the global batch (Lin et al. 2020)
bmuf      global batch / reference x (1 - eta)/zeta   the averaged block update is amplified by
                                                      the block filter's gain zeta / (1 - eta)
                                                      (N at the paper's eta = 1 - 1/N, zeta = 1):
                                                      Chen & Huo (2016) keep each learner at the
                                                      single-learner rate of its local batch;
                                                      eta = 0 is model averaging (as easgd)
diloco    global batch / reference x (1 - mu)/lr_out  as bmuf: the outer Nesterov SGD amplifies
                                                      the averaged pseudo-gradient by
                                                      lr_out / (1 - mu) (7 at the paper's 0.7,
                                                      0.9)
async     a trainer's batch / reference               each update applies one trainer's gradient
========  ==========================================  =========================================

Torch-free (the launcher and the tests read it without torch).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def block_filter_gain(settings: Mapping[str, Any], workers: int) -> float:
    """The amplification of the averaged round update by the paradigm's outer filter: BMUF's
    zeta / (1 - eta), DiLoCo's outer SGD lr / (1 - momentum) (1 for the others)."""
    if settings.get("algorithm") == "diloco":
        outer_lr = float(settings.get("outer_lr", 0.7))
        momentum = float(settings.get("outer_momentum", 0.9))
        return outer_lr / (1.0 - momentum) if outer_lr > 0 else 1.0
    if settings.get("algorithm") != "bmuf":
        return 1.0
    block_momentum = settings.get("block_momentum")
    eta = 1.0 - 1.0 / workers if block_momentum in (None, "auto", -1) else float(block_momentum)
    zeta = float(settings.get("block_lr", 1.0))
    # zeta = 0 never moves the model; no rate can compensate, so none is tried.
    return zeta / (1.0 - eta) if zeta > 0 and eta < 1 else 1.0


def scaled_rate(settings: Mapping[str, Any], workers: int) -> float:
    """``learning-rate`` after ``lr-scaling`` for ``workers`` workers (trainers for async)."""
    base = float(settings["learning_rate"])
    if settings.get("lr_scaling", "linear") != "linear":
        return base
    batch = int(settings["global_batch_size"])
    if settings.get("algorithm") == "async":
        batch //= workers  # one trainer's batch
    return base * batch / int(settings["reference_batch_size"]) \
        / block_filter_gain(settings, workers)


def learning_rate(settings: Mapping[str, Any], workers: int, step: int,
                  steps_per_epoch: int) -> float:
    """The rate at ``step`` (0-based; a trainer's own steps for async): gradual warmup from
    ``learning-rate`` to :func:`scaled_rate` over ``warmup-epochs``, then constant."""
    base = float(settings["learning_rate"])
    target = scaled_rate(settings, workers)
    warmup_steps = round(float(settings.get("warmup_epochs", 0)) * steps_per_epoch)
    if step < warmup_steps:
        return base + (target - base) * step / warmup_steps
    return target
