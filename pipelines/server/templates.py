"""The objects the server keeps besides workflows: WorkflowTemplates, ClusterWorkflowTemplates
and CronWorkflows, one JSON file each, the object as Argo returns it:
``SUBLIMATE_HOME/server/workflow-templates/<namespace>/<name>.json``,
``server/cluster-workflow-templates/<name>.json`` (no namespace: cluster-scoped) and
``server/cron-workflows/<namespace>/<name>.json``. Written durably, so a restarted server has
them all; named only by Kubernetes names, so no body or path names a file elsewhere.

Also: a Workflow submitted from a template (``submitted_workflow``, what Argo's
``SubmitWorkflow`` makes), and the ``workflowTemplateRef``/``templateRef`` of a workflow
resolved from the stored templates (``resolve_references``), as Argo's controller finds them
in the namespace and the cluster."""

from __future__ import annotations

import contextlib
import copy
import json
import threading
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

from sublimate.pipelines.runner import ManifestError
from sublimate.pipelines.runner.manifest.library import TemplateLibrary, has_template_refs
from sublimate.pipelines.runner.manifest.load import normalise_workflow
from sublimate.pipelines.runner.records.run_folder import write_durably

from .errors import NOT_FOUND, ApiError, already_exists, invalid, not_found
from .store import NAME, timestamp

# The server (``app.ArgoApiServer``), as ``routing.ServerState`` and what is attached to it;
# not imported: ``app`` imports this module.
Server = Any


FOLDER = Path("server") / "workflow-templates"
CLUSTER_FOLDER = Path("server") / "cluster-workflow-templates"
KIND = "workflowtemplates.argoproj.io"
CLUSTER_KIND = "clusterworkflowtemplates.argoproj.io"
API_VERSION = "argoproj.io/v1alpha1"
MAX_NAME = 253  # Kubernetes' limit on an object's name (DNS-1123 subdomain)


def checked_object(body: object, field: str, kind: str, namespace: str | None,
                   max_name: int = MAX_NAME) -> dict:
    """``body`` (the request's ``field``) as an object of ``kind`` in ``namespace`` (None:
    cluster-scoped); ``ApiError`` (400) naming the field that is wrong."""
    if not isinstance(body, dict):
        raise invalid(f"{field}: required, an object (the {kind})")
    if body.get("kind", kind) != kind:
        raise invalid(f"{field}.kind: must be {kind}, not {body.get('kind')!r}")
    metadata = body.get("metadata")
    if not isinstance(metadata, dict) or not isinstance(metadata.get("name"), str):
        raise invalid(f"{field}.metadata.name: required")
    name = metadata["name"]
    if not NAME.fullmatch(name) or len(name) > max_name:
        raise invalid(f"{field}.metadata.name: {name!r} is not a valid Kubernetes name (lower "
                      f"case letters, digits, '-' and '.', at most {max_name} characters)")
    check_string_maps(metadata, f"{field}.metadata")
    if not isinstance(body.get("spec"), dict):
        raise invalid(f"{field}.spec: required, an object")
    checked = copy.deepcopy(body)
    checked.update(apiVersion=API_VERSION, kind=kind)
    if namespace is None:
        checked["metadata"].pop("namespace", None)
    else:
        checked["metadata"]["namespace"] = namespace
    return checked


