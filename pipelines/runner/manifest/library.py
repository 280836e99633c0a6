"""The local template library, and turning what a manifest refers to into one plain Workflow.

A manifest may refer to WorkflowTemplates it does not hold itself: a Workflow's or a
CronWorkflow's ``spec.workflowTemplateRef``, or a step's or task's ``templateRef``. On a cluster
Argo finds them in the namespace (ClusterWorkflowTemplates: in the cluster); locally the
``TemplateLibrary`` finds them in the manifest itself, in the other ``*.yaml``/``*.yml`` files of
its folder (``argo/`` holds the whole install) and in every ``--templates DIR``. A name found
twice is an error naming both files; a missing one names the folders searched. Files are read
only when a reference needs them, so a self-contained manifest costs nothing.

The semantics follow Argo (v4, ``workflow/util/merge.go`` ``JoinWorkflowSpec``, and
``workflow/common/convert.go`` for CronWorkflows): see ``join_specs`` and ``cron_workflow``.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta, tzinfo
from pathlib import Path
from typing import Any

from ..errors import ManifestError

TEMPLATE_KINDS = ("WorkflowTemplate", "ClusterWorkflowTemplate")

# Argo's labels and annotation on a workflow a CronWorkflow starts (workflow/common/common.go).
LABEL_CRON_WORKFLOW = "workflows.argoproj.io/cron-workflow"
ANNOTATION_SCHEDULED_TIME = "workflows.argoproj.io/scheduled-time"
# Labels of a CronWorkflow that Argo copies onto the workflows it starts (convert.go).
_PROPAGATED_LABELS = ("workflows.argoproj.io/creator", "workflows.argoproj.io/creator-email",
                      "workflows.argoproj.io/creator-preferred-username",
                      "workflows.argoproj.io/controller-instanceid")
# CronWorkflowSpec's fields that decide when and how often workflows start: nothing to apply to
# one run started by hand (as `argo submit --from cronwf/NAME` ignores them too).
CRON_SCHEDULING_FIELDS = ("schedule", "schedules", "timezone", "concurrencyPolicy", "suspend",
                          "startingDeadlineSeconds", "successfulJobsHistoryLimit",
                          "failedJobsHistoryLimit", "stopStrategy", "when")
_CRON_FIELDS = frozenset({"workflowSpec", "workflowMetadata", *CRON_SCHEDULING_FIELDS})

# The list fields of WorkflowSpec (and what it holds) that Kubernetes' strategic merge patch
# merges item by item, by this key, rather than replacing (``patchMergeKey`` in Argo's types
# and in k8s.io/api's Container): everything else a workflow sets replaces the template's.
_MERGE_KEYS = {"templates": "name", "volumes": "name", "parameters": "name",
               "artifacts": "name", "tasks": "name", "env": "name",
               "volumeMounts": "mountPath", "tolerations": "key", "imagePullSecrets": "name",
               "hostAliases": "ip", "initContainers": "name", "sidecars": "name"}


def doc_name(doc: dict) -> str:
    meta = doc.get("metadata") or {}
    return str(meta.get("name") or meta.get("generateName") or "")


def folder_documents(folders: Iterable[Path], words: tuple[str, ...], skip: Path | None = None,
                     unreadable: list[str] | None = None) -> list[tuple[dict, str]]:
    """The YAML documents, with their files, of every ``*.yaml``/``*.yml`` file of ``folders``
    (not recursively; each file once; ``skip``: one already read) that mentions one of
    ``words`` (cheap: most files hold none). Files that cannot be read are listed in
    ``unreadable``."""
    import yaml  # loaded already by whoever read the manifest

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    found: list[tuple[dict, str]] = []
    seen = {skip.resolve()} if skip is not None else set()
    for folder in folders:
        if not folder.is_dir():
            continue
        for path in sorted(p for p in folder.iterdir() if p.suffix in (".yaml", ".yml")):
            resolved = path.resolve()
            if resolved in seen or not path.is_file():
                continue
            seen.add(resolved)
            try:
                text = path.read_text()
                if not any(word in text for word in words):
                    continue
                docs = list(yaml.load_all(text, Loader=loader))
            except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
                if unreadable is not None:
                    unreadable.append(f"{path}: {type(exc).__name__}")
                continue
            found += [(d, str(path)) for d in docs if isinstance(d, dict)]
    return found


class TemplateLibrary:
    """WorkflowTemplates and ClusterWorkflowTemplates by kind and name.

    ``documents``: (document, source) pairs already read (the manifest's own); ``folders``:
    where to look for more (``*.yaml`` and ``*.yml``, not recursively). ``own_file`` is the
    manifest's file, whose documents ``documents`` already holds."""

    def __init__(self, folders: Sequence[Path] = (), documents: Iterable[tuple[dict, str]] = (),
                 own_file: Path | None = None) -> None:
        self.folders = list(dict.fromkeys(folders))
        self._documents = list(documents)
        self._own_file = own_file.resolve() if own_file is not None else None
        self._index: dict[tuple[str, str], list[tuple[dict, str]]] | None = None
        self._unreadable: list[str] = []

    def empty(self) -> bool:
        """Nothing to look in: no folder, and no template among the documents given."""
        return not self.folders and not any(d.get("kind") in TEMPLATE_KINDS
                                            for d, _ in self._documents)

    def _load(self) -> dict[tuple[str, str], list[tuple[dict, str]]]:
        if self._index is not None:
            return self._index
        found = list(self._documents)
        found += folder_documents(self.folders, ("WorkflowTemplate",), self._own_file,
                                  self._unreadable)
        index: dict[tuple[str, str], list[tuple[dict, str]]] = {}
        for doc, source in found:
            if doc.get("kind") in TEMPLATE_KINDS:
                index.setdefault((doc["kind"], doc_name(doc)), []).append((doc, source))
        self._index = index
        return index

    def find(self, name: Any, cluster_scope: bool, where: str) -> dict:
        """The template document; ``ManifestError`` naming ``where`` if absent or twice."""
        kind = TEMPLATE_KINDS[1] if cluster_scope else TEMPLATE_KINDS[0]
        if not name:
            raise ManifestError(f"{where}.name: missing")
        hits = self._load().get((kind, str(name)), [])
        if len(hits) > 1:
            sources = " and ".join(source for _, source in hits)
            raise ManifestError(f"{where}.name: {kind} {name!r} is defined twice: in {sources}")
        if not hits:
            raise ManifestError(f"{where}.name: {kind} {name!r} not found {self.searched()}")
        return hits[0][0]

    def searched(self) -> str:
        places = ["the manifest"] + [f"{folder}/" for folder in self.folders]
        text = "in " + ", ".join(places)
        if not self.folders:
            text += " (give a folder of templates with --templates DIR)"
        if self._unreadable:
            text += "; unreadable: " + ", ".join(self._unreadable)
        return text


# ---------------------------------------------------------------- workflowTemplateRef


def _empty(value: Any) -> bool:
    # Go's omitempty: what a workflow leaves unset is not in the patch Argo applies.
    return value is None or value == "" or value == [] or value == {}


def strategic_merge(base: Any, patch: Any, field: str | None = None) -> Any:
    """``patch`` applied over ``base`` as a Kubernetes strategic merge patch: mappings merge
    key by key, lists in ``_MERGE_KEYS`` item by item (new items appended), the rest replace."""
    if isinstance(base, dict) and isinstance(patch, dict):
        merged = dict(base)
        for key, value in patch.items():
            if _empty(value):
                continue
            merged[key] = strategic_merge(base[key], value, key) if key in base \
                else copy.deepcopy(value)
        return merged
    if isinstance(base, list) and isinstance(patch, list) and field in _MERGE_KEYS:
        key = _MERGE_KEYS[field]
        merged_list = list(base)
        at = {item.get(key): i for i, item in enumerate(merged_list) if isinstance(item, dict)}
        for item in patch:
            name = item.get(key) if isinstance(item, dict) else None
            if name is not None and name in at:
                merged_list[at[name]] = strategic_merge(merged_list[at[name]], item)
            else:
                merged_list.append(copy.deepcopy(item))
        return merged_list
    return copy.deepcopy(patch)


def _has_value(param: Any) -> bool:
    return isinstance(param, dict) and any(k in param for k in ("value", "default", "valueFrom"))


def join_specs(workflow_spec: dict, template_spec: dict) -> dict:
    """Argo's ``JoinWorkflowSpec``: the workflow's spec merged over its template's (strategic
    merge patch), then each argument that has a value (value, default or valueFrom) taken whole
    from the workflow if it gives one, else from the template; so ``-p`` style overrides never
    mix one side's value with the other's default."""
    own = {k: v for k, v in workflow_spec.items() if k != "workflowTemplateRef"}
    merged = strategic_merge(copy.deepcopy(template_spec), own)
    merged.pop("workflowTemplateRef", None)
    arguments = merged.get("arguments")
    if isinstance(arguments, dict):
        for field in ("parameters", "artifacts"):
            mine = _by_name((workflow_spec.get("arguments") or {}).get(field))
            theirs = _by_name((template_spec.get("arguments") or {}).get(field))
            if field == "parameters":  # Argo's parametersToMapByName: only those with a value
                mine = {k: v for k, v in mine.items() if _has_value(v)}
                theirs = {k: v for k, v in theirs.items() if _has_value(v)}
            items = arguments.get(field) or []
            for i, item in enumerate(items):
                if not isinstance(item, dict) or (field == "parameters" and not _has_value(item)):
                    continue
                chosen = mine.get(item.get("name")) or theirs.get(item.get("name"))
                if chosen is not None:
                    items[i] = copy.deepcopy(chosen)
    return merged


def _by_name(items: Any) -> dict[str, dict]:
    return {item["name"]: item for item in items or []
            if isinstance(item, dict) and "name" in item}


def resolve_workflow_template_ref(spec: dict, library: TemplateLibrary | None,
                                  where: str = "spec") -> dict:
    """``spec`` with its ``workflowTemplateRef`` replaced by the joined template spec."""
    ref = spec.get("workflowTemplateRef")
    if not ref:
        return spec
    path = f"{where}.workflowTemplateRef"
    if not isinstance(ref, dict):
        raise ManifestError(f"{path}: expected a mapping")
    unknown = sorted(set(ref) - {"name", "clusterScope"})
    if unknown:
        raise ManifestError(f"{path}.{unknown[0]}: field is not supported by the local runner")
    library = library or TemplateLibrary()
    template = library.find(ref.get("name"), bool(ref.get("clusterScope")), path)
    base = template.get("spec") or {}
    if base.get("workflowTemplateRef"):
        raise ManifestError(f"{path}.name: {template.get('kind')} {ref.get('name')!r} refers to "
                            "another template itself (spec.workflowTemplateRef); Argo does not "
                            "follow such chains")
    return join_specs(spec, base)


# ---------------------------------------------------------------- templateRef


def inline_template_refs(spec: dict, library: TemplateLibrary | None) -> dict:
    """Steps' and tasks' ``templateRef`` resolved: each template referred to is copied into
    ``spec.templates`` (as ``<WorkflowTemplate>.<template>``) and the call names it instead.

    As in Argo, a template taken from another WorkflowTemplate keeps calling that template's
    siblings (its ``template:`` names are resolved in its own WorkflowTemplate), and it sees
    the running workflow's ``workflow.*`` variables and parameters, not its own file's."""
    templates = spec.get("templates")
    if not has_template_refs(spec):
        return spec
    library = library or TemplateLibrary()
    spec = dict(spec)
    templates = [copy.deepcopy(t) for t in templates]
    taken = {t.get("name") for t in templates if isinstance(t, dict)}
    added: dict[tuple[str, str, str], str] = {}  # (kind, document, template) -> local name

    def local_name(kind: str, doc: str, name: str, where: str) -> str:
        key = (kind, doc, name)
        if key in added:
            return added[key]
        document = library.find(doc, kind == TEMPLATE_KINDS[1], where)
        found = [t for t in (document.get("spec") or {}).get("templates") or []
                 if isinstance(t, dict) and t.get("name") == name]
        if not found:
            raise ManifestError(f"{where}.template: template {name!r} not found in {kind} "
                                f"{doc!r}")
        local = f"{doc}.{name}"
        while local in taken:
            local += "-"
        taken.add(local)
        added[key] = local
        copied = copy.deepcopy(found[0])
        copied["name"] = local
        templates.append(copied)
        rewrite(copied, (kind, doc), f"{kind}/{doc}.templates[{name}]")
        return local

    def rewrite(template: dict, home: tuple[str, str] | None, where: str) -> None:
        for path, call in _calls(template, where):
            ref = call.get("templateRef")
            if isinstance(ref, dict):
                kind = TEMPLATE_KINDS[1] if ref.get("clusterScope") else TEMPLATE_KINDS[0]
                unknown = sorted(set(ref) - {"name", "template", "clusterScope"})
                if unknown:
                    raise ManifestError(f"{path}.templateRef.{unknown[0]}: field is not "
                                        "supported by the local runner")
                if not ref.get("template"):
                    raise ManifestError(f"{path}.templateRef.template: missing")
                call["template"] = local_name(kind, str(ref.get("name") or ""),
                                              str(ref["template"]), f"{path}.templateRef")
                del call["templateRef"]
            elif home is not None and isinstance(call.get("template"), str):
                call["template"] = local_name(home[0], home[1], call["template"], path)

    for i in range(len(spec["templates"])):  # the workflow's own; inlined ones are done
        if isinstance(templates[i], dict):
            rewrite(templates[i], None, f"spec.templates[{i}]")
    spec["templates"] = templates
    return spec


def has_template_refs(spec: dict) -> bool:
    """Whether a step or task of ``spec`` calls a template by ``templateRef``."""
    templates = spec.get("templates")
    return isinstance(templates, list) and any(
        "templateRef" in call for t in templates if isinstance(t, dict)
        for _, call in _calls(t, ""))


def _calls(template: dict, where: str) -> Iterable[tuple[str, dict]]:
    dag = template.get("dag")
    if isinstance(dag, dict):
        for j, task in enumerate(dag.get("tasks") or []):
            if isinstance(task, dict):
                yield f"{where}.dag.tasks[{j}]", task
    steps = template.get("steps")
    if isinstance(steps, list):
        for j, group in enumerate(steps):
            for k, step in enumerate(group if isinstance(group, list) else []):
                if isinstance(step, dict):
                    yield f"{where}.steps[{j}][{k}]", step


# ---------------------------------------------------------------- CronWorkflow


def _zone(name: Any) -> tzinfo:
    if not name or name in ("UTC", "Etc/UTC"):
        return UTC
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    try:
        return ZoneInfo(str(name))
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ManifestError(f"spec.timezone: unknown time zone {name!r}") from exc


def rfc3339(moment: datetime) -> str:
    """Go's ``time.RFC3339``: whole seconds, ``Z`` for UTC, else the offset."""
    text = moment.replace(microsecond=0).isoformat()
    return text[:-6] + "Z" if moment.utcoffset() == timedelta(0) else text


def cron_workflow(doc: dict, now: datetime | None = None) -> tuple[dict, dict, list[str]]:
    """(metadata, workflowSpec, notes) of the workflow a CronWorkflow starts when it fires at
    ``now`` (default: this moment), as Argo's cron controller makes it
    (``ConvertCronWorkflowToWorkflowWithProperties``): named ``<name>-<unix seconds>``
    (``getChildWorkflowName``), labelled ``workflows.argoproj.io/cron-workflow: <name>``,
    annotated with the scheduled time (``{{workflow.scheduledTime}}``), with
    ``spec.workflowMetadata``'s labels and annotations; the scheduling fields are reported in
    ``notes``, not applied."""
    spec = doc.get("spec") or {}
    if not isinstance(spec, dict) or not isinstance(spec.get("workflowSpec"), dict):
        raise ManifestError("spec.workflowSpec: missing in CronWorkflow")
    unknown = sorted(k for k in spec if k not in _CRON_FIELDS)
    if unknown:
        raise ManifestError("; ".join(f"spec.{key}: not a CronWorkflow field" for key in unknown))
    meta = doc.get("metadata") or {}
    name = str(meta.get("name") or "")
    if not name:
        raise ManifestError("metadata.name: a CronWorkflow needs a name")
    moment = (now or datetime.now(UTC)).astimezone(_zone(spec.get("timezone")))
    labels = {k: v for k, v in (meta.get("labels") or {}).items() if k in _PROPAGATED_LABELS}
    labels[LABEL_CRON_WORKFLOW] = name
    annotations = {ANNOTATION_SCHEDULED_TIME: rfc3339(moment)}
    extra = spec.get("workflowMetadata") or {}
    labels.update(extra.get("labels") or {})
    annotations.update(extra.get("annotations") or {})
    metadata: dict[str, Any] = {"name": f"{name}-{int(moment.timestamp())}",
                                "labels": labels, "annotations": annotations}
    if meta.get("namespace"):
        metadata["namespace"] = meta["namespace"]
    scheduling = [k for k in CRON_SCHEDULING_FIELDS if k in spec]
    notes = [f"CronWorkflow {name}: {', '.join(scheduling)} not applied (cron scheduling; "
             f"this is one run, started now)"] if scheduling else []
    return metadata, copy.deepcopy(spec["workflowSpec"]), notes


__all__ = ["TemplateLibrary", "cron_workflow", "inline_template_refs", "join_specs",
           "resolve_workflow_template_ref", "rfc3339", "strategic_merge"]
