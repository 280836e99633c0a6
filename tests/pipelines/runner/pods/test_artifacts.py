"""Artifacts as Argo's executor moves them: keys in the home's artifact repository, archives,
subPath, workflow arguments, raw, http/git on this machine, optional outputs.

Each manifest is ours; each test asserts what Argo would give (workflow/executor/executor.go,
workflow/controller/scope.go, pkg/apis/workflow/v1alpha1/artifact_repository_types.go).
"""

from __future__ import annotations

import http.server
import io
import os
import subprocess
import tarfile
import textwrap
import threading
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

from sublimate.pipelines.runner import ManifestError, RunOptions
from sublimate.pipelines.runner.harness import WorkflowRun, run


def _wf(body: str, args: str = "") -> str:
    return textwrap.dedent("""
        apiVersion: argoproj.io/v1alpha1
        kind: Workflow
        metadata: {generateName: art-}
        spec:
          entrypoint: main
        """) + textwrap.indent(textwrap.dedent(args), "  ") + "  templates:\n" + \
        textwrap.indent(textwrap.dedent(body), "  ")


def _run(text: str, home: Path) -> WorkflowRun:
    return run(text, home=home, echo=False, timeout=60)


def _repo(home: Path) -> Path:
    return home / "artifacts" / "repository"


MAP_REDUCE = """
- name: main
  dag:
    tasks:
    - name: map
      template: map
      withItems: [a, b, c]
      arguments: {parameters: [{name: part, value: "{{item}}"}]}
    - {name: reduce, template: reduce, depends: map}
- name: map
  inputs: {parameters: [{name: part}]}
  script:
    command: [sh]
    source: "echo part-{{inputs.parameters.part}} > /tmp/out.txt"
  outputs:
    artifacts:
    - name: part
      path: /tmp/out.txt
      archive: {none: {}}
      s3: {key: "{{workflow.name}}/parts/{{inputs.parameters.part}}.txt"}
- name: reduce
  inputs:
    artifacts:
    - name: parts
      path: /tmp/parts
      s3: {key: "{{workflow.name}}/parts"}
  script:
    command: [sh]
    source: "ls /tmp/parts | tr '\\n' ' '; cat /tmp/parts/*"
"""


def test_map_reduce_over_keys(tmp_path: Path) -> None:
    result = _run(_wf(MAP_REDUCE), tmp_path)
    result.assert_succeeded()
    assert result.node("reduce").result == "a.txt b.txt c.txt part-a\npart-b\npart-c"
    # archive none: each object is the plain file, at its key in the default bucket
    parts = _repo(tmp_path) / "default" / result.result.name / "parts"
    assert sorted(p.name for p in parts.iterdir()) == ["a.txt", "b.txt", "c.txt"]
    assert (parts / "b.txt").read_text() == "part-b\n"


ARCHIVES = """
- name: main
  steps:
  - - {name: make, template: make}
  - - name: use
      template: use
      arguments:
        artifacts:
        - {name: plain, from: "{{steps.make.outputs.artifacts.plain}}"}
        - {name: default, from: "{{steps.make.outputs.artifacts.default}}"}
        - {name: tar, from: "{{steps.make.outputs.artifacts.tar}}"}
        - {name: dir, from: "{{steps.make.outputs.artifacts.dir}}"}
- name: make
  script:
    command: [sh]
    source: "mkdir -p /out/d/sub && echo hi > /out/f.txt && echo x > /out/d/sub/y"
  outputs:
    artifacts:
    - {name: plain, path: /out/f.txt, archive: {none: {}}}
    - {name: default, path: /out/f.txt}
    - {name: tar, path: /out/f.txt, archive: {tar: {compressionLevel: 0}}}
    - {name: dir, path: /out/d}
- name: use
  inputs:
    artifacts:
    - {name: plain, path: /in/plain}
    - {name: default, path: /in/default}
    - {name: tar, path: /in/tar}
    - {name: dir, path: /in/dir}
  script:
    command: [sh]
    source: "cat /in/plain /in/default /in/tar /in/dir/sub/y"
"""


