"""`sublimate models ...`: the model registry's versions and its champion.

The registry is a folder or an fsspec URL (docs/registry.md): ``--registry URL``, else
``$SUBLIMATE_REGISTRY``, else the local shared volume's ``registry/`` folder, the one that a
local pipeline run writes as ``/mnt/sublimate/registry``. S3 credentials and endpoint come from
the standard AWS variables and profiles, as for ``sublimate data``. ``--registry mlflow`` (or
``mlflow:NAME``) is MLflow's Model Registry on ``$MLFLOW_TRACKING_URI`` (docs/mlflow.md).
"""

from __future__ import annotations

import argparse
import json
import os
from typing import TYPE_CHECKING, Any

from .common import UsageError, default_home

if TYPE_CHECKING:
    from sublimate.components.model.registry import ModelVersion, Registry

REGISTRY_ENV = "SUBLIMATE_REGISTRY"
CHAMPION = "champion"  # what `show` also accepts for VERSION
# Metrics that describe the evaluation run rather than the model: left out of the default
# METRICS column when a version names no chosen metric.
_BOOKKEEPING = {"seconds", "examples_per_second", "examples"}


def default_registry() -> str:
    """The registry the commands use without ``--registry``: ``$SUBLIMATE_REGISTRY``, else the
    local home's shared volume (``$SUBLIMATE_HOME/volumes/sublimate-data/registry``)."""
    from sublimate.components.base.runtime import DEFAULT_CLAIM

    return os.environ.get(REGISTRY_ENV) or str(
        default_home() / "volumes" / DEFAULT_CLAIM / "registry")


def add_models_commands(subparsers: argparse._SubParsersAction) -> None:
    """Register ``models ls|show|promote|rollback|history`` on the main CLI's subparsers."""
    models = subparsers.add_parser(
        "models", help="list model versions and promote or roll back the champion",
        description="The model registry: immutable model versions with their lineage, and the "
                    "champion that serving and the next retraining's gate use.")
    commands = models.add_subparsers(dest="models_command", required=True, metavar="COMMAND")

    ls = commands.add_parser("ls", help="list the versions, oldest first (* marks the champion)",
                             description="List the registry's complete versions, oldest first, "
                                         "with their metrics; * marks the champion.")
    ls.add_argument("-o", "--output", choices=["table", "wide", "json"], default="table",
                    help="wide adds workflow, dataset, size and files; json is for scripts")
    ls.add_argument("--metric", action="append", metavar="NAME",
                    help="the metric(s) to show (repeatable; default: the metric each version "
                         "was judged on, else all)")
    _add_registry_flag(ls)
    ls.set_defaults(handler=command_ls)

    show = commands.add_parser("show", help="show one version: metrics, files, lineage",
                               description="Show a version's model.json: its lineage, metrics "
                                           "and files with their sizes and SHA-256.")
    show.add_argument("version", metavar="VERSION",
                      help="a version id, a unique prefix of one, or 'champion'")
    show.add_argument("-o", "--output", choices=["table", "json"], default="table")
    _add_registry_flag(show)
    show.set_defaults(handler=command_show)

    promote = commands.add_parser("promote", help="make a version the champion",
                                  description="Make VERSION the champion (recorded in the "
                                              "champion log with the reason).")
    promote.add_argument("version", metavar="VERSION", help="a version id or a unique prefix")
    promote.add_argument("--reason", default="promoted by hand", help="why, for the history")
    _add_registry_flag(promote)
    promote.set_defaults(handler=command_promote)

    rollback = commands.add_parser("rollback", help="make the previous champion the champion",
                                   description="Undo the last promotion: the champion before "
                                               "the current one becomes the champion again.")
    rollback.add_argument("--reason", default="rolled back by hand", help="why, for the history")
    _add_registry_flag(rollback)
    rollback.set_defaults(handler=command_rollback)

    history = commands.add_parser("history", help="every champion change, oldest first",
                                  description="The champion log: every promotion and rollback "
                                              "with its reason, time and author.")
    history.add_argument("-o", "--output", choices=["table", "json"], default="table")
    _add_registry_flag(history)
    history.set_defaults(handler=command_history)


