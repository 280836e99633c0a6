"""How the simulated nodes of a local ``train`` job share this host's GPUs.

:func:`gpu_plan` decides (each node its own GPUs, or all on the CPU, or :class:`GpuShortage`
when nccl was asked for and there are too few); :func:`place_gpus` applies the plan to the
TorchX app and its run options.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torchx import specs

# On one host every simulated node is a torchrun agent whose first worker has LOCAL_RANK 0, so
# all of them would train on cuda:0, and NCCL refuses two ranks on one device. Each node gets
# its own GPUs instead (TorchX's auto_set_cuda_visible_devices: CUDA_VISIBLE_DEVICES per
# replica), or none at all. A pod on Kubernetes gets its GPUs from the device plugin.


class GpuShortage(ValueError):
    """The host has fewer GPUs than the simulated nodes need, and nccl was asked for."""


@dataclass(frozen=True)
class GpuPlan:
    assign: bool  # each replica gets its own GPUs; otherwise the replicas see none (CPU)
    note: str | None = None  # why the job falls back to the CPU, said once


def requested_gpus(app: specs.AppDef) -> int:
    return sum(role.num_replicas * role.resource.gpu for role in app.roles)


def local_gpu_plan(app: specs.AppDef, backend: str, host_gpus: int) -> GpuPlan:
    """How the simulated nodes of ``app`` share the ``host_gpus`` GPUs of this host."""
    needed = requested_gpus(app)
    if needed == 0:
        return GpuPlan(assign=False)  # CPU nodes: a GPU they see would be taken by all
    if host_gpus >= needed:
        return GpuPlan(assign=True)
    layout = " + ".join(f"{role.num_replicas} {role.name} x {role.resource.gpu} GPU"
                        for role in app.roles if role.resource.gpu)
    shortage = (f"this host has {host_gpus} GPU{'s' if host_gpus != 1 else ''} and the "
                f"simulated nodes need {needed} ({layout}; NCCL refuses two ranks on one GPU)")
    if backend == "nccl":
        raise GpuShortage(f"gpus-per-node: {shortage}: lower nodes or gpus-per-node, or set "
                          "backend to auto or gloo to train on the CPU")
    return GpuPlan(assign=False, note=f"{shortage}; they train on the CPU with gloo "
                                      "(backend nccl refuses instead)")


def place_gpus(app: specs.AppDef, cfg: dict[str, object], plan: GpuPlan) -> None:
    """Apply ``plan`` to a local job: TorchX's run option for the roles that asked for GPUs;
    replicas of the others (a parameter server, or all on the CPU plan) see none."""
    if plan.assign:
        cfg["auto_set_cuda_visible_devices"] = True
    for role in app.roles:
        if plan.assign and role.resource.gpu:
            continue  # TorchX sets each replica's CUDA_VISIBLE_DEVICES
        role.env["CUDA_VISIBLE_DEVICES"] = ""  # torch.cuda.is_available() is then False: gloo
        role.env.setdefault("OMP_NUM_THREADS", "1")  # CPU workers share this host's cores
        # No GPU is asked of the local scheduler either (it would warn about sharing them).
        role.resource = dataclasses.replace(role.resource, gpu=0)


def host_gpus(given: int | None) -> int:
    """The GPUs of this host: ``--host-gpus`` when given, else what nvidia-smi lists."""
    if given is not None:
        return given
    from sublimate.components.launch.local_cwd_scheduler import host_gpu_count

    return host_gpu_count()


def gpu_plan(app: specs.AppDef, backend: str, given_host_gpus: int | None) -> GpuPlan:
    """The plan for ``app`` on a local scheduler (the host is asked only when GPUs are);
    ``given_host_gpus``: ``--host-gpus`` (None: ask nvidia-smi)."""
    return local_gpu_plan(app, backend, host_gpus(given_host_gpus) if requested_gpus(app) else 0)
