"""A finished local run, run again: ``retry`` (``argo retry``: the same run, in its own folder and
under its name, its failed nodes and what comes after them run again, the rest kept) and
``resubmit`` (``argo resubmit``: a new run of the same manifest; ``memoized``, it keeps what
succeeded, as a retry would). What is kept is ``templates.rerun``'s to decide; this module reads
the earlier run from its folder, moves aside what the nodes that run again leave there, and
returns the ``Run``, not started (``sublimate retry`` runs it in the foreground, the server in a
thread of its own).

A retry holds an exclusive lock on its run folder (``.retry.lock``) from the moment it reads
the earlier status until its run ends, so two retries of one run never overlap; the earlier
status and the folders of the nodes that run again are kept under ``retries/<n>/``.
"""

from __future__ import annotations

import copy
import fcntl
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .engine import Run, prepare_workflow
from .pods.plan import node_folder
from .records.run_folder import STATUS_FILE, runner_gone, write_durably
from .records.run_types import CarriedNodes, RunOptions
from .templates.rerun import RerunError, called_names, plan_resubmit, plan_retry

# Argo's label on a resubmitted workflow (common.LabelKeyPreviousWorkflowName)
LABEL_RESUBMITTED_FROM = "workflows.argoproj.io/resubmitted-from-workflow"
# labels Argo's resubmit does not carry over (FormulateResubmitWorkflow)
_NOT_CARRIED_LABELS = frozenset({
    "workflows.argoproj.io/phase", "workflows.argoproj.io/completed",
    "workflows.argoproj.io/creator", "workflows.argoproj.io/creator-email",
    "workflows.argoproj.io/creator-preferred-username",
    "workflows.argoproj.io/workflow-archiving-status"})


@dataclass
class Rerun:
    """A run made from an earlier one, ready to ``run()``; ``close()`` once it has ended (a
    retry's folder lock)."""

    run: Run
    kept: tuple[str, ...]  # display names of the execution nodes kept from the earlier run
    again: tuple[str, ...]  # ... and of those that run again
    lock_fd: int | None = None

    def close(self) -> None:
        if self.lock_fd is not None:
            os.close(self.lock_fd)  # the lock goes with the descriptor
            self.lock_fd = None


def earlier_run(folder: Path) -> tuple[dict, dict]:
    """The status and the manifest (as run) of the finished run in ``folder``;
    ``RerunError`` for a run that is not there, or not finished."""
    import yaml

    try:
        status = json.loads((folder / STATUS_FILE).read_text())
        workflow = yaml.safe_load((folder / "workflow.yaml").read_text())
    except (OSError, ValueError, yaml.YAMLError) as error:
        raise RerunError(f"run {folder.name}: its status.json or workflow.yaml cannot be read "
                         f"({error})") from None
    if not isinstance(status, dict) or not isinstance(workflow, dict):
        raise RerunError(f"run {folder.name}: its status.json or workflow.yaml is not a run's")
    if status.get("phase") == "Running" and runner_gone(status) is None:
        raise RerunError(f"run {folder.name} is still running: stop it first "
                         f"(sublimate stop {folder.name})")
    return status, workflow


def retry(folder: Path, options: RunOptions, restart_successful: bool = False,
          node_field_selector: str = "", parameters: dict[str, str] | None = None,
          check: Callable[[dict], None] | None = None) -> Rerun:
    """The run in ``folder`` again, in ``folder`` (``argo retry``); ``parameters`` override its
    own, as ``argo retry -p`` does; ``check`` may refuse the workflow (by raising) before
    anything changes."""
    lock_fd = _lock(folder)
    try:
        status, workflow = earlier_run(folder)
        if status.get("phase") == "Running":  # its runner died: settled as the next run would
            status["phase"] = "Failed"
        carried = plan_retry(status, workflow, restart_successful, node_field_selector)
        prepared, resolved = prepare_workflow(copy.deepcopy(workflow), parameters or {},
                                              images=options.containers is not None,
                                              max_nodes=options.max_nodes)
        if check is not None:
            check(prepared)
        kept = _set_aside(folder, status, carried.carried)
        try:
            run = Run(prepared, resolved, _with(options, carried=carried, run_folder=folder))
        except BaseException:
            os.replace(kept / STATUS_FILE, folder / STATUS_FILE)  # as it was: not retried
            raise
    except BaseException:
        os.close(lock_fd)
        raise
    return Rerun(run, _kept(carried), carried.rerun, lock_fd)


