"""The TorchX runner the ``train`` launcher uses, and the training job's identity on a cluster.

:func:`make_runner` gives the launcher a TorchX ``Runner`` for its scheduler (``local_cwd``,
``local_netns`` or ``kubernetes``, the last with a ``job_name`` run option and ``delete``). On a
cluster the job has a deterministic name (:func:`job_name`), so that a retried step re-attaches
to the job its lost attempt submitted, or replaces it (:func:`claim_job`).

TorchX is imported inside the functions that need it: the launcher's start is the user's wait.
"""

from __future__ import annotations

import functools
import hashlib
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from sublimate.components.base.settings import PER_STEP
from sublimate.components.launch.lighthouse import (
    MIN_GROUPS_METADATA,
    RECOVERY_METADATA,
    REPLACEMENTS_METADATA,
)

if TYPE_CHECKING:
    from types import TracebackType

    from torchx.specs import AppDef, AppDryRunInfo, AppStatus

# Schedulers that run the nodes on this machine (the launcher's Python, its folders).
LOCAL_SCHEDULERS = ("local_cwd", "local_netns")

# Argo retries the train step when its pod is lost (retryStrategy OnError), but the Volcano job
# the lost launcher submitted goes on running. The job is therefore named after what the step
# is (the workflow and the run folder), not by TorchX's random suffix, so that a retried
# launcher finds it: it follows a job that still runs (or finished well) to its end as a fresh
# launch would, and deletes one that failed, was cancelled or is being torn down before it
# submits again; a second job never writes the run folder beside the first.

# Pod hostnames are <job>-<task>-0 (task up to "trainer-9999") and must fit in 63 characters.
JOB_NAME_MAX = 47
JOB_PREFIX = "sublimate"
# Volcano phases TorchX reports as RUNNING although the job is ending: not worth attaching to.
ENDING_PHASES = ("Aborting", "Terminating")
# How long a deleted job may take to go before the launcher gives up submitting its successor.
DELETE_WAIT_SECONDS = 120.0


def job_name(workflow_name: str, run_dir: Path) -> str:
    """The Volcano job's name: the same for every attempt of one workflow's train step on one
    run folder, different for another workflow on the same folder (a resubmitted ``run-id``),
    and a valid pod-name prefix (lowercase alphanumerics and '-')."""
    digest = hashlib.sha256(f"{workflow_name}\n{run_dir}".encode()).hexdigest()[:8]
    room = JOB_NAME_MAX - len(JOB_PREFIX) - len(digest) - 2
    slug = re.sub(r"[^a-z0-9-]+", "-", run_dir.name.lower())[:room].strip("-")
    prefix = "" if slug.startswith(JOB_PREFIX) else JOB_PREFIX  # runs are often sublimate-*
    return "-".join(part for part in (prefix, slug, digest) if part)


def _renamed(value: object, old: str, new: str) -> object:
    """``value`` with every ``old`` in its strings replaced by ``new``: dicts, lists and the
    Kubernetes client's model objects (``openapi_types``), which keep their types."""
    if isinstance(value, str):
        return value.replace(old, new)
    if isinstance(value, list):
        return [_renamed(item, old, new) for item in value]
    if isinstance(value, dict):
        return {_renamed(key, old, new): _renamed(item, old, new) for key, item in value.items()}
    for attribute in getattr(value, "openapi_types", {}):
        setattr(value, attribute, _renamed(getattr(value, attribute), old, new))
    return value


