"""What every ``sublimate`` command shares: exit codes, the usage error, ``-p`` and parameter
files, and the home folder."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

DEFAULT_PIPELINE = "train"
EXIT_FAILED = 1
EXIT_USAGE = 2


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit status 2."""


def default_home() -> Path:
    return Path(os.environ.get("SUBLIMATE_HOME") or Path.home() / ".sublimate")


def parse_parameter_flags(flags: list[str]) -> dict[str, str]:
    parameters: dict[str, str] = {}
    for flag in flags:
        name, separator, value = flag.partition("=")
        if not separator or not name.strip():
            raise UsageError(f"-p '{flag}': expected name=value")
        parameters[name.strip()] = value
    return parameters


def read_parameter_file(path: Path) -> dict[str, str]:
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except OSError as error:
        raise UsageError(f"--parameter-file {path}: {error.strerror}") from error
    except yaml.YAMLError as error:
        raise UsageError(f"--parameter-file {path}: not valid YAML/JSON: {error}") from error
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UsageError(f"--parameter-file {path}: expected a mapping of name: value")
    parameters = {}
    for name, value in data.items():
        if isinstance(value, dict | list):
            raise UsageError(f"--parameter-file {path}: parameter '{name}' must be a scalar")
        parameters[str(name)] = str(value).lower() if isinstance(value, bool) else str(value)
    return parameters


def check_settings(workflow: dict[str, Any], parameters: dict[str, str]) -> None:
    """For a sublimate pipeline: its parameters as the runner resolves them, then its
    cross-setting rules, so a bad combination is refused in one line before any step runs or a
    run folder exists. Other manifests are checked by the runner itself."""
    from sublimate.pipelines.render import parameter_check

    check = parameter_check(workflow)
    if check is None:
        return
    from sublimate.components.base.settings import SettingError
    from sublimate.pipelines.runner import ParameterError, resolve_parameters
    try:
        check(resolve_parameters(workflow, parameters))
    except (ParameterError, SettingError) as error:
        raise UsageError(str(error)) from error


def check_tracking_server(workflow: dict[str, Any], parameters: dict[str, str]) -> None:
    """A local run of a pipeline that tracks to MLflow: its server (``-p tracking``, else this
    shell's ``$MLFLOW_TRACKING_URI``, which the runner hands the steps as the Secret's value)
    must answer before any step runs, unless ``tracking-required`` is false; refused in one
    line naming the setting. On a cluster the train step checks it (the server may be
    reachable from the cluster only), so ``submit`` does not."""
    from sublimate.pipelines.render import parameter_check

    if parameter_check(workflow) is None:
        return
    from sublimate.pipelines.runner import resolve_parameters

    texts = resolve_parameters(workflow, parameters)
    if "tracking" not in texts or texts.get("tracking-required", "true").lower() == "false":
        return
    from sublimate.components.base.mlflow_connection import (
        problem_line,
        tracking_uri,
        usable,
    )

    uri = tracking_uri(texts["tracking"])
    problem = usable(uri) if uri is not None else None
    if uri is not None and problem is not None:
        raise UsageError(f"{problem_line('tracking', uri, problem)} (set -p "
                         "tracking-required=false to train without it)")