class ObjectStore:
    """Objects of one kind under ``root``: ``<namespace>/<name>.json``, or ``<name>.json`` for
    a cluster-scoped kind (``namespaced=False``). ``resource`` names the kind in errors
    (``workflowtemplates.argoproj.io``)."""

    def __init__(self, root: Path, resource: str, what: str, namespaced: bool = True) -> None:
        self.root = root
        self.resource = resource
        self.what = what
        self.namespaced = namespaced
        self.lock = threading.RLock()  # a name checked and claimed at once; read-modify-write

    def create(self, item: dict) -> dict:
        metadata = item["metadata"]
        with self.lock:
            path = self._path(metadata.get("namespace"), metadata["name"])
            if path.exists():
                raise already_exists(metadata["name"], self.resource)
            metadata.update(uid=str(uuid.uuid4()), creationTimestamp=timestamp(),
                            resourceVersion="1")
            metadata.pop("deletionTimestamp", None)
            self._write(path, item)
        return item

    def update(self, item: dict, keep: Callable[[dict, dict], None] | None = None) -> dict:
        """``item`` in place of the stored one of its name (404 if none): the same uid and
        creation time, the next resourceVersion; ``keep(old, new)`` carries over what the
        server owns (a CronWorkflow's status)."""
        metadata = item["metadata"]
        with self.lock:
            old = self.get(metadata.get("namespace"), metadata["name"])
            kept = old["metadata"]
            metadata.update(uid=kept["uid"], creationTimestamp=kept["creationTimestamp"],
                            resourceVersion=_next_version(kept))
            if keep is not None:
                keep(old, item)
            self._write(self._path(metadata.get("namespace"), metadata["name"]), item)
        return item

    def modify(self, namespace: str | None, name: str, change: Callable[[dict], bool]) -> dict:
        """Read, ``change`` (True: it changed something), write: one step under the lock."""
        with self.lock:
            item = self.get(namespace, name)
            if change(item):
                item["metadata"]["resourceVersion"] = _next_version(item["metadata"])
                self._write(self._path(namespace, name), item)
            return item

    def get(self, namespace: str | None, name: str) -> dict:
        if NAME.fullmatch(name) and (namespace is None or NAME.fullmatch(namespace)):
            with contextlib.suppress(OSError, ValueError):
                item = json.loads(self._path(namespace, name).read_text())
                if isinstance(item, dict):
                    return item
        if namespace is None:
            raise ApiError(NOT_FOUND, f'{self.resource} "{name}" not found')
        raise not_found(namespace, name, self.resource)

    def list(self, namespace: str | None) -> list[dict]:
        folder = self.root / namespace if namespace is not None else self.root
        names = sorted(path.stem for path in folder.glob("*.json")) if folder.is_dir() else []
        found = []
        for name in names:
            with contextlib.suppress(ApiError):  # a file not ours, or half a name: not listed
                found.append(self.get(namespace, name))
        return found

    def namespaces(self) -> list[str]:
        with contextlib.suppress(OSError):
            return sorted(path.name for path in self.root.iterdir()
                          if path.is_dir() and NAME.fullmatch(path.name))
        return []

    def delete(self, namespace: str | None, name: str) -> dict:
        with self.lock:
            item = self.get(namespace, name)
            self._path(namespace, name).unlink(missing_ok=True)
        return item

    def _path(self, namespace: str | None, name: str) -> Path:
        if self.namespaced:
            assert namespace is not None and NAME.fullmatch(namespace), namespace
            return self.root / namespace / f"{name}.json"
        return self.root / f"{name}.json"

    def _write(self, path: Path, item: dict) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_durably(path, json.dumps(item, indent=1), what=f"a {self.what}")


def _next_version(metadata: dict) -> str:
    try:
        return str(int(metadata.get("resourceVersion") or "0") + 1)
    except ValueError:
        return "1"


class TemplateStore(ObjectStore):
    """WorkflowTemplates, by namespace."""

    def __init__(self, home: Path) -> None:
        super().__init__(Path(home) / FOLDER, KIND, "WorkflowTemplate")

    def checked(self, namespace: str, template: object) -> dict:
        """``template`` as a WorkflowTemplate object in ``namespace``; 400 naming the field."""
        return checked_object(template, "template", "WorkflowTemplate", namespace)


class ClusterTemplateStore(ObjectStore):
    """ClusterWorkflowTemplates: one set for the whole server, whatever the namespace."""

    def __init__(self, home: Path) -> None:
        super().__init__(Path(home) / CLUSTER_FOLDER, CLUSTER_KIND, "ClusterWorkflowTemplate",
                         namespaced=False)

    def checked(self, template: object) -> dict:
        return checked_object(template, "template", "ClusterWorkflowTemplate", None)


_Attached = TypeVar("_Attached")
_ATTACHING = threading.RLock()  # (a part made may ask for another)


def attached(server: Server, attribute: str, make: Callable[[], _Attached]) -> _Attached:
    """What the server holds as ``attribute``, made (once, whatever the thread) when first
    asked for: the parts of the server that ``app`` does not build itself."""
    found = getattr(server, attribute, None)
    if found is None:
        with _ATTACHING:
            found = getattr(server, attribute, None)
            if found is None:
                found = make()
                setattr(server, attribute, found)
    return found


def cluster_templates(server: Server) -> ClusterTemplateStore:
    return attached(server, "cluster_templates", lambda: ClusterTemplateStore(server.store.home))


LABEL_WORKFLOW_TEMPLATE = "workflows.argoproj.io/workflow-template"
LABEL_CLUSTER_WORKFLOW_TEMPLATE = "workflows.argoproj.io/cluster-workflow-template"


def submitted_workflow(template: dict, options: object, cluster_scope: bool = False
                       ) -> tuple[dict, dict, dict[str, str]]:
    """A Workflow from ``template`` as Argo's submit makes one (``SubmitOpts``): the Workflow
    to run (the template's spec), the spec Argo shows (``workflowTemplateRef`` and the
    arguments given) and the parameters given. ``cluster_scope``: a ClusterWorkflowTemplate."""
    name = template["metadata"]["name"]
    labels = dict(((template["spec"].get("workflowMetadata") or {}).get("labels")) or {})
    labels[LABEL_CLUSTER_WORKFLOW_TEMPLATE if cluster_scope else LABEL_WORKFLOW_TEMPLATE] = name
    metadata, parameters, entrypoint = submit_options(options, labels, f"{name}-")
    spec = copy.deepcopy(template["spec"])
    reference: dict[str, Any] = {"name": name}
    if cluster_scope:
        reference["clusterScope"] = True
    shown: dict = {"workflowTemplateRef": reference}
    if parameters:
        shown["arguments"] = {"parameters": [{"name": key, "value": value}
                                             for key, value in parameters.items()]}
    if entrypoint:
        spec["entrypoint"] = shown["entrypoint"] = entrypoint
    workflow = {"apiVersion": API_VERSION, "kind": "Workflow", "metadata": metadata,
                "spec": spec}
    return workflow, shown, parameters


