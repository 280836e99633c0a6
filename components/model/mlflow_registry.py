"""The model registry on MLflow's Model Registry (``registry=mlflow`` or ``mlflow:NAME``).

The same operations as :class:`sublimate.components.model.registry.Registry`, so that the gate,
the register-model step and ``sublimate models`` work unchanged on either:

- a **version** is a version of the registered model ``NAME`` (default ``sublimate``), its id
  MLflow's version number. Its files are artifacts (``registered-model/``) of the training run
  when the train step tracked it (``mlflow-run.json`` among the files), else of a run of their
  own; its lineage is in its tags (``sublimate.lineage.<path>``, each a JSON value), its files'
  sizes and SHA-256 in ``sublimate.files`` (:meth:`MlflowRegistry.download` checks them). A new
  version also gets the alias ``challenger``.
- the **champion** is the version under the alias ``champion``; promotion and rollback move it
  with one request (MLflow's ``set_registered_model_alias``), so a reader sees the old champion
  or the new one, never neither.
- the **history** of champion changes, which MLflow does not keep, is one tag of the registered
  model per change (``sublimate.champion.<seq>``, written before the alias moves), read as the
  folder registry's champion log reads.

What MLflow cannot do: a compare-and-set of an alias. ``promote(expect=...)`` reads the alias,
and refuses when it is not the champion the gate judged, right before it moves it; two
promotions within that moment both succeed, the later one winning (the folder registry's
create-exclusive log entries close that window). The server is ``$MLFLOW_TRACKING_URI`` (on a
cluster, the Secret ``sublimate-mlflow``, with its credentials).
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sublimate.components.base.mlflow_connection import (
    TrackingError,
    connected,
    public_uri,
    short_error,
    tracking_uri,
)
from sublimate.components.base.run_files import MLFLOW_RUN
from sublimate.components.model.registry import (
    _ANY_CHAMPION,
    NOTHING_TO_ROLL_BACK,
    ChampionMoved,
    ModelVersion,
    RegistryError,
    default_actor,
    nothing_before,
)

SCHEME = "mlflow"
DEFAULT_MODEL = "sublimate"
CHAMPION_ALIAS = "champion"
CHALLENGER_ALIAS = "challenger"
FILES_FOLDER = "registered-model"  # the version's files, as artifacts of a run
LINEAGE_TAG = "sublimate.lineage."
FILES_TAG = "sublimate.files"
HISTORY_TAG = "sublimate.champion."
PUBLISH_EXPERIMENT = "sublimate"


def is_mlflow(location: str) -> bool:
    """Whether a ``registry`` setting names MLflow's registry: ``mlflow`` or ``mlflow:NAME``."""
    return location == SCHEME or (location.startswith(f"{SCHEME}:")
                                  and "://" not in location)


def _flatten(value: Any, prefix: str = "") -> dict[str, str]:
    """A nested record as ``{dotted.path: JSON text}``: MLflow's tags are flat strings."""
    if isinstance(value, dict) and value:
        flat: dict[str, str] = {}
        for key, item in value.items():
            flat.update(_flatten(item, f"{prefix}{key}."))
        return flat
    return {prefix.rstrip("."): json.dumps(value, default=str)}


