"""Loading, normalising and validating rendered Argo manifests.

Validation walks the spec against a whitelist so that no field is ever silently ignored:
a key is either supported, cluster-only (accepted, not applied, and reported once as a note:
``fields.FIELDS`` says which) or reported with its path.
"""

from __future__ import annotations

import copy
from collections.abc import Collection, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from sublimate.pipelines.argo_terms import object_name_problem, unknown_targets

from ..errors import ManifestError
from ..expressions.conditions import ExpressionError, parse_depends
from ..expressions.substitution import expression_sites
from .durations import timing_problems
from .fields import CLUSTER_ONLY, SUPPORTED, classify, field_pattern
from .library import (
    TEMPLATE_KINDS,
    TemplateLibrary,
    cron_workflow,
    doc_name,
    inline_template_refs,
    resolve_workflow_template_ref,
)
from .repository import remote_problems
from .template_checks import (
    COMMAND_REQUIRED,
    container_body_problems,
    container_problems,
    hook_problems,
    kind_problems,
    memoize_problems,
)

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

WORKFLOW_KINDS = ("Workflow", "WorkflowTemplate", "ClusterWorkflowTemplate", "CronWorkflow")



# Known Argo features with a friendlier name for the error message.
_REFUSED = {
    "resource": "resource templates",
    "plugin": "plugin templates",
    "templateRef": "templateRef",
    "inline": "inline templates",
    "expression": "expressions",
    "podSpecPatch": "podSpecPatch",
    "templateDefaults": "templateDefaults",
    "database": "database synchronization locks",
    "valueFrom": "valueFrom",
    "shutdown": "spec.shutdown",
}
_ARTIFACT_LOCATIONS = (
    "s3",
    "gcs",
    "http",
    "git",
    "artifactory",
    "hdfs",
    "oss",
    "azure",
    "raw",
    "plugin",
)

ANY = None  # accepted scalar or opaque value


def _list(spec: Any) -> tuple[str, Any]:
    return ("list", spec)


# Artifact locations (fields.py says which of their fields are cluster-only): the buckets the
# home's artifact repository stands in for, and http/git fetched from this machine.
_BUCKETS = {
    "s3": {"bucket": ANY, "key": ANY},
    "gcs": {"bucket": ANY, "key": ANY},
    "oss": {"bucket": ANY, "key": ANY},
    "azure": {"container": ANY, "blob": ANY},
    "hdfs": {"path": ANY},
    "artifactory": {"url": ANY},
}
_FETCHED = {
    "http": {"url": ANY, "headers": _list({"name": ANY, "value": ANY})},
    "git": {"repo": ANY, "revision": ANY},
}
_ARCHIVE = {"archive": {"none": ANY, "tar": {"compressionLevel": ANY}}}
_ARGUMENTS = {
    "parameters": _list({"name": ANY, "value": ANY}),
    "artifacts": _list({"name": ANY, "from": ANY, "raw": {"data": ANY}, "subPath": ANY,
                        "fromExpression": ANY, **_ARCHIVE, **_BUCKETS, **_FETCHED}),
}
# Secrets and ConfigMaps come from manifests (pipelines/runner/pods/k8s_objects.py).
_KEY_REF = {"name": ANY, "key": ANY, "optional": ANY}
_ENV = _list({"name": ANY, "value": ANY,
              "valueFrom": {"secretKeyRef": _KEY_REF, "configMapKeyRef": _KEY_REF}})
_ENV_FROM = _list({"prefix": ANY, "secretRef": {"name": ANY, "optional": ANY},
                   "configMapRef": {"name": ANY, "optional": ANY}})
