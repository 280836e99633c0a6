"""Object storage for staging and publishing: fsspec filesystems set to fail fast, errors that
name the URL and the cause, and the Kubernetes Secret that carries credentials on a cluster.

Credentials and endpoints come only from the standard places that botocore reads: the AWS
environment variables (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``,
``AWS_PROFILE``, ``AWS_ENDPOINT_URL`` / ``AWS_ENDPOINT_URL_S3``, ...) and the shared config and
credentials files. Nothing here accepts a key as an argument, so none can end up in a manifest,
a parameter or a log.
"""

from __future__ import annotations

import errno
import os
import posixpath
import re
import threading
from typing import TYPE_CHECKING, Any

from sublimate.components.data.datasets import DatasetError

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem
    from hera.workflows import SecretEnv

# Fail fast: botocore's defaults (60 s connect timeout, up to 5 attempts) and s3fs's own 5 retries
# multiply into minutes of silence when an endpoint is down. Two attempts at each layer still ride
# out a dropped connection. (s3fs takes its retry count as an attribute, not an argument.)
S3_RETRIES = 2
S3_OPTIONS: dict[str, Any] = {
    "skip_instance_cache": True,  # env may change between calls (tests, notebooks): no stale client
    "config_kwargs": {
        "connect_timeout": 5,
        "read_timeout": 60,
        "retries": {"max_attempts": 2, "mode": "standard"},
    },
}

# Keys that a cluster's Secret may hold; each becomes the env var of the same name in the step.
SECRET_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
               "AWS_ENDPOINT_URL_S3", "AWS_DEFAULT_REGION")
_SECRET_ENV = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ACCESS_KEY_ID")


class StoreError(DatasetError):
    """Object storage refused or failed a request; the message names the URL and the cause."""


def is_s3(url: str) -> bool:
    return url.startswith(("s3://", "s3a://"))


def open_url(url: str) -> tuple[AbstractFileSystem, str]:
    """The filesystem for ``url`` and the path inside it (no trailing slash)."""
    import fsspec  # deferred: built-in datasets never pay for it

    try:
        fs, root = fsspec.core.url_to_fs(url, **(S3_OPTIONS if is_s3(url) else {}))
    except (ValueError, ImportError) as error:
        raise StoreError(f"dataset '{url}': {error}") from error
    if is_s3(url):
        fs = _S3_CLIENTS.setdefault(_aws_environment(), fs)
        fs.retries = S3_RETRIES
    return fs, root.rstrip("/")


# fsspec's own instance cache ignores the environment, so a client built for one set of AWS
# variables would be reused after they change; this one is keyed by them (a new client costs
# ~0.3 s of botocore model loading, noticeable in notebooks and tests).
_S3_CLIENTS: dict[frozenset[tuple[str, str]], Any] = {}


# Bulk GETs go through botocore's own (synchronous, thread-safe) client from a thread pool: on a
# loopback SeaweedFS it moved 1 MiB objects ~1.7x and 64 MiB ranged parts ~2x faster than
# aiobotocore's event loop (urllib3 reads big blocks straight off the socket; aiohttp hands the
# loop small chunks), and hashing and disk writes run in those threads outside the GIL.
_TRANSFER_CLIENTS: dict[tuple[frozenset[tuple[str, str]], int], Any] = {}
_TRANSFER_LOCK = threading.Lock()


def transfer_client(url: str, max_connections: int) -> Any:
    """A botocore S3 client for concurrent downloads: same credentials and endpoint (the standard
    AWS variables and files), timeouts and retries as :func:`open_url`'s, and a connection pool
    as large as the number of threads that share it. ``url`` is named in any error.

    Response checksums are left to the caller (staging checks the SHA-256 of every byte against
    the dataset's metadata, a stronger check than the CRC that botocore would add per GET).
    """
    from botocore.config import Config
    from botocore.session import get_session

    key = (_aws_environment(), max_connections)
    with _TRANSFER_LOCK:
        client = _TRANSFER_CLIENTS.get(key)
        if client is None:
            config = Config(**S3_OPTIONS["config_kwargs"], max_pool_connections=max_connections,
                            response_checksum_validation="when_required")
            try:
                client = get_session().create_client("s3", config=config)
            except Exception as error:  # e.g. a profile that does not exist
                raise explain(url, error) from error
            _TRANSFER_CLIENTS[key] = client
    return client


