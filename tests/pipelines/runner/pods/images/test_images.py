"""Container mode (``sublimate run --containers``, runner/pods/images/executor.py): each step
runs in its template's own image through buildah's chroot isolation, the only engine that runs here.

Two tiny images are built from the static busybox for the session (``images``), each with an
``/etc/image-name`` of its own; the manifests are ours. docker's and podman's command lines
cannot be run on this machine: they are checked as text only.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from sublimate.pipelines.runner import RunOptions
from sublimate.pipelines.runner.engine import run_workflow
from sublimate.pipelines.runner.pods.images import keeper as keeper_script
from sublimate.pipelines.runner.pods.images.engines import (
    ENGINE_CLASSES,
    ENGINES,
    Buildah,
    ContainerEngineError,
    Docker,
    Podman,
    RunSpec,
    choose_engine,
    path_in_root,
)
from sublimate.pipelines.runner.pods.images.executor import Keeper
from sublimate.pipelines.runner.pods.mounts import Bind
from tests.conftest import REPO, buildah_container_names, require, run_cli

BUSYBOX = Path("/bin/busybox")
PREFIX = f"sublimate-{os.getpid()}-"  # this process's containers (images.executor names them so)


def _buildah(*args: str, check: bool = True) -> str:
    done = subprocess.run(["buildah", *args], capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise AssertionError(f"buildah {' '.join(args)}: {done.stderr}")
    return done.stdout.strip()


def _build(name: str, marker: str, config: list[str]) -> None:
    """An image of the static busybox and its applets, ``/etc/image-name`` holding ``marker``."""
    container = _buildah("from", "--quiet", "scratch")
    try:
        root = Path(_buildah("mount", container))
        (root / "bin").mkdir()
        (root / "etc").mkdir()
        (root / "tmp").mkdir(mode=0o1777)
        (root / "tmp").chmod(0o1777)
        shutil.copy2(BUSYBOX, root / "bin/busybox")
        applets = subprocess.run([str(BUSYBOX), "--list"], capture_output=True, text=True,
                                 check=True).stdout.split()
        for applet in applets:
            if applet != "busybox":
                (root / "bin" / applet).symlink_to("busybox")
        (root / "etc/image-name").write_text(marker + "\n")
        if config:
            _buildah("config", *config, container)
        _buildah("commit", "--quiet", container, name)
    finally:
        _buildah("rm", container, check=False)


@pytest.fixture(scope="session")
def images() -> Iterator[dict[str, str]]:
    """Two images, ``a`` (no entrypoint, CMD sh) and ``b`` (ENTRYPOINT sh -c, a CMD that
    prints its name, WorkingDir /srv); removed at the end."""
    require(shutil.which("buildah") and os.geteuid() == 0, "container mode tests need buildah "
            "and root (apt-get install buildah)")
    require(BUSYBOX.is_file(), "the test images need a static busybox (apt-get install "
            "busybox-static)")
    tag = f"t{os.getpid()}"
    names = {"a": f"localhost/sublimate-test-a:{tag}", "b": f"localhost/sublimate-test-b:{tag}"}
    try:
        _build(names["a"], "image-a", ["--cmd", '["sh"]'])
        _build(names["b"], "image-b", ["--entrypoint", '["/bin/sh", "-c"]', "--cmd",
                                       '["echo default $(cat /etc/image-name)"]',
                                       "--workingdir", "/srv"])
        yield names
    finally:
        for name in names.values():
            _buildah("rmi", name, check=False)


@pytest.fixture(autouse=True)
def no_container_left() -> Iterator[None]:
    """Every container a test's run created is removed when the run ends."""
    yield
    if shutil.which("buildah"):
        left = [n for n in buildah_container_names() if n.startswith(PREFIX)]
        assert left == [], f"containers left behind: {left}"


def _run(manifest: str, images: dict[str, str], home: Path, **parameters: str):
    workflow = yaml.safe_load(textwrap.dedent(manifest))
    params = {"image-a": images["a"], "image-b": images["b"], **parameters}
    return run_workflow(workflow, params, RunOptions(home=home, reporter=lambda event: None,
                                                     containers="buildah"))


def _log(result, node: str) -> str:
    return Path(result.node(node).log).read_text()


PARAMETERS = """
  arguments:
    parameters:
    - {name: image-a}
    - {name: image-b}
"""

