"""What a container runs in its image (container mode): planned with the pod (``plan`` calls
:func:`image_spec`), and, before the run starts, every image the workflow names
(:func:`template_images`). Plain data: no engine, no executor."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import NamedTuple

from ...errors import NodeError
from ...expressions.substitution import as_text, substitute_text

_IMAGE_KEYS = ("container", "script")


class InImage(NamedTuple):
    """What one container of a pod runs in its image (``plan`` makes it in container mode)."""

    image: str
    command: tuple[str, ...]  # the template's; empty: the image's ENTRYPOINT
    args: tuple[str, ...]  # with no command and no args: the image's CMD
    working_dir: str = ""  # "": the image's
    run_as_user: int | None = None
    run_as_group: int | None = None
    run_as_non_root: bool = False
    fs_group: int | None = None
    inputs: tuple[str, ...] = ()  # container paths of the input artifacts bound into it


def image_spec(body: dict, pod_security: dict | None, args: Sequence[str] | None = None,
               inputs: Sequence[str] = ()) -> InImage:
    """A container's ``InImage`` from its (substituted) body and the pod's securityContext:
    the container's own securityContext fields win, one by one, as in Kubernetes.
    ``args``: as planned (a script's path appended), else the body's."""
    own = body.get("securityContext") or {}
    pod = pod_security or {}

    def number(key: str, where: str, holder: dict) -> int | None:
        value = holder.get(key)
        if value is None:
            return None
        try:
            return int(str(value))
        except ValueError as exc:
            raise NodeError(f"{where}.{key}: {value!r} is not an integer") from exc

    def chosen(key: str) -> int | None:
        found = number(key, "securityContext", own)
        return found if found is not None else number(key, "pod securityContext", pod)

    non_root = own.get("runAsNonRoot", pod.get("runAsNonRoot", False))
    return InImage(
        image=str(body.get("image") or ""),
        command=tuple(str(a) for a in body.get("command") or ()),
        args=tuple(args if args is not None else (as_text(a) for a in body.get("args") or ())),
        working_dir=str(body.get("workingDir") or ""),
        run_as_user=chosen("runAsUser"),
        run_as_group=chosen("runAsGroup"),
        run_as_non_root=non_root is True or str(non_root).lower() == "true",
        fs_group=number("fsGroup", "pod securityContext", pod),
        inputs=tuple(inputs),
    )


def template_images(workflow: dict, parameters: dict[str, str]
                    ) -> tuple[dict[str, list[str]], list[str]]:
    """Every image the workflow's templates name (main, init, sidecar and containerSet
    containers), with the ``workflow.parameters`` substituted: image -> the templates using
    it; and the problems found (a container without an image)."""
    scope = {f"workflow.parameters.{k}": v for k, v in parameters.items()}
    found: dict[str, list[str]] = {}
    problems: list[str] = []
    for template in workflow["spec"].get("templates") or []:
        name = template.get("name", "?")
        bodies = [(f"{k}", template[k]) for k in _IMAGE_KEYS if isinstance(template.get(k), dict)]
        for key in ("initContainers", "sidecars"):
            bodies += [(f"{key}[{i}]", c) for i, c in enumerate(template.get(key) or [])]
        bodies += [(f"containerSet.containers[{i}]", c) for i, c in enumerate(
            (template.get("containerSet") or {}).get("containers") or [])]
        for where, body in bodies:
            image = str(body.get("image") or "")
            if not image:
                problems.append(f"templates.{name}.{where}.image: required with --containers")
                continue
            with contextlib.suppress(NodeError):
                image = substitute_text(image, scope, f"templates.{name}.{where}.image")
            if "{{" in image:
                continue  # known when the pod starts (a task's argument): looked up then
            users = found.setdefault(image, [])
            if name not in users:
                users.append(name)
    return found, problems