_MOUNTS = _list({"name": ANY, "mountPath": ANY, "subPath": ANY, "readOnly": ANY})
_CONTAINER = {
    "name": ANY,
    "command": ANY,
    "args": ANY,
    "env": _ENV,
    "envFrom": _ENV_FROM,
    "workingDir": ANY,
    "volumeMounts": _MOUNTS,
    # Applied locally (runner/pods/resource_limits.py, sandbox.py); their other keys are
    # cluster-only (manifest/fields.py).
    "resources": {"limits": ANY},
    "securityContext": {"privileged": ANY, "allowPrivilegeEscalation": ANY,
                        "capabilities": {"add": ANY, "drop": ANY}},
}
# A daemon's readiness (runner/templates/probes.py); other containers' probes are cluster-only.
_PROBE = {"exec": {"command": ANY},
          "httpGet": {"host": ANY, "path": ANY, "port": ANY, "scheme": ANY,
                      "httpHeaders": _list({"name": ANY, "value": ANY})},
          "tcpSocket": {"host": ANY, "port": ANY},
          "initialDelaySeconds": ANY, "periodSeconds": ANY, "timeoutSeconds": ANY,
          "successThreshold": ANY, "failureThreshold": ANY}
_MAIN = {**_CONTAINER, "readinessProbe": _PROBE}
_SCRIPT = {**_MAIN, "source": ANY}
_LOOP = {"withItems": ANY, "withParam": ANY, "withSequence": {"count": ANY, "start": ANY,
                                                              "end": ANY, "format": ANY}}
_STEP = {
    "name": ANY,
    "template": ANY,
    "arguments": _ARGUMENTS,
    "when": ANY,
    "continueOn": {"failed": ANY, "error": ANY},
    **_LOOP,
    "hooks": ANY,  # checked by template_checks.hook_problems
    "onExit": ANY,
}
_TASK = {**_STEP, "dependencies": ANY, "depends": ANY}
_ITEMS = _list({"key": ANY, "path": ANY, "mode": ANY})
_VOLUME = {"name": ANY, "persistentVolumeClaim": {"claimName": ANY, "readOnly": ANY},
           "emptyDir": ANY,
           "secret": {"secretName": ANY, "items": _ITEMS, "defaultMode": ANY, "optional": ANY},
           "configMap": {"name": ANY, "items": _ITEMS, "defaultMode": ANY, "optional": ANY}}
