"""A pod, planned and then executed: what a container sees and how it runs on this machine.

- :mod:`.plan`: a template resolved into a ``PodRequest`` (command, env, working dir, mounts,
  deadline) without running anything;
- :mod:`.executor`: the ``Executor`` protocol; :mod:`.local_executor`: the default (local process
  groups), :mod:`.container_set`: a ``containerSet``'s containers, :mod:`.local_process`: one
  process group; :mod:`.scope`: cancel scopes (stop, terminate);
- :mod:`.views` (overlay roots), :mod:`.mounts` (mount namespaces), :mod:`.mount_modes` (which
  of the two, or ``paths``: literal paths rewritten) and :mod:`.paths`: the folders a pod sees;
- :mod:`.artifacts`: input and output artifacts, the local artifact store;
- :mod:`.k8s_objects`: Secrets and ConfigMaps a pod reads;
- :mod:`.images`: container mode (a room of its own, imported only in that mode).
"""
