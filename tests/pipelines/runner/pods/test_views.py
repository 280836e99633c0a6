"""A pod's files are its own (``pipelines/runner/pods/views.py``): each pod, and each container of a
pod, sees the whole tree under a private writable layer, its volumes, inputs and script at
their real paths; outputs are read from its layer. The manifests are ours, shaped like the
Argo examples that motivate them (an output artifact at ``/result.txt``, a loop whose pods all
``mkdir /mnt/out``).
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from sublimate.pipelines.runner import (
    RunEvent,
    RunOptions,
    load_manifest,
    run_workflow,
)
from sublimate.pipelines.runner.pods import mount_modes, mounts, views
from tests.conftest import require


def _probe(folder: Path) -> str:
    return views.probe(folder)


@pytest.fixture
def overlay(tmp_path: Path) -> None:
    require(not _probe(tmp_path), f"no private views here: {_probe(tmp_path)}")


WATCHED = ("/result.txt", "/mnt/out", "/tmp/shared-by-nobody", "/outputs")


@pytest.fixture
def host_untouched(tmp_path: Path) -> Iterator[None]:
    """Nothing made at the paths these manifests write, and nothing of a run mounted on the
    host (its views live in their pods' namespaces). Other mounts may come and go: the machine
    is shared."""
    before = [Path(p).exists() for p in WATCHED]
    yield
    assert [Path(p).exists() for p in WATCHED] == before
    mounted = [line for line in Path("/proc/self/mountinfo").read_text().splitlines()
               if str(tmp_path) in line or any(f" {p} " in line for p in WATCHED)]
    assert mounted == []


def _run(text: str, home: Path, mode: str = "auto", events: list[RunEvent] | None = None):
    sink: list[RunEvent] = [] if events is None else events
    return run_workflow(load_manifest(textwrap.dedent(text)), {},
                        RunOptions(home=home, mounts=mode, reporter=sink.append))


RESULT_FILE = """
apiVersion: argoproj.io/v1alpha1
kind: Workflow
metadata: {name: result}
spec:
  entrypoint: main
  templates:
  - name: main
    outputs:
      parameters:
      - {name: said, valueFrom: {path: /result.txt}}
      artifacts:
      - {name: result, path: /result.txt, archive: {none: {}}}
    script:
      image: python:alpine3.23
      command: [python]
      # as Argo's conditional-artifacts example: a relative path, in the image's working
      # directory (/), declared as /result.txt
      source: |
        import os
        open("result.txt", "w").write("hello from the root\\n")
        open("/tmp/shared-by-nobody", "w").write(open("/result.txt").read())
        print(os.getcwd())
"""


def test_a_step_writes_its_output_artifact_at_the_root(tmp_path: Path, overlay: None,
                                                       host_untouched: None) -> None:
    result = _run(RESULT_FILE, tmp_path)
    assert result.phase == "Succeeded", result.message
    node = result.node("result")
    assert node.result == "/"
    assert node.parameters == {"said": "hello from the root"}
    assert Path(node.artifacts["result"]).read_text() == "hello from the root\n"
    # what the pod wrote outside its volumes is in its own layer, by container path
    (layer,) = (result.run_dir / "nodes").glob("*/fs")
    assert (layer / "tmp" / "shared-by-nobody").read_text() == "hello from the root\n"


LOOP = """
apiVersion: argoproj.io/v1alpha1
kind: Workflow
metadata: {name: loop}
spec:
  entrypoint: main
  templates:
  - name: main
    steps:
    - - name: map
        template: part
        arguments: {parameters: [{name: n, value: "{{item}}"}]}
        withItems: [a, b, c]
  - name: part
    inputs: {parameters: [{name: n}]}
    outputs:
      artifacts:
      - {name: out, path: /mnt/out/part, archive: {none: {}}}
    container:
      image: alpine
      command: [sh, -c]
      # as Argo's map-reduce example: each pod makes the output's folder (mkdir without -p
      # fails if it exists) and waits for the others, so that all three hold /mnt/out at once
      args: ["mkdir /mnt/out && echo {{inputs.parameters.n}} > /mnt/out/part && sleep 0.5 &&
              ls /mnt/out | tr '\\n' ' ' && stat -c %a /tmp"]
"""


def test_parallel_pods_each_make_the_same_absolute_folder(tmp_path: Path, overlay: None,
                                                          host_untouched: None) -> None:
    result = _run(LOOP, tmp_path)
    assert result.phase == "Succeeded", result.message
    parts = [n for n in result.nodes if n.display_name.startswith("map(")]
    assert len(parts) == 3
    for node in parts:
        item = node.display_name.split(":")[1].rstrip(")")
        assert Path(node.artifacts["out"]).read_text() == f"{item}\n"
        # only its own file in it; and /tmp keeps its mode in the view (sticky, for all)
        assert node.result == "part 1777"
    starts = sorted(n.started_at for n in parts)
    ends = sorted(n.finished_at for n in parts)
    assert starts[-1] < ends[0]  # the three held /mnt/out at the same time


def test_a_declared_output_the_host_has_is_not_read_from_the_host(
        tmp_path: Path, overlay: None) -> None:
    # On Argo a fresh image would not have it: the step that does not write it has none.
    stale = Path(tempfile.mkdtemp(prefix="stale-", dir="/tmp"))
    try:
        (stale / "out.txt").write_text("left here by someone else")
        (stale / "dir").mkdir()
        (stale / "dir" / "old").write_text("old")
        text = f"""
        apiVersion: argoproj.io/v1alpha1
        kind: Workflow
        metadata: {{name: stale}}
        spec:
          entrypoint: main
          templates:
          - name: main
            outputs:
              parameters:
              - {{name: p, valueFrom: {{path: {stale}/out.txt, default: none-written}}}}
              artifacts:
              - {{name: d, path: {stale}/dir, archive: {{none: {{}}}}}}
            container:
              command: [sh, -c]
              args: ["test ! -e {stale}/out.txt && ls -A {stale}/dir | wc -l &&
                      echo new > {stale}/dir/new"]
        """
        result = _run(text, tmp_path)
        assert result.phase == "Succeeded", result.message
        node = result.node("stale")
        assert node.result == "0"  # the folder is empty in the view
        assert node.parameters == {"p": "none-written"}
        assert sorted(os.listdir(node.artifacts["d"])) == ["new"]
        assert sorted(os.listdir(stale / "dir")) == ["old"]  # the host's is untouched
    finally:
        shutil.rmtree(stale)


CONTAINER_SET = """
apiVersion: argoproj.io/v1alpha1
kind: Workflow
metadata: {name: set}
spec:
  entrypoint: main
  templates:
  - name: main
    volumes: [{name: shared, emptyDir: {}}]
    containerSet:
      volumeMounts: [{name: shared, mountPath: /shared}]
      containers:
      - name: first
        command: [sh, -c, "mkdir /tmp/mine && echo first > /tmp/mine/who && echo v > /shared/v"]
      - name: main
        dependencies: [first]
        command: [sh, -c, "mkdir /tmp/mine && cat /shared/v && ls /tmp/mine | wc -l"]
"""


def test_containers_of_a_pod_share_volumes_not_files(tmp_path: Path, overlay: None) -> None:
    result = _run(CONTAINER_SET, tmp_path)
    assert result.phase == "Succeeded", result.message
    assert result.node("set").result == "v\n0"
    (first,) = (result.run_dir / "nodes").glob("*/ctr/first/fs/tmp/mine/who")
    assert first.read_text() == "first\n"


def test_overlay_asked_for_where_it_cannot_be_is_refused(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mount_modes, "probe", lambda *_: "no overlayfs in this kernel")
    with pytest.raises(mount_modes.NamespaceError, match="no overlayfs in this kernel"):
        mount_modes.resolve("overlay", True, tmp_path)


SHARED = """
apiVersion: argoproj.io/v1alpha1
kind: Workflow
metadata: {{name: shared}}
spec:
  entrypoint: main
  templates:
  - name: main
    steps:
    - - name: each
        template: write
        arguments: {{parameters: [{{name: n, value: "{{{{item}}}}"}}]}}
        withItems: [a, b]
  - name: write
    inputs: {{parameters: [{{name: n}}]}}
    container:
      command: [sh, -c]
      args: ["mkdir -p {folder} && touch {folder}/{{{{inputs.parameters.n}}}} && sleep 0.5 &&
              ls {folder} | wc -l"]
"""


@pytest.mark.parametrize("views_here", [True, False])
def test_without_views_the_run_falls_back_and_says_so_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, views_here: bool,
        host_untouched: None) -> None:
    if views_here:
        require(not _probe(tmp_path), f"no private views here: {_probe(tmp_path)}")
    else:
        monkeypatch.setattr(mount_modes, "probe", lambda *_: "no overlayfs in this kernel")
    events: list[RunEvent] = []
    result = _run(SHARED.format(folder=tmp_path / "seen"), tmp_path / "home", events=events)
    assert result.phase == "Succeeded", result.message
    notes = [e.message for e in events if e.kind == "note"]
    seen = {n.result for n in result.nodes if n.display_name.startswith("each(")}
    if views_here:
        assert notes == [] and seen == {"1"}  # each pod sees only its own file
        assert not (tmp_path / "seen").exists()
    else:
        assert len(notes) == 1 and "no overlayfs in this kernel" in notes[0]
        assert "pods share this machine's files" in notes[0]
        assert seen == {"2"}  # today's behaviour: both write the host's folder


@pytest.mark.parametrize("mode", ["auto", "namespace"])
def test_a_run_does_not_depend_on_what_others_do_to_tmp(tmp_path: Path, mode: str) -> None:
    """Another process makes and removes folders in /tmp while the pods start: in a view
    nothing of /tmp is listed; with mirrored namespaces an entry gone by the time a pod
    starts is skipped (it used to fail the pod: "bind /tmp/tmp...: No such file")."""
    if mode == "namespace":
        require(not mounts.unavailable(), f"no mount namespaces: {mounts.unavailable()}")
    stop = threading.Event()

    def churn() -> None:
        while not stop.is_set():
            shutil.rmtree(tempfile.mkdtemp(prefix="churn-", dir="/tmp"), ignore_errors=True)

    pods = "\n".join(f"          - {{name: p{i}, template: write}}" for i in range(16))
    text = f"""
    apiVersion: argoproj.io/v1alpha1
    kind: Workflow
    metadata: {{name: churn}}
    spec:
      entrypoint: main
      templates:
      - name: main
        dag:
          tasks:
{pods}
      - name: write
        outputs:
          parameters: [{{name: v, valueFrom: {{path: /tmp/outputs-of-churn/v}}}}]
        container:
          command: [sh, -c, "mkdir -p /tmp/outputs-of-churn && echo ok > /tmp/outputs-of-churn/v"]
    """
    threads = [threading.Thread(target=churn, daemon=True) for _ in range(2)]
    for thread in threads:
        thread.start()
    try:
        result = _run(text, tmp_path, mode)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    failed = [(n.display_name, n.message) for n in result.nodes if n.phase != "Succeeded"]
    assert failed == [], failed


def test_a_mirrored_entry_removed_before_the_pod_starts_is_skipped(tmp_path: Path) -> None:
    """The mirror's race, made certain: plan a pod's namespace, remove a /tmp entry it lists,
    then start the pod."""
    require(not mounts.unavailable(), f"no mount namespaces: {mounts.unavailable()}")
    gone = Path(tempfile.mkdtemp(prefix="gone-", dir="/tmp"))
    folder = tmp_path / "node"
    (folder / "fs" / "tmp" / "outputs-x").mkdir(parents=True)
    namespace = mounts.plan([mounts.Bind("/tmp/outputs-x", folder / "fs" / "tmp" / "outputs-x")],
                            folder, "/")
    assert "/tmp" in namespace.mirrored
    gone.rmdir()
    namespace.root.mkdir()
    done = subprocess.run(["sh", "-c", "test -d /tmp/outputs-x && echo in"], cwd=folder,
                          preexec_fn=mounts.setup(namespace, folder / "termination-log"),
                          capture_output=True, text=True, timeout=30)
    assert (done.returncode, done.stdout, done.stderr) == (0, "in\n", "")


def test_host_mounts_are_layered_or_bound() -> None:
    info = textwrap.dedent("""\
        22 27 0:21 / /proc rw,nosuid shared:5 - proc proc rw
        27 1 253:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
        30 27 0:25 / /tmp rw,nosuid shared:9 - tmpfs tmpfs rw
        31 30 0:26 / /tmp/ro rw shared:9 - tmpfs tmpfs ro
        34 27 253:0 /run/netns /run/netns rw shared:1 - ext4 /dev/vda rw
        32 27 0:27 / /sys ro shared:6 - sysfs sysfs ro
        33 32 0:28 / /sys/fs/cgroup rw shared:7 - cgroup2 cgroup2 rw
        """)
    found = views.host_mounts(info)
    assert found[0] == views.HostMount("/", True)
    assert views.HostMount("/proc", False) in found and views.HostMount("/sys", False) in found
    assert views.HostMount("/tmp", True) in found  # a tmpfs /tmp gets a layer of its own
    assert views.HostMount("/tmp/ro", False) in found  # read-only: bound as it is
    assert views.HostMount("/run/netns", False) in found  # a folder bound from /: as it is
    assert all(m.point != "/sys/fs/cgroup" for m in found)  # the bind of /sys brings it


def test_a_whiteout_in_the_layer_is_a_removal(tmp_path: Path) -> None:
    require(os.geteuid() == 0, "making a whiteout (a 0/0 character device) needs root")
    view = views.View(tmp_path, (), (), "/")
    (tmp_path / "fs" / "etc").mkdir(parents=True)
    os.mknod(tmp_path / "fs" / "etc" / "hostname", stat.S_IFCHR | 0o600, os.makedev(0, 0))
    (tmp_path / "fs" / "etc" / "new").write_text("x")
    assert view.find("/etc/hostname") is None
    assert view.find("/etc/new") == tmp_path / "fs" / "etc" / "new"
    assert view.find("/etc/absent") is None
