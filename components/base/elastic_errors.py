"""torchrun's error files: how a failing training process says why, and how the launcher reads it.

torchrun gives every worker a file to write its error to (``$TORCHELASTIC_ERROR_FILE``; torch's
``@record`` decorator writes it) under its log folder, which the launcher points at the run
folder on the shared volume (``logs/elastic/node<i>/``, :func:`log_dir`), so that the launcher,
the run report and a person can all read every rank's error after the job, on any scheduler::

    logs/elastic/node1/<app id>_<random>/attempt_<restart>/<local rank>/error.json

:func:`recorded` wraps a training process's main function (the built-in worker, a user's entry
point) like ``@record``, writing torch's format (``{"message": {"message": ..., "extraInfo":
{"py_callstack": ..., "timestamp": ...}}}``, which torchrun's own failure report reads) plus the
global rank, the node and a precise time, so that the first rank to fail can be told from the
ranks that failed because of it. :func:`read_failures` reads them back, first failure first.
Light (no torch): the launcher reads them.
"""

from __future__ import annotations

import contextlib
import faulthandler
import functools
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sublimate.components.base import run_files
from sublimate.components.base.disk_full import explain

ERROR_FILE_ENV = "TORCHELASTIC_ERROR_FILE"  # set by torchrun for each worker
LOG_DIR_ENV = "PET_LOG_DIR"  # torchrun's --log-dir, as its environment variable
ELASTIC = "elastic"  # under the run folder's logs/


def log_dir(run_dir: Path, node: str) -> Path:
    """torchrun's log folder for the node ``node`` (a TorchX macro, ``${replica_id}``, or a
    number): ``<run>/logs/elastic/node<node>``."""
    return Path(run_dir) / run_files.LOGS / ELASTIC / f"node{node}"


@dataclass(frozen=True)
class Failure:
    """One failed training process, from its error file."""

    message: str  # ``ValueError: bad shape``, ``exited with code 2: usage ...``
    time: float  # when it failed (seconds since the epoch; to the second for torch's own files)
    error_file: Path
    rank: int | None = None  # the global rank (None: a file torch's @record wrote)
    local_rank: int | None = None
    node: int | None = None  # the TorchX replica (the node's index in the job)
    app_id: str = ""  # the launcher's attempt: the TorchX job
    restart: int = 0  # torchrun's restart of the workers

    @property
    def who(self) -> str:
        """``rank 1 (node1)``, or ``local rank 0 of node1`` when the global rank is unknown."""
        node = f"node{self.node}" if self.node is not None else "its node"
        if self.rank is not None:
            return f"rank {self.rank} ({node})"
        return f"local rank {self.local_rank} of {node}"


def read_failures(run_dir: Path, app_id: str | None = None) -> list[Failure]:
    """Every error file under the run folder's ``logs/elastic/`` (only the TorchX job
    ``app_id``'s when given), the first failure first."""
    root = Path(run_dir) / run_files.LOGS / ELASTIC
    failures = []
    for path in root.glob("node*/*/attempt_*/*/error.json"):
        # torchrun's folder for the job is tempfile.mkdtemp(prefix=f"{rdzv id}_"): the rdzv id
        # (the TorchX job's id), "_", and 8 random characters, which may hold a "_" themselves
        job = path.parents[2].name[:-len("_xxxxxxxx")]
        if app_id is not None and job != app_id:
            continue
        failure = _read(path, job)
        if failure is not None:
            failures.append(failure)
    return sorted(failures, key=lambda f: (f.time, f.rank is None, f.rank or 0))


def _read(path: Path, app_id: str) -> Failure | None:
    try:
        data = json.loads(path.read_text())
        message = data["message"]
        extra = message.get("extraInfo", {}) if isinstance(message, dict) else {}
        text = message["message"] if isinstance(message, dict) else str(message)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    node = path.parents[3].name.removeprefix("node")

    def number(value: Any) -> int | None:
        return int(value) if str(value).lstrip("-").isdigit() else None

    try:
        # torch's own files hold whole seconds: after every precise time of that second
        when = float(extra["time"]) if extra.get("time") else \
            float(extra.get("timestamp") or int(path.stat().st_mtime)) + 0.999999
    except (TypeError, ValueError, OSError):
        when = 0.0
    return Failure(message=" ".join(str(text).split()), time=when, error_file=path,
                   rank=number(extra.get("rank")), local_rank=number(path.parent.name),
                   node=number(node), app_id=app_id,
                   restart=number(path.parents[1].name.removeprefix("attempt_")) or 0)