def test_archive_none_stores_the_file_and_tar_a_tarball(tmp_path: Path) -> None:
    result = _run(_wf(ARCHIVES), tmp_path)
    result.assert_succeeded()
    assert result.node("use").result == "hi\nhi\nhi\nx"
    stored = {name: Path(path) for name, path in result.node("make").artifacts.items()}
    # no key: the repository's key format {{workflow.name}}/{{pod.name}} + the file name
    folder = stored["plain"].parent
    assert folder.parent == _repo(tmp_path) / "default" / result.result.name
    assert stored["plain"].name == "f.txt" and stored["plain"].read_text() == "hi\n"
    for name in ("default", "tar", "dir"):
        assert stored[name] == folder / f"{name}.tgz"
        assert tarfile.is_tarfile(stored[name])
    with tarfile.open(stored["default"]) as tar:  # one entry: the path's base name
        assert tar.getnames() == ["f.txt"]
    with tarfile.open(stored["dir"]) as tar:
        assert sorted(tar.getnames()) == ["d", "d/sub", "d/sub/y"]


SUBPATH = """
- name: main
  steps:
  - - {name: make, template: make}
  - - name: one
      template: use
      arguments:
        artifacts:
        - name: doc
          from: "{{steps.make.outputs.artifacts.docs}}"
          subPath: b.txt
- name: make
  script:
    command: [sh]
    source: "mkdir -p /out && echo A > /out/a.txt && echo B > /out/b.txt"
  outputs:
    artifacts:
    - {name: docs, path: /out, archive: {none: {}}}
- name: use
  inputs: {artifacts: [{name: doc, path: /in/doc}]}
  script: {command: [sh], source: "cat /in/doc"}
"""


def test_sub_path_of_an_input_artifact(tmp_path: Path) -> None:
    result = _run(_wf(SUBPATH), tmp_path)
    result.assert_succeeded()
    assert result.node("one").result == "B"


def test_sub_path_into_a_tarball_is_not_found(tmp_path: Path) -> None:
    # scope.go AppendToKey: the key <...>/docs.tgz/b.txt does not exist
    result = _run(_wf(SUBPATH.replace(", archive: {none: {}}", "")), tmp_path)
    assert result.node("one").phase == "Error"
    assert "docs.tgz/b.txt not found" in result.node("one").message


def test_workflow_artifact_arguments_and_raw(tmp_path: Path) -> None:
    inbox = _repo(tmp_path) / "my-bucket" / "inbox"
    inbox.mkdir(parents=True)
    (inbox / "x.txt").write_text("from the bucket\n")
    body = """
    - name: main
      inputs:
        artifacts:
        - {name: note, path: /in/note}
        - {name: doc, path: /in/doc}
        - {name: own, path: /in/own, raw: {data: "own raw\\n"}}
      script: {command: [sh], source: "cat /in/note /in/doc /in/own"}
    """
    args = """
    arguments:
      artifacts:
      - {name: note, raw: {data: "hello {{workflow.name}}\\n"}}
      - {name: doc, s3: {bucket: my-bucket, key: inbox/x.txt}}
    """
    result = _run(_wf(body, args), tmp_path)
    result.assert_succeeded()
    assert result.node(result.result.name).result == \
        f"hello {result.result.name}\nfrom the bucket\nown raw"


WRITE = """
- name: main
  script: {command: [sh], source: "echo v1 > /tmp/model"}
  outputs:
    artifacts:
    - {name: model, path: /tmp/model, s3: {bucket: models, key: shared/model.tgz}}
"""
READ = """
- name: main
  inputs:
    artifacts:
    - {name: model, path: /in/model, s3: {bucket: models, key: shared/model.tgz}}
  script: {command: [sh], source: "cat /in/model"}
"""


def test_a_key_outlives_its_run(tmp_path: Path) -> None:
    _run(_wf(WRITE), tmp_path / "home").assert_succeeded()
    second = _run(_wf(READ), tmp_path / "home")
    second.assert_succeeded()
    assert second.node(second.result.name).result == "v1"
    elsewhere = _run(_wf(READ), tmp_path / "other")  # another home: another repository
    assert elsewhere.phase == "Error"
    assert "shared/model.tgz not found" in elsewhere.message


def test_an_http_artifact_outside_this_machine_is_refused(tmp_path: Path) -> None:
    body = """
    - name: main
      inputs:
        artifacts:
        - {name: data, path: /in/data, http: {url: "https://example.com/data.csv"}}
      script: {command: [sh], source: "cat /in/data"}
    """
    with pytest.raises(ManifestError, match=r"https://example\.com/data\.csv"):
        _run(_wf(body), tmp_path)


