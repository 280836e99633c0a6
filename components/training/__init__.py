"""The library a training loop uses to run under sublimate (:mod:`.job`; ``docs/own-code.md``)."""

from sublimate.components.training.job import (
    METRICS_FLUSH_STEPS,
    Checkpointer,
    CommClock,
    EpochResult,
    Job,
    ProcessGroup,
    Reporter,
    device_and_backend,
    join,
    log,
    make_paradigm,
    save_model,
    start,
    time_ddp_allreduce,
    wait_for_store,
)

__all__ = [
    "METRICS_FLUSH_STEPS",
    "Checkpointer",
    "CommClock",
    "EpochResult",
    "Job",
    "ProcessGroup",
    "Reporter",
    "device_and_backend",
    "join",
    "log",
    "make_paradigm",
    "save_model",
    "start",
    "time_ddp_allreduce",
    "wait_for_store",
]