@functools.cache
def _kubernetes_scheduler_class() -> type:
    """TorchX's Kubernetes scheduler with a ``job_name`` run option and ``delete``.

    Defined on first use: TorchX is imported only when a job is launched.
    """
    from torchx.schedulers.kubernetes_scheduler import KubernetesScheduler
    from torchx.specs import runopts

    class NamedJobKubernetesScheduler(KubernetesScheduler):
        """TorchX 0.7 names every job ``<app name>-<random suffix>`` (``make_unique``) and has
        no option to name it otherwise, nor a way to delete a job that already ended."""

        def _run_opts(self) -> runopts:
            opts = super()._run_opts()
            opts.add("job_name", type_=str, default=None,
                     help="the Volcano job's name instead of <app name>-<random suffix>")
            return opts

        def _submit_dryrun(self, app: object, cfg: dict) -> object:
            from sublimate.components.launch import volcano_job

            # One Volcano task per role, not per replica: a Job that fits in etcd at any size.
            info = super()._submit_dryrun(volcano_job.one_replica_roles(app), cfg)
            volcano_job.replicate_tasks(info.request.resource, app)
            name = cfg.get("job_name")
            if name:
                # TorchX's generated id is in the job's name, its pods' labels and wherever the
                # app_id macro was (torchrun's --rdzv-id): replace it everywhere at once.
                resource = info.request.resource
                generated = resource["metadata"]["name"]
                info.request.resource = _renamed(resource, generated, name)
            per_step = [role for role in app.roles  # type: ignore[attr-defined]
                        if role.metadata.get(RECOVERY_METADATA) == PER_STEP]
            if per_step:
                from sublimate.components.launch.per_step import volcano_per_step

                companions = volcano_per_step(info.request.resource,
                                              per_step[0].metadata[MIN_GROUPS_METADATA],
                                              per_step[0].metadata[REPLACEMENTS_METADATA])
                info.request = _job_with_companions()(
                    images_to_push=info.request.images_to_push,
                    resource=info.request.resource, companions=companions)
            return info

        def schedule(self, dryrun_info: object) -> str:
            """TorchX's (create the Volcano job), then the objects that run beside it, owned by
            it: Kubernetes deletes them with the job."""
            app_id = super().schedule(dryrun_info)
            companions = getattr(dryrun_info.request, "companions", [])  # type: ignore[attr-defined]
            if companions:
                self._create_companions(app_id, companions)
            return app_id

        def _create_companions(self, app_id: str, companions: list[Any]) -> None:
            from kubernetes import client

            namespace, name = app_id.split(":")
            job = self._custom_objects_api().get_namespaced_custom_object(
                group="batch.volcano.sh", version="v1alpha1", namespace=namespace,
                plural="jobs", name=name)
            owner = client.V1OwnerReference(
                api_version="batch.volcano.sh/v1alpha1", kind="Job", name=name,
                uid=job["metadata"]["uid"], block_owner_deletion=True)
            for companion in companions:
                companion.metadata.owner_references = [owner]
                if companion.kind == "Deployment":
                    client.AppsV1Api(self._api_client()).create_namespaced_deployment(
                        namespace, companion)
                else:
                    client.CoreV1Api(self._api_client()).create_namespaced_service(
                        namespace, companion)

        def worker_pods(self, app_id: str) -> dict[int, tuple[str, str]]:
            """The job's worker pods as they are now: index -> (uid, phase). A pod Volcano
            replaced keeps its name (``<job>-worker-<index>``) under a new uid."""
            from kubernetes import client

            namespace, name = app_id.split(":")
            pods = client.CoreV1Api(self._api_client()).list_namespaced_pod(
                namespace, label_selector=f"volcano.sh/job-name={name}").items
            found = {}
            for pod in pods:
                task, _, index = pod.metadata.name.removeprefix(f"{name}-").rpartition("-")
                if task == "worker" and index.isdigit() and not pod.metadata.deletion_timestamp:
                    found[int(index)] = (pod.metadata.uid, pod.status.phase)
            return found

        def describe(self, app_id: str) -> object:
            from kubernetes.client.rest import ApiException

            from sublimate.components.launch import volcano_job

            try:
                namespace, name = app_id.split(":")
                job = self._custom_objects_api().get_namespaced_custom_object_status(
                    group="batch.volcano.sh", version="v1alpha1", namespace=namespace,
                    plural="jobs", name=name)
            except ApiException as error:
                if error.status == 404:  # TorchX 0.7 raises where its API promises None
                    return None
                raise
            return volcano_job.describe(app_id, job)

        def ending(self, app_id: str) -> str:
            """Why a job TorchX reports as running is in fact ending ("" when it is not):
            Volcano's Aborting and Terminating phases, or a deletion under way."""
            from kubernetes.client.rest import ApiException

            namespace, name = app_id.split(":")
            try:
                job = self._custom_objects_api().get_namespaced_custom_object(
                    group="batch.volcano.sh", version="v1alpha1", namespace=namespace,
                    plural="jobs", name=name)
            except ApiException as error:
                if error.status == 404:
                    return "deleted"
                raise
            phase = ((job.get("status") or {}).get("state") or {}).get("phase", "")
            if (job.get("metadata") or {}).get("deletionTimestamp"):
                return "being deleted"
            return f"phase {phase}" if phase in ENDING_PHASES else ""

        def delete(self, app_id: str) -> None:
            """Delete the job whatever its state (TorchX's cancel skips an ended one)."""
            from kubernetes.client.rest import ApiException

            try:
                self._cancel_existing(app_id)  # on Kubernetes, cancelling deletes the job
            except ApiException as error:
                if error.status != 404:
                    raise

    return NamedJobKubernetesScheduler


