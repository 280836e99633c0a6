"""The launcher's side of per-step recovery (``recovery=per-step``): replace a lost node alone,
and say afterwards what each loss cost.

Under per-step recovery every training node is a replica group (see
:mod:`sublimate.components.training.fault_tolerance`). When one dies, the others go on at the
next step without it; the launcher starts that node again (:class:`Replacer`, on ``local_cwd`` and
``local_netns``: the scheduler's ``restart_replica``; on Kubernetes Volcano restarts the task), and
the replacement copies the weights from a live peer. Only when every node is lost at once does the
job fall back to the restart path: the launcher relaunches it from the last checkpoint.

After the job, :func:`summarize` reads what each node's processes recorded under
``<run>/fault-tolerance/`` (their events and step counters) and the launcher's own record of the
losses, and answers, per loss: which node, at which step, how many steps it lost, and how long
its replacement took to train again; and in total: steps committed against steps attempted.
Standard library only: the launcher never imports torch.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sublimate.components.base import run_files
from sublimate.components.base.elastic_errors import read_failures
from sublimate.components.base.replica_groups import (
    LIGHTHOUSE_HOSTS_ENV,
    LIGHTHOUSE_ROLE,
    read_counters,
)
from sublimate.components.base.runtime import shown_path
from sublimate.components.base.settings import PER_STEP
from sublimate.components.launch.failures import app_id_of
from sublimate.components.monitoring import metrics
from sublimate.components.monitoring.run_report import failure_line

WORKER_ROLE = "worker"
# The label that selects a per-step job's Lighthouse pod (its value: the job's name).
LIGHTHOUSE_LABEL = "sublimate.dev/lighthouse"
# What a replica's state is called (TorchX's AppState names), read without importing TorchX.
RUNNING, SUCCEEDED, FAILED = "RUNNING", "SUCCEEDED", "FAILED"


@dataclass
class Loss:
    """A training node lost while the job ran, and its replacement."""

    node: int
    detected: float  # when the launcher saw its replica fail (epoch seconds)
    killed: float | None = None  # when chaos killed it, if chaos did
    replaced: float | None = None  # when its replacement started
    replacement: int = 0  # the how-many-th replacement of this node


@dataclass
class _Follower:
    """What the launcher keeps while it follows a per-step job, whoever replaces its nodes."""

    runner: Any
    handle: str
    budget: int  # replacements per node
    losses: list[Loss] = field(default_factory=list)
    message: str = ""  # why the job ended, for ``failed`` and ``lost``
    run_dir: Path | None = None  # where the leader writes the summary, once training is done
    stopped: set[int] = field(default_factory=set)  # nodes still running at the end
    started: float = field(default_factory=time.time)

    def found_no_peer(self, node: int) -> bool:
        """Whether ``node``'s last process stopped on finding no peer to copy from."""
        if self.run_dir is None:
            return False
        newest = max((self.run_dir / run_files.FAULT_TOLERANCE).glob(f"node{node}-*.jsonl"),
                     default=None, key=lambda path: path.stem)
        return newest is not None and '"no_peer"' in newest.read_text()

    def state_gone(self, nodes: Sequence[int], failed_now: Sequence[int] = ()) -> bool:
        """Whether no live process holds the job's state: every node was lost in this attempt
        (``failed_now``: just now), and none of their replacements has trained since (one
        trains only once it has copied a live peer's state). They would only wait for a peer,
        as long as the collective timeout, before the job is relaunched from its checkpoint."""
        if self.run_dir is None or not nodes:
            return False
        last_lost = _last_lost(self.losses, failed_now)
        if any(node not in last_lost for node in nodes):
            return False
        # A process of the node started after its last loss that trained holds the state. A
        # second of slack, which can only keep the job waiting: on Kubernetes a pod can be
        # replaced before the launcher's poll sees the loss, on another machine's clock.
        return not any(record["node"] in last_lost
                       and (record["start"] or 0) >= last_lost[record["node"]] - 1
                       and _event(record, "first_commit") is not None
                       for record in _records(self.run_dir).values())

    def failed_in_code(self, nodes: Sequence[int]) -> str | None:
        """Why one of ``nodes`` failed, in one line, when its process raised (it wrote an error
        file since it started): the training code failed, not the node, and a replacement
        would fail the same way. None when they were lost whole (killed, their machine gone),
        which is what replacements are for."""
        if self.run_dir is None or not nodes:
            return None
        started = {node: self.started for node in nodes}
        for loss in self.losses:
            if loss.node in started and loss.replaced is not None:
                started[loss.node] = max(started[loss.node], loss.replaced)
        # kubernetes' app id is <namespace>:<job name>; its pods' rendezvous ids, the name
        app_id = app_id_of(self.handle).rsplit(":", 1)[-1]
        for failure in read_failures(self.run_dir):
            # every node is a torchrun of its own, its rendezvous id the job's and its index
            # (app-id-<node>); torch's error files date a failure to the second
            if failure.app_id.rpartition("-")[0] == app_id and failure.node in started \
                    and failure.time >= int(started[failure.node]):
                return (f"{failure.who} failed: {failure.message}; its traceback: "
                        f"{shown_path(failure.error_file)} (a failure of the training code, "
                        "not a lost node: not replaced)")
        return None

    def summary_written(self) -> bool:
        """Whether this attempt's leader wrote the run's summary (its last act)."""
        if self.run_dir is None:
            return False
        try:
            return (self.run_dir / run_files.SUMMARY).stat().st_mtime >= self.started
        except OSError:
            return False