def write_failure(message: str, callstack: str = "") -> None:
    """Write this process's error file, if torchrun gave it one (never raises: the failure
    itself must still be reported)."""
    path = os.environ.get(ERROR_FILE_ENV)
    if not path:
        return
    now = time.time()
    data = {"message": {"message": message, "extraInfo": {
        "py_callstack": callstack, "timestamp": str(int(now)), "time": f"{now:.6f}",
        "rank": os.environ.get("RANK", ""), "local_rank": os.environ.get("LOCAL_RANK", ""),
        "node": os.environ.get("GROUP_RANK", "")}}}
    with contextlib.suppress(OSError):
        Path(path).write_text(json.dumps(data))


class _LastLine:
    """A stream that passes everything on and remembers the last line written: what a program
    said before it exited with an error (argparse's ``error: ...``)."""

    def __init__(self, stream: Any) -> None:
        self._stream, self.last = stream, ""

    def write(self, text: str) -> int:
        lines = [line for line in text.splitlines() if line.strip()]
        if lines:
            self.last = lines[-1].strip()
        return self._stream.write(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def recorded(function: Callable[..., Any] | None = None, *,
             report: Callable[[BaseException], None] | None = None) -> Any:
    """``function`` (a training process's main) with its failure written to the error file:
    an exception, a ``SystemExit`` with an error, or a non-zero int it returns, each with what
    it said; as torch's ``@record``, plus the rank and a precise time.

    An exception is then printed (by ``report``, else as Python prints an uncaught one) and the
    process exits with status 1, as it would have: raising it on would let torch's own
    ``@record``, which wraps a forked worker, overwrite the file without the rank.
    """
    if function is None:
        return functools.partial(recorded, report=report)

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with contextlib.suppress(Exception):  # as @record: C-level crashes leave a trace too
            faulthandler.enable(all_threads=True)
        stderr = sys.stderr = _LastLine(sys.stderr)
        try:
            result = function(*args, **kwargs)
        except SystemExit as exit_:
            if exit_.code not in (None, 0):
                write_failure(_exit_message(exit_.code, stderr.last))
            raise
        except Exception as error:
            # A full disk is said as the disk and what was written (``disk_full``), not as
            # whatever exception the writer wrapped it in (torch's ``unexpected pos``).
            write_failure(explain(error) or f"{type(error).__name__}: {error}".rstrip(": "),
                          traceback.format_exc())
            sys.stderr = stderr._stream
            if report is not None:
                report(error)
            else:
                sys.excepthook(type(error), error, error.__traceback__)
            raise SystemExit(1) from None
        finally:
            if sys.stderr is stderr:
                sys.stderr = stderr._stream
        if isinstance(result, int) and not isinstance(result, bool) and result:
            write_failure(_exit_message(result, stderr.last))
        return result

    return wrapper


def _exit_message(code: object, said: str) -> str:
    if isinstance(code, int):
        return f"exited with code {code}" + (f": {said}" if said else "") + _quoting_hint(said)
    return f"exited: {code}"  # sys.exit("message") prints the message and exits with 1


# argparse's words for a flag given no value: with `-p entrypoint-args="--data
# $SUBLIMATE_DATA_DIR"` the user's own shell replaced the variable with nothing before sublimate
# saw it (single quotes keep it for sublimate to expand).
_NO_VALUE = "expected one argument"


def _quoting_hint(said: str) -> str:
    if _NO_VALUE not in said:
        return ""
    return (" (a $SUBLIMATE_... variable in -p entrypoint-args? Put the value in single quotes: "
            "in double quotes your shell replaced the variable with nothing)")
