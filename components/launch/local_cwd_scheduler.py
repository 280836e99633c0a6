"""``local_cwd`` as every local run uses it: TorchX's local scheduler with this host's GPUs
divided between the simulated nodes, a CPU node's torchrun agent forked rather than started
afresh, a replica started again alone (per-step recovery), and every job's processes ended with
the launcher. ``local_netns`` (:mod:`.netns_scheduler`) is this scheduler with a network per node.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import os
import signal
import subprocess
from typing import Any

from torchx.schedulers.api import AppDryRunInfo
from torchx.schedulers.local_scheduler import (
    CWDImageProvider,
    LocalOpts,
    LocalScheduler,
    PopenRequest,
    ReplicaParam,
    _LocalAppDef,
    _LocalReplica,
)
from torchx.specs.api import NONE, AppDef, AppState

from sublimate.components.base.replica_groups import volcano_hosts_env
from sublimate.components.launch.forked_agents import AgentServers
from sublimate.components.launch.job_reaper import MARK_ENV, JobReaper


def host_gpu_count() -> int:
    """The GPUs of this host as ``nvidia-smi -L`` lists them (0 without NVIDIA's tools).

    TorchX's local scheduler counts the same way (not with torch, whose import the launcher
    must not pay), but lets a missing ``nvidia-smi`` escape as an exception.
    """
    try:
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True,
                                 check=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in listing.splitlines() if line.startswith("GPU "))


def structured_error_msg(app: _LocalAppDef) -> str:
    """TorchX's ``get_structured_error_msg``, for an error file that is not JSON (yet).

    torchrun writes a failed worker's error file in place, not by a rename: a status poll can
    find it empty or half written, and a node killed while writing leaves it so for good.
    TorchX's own reader raises ``JSONDecodeError`` then, out of ``describe``, which ended the
    launcher (and failed a job that recovery would have carried on). What the file holds is
    passed on as it is instead.
    """
    error_file = app._get_error_file()
    if not error_file:
        return NONE
    try:
        with open(error_file, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:  # removed between the listing and the read
        return NONE
    try:
        return json.dumps(json.loads(text))
    except ValueError:
        return text or NONE


class HostGpuLocalScheduler(LocalScheduler):
    """``local_cwd`` whose ``auto_set_cuda_visible_devices`` divides a known number of GPUs.

    With that run option TorchX gives each replica its own ``CUDA_VISIBLE_DEVICES`` (replica
    ``i`` of a role with ``g`` GPUs gets ``g*i .. g*i+g-1``), so simulated nodes, which all have
    ``LOCAL_RANK`` 0, stop picking the same ``cuda:0``. It asks the host for the count itself;
    ``gpu_count`` makes it the launcher's count, the one the launcher checked the job against
    (and lets a test stand in for a GPU host). Every job it schedules is marked for a
    :class:`~sublimate.components.launch.job_reaper.JobReaper`, which ends whatever of it is
    left when this scheduler closes or its launcher dies.
    """

    def __init__(self, session_name: str, cache_size: int = 100,
                 extra_paths: list[str] | None = None, gpu_count: int | None = None) -> None:
        super().__init__(session_name=session_name, image_provider_class=CWDImageProvider,
                         cache_size=cache_size, extra_paths=extra_paths)
        self.gpu_count = gpu_count
        self._requests: dict[str, PopenRequest] = {}  # by app: to start a replica again
        self._appending = False  # while a replica starts again: its logs are appended to
        self._restarts: dict[str, dict[int, int]] = {}  # by app and node: times started again
        self.reaper = JobReaper()  # the job's processes end with this launcher (job_reaper)
        self.agent_servers = AgentServers()  # CPU nodes forked, not started afresh

    def _cuda_device_count(self) -> int:
        return host_gpu_count() if self.gpu_count is None else self.gpu_count

    # Volcano's env plugin tells every pod of a job where each task runs (VC_<TASK>_HOSTS); the
    # per-step workers find their Lighthouse that way. Here every replica is on this host.
    HOST_OF_EVERY_REPLICA = "127.0.0.1"

    def _to_popen_request(self, app: AppDef, cfg: LocalOpts) -> PopenRequest:
        request = super()._to_popen_request(app, cfg)
        hosts = {volcano_hosts_env(role, replica): self.HOST_OF_EVERY_REPLICA
                 for role, replicas in request.role_params.items()
                 for replica in range(len(replicas))}
        for replicas in request.role_params.values():
            for params in replicas:
                params.env.update({name: host for name, host in hosts.items()
                                   if name not in params.env})
        return request

    def schedule(self, dryrun_info: AppDryRunInfo[PopenRequest]) -> str:
        self.reaper.start()
        for replicas in dryrun_info.request.role_params.values():
            for params in replicas:
                params.env[MARK_ENV] = self.reaper.mark
        app_id = super().schedule(dryrun_info)
        self._requests[app_id] = dryrun_info.request
        app = self._apps[app_id]  # TorchX's own (local_netns makes its own, reader built in)
        app.get_structured_error_msg = functools.partial(
            structured_error_msg, app)
        return app_id

    def replica_states(self, app_id: str) -> dict[tuple[str, int], AppState]:
        """Each replica's own state: RUNNING, SUCCEEDED or FAILED (exit status not 0)."""
        app = self._apps.get(app_id)
        if app is None:
            return {}
        return {(role, replica.replica_id): AppState.RUNNING if replica.is_alive() else
                AppState.FAILED if replica.failed() else AppState.SUCCEEDED
                for role, replicas in app.role_replicas.items() for replica in replicas}

    def restart_replica(self, app_id: str, role: str, replica: int,
                        env: dict[str, str]) -> None:
        """Start replica ``replica`` of ``role`` again, with its first command and ``env`` on
        top (per-step recovery replaces a lost node alone); its logs go on in the same files.
        Whatever is left of the replica's previous process group is killed first."""
        app = self._apps[app_id]
        params = copy.deepcopy(self._requests[app_id].role_params[role][replica])
        params.env.update(env)
        previous = app.role_replicas[role][replica]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(previous.proc.pid, signal.SIGKILL)
        previous.terminate()  # closes its log handles
        self._appending = True
        try:
            app.role_replicas[role][replica] = self._popen(role, replica, params)
        finally:
            self._appending = False

    # local_netns starts each node inside namespaces of its own instead (NetnsScheduler).
    FORKS_AGENTS = True

    def _popen(self, role_name: str, replica_id: int, replica_params: ReplicaParam,
               ) -> _LocalReplica:
        """TorchX's, but a CPU node's torchrun agent is forked from :mod:`.forked_agents`'
        server (its output, environment and session as TorchX would give it)."""
        env = self._get_replica_env(replica_params)
        found = self.agent_servers.server_for(replica_params.args, env, replica_params.cwd) \
            if self.FORKS_AGENTS else None
        if found is None:
            return super()._popen(role_name, replica_id, replica_params)
        server, argv = found
        stdout, stderr, combined = self._get_replica_output_handles(replica_params)
        try:
            agent = server.fork(argv, env, replica_params.cwd,
                                stdout.fileno() if stdout else 1,
                                stderr.fileno() if stderr else 2)
        except OSError:
            for handle in (stdout, stderr, combined):
                if handle is not None:
                    handle.close()
            raise
        return _LocalReplica(role_name, replica_id, agent, stdout=stdout, stderr=stderr,
                             combined=combined,
                             error_file=env.get("TORCHELASTIC_ERROR_FILE", "<N/A>"))

    def _get_file_io(self, file: str | None) -> Any:
        # A replica started again writes on at the end of its logs, which the launcher tails.
        if file and self._appending:
            return open(file, "ab", buffering=0)
        return super()._get_file_io(file)

    def close(self) -> None:
        try:
            super().close()
        finally:
            self.agent_servers.close()
            self.reaper.close()


def create_local_cwd_scheduler(session_name: str, cache_size: int = 100,
                               extra_paths: list[str] | None = None,
                               gpu_count: int | None = None,
                               **kwargs: Any) -> HostGpuLocalScheduler:
    """TorchX's ``local_cwd``, with the GPU count of :class:`HostGpuLocalScheduler`."""
    return HostGpuLocalScheduler(session_name, cache_size=cache_size, extra_paths=extra_paths,
                                 gpu_count=gpu_count)
