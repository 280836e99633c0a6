"""The launcher's libraries: the TorchX runner and the job's identity on a cluster
(:mod:`.cluster_job`), GPU plans (:mod:`.gpu_plan`), the run lock (:mod:`.run_lock`), the
``local_netns`` scheduler (:mod:`.netns_scheduler`) and its faults (:mod:`.faults`)."""
