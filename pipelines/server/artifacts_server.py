"""A node's output artifact, downloaded: Argo Server's artifact paths
(``server/artifacts/artifact_server.go``), ``GET /artifact-files/{namespace}/workflows/{name}/
{nodeId}/outputs/{artifactName}`` as Argo's UI links them, and the older
``GET /artifacts/{namespace}/{name}/{nodeId}/{artifactName}``.

The run's ``status.json`` maps each node's artifact names to where the runner stored them:
objects of the home's artifact repository (``artifacts/repository/<bucket>/<key>``, a ``.tgz``
unless the template said ``archive: none``), or files of the run folder. That path is not
trusted: it is resolved, and served only when what it names is inside the home's ``runs/`` or
its repository, so a status that names ``/etc/passwd``, or a link out of the home, serves
nothing. A file is sent as it is stored; a folder (``archive: none``) as a ``.tar.gz`` made
now, its links kept as links (never followed). Input artifacts have no stored location here
(the runner keeps none): they are not found, said so.

Like the API, it needs the token when the server has one; the page fetches with it."""

from __future__ import annotations

import contextlib
import io
import mimetypes
import os
import stat
import tarfile
from pathlib import Path

from sublimate.pipelines.runner.manifest.repository import repository_root

from .errors import NOT_FOUND, ApiError, invalid
from .routing import Raw, Request, route
from .workflow_server import find

# The answer is built in memory (``routing.Raw``): an artifact larger than this is refused,
# saying where it lies on this machine.
MAX_BYTES = 512 * 1024 * 1024
_CHUNK = 1024 * 1024
# What the browser may do with a downloaded file: nothing but save it (an HTML artifact
# opened in a tab runs no script with this server's origin).
_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; sandbox",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-store",
    "Referrer-Policy": "no-referrer",
}


def output_artifact(request: Request) -> Raw:
    _record, status = find(request)
    node_id = request.params["nodeId"]
    artifact = request.params["artifactName"]
    direction = request.params.get("direction", "outputs")
    if direction not in ("outputs", "inputs"):
        raise invalid(f"{direction}: an artifact is one of a node's inputs or outputs")
    node = next((node for node in (status or {}).get("nodes") or []
                 if isinstance(node, dict) and node.get("id") == node_id), None)
    if node is None:
        raise ApiError(NOT_FOUND, f'node "{node_id}" not found in workflow "{request.name}"')
    if direction == "inputs":
        raise ApiError(NOT_FOUND, f'input artifact "{artifact}" of node "{node_id}": the '
                                  "local runner keeps no location for inputs; download it "
                                  "from the node that made it")
    stored = ((node.get("outputs") or {}).get("artifacts") or {}).get(artifact)
    if not isinstance(stored, str) or not stored:
        raise ApiError(NOT_FOUND, f'artifact "{artifact}" not found in the outputs of node '
                                  f'"{node_id}"')
    path = _inside_home(request.server.store.home, stored)
    if path is None:
        raise ApiError(NOT_FOUND, f'artifact "{artifact}" of node "{node_id}": nothing stored '
                                  "in this server's home")
    if path.is_dir():
        body = _tar_gz(path)
        file_name = f"{artifact}.tar.gz"
        content_type = "application/gzip"
    else:
        body = _read(path)
        file_name = path.name
        content_type = _content_type(file_name)
    safe_name = "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in file_name)
    return Raw(body, content_type, {**_HEADERS,
                                    "Content-Disposition": f'attachment; filename="{safe_name}"'})


def _inside_home(home: Path, stored: str) -> Path | None:
    """What ``stored`` names, resolved (links followed), when it is inside the home's runs or
    artifact repository and exists; else None."""
    try:
        roots = [(home / "runs").resolve(), repository_root(home).resolve()]
        path = Path(stored)
        if not path.is_absolute():
            return None  # the runner records absolute paths only
        resolved = path.resolve(strict=True)
    except (OSError, RuntimeError, ValueError):  # missing, a loop of links, a NUL
        return None
    if not any(resolved != root and resolved.is_relative_to(root) for root in roots):
        return None
    return resolved


def _read(path: Path) -> bytes:
    """The file's bytes, opened without following a link swapped in after the check."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    except OSError as error:
        raise ApiError(NOT_FOUND, f"artifact file not readable: {error.strerror}") from None
    with os.fdopen(descriptor, "rb") as file:
        info = os.fstat(file.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise ApiError(NOT_FOUND, "the artifact is neither a file nor a folder")
        _check_size(info.st_size, path)
        return file.read()


def _tar_gz(folder: Path) -> bytes:
    """The folder as a .tar.gz, named after it inside: links are stored as links, never
    followed; what is neither a file, a folder nor a link is left out."""
    total = 0
    for root, _dirs, files in os.walk(folder):  # (os.walk follows no link to a folder)
        for name in files:
            with contextlib.suppress(OSError):
                info = os.lstat(os.path.join(root, name))
                if stat.S_ISREG(info.st_mode):
                    total += info.st_size
    _check_size(total, folder)
    buffer = io.BytesIO()

    def keep(member: tarfile.TarInfo) -> tarfile.TarInfo | None:
        if not (member.isfile() or member.isdir() or member.issym()):
            return None
        member.uid = member.gid = 0
        member.uname = member.gname = ""
        return member

    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=6) as archive:
        archive.add(folder, arcname=folder.name, recursive=True, filter=keep)
    return buffer.getvalue()


def _check_size(size: int, path: Path) -> None:
    if size > MAX_BYTES:
        raise invalid(f"the artifact is {size} bytes, more than the "
                      f"{MAX_BYTES} this server sends at once: it is at {path}")


def _content_type(name: str) -> str:
    if name.endswith((".tgz", ".tar.gz", ".gz")):
        return "application/gzip"
    guessed, encoding = mimetypes.guess_type(name)
    if encoding or not guessed:
        return "application/octet-stream"
    if guessed.startswith("text/") or guessed in ("application/json",):
        return "text/plain; charset=utf-8"  # shown as text, never run as a page
    return guessed


ARTIFACT_ROUTES = [
    route("GET", "/artifact-files/{namespace}/workflows/{name}/{nodeId}/{direction}/{artifactName}",
          output_artifact),
    route("GET", "/artifacts/{namespace}/{name}/{nodeId}/{artifactName}", output_artifact),
]
