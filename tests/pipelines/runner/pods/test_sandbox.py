"""A pod is contained (``pipelines/runner/pods/sandbox.py``, ``resource_limits.py``): each
workflow here is one a careless or hostile author could write, run through the runner as root
in its default mode, and each checks on this machine that the pod did not reach it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from sublimate.pipelines.runner import RunOptions, load_manifest, run_workflow
from sublimate.pipelines.runner.errors import NodeError
from sublimate.pipelines.runner.pods import sandbox, views
from sublimate.pipelines.runner.pods.resource_limits import plan_limits, quantity
from tests.conftest import require, run_cli


@pytest.fixture(autouse=True)
def contained(tmp_path: Path) -> None:
    require(os.geteuid() == 0, "pods are contained where the runner is root")
    require(not views.probe(tmp_path), f"no private views here: {views.probe(tmp_path)}")


def _run(tmp_path: Path, script: str, *, command: str = "sh", extra: str = "",
         parameters: dict[str, str] | None = None, home: str = "home"):
    body = textwrap.indent(textwrap.dedent(script).strip(), " " * 10)
    extra = textwrap.indent(textwrap.dedent(extra).strip(), " " * 6)
    text = f"""
apiVersion: argoproj.io/v1alpha1
kind: Workflow
metadata: {{name: hostile}}
spec:
  entrypoint: main
  arguments:
    parameters: [{", ".join(f"{{name: {k}, value: '{v}'}}" for k, v in
                             (parameters or {}).items())}]
  templates:
  - name: main
    script:
      image: alpine
      command: [{command}]
{extra}
      source: |
{body}
"""
    return run_workflow(load_manifest(text), {}, RunOptions(home=tmp_path / home))


@pytest.fixture
def host_process() -> Iterator[subprocess.Popen[bytes]]:
    """A process of this machine's that a pod must not see, signal or enter."""
    process = subprocess.Popen(["sleep", "300"])
    yield process
    process.kill()
    process.wait()


def test_a_pod_cannot_write_the_host_through_another_process_root(
        tmp_path: Path, host_process: subprocess.Popen[bytes]) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    result = _run(tmp_path, """
        ls /proc | grep -cE '^[0-9]+$' > /tmp/count
        echo owned > /proc/{{workflow.parameters.pid}}/root{{workflow.parameters.victim}}/x \
          || echo refused
        cat /proc/{{workflow.parameters.pid}}/root/etc/hostname || echo unseen
        cat /tmp/count
        """, parameters={"pid": str(host_process.pid), "victim": str(victim)})
    assert result.phase == "Succeeded", result.message
    assert not (victim / "x").exists()
    lines = result.node("hostile").result.splitlines()
    assert lines[:2] == ["refused", "unseen"]
    assert int(lines[-1]) < 8  # its own few processes, not this machine's


def test_a_pod_cannot_signal_this_machines_processes(
        tmp_path: Path, host_process: subprocess.Popen[bytes]) -> None:
    result = _run(tmp_path, "kill -9 {{workflow.parameters.pid}} || echo refused",
                  parameters={"pid": str(host_process.pid)})
    assert result.phase == "Succeeded", result.message
    assert host_process.poll() is None


def test_a_pod_cannot_chroot_its_way_back_to_the_host(tmp_path: Path) -> None:
    # The classic escape of a chroot by a process that keeps CAP_SYS_CHROOT (the default set):
    # a second chroot below, then '..' past the first one's root.
    marker = tmp_path / "escaped"
    result = _run(tmp_path, """
        import os
        os.makedirs("/deeper", exist_ok=True)
        os.chroot("/deeper")
        for _ in range(64):
            os.chdir("..")
        os.chroot(".")
        try:
            open("{{workflow.parameters.marker}}", "w").write("out")
        except OSError as exc:
            print("refused", exc.errno)
        """, command="python", parameters={"marker": str(marker)})
    assert result.phase == "Succeeded", result.message
    assert not marker.exists()


def _capabilities(tmp_path: Path, context: str) -> int:
    result = _run(tmp_path, "grep CapEff /proc/self/status | cut -f2",
                  extra=f"securityContext: {context}" if context else "",
                  home=f"home-{abs(hash(context))}")
    assert result.phase == "Succeeded", result.message
    return int(result.node("hostile").result, 16)


