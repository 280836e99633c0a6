"""One worker's full training state, saved and restored at committed steps."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from sublimate.components.model import checkpoint
from sublimate.components.monitoring import watchdog
from sublimate.components.paradigms import Paradigm


class Checkpointer:
    """Saves and restores one worker's full training state at committed steps.

    ``save`` is a collective: every rank writes its file, then rank 0 commits the step
    (``checkpoints/latest.json``), so a restart never sees a step that some rank lacks.
    ``extra`` holds anything else to resume (data position, clocks, ...).
    """

    def __init__(self, run_dir: Path, rank: int, world: int, kind: str) -> None:
        self.run_dir, self.rank, self.world, self.kind = Path(run_dir), rank, world, kind
        # Told before a save, so that a slow volume is not taken for a hang (set by Job).
        self.progress: watchdog.ProgressReporter | None = None

    def save(self, step: int, model: nn.Module, optimizer: torch.optim.Optimizer,
             paradigm: Paradigm | None = None, **extra: Any) -> None:
        if self.progress is not None:
            self.progress.pause(step, "checkpoint")
        checkpoint.save_rank(self.run_dir, step, self.rank, {
            "step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
            "paradigm": paradigm.state_dict() if paradigm is not None else None,
            "rng": torch.get_rng_state(), "cuda_rng": _cuda_rng_states(), "extra": extra,
        })
        dist.barrier()  # every rank's file is on the volume before the step is committed
        if self.rank == 0:
            checkpoint.commit(self.run_dir, step, self.world, self.kind)

    def restore(self, model: nn.Module, optimizer: torch.optim.Optimizer,
                paradigm: Paradigm | None = None) -> tuple[int, dict[str, Any]]:
        """Load the last committed step into the objects: (step, extra); (0, {}) when fresh."""
        state = checkpoint.load_rank(self.run_dir, self.rank, self.world, self.kind)
        if state is None:
            return 0, {}
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        if paradigm is not None and state.get("paradigm") is not None:
            paradigm.load_state_dict(state["paradigm"])
        torch.set_rng_state(state["rng"])
        if state.get("cuda_rng") and torch.cuda.is_available() \
                and len(state["cuda_rng"]) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(state["cuda_rng"])  # dropout on the GPU resumes too
        # Checkpoints of the first releases kept train_seconds beside the step.
        extra = state.get("extra") or {"train_seconds": state.get("train_seconds", 0.0)}
        return state["step"], extra


def _cuda_rng_states() -> list[torch.Tensor] | None:
    """Every visible GPU's generator state, when this process has used CUDA (else None)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.cuda.get_rng_state_all()
    return None
