"""The library a training loop uses to run under sublimate; the built-in loop is one of its users.

A loop of your own (under ``sublimate run -p entrypoint=my.module``) gets the paradigms, the
checkpoints and the monitoring of the built-in loop with a few lines (the outline of one
epoch; ``tests/test_documented_examples.py`` runs it)::

    from sublimate.components import training

    job = training.start()                                  # process group, device, contract
    model = MyNet().to(job.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    paradigm = job.paradigm(model, optimizer, "bmuf", sync_period=8)
    step, extra = job.checkpoints.restore(model, optimizer, paradigm)   # 0 on a fresh start
    reporter = job.reporter(paradigm.training_model(), total_steps, local_batch)
    ...                                  # forward/backward on paradigm.training_model()
    optimizer.step(); step += 1; paradigm.after_step(step)
    reporter.step(step, data_seconds, compute_seconds, comm_seconds)
    reporter.end_epoch(epoch, step, mean_loss, epoch_seconds, epoch_steps)   # a collective
    paradigm.finish(step)                  # after the last step: bmuf/easgd sync the remainder
    job.checkpoints.save(step, model, optimizer, paradigm)             # a collective
    job.finish(paradigm.result_model())                                # model.pt on rank 0

Everything here is per process and explicit: no global state, no hidden threads besides the
metrics endpoint. ``docs/own-code.md`` is the guide; :mod:`sublimate.components.base.contract`
lists what the launcher passes in.

One module per part: :mod:`.process_group` (joining the job), :mod:`.checkpointer`,
:mod:`.reporter` (monitoring) and :mod:`.job` (``start`` and ``Job``, which tie them together);
the names below are the library's, whichever module holds them.
"""

from __future__ import annotations

from sublimate.components.training.checkpointer import (
    Checkpointer,
    ShardedCheckpointer,
    checkpointer,
)
from sublimate.components.training.job import Job, make_paradigm, save_model, start
from sublimate.components.training.process_group import (
    ProcessGroup,
    device_and_backend,
    join,
    log,
    wait_for_store,
)
from sublimate.components.training.reporter import (
    METRICS_FLUSH_STEPS,
    CommClock,
    EpochResult,
    Reporter,
    time_ddp_allreduce,
)

__all__ = [
    "METRICS_FLUSH_STEPS",
    "Checkpointer",
    "CommClock",
    "EpochResult",
    "Job",
    "ProcessGroup",
    "Reporter",
    "ShardedCheckpointer",
    "checkpointer",
    "device_and_backend",
    "join",
    "log",
    "make_paradigm",
    "save_model",
    "start",
    "time_ddp_allreduce",
    "wait_for_store",
]
