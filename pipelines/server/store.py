"""The workflows the server knows, all under ``SUBLIMATE_HOME``: each run folder
(``runs/<name>/``, the runner's ``status.json`` and ``workflow.yaml``) is a workflow, and
``server/workflows/<name>.json`` keeps what Argo's API says about one the server accepted and
a run folder does not: its namespace, uid, creation time, labels, annotations and spec as
submitted. Nothing lives only in memory, so a restarted server lists every run again.

A run folder with no such record (``sublimate run``) is shown too, in the namespace its
manifest names, else the server's default namespace."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import threading
import uuid
from datetime import UTC, datetime
from pathlib import Path

from sublimate.pipelines.runner.records.run_folder import STATUS_FILE, write_durably

RECORDS = Path("server") / "workflows"
# A Kubernetes name: DNS-1123 subdomain (what Argo accepts for a namespace and a workflow).
NAME = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")


def timestamp(moment: datetime | None = None) -> str:
    return (moment or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")


class WorkflowStore:
    def __init__(self, home: Path, default_namespace: str) -> None:
        self.home = Path(home)
        self.runs = self.home / "runs"
        self.records = self.home / RECORDS
        self.default_namespace = default_namespace
        self.lock = threading.RLock()  # a name is checked and claimed at once

    def taken(self, name: str) -> bool:
        return (self.runs / name).exists() or self._record_path(name).exists()

    def save(self, record: dict) -> None:
        self.records.mkdir(parents=True, exist_ok=True)
        write_durably(self._record_path(record["name"]), json.dumps(record, indent=1),
                      what="the server's record of a workflow")

    def record(self, name: str) -> dict | None:
        """The server's record of ``name``, else one read from its run folder; None if neither."""
        path = self._record_path(name)
        with contextlib.suppress(OSError, ValueError):
            record = json.loads(path.read_text())
            if isinstance(record, dict):
                return record
        return self._foreign_record(name)

    def status(self, name: str) -> dict | None:
        """The run's ``status.json`` (None before its runner wrote one); it is replaced by a
        rename, so it is never read half written."""
        with contextlib.suppress(OSError, ValueError):
            status = json.loads((self.runs / name / STATUS_FILE).read_text())
            return status if isinstance(status, dict) else None
        return None

    def manifest_spec(self, name: str) -> dict | None:
        """The spec the run ran (its ``workflow.yaml``), or None."""
        spec = self._manifest(name).get("spec")
        return spec if isinstance(spec, dict) else None

    def _manifest(self, name: str) -> dict:
        """The run's ``workflow.yaml`` (the manifest as run), or ``{}`` when it cannot be read."""
        import yaml  # only for what the server's own records do not hold

        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # C: a large run's manifest
        try:
            manifest = yaml.load((self.runs / name / "workflow.yaml").read_text(), loader)
        except (OSError, ValueError, yaml.YAMLError):
            return {}
        return manifest if isinstance(manifest, dict) else {}

    def names(self) -> list[str]:
        names = set()
        for folder, suffix in ((self.runs, ""), (self.records, ".json")):
            with contextlib.suppress(OSError):
                names.update(path.name.removesuffix(suffix) for path in folder.iterdir()
                             if path.name.endswith(suffix) and not path.name.startswith("."))
        return sorted(names)

    def remove(self, name: str) -> None:
        shutil.rmtree(self.runs / name, ignore_errors=True)
        self._record_path(name).unlink(missing_ok=True)

    def _record_path(self, name: str) -> Path:
        return self.records / f"{name}.json"

    def _foreign_record(self, name: str) -> dict | None:
        """A run the server did not start, as Argo would show it: its manifest's metadata."""
        folder = self.runs / name
        if not folder.is_dir() or "/" in name or name.startswith("."):
            return None
        manifest = self._manifest(name)
        metadata = manifest.get("metadata") or {}
        spec = manifest.get("spec") or {}
        if not isinstance(metadata, dict) or not isinstance(spec, dict):
            metadata, spec = {}, {}
        status = self.status(name) or {}
        created = status.get("started_at")
        if not created:
            created = timestamp(datetime.fromtimestamp(folder.stat().st_mtime, UTC))
        return {
            "name": name,
            "namespace": metadata.get("namespace") or self.default_namespace,
            # stable across restarts: the same folder is the same workflow
            "uid": str(uuid.uuid5(uuid.NAMESPACE_URL, folder.resolve().as_uri())),
            "creationTimestamp": created.split(".")[0].removesuffix("Z") + "Z",
            "labels": metadata.get("labels") or {},
            "annotations": metadata.get("annotations") or {},
            "spec": spec,
            "source": "sublimate run",  # not the server's: no status yet means not yet
        }
