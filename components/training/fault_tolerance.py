"""Per-step fault tolerance for a training process: each node is a replica group, and every step
(or averaging round) is a transaction that the groups alive at that moment commit together.

This is torchft (PyTorch's fault-tolerance library) wired into sublimate's job. The Lighthouse, a
role of the job that runs on no training node (:mod:`sublimate.components.launch.lighthouse`),
forms a quorum of the groups before every step; the survivors of a failure go on at the next step
without the lost group, and a replacement group copies the weights from a live peer (no
checkpoint read) and rejoins. Within a group, the processes of one node talk over the node's own
process group (torchrun's); between groups only through the torchft Manager, whose collectives
fail softly: an error marks the step as not to be committed instead of raising.

Choices made against torchft's defaults, each checked on this machine with torch 2.13 and gloo:

* a flat all-reduce through :meth:`Manager.allreduce` rather than torchft's
  ``DistributedDataParallel``: in torchft 0.2.0 the latter's comm hook asserts
  (``assert fut._fut``) in the survivors when a peer dies mid-step, ending the very processes
  that should go on;
* the checkpoint transport over the process group (``PGTransport``) rather than HTTP, whose
  server binds every address of the host and advertises the host name, which resolves to
  127.0.0.1 inside a ``local_netns`` node;
* the Manager's server bound to this node's address rather than ``[::]`` (torchft hard-codes
  the wildcard; :func:`_bind_manager_server_to` narrows it);
* ``init_sync=False``: every group seeds its model identically (``seed``), so step 0 needs no
  broadcast, and a failure-free per-step run computes exactly what the restart mode does;
* a group between the replica groups that fails fast on every survivor
  (:class:`~sublimate.components.training.fail_fast_gloo.FailFastGloo`): closed as soon as one
  of its collectives fails, so that the failure reaches every survivor, not only the dead
  node's neighbours; built within a few seconds or the step dropped, where torchft's would wait
  the collective timeout for a peer that died after the quorum named it.

``docs/fault-tolerance.md`` says when to use it and what it costs.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import AllreduceOptions, ReduceOp
from torch.distributed.distributed_c10d import AllgatherOptions

from sublimate.components.base import run_files
from sublimate.components.base.replica_groups import (
    ReplicaGroups,
    StepCounters,
    incarnation_name,
    node_address,
)
from sublimate.components.monitoring.traffic import Traffic, tensor_bytes

# The longest a step's quorum waits for enough groups (the rendezvous-timeout's default).
QUORUM_TIMEOUT_SECONDS = 300
# The longest the groups wait for each other's rows at an epoch's end (FaultTolerance.gather).
GATHER_SECONDS = 5.0
# How often a replacement whose quorum holds no peer with the job's state asks again.
PEER_POLL_SECONDS = 0.1


def _short(error: str) -> str:
    """gloo's error without its source location and advice (``Connection closed by peer
    [10.213.7.2]:4312``)."""
    return error.split("] ", 1)[-1].split(". This is", 1)[0]


def _quiet_torchft() -> None:
    """torchft logs a traceback for every collective that a lost peer broke, on every survivor;
    :meth:`FaultTolerance.commit` says the same in one line."""
    logging.getLogger("torchft").setLevel(logging.CRITICAL)


def _bind_manager_server_to(address: str) -> None:
    """Make torchft's Manager bind its server to ``address`` instead of every address.

    torchft 0.2.0 builds ``ManagerServer(bind="[::]:<port>")`` inside ``Manager.__init__``; a
    server on every address of the host is more than a training node should open (and on one
    machine, every simulated node would share the host's addresses). The module attribute is
    replaced by a constructor that keeps the port and narrows the address.
    """
    import torchft.manager as manager_module

    original = getattr(manager_module.ManagerServer, "__wrapped__", manager_module.ManagerServer)

    def bound_server(*args: Any, bind: str, **kwargs: Any) -> Any:
        port = bind.rsplit(":", 1)[1]
        return original(*args, bind=f"{address}:{port}", **kwargs)

    bound_server.__wrapped__ = original  # type: ignore[attr-defined]
    manager_module.ManagerServer = bound_server


@dataclass(frozen=True, slots=True)
class _Average:
    """An all-reduce in flight between the groups, and what finishes it: the division of its
    sum by the groups that took part."""

    work: Any  # the process group's Work
    tensor: torch.Tensor
    participants: int


@dataclass(frozen=True, slots=True)
class _Gather:
    """An all-gather of encoded payloads in flight between the groups."""

    work: Any  # the process group's Work
    gathered: list[torch.Tensor]  # one payload per group, in the group order
    participants: int


class NoLivePeer(RuntimeError):
    """A replacement found no live group with the job's state to copy within the bound."""


class JobAlreadyDone(RuntimeError):
    """A replacement started after the job's last step: there is nothing left for it to do."""


class FaultTolerance:
    """This process's share of per-step recovery: a torchft Manager for its replica group.

    ``state`` returns everything a replacement needs to continue from this process's point (model,
    optimizer, paradigm, the run's clocks); ``load_state`` applies what a live peer sent. Per
    step: :meth:`start_step` (the quorum; returns the committed step count, which a healed
    replacement finds ahead of where it started), :meth:`average` on what the step averages, then
    :meth:`commit` (True: apply the step; False: it is discarded, and every group retries it).
    ``async_quorum``: form the quorum while the step computes (sync SGD committing every step,
    where a quorum per step must cost little; a healing group's step then contributes nothing
    and takes the peer's state at the commit) or before it (bmuf/easgd rounds, and sync
    transactions of several steps: the peer's state comes first). A transaction of several
    steps calls :meth:`extend` for each step after its first and commits them together
    (:meth:`commit` with ``steps``).
    """

    def __init__(self, groups: ReplicaGroups, group_rank: int, group_world: int,
                 device: torch.device, run_dir: Path, timeout_seconds: float,
                 state: Callable[[], dict[str, Any]],
                 load_state: Callable[[dict[str, Any]], None], async_quorum: bool = True,
                 job_progress: Callable[[], int] | None = None,
                 job_length: int | None = None, steps_per_commit: int = 1) -> None:
        # torchft's Rust logger reads RUST_LOG when torchft is first imported: the launcher sets
        # it on every node; this covers a process started otherwise, if it comes first.
        os.environ.setdefault("RUST_LOG", "warn")
        _quiet_torchft()
        from torchft.checkpointing.pg_transport import PGTransport
        from torchft.manager import Manager

        from sublimate.components.training.fail_fast_gloo import FailFastGloo

        self.groups, self.group_rank, self.group_world = groups, group_rank, group_world
        # A replacement copies the job's state from a live peer before its first step: a
        # quorum of replacements alone (a survivor was busy, or stuck on a dead peer, when they
        # asked) has nothing to copy, and trained the job again from step 0 (DiLoCo, 2 kills of
        # 3 nodes). job_progress: the steps the job has committed (0: it is at its start).
        self._peer_wait_seconds = float(timeout_seconds)
        self._job_progress = job_progress if groups.replacement else None
        self._job_length = job_length  # the count job_progress reaches at the job's end
        self.workers = groups.groups * group_world  # every worker of the job, alive or not
        self.started = time.time()
        address = node_address()
        _bind_manager_server_to(address)
        timeout = timedelta(seconds=timeout_seconds)
        # A quorum that waits for replacements (fewer groups alive than min_groups) may wait as
        # long as a start does.
        quorum_timeout = max(timeout, timedelta(seconds=QUORUM_TIMEOUT_SECONDS))
        # gloo between groups on every device: torchft's NCCL groups need a GPU build to test,
        # and the tensors a step averages are copied to the CPU anyway when they are small.
        process_group = self.process_group = FailFastGloo(timeout,
                                                          bound_first=groups.replacement)
        self.manager = Manager(
            pg=process_group, load_state_dict=load_state, state_dict=state,
            min_replica_size=groups.min_groups, use_async_quorum=async_quorum,
            timeout=timeout, quorum_timeout=quorum_timeout,
            connect_timeout=timedelta(seconds=60), rank=group_rank, world_size=group_world,
            store_addr=address, store_port=int(os.environ["MASTER_PORT"]),
            lighthouse_addr=groups.lighthouse, replica_id=f"node{groups.group}",
            hostname=address, init_sync=False,
            checkpoint_transport=PGTransport(process_group, timeout, torch.device("cpu")))
        self.recording = group_rank == 0  # one record per group
        # What average() sends between the groups (the per-step loop shares its paradigm's).
        self.traffic = Traffic()
        self.participants = 0
        self.committed = self.attempted = self.aborted = self.heals = 0
        self._expected = 0  # the step count this step commits to, from start_step
        self._first_commit = True
        self._disturbed = False  # a step was dropped since the last commit
        folder = Path(run_dir) / run_files.FAULT_TOLERANCE
        stem = incarnation_name(groups.group, self.started)
        self._events = (folder / f"{stem}.jsonl") if self.recording else None
        self._ended = False
        self._counters = StepCounters(folder / f"{stem}.counters") if self.recording else None
        # the most steps one transaction holds (what a loss can cost: per_step.summarize)
        self.steps_per_commit = steps_per_commit
        self.async_quorum = async_quorum
        self.record("start", step=0, pid=os.getpid(), replacement=groups.replacement,
                    steps_per_commit=steps_per_commit)

    # -- the step transaction -----------------------------------------------------------------

    def start_step(self) -> int:
        """Ask for this step's quorum (answered while the step computes) and return the
        committed step count the step will have if it commits."""
        # Read before the quorum: with the quorum answered in the background, a group that
        # heals may have its peer's step count by the time start_quorum returns.
        self._expected = self.manager.current_step()
        if self._job_progress is not None:
            self._check_the_job_goes_on(self._job_progress())  # before a quorum it may not get
        self.manager.start_quorum()
        if self._job_progress is not None:
            self._wait_for_a_peer_with_the_state()
        self.attempted += 1
        if self._counters is not None:
            self._counters.values[0] = self.attempted
        return self.manager.current_step()

    def _wait_for_a_peer_with_the_state(self) -> None:
        """Ask for quorums until one holds a group with the job's state (this replacement then
        heals from it), or the job turns out to be at its start. A quorum without one is left
        before any collective: its other members are replacements too, and leave it as well.
        Raises :class:`NoLivePeer` after the collective timeout: no survivor answered for as
        long as a live one may be silent, and the job must resume from its checkpoint."""
        assert self._job_progress is not None
        deadline = time.monotonic() + self._peer_wait_seconds
        waiting = False
        while True:
            self.manager.wait_quorum()
            if self.manager.errored() is not None:
                return  # the step is dropped; the next one asks again, and checks again
            if self.manager.current_step() > 0:
                break  # healed
            progress = self._job_progress()
            if progress == 0:
                break  # the job is at its start: there is nothing to copy
            self._check_the_job_goes_on(progress)
            if time.monotonic() >= deadline:
                self.record("no_peer", step=0, job_step=progress)
                raise NoLivePeer(
                    f"node{self.groups.group}: no live peer holds the job's state (step "
                    f"{progress}) after {self._peer_wait_seconds:.0f}s")
            if not waiting:
                waiting = True
                self.record("waiting_for_state", step=0, job_step=progress)
                if self.recording:
                    print(f"node{self.groups.group}: its quorum holds no peer with the job's "
                          f"state (step {progress}); asking again", flush=True)
            time.sleep(PEER_POLL_SECONDS)
            self.manager.start_quorum()
        self._job_progress = None

    def _check_the_job_goes_on(self, progress: int) -> None:
        """Raise :class:`JobAlreadyDone` when the job committed its last step already. On
        Kubernetes a pod that fails is restarted until the job's budget is spent: one that
        waited for peers gone with the job's end would fail a finished job."""
        if self._job_length is not None and progress >= self._job_length:
            self.record("end", step=progress, late=True)
            raise JobAlreadyDone(f"node{self.groups.group}: the job committed its last step "
                                 f"({progress}) before this replacement joined")

    def average(self, tensor: torch.Tensor) -> None:
        """Replace ``tensor`` in place by its mean over every process of the participating
        groups (within the node first, then between groups; a group that is healing
        contributes nothing). An error between groups is not raised: :meth:`commit` says
        False."""
        self.finish_averages([self.start_average(tensor, node_first=True)])

    def start_average(self, tensor: torch.Tensor, node_first: bool = False) -> Any:
        """Start replacing ``tensor`` by its mean over the participating groups (between groups
        only; ``node_first``: averaged within the node first, at once, as :meth:`average`
        does); returns the all-reduce in flight (None once the transaction failed: it is
        dropped anyway), for :meth:`finish_averages`.

        The all-reduce goes to the process group directly rather than through
        :meth:`Manager.allreduce`, which does the same (a SUM, then a division by the
        participants) through a chain of futures with a timeout each: 0.3 ms of CPU per call on
        this machine (``benchmarks/torchft_step_cost.py``), a step's worth of the job's
        throughput on 4 nodes that share 2 cores. The Manager still hears of every error
        (:meth:`Manager.report_error`), so its commit says False."""
        if node_first and self.group_world > 1:  # not counted: it does not leave the node
            dist.all_reduce(tensor)
            tensor /= self.group_world
        manager = self.manager
        if manager.errored() is not None:
            return None
        manager.wait_quorum()
        participants = manager.num_participants()
        if not manager.is_participating():  # healing: its gradient is not the job's yet
            tensor.zero_()
        self.traffic.all_reduce(tensor_bytes(tensor), participants)
        options = AllreduceOptions()
        options.reduceOp = ReduceOp(ReduceOp.SUM)
        try:
            return _Average(self.process_group.allreduce([tensor], options), tensor,
                            participants)
        except Exception as error:  # any failure drops the transaction
            manager.report_error(error)
            return None

    def finish_averages(self, works: list[Any]) -> None:
        """Wait for the all-reduces :meth:`start_average` started; an error between groups is
        not raised (:meth:`commit` says False), and closes the failed group at once."""
        manager = self.manager
        for work in works:
            if work is None or manager.errored() is not None:
                continue
            try:
                work.work.wait()
            except Exception as error:  # gloo's error: a peer's loss
                manager.report_error(error)
                continue
            work.tensor.div_(work.participants)
        if manager.errored() is not None:
            self.process_group.close_after_error()  # its peers fail too, at once

    def average_encoded(self, payload: torch.Tensor,
                        decode: Callable[[torch.Tensor], torch.Tensor],
                        out: torch.Tensor) -> None:
        """Set ``out`` to the mean over every process of the participating groups of
        ``decode(payload)`` (diloco's int8 and top-k outer codecs, whose payloads a sum cannot
        combine): the payloads all-gathered between the groups, decoded and summed in the
        group order, so that every group holds the same bits; then averaged within the node
        (not counted: it does not leave the node). A group that is healing sends zeros (which
        decode to zeros). An error between groups is not raised: ``out`` is left as it was,
        and :meth:`commit` says False."""
        self.finish_average_encoded(self.start_average_encoded(payload), decode, out)

    def start_average_encoded(self, payload: torch.Tensor) -> _Gather | None:
        """:meth:`average_encoded`'s all-gather between the groups, started: returns it in
        flight (None once the transaction failed), for :meth:`finish_average_encoded`."""
        manager = self.manager
        if manager.errored() is not None:
            return None
        manager.wait_quorum()
        participants = manager.num_participants()
        if not manager.is_participating():
            payload = torch.zeros_like(payload)
        parties = self.process_group.size()
        gathered = [torch.empty_like(payload) for _ in range(parties)]
        self.traffic.all_gather(tensor_bytes(payload), parties)
        try:
            work = self.process_group.allgather([gathered], [payload], AllgatherOptions())
        except Exception as error:  # any failure drops the transaction
            manager.report_error(error)
            self.process_group.close_after_error()
            return None
        return _Gather(work, gathered, participants)

    def finish_average_encoded(self, pending: _Gather | None,
                               decode: Callable[[torch.Tensor], torch.Tensor],
                               out: torch.Tensor) -> None:
        """Wait for :meth:`start_average_encoded`'s all-gather, then set ``out`` (see
        :meth:`average_encoded`)."""
        manager = self.manager
        mean: torch.Tensor | None = None
        if pending is not None and manager.errored() is None:
            try:
                pending.work.wait()
            except Exception as error:  # gloo's error: a peer's loss
                manager.report_error(error)
                self.process_group.close_after_error()  # its peers fail too, at once
            else:
                mean = decode(pending.gathered[0])
                for other in pending.gathered[1:]:
                    mean += decode(other)
                mean /= pending.participants
        if self.group_world > 1:  # every process of the node takes part, failed or not
            within = out.reshape(-1).clone() if mean is None else mean
            dist.all_reduce(within)
            within /= self.group_world
            mean = within if mean is not None else None
        if mean is not None:
            out.copy_(mean.view_as(out))

    def gather(self, rows: torch.Tensor) -> torch.Tensor | None:
        """Every participating group's ``rows`` (the same shape on each: one row per process of
        a node), stacked; None when a group is missing. For what a node cannot see alone (the
        epoch's stragglers): called by every group at the same committed step, between two
        transactions, on the group of the last one. Bounded by ``GATHER_SECONDS``: a group
        that left this step's quorum (it healed at the commit, or failed it) is not waited for
        past that, and the failed group is closed, so the next transaction forms a new one."""
        manager = self.manager
        try:
            participants = manager.num_participants()
        except Exception:  # the last quorum failed: there is no group to gather on
            return None
        if participants <= 1:
            return rows if participants == 1 and manager.is_participating() else None
        gathered = [torch.empty_like(rows) for _ in range(participants)]
        options = AllgatherOptions()
        options.timeout = timedelta(seconds=GATHER_SECONDS)
        try:
            self.process_group.allgather([gathered], [rows], options).wait()
        except Exception:  # a group gone: the rows of this node alone
            self.process_group.close_after_error()
            return None
        return torch.cat(gathered)

    def failed(self) -> bool:
        """Whether a collective of the transaction in flight failed (it will not commit)."""
        return self.manager.errored() is not None

    def extend(self) -> None:
        """The transaction in flight takes one more step (it commits them together)."""
        self.attempted += 1
        if self._counters is not None:
            self._counters.values[0] = self.attempted

    def commit(self, steps: int = 1) -> bool:
        """Whether every participating group completed the transaction's ``steps`` steps
        (one, unless :meth:`extend` added more): apply them only then. A healed replacement
        has its peer's state applied here (a quorum formed while the step computed), before it
        steps, or at :meth:`start_step`."""
        manager = self.manager
        committed = manager.should_commit()
        step = manager.current_step()
        if committed and steps > 1:
            # torchft counts a commit as one step; the job's count is in steps (its batches,
            # its epochs, what a replacement heals to), and the Manager's is what the quorum
            # compares and a replacement copies
            step += steps - 1
            manager.load_state_dict({
                "step": step, "batches_committed": manager.batches_committed()
                + (steps - 1) * manager.num_participants()})
        if step > self._expected + (steps if committed else 0):  # healed: a peer's state
            self.heals += 1
            self.record("healed", step=step - (steps if committed else 0))
        participants = self.manager.num_participants()
        changed = participants != self.participants
        if changed:
            self.participants = participants
            self.record("quorum", step=step, participants=participants)
        if committed:
            if (changed or self._disturbed) and not self._first_commit:
                # the first step committed after a drop or without a lost group: how long the
                # survivors of a failure stood still (per_step.summarize)
                self.record("resumed", step=step, participants=participants)
            self._disturbed = False
            self.committed += steps
            if self._counters is not None:
                values = self._counters.values
                values[1], values[2] = self.committed, step
            if self._first_commit:
                self._first_commit = False
                self.record("first_commit", step=step)
        else:
            self._disturbed = True
            self.aborted += steps
            if self._counters is not None:
                self._counters.values[3] = self.aborted
            error = manager.errored()
            why = str(error).splitlines()[0][:200] if error else \
                f"fewer than {self.groups.min_groups} group(s) alive"
            self.record("abort", step=step, steps=steps, error=why)
            if self.recording:
                which = f"step {step + 1}" if steps == 1 else f"steps {step + 1}-{step + steps}"
                print(f"node{self.groups.group}: {which} dropped, every group takes "
                      f"{'it' if steps == 1 else 'them'} again ({_short(why)})", flush=True)
        return committed

    def participating_workers(self) -> int:
        """The workers of the groups in this step's quorum (a group healing counts none)."""
        return self.manager.num_participants() * self.group_world

    @property
    def step(self) -> int:
        """Steps committed by the job so far (the Manager's count)."""
        return self.manager.current_step()

    def is_leader(self) -> bool:
        """Whether this group is the quorum's first (it evaluates, logs the job's epoch line,
        checkpoints and writes the model: one group does, whichever groups are alive)."""
        return self.manager.participating_rank() == 0

    # -- records ------------------------------------------------------------------------------

    def record(self, event: str, **fields: Any) -> None:
        if self._events is None:
            return
        with self._events.open("a") as log:
            log.write(json.dumps({"event": event, "time": round(time.time(), 4), **fields})
                      + "\n")

    def summary(self) -> dict[str, int]:
        return {"attempted": self.attempted, "committed": self.committed,
                "aborted": self.aborted, "heals": self.heals}

    def record_end(self) -> None:
        """Record that this process took its part to the job's end (once)."""
        if not self._ended:
            self._ended = True
            self.record("end", step=self.step, **self.summary())

    def close(self) -> None:
        self.record_end()
        if self._counters is not None:
            self._counters.close()
        self.manager.shutdown(wait=False)