@pytest.fixture
def local_http(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    served = tmp_path / "served"
    served.mkdir()
    handler = partial(http.server.SimpleHTTPRequestHandler, directory=str(served))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", served
    finally:
        server.shutdown()
        server.server_close()


def test_an_http_artifact_on_this_machine_is_fetched(tmp_path: Path,
                                                     local_http: tuple[str, Path]) -> None:
    url, served = local_http
    (served / "data.csv").write_text("a,b\n1,2\n")
    body = f"""
    - name: main
      inputs:
        artifacts:
        - {{name: data, path: /in/data, http: {{url: "{url}/data.csv"}}}}
      script: {{command: [sh], source: "cat /in/data"}}
    """
    result = _run(_wf(body), tmp_path / "home")
    result.assert_succeeded()
    assert result.node(result.result.name).result == "a,b\n1,2"


def test_a_local_git_repository_is_cloned(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "README").write_text("one\n")
    subprocess.run([*git, "add", "README"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "one"], check=True)
    first = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True,
                           text=True).stdout.strip()
    (repo / "README").write_text("two\n")
    subprocess.run([*git, "commit", "-q", "-am", "two"], check=True)
    body = f"""
    - name: main
      inputs:
        artifacts:
        - {{name: src, path: /src, git: {{repo: "{repo}", revision: "{first}"}}}}
      script: {{command: [sh], source: "cat /src/README"}}
    """
    result = _run(_wf(body), tmp_path / "home")
    result.assert_succeeded()
    assert result.node(result.result.name).result == "one"
    remote = body.replace(str(repo), "https://github.com/argoproj/argo-workflows.git")
    with pytest.raises(ManifestError, match=r"github\.com/argoproj/argo-workflows\.git"):
        _run(_wf(remote), tmp_path / "home")


def test_an_optional_output_artifact_may_be_missing(tmp_path: Path) -> None:
    body = """
    - name: main
      steps:
      - - {name: make, template: make}
      - - name: use
          template: use
          arguments:
            artifacts: [{name: maybe, from: "{{steps.make.outputs.artifacts.maybe}}"}]
    - name: make
      script: {command: [sh], source: "true"}
      outputs:
        artifacts:
        - {name: maybe, path: /out/maybe, optional: true}
    - name: use
      inputs: {artifacts: [{name: maybe, path: /in/maybe, optional: true}]}
      script: {command: [sh], source: "ls /in/maybe 2>/dev/null || echo absent"}
    """
    result = _run(_wf(body), tmp_path)
    assert result.node("make").phase == "Succeeded"
    assert "maybe" not in result.node("make").artifacts
    # Argo (steps.go resolveReferences): a reference to an output that was never saved does
    # not resolve, and the step is an Error unless its argument is optional.
    assert result.node("use").phase == "Error"


# ---------------------------------------------------------------- links a pod leaves behind
# A step can leave a link on a volume (which other pods and later runs share) or in its own
# files; the runner, which reads and writes artifacts as root, resolves every such path
# inside the volume or the pod's files, as Argo resolves it inside the container
# (``pods/inside.py``). Each manifest is run in a private view where this machine allows one
# ("auto") and with rewritten paths ("rewrite"): the runner's reads and writes are the same.

MODES = ["auto", "rewrite"]
PVC = "volumes: [{name: vol, persistentVolumeClaim: {claimName: shared}}]\n"


def _run_in(text: str, home: Path, mode: str) -> WorkflowRun:
    return run(text, options=RunOptions(home=home, mounts=mode, reporter=lambda _: None))


PLANT_THEN_LOAD = """
- name: main
  steps:
  - - {name: plant, template: plant}
  - - name: load
      template: load
      arguments: {artifacts: [ARGUMENT]}
- name: plant
  script:
    command: [sh]
    source: "mkdir -p /tmp/d && echo tarred > /tmp/d/f && ln -s LINK /mnt/vol/dir"
    volumeMounts: [{name: vol, mountPath: /mnt/vol}]
  outputs: {artifacts: [{name: d, path: /tmp/d}]}
- name: load
  inputs: {artifacts: [{name: x, path: /mnt/vol/dir/x}]}
  script:
    command: [sh]
    source: "ls /mnt/vol/dir/x"
    volumeMounts: [{name: vol, mountPath: /mnt/vol}]
"""


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("link", ["absolute", "relative"])
@pytest.mark.parametrize("argument", ["{name: x, raw: {data: planted}}",
                                      "{name: x, from: '{{steps.plant.outputs.artifacts.d}}'}"])
