"""Every command of README.md and docs/*.md that a user would paste, run as written.

The commands are found, not listed: every line of a ```bash (or ```sh) block, continuation
lines joined and comments dropped, and every ``$ `` line of a ```console block. So when the text
moves (README.md shortened into topic pages under docs/), the test follows it. Each command is
then handled by the first rule of :data:`RULES` that matches it:

* ``run``: run as written, in a folder laid out as a user's checkout (``examples/`` and
  ``argo/`` there, the files the docs assume: ``params.yaml``, ``./my-dataset``), with a fresh
  ``SUBLIMATE_HOME``; only the substitutions of :func:`as_run` are made (one epoch instead of
  many; the test's own S3 endpoint and credentials for the placeholders; a real model version
  for ``VERSION``). It must end with the documented status and no traceback;
* ``dry-run``: run with ``--dry-run``, which checks every parameter, the rules between them, the
  manifest and the grid, and starts nothing: for a run another test makes end to end (named in
  the rule), so that the suite stays fast;
* ``parse``: parsed by sublimate's own argument parser: commands that need an Argo server, a
  running job or names of runs of your own (the rule names the test that runs them);
* ``skip``: not sublimate's commands, or ones CI runs itself (the rule says where).

A command that no rule matches fails :func:`test_every_command_has_a_rule`: a new command in the
docs must be run, or its rule must say why not. A rule no command matches fails it too.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from tests.components.launch.test_netns_scheduler import netns
from tests.conftest import CRASH_SIGNS, REPO

__all__ = ["netns"]  # the fixture of the cluster on one machine's prerequisites

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


@dataclass(frozen=True)
class Command:
    where: str  # README.md:80
    text: str


@dataclass(frozen=True)
class Rule:
    pattern: str  # searched in the command
    how: str  # run, dry-run, parse, skip
    why: str = ""  # for dry-run, parse and skip: why not run here, and where it is run
    exit: int = 0  # for run: the status the command ends with
    says: str = ""  # for run: a text its output has (a refusal's reason)
    needs: str = ""  # for run: "s3" (a loopback S3 server), "root" (network namespaces)


def _commands_of(path: Path) -> Iterator[Command]:
    text = path.read_text()
    for block in re.finditer(r"^```(bash|sh|shell|console)\n(.*?)^```", text, re.S | re.M):
        first = text[:block.start()].count("\n") + 2
        lines = block.group(2).splitlines()
        if block.group(1) == "console":
            for offset, line in enumerate(lines):
                if line.startswith("$ "):
                    yield Command(f"{path.name}:{first + offset}", _uncommented(line[2:]))
            continue
        pending, start = "", first
        for offset, line in enumerate(lines):
            if not pending:
                start = first + offset
            pending += line.rstrip("\\").strip() + " "
            if line.endswith("\\"):
                continue
            command = _uncommented(pending)
            pending = ""
            if command:
                yield Command(f"{path.name}:{start}", command)


def _uncommented(line: str) -> str:
    """The command without its trailing comment: a ``#`` outside quotes, at a word's start."""
    quote = ""
    for index, char in enumerate(line):
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (index == 0 or line[index - 1].isspace()):
            return line[:index].strip()
    return line.strip()


def commands() -> list[Command]:
    return [command for path in DOCS for command in _commands_of(path)]


