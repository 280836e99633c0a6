"""What runs inside a workflow step's container: the steps, the training processes, the
paradigms, and the libraries they use; one room (subpackage) per layer (docs/architecture.md).

This module is the public face: the names below are what users' code, the docs, the examples
and the notebook may rely on, whichever room holds them (``from sublimate.components import
ShardReader, training``). Everything else is internal and may move. The names load on first
use, so importing ``sublimate.components`` costs nothing and imports no torch.
"""

from __future__ import annotations

from sublimate.components.base.public_face import lazy_exports

# public name -> "module" (the module itself) or "module:attribute", under this package
_EXPORTS: dict[str, str] = {
    # steps: each module's template() builds the step's Hera template (a pipeline of your own)
    "stage_data": "steps.stage_data",
    "train": "steps.train",
    "evaluate": "steps.evaluate",
    "gate": "steps.gate",
    "register_model": "steps.register_model",
    "notify": "steps.notify",
    # the library a training loop of your own uses (docs/own-code.md): training.start(), ...
    "training": "training",
    "Contract": "base.contract:Contract",
    # the TorchX components of the train step, and the cluster on one machine
    "trainer": "launch.apps:trainer",
    "parameter_server": "launch.apps:parameter_server",
    "netns_scheduler": "launch.netns_scheduler",
    "faults": "launch.faults",
    # datasets (docs/datasets.md)
    "Split": "data.datasets:Split",
    "DatasetError": "data.datasets:DatasetError",
    "write_dataset": "data.datasets:write_dataset",
    "write_shards": "data.datasets:write_shards",
    "write_synthetic_dataset": "data.datasets:write_synthetic_dataset",
    "read_metadata": "data.datasets:read_metadata",
    "read_split": "data.datasets:read_split",
    "ShardReader": "data.streaming:ShardReader",
    "evaluation_batches": "data.streaming:evaluation_batches",
    "steps_per_epoch": "data.streaming:steps_per_epoch",
    "credentials_env": "data.object_store:credentials_env",
    # model versions (docs/registry.md)
    "Registry": "model.registry:Registry",
    "RegistryError": "model.registry:RegistryError",
    "ModelVersion": "model.registry:ModelVersion",
    # monitoring (docs/monitoring.md)
    "read_endpoints": "monitoring.metrics:read_endpoints",
    "scrape": "monitoring.metrics:scrape",
    "record_staging": "monitoring.metrics:record_staging",
    "find_stragglers": "monitoring.stragglers:find_stragglers",
    "Watchdog": "monitoring.watchdog:Watchdog",
    "run_report": "monitoring.run_report",
}

__all__ = list(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
