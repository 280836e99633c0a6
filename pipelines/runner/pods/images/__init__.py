"""Container mode (``sublimate run --containers``): every pod's containers run in their images.

- :mod:`.spec`: what a container runs in its image, planned with the pod (plain data);
- :mod:`.executor`: ``ImageExecutor``, the executor that runs them through an engine;
- :mod:`.engines`: the container engines (docker, podman, buildah);
- :mod:`.keeper`: the process that removes a killed runner's containers.

Imported only in that mode (``engine`` and ``plan`` defer it); nothing else of the runner
imports this room.
"""