# In order: the first rule that matches a command handles it.
RULES = [
    # README's two first commands: CI runs them word for word in a new environment (.ci/run;
    # tests/test_readme.py checks that they agree).
    Rule(r"^pip install ", "skip", "CI runs it in a new environment (.ci/run)"),
    # the default pipeline and its forms
    Rule(r"^sublimate run train -p nodes=3 -p global-batch-size=96 -p epochs=\d+$", "run"),
    Rule(r"^sublimate run --parameter-file params\.yaml -o json$", "dry-run",
         "the pipeline the line above runs; tests/pipelines/cli/test_local.py runs parameter "
         "files and -o json"),
    Rule(r"^sublimate run argo/sublimate-train\.yaml$", "dry-run",
         "the manifest `sublimate run train` runs above (tests/pipelines/test_sublimate_train.py)"),
    Rule(r"^sublimate run --dry-run -p nodes=\d+$", "run"),
    Rule(r"^sublimate run --help$", "run"),
    Rule(r"^sublimate render$", "run"),
    Rule(r"^sublimate lint argo/$", "run"),
    # own code: each example is run end to end by tests/test_own_code.py (the CNN killed and
    # resumed, Keras with TensorFlow's minute of start-up) and tests/test_first_hour.py
    Rule(r"entrypoint=examples/plain_torchrun/train\.py", "dry-run", "tests/test_own_code.py"),
    Rule(r"entrypoint=examples\.cnn_bmuf\.train", "dry-run", "tests/test_own_code.py"),
    Rule(r"entrypoint=examples/keras_multiworker/train\.py", "dry-run",
         "tests/test_own_code.py, with the tensorflow extra"),
    # data: published to and staged from a real S3 server on loopback
    Rule(r"^sublimate data push digits s3://my-bucket/datasets/digits$", "run", needs="s3"),
    Rule(r"^sublimate data push \./my-dataset s3://my-bucket/datasets/mine$", "run",
         needs="s3"),
    Rule(r"^sublimate data ls s3://", "run", needs="s3"),
    Rule(r"^(AWS_ENDPOINT_URL_S3=\S+ )?sublimate run -p dataset=s3://my-bucket/datasets/digits$",
         "run", needs="s3"),
    Rule(r"^export AWS_ENDPOINT_URL_S3=", "run", needs="s3"),
    Rule(r"^sublimate data push digits file:///srv/", "run"),
    Rule(r"^sublimate data push py:mypkg", "parse",
         "a placeholder module and gs:// (gcsfs): `data push py:...` is "
         "tests/pipelines/cli/test_data.py's"),
    Rule(r"^sublimate run -p dataset=mnist1d -p global-batch-size=1024$", "dry-run",
         "mnist1d is generated by tests/components/data/test_datasets.py and learned by "
         "tests/components/launch/test_launcher.py"),
    Rule(r"^sublimate run -p dataset=py:sublimate\.components\.examples\.example_datasets:blobs$",
         "dry-run", "tests/components/steps/test_staging_local.py stages it"),
    Rule(r"^sublimate run -p algorithm=diloco -p nodes=2 -p fragments=2 -p fragment-delay=1 "
         r"-p outer-codec=int8$", "dry-run",
         "tests/components/launch/test_per_step_diloco.py runs it, and its resume bit for bit"),
    # sweeps: four trainings; tests/pipelines/test_sublimate_sweep.py runs sweeps end to end
    Rule(r"^sublimate run sweep ", "dry-run", "tests/pipelines/test_sublimate_sweep.py"),
    # MLflow (docs/mlflow.md): a tracking server; tests/test_mlflow_tracking.py starts one and
    # runs each of these against it
    Rule(r"^MLFLOW_TRACKING_URI=\S+ sublimate run$", "dry-run",
         "tests/test_mlflow_tracking.py (a default run logged to a real MLflow server)"),
    Rule(r"^sublimate run -p tracking=\S+ -p tracking-required=false$", "dry-run",
         "tests/test_mlflow_tracking.py (an optional server that is down: a warning)"),
    Rule(r"^MLFLOW_TRACKING_URI=\S+ sublimate run argo/sublimate-retrain\.yaml "
         r"-p registry=mlflow$", "dry-run",
         "tests/test_mlflow_tracking.py (two nights of retraining on MLflow's registry)"),
    Rule(r"^sublimate models \w+ --registry mlflow\b", "parse",
         "an MLflow server (tests/test_mlflow_tracking.py lists, rolls back, shows the history)"),
    # retraining and the registry
    Rule(r"^sublimate run argo/sublimate-retrain\.yaml -p epochs=\d+$", "run"),
    Rule(r"^SUBLIMATE_NOTIFY_URL=\S+ sublimate run argo/sublimate-retrain\.yaml$", "dry-run",
         "the pipeline the line above runs; a placeholder webhook "
         "(tests/pipelines/test_sublimate_retrain.py posts to a local one)"),
    Rule(r"^sublimate run argo/sublimate-train-nightly\.yaml$", "dry-run",
         "the nightly is sublimate-retrain, run above "
         "(tests/pipelines/test_sublimate_retrain.py checks that it is)"),
    Rule(r"^sublimate models (ls|show|history)\b", "run"),
    Rule(r"^sublimate models promote \S+ --reason", "run"),  # the champion already: a no-op
    Rule(r"^sublimate models rollback --reason", "run", exit=2, says="has no earlier champion"),
    # a cluster, an Argo Server, a registry of images
    Rule(r"^sublimate cron trigger ", "parse", "an Argo Server (tests/pipelines/cli/test_cron.py)"),
    Rule(r"^sublimate (install|submit)\b", "parse",
         "an Argo Server (tests/pipelines/test_cluster.py checks the requests on the wire)"),
    Rule(r"^sublimate server$", "parse",
         "a server that runs until stopped (tests/pipelines/server/test_server.py starts one)"),
    Rule(r"^sublimate list; sublimate get NAME; sublimate logs NAME --follow$", "skip",
         "an Argo Server (tests/pipelines/cli/test_logs.py)"),
    Rule(r"^kubectl ", "skip", "a Kubernetes cluster (tests/pipelines/test_cluster.py renders "
                                "and validates the install offline)"),
    Rule(r"^docker (build|push) ", "skip", "a docker engine and a registry"),
    Rule(r"^buildah push ", "skip", "a registry"),
    # the runtime image: .ci/run builds it and tests/test_image.py runs the default pipeline in
    # it with `sublimate run --containers` and images/prove.sh
    Rule(r"^images/(build|prove)\.sh$", "skip", ".ci/run and tests/test_image.py"),
    Rule(r"^sublimate run --containers$", "dry-run", "tests/test_image.py"),
    Rule(r"^SUBLIMATE_WEB_SHOTS=docs/images/web python -m pytest -q tests/pipelines/server/web$",
         "skip", "the suite runs these tests (the variable only keeps their screenshots)"),
    # a run of your own that failed at evaluate, retried
    Rule(r"^sublimate run -p eval-entrypoint=my_eval\.py$", "parse",
         "your evaluation, failing (tests/pipelines/cli/test_local.py runs one and retries it)"),
    Rule(r"^sublimate retry \S+$", "parse",
         "a failed run of your own (tests/pipelines/cli/test_local.py)"),
    # a suspended local run of your own
    Rule(r"^sublimate (resume|stop) RUN\b", "parse",
         "a run waiting at a suspend node (tests/pipelines/runner/templates/test_suspend.py "
         "resumes and stops such runs)"),
    Rule(r"^sublimate run --containers my-flow\.yaml$", "parse",
         "your manifest (tests/pipelines/runner/pods/images/test_images.py runs manifests of "
         "several images)"),
    # a cluster on one machine (root)
    # per-step's chaos (before the generic local_netns rule, which would run it)
    Rule(r"^sublimate run -p scheduler=local_netns -p nodes=4 .*chaos-mtbf=", "dry-run",
         "tests/components/launch/test_per_step_recovery.py (five chaos kills on local_netns)"),
    Rule(r"^sublimate run -p scheduler=local_netns ", "run", needs="root"),
    # per-step fault tolerance (docs/fault-tolerance.md)
    Rule(r"^sublimate run$", "dry-run",
         "the default pipeline (tests/pipelines/cli/test_local.py runs it; .ci/run, the README's)"),
    Rule(r"^sublimate run -p nodes=3:4$", "dry-run",
         "tests/components/launch/test_per_step_recovery.py (a minimum of nodes, kept)"),
    Rule(r"^sublimate run -p commit-every=1$", "dry-run",
         "tests/components/launch/test_per_step_recovery.py (a node killed in the all-reduce, "
         "a step a transaction)"),
    Rule(r"^sublimate run -p recovery=restart$", "dry-run",
         "tests/pipelines/cli/test_local.py (a killed worker restarted from its checkpoint)"),
    Rule(r"^sublimate run --env SUBLIMATE_FAIL_AT_STEP=\d+ --env SUBLIMATE_FAIL_RANK=\d+ "
         r"-p recovery=restart$", "dry-run",
         "tests/pipelines/cli/test_local.py (the same fault passed with --env, the worker "
         "restarted from its checkpoint)"),
    Rule(r"^sublimate fault ", "parse",
         "a running local_netns job (tests/components/launch/test_netns_training.py acts on "
         "one with each)"),
    # monitoring
    Rule(r"^tensorboard ", "skip", "a server that runs until stopped; tensorboard is optional"),
    Rule(r"^sublimate report ", "parse",
         "names of runs of your own (tests/components/monitoring/test_run_report.py runs each "
         "form)"),
    # the studies of docs/results.md: minutes each, root; each one's --smoke runs in seconds
    Rule(r"^python experiments/", "skip",
         "a study of minutes (experiments/; tests/test_benchmarks.py runs each with --smoke)"),
]