# runner/templates/synchronization.py emulates these for the run's own nodes ("database": _REFUSED)
_SYNCHRONIZATION = {
    "mutexes": _list({"name": ANY, "namespace": ANY}),
    "semaphores": _list({"namespace": ANY,
                         "configMapKeyRef": {"name": ANY, "key": ANY, "optional": ANY}}),
}
_TEMPLATE = {
    "name": ANY,
    "inputs": {
        "parameters": _list(
            {"name": ANY, "value": ANY, "default": ANY, "enum": ANY, "description": ANY}
        ),
        "artifacts": _list(
            {"name": ANY, "path": ANY, "from": ANY, "optional": ANY, "raw": {"data": ANY},
             "mode": ANY, **_ARCHIVE, **_BUCKETS, **_FETCHED}
        ),
    },
    "outputs": {
        "parameters": _list(
            {
                "name": ANY,
                "value": ANY,
                "enum": ANY,
                "description": ANY,
                "globalName": ANY,
                "valueFrom": {"path": ANY, "default": ANY, "parameter": ANY, "expression": ANY,
                              "supplied": ANY},
            }
        ),
        "artifacts": _list(
            {"name": ANY, "path": ANY, "from": ANY, "optional": ANY, **_ARCHIVE,
             "globalName": ANY, "mode": ANY, "fromExpression": ANY, **_BUCKETS}
        ),
    },
    "container": _MAIN,
    "script": _SCRIPT,
    # pipelines/runner/templates/suspend.py, daemons.py, data_template.py, http_template.py
    "suspend": {"duration": ANY},
    "daemon": ANY,
    "data": {"source": {"artifactPaths": {"name": ANY, **_BUCKETS}},
             "transformation": _list({"expression": ANY})},
    "http": {"method": ANY, "url": ANY, "body": ANY, "bodyFrom": {"bytes": ANY},
             "headers": _list({"name": ANY, "value": ANY,
                               "valueFrom": {"secretKeyRef": _KEY_REF}}),
             "timeoutSeconds": ANY, "insecureSkipVerify": ANY, "successCondition": ANY},
    # pipelines/runner/pods/container_set.py runs these, template_checks.py checks them
    "containerSet": {
        "containers": _list({**_CONTAINER, "dependencies": ANY}),
        "volumeMounts": _MOUNTS,
        "retryStrategy": {"retries": ANY, "duration": ANY},
    },
    "initContainers": _list({**_CONTAINER, "mirrorVolumeMounts": ANY}),
    "sidecars": _list({**_CONTAINER, "mirrorVolumeMounts": ANY}),
    "dag": {"tasks": _list(_TASK), "failFast": ANY, "target": ANY},
    "steps": _list(_list(_STEP)),
    "retryStrategy": {
        "limit": ANY,
        "retryPolicy": ANY,
        "backoff": {"duration": ANY, "factor": ANY, "maxDuration": ANY, "cap": ANY},
    },
    "activeDeadlineSeconds": ANY,
    "timeout": ANY,
    "pendingTimeout": ANY,
    "parallelism": ANY,
    "failFast": ANY,
    "volumes": _list(_VOLUME),
    "synchronization": _SYNCHRONIZATION,
    # runner/templates/memoize.py; a ConfigMap reference is a name only (LocalObjectReference)
    "memoize": {"key": ANY, "maxAge": ANY, "cache": {"configMap": {"name": ANY}}},
}
_SPEC = {
    "entrypoint": ANY,
    "retryStrategy": _TEMPLATE["retryStrategy"],  # every template's default (operator.go)
    "synchronization": _SYNCHRONIZATION,
    "arguments": {"parameters": _list(
        {"name": ANY, "value": ANY, "default": ANY, "enum": ANY, "description": ANY}
    ), "artifacts": _list({"name": ANY, "raw": {"data": ANY}, **_ARCHIVE, **_BUCKETS,
                           **_FETCHED})},
    "artifactRepositoryRef": {"configMap": ANY, "key": ANY},
    "templates": _list(_TEMPLATE),
    "onExit": ANY,
    "hooks": ANY,  # checked by template_checks.hook_problems
    "parallelism": ANY,
    "activeDeadlineSeconds": ANY,
    "volumes": _list(_VOLUME),
    "volumeClaimTemplates": ANY,
    "workflowTemplateRef": {"name": ANY, "clusterScope": ANY},
}


def _walk(value: Any, spec: Any, path: str, problems: list[str]) -> None:
    if spec is ANY:
        return
    if isinstance(spec, tuple):
        if not isinstance(value, list):
            problems.append(f"{path}: expected a list")
            return
        for i, item in enumerate(value):
            _walk(item, spec[1], f"{path}[{i}]", problems)
        return
    if not isinstance(value, dict):
        problems.append(f"{path}: expected a mapping")
        return
    for key, item in value.items():
        sub = f"{path}.{key}"
        if key in spec:
            _walk(item, spec[key], sub, problems)
        elif _cluster_only(sub):
            continue
        elif key in _ARTIFACT_LOCATIONS and ".artifacts[" in path:
            problems.append(
                f"{sub}: {key} artifact locations are not supported here by the local runner"
                " (outputs go to the home's artifact repository; http and git are only"
                " fetched, from this machine)"
            )
        elif key == "templateRef":
            problems.append(f"{sub}: templateRef are not supported by the local runner without "
                            "templates to resolve them from (run the manifest from a file: its "
                            "folder is searched; or pass --templates DIR)")
        elif key in _REFUSED:
            problems.append(f"{sub}: {_REFUSED[key]} are not supported by the local runner")
        elif key in ("hostPath", "nfs", "projected", "downwardAPI", "csi", "ephemeral"):
            problems.append(f"{sub}: {key} volumes are not supported by the local runner")
        else:
            problems.append(f"{sub}: field is not supported by the local runner")


