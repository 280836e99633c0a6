"""What a workflow that comes over HTTP may not ask for unless the server allows it
(``--allow-privileged``): the settings that take a pod out of its sandbox
(``runner/pods/sandbox.py``), so that whoever reaches the server gets no more of this machine
than a contained pod's. As a Pod Security admission's ``baseline`` refuses them on a cluster:
``privileged``, ``capabilities.add``, ``allowPrivilegeEscalation``, and the local runner's own
``sublimate.dev/local-privileged`` annotation.

A value that a parameter fills (``{{inputs.parameters.x}}``, as the built-in train step's
annotation is filled from ``scheduler``) is checked when the pod starts, with its value: the
run refuses the pod there (``RunOptions.allow_privileged``)."""

from __future__ import annotations

from sublimate.pipelines.runner.pods.sandbox import privilege_requests

from .errors import PERMISSION_DENIED, ApiError


def privileged_requests(workflow: dict) -> list[str]:
    """Each field of ``workflow`` (as the runner would run it) that asks for more than a
    contained pod, by its path; what a parameter fills is checked as each pod starts."""
    return [f"spec.templates[{index}] ({template.get('name')}).{field}"
            for index, template in enumerate((workflow.get("spec") or {}).get("templates") or [])
            for field in privilege_requests(template)]


def check(workflow: dict, allowed: bool) -> None:
    """Refuse ``workflow`` (403, naming the first field) unless privileged pods are allowed."""
    if allowed:
        return
    requests = privileged_requests(workflow)
    if requests:
        more = f" (and {len(requests) - 1} more)" if len(requests) > 1 else ""
        raise ApiError(PERMISSION_DENIED, f"{requests[0]}{more}: asks for a pod with more than "
                                          "a container's privileges, which this server refuses "
                                          "to what comes over HTTP; start it with "
                                          "--allow-privileged to run such workflows")
