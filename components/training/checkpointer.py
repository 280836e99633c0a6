"""One worker's full training state, saved and restored at committed steps."""

from __future__ import annotations

import errno
import os
import shutil
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from sublimate.components.base.disk_full import (
    DiskFullError,
    disk_full_cause,
    disk_full_error,
    is_full,
    writing,
)
from sublimate.components.base.runtime import shown_path
from sublimate.components.model import checkpoint
from sublimate.components.monitoring import watchdog
from sublimate.components.paradigms import Paradigm


class Checkpointer:
    """Saves and restores one worker's full training state at committed steps.

    ``save`` is a collective: every rank writes its file, then rank 0 commits the step
    (``checkpoints/latest.json``), so a restart never sees a step that some rank lacks.
    ``extra`` holds anything else to resume (data position, clocks, ...).
    """

    checkpoint_format = checkpoint.FILES

    def __init__(self, run_dir: Path, rank: int, world: int, kind: str) -> None:
        self.run_dir, self.rank, self.world, self.kind = Path(run_dir), rank, world, kind
        # Told before a save, so that a slow volume is not taken for a hang (set by Job).
        self.progress: watchdog.ProgressReporter | None = None
        # Seconds each save kept training waiting (benchmarks/checkpoints.py reads them).
        self.blocked_seconds: list[float] = []

    def save(self, step: int, model: nn.Module, optimizer: torch.optim.Optimizer,
             paradigm: Paradigm | None = None, *, group: int | None = None,
             **extra: Any) -> None:
        """``group``: this process is of a replica group that does not lead (per-step
        recovery, a paradigm whose groups' states differ): its own state is written beside the
        leader's, and only the leader commits the step."""
        if self.progress is not None:
            self.progress.pause(step, "checkpoint")
        started = time.perf_counter()
        checkpoint.save_rank(self.run_dir, step, self.rank, {
            "step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
            **_rank_state(paradigm, extra)}, group)
        dist.barrier()  # every rank's file is on the volume before the step is committed
        if self.rank == 0 and group is None:
            checkpoint.commit(self.run_dir, step, self.world, self.kind)
        self.blocked_seconds.append(time.perf_counter() - started)

    def wait(self) -> None:
        """Return once every save so far is committed (saves here are, when they return)."""

    def restore(self, model: nn.Module, optimizer: torch.optim.Optimizer,
                paradigm: Paradigm | None = None, group: int | None = None,
                ) -> tuple[int, dict[str, Any]]:
        """Load the last committed step into the objects: (step, extra); (0, {}) when fresh.
        ``group``: this process's replica group, whose own file of that step (see
        :meth:`save`) is taken where there is one, the leader's where there is none (the
        group was lost before it wrote it, or it led)."""
        state = checkpoint.load_rank(self.run_dir, self.rank, self.world, self.kind,
                                     self.checkpoint_format)
        if state is None:
            return 0, {}
        if group is not None:
            state = checkpoint.load(checkpoint.step_path(self.run_dir, state["step"],
                                                         self.rank, group)) or state
        self._restore_model(state, model, optimizer)
        if paradigm is not None and state.get("paradigm") is not None:
            paradigm.load_state_dict(state["paradigm"])
        torch.set_rng_state(state["rng"])
        if state.get("cuda_rng") and torch.cuda.is_available() \
                and len(state["cuda_rng"]) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(state["cuda_rng"])  # dropout on the GPU resumes too
        # Checkpoints of the first releases kept train_seconds beside the step.
        extra = state.get("extra") or {"train_seconds": state.get("train_seconds", 0.0)}
        return state["step"], extra

    def _restore_model(self, state: dict[str, Any], model: nn.Module,
                       optimizer: torch.optim.Optimizer) -> None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])