@dataclass
class Replacer(_Follower):
    """Follows a per-step job's replicas on a local scheduler (one call of :meth:`check` per
    poll), replacing each lost worker node and a lost Lighthouse, up to ``budget`` times per
    node. :meth:`check` returns None while the job goes on, else how it ended: ``succeeded``
    (every node finished), ``lost`` (no node left: relaunch from the checkpoint) or ``failed``
    (a node is out of replacements)."""

    replaced: dict[int, int] = field(default_factory=dict)  # node -> replacements so far
    # set when the launcher is stopping (a signal): a node lost then is not replaced, or the
    # cancel that follows would have to stop a node started under it
    stop: threading.Event | None = None

    def check(self, state: str = "") -> str | None:
        """``state``: the job's (TorchX's name; unused here: a local job ends only when the
        launcher stops it)."""
        states = {key: state.name for key, state in
                  self.runner.replica_states(self.handle).items()}
        workers = {replica: state for (role, replica), state in states.items()
                   if role == WORKER_ROLE}
        failed = sorted(replica for replica, state in workers.items() if state == FAILED)
        if SUCCEEDED in workers.values():
            # A node finished: the job committed its last step. The others in that step finish
            # too (the leader may still be writing the model); a replacement that started too
            # late to take part waits for peers that are gone, so once the summary is written
            # (the leader's last act) the job is done.
            done = RUNNING not in workers.values() or self.summary_written()
            if done:  # what still runs is stopped with the job: it is no loss
                self.stopped = {node for node, state in workers.items() if state == RUNNING}
            return "succeeded" if done else None
        crashed = self.failed_in_code(failed)
        if crashed is not None:
            # its code raised: a replacement would run the same code into the same error
            self.message = crashed
            return "failed"
        if failed and RUNNING not in workers.values():
            self.message = f"lost every node ({', '.join(f'node{n}' for n in failed)})"
            return "lost"
        if any(self.found_no_peer(node) for node in failed):
            # a replacement found no group alive to copy from: the job's state is gone with
            # its nodes, whatever still runs (other replacements, as stateless as it was)
            self.message = "lost every node (a replacement found no live peer to copy from)"
            return "lost"
        if failed and self.state_gone(sorted(workers), failed):
            # the last node that held the state is gone: its replacements would only wait
            self.message = ("lost every node (none of their replacements had copied the "
                            "job's state)")
            return "lost"
        for node in failed:
            if self.replaced.get(node, 0) >= self.budget:
                self.message = (f"node{node} was lost again after {self.budget} replacement(s) "
                                "(max-restarts)")
                return "failed"
            self._replace(node)
        if states.get((LIGHTHOUSE_ROLE, 0)) == FAILED and not (self.stop is not None
                                                                and self.stop.is_set()):
            print("train: the lighthouse stopped; starting it again", flush=True)
            self.runner.restart_replica(self.handle, LIGHTHOUSE_ROLE, 0, {})
        return None

    def _replace(self, node: int) -> None:
        if self.stop is not None and self.stop.is_set():
            return
        count = self.replaced[node] = self.replaced.get(node, 0) + 1
        loss = Loss(node, detected=time.time(), replacement=count)
        print(f"train: lost node{node}; the others go on without it, and a replacement starts "
              f"(replacement {count} of {self.budget} for node{node})", flush=True)
        # The replacement's start-up is timed from now (its workers report it: LAUNCH_TIME_ENV).
        # With its environment unchanged, as Volcano's RestartPod does: a node knows it is a
        # replacement by its own start record in this launch, the same way on every scheduler.
        self.runner.restart_replica(self.handle, WORKER_ROLE, node,
                                    {metrics.LAUNCH_TIME_ENV: f"{time.time():.3f}"})
        loss.replaced = time.time()
        self.losses.append(loss)


