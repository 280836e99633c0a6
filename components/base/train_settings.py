"""The train step's settings as one typed, frozen value (:class:`TrainSettings`).

:data:`~sublimate.components.base.settings.SETTINGS` declares each setting once (name, type,
bounds, description); this is the same list as a dataclass, so that the code which reads a
setting says which one with an attribute a type checker knows (``request.sync_period`` is an
``int``), never with a string or an ``argparse.Namespace`` that anything may have written into.
A test holds the two lists to each other (names, order, types and defaults).

The launcher's request (:class:`sublimate.components.launch.request.TrainRequest`) and the
workers' (:class:`sublimate.components.processes.request.WorkerRequest`) extend it with what
each is told besides the settings (folders, ports). What the launcher decides from them (the
scheduler, the recovery mode, the restarts) is its plan, not a field written into the request.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Self

from sublimate.components.base.runtime import DEFAULT_IMAGE
from sublimate.components.base.settings import AUTO, NodeRange


@dataclass(frozen=True, kw_only=True)
class TrainSettings:
    """Every setting of the train step, typed, with its declared default ("auto": None where the
    declaration has ``auto=True``, the text ``"auto"`` where auto is one of its choices)."""

    algorithm: str = "sync"
    entrypoint: str = ""
    entrypoint_args: str = ""
    framework: str = "pytorch"
    model: str = "mlp"
    run_id: str = ""
    nodes: NodeRange = field(default_factory=lambda: NodeRange(2))
    rendezvous: str = AUTO
    rendezvous_endpoint: str = ""
    rendezvous_timeout: float = 300.0
    procs_per_node: int = 1
    epochs: int = 20
    global_batch_size: int = 64
    learning_rate: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 0.0001
    hidden: int = 128
    seed: int = 0
    checkpoint_every: int = 100
    checkpoint_format: str = "files"
    max_restarts: int | None = None
    recovery: str = AUTO
    commit_every: int = 16
    chaos_mtbf: float = 0.0
    chaos_kills: int = 0
    chaos_seed: int = 0
    lr_scaling: str = "linear"
    reference_batch_size: int = 64
    warmup_epochs: float = 0.0
    accumulation_steps: int = 1
    sync_period: int = 8
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    fragments: int = 1
    fragment_delay: int = 0
    fragment_update_alpha: float = 0.0
    outer_gradient_dtype: str = "float32"
    outer_codec: str = "none"
    outer_codec_topk: float = 0.03
    block_momentum: float | None = None
    block_lr: float = 1.0
    nesterov: bool = True
    moving_rate: float | None = None
    staleness_bound: int = 0
    eval_every_epoch: bool = True
    collective_timeout: float | None = None
    data_loading: str = AUTO
    shuffle_buffer: int = 16384
    loader_workers: int = 0
    stall_seconds: float = 300.0
    startup_seconds: float = 900.0
    progress_every: float = 5.0
    backend: str = AUTO
    scheduler: str = AUTO
    link_rate: str = ""
    link_delay: str = ""
    link_loss: str = ""
    cpu_per_node: int = 1
    gpus_per_node: int = 0
    memory_mb_per_node: int = 2048
    queue: str = "default"
    image: str = DEFAULT_IMAGE
    tracking: str = ""
    tracking_required: bool = True

    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> Self:
        """The request from typed values by attribute (argparse's ``vars``, a test's dict):
        each field of ``cls`` that ``values`` has, the others at their defaults. Values are
        taken as typed: parse text with the declarations first (``settings.parse_values``)."""
        return cls(**{f.name: values[f.name] for f in dataclasses.fields(cls) if f.name in values})

    def values(self) -> dict[str, Any]:
        """Every field by attribute: what the rules of ``settings`` (``check``,
        ``recovery_mode``, ``to_flags``) take."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