def check_string_maps(metadata: dict, field: str) -> None:
    """An object's ``labels`` and ``annotations`` map names to strings, as Kubernetes requires;
    400 naming the one that does not."""
    for key in ("labels", "annotations"):
        values = metadata.get(key)
        if values is not None and (not isinstance(values, dict) or not all(
                isinstance(value, str) for value in values.values())):
            raise invalid(f"{field}.{key}: must map names to strings")


def name_values(entries: Iterable[object], field: str) -> dict[str, str]:
    """Argo's ``parameters`` of a request (submit, retry, resubmit): ``NAME=VALUE`` each, the
    value kept as given; 400 naming ``field`` for one that is not."""
    values: dict[str, str] = {}
    for entry in entries:
        key, separator, value = str(entry).partition("=")
        if not separator or not key.strip():
            raise invalid(f"{field}: '{entry}' is not name=value")
        values[key.strip()] = value
    return values


def submit_options(options: object, labels: dict[str, str], generate_name: str
                   ) -> tuple[dict, dict[str, str], str | None]:
    """Argo's ``ApplySubmitOpts``: the workflow's metadata (``name`` or ``generateName``, the
    labels given added to ``labels``), the parameters given and the entrypoint given."""
    if options is None:
        options = {}
    if not isinstance(options, dict):
        raise invalid("submitOptions: must be an object")
    parameters = name_values(options.get("parameters") or [], "submitOptions.parameters")
    labels = dict(labels)
    for entry in filter(None, str(options.get("labels") or "").split(",")):
        key, separator, value = entry.partition("=")
        if not separator or not key.strip():
            raise invalid(f"submitOptions.labels: '{entry}' is not name=value")
        labels[key.strip()] = value.strip()
    metadata: dict = {"labels": labels}
    if options.get("name"):
        metadata["name"] = options["name"]
    else:
        metadata["generateName"] = options.get("generateName") or generate_name
    entrypoint = options.get("entryPoint")
    return metadata, parameters, str(entrypoint) if entrypoint else None


# ------------------------------------------------------------ templates a workflow names


def needs_templates(spec: object) -> bool:
    """Whether ``spec`` names a stored template: ``workflowTemplateRef``, or a step's or
    task's ``templateRef``."""
    return isinstance(spec, dict) and (bool(spec.get("workflowTemplateRef"))
                                       or has_template_refs(spec))


def resolve_references(server: Server, namespace: str | None, workflow: object,
                       checking: dict | None = None) -> object:
    """``workflow`` (a Workflow object) with its ``workflowTemplateRef`` joined and its steps'
    and tasks' ``templateRef`` copied in from the WorkflowTemplates of ``namespace`` (None: a
    ClusterWorkflowTemplate's, which may name only ClusterWorkflowTemplates, as in Argo) and
    the ClusterWorkflowTemplates (``clusterScope: true``); ``checking``: a template being
    created, found by its own references before it is stored. A workflow that names none, or
    that is no object, is returned as given (the launcher says what is wrong with it)."""
    if not isinstance(workflow, dict) or workflow.get("kind", "Workflow") != "Workflow" \
            or not needs_templates(workflow.get("spec")):
        return workflow
    documents: list[dict] = []
    if namespace is not None:
        documents += server.templates.list(namespace)
    documents += cluster_templates(server).list(None)
    if checking is not None:
        key = (checking.get("kind"), checking["metadata"]["name"])
        documents = [d for d in documents if (d.get("kind"), d["metadata"]["name"]) != key]
        documents.append(checking)
    library = _StoredTemplates(namespace, documents)
    try:
        normalised = normalise_workflow(workflow, library)
    except ManifestError as error:
        raise invalid(str(error)) from error
    return {**workflow, "spec": normalised["spec"]}


class _StoredTemplates(TemplateLibrary):
    """The server's stored templates as the runner's library: found by kind and name."""

    def __init__(self, namespace: str | None, documents: list[dict]) -> None:
        super().__init__(documents=[(document, _source(document)) for document in documents])
        self.namespace = namespace

    def empty(self) -> bool:
        return False  # a reference to a template not stored is an error naming it

    def searched(self) -> str:
        if self.namespace is None:
            return "among the server's ClusterWorkflowTemplates"
        return (f"among the WorkflowTemplates of namespace {self.namespace} and the server's "
                f"ClusterWorkflowTemplates")


def _source(document: dict) -> str:
    return f"the server's {document.get('kind')} {document['metadata']['name']}"
