"""The local artifact repository: one per local home, standing in for every bucket.

Argo stores an artifact in a bucket of an artifact repository (s3, gcs, azure, oss, hdfs,
artifactory) under a key; a key written by one pod, or one workflow, is read by the next. Here
every bucket is a folder of ``$SUBLIMATE_HOME/artifacts/repository`` and every key a path in it
(``<root>/<bucket>/<key>``), so keys behave as in a bucket across the nodes of a run and across
runs of the same home. A "directory" key is a prefix: the objects under it.

- A location's bucket is its ``bucket`` (s3, gcs, oss), ``container`` (azure), ``hdfs`` for an
  hdfs ``path``, the URL's host for an artifactory ``url``; a key-only artifact (no bucket) is in
  the repository's own bucket, ``DEFAULT_BUCKET``: Argo's ``Relocate`` fills what the
  artifact leaves out from the repository (pkg/apis/workflow/v1alpha1/workflow_types.go).
- ``artifactRepositoryRef`` picks a repository from a config map on a cluster; locally every
  reference names the one repository of the home.
- An output with no key is stored under the repository's key format, Argo's default
  ``DefaultArchivePattern`` ``{{workflow.name}}/{{pod.name}}``
  (pkg/apis/workflow/v1alpha1/artifact_repository_types.go), joined with the file name
  (workflow/executor/executor.go, ``saveArtifactFromFile``).
- ``http`` and ``git`` artifacts are fetched only from this machine (127.0.0.1, localhost, a
  local git repository): anything else is refused with its URL.
"""

from __future__ import annotations

import posixpath
from pathlib import Path
from typing import Any

# Argo's DefaultArchivePattern: the key of an output artifact that gives none.
DEFAULT_KEY_FORMAT = "{{workflow.name}}/{{pod.name}}"
# The bucket of key-only artifacts (the repository's own bucket on a cluster).
DEFAULT_BUCKET = "default"

# The storage locations the repository stands in for, and how each names its bucket and key.
BUCKET_KINDS = ("s3", "gcs", "oss", "azure", "hdfs", "artifactory")
REMOTE_KINDS = ("http", "git")
LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


def repository_root(home: Path) -> Path:
    return home / "artifacts" / "repository"


def location_kind(art: dict) -> str | None:
    """The storage location an artifact names (``s3``, ..., ``http``, ``git``), or None."""
    for kind in (*BUCKET_KINDS, *REMOTE_KINDS):
        if isinstance(art.get(kind), dict):
            return kind
    return None


def bucket_and_key(art: dict) -> tuple[str, str]:
    """(bucket, key) of an artifact's bucket location; the key is ``""`` when none is given."""
    kind = location_kind(art)
    loc: dict = art.get(kind) or {} if kind else {}
    if kind == "azure":
        return str(loc.get("container") or DEFAULT_BUCKET), str(loc.get("blob") or "")
    if kind == "hdfs":
        return "hdfs", str(loc.get("path") or "")
    if kind == "artifactory":
        from urllib.parse import urlsplit  # only an artifactory artifact pays for it

        url = urlsplit(str(loc.get("url") or ""))
        return url.netloc or DEFAULT_BUCKET, url.path
    return str(loc.get("bucket") or DEFAULT_BUCKET), str(loc.get("key") or "")


def object_path(home: Path, bucket: str, key: str) -> Path:
    """The local file or folder of ``bucket``/``key``; ``ValueError`` for a key that would leave
    its bucket (``..``) or an empty one."""
    clean = posixpath.normpath("/" + key).lstrip("/")
    if not clean or clean == "." or ".." in clean.split("/"):
        raise ValueError(f"artifact key {key!r} is not a key in a bucket")
    if not bucket or "/" in bucket or bucket in (".", ".."):
        raise ValueError(f"artifact bucket {bucket!r} is not a bucket name")
    return repository_root(home) / bucket / clean


def is_local_url(url: str) -> bool:
    """An http URL on this machine (127.0.0.1, localhost, ::1)."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    return parts.scheme in ("http", "https") and (parts.hostname or "") in LOCAL_HOSTS


def local_git_repo(repo: str) -> str | None:
    """The local folder of a git ``repo`` (a path or a ``file://`` URL), or None."""
    if repo.startswith("file://"):
        return repo.removeprefix("file://") or None
    if repo.startswith("/"):
        return repo
    return None


def remote_problem(art: dict) -> str | None:
    """Why an ``http``/``git`` artifact cannot be fetched here (it is elsewhere), or None.
    A URL still holding ``{{...}}`` is checked when it is resolved."""
    if isinstance(art.get("http"), dict):
        url = str(art["http"].get("url") or "")
        if "{{" not in url and not is_local_url(url):
            return (f"http artifact {url!r} is outside this machine: the local runner fetches "
                    "only http://127.0.0.1 or http://localhost URLs")
    if isinstance(art.get("git"), dict):
        repo = str(art["git"].get("repo") or "")
        if "{{" not in repo and local_git_repo(repo) is None:
            return (f"git artifact {repo!r} is outside this machine: the local runner clones "
                    "only a local repository (a path or a file:// URL)")
    return None


def remote_problems(spec: Any, path: str = "spec") -> list[str]:
    """``remote_problem`` of every artifact of a spec, each with its path."""
    found: list[str] = []
    if isinstance(spec, dict):
        for key, value in spec.items():
            sub = f"{path}.{key}"
            if key == "artifacts" and isinstance(value, list):
                for i, art in enumerate(value):
                    problem = remote_problem(art) if isinstance(art, dict) else None
                    if problem:
                        kind = "http" if "http" in art else "git"
                        found.append(f"{sub}[{i}].{kind}: {problem}")
            else:
                found += remote_problems(value, sub)
    elif isinstance(spec, list):
        for i, item in enumerate(spec):
            found += remote_problems(item, f"{path}[{i}]")
    return found