def resubmit(folder: Path, options: RunOptions, memoized: bool = False,
             parameters: dict[str, str] | None = None,
             check: Callable[[dict], None] | None = None) -> Rerun:
    """A new run of the manifest the run in ``folder`` ran (``argo resubmit``); ``memoized``:
    what succeeded there is kept; ``check`` may refuse the workflow before it is made."""
    status, workflow = earlier_run(folder)
    carried = plan_resubmit(status, workflow) if memoized else None
    fresh = copy.deepcopy(workflow)
    metadata = fresh.setdefault("metadata", {})
    earlier_name = metadata.get("name") or folder.name
    metadata.pop("name", None)
    metadata["generateName"] = metadata.get("generateName") or f"{earlier_name}-"
    labels = {key: value for key, value in (metadata.get("labels") or {}).items()
              if key not in _NOT_CARRIED_LABELS}
    metadata["labels"] = {**labels, LABEL_RESUBMITTED_FROM: earlier_name}
    prepared, resolved = prepare_workflow(fresh, parameters or {},
                                          images=options.containers is not None,
                                          max_nodes=options.max_nodes)
    if check is not None:
        check(prepared)
    run = Run(prepared, resolved, _with(options, carried=carried))
    if carried is None:
        return Rerun(run, (), ())
    return Rerun(run, _kept(carried), carried.rerun)


def _with(options: RunOptions, **changes: object) -> RunOptions:
    changed = copy.copy(options)
    for key, value in changes.items():
        setattr(changed, key, value)
    return changed


def _kept(carried: CarriedNodes) -> tuple[str, ...]:
    return called_names(carried.earlier, (node["id"] for node in carried.carried.values()))


def _lock(folder: Path) -> int:
    if not (folder / "workflow.yaml").is_file():  # (a retry under way has no status yet)
        raise RerunError(f"{folder}: not a run folder (no workflow.yaml)")
    fd = os.open(folder / ".retry.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise RerunError(f"run {folder.name} is being retried already") from None
    return fd


def _set_aside(folder: Path, status: dict, carried: dict[str, dict]) -> Path:
    """The earlier status, and the node folders of every node that runs again, moved under
    ``retries/<n>/`` (the log paths in that status follow them), which is returned: the nodes
    start afresh, and what they left stays to be read. The run folder has no status until the
    retry writes its first, so that nothing reads the earlier run's end as the retry's."""
    retries = folder / "retries"
    retries.mkdir(exist_ok=True)
    number = 1 + max((int(p.name) for p in retries.iterdir() if p.name.isdigit()), default=0)
    kept = folder / "retries" / str(number)
    (kept / "nodes").mkdir(parents=True)
    carried_ids = {node["id"] for node in carried.values()}
    archived = copy.deepcopy(status)
    for node in archived.get("nodes") or []:
        if node["id"] in carried_ids:
            continue
        name = node_folder(node.get("display_name", ""), node["id"])
        source = folder / "nodes" / name
        if source.is_dir():
            os.replace(source, kept / "nodes" / name)
            if node.get("log"):
                node["log"] = str(kept / "nodes" / name / Path(node["log"]).name)
    write_durably(kept / STATUS_FILE, json.dumps(archived, indent=1),
                  what="the earlier status of a retried run")
    (folder / STATUS_FILE).unlink()
    return kept


__all__ = ["LABEL_RESUBMITTED_FROM", "Rerun", "RerunError", "earlier_run", "resubmit", "retry"]
