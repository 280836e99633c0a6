"""The ``register-model`` step of retraining: publish the challenger; promote it on the gate's word.

Every challenger becomes an immutable version in the registry, winner or not, so that its lineage
(what data, which settings, which code, which workflow, what it scored) is there when someone
asks why the champion is what it is, or wants to roll forward to a model that narrowly lost.
The champion pointer moves only when the gate's ``promote`` is true, with the gate's reason.
Like every step it is safe to re-run: a retried attempt finds the version its workflow already
published of the same files (:func:`published_before`) and promotes that one (promoting the
champion again writes nothing), instead of publishing a second copy.

The version holds the run folder's results (the model, ``metrics.json``, the training summary and
whatever a user's code wrote beside them), not its bookkeeping: checkpoints, per-epoch logs,
heartbeats, TensorBoard files, worker logs and the report stay on the volume.

(``sublimate.components.steps.publish`` is something else: ``sublimate data push``, for datasets.)
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sublimate.components.base import run_files
from sublimate.components.base import settings as declared
from sublimate.components.base.disk_full import explain
from sublimate.components.base.durable_files import write_json
from sublimate.components.base.termination import OneLineParser, disk_full_in_one_line, fail
from sublimate.components.steps import gate

if TYPE_CHECKING:
    from sublimate.components.model.registry import ModelVersion, Registry

STEP = "register-model"
RECORD = "registered.json"  # what was published, in the run's folder (read by notify)
# The run folder's bookkeeping, kept out of a published version.
NOT_PUBLISHED = frozenset({
    run_files.CHECKPOINTS, run_files.EPOCH_LOGS, run_files.ENDPOINTS, run_files.PROGRESS,
    run_files.TENSORBOARD, run_files.LOGS, run_files.REPORT, run_files.LAUNCHER_LOCK,
    gate.RECORD, RECORD,
})
GIT_COMMIT_ENV = "SUBLIMATE_GIT_COMMIT"  # set by an image build that has no .git to ask


def _sha256(path: Path) -> str | None:
    if not path.is_file():
        return None
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def dataset_lineage(dataset: str, data_dir: Path) -> dict[str, Any]:
    """Which data trained it: the URL as given (without credentials), and digests of what was
    staged. The staging manifest exists for data fetched from a path or URL; ``metadata.json``
    (which holds every shard's SHA-256) pins the content of any dataset, built-in ones too."""
    from sublimate.components.data.datasets import METADATA_FILE
    from sublimate.components.data.object_store import public_url
    from sublimate.components.steps.stage_data import MANIFEST_FILE

    lineage: dict[str, Any] = {
        "url": public_url(dataset), "staged_dir": str(data_dir),
        "manifest_sha256": _sha256(data_dir / MANIFEST_FILE),
        "metadata_sha256": _sha256(data_dir / METADATA_FILE),
    }
    try:
        metadata = json.loads((data_dir / METADATA_FILE).read_text())
        lineage["name"] = metadata.get("name")
        lineage["examples"] = {split: info.get("examples")
                               for split, info in metadata.get("splits", {}).items()}
    except (OSError, ValueError, AttributeError):
        pass  # the digests above are what identifies the data; the rest is for reading
    return lineage


def code_lineage() -> dict[str, Any]:
    """The package's version and, where it can be known, the git commit it was built from."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        package = version("sublimate")
    except PackageNotFoundError:
        package = None
    commit = os.environ.get(GIT_COMMIT_ENV) or None
    if commit is None:
        source = Path(__file__).resolve().parent
        try:
            completed = subprocess.run(["git", "-C", str(source), "rev-parse", "HEAD"],
                                       capture_output=True, text=True, timeout=10, check=False)
            if completed.returncode == 0:
                commit = completed.stdout.strip() or None
        except (OSError, subprocess.TimeoutExpired):
            pass  # no git in the image: the package version has to do
    return {"package": "sublimate", "version": package, "git_commit": commit}


def _iso(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _typed(setting: Any, value: Any) -> Any:
    """A setting's value as JSON keeps it: a number, a boolean, a string or null; anything
    else (an elastic node range) as the text `-p` takes."""
    if value is None or type(value) in (bool, int, float, str):
        return value
    if isinstance(value, int) and getattr(value, "minimum", value) == value:
        return int(value)  # a fixed node count
    return setting.text(value)


def lineage(args: Any) -> dict[str, Any]:
    """Everything that says where this model came from."""
    chosen = [*declared.settings(step="train"), *declared.settings(step="evaluate")]
    settings = {s.name: _typed(s, getattr(args, s.attribute)) for s in chosen if s.in_pipeline}
    summary = _read_json(args.model_dir / run_files.SUMMARY)
    metrics = _read_json(args.model_dir / run_files.EVALUATION)
    decision = gate.read_record(args.model_dir / gate.RECORD, args.workflow_uid) or {}
    return {
        "dataset": dataset_lineage(args.dataset, args.data_dir),
        # typed as declared (numbers, booleans, null for auto); versions published before
        # hold texts, which read as they did
        "settings": settings,
        "metrics": metrics,
        "metric": {"name": args.metric, "value": metrics.get(args.metric),
                   "goal": decision.get("goal")},
        "gate": {"promote": args.promote, "reason": args.reason,
                 "champion": decision.get("champion") or None,
                 "champion_metric": decision.get("champion_metric")},
        "workflow": {"name": args.workflow_name, "uid": args.workflow_uid},
        # the training workers' image; on an install the steps run the same one (argo/defaults)
        "image": settings.get("image"),
        "code": code_lineage(),
        "run_dir": str(args.model_dir),
        "times": {
            "workflow_created": args.workflow_created or None,
            "trained": _iso(_mtime(args.model_dir / run_files.MODEL)),
            "train_seconds": summary.get("train_seconds"),
            "evaluated": _iso(_mtime(args.model_dir / run_files.EVALUATION)),
            "published": _iso(time.time()),
        },
    }


def collect_files(model_dir: Path, into: Path) -> list[str]:
    """Copy the run's results (not its bookkeeping) into ``into``; the names copied."""
    names = []
    for path in sorted(model_dir.iterdir()):
        # (*.lock: a writer's lock file beside what it guards, e.g. the metrics endpoints)
        if path.name in NOT_PUBLISHED or path.name.startswith(".") or path.suffix == ".lock":
            continue
        if path.is_dir():
            shutil.copytree(path, into / path.name, symlinks=False)
        elif path.is_file():
            shutil.copy2(path, into / path.name)
        else:
            continue
        names.append(path.name)
    return names


def published_before(registry: Registry, workflow_uid: str, files: Path) -> ModelVersion | None:
    """The version this workflow already published of exactly these files, if any.

    A step is retried (Argo's retryStrategy, ``argo retry``) when it failed after its publish
    (a promotion that failed, a lost pod): publishing again would leave a second version of
    one model. A version is this workflow's when its lineage carries the workflow's uid, and
    the same model when every file has the size and SHA-256 the version recorded (a workflow
    retried after its training ran again publishes the new model).
    """
    if not workflow_uid:  # run by hand, without a workflow to tell attempts apart
        return None
    digests = {path.relative_to(files).as_posix(): {"size": path.stat().st_size,
                                                    "sha256": _sha256(path)}
               for path in sorted(files.rglob("*")) if path.is_file()}
    for version in reversed(registry.versions()):  # the newest first
        workflow = version.lineage.get("workflow")
        if isinstance(workflow, dict) and workflow.get("uid") == workflow_uid \
                and version.files == digests:
            return version
    return None


def register(args: Any) -> dict[str, Any]:
    """Publish (once per workflow: a retried step reuses its version), then promote when the
    gate said so; the record of what was done."""
    from sublimate.components.data.object_store import public_url
    from sublimate.components.model.mlflow_registry import open_registry
    from sublimate.components.model.registry import ChampionMoved

    if not (args.model_dir / run_files.MODEL).is_file() and not \
            (args.model_dir / run_files.EVALUATION).is_file():
        raise ValueError(f"model-dir: {args.model_dir} holds neither {run_files.MODEL} nor "
                         f"{run_files.EVALUATION}; did train and evaluate succeed?")
    registry = open_registry(args.registry)  # a folder, an fsspec URL or mlflow[:NAME]
    with tempfile.TemporaryDirectory(prefix="sublimate-publish-") as work:
        files = Path(work) / "files"
        files.mkdir()
        names = collect_files(args.model_dir, files)
        version = published_before(registry, args.workflow_uid, files)
        if version is not None:
            print(f"{STEP}: {version.id} in {public_url(args.registry)} is this model, "
                  "published by an earlier attempt of this workflow: not published again",
                  flush=True)
        else:
            version = registry.publish(files, lineage(args))
            print(f"{STEP}: published {version.id} to {public_url(args.registry)} "
                  f"({', '.join(names)})", flush=True)
    promoted = args.promote
    if promoted:
        try:
            # Only over the champion the gate judged against (compare-and-set): a concurrent
            # pipeline may have promoted a better model since.
            registry.promote(version.id, args.reason, expect=args.gate_champion or None,
                             by=f"workflow/{args.workflow_name}" if args.workflow_name else None)
            print(f"{STEP}: {version.id} is the champion now: {args.reason}", flush=True)
        except ChampionMoved as moved:
            promoted = False
            print(f"{STEP}: {moved}; {version.id} stays a version (sublimate models promote "
                  "decides by hand)", flush=True)
    else:
        champion = registry.champion()
        print(f"{STEP}: the champion stays {champion.id if champion else '(none)'}: "
              f"{args.reason}", flush=True)
    champion = registry.champion()
    return {"workflow_uid": args.workflow_uid, "version": version.id,
            "promoted": promoted, "champion": champion.id if champion else "",
            "registry": public_url(args.registry)}


def template_settings() -> list[declared.Setting]:
    """The settings this step takes as inputs: every one a pipeline sets, for the lineage, and
    the registry (not the gate's own margin and goal: the gate's reason says what they did)."""
    return [s for step in ("train", "evaluate", "gate") for s in declared.settings(step=step)
            if s.in_pipeline and s.name not in ("promote-margin", "metric-goal")]


def _boolean(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered not in ("true", "false"):
        raise ValueError(f"'{text}' is not true or false")
    return lowered == "true"


def parse_args(argv: list[str] | None) -> Any:
    parser = OneLineParser(prog=STEP, description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, required=True, help="the challenger's run folder")
    parser.add_argument("--data-dir", type=Path, required=True, help="staged dataset folder")
    parser.add_argument("--dataset", required=True, help="the dataset as the pipeline was given it")
    parser.add_argument("--promote", type=_boolean, required=True, help="the gate's decision")
    parser.add_argument("--reason", required=True, help="the gate's reason")
    parser.add_argument("--gate-champion", default="",
                        help="the champion the gate compared against (empty: none)")
    parser.add_argument("--workflow-name", default="")
    parser.add_argument("--workflow-uid", default="")
    parser.add_argument("--workflow-created", default="", help="the workflow's creation time")
    # Every setting, typed and checked by its one declaration, kept as the version's lineage.
    declared.add_arguments(parser, template_settings())
    for output in ("version", "champion"):
        parser.add_argument(f"--{output}-path", type=Path, help=f"file to write {output} to")
    return parser.parse_args(argv)


@disk_full_in_one_line(STEP)
def main(argv: list[str] | None = None) -> int:
    from sublimate.components.data.object_store import redact
    from sublimate.components.model.registry import RegistryError

    args = parse_args(argv)
    try:
        record = register(args)
    except (RegistryError, ValueError, OSError) as error:
        # a bare OSError of a full disk: which disk, and what (the registry says its own)
        full = explain(error) if isinstance(error, OSError) else None
        return fail(STEP, redact(full or str(error)))
    write_json(record, args.model_dir / RECORD)  # read by notify
    for path, value in ((args.version_path, record["version"]),
                        (args.champion_path, record["champion"])):
        if path:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(value)
    return 0



def template(name: str = STEP, **step_options: object):
    """The ``register-model`` step: inputs ``model-dir``, ``data-dir``, ``dataset``, ``promote``,
    ``reason``, ``workflow-name``, ``workflow-uid``, ``workflow-created`` and every pipeline
    setting; outputs ``version`` (the published version) and ``champion``."""
    from hera.workflows import Parameter

    from sublimate.components.base.mlflow_connection import credentials_env as mlflow_env
    from sublimate.components.base.runtime import python_step

    own = {s.name: s for s in template_settings()}
    step = python_step(
        name, "sublimate.components.steps.register_model",
        inputs={"model-dir": "--model-dir", "data-dir": "--data-dir", "dataset": "--dataset",
                "promote": "--promote", "reason": "--reason", "gate-champion": "--gate-champion",
                "workflow-name": "--workflow-name",
                "workflow-uid": "--workflow-uid", "workflow-created": "--workflow-created",
                **{setting: f"--{setting}" for setting in own}},
        outputs={"version": "--version-path", "champion": "--champion-path"},
        env=mlflow_env(),  # registry mlflow's server: a Secret, optional
        **step_options,  # type: ignore[arg-type]
    )
    # A setting's input defaults to its declared default, so a pipeline that passes only some
    # of them still passes Argo's argument check (as the train step's inputs do).
    step.inputs = [Parameter(name=p.name, default=own[p.name].default_text())
                   if p.name in own else p for p in step.inputs]
    return step


if __name__ == "__main__":
    sys.exit(main())
