"""A node's output artifacts downloaded at Argo Server's paths (``/artifact-files/...``, as
Argo's UI links them, and ``/artifacts/...``): a stored file as it is, a folder as a .tar.gz
with its links kept as links; nothing outside the home's runs and artifact repository, whatever
the run's status.json names; the token asked for like the API's."""

from __future__ import annotations

import io
import json
import tarfile
import time
from collections.abc import Callable
from pathlib import Path

import requests

from .argo_api import Server, ended, wait_for

SCRIPT = ("mkdir -p /tmp/out/folder && echo hello > /tmp/out/file.txt && "
          "echo inner > /tmp/out/folder/inner.txt && ln -s /etc/passwd /tmp/out/folder/link")


def _workflow() -> dict:
    return {"metadata": {"name": "makes-artifacts"}, "spec": {
        "entrypoint": "make",
        "templates": [{"name": "make",
                       "container": {"image": "alpine:3.20", "command": ["sh", "-c", SCRIPT]},
                       "outputs": {"artifacts": [
                           {"name": "packed", "path": "/tmp/out/file.txt"},
                           {"name": "plain", "path": "/tmp/out/file.txt", "archive": {"none": {}}},
                           {"name": "folder", "path": "/tmp/out/folder",
                            "archive": {"none": {}}}]}}]}}


def _files(server: Server, namespace: str, name: str, node: str, artifact: str) -> str:
    return f"{server.url}/artifact-files/{namespace}/workflows/{name}/{node}/outputs/{artifact}"


def _run(server: Server) -> tuple[dict, str]:
    assert server.call("POST", "/api/v1/workflows/ns", json={"workflow": _workflow()})[0] == 200
    body = wait_for(server, "ns", "makes-artifacts", ended)
    assert body["status"]["phase"] == "Succeeded", body["status"]
    pod = next(node for node in body["status"]["nodes"].values() if node["type"] == "Pod")
    return body, pod["id"]


def test_a_nodes_artifacts_are_downloaded(start: Callable[..., Server]) -> None:
    server = start()
    _, node = _run(server)

    plain = requests.get(_files(server, "ns", "makes-artifacts", node, "plain"), timeout=30)
    assert plain.status_code == 200 and plain.content == b"hello\n"
    assert plain.headers["Content-Disposition"] == 'attachment; filename="file.txt"'
    assert plain.headers["Content-Type"].startswith("text/plain")  # never run as a page
    assert "sandbox" in plain.headers["Content-Security-Policy"]

    # stored as Argo stores it (a .tgz, archive's default), sent as stored
    packed = requests.get(_files(server, "ns", "makes-artifacts", node, "packed"), timeout=30)
    assert packed.status_code == 200 and packed.headers["Content-Type"] == "application/gzip"
    with tarfile.open(fileobj=io.BytesIO(packed.content)) as archive:
        member = archive.extractfile("file.txt")
        assert member is not None and member.read() == b"hello\n"

    # a folder: a .tar.gz made now, named after it; the link in it is a link, not /etc/passwd
    folder = requests.get(f"{server.url}/artifacts/ns/makes-artifacts/{node}/folder", timeout=30)
    assert folder.status_code == 200
    assert folder.headers["Content-Disposition"] == 'attachment; filename="folder.tar.gz"'
    with tarfile.open(fileobj=io.BytesIO(folder.content)) as archive:
        members = {member.name: member for member in archive.getmembers()}
        assert archive.extractfile("folder/inner.txt").read() == b"inner\n"  # type: ignore[union-attr]
        assert members["folder/link"].issym()
        assert members["folder/link"].linkname == "/etc/passwd"

    # what is not there is not found, as Argo says it
    for path, words in (
            (_files(server, "ns", "makes-artifacts", node, "nothing"), "not found in the outputs"),
            (_files(server, "ns", "makes-artifacts", "makes-artifacts-1", "plain"), "node"),
            (_files(server, "other", "makes-artifacts", node, "plain"), "not found"),
            (_files(server, "ns", "no-such-run", node, "plain"), "not found"),
            (_files(server, "ns", "makes-artifacts", node, "plain").replace("outputs", "inputs"),
             "no location for inputs")):
        response = requests.get(path, timeout=30)
        assert response.status_code == 404, path
        assert words in response.json()["message"], response.json()


def test_only_files_inside_the_home_are_served(start: Callable[..., Server],
                                               tmp_path: Path) -> None:
    server = start()
    _, node = _run(server)
    status_path = server.home / "runs" / "makes-artifacts" / "status.json"
    status = json.loads(status_path.read_text())
    secret = tmp_path / "secret.txt"  # beside the home, not in it
    secret.write_text("not yours\n")
    run_folder = server.home / "runs" / "makes-artifacts"
    (run_folder / "out-link").symlink_to(secret)  # in the run folder, pointing out of the home
    (run_folder / "inside.txt").write_text("in the run\n")
    paths = {"passwd": "/etc/passwd", "beside": str(secret), "dotdot":
             str(run_folder / ".." / ".." / ".." / "secret.txt"),
             "linked": str(run_folder / "out-link"), "relative": "inside.txt",
             "home": str(server.home), "runs": str(server.home / "runs"),
             "inside": str(run_folder / "inside.txt")}
    for entry in status["nodes"]:
        if entry["id"] == node:
            entry["outputs"]["artifacts"].update(paths)
    status_path.write_text(json.dumps(status))

    for name in paths:
        response = requests.get(_files(server, "ns", "makes-artifacts", node, name), timeout=30)
        if name == "inside":
            assert response.status_code == 200 and response.content == b"in the run\n"
            continue
        assert response.status_code == 404, name
        assert "nothing stored in this server's home" in response.json()["message"]
        assert b"not yours" not in response.content and b"root:" not in response.content


def test_the_token_is_needed_as_for_the_api(start: Callable[..., Server]) -> None:
    server = start("--auth-token", "s3cret")
    headers = {"Authorization": "Bearer s3cret"}
    assert server.call("POST", "/api/v1/workflows/ns", json={"workflow": _workflow()},
                       headers=headers)[0] == 200
    deadline = time.monotonic() + 60
    while True:
        status, body = server.call("GET", "/api/v1/workflows/ns/makes-artifacts", headers=headers)
        assert status == 200 and time.monotonic() < deadline, body
        if ended(body):
            break
        time.sleep(0.1)
    node = next(node["id"] for node in body["status"]["nodes"].values() if node["type"] == "Pod")
    url = _files(server, "ns", "makes-artifacts", node, "plain")
    assert requests.get(url, timeout=30).status_code == 401
    assert requests.get(url, headers={"Authorization": "Bearer wrong"}, timeout=30
                        ).status_code == 401
    answer = requests.get(url, headers=headers, timeout=30)
    assert answer.status_code == 200 and answer.content == b"hello\n"
