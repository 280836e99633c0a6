"""Runs a user's training code in every process that torchrun starts: ``-p entrypoint=...``.

``python -m sublimate.components.processes.entrypoint [--framework tensorflow] -- TARGET
[ARGS...]``, where TARGET is a module (``mypkg.train``, run as ``python -m`` would),
``module:function`` (imported and called with no arguments; an int it returns is the exit code) or a
script path (run as ``python script.py`` would). ``sys.argv`` is ``[TARGET, *ARGS]`` as the code
expects. Before the code starts, the contract of :mod:`sublimate.components.base.contract` is in the
environment (the launcher set it), plus ``TF_CONFIG`` for TensorFlow, built here from torchrun's
launch so that every worker knows every other worker's address.
"""

from __future__ import annotations

import argparse
import importlib
import os
import runpy
import sys
import traceback
from pathlib import Path
from types import TracebackType

from sublimate.components.base.contract import TF_CONFIG_ENV, is_script
from sublimate.components.base.elastic_errors import recorded

MODULE = "sublimate.components.processes.entrypoint"


def run(target: str, args: list[str]) -> int:
    """Run ``target`` in this process as the command line would; returns its exit code."""
    if is_script(target):
        sys.argv = [target, *args]
        sys.path.insert(0, str(Path(target).resolve().parent))  # as `python script.py` does
        runpy.run_path(target, run_name="__main__")
        return 0
    module, _, function = target.partition(":")
    sys.argv = [target if function else module, *args]
    if function:
        result = getattr(importlib.import_module(module), function)()
        return result if isinstance(result, int) else 0
    runpy.run_module(module, run_name="__main__", alter_sys=True)
    return 0


def print_failure(error: BaseException) -> None:
    """The traceback of the user's code (this module's and runpy's frames left out), each line
    prefixed with the rank as torch.distributed prints a worker's: the launcher keeps these
    lines out of the step's log and names the failure in one line (launch.failures)."""
    frames = traceback.extract_tb(error.__traceback__)
    ours = str(Path(__file__).resolve().parents[1])  # sublimate.components: the wrapping frames
    skipped = next((index for index, frame in enumerate(frames)
                    if not frame.filename.startswith(ours) and "runpy" not in frame.filename),
                   0)
    error.__traceback__ = _skip(error.__traceback__, skipped)
    prefix = f"[rank{os.environ.get('RANK', '?')}]: "
    text = "".join(traceback.format_exception(error))
    sys.stderr.write("".join(prefix + line if line.strip() else line
                             for line in text.splitlines(keepends=True)))
    sys.stderr.flush()


def _skip(tb: TracebackType | None, frames: int) -> TracebackType | None:
    for _ in range(frames):
        if tb is None or tb.tb_next is None:
            break
        tb = tb.tb_next
    return tb


# torchrun's error file says why this rank failed (for the launcher); its traceback is printed
# as a rank's, for the launcher to keep out of the step's log
@recorded(report=print_failure)
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="entrypoint", description=__doc__.splitlines()[0])
    parser.add_argument("--framework", choices=("pytorch", "tensorflow"), default="pytorch")
    parser.add_argument("target")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" in argv:  # everything after -- belongs to the user's code, flags included
        split = argv.index("--")
        options = parser.parse_args(argv[:split + 2])
        options.args = argv[split + 2:]
    else:
        options = parser.parse_args(argv)
    if options.framework == "tensorflow" and TF_CONFIG_ENV not in os.environ:
        from sublimate.components.processes.tf_config import tf_config

        os.environ[TF_CONFIG_ENV] = tf_config()
    return run(options.target, options.args)


if __name__ == "__main__":
    sys.exit(main())
