"""The launcher: from the train step's arguments to a TorchX job, and that job followed to its
end. Never imports torch (everything before the job is submitted is the user's wait).

- :mod:`.apps`: the TorchX components (``trainer``, ``parameter_server``): typed functions
  returning ``AppDef``\\ s, like ``torchx.components.dist``;
- :mod:`.launcher`: ``launch`` (the run lock, the relaunch loop, one attempt watched by the
  watchdog), and the step's arguments turned into an ``AppDef`` (``build_app``);
- :mod:`.logs`: the replicas' logs followed into the step's log;
- :mod:`.job_runner`: the TorchX runner and the job's name on a cluster;
- :mod:`.gpu_plan`: how simulated nodes share this host's GPUs;
- :mod:`.run_lock`: one launcher per run folder;
- :mod:`.job_reaper`: a ``local_cwd`` job's processes end with its launcher, however it ends;
- :mod:`.netns_scheduler`: the ``local_netns`` TorchX scheduler (a cluster on one machine),
  :mod:`.cpu_cgroups`: its nodes' cpu groups (cgroup v1 or v2), and :mod:`.faults`: the faults
  it can inject.

A launcher feature (a process beside the job, a restart policy) is a module here, wired into
:func:`.launcher.launch` or :func:`.launcher.run_attempt`.
"""
