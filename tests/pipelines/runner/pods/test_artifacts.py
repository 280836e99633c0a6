"""Artifacts as Argo's executor moves them: keys in the home's artifact repository, archives,
subPath, workflow arguments, raw, http/git on this machine, optional outputs.

Each manifest is ours; each test asserts what Argo would give (workflow/executor/executor.go,
workflow/controller/scope.go, pkg/apis/workflow/v1alpha1/artifact_repository_types.go).
"""

from __future__ import annotations

import http.server
import subprocess
import tarfile
import textwrap
import threading
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

from sublimate.pipelines.runner import ManifestError
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