def test_capabilities_are_a_container_runtimes_unless_the_pod_asks(tmp_path: Path) -> None:
    default = sum(1 << sandbox.CAPABILITIES[name] for name in sandbox.DEFAULT_CAPABILITIES)
    assert _capabilities(tmp_path, "") == default
    net_admin = 1 << sandbox.CAPABILITIES["NET_ADMIN"]
    assert _capabilities(tmp_path, "{capabilities: {add: [NET_ADMIN]}}") == default | net_admin
    assert _capabilities(tmp_path, "{capabilities: {drop: [ALL], add: [CHOWN]}}") == 1
    own = next(line for line in Path("/proc/self/status").read_text().splitlines()
               if line.startswith("CapEff:")).split()[1]
    assert _capabilities(tmp_path, "{privileged: true}") == int(own, 16)  # the runner's


def test_a_pod_has_its_own_devices_and_cannot_make_a_disk_node(tmp_path: Path) -> None:
    result = _run(tmp_path, """
        ls /dev | tr '\\n' ' '; echo
        mknod /tmp/disk b 8 0 2>/dev/null && echo made || echo refused
        echo x > /sys/kernel/profiling 2>/dev/null && echo sys-written || echo sys-read-only
        """)
    assert result.phase == "Succeeded", result.message
    devices, made, sys_written = result.node("hostile").result.splitlines()
    assert set(devices.split()) <= {"null", "zero", "full", "random", "urandom", "tty", "pts",
                                    "shm", "ptmx", "fd", "stdin", "stdout", "stderr",
                                    "dri", "kfd", "nvidia-caps"} | {
        name for name in os.listdir("/dev") if name.startswith("nvidia")}
    assert (made, sys_written) == ("refused", "sys-read-only")


def test_a_setuid_program_gains_nothing(tmp_path: Path) -> None:
    result = _run(tmp_path, "grep NoNewPrivs /proc/self/status | cut -f2")
    assert result.node("hostile").result == "1"


def test_the_runs_secret_files_are_out_of_a_pods_sight(tmp_path: Path) -> None:
    # Another run's (or a sibling pod's) secret volumes live on this machine's /dev/shm.
    planted = Path("/dev/shm") / f"sublimate-test-{os.getpid()}"
    planted.mkdir(mode=0o700)
    try:
        (planted / "token").write_text("hunter2")
        result = _run(tmp_path, f"ls /dev/shm; cat {planted}/token || echo unseen")
    finally:
        (planted / "token").unlink()
        planted.rmdir()
    assert result.node("hostile").result == "unseen"


def test_a_memory_limit_ends_the_pod_as_oom_killed(tmp_path: Path) -> None:
    result = _run(tmp_path, """
        blocks = [bytearray(10 << 20) for _ in range(30)]
        print(len(blocks))
        """, command="python", extra="resources: {limits: {memory: 50Mi}}")
    assert result.phase == "Failed"
    assert result.node("hostile").message == "OOMKilled (exit code 137)"


def test_a_cpu_limit_throttles_the_pod(tmp_path: Path) -> None:
    # 0.2 of a core for 1.5 s of busy waiting: its CPU time is a fraction of its wall time (a
    # bound with a wide margin: 1.5 s of CPU without the limit).
    result = _run(tmp_path, """
        import time
        started = time.monotonic()
        while time.monotonic() - started < 1.5:
            pass
        print(time.process_time())
        """, command="python", extra="resources: {limits: {cpu: 200m}}")
    assert result.phase == "Succeeded", result.message
    assert float(result.node("hostile").result) < 0.8


def test_each_signal_reaches_the_command_once(tmp_path: Path) -> None:
    # A deadline stops the pod with SIGTERM, passed on by the pod's namespace init: the
    # command's trap runs once (a second SIGTERM would append a second line).
    text = """
apiVersion: argoproj.io/v1alpha1
kind: Workflow
metadata: {name: counted}
spec:
  entrypoint: main
  volumes: [{name: out, emptyDir: {}}]
  templates:
  - name: main
    activeDeadlineSeconds: 2
    script:
      image: alpine
      command: [sh]
      volumeMounts: [{name: out, mountPath: /out}]
      source: |
        trap 'echo term >> /out/signals' TERM
        sleep 30 & wait
        sleep 3 & wait
"""
    result = run_workflow(load_manifest(text), {}, RunOptions(home=tmp_path / "home"))
    assert result.phase == "Failed"
    signals = next(Path(result.run_dir).rglob("volumes/out/signals"))
    assert signals.read_text() == "term\n"


def test_a_command_killed_by_a_signal_ends_with_128_plus_it(tmp_path: Path) -> None:
    result = _run(tmp_path, "kill -KILL $$")
    assert result.node("hostile").message == f"Error (exit code {128 + signal.SIGKILL})"


