"""A pod's environment: what its manifest declares, and a short list the runner needs.

On a cluster a container's environment is its image's ``ENV``, what the kubelet adds, and what
the pod spec declares; nothing of the shell that submitted the workflow reaches it. Locally the
runner's own Python environment stands in for the image and this machine for the node, so a
pod starts from the few variables of this process that play those parts (``HOST_VARIABLES``),
never from the whole of ``os.environ``: a variable exported in the shell that ran
``sublimate run`` (a token, a password) would otherwise reach every pod and be printed
unmasked by any step that logs its environment.

What a pod gets, each layer overriding the one before:

1. ``HOST_VARIABLES`` that this process has (not in container mode: the image has its own);
2. ``PYTHONUNBUFFERED=1``, so that a pod's lines reach its log and the console as printed;
3. the variables of optional secretKeyRefs that no Secret manifest provides, from this
   machine's environment (``k8s_objects``: ``from_environment``; masked like any secret);
4. what the manifest declares (``env``, ``envFrom``);
5. what the user passed explicitly (``sublimate run --env NAME[=VALUE]``), masked in every output
   like a secret's value (the run remembers them as secrets: ``engine``);
6. the runner's own variables (``PodRequest.runner_env``), which a pod must be able to trust.

``pod_environment`` is the one place that builds it: every process a pod starts (its
container, an init container, a sidecar, a containerSet's containers, a readiness probe's
command, a container in its image) gets its environment from here.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

# What stands in for the image and the node, taken from this process when set. Nothing here
# is meant to hold a secret; everything else of the shell reaches a pod only through --env.
HOST_VARIABLES = (
    # the image's search paths: `python`, `sh`, `torchrun` and a GPU machine's CUDA libraries
    # are found through them, as in an image whose ENV sets them
    "PATH",
    "LD_LIBRARY_PATH",
    # every image has a home: torch's, pip's and matplotlib's caches go under it
    "HOME",
    # the image's locale: how a pod's processes encode the text they read and print
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    # the node's time zone, so that a pod's timestamps read as the console's
    "TZ",
    # the node's scratch space: the test suite points it under pytest's base folder, so that
    # what pods leave there (torchrun's log folders) is pruned with it
    "TMPDIR",
    # the node's devices: the GPUs this runner may hand out, as a device plugin exposes a
    # node's to its containers
    "CUDA_VISIBLE_DEVICES",
    # the node's CPU allotment per process (a container sees its CPU limit): the test suite
    # gives every process one thread, more than cores would only spin
    "OMP_NUM_THREADS",
    # a process mark, not data: the test suite's reaper (tests/conftest.py, job_reaper) ends
    # every process that carries it when the session ends, pods and what they start included
    "SUBLIMATE_TEST_SESSION",
)


def host_environment() -> dict[str, str]:
    """The variables of ``HOST_VARIABLES`` that this process has."""
    environ = os.environ
    return {name: environ[name] for name in HOST_VARIABLES if name in environ}


def pod_environment(declared: Mapping[str, str], runner: Mapping[str, str], *,
                    from_environment: Iterable[str] = (),
                    passed: Mapping[str, str] | None = None,
                    in_image: bool = False) -> dict[str, str]:
    """The environment of one process of a pod (see the module docstring for its layers):
    ``declared`` by its manifest, the ``runner``'s own variables, the names of optional secrets
    taken from this machine's environment, what the user ``passed`` with ``--env``.
    ``in_image``: the process runs in its image, which supplies the image's and node's part."""
    env = {} if in_image else host_environment()
    env["PYTHONUNBUFFERED"] = "1"  # lets the runner stream a pod's lines as they come
    environ = os.environ
    env.update({name: environ[name] for name in from_environment if name in environ})
    env.update(declared)
    if passed:
        env.update(passed)
    env.update(runner)
    return env


__all__ = ["HOST_VARIABLES", "host_environment", "pod_environment"]
