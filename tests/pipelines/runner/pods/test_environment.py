"""A pod's environment (runner/pods/environment.py): what its manifest declares and a short
list the runner needs, never the whole shell that ran `sublimate run`; a variable of that shell
reaches a pod only through ``--env``, and is then masked as a secret in every output. Each
workflow is ours; its steps print their environment."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from sublimate.pipelines.runner import run
from sublimate.pipelines.runner.pods.environment import HOST_VARIABLES, pod_environment
from tests.conftest import run_cli

SECRET = "hunter2-xyz"
DIGEST = hashlib.sha256(SECRET.encode()).hexdigest()

# One step that prints every variable it has, and a digest of SECRET_THING: whether the value
# reached the pod, told without printing it.
PRINTS_ENV = """
apiVersion: argoproj.io/v1alpha1
kind: Workflow
metadata: {name: prints-env}
spec:
  entrypoint: show
  templates:
  - name: show
    script:
      image: python:3.12
      command: [python]
      env: [{name: DECLARED, value: declared-value}]
      source: |
        import hashlib, os
        for name in sorted(os.environ):
            print(f"{name}={os.environ[name]}")
        value = os.environ.get("SECRET_THING")
        print("digest", "absent" if value is None else hashlib.sha256(value.encode()).hexdigest())