def test_an_input_artifact_is_never_written_through_a_link_on_the_volume(
        tmp_path: Path, mode: str, link: str, argument: str) -> None:
    # The runner wrote the next step's artifact (a raw one, a tarball it unpacked) as root
    # into the host folder a link on the shared volume named.
    home, victim = tmp_path / "home", tmp_path / "victim"
    victim.mkdir()
    target = str(victim) if link == "absolute" else "../../../victim"  # from home/volumes/shared
    text = _wf(PLANT_THEN_LOAD.replace("LINK", target).replace("ARGUMENT", argument), PVC)
    result = _run_in(text, home, mode)
    assert list(victim.iterdir()) == []
    load = result.node("load")
    assert load.phase == "Error"
    assert load.message.startswith("input artifact 'x': cannot be put at /mnt/vol/dir/x: No "
                                   "such file or directory")


def test_an_input_artifact_follows_a_link_that_stays_on_its_volume(tmp_path: Path) -> None:
    # as sublimate's own steps link on a volume: relatively, wherever the volume is mounted
    text = _wf(PLANT_THEN_LOAD.replace("ln -s LINK", "mkdir /mnt/vol/real && ln -s real")
               .replace("ARGUMENT", "{name: x, raw: {data: planted}}")
               .replace("ls /mnt/vol/dir/x", "cat /mnt/vol/dir/x"), PVC)
    result = _run_in(text, tmp_path, "auto")
    result.assert_succeeded()
    assert result.node("load").result == "planted"
    assert (tmp_path / "volumes" / "shared" / "real" / "x").read_text() == "planted"


READ_THROUGH_LINKS = """
- name: main
  script:
    command: [sh]
    source: |
      ln -s SECRET /mnt/vol/p
      ln -s SECRET /tmp/q
      ln -s ../../../secret/key.txt /mnt/vol/r
      ln -s SECRET /mnt/vol/f
      ln -s FOLDER /mnt/vol/d
    volumeMounts: [{name: vol, mountPath: /mnt/vol}]
  outputs:
    parameters:
    - {name: p, valueFrom: {path: /mnt/vol/p, default: unread}}
    - {name: q, valueFrom: {path: /tmp/q, default: unread}}
    - {name: r, valueFrom: {path: /mnt/vol/r, default: unread}}
    artifacts:
    - {name: f, path: /mnt/vol/f, archive: {none: {}}, optional: true}
    - {name: d, path: /mnt/vol/d, optional: true}
"""


@pytest.mark.parametrize("mode", MODES)
def test_outputs_are_never_read_through_a_link_to_the_host(tmp_path: Path, mode: str) -> None:
    # An output parameter read through a link returned a host file's content (as root: a
    # file the pod itself may not read).
    home, secret = tmp_path / "home", tmp_path / "secret"
    secret.mkdir()
    (secret / "key.txt").write_text("host secret")
    text = _wf(READ_THROUGH_LINKS.replace("SECRET", str(secret / "key.txt"))
               .replace("FOLDER", str(secret)), PVC)
    result = _run_in(text, home, mode)
    result.assert_succeeded()
    node = result.node(result.result.name)
    assert node.outputs == {"p": "unread", "q": "unread", "r": "unread"}
    assert node.artifacts == {}
    stored = [p for p in _repo(home).rglob("*") if p.is_file()] if _repo(home).exists() else []
    assert stored == []


REPOSITORY_LINKS = """
- name: main
  steps:
  - - {name: store, template: store}
  - - {name: read, template: read}
    - {name: write, template: write}
- name: store
  script: {command: [sh], source: "mkdir /out && ln -s SECRET /out/leak && ln -s VICTIM /out/sub"}
  outputs:
    artifacts: [{name: out, path: /out, archive: {none: {}}, s3: {key: planted}}]
- name: read
  inputs: {artifacts: [{name: leak, path: /in/leak, s3: {key: planted/leak}}]}
  script: {command: [sh], source: "cat /in/leak"}
- name: write
  script: {command: [sh], source: "echo pwned > /tmp/f"}
  outputs:
    artifacts: [{name: f, path: /tmp/f, archive: {none: {}}, s3: {key: planted/sub/f}}]
"""


@pytest.mark.parametrize("mode", MODES)
def test_links_stored_in_the_repository_are_never_followed_out_of_it(tmp_path: Path,
                                                                      mode: str) -> None:
    # A folder stored as it is (archive none) keeps its links: a later key read through one
    # copied a host file into a pod, and one written through one wrote into a host folder.
    home, victim, secret = tmp_path / "home", tmp_path / "victim", tmp_path / "key.txt"
    victim.mkdir()
    secret.write_text("host secret")
    text = _wf(REPOSITORY_LINKS.replace("SECRET", str(secret)).replace("VICTIM", str(victim)))
    result = _run_in(text, home, mode)
    assert result.node("store").phase == "Succeeded"
    read = result.node("read")
    assert read.phase == "Error" and "planted/leak not found in the artifact repository" in \
        read.message
    write = result.node("write")
    assert write.phase == "Error"
    assert write.message.startswith("output artifact 'f': cannot store /tmp/f: No such file")
    assert list(victim.iterdir()) == []