def rule_of(command: Command) -> Rule | None:
    return next((rule for rule in RULES if re.search(rule.pattern, command.text)), None)


def test_every_command_has_a_rule() -> None:
    found = commands()
    assert len(found) > 40, "the docs' command blocks were not found"
    unruled = [f"{command.where}: {command.text}" for command in found if not rule_of(command)]
    assert unruled == [], "run these in this test, or add a rule saying why not:\n" + \
        "\n".join(unruled)
    used = {id(rule_of(command)) for command in found}
    stale = [rule.pattern for rule in RULES if id(rule) not in used]
    assert stale == [], f"rules that match no command any more: {stale}"
    for rule in RULES:
        assert rule.how in ("run", "dry-run", "parse", "skip")
        assert rule.how == "run" or rule.why, f"{rule.pattern}: say why it is not run"


def test_commands_that_need_a_server_or_a_job_parse() -> None:
    """What is not run here is still sublimate's syntax: its commands and flags exist."""
    from sublimate.pipelines.cli import build_parser

    parser = build_parser()
    for command in commands():
        rule = rule_of(command)
        if rule is None or rule.how != "parse":
            continue
        for part in command.text.split(";"):
            words = shlex.split(part)
            try:
                parser.parse_args(words[1:])
            except SystemExit as refused:
                pytest.fail(f"{command.where}: {command.text}: refused ({refused.code})")


