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