def test_bad_security_and_limits_are_refused_naming_the_field() -> None:
    with pytest.raises(NodeError, match=r"capabilities.add: unknown capability 'NET_FLY'"):
        sandbox.plan_sandbox({"securityContext": {"capabilities": {"add": ["NET_FLY"]}}},
                             None, "templates.main.container")
    with pytest.raises(NodeError, match=r"resources.limits.memory: '12 apples'"):
        plan_limits({"resources": {"limits": {"memory": "12 apples"}}}, None, "main")
    assert quantity("256Mi", "x") == 256 << 20
    assert quantity("500m", "x") == 0.5
    assert quantity("1.5G", "x") == 1.5e9
    assert plan_limits({"resources": {"limits": {"memory": "1Gi"}}},
                       {"sublimate.dev/local-job": "true"}, "train") is None
    assert sandbox.plan_sandbox({}, {"sublimate.dev/local-privileged": "true"}, "x") is None


def test_lint_refuses_what_kubernetes_would_before_any_pod_runs(tmp_path: Path) -> None:
    manifest = tmp_path / "bad.yaml"
    manifest.write_text(textwrap.dedent("""
        apiVersion: argoproj.io/v1alpha1
        kind: Workflow
        metadata: {name: bad}
        spec:
          entrypoint: main
          templates:
          - name: main
            container:
              image: alpine
              command: ["true"]
              resources: {limits: {memory: 12 apples}}
              securityContext: {capabilities: {add: [NET_FLY]}}
    """))
    done = run_cli("lint", str(manifest), home=tmp_path / "home")
    assert done.returncode != 0
    said = done.stdout + done.stderr
    assert "spec.templates[0].container.resources.limits.memory: '12 apples' is not a " \
           "quantity" in said
    assert "spec.templates[0].container.securityContext.capabilities.add: unknown " \
           "capability 'NET_FLY'" in said


def test_an_exec_probe_runs_in_the_pod_not_on_this_machine(tmp_path: Path) -> None:
    # The kubelet runs an exec probe in the container: it sees the pod's files, and what it
    # writes stays there.
    marker = tmp_path / "probed"
    # and it holds no more than the pod's own command
    own = sum(1 << sandbox.CAPABILITIES[name] for name in sandbox.DEFAULT_CAPABILITIES)
    text = f"""
apiVersion: argoproj.io/v1alpha1
kind: Workflow
metadata: {{name: probed}}
spec:
  entrypoint: main
  templates:
  - name: main
    dag:
      tasks:
      - {{name: server, template: server}}
      - {{name: client, template: client, dependencies: [server]}}
  - name: server
    daemon: true
    script:
      image: alpine
      command: [sh]
      source: "touch /tmp/ready; sleep 60"
      readinessProbe:
        exec:
          command:
          - sh
          - -c
          - touch {marker}; grep -q CapEff:.{own:016x} /proc/self/status && test -f /tmp/ready
        periodSeconds: 1
  - name: client
    script: {{image: alpine, command: [sh], source: "echo served"}}
"""
    result = run_workflow(load_manifest(text), {}, RunOptions(home=tmp_path / "home"))
    assert result.phase == "Succeeded", result.message
    assert result.node("client").result == "served"
    assert not marker.exists()


def test_only_the_pods_first_process_gets_a_new_pid_namespace() -> None:
    # The runner's thread unshares for its next child alone and takes its namespace back.
    def own_pid() -> str:
        return subprocess.run(["sh", "-c", "echo $$"], capture_output=True, text=True,
                              check=True).stdout.strip()

    with sandbox.children_in_new_pid_namespace():
        assert own_pid() == "1"
    assert own_pid() != "1"
    before = os.readlink("/proc/thread-self/ns/pid_for_children")
    assert before == os.readlink("/proc/self/ns/pid")


def test_limits_that_cannot_be_applied_are_said_not_raised(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # In a container the cgroup tree is read-only: the pod runs, without its limit, saying so
    # (a raise here once left a run hanging on its pod's thread).
    from sublimate.pipelines.runner.pods import resource_limits

    blocked = tmp_path / "not-a-folder"
    blocked.write_text("")
    monkeypatch.setattr(resource_limits, "_own_group", lambda controller: (blocked, 1))
    groups = resource_limits.make_groups(resource_limits.Limits(64 << 20, None), "x")
    assert groups.paths == () and groups.unavailable.startswith("cgroups (")
