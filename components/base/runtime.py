"""Where component steps run: the runtime image and the shared volume every step mounts."""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hera.workflows import ExistingVolume
    from hera.workflows.models import Memoize

DEFAULT_IMAGE = "ghcr.io/sublimate-ml/sublimate:0.1.0"
# The same absolute path in every step (and every training node), so paths written by one step
# are valid in the next. The local runner maps it onto a folder.
SHARED_VOLUME_PATH = "/mnt/sublimate"
DEFAULT_CLAIM = "sublimate-data"
DATASETS_PATH = f"{SHARED_VOLUME_PATH}/datasets"
RUNS_PATH = f"{SHARED_VOLUME_PATH}/runs"
# Small per-step files read back by Argo as output parameters.
OUTPUTS_PATH = "/tmp/outputs"


# Set by the local runner: each volume's container path and the folder standing in for it.
LOCAL_VOLUMES_ENV = "SUBLIMATE_LOCAL_VOLUMES"


def shown_path(path: object) -> str:
    """``path`` as its user can open it, for a message: in a local run a path on a volume is
    named by its folder on this machine ($SUBLIMATE_HOME/volumes/...), not by the container
    path the step sees (/mnt/sublimate/...); elsewhere it is unchanged."""
    text = os.fspath(path)  # type: ignore[call-overload]
    try:
        volumes = json.loads(os.environ.get(LOCAL_VOLUMES_ENV) or "{}")
    except ValueError:
        return text
    for container, local in sorted(volumes.items(), key=lambda item: -len(item[0])):
        if text == container or text.startswith(container.rstrip("/") + "/"):
            return local + text[len(container.rstrip("/")):]
    return text


def shared_volume(claim_name: str = DEFAULT_CLAIM) -> ExistingVolume:
    """The ReadWriteMany claim that holds datasets, checkpoints and models for every step."""
    from hera.workflows import ExistingVolume

    return ExistingVolume(name="shared", claim_name=claim_name, mount_path=SHARED_VOLUME_PATH)


def python_step(
    name: str,
    module: str,
    inputs: dict[str, str],
    outputs: dict[str, str] | None = None,
    *,
    image: str = DEFAULT_IMAGE,
    claim_name: str = DEFAULT_CLAIM,
    extra_args: list[str] | None = None,
    retries: int = 0,
    cpu: str = "500m",
    memory: str = "1Gi",
    env: list | None = None,
    memoize: Memoize | None = None,
):  # -> hera.workflows.Container (hera is imported lazily: step code must not pay for it)
    """A container template that runs ``python -m module`` with one flag per input parameter.

    ``inputs`` maps each input parameter to its command-line flag; ``outputs`` maps each output
    parameter to the flag that tells the step where to write it (read back by Argo from
    ``/tmp/outputs/<name>``). ``memoize``: a Hera ``Memoize`` (Argo skips the step on a
    cache hit and hands on the outputs it saved).
    """
    from hera.workflows import Container, Counter, Gauge, Label, Parameter, RetryStrategy
    from hera.workflows.models import (
        Backoff,
        IntOrString,
        Quantity,
        ResourceRequirements,
        ValueFrom,
    )

    args: list[str] = []
    for parameter, flag in inputs.items():
        args += [flag, f"{{{{inputs.parameters.{parameter}}}}}"]
    output_parameters = []
    for parameter, flag in (outputs or {}).items():
        path = f"{OUTPUTS_PATH}/{parameter}"
        args += [flag, path]
        output_parameters.append(Parameter(name=parameter, value_from=ValueFrom(path=path)))
    return Container(
        name=name,
        image=image,
        command=["python", "-m", module],
        args=args + (extra_args or []),
        inputs=[Parameter(name=parameter) for parameter in inputs],
        outputs=output_parameters,
        volumes=[shared_volume(claim_name)],
        env=env,
        memoize=memoize,
        resources=ResourceRequirements(
            requests={"cpu": Quantity(cpu), "memory": Quantity(memory)},
            limits={"memory": Quantity(memory)}),
        # Retries only on errors of the pod itself (evicted, node lost): a step that fails on
        # bad input would fail again. Every sublimate step is safe to re-run (staging is
        # idempotent, training resumes from its checkpoint).
        retry_strategy=RetryStrategy(
            limit=retries, retry_policy="OnError",
            backoff=Backoff(duration="10s", factor=IntOrString(2), max_duration="5m"),
        ) if retries else None,
        # Argo's controller exports these to the cluster's Prometheus for every run.
        metrics=[
            Gauge(name="sublimate_step_duration_seconds", help="Duration of a sublimate step",
                  labels=[Label(key="step", value=name)], realtime=False, value="{{duration}}"),
            Counter(name="sublimate_step_results_total", help="sublimate steps by final status",
                    labels=[Label(key="step", value=name), Label(key="status", value="{{status}}")],
                    value="1"),
        ],
    )
