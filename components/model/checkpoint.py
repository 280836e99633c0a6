"""Atomic checkpoint files on the shared volume.

A checkpoint is written to a temporary file in the same folder, flushed to disk, then renamed over
the old one, and the folder itself is flushed so that the rename survives a power loss: a crash at
any moment leaves either the previous checkpoint or the new one, never a truncated file.

Files are read back with ``torch.load(weights_only=True)``: a checkpoint holds tensors and plain
Python values only, so a file planted in a run folder on the shared volume cannot run code in
the next resume or evaluation (a full unpickle would run whatever the file asks for).
"""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path
from typing import Any

import torch

from sublimate.components.base.disk_full import writing
from sublimate.components.base.durable_files import replace_atomically, write_json
from sublimate.components.base.run_files import CHECKPOINTS, LATEST
from sublimate.components.base.runtime import shown_path


def save(state: dict[str, Any], path: Path, what: str = "") -> None:
    """``state`` at ``path``, atomically; a full disk is a ``DiskFullError`` that names it and
    says ``what`` was being written (else ``writing <path>``), not torch's ``unexpected pos``,
    and leaves nothing behind (the temporary file is removed)."""
    with writing(path, what or f"writing {shown_path(path)}"):
        replace_atomically(path, lambda stream: torch.save(state, stream))


def load(path: Path) -> dict[str, Any] | None:
    """The state saved at ``path`` (on the CPU), or None when there is no file.

    Anything but tensors and plain values is refused, naming the file (see the module's
    docstring): e.g. a checkpoint whose ``extra`` holds a NumPy array or an object.
    """
    if not path.is_file():
        return None
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        raise CheckpointError(f"{path}: holds more than tensors and plain values, so it is "
                              f"not loaded ({_refused_global(str(error))}); save tensors, "
                              "numbers, strings, lists and dicts only") from None


def _refused_global(message: str) -> str:
    """The line of torch's weights-only refusal that names what the file asked for."""
    for line in message.splitlines():
        if "GLOBAL" in line:
            return line.strip().removeprefix("WeightsUnpickler error: ").split(" was not")[0] \
                .split(" whose module")[0]
    return "not a weights-only file"


class CheckpointError(ValueError):
    """A checkpoint that cannot be used; the message names the file and what to do."""


# Per-rank checkpoints: every worker writes its own state for a step (local models differ under
# BMUF and EASGD), then rank 0 commits the step by atomically rewriting ``latest.json``. A step
# folder without a commit is ignored, so a crash mid-checkpoint resumes from the previous one.
KEEP_STEPS = 2


def step_path(run_dir: Path, step: int, rank: int, group: int | None = None) -> Path:
    """A rank's file of ``step``; ``group``: the same rank's in a replica group that did not
    lead (per-step recovery: its own state of a paradigm whose groups differ, beside the
    leader's)."""
    name = f"rank-{rank:05d}.pt" if group is None else f"node{group}-rank-{rank:05d}.pt"
    return run_dir / CHECKPOINTS / f"step-{step:09d}" / name


def save_rank(run_dir: Path, step: int, rank: int, state: dict[str, Any],
              group: int | None = None) -> None:
    path = step_path(run_dir, step, rank, group)
    save(state, path, f"saving checkpoint step {step} to {shown_path(path)}")


# How a step's state is laid out (the checkpoint-format setting): "files", one file per rank
# holding all its state; "dcp", a sharded folder (:mod:`.sharded_checkpoint`) holding the model
# and optimizer, beside a small file per rank for the rest (random state, paradigm, extra).
FILES, SHARDED = "files", "dcp"


def commit(run_dir: Path, step: int, world_size: int, algorithm: str,
           checkpoint_format: str = FILES) -> None:
    """Mark ``step`` complete (call after every rank saved it) and prune older steps."""
    folder = run_dir / CHECKPOINTS
    with writing(folder / LATEST, f"committing checkpoint step {step} to "
                                  f"{shown_path(folder / LATEST)}"):
        write_json({"step": step, "world_size": world_size, "algorithm": algorithm,
                    "format": checkpoint_format}, folder / LATEST)
    steps = sorted(path for path in folder.glob("step-*") if path.is_dir())
    for old in steps[:-KEEP_STEPS]:
        if old.name != f"step-{step:09d}":
            # a replica group that did not lead may still be writing its own file there
            shutil.rmtree(old, ignore_errors=True)


def latest(run_dir: Path) -> dict[str, Any] | None:
    path = run_dir / CHECKPOINTS / LATEST
    return json.loads(path.read_text()) if path.is_file() else None


# Paradigms whose checkpoints resume on another number of workers.
RESIZABLE = ("sync",)


def load_rank(run_dir: Path, rank: int, world_size: int, algorithm: str,
              checkpoint_format: str = FILES) -> dict[str, Any] | None:
    """The state this rank saved at the last committed step, or None for a fresh start."""
    committed = latest(run_dir)
    if committed is None:
        return None
    written_as = committed.get("format", FILES)  # the first releases wrote files only
    if written_as != checkpoint_format:
        raise CheckpointError(
            f"{run_dir / CHECKPOINTS / LATEST}: checkpoints written with checkpoint-format "
            f"{written_as}, this run has {checkpoint_format}; resume with checkpoint-format "
            f"{written_as}, or use a new run folder")
    if committed["world_size"] != world_size and committed["algorithm"] == algorithm \
            and algorithm in RESIZABLE:
        # Synchronous SGD keeps every rank's model and optimizer identical, so any rank's state
        # resumes any rank: an elastic job that lost (or gained) a node goes on from the step.
        return load_committed(run_dir, committed["step"], min(rank, committed["world_size"] - 1))
    if committed["world_size"] != world_size or committed["algorithm"] != algorithm:
        raise ValueError(
            f"{run_dir / CHECKPOINTS / LATEST}: written by {committed['world_size']} "
            f"'{committed['algorithm']}' workers, this run has {world_size} '{algorithm}' "
            "workers; use a new run folder or the same settings")
    return load_committed(run_dir, committed["step"], rank)


def load_committed(run_dir: Path, step: int, rank: int) -> dict[str, Any]:
    """A rank's file of a committed step. Its absence is an error, never a fresh start: that
    rank would restart at step 0 while the others resume, and the job would train on."""
    path = step_path(run_dir, step, rank)
    state = load(path)
    if state is None:
        raise CheckpointError(
            f"{path}: missing, although {run_dir / CHECKPOINTS / LATEST} commits step {step} "
            f"for every rank; restore the file, or remove {LATEST} to start over")
    return state
