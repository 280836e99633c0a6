"""The training job's Volcano Job with one task per role, whatever the number of nodes.

TorchX 0.7 renders a role of N replicas as N Volcano tasks of one pod each, every one with its
own copy of the pod template (about 3.4 KB): 1.7 MB of JSON at 512 nodes and 13.8 MB at 4,096,
past etcd's 1.5 MiB request limit, which the API server enforces on every object it stores
(``etcdserver: request is too large``). Volcano's svc plugin also gives every pod two variables
per task, so N tasks mean 2N variables in every pod. Here a role of several replicas is rendered
as one task with ``replicas: N``: the Job stays a few KB at any size (docs/scale.md).

What told the replicas apart moves into the pod: TorchX's ``${replica_id}`` becomes
``$(VC_TASK_INDEX)`` in the container's arguments, which Kubernetes expands from the variable
Volcano's env plugin sets in every pod (its index in its task); a variable whose value was the
replica id is dropped, and its reader takes ``VC_TASK_INDEX`` instead
(:class:`~sublimate.components.base.replica_groups.ReplicaGroups`). The first role's first pod
hosts the rendezvous; every pod reaches it by the name Volcano's svc plugin gives it
(``<job>-<task>-0.<job>``, a headless service). Field names are Volcano's
``batch.volcano.sh/v1alpha1`` Job (pkg/apis/batch/v1alpha1/job.go).
"""

from __future__ import annotations

import copy
from typing import Any

from sublimate.components.base.replica_groups import TASK_INDEX_ENV

# TorchX's label of a pod's replica index: a task of several pods has no single one.
REPLICA_ID_LABEL = "torchx.pytorch.org/replica-id"
RANK0_HOST_ENV = "TORCHX_RANK0_HOST"


def one_replica_roles(app: Any) -> Any:
    """A copy of ``app`` whose roles of several replicas have one, the replica index left to
    Volcano; render it with TorchX, then :func:`replicate_tasks` with the original ``app``."""
    from torchx.specs import macros

    collapsed = copy.deepcopy(app)
    for role in collapsed.roles:
        if role.num_replicas > 1:
            role.args = [arg.replace(macros.replica_id, f"$({TASK_INDEX_ENV})")
                         for arg in role.args]
            role.env = {name: value for name, value in role.env.items()
                        if macros.replica_id not in value}
            role.num_replicas, role.min_replicas = 1, None
    return collapsed


def replicate_tasks(job: dict[str, Any], app: Any) -> dict[str, Any]:
    """Give each task of ``job`` (rendered from :func:`one_replica_roles`'s copy: one task per
    role, in the roles' order) the replicas of ``app``'s role; returns ``job``."""
    name = job["metadata"]["name"]
    tasks = job["spec"]["tasks"]
    for index, (task, role) in enumerate(zip(tasks, app.roles, strict=True)):
        if role.num_replicas == 1:
            continue
        task["name"], task["replicas"] = role.name, role.num_replicas
        if role.min_replicas is not None:  # an elastic job's gang: its minimum
            task["minAvailable"] = role.min_replicas
        pod = task["template"]
        pod.metadata.labels.pop(REPLICA_ID_LABEL, None)
        container = pod.spec.containers[0]
        container.name = role.name
        if index == 0:  # TorchX told only its first pod, as localhost
            for variable in container.env:
                if variable.name == RANK0_HOST_ENV:
                    variable.value = f"{name}-{role.name}-0.{name}"
    if any(role.min_replicas is not None for role in app.roles):
        # The Job's gang defaults to every task's replicas (job.go), not the tasks' minimums.
        job["spec"]["minAvailable"] = sum(
            role.num_replicas if role.min_replicas is None else role.min_replicas
            for role in app.roles)
    return job


def job_state(phase: str) -> Any:
    """TorchX's state of a Volcano job phase. TorchX 0.7's table lacks ``Completing`` (a job
    whose CompleteJob policy fired while pods still end: state/completing.go), on which its
    lookup raised: running, until Volcano says Completed."""
    from torchx.schedulers.kubernetes_scheduler import JOB_STATE
    from torchx.specs import AppState

    return JOB_STATE.get(phase, AppState.RUNNING if phase == "Completing" else AppState.UNKNOWN)


def describe(app_id: str, job: dict[str, Any]) -> Any:
    """TorchX's ``describe`` of a Volcano Job in either form: a task of one pod is TorchX's
    ``<role>-<replica>``; a task of several is a role whose pods the Job's status counts by
    phase (which pod is in which phase it does not say, so their ids are positions, running
    ones first, not the pods' indices)."""
    from torchx.schedulers.api import DescribeAppResponse
    from torchx.schedulers.kubernetes_scheduler import TASK_STATE
    from torchx.specs import AppState, ReplicaStatus, Role, RoleStatus

    status = job.get("status")
    if not status:
        return DescribeAppResponse(app_id=app_id, state=AppState.UNKNOWN)
    replicas: dict[str, list[Any]] = {}
    for task, counts in (status.get("taskStatusCount") or {}).items():
        role, _, index = task.rpartition("-")
        phases = counts.get("phase") or {}
        if role and index.isdigit():  # TorchX's own form: one pod
            replicas.setdefault(role, []).append(ReplicaStatus(
                id=int(index), role=role, state=TASK_STATE[next(iter(phases))], hostname=""))
            continue
        ordered = sorted(phases.items(), key=lambda item: item[0] != "Running")
        states = [TASK_STATE[phase] for phase, count in ordered for _ in range(count)]
        replicas.setdefault(task, []).extend(
            ReplicaStatus(id=position, role=task, state=state, hostname="")
            for position, state in enumerate(states))
    return DescribeAppResponse(
        app_id=app_id, state=job_state(status["state"]["phase"]),
        roles=[Role(name=role, num_replicas=len(found), image="")
               for role, found in replicas.items()],
        roles_statuses=[RoleStatus(role, found) for role, found in replicas.items()])


def job_bytes(job: dict[str, Any]) -> int:
    """The Job's size as the API server stores it (compact JSON)."""
    import json

    from kubernetes.client import ApiClient

    return len(json.dumps(ApiClient().sanitize_for_serialization(job),
                          separators=(",", ":")).encode())