# --- running them -----------------------------------------------------------------------------

def as_run(command: Command, rule: Rule, context: dict[str, str]) -> str:
    """The command as this test runs it: the substitutions, each for one reason."""
    text = command.text
    if rule.how == "dry-run":
        return re.sub(r"\bsublimate run\b", "sublimate run --dry-run", text, count=1)
    if re.search(r"\bsublimate run\b", text) and "--help" not in text \
            and "--dry-run" not in text:
        # one epoch, not the 5 to 30 the docs show for a result worth reading
        text = re.sub(r"-p epochs=\d+", "-p epochs=1", text)
        if "epochs=" not in text:
            text += " -p epochs=1"
    # the docs' placeholders: the test's S3 server, a folder of this test, a published version
    text = text.replace("http://127.0.0.1:8333", context.get("endpoint", "http://127.0.0.1:8333"))
    text = text.replace("AWS_ACCESS_KEY_ID=...", f"AWS_ACCESS_KEY_ID={context.get('key', '')}")
    text = text.replace("AWS_SECRET_ACCESS_KEY=...",
                        f"AWS_SECRET_ACCESS_KEY={context.get('secret', '')}")
    text = text.replace("file:///srv/", f"file://{context['folder']}/srv/")
    if "version" in context:
        text = re.sub(r"\bVERSION\b|\b\d{8}T\d{6}Z-[0-9a-f]{8}\b", context["version"], text)
    return text