"""


def _cli(tmp_path: Path, *flags: str) -> tuple[str, str, str, str]:
    """`sublimate run -o json` of PRINTS_ENV with SECRET_THING exported in its shell: exit
    status and console, and the step's main.log, the run's status.json and the -o json."""
    manifest = tmp_path / "prints-env.yaml"
    manifest.write_text(PRINTS_ENV)
    home = tmp_path / "home"
    done = run_cli("run", str(manifest), "-o", "json", *flags, home=home,
                   env={"SECRET_THING": SECRET})
    assert done.returncode == 0, done.stderr[-3000:]
    (log,) = home.glob("runs/prints-env/nodes/*/main.log")
    status = (home / "runs" / "prints-env" / "status.json").read_text()
    return done.stdout + done.stderr, log.read_text(), status, done.stdout


def test_a_variable_exported_in_the_shell_does_not_reach_a_pod(tmp_path: Path) -> None:
    console, log, status, output = _cli(tmp_path)
    assert "digest absent" in log  # not in the pod
    for text in (console, log, status, output):
        assert SECRET not in text and "SECRET_THING" not in text
    # what the manifest declares and the runner's own do reach it
    assert "DECLARED=declared-value" in log and "SUBLIMATE_LOCAL_RUN=1" in log
    assert "PATH=" in log and "PYTHONUNBUFFERED=1" in log


def test_a_variable_passed_with_env_reaches_the_pod_masked_everywhere(tmp_path: Path) -> None:
    console, log, status, output = _cli(tmp_path, "--env", "SECRET_THING")
    assert f"digest {DIGEST}" in log  # the pod had the value itself
    assert "SECRET_THING=***" in log and "SECRET_THING=***" in console
    for text in (console, log, status, output):
        assert SECRET not in text
    (node,) = json.loads(output)["nodes"]
    assert "SECRET_THING=***" in node["outputs"]["result"]


def test_env_takes_a_value_too_and_the_dry_run_names_it_only(tmp_path: Path) -> None:
    manifest = tmp_path / "prints-env.yaml"
    manifest.write_text(PRINTS_ENV)
    done = run_cli("run", str(manifest), "--dry-run", "--env", "SECRET_THING",
                   "--env", "OTHER_THING=other-value", home=tmp_path / "home",
                   env={"SECRET_THING": SECRET})
    assert done.returncode == 0, done.stderr
    assert "passed to every step (--env, values masked): SECRET_THING, OTHER_THING" \
        in done.stdout
    assert SECRET not in done.stdout + done.stderr
    assert "other-value" not in done.stdout + done.stderr
    assert not (tmp_path / "home" / "runs").exists()


@pytest.mark.parametrize(("flag", "error"), [
    ("NOT_IN_THIS_SHELL", "error: --env NOT_IN_THIS_SHELL: not set in this shell (export it, "
                          "or give --env NOT_IN_THIS_SHELL=VALUE)"),
    ("9LIVES=x", "error: --env '9LIVES': not a variable name (letters, digits and _, not "
                 "starting with a digit)"),
    ("MY-TOKEN=s3cr3t-value", "error: --env 'MY-TOKEN': not a variable name (letters, digits "
                              "and _, not starting with a digit)"),
])
def test_a_bad_env_flag_is_one_line(tmp_path: Path, flag: str, error: str) -> None:
    manifest = tmp_path / "prints-env.yaml"
    manifest.write_text(PRINTS_ENV)
    env = {name: value for name, value in os.environ.items() if name != "NOT_IN_THIS_SHELL"}
    done = run_cli("run", str(manifest), "--env", flag, home=tmp_path / "home", env=env)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [error]  # the value never shown
    assert not (tmp_path / "home" / "runs").exists()


# Every other process of a pod: an init container, a sidecar and the main container of one pod,
# and a containerSet's containers.
PRINT = ("import hashlib, os; v = os.environ.get('PASSED_THING', ''); "
         "print('passed', hashlib.sha256(v.encode()).hexdigest()); "
         "print('keys', ' '.join(sorted(os.environ)))")
CONTAINERS = f"""
apiVersion: argoproj.io/v1alpha1
kind: Workflow
metadata: {{name: containers}}
spec:
  entrypoint: main
  templates:
  - name: main
    steps:
    - - {{name: with-init, template: with-init}}
      - {{name: set, template: set}}
  - name: with-init
    volumes: [{{name: shared, emptyDir: {{}}}}]
    initContainers:
    - name: setup
      command: [python, -c, "{PRINT}"]
      env: [{{name: DECLARED, value: declared-value}}]
    sidecars:
    - name: side
      command: [python, -c, "{PRINT}; open('/shared/printed', 'w').close(); import time;
                time.sleep(300)"]
      volumeMounts: [{{name: shared, mountPath: /shared}}]
    container:
      # waits for the sidecar to have printed (it is killed once main ends)
      command: [python, -c, "import os, time; [time.sleep(0.05) for _ in range(1200)
                if not os.path.exists('/shared/printed')]; {PRINT}"]
      volumeMounts: [{{name: shared, mountPath: /shared}}]
  - name: set
    containerSet:
      containers:
      - name: first
        command: [python, -c, "{PRINT}"]
        env: [{{name: DECLARED, value: declared-value}}]
      - name: main
        dependencies: [first]
        command: [python, -c, "{PRINT}"]
"""


def test_every_process_of_a_pod_gets_the_same_clean_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SECRET_THING", SECRET)
    result = run(CONTAINERS, home=tmp_path / "home", echo=False, timeout=60,
                 env={"PASSED_THING": "passed-value"})
    assert result.phase == "Succeeded", result.message
    folder = Path(result.run_folder) / "nodes"
    logs = {str(log.relative_to(folder)): log.read_text() for log in folder.rglob("*.log")}
    runner = {"PYTHONUNBUFFERED", "SUBLIMATE_LOCAL_RUN", "SUBLIMATE_LOCAL_RUN_FOLDER",
              "SUBLIMATE_LOCAL_CWD", "SUBLIMATE_TERMINATION_LOG", "SUBLIMATE_LOCAL_VOLUMES"}
    passed = hashlib.sha256(b"passed-value").hexdigest()
    names = sorted(Path(log).name for log in logs)
    assert names == ["first.log", "main.log", "main.log", "setup.log", "side.log"]
    printed = [text for text in logs.values() if "keys " in text]
    assert len(printed) == 5  # setup, side and main; the set's first and main
    for text in printed:
        keys = set(text.split("keys ", 1)[1].split())
        assert "SECRET_THING" not in keys and "PASSED_THING" in keys and "PATH" in keys
        assert keys <= set(HOST_VARIABLES) | runner | {"DECLARED", "PASSED_THING"}, text
        assert f"passed {passed}" in text
    status = (Path(result.run_folder) / "status.json").read_text()
    for text in [status, *logs.values()]:
        assert "passed-value" not in text and SECRET not in text


# A daemon's readiness probe: ready only if its command's environment is the pod's clean one;
# else the run never gets past it and ends at its deadline.
PROBED = """
apiVersion: argoproj.io/v1alpha1
kind: Workflow
metadata: {name: probed}
spec:
  entrypoint: main
  templates:
  - name: main
    steps:
    - - {name: serve, template: serve}
    - - {name: after, template: after}
  - name: serve
    daemon: true
    container:
      command: [sleep, "300"]
      env: [{name: DECLARED, value: declared-value}]
      readinessProbe:
        periodSeconds: 1
        exec:
          command: [sh, -c, 'test -z "${SECRET_THING+set}" && test -n "$PATH" &&
                    test "$PASSED_THING" = passed-value && test "$DECLARED" = declared-value']
  - name: after
    container: {command: ["true"]}
"""


def test_a_readiness_probe_runs_with_the_pods_clean_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SECRET_THING", SECRET)
    result = run(PROBED, home=tmp_path / "home", echo=False, timeout=30,
                 env={"PASSED_THING": "passed-value"})
    assert result.phase == "Succeeded", result.message
    assert result.node("after").phase == "Succeeded"


def test_the_layers_of_a_pods_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SECRET_THING", SECRET)
    monkeypatch.setenv("HOME", "/home/me")
    monkeypatch.setenv("FROM_SECRET", "optional secret's value")
    env = pod_environment({"DECLARED": "d", "OVERRIDDEN": "declared", "HOME": "/manifest"},
                          {"SUBLIMATE_LOCAL_RUN": "1", "OVERRIDDEN": "runner"},
                          from_environment=["FROM_SECRET", "NOT_SET_ANYWHERE"],
                          passed={"PASSED_THING": "p", "SUBLIMATE_LOCAL_RUN": "0"})
    assert "SECRET_THING" not in env and "NOT_SET_ANYWHERE" not in env
    assert env["HOME"] == "/manifest" and env["DECLARED"] == "d"
    assert env["FROM_SECRET"] == "optional secret's value" and env["PASSED_THING"] == "p"
    assert env["OVERRIDDEN"] == "runner" and env["SUBLIMATE_LOCAL_RUN"] == "1"
    assert env["PYTHONUNBUFFERED"] == "1" and env["PATH"] == os.environ["PATH"]
    # in its image, the image supplies PATH, HOME, ...: none of this machine's
    in_image = pod_environment({"DECLARED": "d"}, {"SUBLIMATE_LOCAL_RUN": "1"},
                               passed={"PASSED_THING": "p"}, in_image=True)
    assert in_image == {"PYTHONUNBUFFERED": "1", "DECLARED": "d", "PASSED_THING": "p",
                        "SUBLIMATE_LOCAL_RUN": "1"}