def test_a_from_written_out_is_not_an_artifact(tmp_path: Path) -> None:
    # `from: /etc/shadow` had the runner copy a host file into the pod.
    secret = tmp_path / "key.txt"
    secret.write_text("host secret")
    body = f"""
    - name: main
      steps:
      - - name: use
          template: use
          arguments: {{artifacts: [{{name: a, from: "{secret}"}}]}}
    - name: use
      inputs: {{artifacts: [{{name: a, path: /in/a}}]}}
      script: {{command: [sh], source: "cat /in/a"}}
    """
    result = _run(_wf(body), tmp_path / "home")
    use = result.node("use")
    assert use.phase == "Error"
    assert use.message == (f"input artifact 'a': from: '{secret}' is not an artifact of this "
                           f"home's repository ({_repo(tmp_path / 'home')})")


# --------------------------------------------------------------- one line, never a traceback


def _gzipped_tar_cut_short() -> bytes:
    data = os.urandom(200_000)  # incompressible: the cut falls inside the member
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        member = tarfile.TarInfo("f")
        member.size = len(data)
        tar.addfile(member, io.BytesIO(data))
    return buffer.getvalue()[:100_000]


@pytest.mark.parametrize("kind", ["text declared a tarball", "a gzipped tarball cut short"])
def test_an_input_that_is_not_a_tarball_fails_its_node_in_one_line(tmp_path: Path,
                                                                   kind: str) -> None:
    # Each ended the node with "internal error: ReadError('not a gzip file')" or EOFError,
    # naming neither the artifact nor the object.
    if kind == "text declared a tarball":
        content, archive, why = b"not a tarball\n", "archive: {tar: {}}, ", "not a gzip file"
    else:  # detected as a tarball by its first header, as Argo's isTarball detects it
        content, archive = _gzipped_tar_cut_short(), ""
        why = "Compressed file ended before the end-of-stream marker"
    stored = _repo(tmp_path) / "default" / "in" / "a.tgz"
    stored.parent.mkdir(parents=True)
    stored.write_bytes(content)
    body = f"""
    - name: main
      inputs: {{artifacts: [{{name: a, path: /in/a, {archive}s3: {{key: in/a.tgz}}}}]}}
      script: {{command: [sh], source: "ls /in"}}
    """
    result = _run(_wf(body), tmp_path)
    node = result.node(result.result.name)
    assert node.phase == "Error"
    assert node.message.startswith(f"input artifact 'a': {stored} is not a gzipped tarball (")
    assert why in node.message and "\n" not in node.message


def test_an_optional_http_artifact_not_found_is_skipped(tmp_path: Path,
                                                        local_http: tuple[str, Path]) -> None:
    url, _ = local_http
    body = f"""
    - name: main
      inputs:
        artifacts:
        - {{name: data, path: /in/data, optional: true, http: {{url: "{url}/absent.csv"}}}}
      script: {{command: [sh], source: "ls /in/data 2>/dev/null || echo absent"}}
    """
    result = _run(_wf(body), tmp_path / "home")
    result.assert_succeeded()
    assert result.node(result.result.name).result == "absent"


def test_output_folders_are_never_made_through_a_link(tmp_path: Path) -> None:
    # With paths rewritten the runner makes an output's folders before the pod starts: through
    # a link a step left on the volume, it made them in a host folder.
    home, victim = tmp_path / "home", tmp_path / "victim"
    victim.mkdir()
    body = f"""
    - name: main
      steps:
      - - {{name: plant, template: plant}}
      - - {{name: use, template: use}}
    - name: plant
      script:
        command: [sh]
        source: "ln -s {victim} /mnt/vol/dir"
        volumeMounts: [{{name: vol, mountPath: /mnt/vol}}]
    - name: use
      script:
        command: [sh]
        source: "true"
        volumeMounts: [{{name: vol, mountPath: /mnt/vol}}]
      outputs:
        parameters: [{{name: p, valueFrom: {{path: /mnt/vol/dir/sub/p, default: none}}}}]
    """
    result = _run_in(_wf(body, PVC), home, "rewrite")
    result.assert_succeeded()
    assert list(victim.iterdir()) == []