def _unflatten(flat: dict[str, str]) -> dict[str, Any]:
    record: dict[str, Any] = {}
    for path, text in sorted(flat.items()):
        node = record
        *parents, leaf = path.split(".")
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                break
        else:
            try:
                node[leaf] = json.loads(text)
            except ValueError:
                node[leaf] = text
    return record


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class MlflowRegistry:
    """MLflow's Model Registry for the registered model ``model`` on the server ``uri``
    (default: ``$MLFLOW_TRACKING_URI``)."""

    def __init__(self, model: str = DEFAULT_MODEL, uri: str | None = None) -> None:
        self.model = model or DEFAULT_MODEL
        self.url = f"{SCHEME}:{self.model}"
        found = uri or tracking_uri("")
        if found is None:
            raise RegistryError(f"model registry '{self.url}': no MLflow server: set "
                                "MLFLOW_TRACKING_URI (on a cluster, the key of the Secret "
                                "sublimate-mlflow)")
        self.uri = found
        try:
            self._mlflow = connected(found)
        except TrackingError as error:
            raise self._error(str(error)) from None

    def __repr__(self) -> str:
        return f"MlflowRegistry({self.url!r} on {public_uri(self.uri)!r})"

    def _error(self, what: str) -> RegistryError:
        return RegistryError(f"model registry '{self.url}' on {public_uri(self.uri)}: {what}")

    def _call(self, doing: str, request: Any, *args: Any, **kwargs: Any) -> Any:
        """One request of MLflow's client; its failure as one line naming the registry."""
        try:
            return request(*args, **kwargs)
        except RegistryError:
            raise
        except Exception as error:  # (MlflowException, a connection's errors)
            raise self._error(f"{doing}: {short_error(error)}") from None

    # ---- reading -----------------------------------------------------------------------------

    def _exists(self) -> bool:
        try:
            self._mlflow.get_registered_model(self.model)
        except Exception as error:
            if "RESOURCE_DOES_NOT_EXIST" in str(error) or "not found" in str(error).lower():
                return False
            raise self._error(f"reading the registered model: {short_error(error)}") from None
        return True

    def versions(self) -> list[ModelVersion]:
        """Every version, oldest first."""
        if not self._exists():
            return []
        found = self._call("listing the versions", self._mlflow.search_model_versions,
                           f"name = '{self.model}'")
        return sorted((self._version(v) for v in found), key=lambda v: int(v.id))

    def get(self, version_id: str) -> ModelVersion:
        if not str(version_id).isdigit():
            raise self._error(f"'{version_id}' is not a version (MLflow numbers them: 1, 2, "
                              "...; `sublimate models ls` lists them)")
        try:
            return self._version(self._mlflow.get_model_version(self.model, str(version_id)))
        except Exception as error:
            raise self._error(f"no version '{version_id}' ({short_error(error)}; `sublimate "
                              f"models ls --registry {self.url}` lists the versions)") from None

    def champion(self) -> ModelVersion | None:
        """The version under the alias ``champion``, None before the first promotion."""
        if not self._exists():
            return None
        try:
            found = self._mlflow.get_model_version_by_alias(self.model, CHAMPION_ALIAS)
        except Exception as error:
            if "RESOURCE_DOES_NOT_EXIST" in str(error) or "alias" in str(error).lower():
                return None
            raise self._error(f"reading the champion: {short_error(error)}") from None
        return self._version(found)

    def history(self) -> list[dict[str, Any]]:
        """Every champion change, oldest first (version, previous, reason, time, by, seq,
        action)."""
        if not self._exists():
            return []
        tags = self._call("reading the champion's history", self._mlflow.get_registered_model,
                          self.model).tags
        entries = [json.loads(value) for key, value in tags.items()
                   if key.startswith(HISTORY_TAG)]
        return sorted(entries, key=lambda entry: entry["seq"])

    def download(self, version_id: str, dest: Path) -> Path:
        """The version's files into ``dest``, each checked against its recorded size and
        SHA-256; returns ``dest``."""
        version = self.get(version_id)
        run_id = version.lineage.get("mlflow", {}).get("run_id")
        if not run_id:
            raise self._error(f"version {version_id} names no run holding its files")
        dest = Path(dest)
        dest.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=dest.parent, prefix=".download-") as work:
            got = Path(self._call(f"downloading version {version_id}",
                                  self._mlflow.download_artifacts, run_id, FILES_FOLDER, work))
            for name, info in version.files.items():
                path = got / name
                if not path.is_file() or path.stat().st_size != int(info["size"]) \
                        or _sha256(path) != info["sha256"]:
                    raise self._error(f"version {version_id}: {name} is missing or not the "
                                      "file published (its size or SHA-256 differ)")
                target = dest / name
                target.parent.mkdir(parents=True, exist_ok=True)
                path.replace(target)
        return dest

    def _version(self, found: Any) -> ModelVersion:
        tags = dict(found.tags or {})
        lineage = _unflatten({key[len(LINEAGE_TAG):]: value for key, value in tags.items()
                              if key.startswith(LINEAGE_TAG)})
        lineage.setdefault("mlflow", {})["run_id"] = found.run_id
        files = json.loads(tags.get(FILES_TAG, "{}"))
        created = datetime.fromtimestamp(found.creation_timestamp / 1000, UTC)
        return ModelVersion(id=str(found.version),
                            created=created.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
                            lineage=lineage, metrics=lineage.get("metrics") or {},
                            files=files, url=str(found.source))

    # ---- writing -----------------------------------------------------------------------------

    def publish(self, files_dir: Path, lineage: dict[str, Any]) -> ModelVersion:
        """Every file under ``files_dir`` as a new version, with ``lineage`` in its tags; it
        takes the alias ``challenger``."""
        files_dir = Path(files_dir)
        files = {path.relative_to(files_dir).as_posix(): {"size": path.stat().st_size,
                                                          "sha256": _sha256(path)}
                 for path in sorted(files_dir.rglob("*")) if path.is_file()}
        run_id = self._files_run(files_dir, lineage)
        self._call("uploading the files", self._mlflow.log_artifacts, run_id, str(files_dir),
                   FILES_FOLDER)
        if not self._exists():
            try:
                self._mlflow.create_registered_model(
                    self.model, description="Published by sublimate's retraining pipeline.")
            except Exception as error:  # (created meanwhile: fine)
                if "RESOURCE_ALREADY_EXISTS" not in str(error) \
                        and "already exists" not in str(error):
                    raise self._error(f"creating the model: {short_error(error)}") from None
        source = self._call("reading the run", self._mlflow.get_run, run_id).info.artifact_uri
        tags = {f"{LINEAGE_TAG}{key}": value[:5000]
                for key, value in _flatten(lineage).items() if key}
        tags[FILES_TAG] = json.dumps(files, sort_keys=True)
        created = self._call("creating the version", self._mlflow.create_model_version,
                             self.model, f"{source}/{FILES_FOLDER}", run_id=run_id, tags=tags)
        self._call("setting the alias challenger", self._mlflow.set_registered_model_alias,
                   self.model, CHALLENGER_ALIAS, str(created.version))
        return self.get(str(created.version))

    def _files_run(self, files_dir: Path, lineage: dict[str, Any]) -> str:
        """The run whose artifacts hold a version's files: the training run (the run folder's
        ``mlflow-run.json`` came with the files) when it is on this server, else a new one."""
        try:
            record = json.loads((files_dir / MLFLOW_RUN).read_text())
        except (OSError, ValueError):
            record = {}
        if record.get("run_id") and record.get("uri") == public_uri(self.uri):
            return str(record["run_id"])
        experiment = self._mlflow.get_experiment_by_name(PUBLISH_EXPERIMENT)
        experiment_id = experiment.experiment_id if experiment is not None else \
            self._call("creating the experiment", self._mlflow.create_experiment,
                       PUBLISH_EXPERIMENT)
        workflow = (lineage.get("workflow") or {}).get("name") or "by-hand"
        run = self._call("creating a run for the files", self._mlflow.create_run,
                         experiment_id, run_name=f"{workflow}-model",
                         tags={"sublimate.kind": "published-model"})
        self._mlflow.set_terminated(run.info.run_id)
        return str(run.info.run_id)

    def promote(self, version_id: str, reason: str, *, by: str | None = None,
                expect: str | object | None = _ANY_CHAMPION) -> ModelVersion:
        """Make ``version_id`` the champion (a no-op if it already is). ``expect``: the
        champion the decision was made against (None: none); another one there is
        :class:`ChampionMoved`, and nothing changes."""
        version = self.get(version_id)
        current = self.champion()
        current_id = current.id if current is not None else None
        if current_id == version.id:
            return version
        if expect is not _ANY_CHAMPION and current_id != expect:
            raise ChampionMoved(
                f"model registry '{self.url}': the champion is {current_id or '(none)'}, not "
                f"{expect or '(none)'} as when {version.id} was judged; not promoted")
        head = self._head()
        self._move({"action": "promote", "version": version.id, "previous": current_id,
                    "undo": head["seq"] if head else 0, "reason": reason}, by)
        return version

    def rollback(self, reason: str, *, by: str | None = None) -> ModelVersion:
        """Make the champion before the current one the champion again."""
        head = self._head()
        if head is None:
            raise self._error(NOTHING_TO_ROLL_BACK)
        if not head.get("undo"):
            raise self._error(nothing_before(head["version"]))
        restored = next(e for e in self.history() if e["seq"] == head["undo"])
        target = self.get(restored["version"])
        self._move({"action": "rollback", "version": target.id, "previous": head["version"],
                    "undo": restored.get("undo", 0), "reason": reason}, by)
        return target

    def _head(self) -> dict[str, Any] | None:
        entries = self.history()
        return entries[-1] if entries else None

    def _move(self, entry: dict[str, Any], by: str | None) -> None:
        """Record the change, then move the alias (one request: atomic for every reader)."""
        head = self._head()
        seq = (head["seq"] if head else 0) + 1
        entry = {**entry, "seq": seq, "by": by or default_actor(),
                 "time": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")}
        self._call("recording the champion's change", self._mlflow.set_registered_model_tag,
                   self.model, f"{HISTORY_TAG}{seq:08d}", json.dumps(entry, sort_keys=True))
        self._call("moving the alias champion", self._mlflow.set_registered_model_alias,
                   self.model, CHAMPION_ALIAS, entry["version"])


def open_registry(location: str) -> Any:
    """The registry a ``registry`` setting names: MLflow's for ``mlflow``/``mlflow:NAME``, else
    the folder or fsspec URL (:class:`~sublimate.components.model.registry.Registry`)."""
    if is_mlflow(location):
        return MlflowRegistry(location.partition(":")[2] or DEFAULT_MODEL)
    from sublimate.components.base.contract import user_location
    from sublimate.components.model.registry import Registry

    return Registry(user_location(location))
