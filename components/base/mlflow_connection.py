"""Where MLflow's tracking server is, how a step reaches it, and its failures in one line.

Shared by the training runs' tracking (:mod:`sublimate.components.monitoring.mlflow_tracking`)
and the MLflow model registry (:mod:`sublimate.components.model.mlflow_registry`). The server is
named by the ``tracking`` setting (a URI; empty: ``$MLFLOW_TRACKING_URI``, which a cluster's
pods read from the Secret ``sublimate-mlflow``; ``off``: no tracking even where that is set).
Credentials are MLflow's own variables (``MLFLOW_TRACKING_USERNAME``/``PASSWORD`` or
``TOKEN``), read by MLflow's client; nothing here prints them, and a URI is shown without its
``user:password@`` part.

Import cost: the standard library only. MLflow's client (1.8 s to import on 2 cores) is imported
by :func:`client`, which the train step calls from a thread beside the job, never before it.
"""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Mapping
from typing import Any

TRACKING_URI_ENV = "MLFLOW_TRACKING_URI"
# What a cluster's Secret may hold; each becomes the variable of the same name in the steps
# that talk to MLflow (every key optional, as for the S3 Secret).
SECRET_NAME = "sublimate-mlflow"
SECRET_KEYS = (TRACKING_URI_ENV, "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD",
               "MLFLOW_TRACKING_TOKEN", "MLFLOW_TRACKING_INSECURE_TLS")
OFF = "off"
# What the setting accepts (checked by its declaration before any step runs): a server, a
# local store, or Databricks' workspace.
URI_PATTERN = r"^(off|(https?|file|sqlite|postgresql|mysql)://\S+|databricks(://\S*)?)?$"
# MLflow's client retries a refused connection 7 times with exponential backoff (minutes);
# a step that must fail in one line when the server is down asks for less, unless the user
# set these.
_CLIENT_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
                    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                    "MLFLOW_HTTP_REQUEST_TIMEOUT": "30"}
HEALTH_TIMEOUT = 5.0


class TrackingError(Exception):
    """MLflow could not be reached or refused a request; the message is one line that names
    the setting and the server (without credentials)."""


def tracking_uri(setting: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The tracking server a step logs to: ``setting`` when it is a URI, ``$MLFLOW_TRACKING_URI``
    when it is empty, None (tracking off) for ``off`` or when neither names one."""
    variables: Mapping[str, str] = os.environ if environ is None else environ
    setting = (setting or "").strip()
    if setting == OFF:
        return None
    return setting or (variables.get(TRACKING_URI_ENV) or "").strip() or None


def public_uri(uri: str) -> str:
    """``uri`` without a ``user:password@`` part: what a log line or report may show."""
    parts = urllib.parse.urlsplit(uri)
    if parts.username is None and parts.password is None:
        return uri
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urllib.parse.urlunsplit(parts._replace(netloc=host))


def unreachable(uri: str, timeout: float = HEALTH_TIMEOUT) -> str | None:
    """Why the server at ``uri`` cannot be used, in a few words; None when it answers. Only an
    HTTP server is asked (its ``/health``, a few milliseconds, no MLflow import); a local store
    is MLflow's to open."""
    if not uri.startswith(("http://", "https://")):
        return None
    import urllib.error
    import urllib.request  # deferred: every settings import reads this module's pattern

    url = uri.rstrip("/") + "/health"
    parts = urllib.parse.urlsplit(url)
    # credentials stay out of the request line and any error text; the server's health
    # endpoint needs none
    host = parts.hostname or ""
    bare = urllib.parse.urlunsplit(parts._replace(
        netloc=f"{host}:{parts.port}" if parts.port else host))
    try:
        with urllib.request.urlopen(bare, timeout=timeout) as answer:
            if answer.status >= 400:
                return f"/health answered HTTP {answer.status}"
    except urllib.error.HTTPError as error:
        return f"/health answered HTTP {error.code}"
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        return f"unreachable ({reason})"
    return None


CLIENT_MISSING = ("MLflow's client is not installed: pip install 'sublimate[mlflow]' "
                  "(mlflow-skinny), or -p tracking=off")


def usable(uri: str) -> str | None:
    """Why a step cannot log to ``uri``, in a few words; None when it can. Its client is looked
    for first (a shell that exports ``$MLFLOW_TRACKING_URI`` for other tools turns tracking on
    here too, and without the client the run would train to its end and then fail), then
    the server asked (:func:`unreachable`)."""
    import importlib.util  # deferred: every settings import reads this module's pattern

    if importlib.util.find_spec("mlflow") is None:
        return CLIENT_MISSING
    return unreachable(uri)


def problem_line(setting: str, uri: str, problem: str) -> str:
    """The one line a step fails (or warns) with."""
    return f"{setting} {public_uri(uri)}: {problem}"


def client(uri: str) -> Any:
    """MLflow's client for ``uri`` (tracking and model registry), its retries bounded (see
    ``_CLIENT_DEFAULTS``); a :class:`TrackingError` when MLflow's client is not installed."""
    for name, value in _CLIENT_DEFAULTS.items():
        os.environ.setdefault(name, value)
    parts = urllib.parse.urlsplit(uri)
    if parts.username is not None:
        # user:password@ in the URI becomes MLflow's own variables, so that the URI the client
        # holds, and prints in its messages ("View run at ..."), carries none
        os.environ.setdefault("MLFLOW_TRACKING_USERNAME", urllib.parse.unquote(parts.username))
        os.environ.setdefault("MLFLOW_TRACKING_PASSWORD",
                              urllib.parse.unquote(parts.password or ""))
        uri = public_uri(uri)
    try:
        from mlflow.tracking import MlflowClient
    except ImportError:
        raise TrackingError("tracking to MLflow needs its client: pip install "
                            "'sublimate[mlflow]' (mlflow-skinny)") from None
    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def connected(uri: str) -> Any:
    """MLflow's client for a server that answers now (:func:`unreachable`); else a
    :class:`TrackingError` that says why in a few words."""
    problem = unreachable(uri)
    if problem is not None:
        raise TrackingError(problem)
    return client(uri)


def short_error(error: BaseException) -> str:
    """An MLflow client's exception as a few words: its first line, without credentials."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    for key in SECRET_KEYS[1:4]:
        secret = os.environ.get(key)
        if secret:
            text = text.replace(secret, "***")
    return text[:300]


def credentials_env(secret_name: str = SECRET_NAME) -> list[Any]:
    """Env entries of the steps that talk to MLflow: the tracking URI and credentials from the
    Kubernetes Secret ``secret_name``, every key optional (as the S3 Secret's), so that nothing
    is needed where tracking is off and no value passes through a parameter, the manifest or
    a log. Locally, the runner fills an optional key no manifest provides from its own
    environment (``MLFLOW_TRACKING_URI=... sublimate run``) and masks it in the logs."""
    from hera.workflows import SecretEnv  # deferred: a step's own code never needs Hera

    return [SecretEnv(name=key, secret_name=secret_name, secret_key=key, optional=True)
            for key in SECRET_KEYS]
