"""Real mount paths (``runner/pods/mounts.py``): each pod in a private mount namespace with
the run's folders at the manifest's paths, and the rewriting fallback on the same manifests."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from sublimate.pipelines.runner import RunOptions, run_workflow
from sublimate.pipelines.runner.pods.mounts import unavailable
from tests.conftest import run_cli

NAMESPACES = not unavailable()
needs_namespaces = pytest.mark.skipif(not NAMESPACES, reason=f"no mount namespaces: "
                                      f"{unavailable()}")


def _mountinfo() -> list[str]:
    return sorted(Path("/proc/self/mountinfo").read_text().splitlines())


@pytest.fixture
def host_untouched(tmp_path: Path):
    """Nothing of a run mounted on the host (its mounts live in its pod's namespace), and
    nothing made in /mnt or /tmp. Other mounts may come and go: the machine is shared (another
    xdist worker's buildah mounts its storage over itself on first use, a CI run found)."""
    before = set(_mountinfo())
    mnt, tmp = sorted(Path("/mnt").iterdir()), Path("/tmp/outputs").exists()
    yield
    appeared = [line for line in set(_mountinfo()) - before
                if str(tmp_path) in line or " /mnt" in line or " /tmp/outputs" in line]
    assert appeared == []
    assert sorted(Path("/mnt").iterdir()) == mnt
    assert Path("/tmp/outputs").exists() == tmp


def _workflow(source: str, outputs: list | None = None, **body: object) -> dict:
    template = {"name": "main",
                "script": {"image": "python:3.11", "command": ["python"],
                           "source": textwrap.dedent(source),
                           "volumeMounts": [{"name": "data", "mountPath": "/mnt/data"}], **body}}
    if outputs:
        template["outputs"] = {"parameters": outputs}
    return {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow",
            "metadata": {"name": "mounts"},
            "spec": {"entrypoint": "main", "volumes": [{"name": "data", "emptyDir": {}}],
                     "templates": [template]}}


def _run(workflow: dict, home: Path, mode: str):
    return run_workflow(workflow, {}, RunOptions(home=home, mounts=mode,
                                                 reporter=lambda event: None))


# A path built at run time, and an output parameter read from an absolute path (Argo reads
# valueFrom.path from the container's filesystem once it has ended: executor.go SaveParameters).
BUILT = """
    import os
    folder = os.path.join("/mnt", "data")
    with open(os.path.join(folder, "made.txt"), "w") as out:
        out.write("hello")
    os.makedirs("/tmp/outputs", exist_ok=True)
    with open("/tmp/outputs/answer", "w") as out:
        out.write(open(folder + "/made.txt").read() + " from " + folder)
"""
OUTPUT = [{"name": "answer", "valueFrom": {"path": "/tmp/outputs/answer"}}]


@needs_namespaces
def test_a_path_built_at_run_time_is_the_mount(tmp_path: Path, host_untouched: None) -> None:
    result = _run(_workflow(BUILT, OUTPUT), tmp_path, "namespace")
    assert result.phase == "Succeeded", result.message
    node = result.node("mounts")
    assert node.parameters == {"answer": "hello from /mnt/data"}
    (made,) = (result.run_dir / "nodes").glob("*/volumes/data/made.txt")
    assert made.read_text() == "hello"
    assert not list((result.run_dir / "nodes").glob("*/.root"))  # mount point removed


def test_rewrite_mode_cannot_follow_a_built_path(tmp_path: Path, host_untouched: None) -> None:
    """The fallback rewrites literal paths only: the built /mnt/data is not the volume."""
    source = """
        import os
        print(os.path.isdir(os.path.join("/mnt", "data")), os.path.isdir("/mnt/data"))
    """
    result = _run(_workflow(source), tmp_path, "rewrite")
    assert result.phase == "Succeeded", result.message
    assert result.node("mounts").result == "False True"


def test_rewrite_mode_runs_literal_paths(tmp_path: Path, host_untouched: None) -> None:
    source = """
        open("/mnt/data/x", "w").write("1")
        open("/tmp/outputs/answer", "w").write(open("/mnt/data/x").read() + " /mnt/data")
    """
    result = _run(_workflow(source, OUTPUT), tmp_path, "rewrite")
    assert result.phase == "Succeeded", result.message
    # the local folder a step reports is mapped back to the container path
    assert result.node("mounts").parameters == {"answer": "1 /mnt/data"}


@needs_namespaces
def test_proc_mounts_lists_the_mount_path(tmp_path: Path, host_untouched: None) -> None:
    source = """
        import sys
        mounts = [line.split()[1] for line in open("/proc/mounts")]
        print("/mnt/data" in mounts, "/argo/staging/script" in mounts, sys.argv[-1])
    """
    result = _run(_workflow(source), tmp_path, "namespace")
    assert result.phase == "Succeeded", result.message
    # Argo runs a script template's source from ExecutorScriptSourcePath
    assert result.node("mounts").result == "True True /argo/staging/script"


@needs_namespaces
def test_read_only_working_dir_and_missing_output(tmp_path: Path,
                                                  host_untouched: None) -> None:
    source = """
        import os
        try:
            open("/mnt/data/x", "w")
        except OSError as exc:
            print(exc.errno == 30, os.getcwd())
    """
    workflow = _workflow(source, [{"name": "absent", "valueFrom": {
        "path": "/work/out/absent", "default": "fallback"}}], workingDir="/work/dir")
    workflow["spec"]["templates"][0]["script"]["volumeMounts"][0]["readOnly"] = True
    result = _run(workflow, tmp_path, "namespace")
    assert result.phase == "Succeeded", result.message
    node = result.node("mounts")
    assert node.result == "True /work/dir"  # EROFS
    assert node.parameters == {"absent": "fallback"}  # a missing file still takes its default


@needs_namespaces
def test_a_file_directly_in_a_host_folder_is_rewritten(tmp_path: Path,
                                                       host_untouched: None) -> None:
    """Mounting the node's folder over /tmp would hide the host's /tmp: that pod falls back."""
    source = 'open("/tmp/answer.txt", "w").write("ok")\n'
    result = _run(_workflow(source, [{"name": "a", "valueFrom": {"path": "/tmp/answer.txt"}}]),
                  tmp_path, "namespace")
    assert result.phase == "Succeeded", result.message
    assert result.node("mounts").parameters == {"a": "ok"}
    assert not Path("/tmp/answer.txt").exists()


def test_auto_with_a_fake_executor_rewrites(tmp_path: Path) -> None:
    from sublimate.pipelines.runner.pods.mount_modes import resolve
    from sublimate.pipelines.runner.pods.views import probe

    assert resolve("auto", False, tmp_path).name == "rewrite"
    assert resolve("rewrite", True, tmp_path).name == "rewrite"
    expected = "overlay" if not probe(tmp_path) else "namespace" if NAMESPACES else "rewrite"
    assert resolve("auto", True, tmp_path).name == expected


@needs_namespaces
def test_default_pipeline_under_namespaces(tmp_path: Path, host_untouched: None) -> None:
    """The train step's launcher and torchrun run inside the namespace."""
    result = run_cli("run", "--mounts", "namespace", "-q", "-p", "epochs=1",
                     home=tmp_path / "home", timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Succeeded" in result.stdout


@needs_namespaces
def test_a_host_entry_removed_after_planning_is_left_out(tmp_path: Path) -> None:
    """A pod's root mirrors the host's folders, listed when it is planned; another program may
    remove its file in /tmp before the pod starts. That entry is left out of the pod, which
    starts (it failed with `mount namespace: bind /tmp/tmpXXXX: No such file or directory`);
    the pod's own folders still must be there."""
    import os

    from sublimate.pipelines.runner.pods.mounts import _resolve_libc, _run_step, plan

    other = tmp_path / "someone-elses"
    other.mkdir()
    (other / "scratch").mkdir()
    steps = plan([], tmp_path / "node", "/").steps
    mirrored = [step for step in steps if step[0] == "mirror"]
    assert mirrored and not [step for step in steps if step[0] == "bind"]
    gone, target = os.fsencode(other / "scratch"), os.fsencode(tmp_path / "target")
    os.mkdir(target)
    (other / "scratch").rmdir()  # between the plan and the pod's start
    libc = _resolve_libc()
    _run_step(libc, ("mirror", gone, target))  # nothing mounted, nothing raised
    with pytest.raises(FileNotFoundError):
        _run_step(libc, ("bind", gone, target))
    assert os.fsdecode(target) not in Path("/proc/self/mountinfo").read_text()