def _cluster_only(path: str) -> bool:
    field = classify(path)
    return field is not None and field.status == CLUSTER_ONLY


def cluster_only_fields(workflow: dict) -> list[str]:
    """The paths of the cluster-only fields (``fields.FIELDS``) a workflow sets, in order: what
    a local run accepts and does not apply."""
    found: list[str] = []

    def walk(value: Any, path: str) -> None:
        if isinstance(value, dict):
            items = [(f"{path}.{key}", item) for key, item in value.items()]
        elif isinstance(value, list):
            items = [(f"{path}[{i}]", item) for i, item in enumerate(value)]
        else:
            return
        for sub, item in items:
            field = classify(sub)
            if field is not None and field.status == CLUSTER_ONLY:
                found.append(sub)
            elif isinstance(value, list) or (field is not None and field.status == SUPPORTED):
                walk(item, sub)

    walk(workflow.get("spec"), "spec")
    return found


def cluster_only_note(workflow: dict, applied: Collection[str] = ()) -> str | None:
    """One line naming the cluster-only fields a workflow sets, or None when it sets none;
    ``applied``: field names this run applies after all (``image`` in container mode)."""
    names = sorted({name for name in map(_short_name, cluster_only_fields(workflow))
                    if name.rsplit(".", 1)[-1] not in applied})
    if not names:
        return None
    return (f"not applied locally: {', '.join(names)} (cluster-only: scheduling, images, "
            "resources, pod and security settings, garbage collection, metrics, archiving)")


def _short_name(path: str) -> str:
    """``spec.templates[3].container.image`` -> ``container.image``."""
    name = field_pattern(path).replace("[]", "").removeprefix("spec.")
    return name.removeprefix("templates.")


