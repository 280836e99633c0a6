"""What a training process receives from sublimate: the contract, as environment variables.

The train step runs the built-in loop or a user's own entry point under ``torchrun`` on every
node. Besides torchrun's own variables (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``) every process gets:

==========================  ===================================================================
``SUBLIMATE_DATA_DIR``      the staged dataset's folder (``docs/datasets.md`` has its layout)
``SUBLIMATE_RUN_DIR``       the run's folder on the shared volume: checkpoints, the final model,
                            logs; what the evaluate step reads (``metrics.json`` for own code)
``SUBLIMATE_SETTINGS``      the train step's settings as JSON, by attribute (``epochs``,
                            ``learning_rate``, ``global_batch_size``, ``seed``, ...), typed
``SUBLIMATE_METRICS_PORT``  base port of the Prometheus endpoints: a process serves on base +
                            ``LOCAL_RANK`` (``metrics.serve_worker`` does this)
``TF_CONFIG``               with ``framework=tensorflow`` only: the cluster of workers and this
                            worker's index, for ``tf.distribute.MultiWorkerMirroredStrategy``
==========================  ===================================================================

This module is light (no torch): the launcher writes the contract,
:mod:`sublimate.components.training` reads it.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DATA_DIR_ENV = "SUBLIMATE_DATA_DIR"
RUN_DIR_ENV = "SUBLIMATE_RUN_DIR"
SETTINGS_ENV = "SUBLIMATE_SETTINGS"
METRICS_PORT_ENV = "SUBLIMATE_METRICS_PORT"  # read by metrics.base_port
TF_CONFIG_ENV = "TF_CONFIG"
# Set by the local runner: where `sublimate run` was started (pipelines/runner/pods/plan.py).
LOCAL_CWD_ENV = "SUBLIMATE_LOCAL_CWD"


class ContractError(RuntimeError):
    """The process was not started by sublimate (or torchrun): the message says what is missing."""


@dataclass(frozen=True)
class Contract:
    """One training process's view of its job."""

    run_dir: Path
    data_dir: Path | None
    settings: Mapping[str, Any] = field(default_factory=dict)
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    node: int = 0  # torchrun's GROUP_RANK: which node this process runs on

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Contract:
        """The contract from the environment; raises :class:`ContractError` naming what is
        missing."""
        env = os.environ if env is None else env
        run_dir = env.get(RUN_DIR_ENV)
        if not run_dir:
            raise ContractError(f"${RUN_DIR_ENV} is not set: run this under `sublimate run -p "
                                "entrypoint=...` (or set it to a folder for the run's files)")
        try:
            settings = json.loads(env.get(SETTINGS_ENV) or "{}")
        except ValueError as error:
            raise ContractError(f"${SETTINGS_ENV} is not JSON: {error}") from None
        data_dir = env.get(DATA_DIR_ENV)
        return cls(Path(run_dir), Path(data_dir) if data_dir else None, settings,
                   int(env.get("RANK", "0")), int(env.get("WORLD_SIZE", "1")),
                   int(env.get("LOCAL_RANK", "0")), int(env.get("GROUP_RANK", "0")))


def is_script(target: str) -> bool:
    """An entry point that is a script path rather than a module (``train.py``, ``a/b.py``)."""
    return target.endswith(".py") or "/" in target


def local_workdir() -> Path | None:
    """Where ``sublimate run`` was started, for a local run's relative paths (None elsewhere)."""
    folder = os.environ.get(LOCAL_CWD_ENV)
    return Path(folder) if folder else None


def user_path(text: str) -> Path:
    """A path the user gave (``-p dataset=./mine``) as they meant it: in a local run, a relative
    one is from the folder where they ran ``sublimate run``, the one rule for every path they
    give; elsewhere (a cluster's step, a command run by hand) as it is."""
    path = Path(text).expanduser()
    workdir = local_workdir()
    return workdir / path if workdir is not None and not path.is_absolute() else path


def user_location(text: str) -> str:
    """A folder or fsspec URL the user gave (``-p registry=./models``): a URL as it is, a path
    by :func:`user_path`'s rule."""
    return text if "://" in text else str(user_path(text))


def import_user_code() -> None:
    """Let ``import`` find a user's modules (``-p model=mymodel:tiny``, ``py:mydata:rings``) as
    ``python -m`` would in the folder where ``sublimate run`` was started: that folder first on
    ``sys.path`` (a local run; on a cluster the modules are the image's)."""
    workdir = local_workdir()
    if workdir is not None and str(workdir) not in sys.path:
        sys.path.insert(0, str(workdir))


def locate_entrypoint(entrypoint: str, local: bool = True) -> tuple[str, str | None]:
    """A user's entry point as its process will find it, and a folder to import modules from.

    A local run resolves a relative script path and imports modules from the folder where
    ``sublimate run`` was started, as ``python train.py`` or ``python -m pkg.train`` there
    would; in a cluster (``local`` false, or no local run), paths and modules are the image's.
    """
    workdir = local_workdir() if local else None
    if is_script(entrypoint):
        path = Path(entrypoint)
        if not path.is_absolute() and workdir is not None:
            path = workdir / path
        return str(path), None
    return entrypoint, str(workdir) if workdir is not None else None


def contract_env(data_dir: Path, run_dir: Path, settings: Mapping[str, Any]) -> dict[str, str]:
    """The launcher's side: the variables every training process of the job gets."""
    return {DATA_DIR_ENV: str(data_dir), RUN_DIR_ENV: str(run_dir),
            SETTINGS_ENV: json.dumps(dict(settings), sort_keys=True, default=str)}