@dataclass
class VolcanoWatch(_Follower):
    """Follows a per-step job on Kubernetes, where Volcano replaces a lost node's pod
    (:func:`volcano_per_step`): one call of :meth:`check` per poll, as :class:`Replacer`'s.
    A loss is a worker pod seen ``Failed``, or one that came back under a new uid between two
    polls (Volcano deletes a failed pod and creates it again under the same name, a fresh uid:
    the failure was missed, not absent). The job's own phase ends it: ``Completed`` succeeded;
    ``Failed`` (Volcano's retry budget spent), ``Aborted`` or ``Terminated`` failed. A replacement
    that found no live peer with the job's state ends it as ``lost`` (relaunch from the
    checkpoint), as on one machine."""

    pods: dict[int, str] = field(default_factory=dict)  # node -> the uid of its pod last seen
    counted: set[str] = field(default_factory=set)  # pod uids whose loss is recorded

    def check(self, state: str = "") -> str | None:
        """``state``: the job's, as TorchX names Volcano's phases (``SUCCEEDED``: Completed;
        ``FAILED``: Failed or Terminated; ``CANCELLED``: Aborted; Restarting, Completing and
        the like are ``RUNNING``)."""
        now = time.time()
        for node, (uid, phase) in sorted(self.runner.worker_pods(self.handle).items()):
            known = self.pods.get(node)
            if phase == "Failed" and uid not in self.counted:
                self._lost(node, uid, now)
            elif known is not None and uid != known:
                if known not in self.counted:  # replaced between two polls
                    self._lost(node, known, now)
                self._replaced(node, now)
            self.pods[node] = uid
        if state == "SUCCEEDED":
            return "succeeded"
        if state in ("FAILED", "CANCELLED"):
            self.message = (f"Volcano ended the job ({state}) after {len(self.losses)} lost "
                            f"pod(s) seen; its budget is the job's: max-restarts "
                            f"({self.budget}) x {len(self.pods)} nodes")
            return "failed"
        crashed = self.failed_in_code(sorted({loss.node for loss in self.losses}))
        if crashed is not None:  # Volcano would only restart the pod into the same error
            self.message = crashed
            return "failed"
        if any(self.found_no_peer(loss.node) for loss in self.losses):
            self.message = "lost every node (a replacement found no live peer to copy from)"
            return "lost"
        if self.losses and self.state_gone(sorted(self.pods)):
            self.message = ("lost every node (none of their replacements had copied the "
                            "job's state)")
            return "lost"
        return None

    def _lost(self, node: int, uid: str, now: float) -> None:
        self.counted.add(uid)
        count = sum(1 for loss in self.losses if loss.node == node) + 1
        self.losses.append(Loss(node, detected=now, replacement=count))
        print(f"train: lost node{node}; the others go on without it, and Volcano replaces its "
              f"pod (loss {count} of node{node})", flush=True)

    def _replaced(self, node: int, now: float) -> None:
        for loss in reversed(self.losses):
            if loss.node == node:
                if loss.replaced is None:
                    loss.replaced = now
                return


