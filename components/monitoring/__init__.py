"""Watching a training job: Prometheus metrics and start-up timings (:mod:`.metrics`),
stragglers (:mod:`.stragglers`), TensorBoard and the epoch log (:mod:`.tensorboard_log`), the run
report and its plots (:mod:`.run_report`), and the heartbeats the launcher's watchdog judges
(:mod:`.watchdog`).

Torch-free at import time: the launcher uses the watchdog and the metrics' names.
"""