@functools.cache
def _job_with_companions() -> type:
    """TorchX's Volcano job request with the objects that run beside the job (a per-step job's
    Lighthouse Deployment and Service): created after it by ``schedule``, shown with it by a
    dry run."""
    from dataclasses import dataclass, field

    import yaml
    from torchx.schedulers.kubernetes_scheduler import KubernetesJob

    @dataclass(repr=False)  # TorchX's repr is the YAML (a dry run prints it)
    class KubernetesJobWithCompanions(KubernetesJob):
        companions: list[Any] = field(default_factory=list)

        def __str__(self) -> str:
            from kubernetes.client import ApiClient

            sanitize = ApiClient().sanitize_for_serialization
            return yaml.dump_all([sanitize(self.resource),
                                  *(sanitize(companion) for companion in self.companions)])

    return KubernetesJobWithCompanions


def _in_cluster_kubernetes_scheduler(session_name: str, **kwargs: object) -> object:
    """TorchX 0.7 reads only ~/.kube/config; inside a pod use the pod's service account."""
    from kubernetes import client, config

    try:
        config.load_incluster_config()
        api_client = client.ApiClient()
    except config.ConfigException:  # not in a pod: TorchX falls back to ~/.kube/config
        api_client = None
    return _kubernetes_scheduler_class()(session_name, client=api_client)


class JobRunner(Protocol):
    """What the launcher uses of the runner :func:`make_runner` gives: TorchX's ``Runner``
    (submit, status, cancel) and the methods this module adds to it."""

    def run(self, app: AppDef, scheduler: str, cfg: dict[str, Any] | None = None) -> str: ...

    def dryrun(self, app: AppDef, scheduler: str,
               cfg: dict[str, Any] | None = None) -> AppDryRunInfo: ...

    def status(self, app_handle: str) -> AppStatus | None: ...

    def cancel(self, app_handle: str) -> None: ...

    def name(self) -> str: ...

    def log_lines(self, app_handle: str, role_name: str, k: int = 0, regex: str | None = None,
                  since: Any = None, until: Any = None, should_tail: bool = False,
                  streams: Any = None) -> Any: ...

    def delete(self, app_handle: str) -> None: ...

    def ending(self, app_handle: str) -> str: ...

    def worker_pods(self, app_handle: str) -> dict[int, tuple[str, str]]: ...

    def replica_states(self, app_handle: str) -> dict[tuple[str, int], object]: ...

    def restart_replica(self, app_handle: str, role: str, replica: int,
                        env: dict[str, str]) -> None: ...

    def __enter__(self) -> JobRunner: ...

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None: ...