class ShardedCheckpointer(Checkpointer):
    """``checkpoint-format=dcp``: the model and optimizer go to a sharded folder through
    ``torch.distributed.checkpoint``, asynchronously; the rest of a rank's state (random state,
    paradigm, extra) to a small file per rank, as :class:`Checkpointer` writes it.

    A save blocks training only while the state is copied into memory the checkpointer keeps
    between saves (its stager): the files are written by a background thread while training goes
    on. At most one save is in flight: the next one (or :meth:`wait`) first waits for it. The
    background thread runs its collectives (the plan, the final gather) on a process group of
    its own; on the training group they would interleave with the gradients' all-reduces and
    deadlock. Rank 0 commits the step once DCP has written the folder's ``.metadata``, which it
    does only after every rank reported its files written.

    The folder holds each replicated tensor once (written by one rank or another), so it
    serves synchronous SGD, whose ranks hold the same model; and any number of ranks can load
    it (:mod:`~sublimate.components.model.sharded_checkpoint`), so an elastic job resumes on
    another number of nodes.
    """

    checkpoint_format = checkpoint.SHARDED

    def __init__(self, run_dir: Path, rank: int, world: int, kind: str) -> None:
        super().__init__(run_dir, rank, world, kind)
        self._pending: Future[Any] | None = None
        self._pending_step = 0
        self._group: dist.ProcessGroup | None = None
        self._stager: Any = None

    def save(self, step: int, model: nn.Module, optimizer: torch.optim.Optimizer,
             paradigm: Paradigm | None = None, **extra: Any) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        if self.progress is not None:
            self.progress.pause(step, "checkpoint")
        started = time.perf_counter()
        self.wait()
        # The small part first: by the time rank 0 commits, every rank has written it.
        checkpoint.save_rank(self.run_dir, step, self.rank,
                             {"step": step, **_rank_state(paradigm, extra)})
        # Under DDP a rank's buffers (batch-norm statistics) drift from rank 0's until the next
        # forward pass broadcasts rank 0's; the folder holds one copy of each, so it is rank 0's.
        for buffer in model.buffers():
            dist.broadcast(buffer, 0)
        model_state, optimizer_state = get_state_dict(model, optimizer)
        if self._group is None:
            self._group, self._stager = dist.new_group(backend="gloo"), _stager()
        folder = checkpoint.step_path(self.run_dir, step, 0).parent
        written = dcp.async_save({"model": model_state, "optimizer": optimizer_state},
                                 storage_writer=_writer(folder, _saving(step, folder)),
                                 process_group=self._group, async_stager=self._stager)
        if not isinstance(written, Future):  # torch's AsyncSaveResponse: a stager that overlaps
            raise TypeError(f"dcp.async_save returned {type(written).__name__}, not a Future")
        self._pending = self._committing(step, written) if self.rank == 0 else written
        self._pending_step = step
        self.blocked_seconds.append(time.perf_counter() - started)

    def _committing(self, step: int, written: Future[Any]) -> Future[None]:
        """A future that resolves once ``step`` is written and committed (rank 0's)."""
        committed: Future[None] = Future()

        def commit(done: Future[Any]) -> None:
            try:
                done.result()
                checkpoint.commit(self.run_dir, step, self.world, self.kind,
                                  self.checkpoint_format)
            except BaseException as error:  # raised in training by the next wait()
                committed.set_exception(error)
            else:
                committed.set_result(None)

        written.add_done_callback(commit)
        return committed

    def wait(self) -> None:
        """Return once the save in flight is written (and, on rank 0, committed). A full disk
        (DCP gathers each rank's failure into one ``CheckpointException``) is a
        ``DiskFullError`` naming the disk and the step; the step's folder, never committed,
        is removed, so that the space its shards took is free again (the error files need
        some)."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        folder = checkpoint.step_path(self.run_dir, self._pending_step, 0).parent
        try:
            with writing(folder, _saving(self._pending_step, folder)):
                pending.result()
        except DiskFullError:
            shutil.rmtree(folder, ignore_errors=True)  # uncommitted: no resume reads it
            raise

    def _restore_model(self, state: dict[str, Any], model: nn.Module,
                       optimizer: torch.optim.Optimizer) -> None:
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        from sublimate.components.model import sharded_checkpoint

        # The optimizer's state as it will be after a step (get_state_dict creates it), so that
        # every tensor to load has its place.
        model_state, optimizer_state = get_state_dict(model, optimizer)
        loaded: dict[str, Any] = {"model": model_state, "optimizer": optimizer_state}
        sharded_checkpoint.load(loaded, checkpoint.step_path(self.run_dir, state["step"],
                                                             0).parent)
        set_state_dict(model, optimizer, model_state_dict=loaded["model"],
                       optim_state_dict=loaded["optimizer"])


def checkpointer(checkpoint_format: str, run_dir: Path, rank: int, world: int,
                 kind: str) -> Checkpointer:
    """The checkpointer of a checkpoint-format setting's value."""
    chosen = ShardedCheckpointer if checkpoint_format == checkpoint.SHARDED else Checkpointer
    return chosen(run_dir, rank, world, kind)


def _rank_state(paradigm: Paradigm | None, extra: dict[str, Any]) -> dict[str, Any]:
    """What a rank keeps besides its model and optimizer."""
    return {"paradigm": paradigm.state_dict() if paradigm is not None else None,
            "rng": torch.get_rng_state(), "cuda_rng": _cuda_rng_states(), "extra": extra}


def _saving(step: int, folder: Path) -> str:
    return f"saving checkpoint step {step} to {shown_path(folder)}"


def _writer(folder: Path, what: str) -> Any:
    """DCP's file writer for ``folder``, whose full disk is a ``DiskFullError`` saying
    ``what``. DCP carries each rank's failure to every rank by pickling it, which drops the
    ``OSError`` behind torch's ``unexpected pos``; a ``DiskFullError`` pickles whole. A failed
    write whose disk is left full is one too: torch's stream may not keep the errno."""
    from torch.distributed.checkpoint import FileSystemWriter

    class Writer(FileSystemWriter):
        def write_data(self, plan: Any, planner: Any) -> Any:
            try:
                return super().write_data(plan, planner)
            except DiskFullError:
                raise
            except Exception as error:
                full = disk_full_cause(error)
                if full is None and is_full(folder):  # (its partial file holds the space)
                    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                if full is None:
                    raise
                raise disk_full_error(full, folder, what) from error

    return Writer(folder)


def _stager() -> Any:
    """DCP's stager, kept for the whole run: it reuses its copy of the state between saves
    (a new one per save pays for fresh memory every time). Pinned memory and non-blocking
    copies need a GPU; DCP refuses the latter on a CPU-only machine."""
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

    gpu = torch.cuda.is_available()
    return DefaultStager(StagingOptions(use_pinned_memory=gpu, use_shared_memory=False,
                                        use_async_staging=False, use_non_blocking_copy=gpu))


def _cuda_rng_states() -> list[torch.Tensor] | None:
    """Every visible GPU's generator state, when this process has used CUDA (else None)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.cuda.get_rng_state_all()
    return None
