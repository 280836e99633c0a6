"""The training job's logs, followed into the train step's log: every replica's lines, each
prefixed by its node (``[node0] ...``), one whole line at a time."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from sublimate.components.launch.failures import app_id_of, quiet
from sublimate.components.launch.job_runner import LOCAL_SCHEDULERS

if TYPE_CHECKING:
    from torchx import specs

_OUTPUT_LOCK = threading.Lock()


def whole_lines(chunks: Iterable[str]) -> Iterator[str]:
    """Lines of ``chunks``, joining the pieces of a line that arrived in two reads.

    TorchX's local log iterator reads fixed-size chunks from a file that is still being
    written, so one printed line can come back as two pieces.
    """
    pending = ""
    for chunk in chunks:
        pending += chunk
        *complete, pending = pending.split("\n")
        yield from complete
    if pending:
        yield pending


def log_streams(scheduler: str) -> tuple[object, ...]:
    """Which of a replica's log streams to follow."""
    from torchx.schedulers.api import Stream

    # The local scheduler's combined.log is copied from stdout/stderr by a background thread
    # that can lag the process by 0.1 s, so a job that just ended may miss its last lines
    # there; the per-stream files are written by the process itself and are complete.
    return (Stream.STDOUT, Stream.STDERR) if scheduler in LOCAL_SCHEDULERS else (None,)


def _stream_logs(runner: object, handle: str, role: str, replica: int, scheduler: str,
                 stream: object, prefix: str) -> None:
    try:
        chunks = runner.log_lines(  # type: ignore[attr-defined]
            handle, role, k=replica, should_tail=True, streams=stream)
        # Kubernetes yields whole lines without their newline; the local scheduler, file chunks.
        lines = whole_lines(chunks) if scheduler in LOCAL_SCHEDULERS else chunks
        # A failure's tracebacks and torchrun's reports stay in the node's log file; the
        # launcher says why in one line (failures.explain).
        node = replica if role == "worker" else None
        for line in quiet(lines, app_id_of(handle), node):
            # One write per line under a lock, so lines from different nodes never interleave.
            with _OUTPUT_LOCK:
                sys.stdout.write(f"[{prefix}] {line.rstrip()}\n")
                sys.stdout.flush()
    except Exception as error:  # the log stream must never take the step down with it
        print(f"[{prefix}] (log stream ended: {error})", flush=True)


def follow_logs(runner: object, handle: str, app: specs.AppDef,
                scheduler: str) -> list[threading.Thread]:
    """Copies every replica's log into this process's stdout, each line prefixed by its node.

    Returns the started threads; they end once the job has ended and its logs are read.
    """
    threads = [
        threading.Thread(target=_stream_logs, daemon=True, args=(
            runner, handle, role.name, replica, scheduler, stream,
            f"node{replica}" if role.name == "worker" else f"{role.name}{replica}"))
        for role in app.roles for replica in range(role.num_replicas)
        for stream in log_streams(scheduler)]
    for thread in threads:
        thread.start()
    return threads