def _aws_environment() -> frozenset[tuple[str, str]]:
    return frozenset((k, v) for k, v in os.environ.items() if k.startswith("AWS_"))


def join(root: str, name: str) -> str:
    return posixpath.join(root, name) if root else name


def endpoint() -> str:
    """The S3 endpoint botocore will use, for messages (an endpoint URL is not a secret)."""
    return (os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
            or "the default AWS endpoint")


def public_url(url: str) -> str:
    """``url`` without any ``user:password@`` part, fit for a manifest or a log."""
    return re.sub(r"^([a-z0-9+.-]+://)[^/@]*@", r"\1", url)


def redact(text: str) -> str:
    """Belt and braces: blank any credential value that a library echoed into ``text``."""
    for name in _SECRET_ENV:
        value = os.environ.get(name)
        if value and len(value) >= 4:
            text = text.replace(value, "***")
    return text


def _chain(error: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and current not in seen:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def explain(url: str, error: BaseException) -> StoreError:
    """Turn what fsspec/s3fs/botocore raised while touching ``url`` into one clear message."""
    names = {type(e).__name__ for e in _chain(error)}
    text = redact(" ".join(str(e) for e in _chain(error)))
    bucket = url.split("://", 1)[-1].split("/", 1)[0]
    if names & {"NoCredentialsError", "PartialCredentialsError", "ProfileNotFound"}:
        cause = ("no credentials found (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or "
                 "AWS_PROFILE; on a cluster, the Secret named by the pipeline)")
    elif names & {"EndpointConnectionError", "ConnectTimeoutError", "ConnectionClosedError",
                  "ClientConnectorError", "ServerDisconnectedError", "ConnectionRefusedError",
                  "ReadTimeoutError"}:
        cause = f"cannot reach the endpoint {endpoint()} ({_last_line(text)})"
    elif "PreconditionFailed" in text:
        cause = "it changed while it was being copied (its ETag no longer matches the listing)"
    elif isinstance(error, PermissionError) or "AccessDenied" in text or "Forbidden" in text:
        cause = f"credentials refused or access denied ({_last_line(text)})"
    elif missing_bucket(error):
        cause = f"bucket '{bucket}' does not exist at {endpoint()}"
    elif isinstance(error, OSError) and error.errno == errno.ENOSPC:
        cause = f"disk full ({error.strerror})"
    else:
        cause = _last_line(text) or type(error).__name__
    return StoreError(f"dataset '{public_url(url)}': {cause}")


def missing_bucket(error: BaseException) -> bool:
    text = " ".join(str(e) for e in _chain(error))
    return "NoSuchBucket" in text or "specified bucket does not exist" in text


def _last_line(text: str) -> str:
    return text.strip().splitlines()[-1][:300] if text.strip() else ""


def credentials_env(secret_name: str, keys: tuple[str, ...] = SECRET_KEYS) -> list[SecretEnv]:
    """Env entries that read S3 credentials and endpoint from the Kubernetes Secret ``secret_name``.

    Each key is optional, so a Secret may hold only what it needs (e.g. an endpoint and keys for
    MinIO/SeaweedFS, nothing at all where the pod's service account grants access via IRSA).
    The values never pass through a parameter or the rendered manifest: only the Secret's name.
    """
    from hera.workflows import SecretEnv

    return [SecretEnv(name=key, secret_name=secret_name, secret_key=key, optional=True)
            for key in keys]