def _add_registry_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--registry", metavar="URL",
                        help=f"folder or fsspec URL of the registry, or mlflow[:NAME] for "
                             f"MLflow's on $MLFLOW_TRACKING_URI (default: ${REGISTRY_ENV}, "
                             "else $SUBLIMATE_HOME/volumes/sublimate-data/registry)")


# The handlers import the registry (fsspec, numpy via object_store) themselves: registering
# these commands must not slow down every other `sublimate` command.


def _open(args: argparse.Namespace) -> Registry:
    from sublimate.components.model.mlflow_registry import MlflowRegistry, is_mlflow
    from sublimate.components.model.registry import Registry

    location = args.registry or default_registry()
    if is_mlflow(location):  # MLflow's Model Registry, the champion its alias
        return MlflowRegistry(location.partition(":")[2])  # type: ignore[return-value]
    return Registry(location)


def _refuse(error: Exception) -> UsageError:
    from sublimate.components.data import object_store

    return UsageError(object_store.redact(str(error)))


def _resolve(registry: Registry, reference: str, allow_champion: bool = False) -> ModelVersion:
    """The version named by a full id, a unique prefix of one, or (if allowed) 'champion'."""
    from sublimate.components.model.registry import version_started

    if allow_champion and reference == CHAMPION:
        champion = registry.champion()
        if champion is None:
            raise UsageError(f"registry '{registry.url}' has no champion yet; promote a version "
                             "first (sublimate models promote VERSION)")
        return champion
    if version_started(reference) is not None:
        return registry.get(reference)
    versions = registry.versions() if reference else []
    # an id in full first: MLflow's versions are numbers, and "1" begins "10" too
    matches = [v for v in versions if v.id == reference] \
        or [v for v in versions if v.id.startswith(reference)]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise UsageError(f"registry '{registry.url}' has no version '{reference}' (`sublimate "
                         f"models ls --registry {registry.url}` lists them)")
    raise UsageError(f"'{reference}' matches {len(matches)} versions in registry "
                     f"'{registry.url}' ({', '.join(v.id for v in matches[:3])}...); give "
                     "more of the id")


def _chosen(version: ModelVersion, wanted: list[str] | None) -> dict[str, Any]:
    """The metrics to show for ``version``: those asked for, else the one it was judged on
    (its lineage's ``metric``), else all but the evaluation's bookkeeping."""
    names = wanted
    if not names:
        judged = version.lineage.get("metric")
        names = [judged] if isinstance(judged, str) and judged in version.metrics else None
    if names:
        return {name: version.metrics.get(name, "") for name in names}
    return {k: v for k, v in version.metrics.items()
            if k not in _BOOKKEEPING and isinstance(v, int | float) and not isinstance(v, bool)}


def _metric_text(metrics: dict[str, Any]) -> str:
    def number(value: Any) -> str:
        return f"{value:.6g}" if isinstance(value, float) else str(value)

    return " ".join(f"{k}={number(v)}" for k, v in metrics.items()) or "-"


def _created(version: ModelVersion) -> str:
    return version.created[:19].replace("T", " ")


def _lineage_text(lineage: dict[str, Any], *keys: str) -> str:
    """The first of ``keys`` in the lineage (a name inside a dict value counts)."""
    for key in keys:
        value = lineage.get(key)
        if isinstance(value, dict):
            value = value.get("name") or value.get("url") or value.get("digest")
        if value:
            return str(value)
    return "-"


def _size_text(size: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f}{unit}" if unit == "B" else f"{size:.1f}{unit}"
        size /= 1024  # type: ignore[assignment]
    return str(size)


