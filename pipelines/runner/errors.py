"""Exceptions raised by the local runner before or while running a workflow."""


class ManifestError(ValueError):
    """The manifest is malformed or uses a feature the local runner does not support.

    The message names the offending field path, e.g. ``spec.templates[2].resource``.
    """


class ParameterError(ValueError):
    """A workflow parameter given on the command line is unknown or invalid."""


class NodeError(Exception):
    """A node could not be prepared (unresolved variable, bad loop input, missing input).

    The engine turns this into an ``Error`` phase on the node instead of crashing the run.
    """


class RunInterrupted(KeyboardInterrupt):
    """The run was stopped by a signal (Ctrl-C, SIGTERM, SIGHUP) before it ended on its own.

    A ``KeyboardInterrupt``, so a caller that only knows Ctrl-C still sees one. ``signal`` is
    the first signal (the one that stopped the run, as ``argo stop``: steps ended, exit handler
    run); ``terminated`` is true when a second one ended it at once (``argo terminate``).
    ``result`` is the run as concluded, also in its ``status.json``.
    """

    def __init__(self, signal: int, terminated: bool, result: object) -> None:
        super().__init__(f"stopped by signal {signal}")
        self.signal = signal
        self.terminated = terminated
        self.result = result
