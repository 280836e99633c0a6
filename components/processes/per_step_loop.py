"""The built-in loop under per-step recovery (``recovery=per-step``): every node a replica group,
every step (sync) or averaging round (bmuf, easgd) a transaction of the groups alive.

The restart mode's :class:`~.training_loop.TrainingLoop` walks the steps of an epoch; this loop
walks the job's *committed* steps instead. A step's batch follows from the committed step count, so
a step that no group completed is simply taken again, and a replacement that copied a live peer's
state (which carries that count) goes on from where the job is, not from where it started. Each
node takes its own slice of every global batch (node x procs-per-node + local rank, of all the
job's slots); the slices of a lost node are skipped while it is away, and the gradient is the mean
over the groups that took part (torchft's semantics: the effective batch shrinks with the job).

One group leads: the first of the current quorum (:meth:`FaultTolerance.is_leader`). Its first
process evaluates, logs the job's epoch line, writes the model and the summary, and its processes
checkpoint (the groups hold the same state under sync SGD; under bmuf, easgd and diloco, whose
groups' local states differ, every other group writes its own beside the leader's, which a
relaunched job resumes). A diloco round with ``fragment-delay`` D is a transaction that spans D
local steps: its quorum where it begins, its commit where it ends (a checkpoint due between the
two waits for the end). Every group's first process records its events and step
counters for the launcher (``<run>/fault-tolerance/``). A replacement never reads a checkpoint;
a job relaunched after losing every node does, as the restart mode does.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from sublimate.components import training
from sublimate.components.base import run_files
from sublimate.components.base.replica_groups import (
    ReplicaGroups,
    attempt_started,
    steps_committed_since,
)
from sublimate.components.base.settings import PER_STEP, steps_per_commit
from sublimate.components.monitoring import metrics as monitoring
from sublimate.components.monitoring.watchdog import ATTEMPT_ENV
from sublimate.components.processes.fault_injection import (
    fault_injection_step,
    freeze_self,
    kill_self,
    stall_self,
)
from sublimate.components.processes.learning import (
    Learner,
    TrainingData,
    build_learner,
    learning_rate,
    load_data,
)
from sublimate.components.processes.request import WorkerRequest
from sublimate.components.processes.training_loop import TrainingLoop, first_step_done
from sublimate.components.training import ProcessGroup, log
from sublimate.components.training.fault_tolerance import (
    QUORUM_TIMEOUT_SECONDS,
    FaultTolerance,
    JobAlreadyDone,
    NoLivePeer,
)

# How often a group waiting for the others to start looks for them (start barrier).
START_POLL_SECONDS = 0.02


def train(request: WorkerRequest, startup: monitoring.StartupClock,
          group: ProcessGroup) -> dict[str, Any]:
    """Train to the end under per-step recovery and return the summary (``group``: this node's
    process group)."""
    groups = ReplicaGroups.from_env()
    if groups is None:
        raise RuntimeError("recovery per-step: started without the launcher's replica groups")
    group.replica_group, group.replica_groups = groups.group, groups.groups
    if _ready_file(request.run_dir, groups.group, group.rank).exists():
        # This group's node already started in this launch: it is restarted in place (by the
        # launcher on one machine, by Volcano's RestartPod on Kubernetes), a replacement.
        groups = dataclasses.replace(groups, replacement=True)
    data = load_data(request, group, startup)
    learner = build_learner(request, group, data)
    run = PerStepLoop(request, startup, group, data, learner, groups)
    try:
        run.loop()
    except JobAlreadyDone as error:
        print(f"train: {error}; nothing left to train", flush=True)
        os._exit(0)
    except NoLivePeer as error:
        # Every group that held the job's state is gone: the launcher relaunches the job from
        # its last checkpoint (per_step.Replacer: the no_peer record).
        print(f"train: {error}; stopping so that the job resumes from its last checkpoint",
              file=sys.stderr, flush=True)
        os._exit(3)
    return run.finish()


def _ready_file(run_dir: str | Path, group: int, rank: int = 0) -> Path:
    """The file each process of a group's node leaves when it starts in this launch (``rank``:
    its rank in the node; the start barrier waits for every group's first process)."""
    attempt = os.environ.get(ATTEMPT_ENV, "run").replace("/", "-")
    return Path(run_dir) / run_files.FAULT_TOLERANCE / f"ready-{attempt}-node{group}-{rank}"