def _strings(value: Any, path: str):
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _strings(item, f"{path}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _strings(item, f"{path}[{i}]")


def unsupported_fields(workflow: dict) -> list[str]:
    """Every unsupported or malformed field of a normalised workflow, each with its path.

    Covers the whitelist walk plus the checks that need context: template references,
    ``depends`` syntax, volume names, container commands and ``{{=...}}`` expression tags.
    """
    problems: list[str] = []
    metadata = workflow.get("metadata")
    for key in ("name", "generateName"):  # the run folder is named after them
        value = metadata.get(key) if isinstance(metadata, dict) else None
        if value is not None:
            problem = object_name_problem(str(value), prefix=key == "generateName")
            if problem is not None:
                problems.append(f"metadata.{key}: {problem}")
    spec = workflow.get("spec")
    if not isinstance(spec, dict):
        return [*problems, "spec: missing"]
    _walk(spec, _SPEC, "spec", problems)
    sites = expression_sites(spec, _strings(spec, "spec"))
    if sites:
        from ..expressions.expr_lang import (
            site_problems,  # only a manifest with expressions pays for lark
        )

        problems += site_problems(sites)
    templates = spec.get("templates") or []
    problems += remote_problems(spec)  # http/git artifacts elsewhere than this machine
    names = {t.get("name") for t in templates if isinstance(t, dict)}
    entry = spec.get("entrypoint")
    if not entry:
        problems.append("spec.entrypoint: missing")
    elif entry not in names:
        problems.append(f"spec.entrypoint: template {entry!r} not found")
    if spec.get("hooks") is not None:
        problems += hook_problems(spec, "spec", names)
        if isinstance(spec["hooks"], dict) and isinstance(spec["hooks"].get("exit"), dict) \
                and "expression" in spec["hooks"]["exit"]:
            problems.append("spec.hooks.exit.expression: Argo runs the workflow's exit hook "
                            "whatever its expression (operator.go); remove it")
    elif spec.get("onExit") and spec["onExit"] not in names:
        problems.append(f"spec.onExit: template {spec['onExit']!r} not found")
    workflow_volumes = _volume_names(spec, "spec", problems)
    for i, claim in enumerate(spec.get("volumeClaimTemplates") or []):
        name = (claim.get("metadata") or {}).get("name") if isinstance(claim, dict) else None
        if not name:
            problems.append(f"spec.volumeClaimTemplates[{i}].metadata.name: missing")
        else:
            workflow_volumes.add(name)
    for number in ("parallelism", "activeDeadlineSeconds"):
        _check_int(spec, number, "spec", problems)
    _check_retry_policy(spec, "spec", problems)
    for i, template in enumerate(templates):
        if isinstance(template, dict):
            _check_template(template, f"spec.templates[{i}]", names, workflow_volumes, problems)
    return list(dict.fromkeys(problems))


def _check_int(holder: dict, key: str, path: str, problems: list[str]) -> None:
    value = holder.get(key)
    if value is None or (isinstance(value, str) and "{{" in value):
        return
    try:
        int(value)
    except (TypeError, ValueError):
        problems.append(f"{path}.{key}: {value!r} is not an integer")


def _volume_names(holder: dict, path: str, problems: list[str]) -> set[str]:
    names: set[str] = set()
    for i, volume in enumerate(holder.get("volumes") or []):
        if not isinstance(volume, dict):
            continue
        kinds = [k for k in volume if k != "name"]
        if not volume.get("name"):
            problems.append(f"{path}.volumes[{i}].name: missing")
        if kinds == ["persistentVolumeClaim"] and not volume[kinds[0]].get("claimName"):
            problems.append(f"{path}.volumes[{i}].persistentVolumeClaim.claimName: missing")
        names.add(volume.get("name"))
    return names


def _check_template(
    template: dict, path: str, names: set, volumes: set[str], problems: list[str]
) -> None:
    kinds = [k for k in ("container", "script", "dag", "steps", "containerSet", "suspend",
                         "http", "data") if k in template]
    refused = [k for k in template if k in ("resource", "plugin")]
    if len(kinds) + len(refused) == 0:
        problems.append(f"{path}: template has no container, script, dag, steps, suspend, "
                        "http or data")
    elif len(kinds) > 1:
        problems.append(f"{path}: template has more than one of {', '.join(kinds)}")
    if not template.get("name"):
        problems.append(f"{path}.name: missing")
    local_volumes = volumes | _volume_names(template, path, problems)
    if any(k in template for k in ("containerSet", "initContainers", "sidecars")):
        problems += container_problems(template, path, local_volumes)
    for kind in ("container", "script"):
        body = template.get(kind)
        if isinstance(body, dict):
            problems += container_body_problems(body, f"{path}.{kind}", local_volumes)
    problems += timing_problems(template, path)  # timeout, deadlines, backoff (validate.go)
    problems += kind_problems(template, path)  # suspend, daemon, data, http, outputs
    if "memoize" in template:  # run by templates/memoize
        problems += memoize_problems(template["memoize"], path)
    for number in ("parallelism", "activeDeadlineSeconds"):
        _check_int(template, number, path, problems)
    _check_retry_policy(template, path, problems)
    dag = template.get("dag")
    if isinstance(dag, dict):
        tasks = [t for t in dag.get("tasks") or [] if isinstance(t, dict)]
        task_names = {t.get("name") for t in tasks}
        for j, task in enumerate(tasks):
            _check_call(task, f"{path}.dag.tasks[{j}]", names, problems)
            if "depends" in task and "dependencies" in task:
                problems.append(f"{path}.dag.tasks[{j}]: use either depends or dependencies")
            deps = list(task.get("dependencies") or [])
            if task.get("depends"):
                try:
                    from ..expressions.conditions import depends_references

                    ast = parse_depends(str(task["depends"]))
                    deps += [name for name, _ in depends_references(ast)]
                except ExpressionError as exc:
                    problems.append(f"{path}.dag.tasks[{j}].depends: {exc}")
            for dep in deps:
                if dep not in task_names:
                    problems.append(f"{path}.dag.tasks[{j}]: depends on unknown task {dep!r}")
        # validate.go validateDAGTargets: each literal target names a task.
        for target in unknown_targets(str(dag.get("target") or ""), task_names):
            problems.append(f"{path}.dag.target: target {target!r} is not defined")
    steps = template.get("steps")
    if isinstance(steps, list):
        for j, group in enumerate(steps):
            for k, step in enumerate(group if isinstance(group, list) else []):
                if isinstance(step, dict):
                    _check_call(step, f"{path}.steps[{j}][{k}]", names, problems)


def _check_retry_policy(holder: dict, path: str, problems: list[str]) -> None:
    policy = (holder.get("retryStrategy") or {}).get("retryPolicy")
    if policy not in (None, "Always", "OnFailure", "OnError", "OnTransientError"):
        problems.append(f"{path}.retryStrategy.retryPolicy: unknown policy {policy!r}")


def _check_call(call: dict, path: str, names: set, problems: list[str]) -> None:
    if not call.get("name"):
        problems.append(f"{path}.name: missing")
    if "template" not in call:
        if "templateRef" not in call and "inline" not in call:
            problems.append(f"{path}.template: missing")
    elif call["template"] not in names:
        problems.append(f"{path}.template: template {call['template']!r} not found")
    loops = [k for k in ("withItems", "withParam", "withSequence") if k in call]
    if len(loops) > 1:
        problems.append(f"{path}: only one of {', '.join(loops)} may be used")
    if "hooks" in call or "onExit" in call:
        problems += hook_problems(call, path, names, looped=bool(loops))


# ------------------------------------------------------------------------------ loading


def load_manifest(path_or_text: str | Path, name: str | None = None,
                  template_dirs: Sequence[str | Path] = (),
                  notes: list[str] | None = None, now: datetime | None = None,
                  applied: Collection[str] = ()) -> dict:
    """Read a (multi-document) YAML manifest and return the normalised Workflow to run.

    ``path_or_text`` is a file path, or YAML text when it contains a newline. The templates it
    refers to (``workflowTemplateRef``, ``templateRef``) are looked up in the manifest, in the
    other YAML files of its folder and in ``template_dirs`` (see ``library``). What is accepted
    but not applied (a CronWorkflow's scheduling, cluster-only fields but those ``applied``:
    ``cluster_only_note``) is appended to ``notes``; ``now`` is when a CronWorkflow fires
    (default: this moment).
    """
    own_file: Path | None = None
    if isinstance(path_or_text, Path) or "\n" not in path_or_text:
        own_file = Path(path_or_text)
        try:
            data = own_file.read_bytes()
        except OSError as exc:
            raise ManifestError(f"cannot read manifest {str(path_or_text)!r}: {exc}") from exc
        try:
            # YAML (and Kubernetes) read UTF-8: a file in another encoding is refused in one
            # line that says where, not with the decoder's traceback.
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            line = data.count(b"\n", 0, exc.start) + 1
            raise ManifestError(f"cannot read manifest {str(path_or_text)!r}: not UTF-8 text "
                                f"(byte {data[exc.start]:#04x} on line {line})") from None
    else:
        text = path_or_text
    try:
        docs = [d for d in yaml.load_all(text, Loader=_LOADER) if d is not None]
    except yaml.YAMLError as exc:
        raise ManifestError(f"invalid YAML: {exc}") from exc
    for i, doc in enumerate(docs):
        if not isinstance(doc, dict):
            raise ManifestError(f"document {i}: expected a mapping")
    candidates = [d for d in docs if d.get("kind") in WORKFLOW_KINDS]
    if not candidates:
        raise ManifestError("no Workflow, WorkflowTemplate or CronWorkflow document found")
    if name is not None:
        candidates = [d for d in candidates if doc_name(d) == name]
        if not candidates:
            known = ", ".join(doc_name(d) for d in docs if d.get("kind") in WORKFLOW_KINDS)
            raise ManifestError(f"no workflow named {name!r} in the manifest (found: {known})")
    elif len(candidates) > 1:
        # A Workflow that refers to templates in the same file is the obvious choice.
        workflows = [d for d in candidates if d.get("kind") in ("Workflow", "CronWorkflow")]
        if len(workflows) == 1:
            candidates = workflows
    if len(candidates) > 1:
        found = ", ".join(f"{d.get('kind')}/{doc_name(d)}" for d in candidates)
        raise ManifestError(f"several workflows in the manifest ({found}); choose one by name")
    folders = [own_file.parent] if own_file is not None else []
    for folder in template_dirs:
        if not Path(folder).is_dir():
            raise ManifestError(f"--templates {folder}: not a folder")
        folders.append(Path(folder))
    library = TemplateLibrary(folders, [(d, str(own_file or "the manifest")) for d in docs],
                              own_file)
    workflow = normalise_workflow(candidates[0], library, notes=notes, now=now)
    if notes is not None and (note := cluster_only_note(workflow, applied)):
        notes.append(note)
    return workflow


def normalise_workflow(doc: dict, workflow_templates: TemplateLibrary | dict[str, dict] | None
                       = None, *, notes: list[str] | None = None, now: datetime | None = None
                       ) -> dict:
    """Turn a Workflow, WorkflowTemplate, ClusterWorkflowTemplate or CronWorkflow document into
    the plain Workflow Argo would run: a template as ``argo submit --from`` submits it, a
    CronWorkflow as its schedule starts it (``library.cron_workflow``), with
    ``spec.workflowTemplateRef`` joined (``library.join_specs``) and steps' and tasks'
    ``templateRef`` copied in when there are templates to find them in."""
    doc = copy.deepcopy(doc)
    kind = doc.get("kind", "Workflow")
    meta = dict(doc.get("metadata") or {})
    if kind == "CronWorkflow":
        meta, spec, cron_notes = cron_workflow(doc, now)
        if notes is not None:
            notes += cron_notes
    elif kind in TEMPLATE_KINDS:
        spec = doc.get("spec") or {}
        meta = _submitted_metadata(meta)
    elif kind == "Workflow":
        spec = doc.get("spec") or {}
    else:
        raise ManifestError(f"kind: {kind!r} is not a workflow")
    if isinstance(workflow_templates, dict):  # {name: WorkflowTemplate document}
        workflow_templates = TemplateLibrary(
            documents=[(d, "the manifest") for d in workflow_templates.values()])
    if not isinstance(spec, dict):
        raise ManifestError("spec: expected a mapping")
    spec = resolve_workflow_template_ref(spec, workflow_templates)
    if workflow_templates is not None and not workflow_templates.empty():
        spec = inline_template_refs(spec, workflow_templates)
    return {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow", "metadata": meta,
            "spec": spec}


def _submitted_metadata(meta: dict) -> dict:
    name = meta.pop("name", None)
    meta.pop("generateName", None)
    meta["generateName"] = f"{name}-" if name else "workflow-"
    return meta


def check_workflow(workflow: dict, images: bool = False) -> None:
    """``ManifestError`` listing every problem; ``images``: pods run in their images (a
    container's command may be the image's entrypoint)."""
    problems = unsupported_fields(workflow)
    if images:
        problems = [p for p in problems if not p.endswith(COMMAND_REQUIRED)]
    if problems:
        count = len(problems)
        raise ManifestError(
            f"{count} problem{'s' if count > 1 else ''} in the manifest:\n  "
            + "\n  ".join(problems)
        )
