"""Readiness probes (Kubernetes core/v1 ``Probe``): when a daemon is ready for its dependants.

The kubelet runs a container's ``readinessProbe`` after ``initialDelaySeconds`` (0), then every
``periodSeconds`` (10), each try given ``timeoutSeconds`` (1); ``successThreshold`` (1)
successes in a row make the container Ready. For readiness a failure only means "not ready
yet", never a restart, so ``failureThreshold`` changes nothing here. A container without a
probe is ready once started. Argo daemons a pod when every container is Ready (operator.go).

- ``exec.command``: exit status 0. It runs with the pod's environment and working directory,
  and, where the pod runs in a mount namespace (``mounts``), inside the pod's view of the
  files (the probe enters its root, ``/proc/<pid>/root``); where paths are rewritten, the
  command's paths are rewritten the same way.
- ``httpGet``: a status from 200 to 399; ``host`` defaults to the pod's address, 127.0.0.1
  (pods share this machine's network), ``scheme`` to HTTP, ``path`` to ``/``; a named
  ``port`` is looked up in the container's ``ports``.
- ``tcpSocket``: a connection accepted.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

from ..errors import NodeError
from ..pods.environment import pod_environment

if TYPE_CHECKING:
    from ..pods.plan import PodRequest

POD_IP = "127.0.0.1"  # every local pod's address: they share this machine's network


class Probe(NamedTuple):
    """One readiness check and its timing."""

    check: Callable[[], bool]
    initial_delay_s: float = 0.0
    period_s: float = 10.0
    success_threshold: int = 1


def readiness(spec: dict | None, body: dict, request: PodRequest,
              pid: Callable[[], int | None]) -> Probe | None:
    """The readiness probe of a container (``body``), or None when it has none: ready once
    started. ``pid``: the pod's process, for an exec probe entering its view. ``NodeError``
    for a probe the runner cannot run."""
    if not spec:
        return None
    timeout = float(spec.get("timeoutSeconds") or 1)
    if isinstance(spec.get("exec"), dict):
        check = _exec(list(map(str, spec["exec"].get("command") or [])), request, pid, timeout)
    elif isinstance(spec.get("httpGet"), dict):
        check = _http(spec["httpGet"], body, timeout)
    elif isinstance(spec.get("tcpSocket"), dict):
        check = _tcp(spec["tcpSocket"], body, timeout)
    else:
        raise NodeError("readinessProbe: give exec, httpGet or tcpSocket")
    return Probe(check, float(spec.get("initialDelaySeconds") or 0),
                 float(spec.get("periodSeconds") or 10),
                 int(spec.get("successThreshold") or 1))


def _port(port: object, body: dict) -> int:
    if isinstance(port, int) or str(port).isdigit():
        return int(str(port))
    for declared in body.get("ports") or []:
        if declared.get("name") == port:
            return int(declared["containerPort"])
    raise NodeError(f"readinessProbe: port {port!r} is not a number nor a named port of the "
                    "container")


def _exec(command: list[str], request: PodRequest, pid: Callable[[], int | None],
          timeout: float) -> Callable[[], bool]:
    if not command:
        raise NodeError("readinessProbe.exec.command: missing")
    in_namespace = request.binds is not None
    argv = command if in_namespace or request.in_image is not None else \
        [request.paths.rewrite(arg) for arg in command]
    # the pod's own environment (``environment``), never this shell's whole one: the
    # probe's command is a process of the pod (run here, so with this machine's part)
    env = pod_environment(request.env, request.runner_env,
                          from_environment=request.from_environment,
                          passed=request.passed_env)
    cwd = request.working_dir if in_namespace else str(request.cwd)

    view = request.view
    if view is not None:  # in the pod's view, as the pod's command: never on this machine
        argv = command

    def check() -> bool:
        process = pid()
        root = f"/proc/{process}/root" if in_namespace and process is not None else None
        if view is not None and process is None:
            return False  # the pod has not started: there is nothing to run the probe in

        def enter() -> None:  # lock-free, in the child before exec: see local_process
            if root is not None:
                os.chroot(root)
                os.chdir(cwd)

        preexec = None
        if view is not None:
            from ..pods.sandbox import joining  # deferred: only overlay mode pays for it

            preexec = joining(process, view.cwd, view.sandbox)  # type: ignore[arg-type]
        elif root is not None:
            preexec = enter
        try:
            done = subprocess.run(argv, env=env, cwd=None if preexec else cwd,
                                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL, timeout=timeout,
                                  preexec_fn=preexec, check=False)
        except (OSError, subprocess.SubprocessError):
            return False
        return done.returncode == 0

    return check


def _http(spec: dict, body: dict, timeout: float) -> Callable[[], bool]:
    import urllib.error
    import urllib.request

    scheme = str(spec.get("scheme") or "HTTP").lower()
    host = str(spec.get("host") or POD_IP)
    path = "/" + str(spec.get("path") or "").lstrip("/")
    url = f"{scheme}://{host}:{_port(spec.get('port'), body)}{path}"
    headers = {str(h.get("name")): str(h.get("value", "")) for h in spec.get("httpHeaders") or []}
    context = None
    if scheme == "https":  # the kubelet does not verify a probe's certificate
        import ssl

        context = ssl._create_unverified_context()

    def check() -> bool:
        request = urllib.request.Request(url, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
                return 200 <= response.status < 400
        except urllib.error.HTTPError as exc:
            return 200 <= exc.code < 400
        except (OSError, ValueError):
            return False

    return check


def _tcp(spec: dict, body: dict, timeout: float) -> Callable[[], bool]:
    import socket

    address = (str(spec.get("host") or POD_IP), _port(spec.get("port"), body))

    def check() -> bool:
        with contextlib.suppress(OSError):
            socket.create_connection(address, timeout=timeout).close()
            return True
        return False

    return check
