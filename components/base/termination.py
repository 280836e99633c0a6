"""One-line failures of a step: the message a user sees, on the step's log and as its node message.

Kubernetes keeps what a container writes to its termination-message file (``/dev/termination-log``
by default) in the pod's status, and Argo shows it as the node's message, e.g. ``Error (exit code
2): global-batch-size 4096 is larger than ...``. The local runner gives every step its own file
in ``$SUBLIMATE_TERMINATION_LOG`` and reads it back the same way, so a step that ends with
:func:`fail` tells the user what to fix in one line on a cluster and on a laptop alike.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import sys
from collections.abc import Callable
from typing import NoReturn, TypeVar

from .disk_full import explain

Main = TypeVar("Main", bound=Callable[..., int])

# Kubernetes' default terminationMessagePath; the local runner points the variable elsewhere.
KUBERNETES_PATH = "/dev/termination-log"
ENV_VAR = "SUBLIMATE_TERMINATION_LOG"
# Exit status of a step refused for bad input (the same as the CLI's usage errors).
EXIT_BAD_INPUT = 2
# Kubernetes truncates termination messages at 4096 bytes.
MAX_BYTES = 4096


def termination_path() -> str | None:
    path = os.environ.get(ENV_VAR)
    if path:
        return path
    return KUBERNETES_PATH if os.path.exists(KUBERNETES_PATH) else None


def write_message(message: str) -> None:
    """Record ``message`` as this container's termination message (best effort, never raises)."""
    path = termination_path()
    if path is None:
        return
    try:
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(message.encode("utf-8")[:MAX_BYTES].decode("utf-8", "ignore"))
    except OSError:
        pass  # a read-only /dev or a missing folder must not hide the real error


def fail(step: str, message: str, code: int = EXIT_BAD_INPUT) -> int:
    """Print ``<step>: error: <message>`` on stderr, keep it as the termination message, and
    return the exit status for ``main`` to return."""
    message = " ".join(message.split())  # one line, whatever the exception text held
    print(f"{step}: error: {message}", file=sys.stderr, flush=True)
    write_message(message)
    return code


def disk_full_in_one_line(step: str) -> Callable[[Main], Main]:
    """A step's ``main`` that a full disk, wherever it wrote, ends with one line (``fail``,
    exit status 1) naming the disk and what was written, not a traceback. When the error names
    no file (a buffered file fails on ``close``), the paths of its command line and its working
    folder are where a full disk is looked for."""

    def wrap(main: Main) -> Main:
        @functools.wraps(main)
        def wrapper(*args: object, **kwargs: object) -> int:
            try:
                return main(*args, **kwargs)
            except Exception as error:
                near = [arg for arg in sys.argv[1:] if arg.startswith("/")] + [os.getcwd()]
                line = explain(error, near=near)
                if line is None:
                    raise
                return fail(step, line, code=1)

        return wrapper  # type: ignore[return-value]

    return wrap


class OneLineParser(argparse.ArgumentParser):
    """Refuses bad flags in one line (and as the termination message), not with a usage screen:
    in a workflow the user reads the step's message, not the program's synopsis. ``prog`` names
    the step the line is reported for."""

    def error(self, message: str) -> NoReturn:
        raise SystemExit(fail(self.prog, message))


def exit_now(code: int) -> NoReturn:
    """End the process without the interpreter's teardown, once all output is flushed.

    Tearing down an interpreter that holds torch (and torch._dynamo, matplotlib, TensorBoard)
    takes 0.3-0.6 CPU-s, which delays the end of the step, on cores that other nodes share.
    For a process that runs only this project's code, whose files are closed by the time it
    ends; not after a user's code ran in it, whose objects may still hold buffered writes.
    multiprocessing ends its children the same way.
    """
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