@functools.cache
def _runner_class() -> type:
    from torchx.runner import Runner

    class JobRunner(Runner):
        """TorchX's Runner with ``delete(app_handle)`` (TorchX 0.7 has none) and ``ending``
        (why a job reported as running is ending), for the Kubernetes scheduler above, and
        ``replica_states`` / ``restart_replica`` for the local ones (per-step recovery)."""

        def delete(self, app_handle: str) -> None:
            scheduler, _, app_id = self._scheduler_app_id(app_handle, check_session=False)
            scheduler.delete(app_id)

        def ending(self, app_handle: str) -> str:
            scheduler, _, app_id = self._scheduler_app_id(app_handle, check_session=False)
            return scheduler.ending(app_id)

        def worker_pods(self, app_handle: str) -> dict[int, tuple[str, str]]:
            """The worker pods of a Kubernetes job: index -> (uid, phase)."""
            scheduler, _, app_id = self._scheduler_app_id(app_handle, check_session=False)
            return scheduler.worker_pods(app_id)

        def replica_states(self, app_handle: str) -> dict[tuple[str, int], object]:
            """Each replica's own state (the local schedulers: per-step recovery's view)."""
            scheduler, _, app_id = self._scheduler_app_id(app_handle, check_session=False)
            return scheduler.replica_states(app_id)

        def restart_replica(self, app_handle: str, role: str, replica: int,
                            env: dict[str, str]) -> None:
            """Start one replica of a running job again (per-step recovery's replacement)."""
            scheduler, _, app_id = self._scheduler_app_id(app_handle, check_session=False)
            scheduler.restart_replica(app_id, role, replica, env)

    return JobRunner


def make_runner(scheduler: str, host_gpus: int | None = None) -> JobRunner:
    """A TorchX Runner for ``scheduler``; ``host_gpus``: the GPUs the local schedulers divide
    between the simulated nodes (default: what the host has)."""
    if scheduler == "local_netns":
        from sublimate.components.launch.netns_scheduler import create_scheduler

        return _runner_class()("sublimate", {"local_netns": functools.partial(
            create_scheduler, gpu_count=host_gpus)})
    if scheduler == "local_cwd":
        from sublimate.components.launch.local_cwd_scheduler import create_local_cwd_scheduler

        # The session name get_runner() uses: the nodes' logs stay in <run>/logs/torchx/.
        return _runner_class()("torchx", {"local_cwd": functools.partial(
            create_local_cwd_scheduler, gpu_count=host_gpus)})
    return _runner_class()("sublimate", {"kubernetes": _in_cluster_kubernetes_scheduler})


def job_handle(runner: JobRunner, scheduler: str, cfg: dict[str, object]) -> str:
    """The TorchX app handle of the named job ``cfg`` describes (``kubernetes://session/
    namespace:name``)."""
    from torchx.specs.builders import make_app_handle

    return make_app_handle(scheduler, runner.name(), f"{cfg['namespace']}:{cfg['job_name']}")


# What to do about a job of the same name found before submitting.
ATTACH, REPLACE, START = "attach", "replace", "start"


def previous_job_action(status: AppStatus | None, ending: str = "", fresh: bool = False) -> str:
    """ATTACH to a job that runs (or finished well: its results stand), REPLACE one that
    failed, was cancelled, is ``ending`` or is in an unknown state, START when there is none.
    ``fresh``: this launcher stopped that job itself (a relaunch): replace it whatever its
    state."""
    from torchx.specs import AppState

    if status is None:
        return START
    if fresh:
        return REPLACE
    state = status.state
    if state == AppState.SUCCEEDED or (
            state in (AppState.SUBMITTED, AppState.PENDING, AppState.RUNNING) and not ending):
        return ATTACH
    return REPLACE


def claim_job(runner: JobRunner, handle: str, fresh: bool,
              wait_seconds: float = DELETE_WAIT_SECONDS, poll: float = 1.0) -> bool:
    """Before submitting the job ``handle`` names: whether to follow the job already there
    (True), or to submit (False), after deleting any job left under that name."""
    from torchx.specs import is_terminal

    status = runner.status(handle)
    if status is None:
        return False
    ending = "" if is_terminal(status.state) else runner.ending(handle)
    action = previous_job_action(status, ending, fresh)
    if action == ATTACH:
        print(f"train: re-attached to {handle} ({status.state.name}), "
              "started by an earlier attempt of this step", flush=True)
        return True
    if action == REPLACE:
        why = status.state.name + (f", {ending}" if ending else "")
        print(f"train: deleting {handle} ({why}) before submitting it again", flush=True)
        runner.delete(handle)
        deadline = time.monotonic() + wait_seconds
        while runner.status(handle) is not None:
            if time.monotonic() >= deadline:
                raise RuntimeError(f"training job {handle} is still there {wait_seconds:.0f}s "
                                   "after deleting it; delete it by hand (kubectl delete "
                                   "vcjob) and retry the step")
            time.sleep(poll)
    return False