def command_ls(args: argparse.Namespace) -> int:
    from sublimate.components.model.registry import RegistryError

    try:
        registry = _open(args)
        versions = registry.versions()
        champion = registry.champion()
    except RegistryError as error:
        raise _refuse(error) from error
    champion_id = champion.id if champion else None
    if args.output == "json":
        print(json.dumps([{**_as_dict(v), "champion": v.id == champion_id} for v in versions],
                         indent=2, sort_keys=True))
        return 0
    if not versions:
        print(f"no versions in registry '{registry.url}' (a retraining run publishes them)")
        return 0
    rows = []
    for v in versions:
        row = ["*" if v.id == champion_id else " ", v.id, _created(v),
               _metric_text(_chosen(v, args.metric))]
        if args.output == "wide":
            row += [_lineage_text(v.lineage, "workflow", "workflow_name"),
                    _lineage_text(v.lineage, "dataset", "dataset_url"),
                    _size_text(v.size), str(len(v.files))]
        rows.append(row)
    header = [" ", "VERSION", "CREATED", "METRICS"]
    if args.output == "wide":
        header += ["WORKFLOW", "DATASET", "SIZE", "FILES"]
    _table([header, *rows])
    return 0


def _table(rows: list[list[str]]) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
              .rstrip())


def _as_dict(version: ModelVersion) -> dict[str, Any]:
    return {"id": version.id, "created": version.created, "url": version.url,
            "metrics": version.metrics, "lineage": version.lineage, "files": version.files}


def command_show(args: argparse.Namespace) -> int:
    from sublimate.components.model.registry import RegistryError

    try:
        registry = _open(args)
        version = _resolve(registry, args.version, allow_champion=True)
        champion = registry.champion()
    except RegistryError as error:
        raise _refuse(error) from error
    is_champion = champion is not None and champion.id == version.id
    if args.output == "json":
        print(json.dumps({**_as_dict(version), "champion": is_champion}, indent=2,
                         sort_keys=True))
        return 0
    print(f"version:  {version.id}{'  (champion)' if is_champion else ''}")
    print(f"created:  {version.created}")
    print(f"url:      {version.url}")
    print(f"metrics:  {_metric_text(version.metrics)}")
    print("files:")
    for name, info in sorted(version.files.items()):
        print(f"  {info['size']:>12}  {info['sha256'][:16]}  {name}")
    print("lineage:")
    for line in json.dumps(version.lineage, indent=2, sort_keys=True).splitlines():
        print(f"  {line}")
    return 0


def command_promote(args: argparse.Namespace) -> int:
    from sublimate.components.model.registry import RegistryError

    try:
        registry = _open(args)
        version = _resolve(registry, args.version)
        before = registry.champion()
        registry.promote(version.id, args.reason)
    except RegistryError as error:
        raise _refuse(error) from error
    if before is not None and before.id == version.id:
        print(f"{version.id} is already the champion of {registry.url}")
    else:
        was = f" (was {before.id})" if before else ""
        print(f"{version.id} is now the champion of {registry.url}{was}")
    return 0


def command_rollback(args: argparse.Namespace) -> int:
    from sublimate.components.model.registry import RegistryError

    try:
        registry = _open(args)
        before = registry.champion()
        version = registry.rollback(args.reason)
    except RegistryError as error:
        raise _refuse(error) from error
    was = f" (was {before.id})" if before else ""
    print(f"{version.id} is the champion of {registry.url} again{was}")
    return 0


def command_history(args: argparse.Namespace) -> int:
    from sublimate.components.model.registry import RegistryError

    try:
        entries = _open(args).history()
    except RegistryError as error:
        raise _refuse(error) from error
    if args.output == "json":
        print(json.dumps(entries, indent=2, sort_keys=True))
        return 0
    rows = [["#", "TIME", "ACTION", "VERSION", "PREVIOUS", "BY", "REASON"]]
    rows += [[str(e["seq"]), e["time"][:19].replace("T", " "), str(e.get("action", "")),
              e["version"], e["previous"] or "-", str(e["by"]), str(e["reason"])]
             for e in entries]
    _table(rows)
    return 0