def user_folder(root: Path) -> Path:
    """A folder laid out as the docs assume: the checkout's examples/ and argo/ (copied: render
    writes there), and the files the docs name."""
    from sublimate.components import Split, write_dataset

    folder = root / "checkout"
    folder.mkdir()
    (folder / "examples").symlink_to(REPO / "examples")
    shutil.copytree(REPO / "argo", folder / "argo")
    (folder / "params.yaml").write_text("nodes: 2\nepochs: 1\n")
    rng = np.random.default_rng(0)
    write_dataset(folder / "my-dataset", {
        split: Split(rng.normal(size=(size, 4)).astype(np.float32), rng.integers(0, 2, size))
        for split, size in (("train", 64), ("test", 16))}, name="my-dataset", num_classes=2)
    return folder


def run_group(needs: str, root: Path, context: dict[str, str]) -> list[str]:
    """Run the group's commands in the docs' order, in one folder and home; the commands run."""
    folder, home = context["folder"], root / "home"
    env = {**os.environ, "SUBLIMATE_HOME": str(home), "PATH": _path_with_sublimate()}
    env.update({key: value for key, value in context.items() if key.startswith("AWS_")})
    done: list[str] = []
    for command in commands():
        rule = rule_of(command)
        if rule is None or rule.how not in ("run", "dry-run") or rule.needs != needs:
            continue
        if command.text.startswith("sublimate models") and "version" not in context:
            context["version"] = _published_version(home)
        text = as_run(command, rule, context)
        # the same command in two pages (one with the variables the group's env holds anyway)
        if re.sub(r"^(export )?([A-Z_0-9]+=\S+ )+", "", text) in done:
            continue
        result = subprocess.run(["bash", "-c", text], cwd=folder, env=env, capture_output=True,
                                text=True, timeout=400, check=False)
        output = result.stdout + result.stderr
        expected = rule.exit if rule.how == "run" else 0
        assert result.returncode == expected, f"{command.where}: {text}\n{output[-3000:]}"
        assert not [sign for sign in CRASH_SIGNS if sign in output], \
            f"{command.where}: {text}\n{output[-3000:]}"
        assert rule.says in output, f"{command.where}: {text}\n{output[-3000:]}"
        done.append(re.sub(r"^(export )?([A-Z_0-9]+=\S+ )+", "", text))
    return done


def _path_with_sublimate() -> str:
    """PATH with this interpreter's scripts first: `sublimate` is the one under test."""
    return os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])


def _published_version(home: Path) -> str:
    from sublimate.components import Registry

    versions = Registry(home / "volumes" / "sublimate-data" / "registry").versions()
    assert versions, "the retraining above published no version"
    return versions[-1].id


def test_the_docs_commands_run(tmp_path: Path) -> None:
    context = {"folder": str(user_folder(tmp_path))}
    done = run_group("", tmp_path, context)
    assert any("sublimate models rollback" in text for text in done)
    assert (Path(context["folder"]) / "srv" / "datasets" / "digits" / "metadata.json").is_file()


def test_the_docs_commands_on_object_storage_run(tmp_path: Path, s3_env) -> None:
    s3_env.filesystem().mkdir("my-bucket")  # the docs' bucket: a user has theirs
    context = {"folder": str(user_folder(tmp_path)), "endpoint": s3_env.endpoint,
               **s3_env.env()}
    context["key"], context["secret"] = context["AWS_ACCESS_KEY_ID"], \
        context["AWS_SECRET_ACCESS_KEY"]
    done = run_group("s3", tmp_path, context)
    assert any("sublimate run -p dataset=s3://" in text for text in done)


def test_the_docs_commands_on_a_cluster_on_one_machine_run(tmp_path: Path, netns: None) -> None:
    done = run_group("root", tmp_path, {"folder": str(user_folder(tmp_path))})
    assert any("scheduler=local_netns" in text for text in done)