@dataclass(slots=True)
class _Epoch:
    """The epoch a group is in: its data order, and what it took of it."""

    index: int
    order: torch.Tensor
    device: torch.device
    started: float
    loss: torch.Tensor = field(init=False)
    taken: int = 0

    def __post_init__(self) -> None:
        self.loss = torch.zeros((), device=self.device)


class PerStepLoop(TrainingLoop):
    """One process's way through the job's committed steps (see the module's docstring)."""

    def __init__(self, request: WorkerRequest, startup: monitoring.StartupClock,
                 group: ProcessGroup, data: TrainingData, learner: Learner,
                 groups: ReplicaGroups) -> None:
        # bmuf, easgd, diloco: each group's local model, inner optimizer (and diloco's codec
        # residual) are its own, and each resumes its own (the leader's where it has none)
        own = groups.group if request.algorithm != "sync" else None
        step, extra = (0, {}) if groups.replacement else learner.checkpointer.restore(
            learner.model, learner.optimizer, learner.paradigm, group=own)
        if step:
            log(group.slot, f"resumed from checkpoint at step {step}/{data.total_steps}")
        self.groups = groups
        self.periodic = request.algorithm != "sync"
        # diloco's fragment-delay: its rounds begin this many steps before they end
        self.delay = getattr(learner.paradigm, "delay", 0)
        # a checkpoint due while a round was in flight, taken when it ends
        self._checkpoint_due = False
        # sync: the steps one transaction commits together (the rounds are the transactions
        # of the periodic paradigms)
        self.steps_per_commit = 1 if self.periodic else steps_per_commit(request.values())
        self._epoch: _Epoch | None = None
        self._first_epoch_closed = False
        folder = Path(request.run_dir) / run_files.FAULT_TOLERANCE
        since = attempt_started(os.environ.get(ATTEMPT_ENV, "")) or 0.0
        self.ft = FaultTolerance(groups, group.rank, group.world, group.device, request.run_dir,
                                 request.collective_seconds, state=self.state,
                                 load_state=self.load_state,
                                 # a quorum formed while a lone step computes; before a
                                 # transaction of several, whose steps need the healed state
                                 async_quorum=self.steps_per_commit == 1 and not self.periodic,
                                 steps_per_commit=self.steps_per_commit,
                                 job_progress=lambda: steps_committed_since(folder, since),
                                 job_length=data.total_steps
                                 // learner.paradigm.period  # type: ignore[attr-defined]
                                 if self.periodic else data.total_steps)
        # The Manager counts committed steps (rounds under bmuf/easgd/diloco) from the
        # checkpoint on.
        self.ft.manager.load_state_dict({
            "step": step // learner.paradigm.period if self.periodic else step,  # type: ignore[attr-defined]
            "batches_committed": 0})
        learner.paradigm.replicas = self.ft
        self.ft.traffic = learner.paradigm.traffic  # one count, checkpointed with the paradigm
        training_model = learner.paradigm.training_model()
        reporter = training.Reporter(request.run_dir, group, data.total_steps,
                                     data.local_batch, training_model, request.metrics_addr,
                                     request.metrics_port, request.progress_every, first_step=step)
        learner.checkpointer.progress = reporter.progress
        super().__init__(request, startup, group, data, learner, training_model, reporter, step,
                         extra.get("train_seconds", 0.0))
        slot = group.slot  # fault injection names the process by its slot in the job

        def first_start_fault(variable: str = "SUBLIMATE_FAIL_AT_STEP") -> int | None:
            return None if groups.replacement else fault_injection_step(slot, variable)

        self.fail_at = first_start_fault()
        self.freeze_at = first_start_fault("SUBLIMATE_FREEZE_AT_STEP")
        self.fail_in_allreduce = first_start_fault("SUBLIMATE_FAIL_IN_ALLREDUCE_AT_STEP")
        self.fail_in_checkpoint = first_start_fault("SUBLIMATE_FAIL_DURING_CHECKPOINT")
        self.stall_at = first_start_fault("SUBLIMATE_STALL_AT_STEP")
        startup.mark("setup")
        self._wait_for_the_other_groups()

    # -- what a replacement copies from a live peer -------------------------------------------

    def state(self) -> dict[str, Any]:
        learner = self.learner
        return {"model": learner.model.state_dict(), "optimizer": learner.optimizer.state_dict(),
                "paradigm": learner.paradigm.state_dict(),
                "run": {"step": self.step, "train_seconds": self.train_seconds}}

    def load_state(self, state: dict[str, Any]) -> None:
        learner = self.learner
        learner.model.load_state_dict(state["model"])
        learner.optimizer.load_state_dict(state["optimizer"])
        learner.paradigm.load_state_dict(state["paradigm"])
        self.train_seconds = float(state["run"]["train_seconds"])
        if self.periodic:  # the local step (sync: the Manager's count is the step)
            self.step = int(state["run"]["step"])

    # -- the loop -------------------------------------------------------------------------------

    def loop(self) -> None:
        """Take committed steps until the job has taken them all.

        A transaction, once its quorum is asked for, is always carried through to its commit:
        every group in that quorum does the same collectives (a group that asked again instead
        would leave the others waiting in the all-reduce). What a step's number says (its
        epoch, its batch) is read from the committed count, which a healed group finds
        ahead."""
        if self.groups.replacement and self.periodic:
            # Heal first: the peers reach a round within sync-period steps, and this group's
            # local steps before that would be thrown away. (With fragment-delay the peers'
            # quorum is where their round begins: this group begins it with them.)
            self._round(begin_only=self.delay > 0)
        self._epoch = None
        while self.step < self.data.total_steps:
            if self.periodic:
                self._local_step()
            else:
                self._transaction()

    def _compute(self, step: int, began: float | None = None
                 ) -> tuple[torch.Tensor, float, float, float]:
        """The forward and backward passes of ``step`` (under sync, its buckets are sent during
        the backward pass). Returns its loss and when it started, had its batch and had its
        gradient. ``began``: when its transaction began (a new epoch's time starts there)."""
        started = time.perf_counter()
        epoch = self._epoch
        if epoch is None or epoch.index != step // self.data.steps_per_epoch:
            index = step // self.data.steps_per_epoch
            epoch = self._epoch = _Epoch(index, self._order(index), self.group.device,
                                         started if began is None else began)
        lr = learning_rate(self.request, step, self.data.steps_per_epoch, self.group.slots)
        if lr != self.lr:
            self.lr = lr
            for param_group in self.learner.optimizer.param_groups:
                param_group["lr"] = lr
        x, y = self._batch(step, epoch.order)
        if not self.periodic and step + 1 == self.fail_in_allreduce:
            # before the backward pass, which sends this group's share of the all-reduce
            from sublimate.components.paradigms.sync_sgd import SyncSGD
            from sublimate.components.processes.fault_injection import kill_in_allreduce

            paradigm = self.learner.paradigm
            assert isinstance(paradigm, SyncSGD)  # a non-periodic paradigm under per-step
            kill_in_allreduce(self.ft.manager, paradigm.averaged_parameters(),
                              self.group.slot, step + 1, record=self.ft.record)
        loaded = time.perf_counter()
        loss = self._forward_backward(self.training_model, x, y, self.request.accumulation_steps)
        return loss, started, loaded, time.perf_counter()

    def _local_step(self) -> None:
        """bmuf/easgd/diloco: a local step, which always commits, and every sync-period steps a
        round, the transaction."""
        paradigm = self.learner.paradigm
        loss, started, loaded, _ = self._compute(self.step)
        self.learner.optimizer.step()
        paradigm.zero_grad()
        # The local optimizer step is computation (as in the restart mode's loop); the round,
        # every sync-period steps, is the communication.
        computed = synced = time.perf_counter()
        self.step += 1
        period: int = paradigm.period  # type: ignore[attr-defined]
        phase = self.step % period
        if phase == 0 and self.delay:  # the round begun fragment-delay steps ago ends
            paradigm.end_round(self.step)  # type: ignore[attr-defined]
            synced = time.perf_counter()
        elif phase == 0 or (self.delay and phase == period - self.delay):
            healed = self._round(begin_only=phase != 0)
            synced = time.perf_counter()
            if healed:
                self._epoch = None  # healed: this group's epoch so far is not the job's
                return
        self._count(loss, loaded - started, computed - loaded, synced - computed)
        self._committed()

    def _transaction(self) -> None:
        """sync: the steps up to the next commit (``commit-every`` of them at most, ending at
        every epoch's end and checkpoint) as one transaction of the groups alive.

        Each step's gradient is averaged between the groups; the optimizer steps on it at once
        (the next step's gradient needs it) except for the last step, which steps only once the
        groups have committed. A transaction of several steps keeps a copy of the model and the
        optimizer from its start, and goes back to it when it is dropped."""
        ft, paradigm, optimizer = self.ft, self.learner.paradigm, self.learner.optimizer
        began = time.perf_counter()
        first = ft.start_step()  # the quorum
        quorum = time.perf_counter() - began
        if first != self.step:
            # a heal: applied by the quorum (a blocking one), or on its way to the commit
            was, self.step, self._epoch = self.step, first, None
            if not ft.async_quorum:
                self._healed(was)
        end = self._transaction_end(first)
        saved = self._save() if end - first > 1 else None
        # per step: its loss and its seconds of data, computation and communication
        steps: list[tuple[torch.Tensor, float, float, float]] = []
        for step in range(first, end):
            if step > first:
                ft.extend()
            loss, started, loaded, computed = self._compute(step, began)
            paradigm.average_gradients()  # type: ignore[attr-defined]
            if ft.failed():
                break
            if step + 1 < end:
                optimizer.step()
                paradigm.zero_grad()
            steps.append((loss, loaded - started, computed - loaded,
                          time.perf_counter() - computed + (quorum if step == first else 0)))
            if step + 1 < end:
                # mid-transaction: the step is taken, not committed (at a transaction's end,
                # after the commit: _committed)
                if step + 1 == self.fail_at:
                    self.ft.record("killed", step=step + 1, fault="after the step")
                    kill_self(self.group.slot, step + 1)
                if step + 1 == self.freeze_at:
                    freeze_self(self.group.slot, step + 1)
        taken = step - first + 1
        committing = time.perf_counter()
        committed = ft.commit(taken)
        if committed:
            optimizer.step()
            paradigm.communication_ops += taken
        paradigm.zero_grad()
        if steps:  # the commit (and the last step's optimizer step) is the last step's
            loss, data_seconds, compute_seconds, comm_seconds = steps[-1]
            steps[-1] = (loss, data_seconds, compute_seconds,
                         comm_seconds + time.perf_counter() - committing)
        if not committed:  # its steps are not counted: every group takes them again
            if saved is not None:
                self._restore(saved)
            self.step = ft.step
            if self.step != first:  # healed at the commit
                self._epoch = None
            return
        self.step = ft.step
        if self.step != first + taken:  # healed at the commit: its epoch so far is not the job's
            self._healed(first)
            self._epoch = None
            return
        for loss, data_seconds, compute_seconds, comm_seconds in steps:
            self._count(loss, data_seconds, compute_seconds, comm_seconds)
        self._committed()

    def _transaction_end(self, first: int) -> int:
        """Where a transaction that starts at committed step ``first`` ends: after
        ``commit-every`` steps, at its epoch's end, at a checkpoint or at the job's end,
        whichever comes first (every group computes the same)."""
        data, every = self.data, self.request.checkpoint_every
        end = min(first + self.steps_per_commit, data.total_steps,
                  (first // data.steps_per_epoch + 1) * data.steps_per_epoch)
        return min(end, (first // every + 1) * every) if every else end

    def _save(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """What a dropped transaction goes back to: the model's tensors and the optimizer's
        state, as they are (a copy)."""
        learner = self.learner
        return ({name: tensor.detach().clone()
                 for name, tensor in learner.model.state_dict().items()},
                copy.deepcopy(learner.optimizer.state_dict()))

    def _restore(self, saved: tuple[dict[str, torch.Tensor], dict[str, Any]]) -> None:
        model_state, optimizer_state = saved
        self.learner.model.load_state_dict(model_state)
        self.learner.optimizer.load_state_dict(optimizer_state)

    def _count(self, loss: torch.Tensor, data_seconds: float, compute_seconds: float,
               comm_seconds: float) -> None:
        """A committed step in its epoch's loss and in the time split."""
        epoch, times = self._epoch, self.reporter.times
        assert epoch is not None
        epoch.loss += loss
        epoch.taken += 1
        times.data += data_seconds
        times.compute += compute_seconds
        times.comm += comm_seconds
        times.steps += 1

    def _committed(self) -> None:
        """What follows a commit at ``self.step``: the replacement's first step's line, metrics,
        progress, fault injection, the checkpoint and the epoch's end."""
        request, data, reporter, ft = self.request, self.data, self.reporter, self.ft
        if self.pending_startup is not None:
            self.launch_to_first_step = first_step_done(self.pending_startup, reporter.metrics)
            if self.groups.replacement:
                log(self.group.rank, f"node{self.groups.group}: training again, step "
                    f"{self.step}: " + monitoring.format_startup(
                        self.launch_to_first_step, self.pending_startup.phases()))
            self.pending_startup = None
        if reporter.times.steps >= training.METRICS_FLUSH_STEPS:
            reporter.flush(self.step)
            if reporter.metrics is not None:
                reporter.metrics.observe_replica_groups(ft.participants, ft.committed,
                                                        ft.aborted, ft.heals)
        now = time.perf_counter()
        if now >= reporter.progress.due:
            reporter.progress.step(self.step)
        if self.step == self.fail_at:
            self.ft.record("killed", step=self.step, fault="after the step")
            kill_self(self.group.slot, self.step)
        if self.step == self.freeze_at:
            freeze_self(self.group.slot, self.step)
        if self.step == self.stall_at:
            stall_self(self.group.slot, self.step)
        epoch = self._epoch
        assert epoch is not None
        every = request.checkpoint_every
        if every and self.step % every == 0:
            self._checkpoint_due = True
        # A checkpoint due while a round travels (fragment-delay) waits for the round's end:
        # a run resumed from it then holds every round whole, and ends bit for bit as one that
        # was not stopped.
        if self._checkpoint_due and not self._round_in_flight():
            self._checkpoint_due = False
            if self.step < data.total_steps:
                self.save_checkpoint(self.step, self.train_seconds + now - epoch.started)
        if self.step % data.steps_per_epoch == 0:  # the epoch's last step
            self.close_epoch(epoch.index, data.steps_per_epoch - epoch.taken, epoch.loss,
                             time.perf_counter() - epoch.started)
            self._epoch = None

    def _batch(self, step: int, order: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        data, request = self.data, self.request
        start = (step % data.steps_per_epoch) * request.global_batch_size \
            + self.group.slot * data.local_batch
        rows = order[start:start + data.local_batch]
        assert data.features is not None and data.labels is not None  # _order refused a stream
        return data.features[rows], data.labels[rows]

    def _order(self, epoch: int) -> torch.Tensor:
        if self.data.reader is not None:
            raise NotImplementedError("recovery per-step reads the training split into memory "
                                      "(data-loading memory or auto below 1 GiB)")
        assert self.data.labels is not None
        return torch.randperm(len(self.data.labels), generator=torch.Generator().manual_seed(
            self.request.seed * 100_003 + epoch)).to(self.group.device)

    def _forward_backward(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                          accumulation: int) -> torch.Tensor:
        """This step's loss (detached), its gradient accumulated in the parameters."""
        if accumulation == 1:
            loss = self.loss_fn(model(x), y)
            loss.backward()
            return loss.detach()
        micro = len(y) // accumulation
        total = torch.zeros((), device=x.device)
        for index in range(accumulation):
            part = slice(index * micro, (index + 1) * micro)
            # only the last micro-batch's backward pass sends the gradient (sync's buckets)
            with (self.learner.paradigm.no_sync() if index < accumulation - 1
                  else contextlib.nullcontext()):
                loss = self.loss_fn(model(x[part]), y[part])
                (loss / accumulation).backward()
            total += loss.detach() / accumulation
        return total

    def _round(self, begin_only: bool = False) -> bool:
        """A bmuf/easgd/diloco round as a transaction; True when this group healed in its
        quorum (its state, step included, is now a peer's). ``begin_only``: diloco with
        fragment-delay, whose round's quorum and commit are ``fragment-delay`` steps apart:
        the round is begun here and ended by :meth:`_local_step`."""
        before = self.step
        self.ft.start_step()  # the quorum; a group that must catch up gets a peer's state here
        healed = self.step != before
        paradigm = self.learner.paradigm
        if self.step == self.fail_in_allreduce:  # in the round's quorum, its share unsent
            from sublimate.components.processes.fault_injection import kill_in_allreduce

            kill_in_allreduce(self.ft.manager, list(self.learner.model.parameters()),
                              self.group.slot, self.step, record=self.ft.record)
        if begin_only:
            paradigm.begin_round(self.step)  # type: ignore[attr-defined]
        else:
            paradigm.round_in_quorum(self.step)  # type: ignore[attr-defined]
        if healed:
            self._healed(before)
        return healed

    def _healed(self, from_step: int) -> None:
        log(self.group.rank, f"node{self.groups.group}: took a live peer's state at step "
                             f"{self.step} (was at {from_step}); training on")

    def _wait_for_the_other_groups(self) -> None:
        """Start together: a group that took its first step alone would have the others copy
        its state instead of computing the same first steps, and a failure-free per-step run
        would no longer be exactly the restart mode's."""
        mine = _ready_file(self.request.run_dir, self.groups.group, self.group.rank)
        mine.parent.mkdir(parents=True, exist_ok=True)
        mine.touch()
        if self.groups.replacement:  # the others are training: it joins them at once
            return
        deadline = time.monotonic() + QUORUM_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            ready = sum(_ready_file(self.request.run_dir, g).exists()
                        for g in range(self.groups.groups))
            if ready >= self.groups.groups:
                return
            time.sleep(START_POLL_SECONDS)

    def save_checkpoint(self, step: int, train_seconds: float) -> None:
        """The leader's processes checkpoint and commit; under bmuf, easgd and diloco every
        other group writes its own state beside the leader's (a relaunched job resumes each
        group's own, and ends bit for bit as if it had not stopped), without committing."""
        if self.leads():
            super().save_checkpoint(step, train_seconds)
        elif self.periodic:
            learner = self.learner
            learner.checkpointer.save(step, learner.model, learner.optimizer, learner.paradigm,
                                      group=self.groups.group, train_seconds=train_seconds)

    # -- what the leader does ---------------------------------------------------------------------

    def leads(self) -> bool:
        return self.ft.is_leader()

    def evaluate(self) -> float | None:
        return super().evaluate() if self.leads() else None

    def close_epoch(self, epoch: int, position: int, epoch_loss: torch.Tensor,
                    epoch_seconds: float) -> None:
        data = self.data
        self.train_seconds += epoch_seconds
        epoch_steps = data.steps_per_epoch - position
        leader = self.leads()
        accuracy = self.evaluate() if leader else None
        extra: dict[str, Any] = {"leader": leader, "participants": self.ft.participants}
        if not self._first_epoch_closed and self.launch_to_first_step is not None:
            # this process's first epoch, as the restart mode's loop records it
            extra["launch_to_first_step_seconds"] = self.launch_to_first_step
        self._first_epoch_closed = True
        self.reporter.end_epoch(
            epoch, self.step, epoch_loss / max(epoch_steps, 1), epoch_seconds, epoch_steps,
            total_epochs=self.request.epochs, accuracy=accuracy, learning_rate=self.lr,
            extra=extra, leader=leader and self.group.rank == 0,
            # the groups' rows are not gathered while a round's average travels between them:
            # the gather would queue behind it (and its bound would end that round)
            between=None if self._round_in_flight() else self.ft.gather)

    def _round_in_flight(self) -> bool:
        return getattr(self.learner.paradigm, "in_flight", None) is not None

    def summary(self) -> dict[str, Any]:
        summary = super().summary()
        summary.update(recovery=PER_STEP, replica_groups=self.groups.groups,
                       steps_taken_here=self.ft.summary())
        return summary

    def finish(self) -> dict[str, Any]:
        # The end is recorded before the leader writes the summary: the launcher ends the job
        # once the summary is written, stopping a node still finishing (per_step.Replacer.check),
        # and a node stopped with no end recorded would count as a loss at the last step.
        self.ft.record_end()
        summary = super().finish()
        self.ft.close()
        return summary