# Two steps in two images: each reports its image's marker through an output parameter read
# from its own filesystem; the first writes a file on a claim the second reads; the first's
# output artifact (a folder in its own filesystem) is the second's input artifact.
TWO_IMAGES = """
apiVersion: argoproj.io/v1alpha1
kind: Workflow
metadata: {name: two-images}
spec:
  entrypoint: main
""" + PARAMETERS + """
  volumeClaimTemplates:
  - metadata: {name: shared}
    spec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 1Gi}}}
  templates:
  - name: main
    dag:
      tasks:
      - {name: first, template: first}
      - name: second
        template: second
        depends: first
        arguments:
          artifacts:
          - {name: report, from: "{{tasks.first.outputs.artifacts.report}}"}
  - name: first
    container:
      image: "{{workflow.parameters.image-a}}"
      command: [sh, -c]
      args:
      - |
        cat /etc/image-name > /tmp/name
        echo "from first" > /shared/note
        mkdir -p /tmp/report && echo "made in $(cat /etc/image-name)" > /tmp/report/text
      volumeMounts:
      - {name: shared, mountPath: /shared}
    outputs:
      parameters:
      - name: name
        valueFrom: {path: /tmp/name}
      artifacts:
      - {name: report, path: /tmp/report}
  - name: second
    inputs:
      artifacts:
      - {name: report, path: /inputs/report}
    container:
      image: "{{workflow.parameters.image-b}}"
      command: [sh, -c]
      args:
      - |
        cat /etc/image-name > /tmp/name
        echo "$(cat /shared/note), $(cat /inputs/report/text)" > /tmp/seen
      volumeMounts:
      - {name: shared, mountPath: /shared}
    outputs:
      parameters:
      - name: name
        valueFrom: {path: /tmp/name}
      - name: seen
        valueFrom: {path: /tmp/seen}
"""


def test_two_steps_run_in_their_two_images(images: dict[str, str], tmp_path: Path) -> None:
    result = _run(TWO_IMAGES, images, tmp_path)
    assert result.phase == "Succeeded", result.message
    assert result.node("first").parameters == {"name": "image-a"}
    second = result.node("second").parameters
    assert second["name"] == "image-b"
    assert second["seen"] == "from first, made in image-a"
    # The output artifact was copied out of the first container before it was removed.
    assert result.node("first").artifacts["report"]


SCRIPT = """
apiVersion: argoproj.io/v1alpha1
kind: Workflow
metadata: {name: script}
spec:
  entrypoint: script
""" + PARAMETERS + """
  templates:
  - name: script
    inputs:
      artifacts:
      - {name: motto, path: /etc/motto, raw: {data: "a raw input artifact"}}
    script:
      image: "{{workflow.parameters.image-a}}"
      command: [sh]
      workingDir: /work/here
      env:
      - {name: GREETING, value: hello}
      source: |
        echo "$GREETING from $(pwd) in $(cat /etc/image-name) as $0"
        echo "HOME=$HOME PATH=$PATH"
        cat /etc/motto; echo
        env | cut -d= -f1 | sort | tr '\\n' ' '
"""


def test_a_script_runs_with_its_env_working_dir_and_input(images: dict[str, str],
                                                    tmp_path: Path) -> None:
    result = _run(SCRIPT, images, tmp_path)
    assert result.phase == "Succeeded", result.message
    lines = result.node("script").result.splitlines()
    assert lines[0] == "hello from /work/here in image-a as /argo/staging/script"
    # The image's environment, not the runner's: the host's HOME and PATH stay outside.
    assert lines[1] == "HOME=/ PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    # A file bound at its path, beside the image's own files in /etc.
    assert lines[2] == "a raw input artifact"
    names = set(lines[3].split())
    assert {"GREETING", "SUBLIMATE_LOCAL_RUN", "SUBLIMATE_TERMINATION_LOG"} <= names
    assert not names & {"VIRTUAL_ENV", "SUBLIMATE_LOCAL_CWD", "SUBLIMATE_LOCAL_RUN_FOLDER",
                        "PYTEST_CURRENT_TEST"}


