"""WorkflowTemplates the server keeps, so that workflows can be submitted from them
(``POST /api/v1/workflows/{namespace}/submit``, what ``sublimate submit`` and
``argo submit --from workflowtemplate/NAME`` send): one JSON file each,
``SUBLIMATE_HOME/server/workflow-templates/<namespace>/<name>.json``, the object as Argo
returns it."""

from __future__ import annotations

import contextlib
import copy
import json
import re
import threading
import uuid
from pathlib import Path

from sublimate.pipelines.runner.records.run_folder import write_durably

from .errors import already_exists, invalid, not_found
from .store import timestamp

FOLDER = Path("server") / "workflow-templates"
KIND = "workflowtemplates.argoproj.io"
_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")


class TemplateStore:
    def __init__(self, home: Path) -> None:
        self.root = Path(home) / FOLDER
        self.lock = threading.Lock()

    def checked(self, namespace: str, template: object) -> dict:
        """``template`` as a WorkflowTemplate object in ``namespace``; 400 naming the field."""
        if not isinstance(template, dict):
            raise invalid("template: required, an object (the WorkflowTemplate)")
        if template.get("kind", "WorkflowTemplate") != "WorkflowTemplate":
            raise invalid(f"template.kind: must be WorkflowTemplate, not "
                          f"{template.get('kind')!r}")
        metadata = template.get("metadata")
        if not isinstance(metadata, dict) or not isinstance(metadata.get("name"), str):
            raise invalid("template.metadata.name: required")
        if not _NAME.fullmatch(metadata["name"]) or len(metadata["name"]) > 253:
            raise invalid(f"template.metadata.name: {metadata['name']!r} is not a valid "
                          f"Kubernetes name (lower case letters, digits, '-' and '.')")
        if not isinstance(template.get("spec"), dict):
            raise invalid("template.spec: required, an object")
        checked = copy.deepcopy(template)
        checked.update(apiVersion="argoproj.io/v1alpha1", kind="WorkflowTemplate")
        checked["metadata"]["namespace"] = namespace
        return checked

    def create(self, template: dict) -> dict:
        metadata = template["metadata"]
        with self.lock:
            path = self._path(metadata["namespace"], metadata["name"])
            if path.exists():
                raise already_exists(metadata["name"], KIND)
            metadata.update(uid=str(uuid.uuid4()), creationTimestamp=timestamp(),
                            resourceVersion="1")
            self._write(path, template)
        return template

    def update(self, template: dict) -> dict:
        metadata = template["metadata"]
        with self.lock:
            old = self.get(metadata["namespace"], metadata["name"])
            kept = old["metadata"]
            metadata.update(uid=kept["uid"], creationTimestamp=kept["creationTimestamp"],
                            resourceVersion=str(int(kept.get("resourceVersion", "1")) + 1))
            self._write(self._path(metadata["namespace"], metadata["name"]), template)
        return template

    def get(self, namespace: str, name: str) -> dict:
        if _NAME.fullmatch(name):
            with contextlib.suppress(OSError, ValueError):
                template = json.loads(self._path(namespace, name).read_text())
                if isinstance(template, dict):
                    return template
        raise not_found(namespace, name, KIND)

    def list(self, namespace: str) -> list[dict]:
        folder = self.root / namespace
        names = sorted(path.stem for path in folder.glob("*.json")) if folder.is_dir() else []
        found = []
        for name in names:
            with contextlib.suppress(Exception):
                found.append(self.get(namespace, name))
        return found

    def delete(self, namespace: str, name: str) -> None:
        self.get(namespace, name)
        self._path(namespace, name).unlink(missing_ok=True)

    def _path(self, namespace: str, name: str) -> Path:
        return self.root / namespace / f"{name}.json"

    def _write(self, path: Path, template: dict) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_durably(path, json.dumps(template, indent=1), what="a WorkflowTemplate")


LABEL_WORKFLOW_TEMPLATE = "workflows.argoproj.io/workflow-template"


def submitted_workflow(template: dict, options: object) -> tuple[dict, dict, dict[str, str]]:
    """A Workflow from ``template`` as Argo's submit makes one (``SubmitOpts``): the Workflow
    to run (the template's spec), the spec Argo shows (``workflowTemplateRef`` and the
    arguments given) and the parameters given."""
    if options is None:
        options = {}
    if not isinstance(options, dict):
        raise invalid("submitOptions: must be an object")
    name = template["metadata"]["name"]
    parameters: dict[str, str] = {}
    for entry in options.get("parameters") or []:
        key, separator, value = str(entry).partition("=")
        if not separator or not key.strip():
            raise invalid(f"submitOptions.parameters: '{entry}' is not name=value")
        parameters[key.strip()] = value
    labels = dict(((template["spec"].get("workflowMetadata") or {}).get("labels")) or {})
    labels[LABEL_WORKFLOW_TEMPLATE] = name
    for entry in filter(None, str(options.get("labels") or "").split(",")):
        key, separator, value = entry.partition("=")
        if not separator or not key.strip():
            raise invalid(f"submitOptions.labels: '{entry}' is not name=value")
        labels[key.strip()] = value.strip()
    metadata: dict = {"labels": labels}
    if options.get("name"):
        metadata["name"] = options["name"]
    else:
        metadata["generateName"] = options.get("generateName") or f"{name}-"
    spec = copy.deepcopy(template["spec"])
    shown: dict = {"workflowTemplateRef": {"name": name}}
    if parameters:
        shown["arguments"] = {"parameters": [{"name": key, "value": value}
                                             for key, value in parameters.items()]}
    if options.get("entryPoint"):
        spec["entrypoint"] = shown["entrypoint"] = options["entryPoint"]
    workflow = {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow",
                "metadata": metadata, "spec": spec}
    return workflow, shown, parameters