# --------------------------------------------------------------------------------------------
# What the losses cost


def _records(run_dir: Path) -> dict[str, dict[str, Any]]:
    """Every process incarnation's record: events and counters, by file stem (node<g>-<ms>)."""
    folder = run_dir / run_files.FAULT_TOLERANCE
    found: dict[str, dict[str, Any]] = {}
    for path in sorted(folder.glob("node*.jsonl")):
        events = []
        for line in path.read_text().splitlines():
            try:
                events.append(json.loads(line))
            except ValueError:  # a process killed mid-write leaves half a line
                continue
        counters_path = path.with_suffix(".counters")
        counters = read_counters(counters_path) if counters_path.is_file() else {}
        node = int(path.stem.split("-")[0].removeprefix("node"))
        start = next((e["time"] for e in events if e["event"] == "start"), None)
        found[path.stem] = {"node": node, "start": start, "events": events,
                            "counters": counters}
    return found


def _last_lost(losses: Sequence[Loss], lost_now: Sequence[int] = ()) -> dict[int, float]:
    """When each lost node's latest loss was seen (``lost_now``: nodes seen lost just now)."""
    latest: dict[int, float] = {}
    for loss in losses:
        latest[loss.node] = max(latest.get(loss.node, 0.0), loss.detected)
    now = time.time()
    latest.update((node, now) for node in lost_now)
    return latest


def _steps(abort: dict[str, Any]) -> int:
    """The steps a dropped transaction held (one before commit-every)."""
    return int(abort.get("steps", 1))