def test_a_variable_passed_with_env_reaches_the_container_masked(
        images: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`sublimate run --env` in container mode: into the container as in a local pod
    (runner/pods/environment.py); the rest of the runner's environment stays outside."""
    monkeypatch.setenv("SECRET_THING", "hunter2-xyz")
    workflow = yaml.safe_load(textwrap.dedent(SCRIPT.replace(
        "env | cut", 'echo "passed=$PASSED_THING"; env | cut')))
    result = run_workflow(workflow, {"image-a": images["a"], "image-b": images["b"]},
                          RunOptions(home=tmp_path, reporter=lambda event: None,
                                     containers="buildah", env={"PASSED_THING": "passed-value"}))
    assert result.phase == "Succeeded", result.message
    lines = result.node("script").result.splitlines()
    assert lines[3] == "passed=***"  # it had the value; masked in the output
    names = set(lines[4].split())
    assert "PASSED_THING" in names and "SECRET_THING" not in names


ENTRYPOINT = """
apiVersion: argoproj.io/v1alpha1
kind: Workflow
metadata: {name: entrypoint}
spec:
  entrypoint: main
""" + PARAMETERS + """
  templates:
  - name: main
    steps:
    - - {name: image-cmd, template: image-cmd}
      - {name: own-args, template: own-args}
  - name: image-cmd
    container:
      image: "{{workflow.parameters.image-b}}"
  - name: own-args
    container:
      image: "{{workflow.parameters.image-b}}"
      args: ["echo args in $(pwd)"]
"""


def test_a_template_without_command_runs_the_images_entrypoint(images: dict[str, str],
                                                               tmp_path: Path) -> None:
    """Kubernetes: no command runs ENTRYPOINT + args, or ENTRYPOINT + CMD with no args."""
    result = _run(ENTRYPOINT, images, tmp_path)
    assert result.phase == "Succeeded", result.message
    assert _log(result, "image-cmd") == "default image-b\n"
    assert _log(result, "own-args") == "args in /srv\n"  # the image's WorkingDir


FAILING = """
apiVersion: argoproj.io/v1alpha1
kind: Workflow
metadata: {name: failing}
spec:
  entrypoint: fail
""" + PARAMETERS + """
  templates:
  - name: fail
    container:
      image: "{{workflow.parameters.image-a}}"
      command: [sh, -c, 'echo "no data in /x" > "$SUBLIMATE_TERMINATION_LOG"; exit 3']
"""


def test_a_non_zero_exit_fails_the_node_with_its_message(images: dict[str, str],
                                                         tmp_path: Path) -> None:
    result = _run(FAILING, images, tmp_path)
    node = result.node("failing")
    assert (result.phase, node.phase) == ("Failed", "Failed")
    assert node.exit_code == 3
    assert node.message == "Error (exit code 3): no data in /x"
    assert "exit status" not in _log(result, "failing")  # buildah's own report is left out


USER = """
apiVersion: argoproj.io/v1alpha1
kind: Workflow
metadata: {name: user}
spec:
  entrypoint: main
""" + PARAMETERS + """
  securityContext: {runAsUser: 1234, runAsGroup: 2345, fsGroup: 2345, runAsNonRoot: true}
  volumeClaimTemplates:
  - metadata: {name: data}
    spec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 1Gi}}}
  templates:
  - name: main
    steps:
    - - {name: pod-user, template: pod-user}
      - {name: own-user, template: own-user}
  - name: pod-user
    container:
      image: "{{workflow.parameters.image-a}}"
      command: [sh, -c, 'echo "$(id -u):$(id -g)" > /tmp/ids; echo written > /data/by-user']
      volumeMounts:
      - {name: data, mountPath: /data}
    outputs:
      parameters:
      - name: ids
        valueFrom: {path: /tmp/ids}
  - name: own-user
    container:
      image: "{{workflow.parameters.image-a}}"
      command: [sh, -c, 'echo "$(id -u):$(id -g)" > /tmp/ids']
      securityContext: {runAsUser: 4321}
    outputs:
      parameters:
      - name: ids
        valueFrom: {path: /tmp/ids}
"""


def test_run_as_user_and_fs_group_are_honoured(images: dict[str, str], tmp_path: Path) -> None:
    result = _run(USER, images, tmp_path)
    assert result.phase == "Succeeded", result.message
    assert result.node("pod-user").parameters == {"ids": "1234:2345"}
    # The container's own runAsUser wins over the pod's, field by field.
    assert result.node("own-user").parameters == {"ids": "4321:2345"}
    written = result.run_dir / "volumes/data/by-user"
    assert written.read_text() == "written\n"
    assert (written.stat().st_uid, written.stat().st_gid) == (1234, 2345)


def test_run_as_non_root_refuses_an_image_running_as_root(images: dict[str, str],
                                                          tmp_path: Path) -> None:
    manifest = SCRIPT.replace("  templates:", "  securityContext: {runAsNonRoot: true}\n"
                              "  templates:")
    result = _run(manifest, images, tmp_path)
    node = result.node("script")
    assert node.phase == "Error"
    assert node.message == "container has runAsNonRoot and image will run as root"


PODS = """
apiVersion: argoproj.io/v1alpha1
kind: Workflow
metadata: {name: pods}
spec:
  entrypoint: main
""" + PARAMETERS + """
  templates:
  - name: main
    volumes:
    - {name: work, emptyDir: {}}
    initContainers:
    - name: fetch
      image: "{{workflow.parameters.image-a}}"
      command: [sh, -c, 'cat /etc/image-name > /work/fetched']
      volumeMounts:
      - {name: work, mountPath: /work}
    container:
      image: "{{workflow.parameters.image-b}}"
      command: [sh, -c, 'echo "$(cat /work/fetched) then $(cat /etc/image-name)"']
      volumeMounts:
      - {name: work, mountPath: /work}
"""


def test_an_init_container_runs_in_its_own_image(images: dict[str, str],
                                                 tmp_path: Path) -> None:
    result = _run(PODS, images, tmp_path)
    assert result.phase == "Succeeded", result.message
    assert result.node("pods").result == "image-a then image-b"


def test_a_missing_image_is_refused_before_anything_runs(images: dict[str, str],
                                                         tmp_path: Path) -> None:
    missing = "localhost/sublimate-test-missing:0"
    with pytest.raises(ContainerEngineError) as error:
        _run(TWO_IMAGES, {**images, "b": missing}, tmp_path)
    message = str(error.value)
    assert f"{missing} (template second): " in message
    assert images["a"] not in message  # only what is missing
    assert "never pulls" in message and "buildah pull NAME" in message
    assert not (tmp_path / "runs").exists()  # refused before the run folder exists


def test_the_cli_names_the_missing_image(images: dict[str, str], tmp_path: Path) -> None:
    manifest = tmp_path / "two.yaml"
    manifest.write_text(textwrap.dedent(TWO_IMAGES))
    done = run_cli("run", str(manifest), "--container-engine", "buildah",
                   "-p", f"image-a={images['a']}", "-p", "image-b=ghcr.io/nobody/absent:1",
                   home=tmp_path / "home", timeout=120)
    assert done.returncode != 0
    assert "ghcr.io/nobody/absent:1 (template second)" in done.stderr, done.stderr
    assert "not applied locally: " in done.stderr
    assert "image" not in done.stderr.split("not applied locally: ")[1].split("(")[0]


SLOW = """
apiVersion: argoproj.io/v1alpha1
kind: Workflow
metadata: {name: slow}
spec:
  entrypoint: slow
""" + PARAMETERS + """
  volumeClaimTemplates:
  - metadata: {name: shared}
    spec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 1Gi}}}
  templates:
  - name: slow
    activeDeadlineSeconds: DEADLINE
    container:
      image: "{{workflow.parameters.image-a}}"
      command: [sh, -c]
      args:
      - |
        trap 'echo stopped > /shared/stopped; exit 7' TERM
        echo started > /shared/started
        while true; do sleep 0.1; done
      volumeMounts:
      - {name: shared, mountPath: /shared}
"""


def test_a_deadline_stops_the_step_with_sigterm(images: dict[str, str],
                                                tmp_path: Path) -> None:
    """The step's own processes get SIGTERM (buildah, signalled, would kill them outright)."""
    result = _run(SLOW.replace("DEADLINE", "2"), images, tmp_path)
    node = result.node("slow")
    assert node.phase == "Failed"
    assert "exceeded its deadline" in node.message
    assert (result.run_dir / "volumes/shared/stopped").read_text() == "stopped\n"


def test_a_killed_runners_container_is_stopped_and_removed(images: dict[str, str],
                                                           tmp_path: Path) -> None:
    """The run's keeper does what the runner's ``finally`` cannot: SIGTERM, then ``rm``. The
    step may print on its way out: the keeper holds its output pipes and reads them into the
    log, where the dead runner would have left the engine a broken pipe (buildah's stdio relay
    dies of SIGPIPE and takes the step with it, before its trap has run: CI, once)."""
    manifest = tmp_path / "slow.yaml"
    manifest.write_text(textwrap.dedent(SLOW.replace("DEADLINE", "60").replace(
        "trap 'echo", "trap 'echo stopping; echo stopping, said on stderr >&2; sleep 1; echo")))
    home = tmp_path / "home"
    runner = subprocess.Popen(
        [sys.executable, "-m", "sublimate.pipelines", "run", str(manifest), "--containers",
         "-p", f"image-a={images['a']}", "-p", f"image-b={images['b']}", "--home", str(home)],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    shared = home / "runs/slow/volumes/shared"
    try:
        deadline = time.monotonic() + 60
        while not (shared / "started").exists():
            assert time.monotonic() < deadline and runner.poll() is None, "the step never ran"
            time.sleep(0.1)
    finally:
        runner.send_signal(signal.SIGKILL)
        runner.wait()
    ours = f"sublimate-{runner.pid}-"
    deadline = time.monotonic() + 30
    while any(n.startswith(ours) for n in buildah_container_names()):
        assert time.monotonic() < deadline, "the killed runner's container was not removed"
        time.sleep(0.2)
    assert (shared / "stopped").read_text() == "stopped\n"
    (log,) = (home / "runs/slow/nodes").glob("*/main.log")
    said = log.read_text()
    assert "stopping\n" in said and "stopping, said on stderr\n" in said


# ----------------------------------------------------------------------------- no engine run


def test_path_in_root_keeps_links_inside_the_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "data").mkdir(parents=True)
    (root / "data/file").write_text("inside")
    (root / "abs").symlink_to("/data")  # absolute: the container's /data, not this machine's
    (root / "up").symlink_to("../../../../data")  # `..` stops at the root
    assert path_in_root(root, "/abs/file") == root / "data/file"
    assert path_in_root(root, "/up/file") == root / "data/file"
    (root / "loop").symlink_to("/loop")
    with pytest.raises(OSError, match="symbolic links"):
        path_in_root(root, "/loop/x")


SPEC = RunSpec(argv=["python", "-c", "print(1)"],
               binds=[Bind("/mnt/data", Path("/home/x/volumes/data")),
                      Bind("/argo/staging/script", Path("/run/n/script"), read_only=True)],
               env={"A": "1"}, working_dir="/work", user="1000:1000", groups=(2000,))


@pytest.mark.parametrize("engine", [Docker("docker"), Podman("podman")])
def test_docker_and_podman_command_lines(engine: Docker | Podman) -> None:
    """Not runnable here (no daemon; podman cannot start containers): the text only."""
    assert engine.run("c1", "img:1", SPEC) == [
        engine.name, "run", "--name", "c1", "--pull", "never", "--network", "host",
        "--volume", "/home/x/volumes/data:/mnt/data",
        "--volume", "/run/n/script:/argo/staging/script:ro",
        "--env", "A=1", "--workdir", "/work", "--user", "1000:1000", "--group-add", "2000",
        "--entrypoint", "python", "img:1", "-c", "print(1)"]
    assert engine.create("c1", "img:1") is None
    assert engine.remove("c1") == [engine.name, "rm", "--force", "c1"]


def test_buildah_command_lines() -> None:
    engine = Buildah("buildah")
    assert engine.create("c1", "img:1") == ["buildah", "from", "--quiet", "--pull=never",
                                            "--name", "c1", "img:1"]
    assert engine.run("c1", "img:1", SPEC) == [
        "buildah", "run", "--isolation", "chroot", "--uts", "host",
        "--volume", "/home/x/volumes/data:/mnt/data",
        "--volume", "/run/n/script:/argo/staging/script:ro",
        "--env", "A=1", "--workingdir", "/work", "--user", "1000:1000",
        "c1", "--", "python", "-c", "print(1)"]
    assert engine.signal_from_line("subprocess exited on terminated") == 15
    assert engine.signal_from_line("Error: exit status 3") == 0
    assert engine.signal_from_line("an ordinary line") is None


def test_an_unknown_engine_is_refused() -> None:
    with pytest.raises(ContainerEngineError, match="must be one of docker, podman, buildah"):
        choose_engine("lxc")


def test_the_keeper_needs_only_the_standard_library() -> None:
    """The keeper runs as a script without the package (python -I -S): standard library only."""
    source = (REPO / "pipelines/runner/pods/images/keeper.py").read_text()
    imports = {line.split()[1] for line in source.splitlines()
               if line.startswith(("import ", "from "))}
    assert imports <= set(sys.stdlib_module_names) | {"__future__"}, imports


def test_buildahs_probe_survives_another_runs_container_going(tmp_path: Path) -> None:
    """Whether buildah works is asked of its store, not of each container in it: listing them
    fails while another run removes one of its own (1 listing in 400 here, beside three loops
    of ``buildah from``/``rm``), which made a run refuse a working engine. A buildah that fails
    its listings that way, as the real one does mid-removal, stands for the race."""
    require(os.geteuid() == 0, "buildah's chroot isolation needs root")
    racing = tmp_path / "buildah"
    racing.write_text(textwrap.dedent("""\
        #!/bin/sh
        if [ "$1" = containers ]; then
          echo 'Error: reading build containers: container not known' >&2; exit 125
        fi
        exec buildah "$@"
        """))
    racing.chmod(0o755)
    assert Buildah(str(racing)).unavailable() == ""


def test_auto_takes_the_first_engine_that_works(images: dict[str, str]) -> None:
    engine = choose_engine()
    assert engine.unavailable() == ""
    for name in ENGINES[:ENGINES.index(engine.name)]:  # each one before it was passed over
        assert ENGINE_CLASSES[name]().unavailable() != ""


def test_the_keepers_watch_line_reads_back_as_written() -> None:
    """Each word of a ``watch`` line is the keeper's to read back: the log given or not."""
    keeper = Keeper(Buildah())
    sent: list[str] = []
    keeper._send = sent.append  # type: ignore[method-assign]  # the line, not a keeper process
    gone = 2 ** 22 + 1  # above the kernel's largest pid: no pipes to hold
    keeper.watch("step-a", gone, masked=[b"s3cret"])
    keeper.watch("step-b", gone, Path("/runs/b/main.log"), [b"s3cret", b"token"])
    (a, b) = (keeper_script.Kept(line.split()[1:]) for line in sent)
    assert (a.name, a.pgid, a.log, a.masked) == ("step-a", gone, os.devnull, [b"s3cret"])
    assert (b.log, b.masked) == ("/runs/b/main.log", [b"s3cret", b"token"])


def test_the_keeper_removes_what_a_vanished_runner_left(images: dict[str, str]) -> None:
    """Its stdin ending without ``close`` is the runner's death; a keeper that died is started
    again knowing every container the last one knew."""
    keeper = Keeper(Buildah())
    names = [f"{PREFIX}keeper-{n}" for n in range(2)]
    try:
        for name in names:
            _buildah("from", "--quiet", "--pull=never", "--name", name, images["a"])
        keeper.watch(names[0])
        first = keeper._process
        assert first is not None
        first.kill()
        first.wait()
        keeper.watch(names[1])  # a new keeper, told of both
        second = keeper._process
        assert second is not None and second is not first
        assert second.stdin is not None
        second.stdin.close()  # as the runner's end closes it
        second.wait(timeout=30)
        assert not set(names) & set(buildah_container_names())
    finally:
        for name in names:
            _buildah("rm", name, check=False)



def test_a_runner_killed_before_naming_the_engines_group_still_has_its_step_stopped(
        tmp_path: Path) -> None:
    """The runner names the engine command's process group once that command has started; a
    runner killed in between (CI hit it once, under load) has told its keeper the container's
    name only. The keeper finds the group by the name and stops the step with SIGTERM, as the
    runner would, before removing the container (a bare ``rm`` kills the step outright)."""
    name = f"{PREFIX}unnamed-group-{os.getpid()}"
    stopped = tmp_path / "stopped"
    # The engine command, as the runner starts it: a session of its own, the name in its argv.
    engine = subprocess.Popen(
        ["sh", "-c", f"trap 'echo stopped > {stopped}; exit 7' TERM; echo started > "
         f"{tmp_path}/started; while true; do sleep 0.1; done", name],
        start_new_session=True)
    config = {"remove": ["true"], "engine_exes": [], "grace_s": 30}
    keeper = subprocess.Popen(
        [sys.executable, "-I", "-S", str(REPO / "pipelines/runner/pods/images/keeper.py"),
         json.dumps(config)], stdin=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "started").exists():
            assert time.monotonic() < deadline, "the engine command never started"
            time.sleep(0.05)
        assert keeper.stdin is not None
        keeper.stdin.write(f"watch {name}\n")  # no group: the runner died before it knew
        keeper.stdin.close()  # the runner's end
        # Reaped here first: as a zombie, it would keep its group alive for the keeper.
        assert engine.wait(timeout=30) == 7  # the trap ran: SIGTERM, not SIGKILL
        assert keeper.wait(timeout=60) == 0
        assert stopped.read_text() == "stopped\n"
    finally:
        for process in (engine, keeper):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def test_a_killed_runners_step_may_print_on_its_way_out(tmp_path: Path) -> None:
    """The engine command's output pipes lose their reader with the runner: the keeper holds
    them from the ``watch`` on and reads them into the step's log, masked, once the runner is
    gone, so a step that prints on SIGTERM is not killed by SIGPIPE before its cleanup."""
    name = f"{PREFIX}printing-{os.getpid()}"
    stopped, log = tmp_path / "stopped", tmp_path / "main.log"
    log.write_text("the runner's lines\n")
    engine = subprocess.Popen(
        ["sh", "-c", "trap 'echo token s3cr3t-value; echo on stderr >&2; sleep 0.5; "
         f"echo stopped > {stopped}; printf \"last words\"; exit 7' TERM; echo started; "
         "while true; do sleep 0.1; done", name],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    config = {"remove": ["true"], "engine_exes": [], "grace_s": 30}
    keeper = subprocess.Popen(
        [sys.executable, "-I", "-S", str(REPO / "pipelines/runner/pods/images/keeper.py"),
         json.dumps(config)], stdin=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert engine.stdout is not None and engine.stderr is not None
        assert engine.stdout.readline() == b"started\n"
        assert keeper.stdin is not None
        keeper.stdin.write(f"watch {name} {engine.pid} {bytes(log).hex()} "
                           f"{b's3cr3t-value'.hex()}\n")
        keeper.stdin.close()  # the runner's end...
        engine.stdout.close()  # ...and its pipes' reading ends
        engine.stderr.close()
        assert engine.wait(timeout=30) == 7  # the trap ran to its end: no SIGPIPE
        assert keeper.wait(timeout=60) == 0
        assert stopped.read_text() == "stopped\n"
        said = log.read_text()
        assert said.startswith("the runner's lines\nnote: the runner is gone")
        assert "token ***\n" in said and "s3cr3t" not in said
        assert "on stderr\n" in said and said.endswith("last words")
    finally:
        for process in (engine, keeper):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


LATE = """
apiVersion: argoproj.io/v1alpha1
kind: Workflow
metadata: {name: late}
spec:
  entrypoint: main
""" + PARAMETERS + """
  templates:
  - name: main
    dag:
      tasks:
      - name: present
        template: named
        arguments: {parameters: [{name: image, value: "{{workflow.parameters.image-b}}"}]}
      - name: absent
        template: named
        arguments: {parameters: [{name: image, value: localhost/sublimate-test-absent:0}]}
  - name: named
    inputs: {parameters: [{name: image}]}
    container:
      image: "{{inputs.parameters.image}}"
      command: [cat, /etc/image-name]
"""


def test_an_image_known_only_at_run_time_is_looked_up_when_its_pod_starts(
        images: dict[str, str], tmp_path: Path) -> None:
    result = _run(LATE, images, tmp_path)
    assert result.node("present").phase == "Succeeded"
    assert result.node("present").result == "image-b"
    absent = result.node("absent")
    assert absent.phase == "Error"
    assert absent.message.startswith("image localhost/sublimate-test-absent:0 is not present "
                                     "locally for buildah (image not known); a local run never "
                                     "pulls")


def test_the_missing_runtime_image_says_how_to_build_it() -> None:
    """`sublimate run --containers` before `images/build.sh`: the message names the script."""
    from sublimate.components.base.runtime import DEFAULT_IMAGE
    from sublimate.pipelines.runner.pods.images.executor import missing_images_message

    class Bare(Buildah):  # an engine that holds no image at all
        def local_images(self) -> list[str]:
            return []

    message = missing_images_message(Bare("buildah"), {DEFAULT_IMAGE: "image not known"},
                                     {DEFAULT_IMAGE: ["stage-data", "train"]})
    assert f"{DEFAULT_IMAGE} is sublimate's runtime image: `images/build.sh`" in message
    other = missing_images_message(Bare("buildah"), {"ghcr.io/x/y:1": "image not known"},
                                   {"ghcr.io/x/y:1": ["main"]})
    assert "images/build.sh" not in other