def _event(record: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((e for e in record["events"] if e["event"] == name), None)


def summarize(run_dir: Path, losses: list[Loss], since: float,
              kills: Sequence[Any] = (), stopped: Collection[int] = (),
              unit: str = "step", job_restarts: int = 0) -> dict[str, Any]:
    """The ``fault_tolerance`` section of ``train-summary.json`` for the attempt that started at
    ``since`` (epoch seconds): per lost node, and in total.

    A loss is a node's process that ended without its ``end`` record (whatever the launcher saw:
    a node may die after the last step it took part in, or on a cluster where Volcano replaced
    it). The launcher's own record of the loss (``losses``) and chaos's ``kills`` date it and
    time its replacement when they have it. ``stopped``: the nodes whose process the launcher
    stopped at the job's end (a replacement that never caught up), which are no loss.
    ``unit``: what a transaction is, ``step`` or (bmuf, easgd, diloco) ``round``, which the
    section's counts count. ``job_restarts``: the relaunches of the whole job before this
    attempt (every node lost, or a replacement with no live peer); the losses are this
    attempt's."""
    for loss in losses:
        killed = [kill.time for kill in kills if kill.node == loss.node
                  and kill.time <= loss.detected]
        if killed and loss.killed is None:
            loss.killed = max(killed)
    records = [r for r in _records(run_dir).values() if (r["start"] or 0) >= since - 1]
    by_node: dict[int, list[dict[str, Any]]] = {}
    for record in sorted(records, key=lambda r: r["start"] or 0):
        by_node.setdefault(record["node"], []).append(record)
    unused = sorted(losses, key=lambda loss: loss.detected)
    # What the launcher stopped with the job is a replacement that had not caught up: each such
    # node's newest process, if it started after the node's last loss was seen. A node with no
    # loss seen has no replacement: the job can end before the launcher sees a node die (its
    # agent notices the dead worker a moment later), and its record is a loss. So is a lost
    # process still newest because its replacement had not recorded its start yet. (A window of
    # a second before the replacement took a node killed within a second of its start for one
    # stopped.)
    last_seen = _last_lost(losses)
    stopped_last = {id(incarnations[-1]) for node, incarnations in by_node.items()
                    if node in stopped and node in last_seen
                    and (incarnations[-1]["start"] or 0) >= last_seen[node]}
    # A replacement that started after the job's last step was committed never had a part:
    # stopped with the job, it is no loss.
    ended = min((e["time"] for r in records for e in r["events"] if e["event"] == "end"),
                default=None)
    records = [r for r in records if ended is None or (r["start"] or 0) < ended]
    by_node = {node: [r for r in incarnations if r in records]
               for node, incarnations in by_node.items()}
    failures = []
    for node, incarnations in sorted(by_node.items()):
        for index, record in enumerate(incarnations):
            # ended well, stopped on finding no peer to copy (the job was over, or gone), or
            # stopped by the launcher with the job
            if _event(record, "end") is not None or _event(record, "no_peer") is not None \
                    or id(record) in stopped_last:
                continue
            matched = next((lost for lost in unused if lost.node == node
                            and lost.detected >= (record["start"] or 0)), None)
            if matched is not None:
                unused.remove(matched)
            counters = record["counters"]
            last_event = record["events"][-1]["time"] if record["events"] else record["start"]
            # when it died: chaos's kill, else the fault injection's own record of its kill,
            # else when the launcher saw it (a cluster's loss: later than the death)
            injected = _event(record, "killed")
            moment = (matched.killed if matched is not None and matched.killed else
                      injected["time"] if injected is not None else
                      matched.detected if matched is not None else last_event)
            entry: dict[str, Any] = {
                "node": node, "time": round(moment or 0, 3), "step": counters.get("last_step"),
                # the step in flight when it died: attempted, neither committed nor dropped
                "steps_lost": counters.get("attempted", 0) - counters.get("committed", 0)
                - counters.get("dropped", 0)}
            if matched is not None:
                entry["detected_after_seconds"] = round(matched.detected - moment, 3)
            entry.update(_survivors(records, record, moment))
            replacement = incarnations[index + 1] if index + 1 < len(incarnations) else None
            first = _event(replacement, "first_commit") if replacement else None
            if replacement is not None and first is not None:
                # from the replacement's process start (the launcher's clock), else from its
                # own first record, after its imports
                started = matched.replaced if matched is not None and matched.replaced else \
                    replacement["start"]
                entry["replaced_at"] = round(started, 3)
                entry["replacement_trained_after_seconds"] = round(first["time"] - started, 3)
                healed = _event(replacement, "healed")
                entry["healed_at_step"] = healed["step"] if healed else None
            failures.append(entry)
    for loss in unused:  # lost before it recorded anything (in its start-up): no step taken
        moment = loss.killed or loss.detected
        failures.append({"node": loss.node, "time": round(moment, 3), "step": None,
                         "steps_lost": 0, "in_start_up": True,
                         "detected_after_seconds": round(loss.detected - moment, 3)})
    failures.sort(key=lambda failure: failure["time"])
    attempted = sum(r["counters"].get("attempted", 0) for r in records)
    committed = sum(r["counters"].get("committed", 0) for r in records)
    # sync's transactions of several steps (commit-every): what one loss can cost
    per_commit = max((e.get("steps_per_commit", 1) for r in records for e in r["events"]
                      if e["event"] == "start"), default=1)
    return {
        "recovery": PER_STEP,
        "unit": unit,
        "job_restarts": job_restarts,
        "nodes_lost": len(failures),
        "failures": failures,
        # group-steps: a step committed by 3 groups counts 3
        "steps_attempted": attempted,
        "steps_committed": committed,
        "committed_ratio": round(committed / attempted, 5) if attempted else None,
        "steps_per_commit": per_commit,
        # at most one transaction in flight (steps_per_commit steps) is lost per lost node: the
        # best per-step recovery can do
        "committed_bound": round(1 - len(failures) * per_commit / attempted, 5)
        if attempted else None,
        # steps that every group took again (a peer died in their all-reduce, or too few
        # groups were alive), counted once per group that dropped them
        "dropped_steps": sum(_steps(e) for r in records for e in r["events"]
                             if e["event"] == "abort"),
        "timeline": timeline(records),
    }


def _survivors(records: list[dict[str, Any]], lost: dict[str, Any],
               moment: float) -> dict[str, Any]:
    """What a loss at ``moment`` cost the groups that survived it: how long they stood still,
    from the loss to their first step committed after it (without the lost group, or after
    dropping the step it broke), and the steps they dropped meanwhile (one per group that
    dropped it). Empty when no survivor committed a step after it (the job was over)."""
    others = [record for record in records if record is not lost
              and record["node"] != lost["node"] and (record["start"] or 0) <= moment]
    resumed = min((event["time"] for record in others for event in record["events"]
                   if event["event"] == "resumed" and event["time"] >= moment), default=None)
    if resumed is None:
        return {}
    dropped = sum(_steps(event) for record in others for event in record["events"]
                  if event["event"] == "abort" and moment <= event["time"] <= resumed)
    return {"survivors_stalled_seconds": round(resumed - moment, 3),
            "survivor_steps_dropped": dropped}


def timeline(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Which node took part in which steps: one interval per process incarnation, from its first
    committed step to its last (for the report's timeline)."""
    spans = []
    for record in sorted(records, key=lambda r: (r["node"], r["start"] or 0)):
        first = _event(record, "first_commit")
        last = record["counters"].get("last_step")
        if first is not None and last:
            spans.append({"node": record["node"], "from_step": first["step"],
                          "to_step": last, "replacement": bool((_event(record, "start") or {})
                                                               .get("replacement"))})
    return spans


def merge_into_summary(run_dir: Path, section: Any, key: str = "fault_tolerance") -> None:
    """Add ``section`` to the run's ``train-summary.json`` (written by the workers) as ``key``."""
    from sublimate.components.base.durable_files import write_json

    path = run_dir / run_files.SUMMARY
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError):
        summary = {}
    summary[key] = section
    write_json(summary, path, sort_keys=False)


def describe(section: dict[str, Any]) -> list[str]:
    """The launcher's closing lines about per-step recovery."""
    unit = section.get("unit", "step")
    lines = [failure_line(failure, unit) for failure in section["failures"]]
    restarts = section.get("job_restarts", 0)
    if section.get("steps_attempted"):
        lines.append(
            f"per-step recovery: {section['nodes_lost']} node(s) lost"
            + (f" in the last attempt, after {restarts} relaunch(es) of the whole job from "
               "its checkpoint; " if restarts else ", no job restart; ") +
            f"{section['steps_committed']} of {section['steps_attempted']} group-{unit}s "
            f"committed ({100 * section['committed_ratio']:.2f}%, bound "
            f"{100 * section['committed_bound']:.2f}%)")
    return lines


# --------------------------------------------------------------------------------------------
# Kubernetes: Volcano replaces a lost node


def volcano_per_step(job: dict[str, Any], min_groups: int, replacements: int) -> list[Any]:
    """Make the Volcano job of a per-step app survive any node's loss, ``replacements`` times
    per node; return the Lighthouse's Deployment and Service, which run beside the job.

    Each rule below is Volcano's, read in its source (docs/fault-tolerance.md links each line):

    * **A lost node's pod is replaced alone**: ``RestartPod`` on ``PodFailed`` and
      ``PodEvicted`` deletes that one pod, and the controller creates it again under the same
      name (TorchX's ``RestartJob`` would restart every node). The replacement runs with the
      same environment and knows it is one by its own start record (per_step_loop).
    * **The budget is the job's**: every ``RestartPod`` adds one to the job's ``retryCount``,
      and the job fails once that count reaches its ``maxRetry``. An unset or zero ``maxRetry``
      becomes 3 at admission, which failed the job on the third pod lost, whatever
      ``max-restarts`` said. So ``maxRetry`` is one above every node's replacements together:
      no node's ``replacements``-th loss fails the job (nor, since the count is the job's, does
      one node's loss beyond that while others lost fewer). A task's ``maxRetry`` counts only
      containers restarted in place, which ``restartPolicy: Never`` never does: not set.
    * **The gang is the minimum of groups**: the task's ``minAvailable``, unset, becomes its
      replicas at admission; both it and the job's are ``min_groups``.
    * **Done when every node succeeded**: ``TaskCompleted`` (all of the task's pods succeeded)
      completes the job. A replacement that starts after the job's last step stops with
      success (per_step_loop).
    * **The Lighthouse is no task of the job**: on every ``RestartPod`` Volcano calls its
      plugins' job-delete hooks, and the svc plugin deletes the job's headless Service with it,
      the name the nodes found the Lighthouse by, until the next sync creates it again. It is
      a Deployment (its pod restarted however often, with no budget and no effect on the job)
      behind a Service of its own, both owned by the job (deleted with it). The nodes reach
      each other by address, so the job needs no svc plugin at all: only env, for
      ``VC_TASK_INDEX``.
    """
    from kubernetes import client

    spec = job["spec"]
    name = job["metadata"]["name"]
    lighthouse_tasks = [task for task in spec["tasks"]
                        if task["name"].startswith(LIGHTHOUSE_ROLE)]
    (worker,) = [task for task in spec["tasks"] if task not in lighthouse_tasks]
    (lighthouse_task,) = lighthouse_tasks
    spec["tasks"] = [worker]
    worker["minAvailable"] = min_groups
    worker.pop("maxRetry", None)
    worker["policies"] = [{"event": "PodFailed", "action": "RestartPod"},
                          {"event": "PodEvicted", "action": "RestartPod"},
                          {"event": "TaskCompleted", "action": "CompleteJob"}]
    spec["minAvailable"] = min_groups
    spec["maxRetry"] = replacements * worker["replicas"] + 1
    for field_name in ("minSuccess", "policies"):
        spec.pop(field_name, None)
    spec["plugins"] = {"env": []}
    service_name = lighthouse_name(name)
    worker["template"].spec.containers[0].env.append(
        client.V1EnvVar(name=LIGHTHOUSE_HOSTS_ENV, value=service_name))
    pod = lighthouse_task["template"]
    pod.spec.restart_policy = "Always"  # a Deployment's pods restart in place
    labels = {**(pod.metadata.labels or {}), LIGHTHOUSE_LABEL: name}
    pod.metadata.labels = labels
    port = pod.spec.containers[0].ports[0].container_port
    deployment = client.V1Deployment(
        api_version="apps/v1", kind="Deployment",
        metadata=client.V1ObjectMeta(name=service_name, labels=labels),
        spec=client.V1DeploymentSpec(
            replicas=1, selector=client.V1LabelSelector(match_labels={LIGHTHOUSE_LABEL: name}),
            template=pod))
    service = client.V1Service(
        api_version="v1", kind="Service",
        metadata=client.V1ObjectMeta(name=service_name, labels=labels),
        spec=client.V1ServiceSpec(
            selector={LIGHTHOUSE_LABEL: name},
            ports=[client.V1ServicePort(name=LIGHTHOUSE_ROLE, port=port, target_port=port)]))
    return [deployment, service]


def lighthouse_name(job_name: str) -> str:
    """The name of a per-step job's Lighthouse Deployment and Service (the nodes' address)."""
    return f"{job_name}-{LIGHTHOUSE_ROLE}"
