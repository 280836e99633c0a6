"""Every field of Argo's Workflow spec is classified in ``runner.fields.FIELDS`` (supported,
refused or cluster-only), and the runner's checker does what the table says for each one.

A new Argo schema (pipelines/lint/schema/) that adds a field fails
``test_every_schema_field_is_classified`` until the field is classified in fields.py.
"""

from __future__ import annotations

import copy
import gzip
import json
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import yaml

from sublimate.pipelines.runner import ManifestError, load_manifest
from sublimate.pipelines.runner.manifest.fields import (
    CLUSTER_ONLY,
    CLUSTER_ONLY_FIELDS,
    FIELDS,
    REFUSED,
    SUPPORTED,
    field_pattern,
    paths_with,
)
from sublimate.pipelines.runner.manifest.load import (
    check_workflow,
    cluster_only_fields,
    cluster_only_note,
    unsupported_fields,
)

_DEF_PREFIX = "io.argoproj.workflow.v1alpha1."


@cache
def _definitions() -> dict[str, Any]:
    raw = resources.files("sublimate.pipelines.lint").joinpath(
        "schema/argo-workflows.schema.json.gz").read_bytes()
    return json.loads(gzip.decompress(raw))["definitions"]


def _resolve(schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        schema = _definitions()[schema["$ref"].rsplit("/", 1)[-1]]
    return schema


@cache
def _schema_fields() -> tuple[dict[str, dict[str, Any]], tuple[str, ...]]:
    """({path: its schema} for every field the table must classify, unclassified paths).

    Walks WorkflowSpec and, following $refs, the fields under every SUPPORTED field (a refused
    or cluster-only field decides for everything under it)."""
    found: dict[str, dict[str, Any]] = {}
    unclassified: list[str] = []

    def walk(schema: dict[str, Any], path: str) -> None:
        schema = _resolve(schema)
        if schema.get("type") == "array" or "items" in schema:
            walk(schema.get("items") or {}, f"{path}[]")
            return
        for key, sub in (schema.get("properties") or {}).items():
            child = f"{path}.{key}"
            found[child] = sub
            field = FIELDS.get(child)
            if field is None:
                unclassified.append(child)
            elif field.status == SUPPORTED:
                walk(sub, child)

    walk({"$ref": f"#/definitions/{_DEF_PREFIX}WorkflowSpec"}, "spec")
    return found, tuple(unclassified)


def test_every_schema_field_is_classified() -> None:
    _, unclassified = _schema_fields()
    assert not unclassified, (
        f"{len(unclassified)} fields of Argo's schema are not classified in "
        "pipelines/runner/manifest/fields.py (SUPPORTED, REFUSED or CLUSTER_ONLY):\n"
        + "\n".join(unclassified))


def test_the_table_names_only_schema_fields() -> None:
    found, _ = _schema_fields()
    stale = [path for path in FIELDS if path != "spec" and path not in found]
    assert not stale, "fields.py classifies paths Argo's schema does not have:\n" + \
        "\n".join(stale)
    for path, field in FIELDS.items():
        assert field.status in (SUPPORTED, REFUSED, CLUSTER_ONLY), path
        assert field.status == SUPPORTED or field.reason, f"{path}: give a reason"


# A workflow that uses every SUPPORTED field (the checker does not resolve references).
EVERYTHING = yaml.safe_load(textwrap.dedent("""
    spec:
      entrypoint: main
      onExit: leaf
      hooks:
        running: {expression: 'workflow.status == "Running"', template: leaf}
      parallelism: 2
      activeDeadlineSeconds: 600
      workflowTemplateRef: {name: base, clusterScope: false}
      arguments:
        parameters:
        - {name: p, value: "1", default: "0", enum: ["0", "1"], description: a parameter}
        artifacts:
        - {name: s3, s3: {bucket: b, key: k}, archive: {none: {}}}
        - {name: gcs, gcs: {bucket: b, key: k}, archive: {tar: {compressionLevel: 1}}}
        - {name: oss, oss: {bucket: b, key: k}}
        - {name: azure, azure: {container: c, blob: k}}
        - {name: hdfs, hdfs: {path: /k}}
        - {name: artifactory, artifactory: {url: "http://127.0.0.1/r/k"}}
        - {name: http, http: {url: "http://127.0.0.1/k", headers: [{name: A, value: b}]}}
        - {name: git, git: {repo: /tmp/repo, revision: main}}
        - {name: raw, raw: {data: x}}
      artifactRepositoryRef: {configMap: artifact-repositories, key: default}
      volumes:
      - name: work
        persistentVolumeClaim: {claimName: work, readOnly: false}
      - name: scratch
        emptyDir: {}
      volumeClaimTemplates:
      - metadata: {name: data}
      synchronization:
        mutexes: [{name: whole, namespace: argo}]
        semaphores:
        - {namespace: argo, configMapKeyRef: {name: limits, key: workflow, optional: false}}
      templates:
      - name: main
        failFast: true
        parallelism: 1
        synchronization:
          mutexes: [{name: one, namespace: argo}]
          semaphores:
          - {namespace: argo, configMapKeyRef: {name: limits, key: main, optional: true}}
        retryStrategy:
          limit: 2
          retryPolicy: OnFailure
          backoff: {duration: 1s, factor: 2, maxDuration: 1m, cap: 30s}
        outputs:
          parameters:
          - {name: picked, valueFrom: {expression: "tasks.b.status == 'Succeeded' ? 'b' : 'c'"}}
          artifacts:
          - {name: chosen, fromExpression: "tasks.e.outputs.artifacts.out"}
        dag:
          failFast: true
          target: "{{workflow.parameters.p}}"
          tasks:
          - name: a
            template: leaf
            when: "1 == 1"
            continueOn: {failed: true, error: true}
            withItems: [1, 2]
            arguments:
              parameters: [{name: x, value: "{{item}}"}]
              artifacts:
              - {name: data, from: "{{workflow.outputs.artifacts.out}}", subPath: x}
              - {name: picked, fromExpression: "workflow.outputs.artifacts.out"}
              - name: raw
                raw: {data: hello}
              - {name: s3, s3: {bucket: b, key: k}, archive: {none: {}}}
              - {name: gcs, gcs: {bucket: b, key: k}, archive: {tar: {compressionLevel: 1}}}
              - {name: oss, oss: {bucket: b, key: k}}
              - {name: azure, azure: {container: c, blob: k}}
              - {name: hdfs, hdfs: {path: /k}}
              - {name: artifactory, artifactory: {url: "http://127.0.0.1/r/k"}}
              - {name: http, http: {url: "http://127.0.0.1/k", headers: [{name: A, value: b}]}}
              - {name: git, git: {repo: /tmp/repo, revision: main}}
          - {name: b, template: leaf, dependencies: [a], withParam: "[1]"}
          - name: c
            template: leaf
            depends: a
            withSequence: {count: "2", start: "0", end: "1", format: "%02d"}
          - name: d
            template: leaf
            depends: c
            hooks:
              exit: {template: leaf}
          - {name: e, template: leaf, depends: d, onExit: leaf}
      - name: sequential
        steps:
        - - name: one
            template: leaf
            when: "1 == 1"
            continueOn: {failed: true, error: true}
            withItems: [1]
            arguments:
              parameters: [{name: x, value: "1"}]
              artifacts:
              - {name: data, from: "{{workflow.outputs.artifacts.out}}", subPath: x}
              - {name: picked, fromExpression: "workflow.outputs.artifacts.out"}
              - name: raw
                raw: {data: hello}
              - {name: s3, s3: {bucket: b, key: k}, archive: {none: {}}}
              - {name: gcs, gcs: {bucket: b, key: k}, archive: {tar: {compressionLevel: 1}}}
              - {name: oss, oss: {bucket: b, key: k}}
              - {name: azure, azure: {container: c, blob: k}}
              - {name: hdfs, hdfs: {path: /k}}
              - {name: artifactory, artifactory: {url: "http://127.0.0.1/r/k"}}
              - {name: http, http: {url: "http://127.0.0.1/k", headers: [{name: A, value: b}]}}
              - {name: git, git: {repo: /tmp/repo, revision: main}}
        - - {name: two, template: leaf, withParam: "[1]"}
          - {name: four, template: leaf, hooks: {exit: {template: leaf}}}
          - {name: five, template: leaf, onExit: leaf}
          - name: three
            template: leaf
            withSequence: {count: "2", start: "0", end: "1", format: "%02d"}
      - name: leaf
        inputs:
          parameters:
          - {name: x, value: "1", default: "0", enum: ["0", "1"], description: x}
          artifacts:
          - {name: data, path: /tmp/data, from: "{{workflow.outputs.artifacts.out}}",
             optional: true, mode: 0o644}
          - name: raw
            path: /tmp/raw
            raw: {data: hello}
          - {path: /tmp/in, name: s3, s3: {bucket: b, key: k}, archive: {none: {}}}
          - {path: /tmp/in, name: gcs, gcs: {bucket: b, key: k},
             archive: {tar: {compressionLevel: 1}}}
          - {path: /tmp/in, name: oss, oss: {bucket: b, key: k}}
          - {path: /tmp/in, name: azure, azure: {container: c, blob: k}}
          - {path: /tmp/in, name: hdfs, hdfs: {path: /k}}
          - {path: /tmp/in, name: artifactory, artifactory: {url: "http://127.0.0.1/r/k"}}
          - {path: /tmp/in, name: http,
             http: {url: "http://127.0.0.1/k", headers: [{name: A, value: b}]}}
          - {path: /tmp/in, name: git, git: {repo: /tmp/repo, revision: main}}
        outputs:
          parameters:
          - name: out
            description: out
            globalName: out
            valueFrom: {path: /tmp/out, default: "0", parameter: "{{inputs.parameters.x}}"}
          artifacts:
          - {name: out, path: /tmp/out, from: /tmp/out, optional: true, globalName: out,
             mode: 0o644}
          - {path: /tmp/o, name: s3, s3: {bucket: b, key: k}, archive: {none: {}}}
          - {path: /tmp/o, name: gcs, gcs: {bucket: b, key: k},
             archive: {tar: {compressionLevel: 1}}}
          - {path: /tmp/o, name: oss, oss: {bucket: b, key: k}}
          - {path: /tmp/o, name: azure, azure: {container: c, blob: k}}
          - {path: /tmp/o, name: hdfs, hdfs: {path: /k}}
          - {path: /tmp/o, name: artifactory, artifactory: {url: "http://127.0.0.1/r/k"}}
        volumes:
        - name: local
          persistentVolumeClaim: {claimName: local, readOnly: true}
        - name: tmp
          emptyDir: {}
        container:
          name: main
          command: ["true"]
          args: [x]
          workingDir: /tmp
          env:
          - {name: A, value: "1"}
          - name: TOKEN
            valueFrom:
              secretKeyRef: {name: s, key: k, optional: true}
          volumeMounts:
          - {name: work, mountPath: /mnt/work, subPath: x, readOnly: true}
      - name: scripted
        activeDeadlineSeconds: 60
        timeout: 1m
        pendingTimeout: 30s
        memoize:
          key: "scripted-{{workflow.parameters.p}}"
          maxAge: 10m
          cache: {configMap: {name: memo-cache}}
        script:
          name: main
          command: [python]
          args: [x]
          workingDir: /tmp
          source: print(1)
          env:
          - {name: A, value: "1"}
          - name: TOKEN
            valueFrom:
              secretKeyRef: {name: s, key: k, optional: true}
          volumeMounts:
          - {name: work, mountPath: /mnt/work, subPath: x, readOnly: true}
      - name: set
        initContainers:
        - name: setup
          command: ["true"]
          args: [x]
          workingDir: /tmp
          mirrorVolumeMounts: true
          env:
          - {name: A, value: "1"}
          - name: TOKEN
            valueFrom:
              secretKeyRef: {name: s, key: k, optional: true}
          volumeMounts:
          - {name: work, mountPath: /mnt/work, subPath: x, readOnly: true}
        sidecars:
        - name: helper
          command: ["true"]
          args: [x]
          workingDir: /tmp
          mirrorVolumeMounts: true
          env:
          - {name: A, value: "1"}
          - name: TOKEN
            valueFrom:
              secretKeyRef: {name: s, key: k, optional: true}
          volumeMounts:
          - {name: work, mountPath: /mnt/work, subPath: x, readOnly: true}
        containerSet:
          retryStrategy: {retries: "2", duration: 1s}
          volumeMounts:
          - {name: scratch, mountPath: /mnt/scratch, subPath: x, readOnly: true}
          containers:
          - name: a
            command: ["true"]
          - name: main
            dependencies: [a]
            command: ["true"]
            args: [x]
            workingDir: /tmp
            env:
            - {name: A, value: "1"}
            - name: TOKEN
              valueFrom:
                secretKeyRef: {name: s, key: k, optional: true}
            volumeMounts:
            - {name: work, mountPath: /mnt/work, subPath: x, readOnly: true}
"""))

# Fields every container takes (env from Secrets and ConfigMaps), the main container's
# readiness probe (a daemon's), and the template kinds and volumes that need no command.
_ENV_FROM_OBJECTS = yaml.safe_load(textwrap.dedent("""
    env:
    - name: SETTING
      valueFrom:
        configMapKeyRef: {name: settings, key: k, optional: true}
    envFrom:
    - prefix: DB_
      secretRef: {name: db, optional: true}
    - configMapRef: {name: settings, optional: false}
"""))
_READINESS = yaml.safe_load(textwrap.dedent("""
    readinessProbe:
      exec: {command: ["true"]}
      httpGet:
        host: 127.0.0.1
        path: /ready
        port: 8080
        scheme: HTTP
        httpHeaders: [{name: A, value: b}]
      tcpSocket: {host: 127.0.0.1, port: 8080}
      initialDelaySeconds: 0
      periodSeconds: 1
      timeoutSeconds: 1
      successThreshold: 1
      failureThreshold: 3
"""))
_MORE = yaml.safe_load(textwrap.dedent("""
    spec:
      retryStrategy:
        limit: 1
        retryPolicy: Always
        backoff: {duration: 1s, factor: 2, maxDuration: 1m, cap: 30s}
      volumes:
      - name: credentials
        secret:
          secretName: db
          items: [{key: password, path: password, mode: 0o400}]
          defaultMode: 0o440
          optional: false
      - name: settings
        configMap:
          name: settings
          items: [{key: k, path: k.txt, mode: 0o644}]
          defaultMode: 0o644
          optional: true
      templates:
      - name: approve
        inputs:
          parameters: [{name: approve, default: "NO", enum: ["YES", "NO"]}]
        suspend: {duration: 1h}
        outputs:
          parameters:
          - {name: approve, enum: ["YES", "NO"], valueFrom: {supplied: {}}}
          - {name: static, value: "1"}
      - name: served
        daemon: true
        container: {command: ["true"]}
      - name: listing
        data:
          source:
            artifactPaths: {name: listed, s3: {bucket: b, key: k}}
          transformation:
          - expression: 'filter(data, {# endsWith ".csv"})'
      - name: request
        http:
          method: POST
          url: http://127.0.0.1:8080/hook
          body: hello
          bodyFrom: {bytes: aGVsbG8=}
          headers:
          - {name: A, value: b}
          - name: Authorization
            valueFrom:
              secretKeyRef: {name: db, key: token, optional: false}
          timeoutSeconds: 5
          insecureSkipVerify: false
          successCondition: response.statusCode == 200
"""))


def _everything() -> dict:
    workflow = copy.deepcopy(EVERYTHING)
    spec, more = workflow["spec"], copy.deepcopy(_MORE["spec"])
    spec["retryStrategy"] = more["retryStrategy"]
    spec["volumes"] += more["volumes"]
    spec["templates"] += more["templates"]
    served = next(t for t in spec["templates"] if t["name"] == "served")
    served["volumes"] = copy.deepcopy(more["volumes"])
    for kind, location in (("gcs", {"bucket": "b", "key": "k"}),
                           ("oss", {"bucket": "b", "key": "k"}),
                           ("azure", {"container": "c", "blob": "k"}), ("hdfs", {"path": "/k"}),
                           ("artifactory", {"url": "http://127.0.0.1/r/k"})):
        spec["templates"].append({"name": f"listing-{kind}", "data": {"source": {
            "artifactPaths": {"name": "listed", kind: location}}}})
    for template in spec["templates"]:
        bodies = [template[key] for key in ("container", "script") if key in template]
        for body in bodies:
            body.update(copy.deepcopy(_READINESS))
        bodies += template.get("initContainers") or []
        bodies += template.get("sidecars") or []
        bodies += (template.get("containerSet") or {}).get("containers") or []
        for body in bodies:
            if "env" in body:
                body["env"] = body["env"] + _ENV_FROM_OBJECTS["env"]
                body["envFrom"] = copy.deepcopy(_ENV_FROM_OBJECTS["envFrom"])
            # applied locally: runner/pods/resource_limits.py and sandbox.py
            body["resources"] = {"limits": {"memory": "64Mi", "cpu": "1"}}
            body["securityContext"] = {"privileged": False, "allowPrivilegeEscalation": False,
                                       "capabilities": {"drop": ["ALL"], "add": ["CHOWN"]}}
    return workflow


def _nodes(value: Any, path: str = "spec") -> Iterator[tuple[str, Any]]:
    """(concrete path, value) of every mapping key and list item under ``value``."""
    yield path, value
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _nodes(item, f"{path}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _nodes(item, f"{path}[{i}]")


def test_every_supported_field_is_accepted() -> None:
    """One manifest uses every SUPPORTED field; the checker accepts it, finds nothing
    cluster-only in it, and it leaves no SUPPORTED field out."""
    workflow = _everything()
    check_workflow(workflow)
    assert cluster_only_fields(workflow) == []
    used = {field_pattern(path) for path, _ in _nodes(workflow["spec"])}
    missing = [path for path in paths_with(SUPPORTED) if path not in used]
    assert not missing, "SUPPORTED fields the example does not show accepted:\n" + \
        "\n".join(missing)


def _example_value(schema: dict[str, Any]) -> Any:
    schema = _resolve(schema)
    kind = schema.get("type")
    if kind == "array" or "items" in schema:
        return []
    if kind == "boolean":
        return True
    if kind == "integer":
        return 1
    if kind == "string" or (isinstance(kind, list) and "string" in kind):
        return "x"
    return {}


def _with_field(path: str) -> tuple[dict, str]:
    """EVERYTHING with the field at ``path`` (a pattern) added to the first mapping where it
    can go; and the field's concrete path."""
    workflow = _everything()
    parent, key = path.rsplit(".", 1)
    for concrete, value in _nodes(workflow["spec"]):
        if isinstance(value, dict) and field_pattern(concrete) == parent:
            value[key] = _example_value(_schema_fields()[0][path])
            return {"spec": workflow["spec"]}, f"{concrete}.{key}"
    raise AssertionError(f"{path}: the example has no {parent} to add it to")


@pytest.mark.parametrize("path", paths_with(REFUSED))
def test_refused_fields_are_refused_by_name(path: str) -> None:
    workflow, concrete = _with_field(path)
    problems = unsupported_fields(workflow)
    assert [p for p in problems if p.startswith(f"{concrete}:")], \
        f"{path} is REFUSED in fields.py but the checker says {problems}"
    assert cluster_only_fields(workflow) == []


@pytest.mark.parametrize("path", paths_with(CLUSTER_ONLY))
def test_cluster_only_fields_are_accepted_and_reported(path: str) -> None:
    workflow, concrete = _with_field(path)
    assert unsupported_fields(workflow) == [], f"{path} is CLUSTER_ONLY in fields.py"
    assert cluster_only_fields(workflow) == [concrete]
    note = cluster_only_note(workflow)
    assert note is not None and note.startswith("not applied locally: ")
    short = field_pattern(path).replace("[]", "").removeprefix("spec.")
    assert short.removeprefix("templates.") in note


def test_cluster_only_fields_are_noted_once_per_run(tmp_path: Path) -> None:
    manifest = tmp_path / "wf.yaml"
    manifest.write_text(textwrap.dedent("""
        apiVersion: argoproj.io/v1alpha1
        kind: Workflow
        metadata: {generateName: wf-}
        spec:
          entrypoint: main
          serviceAccountName: runner
          podGC: {strategy: OnPodSuccess}
          nodeSelector: {gpu: "true"}
          templates:
          - name: main
            steps: [[{name: a, template: leaf}, {name: b, template: leaf}]]
          - name: leaf
            tolerations: [{key: gpu, operator: Exists}]
            container:
              image: python:3.11
              command: ["true"]
              resources: {requests: {cpu: "1"}}
          - name: other
            container: {image: python:3.11, command: ["true"]}
    """))
    notes: list[str] = []
    workflow = load_manifest(manifest, notes=notes)
    assert notes == [
        "not applied locally: container.image, container.resources.requests, nodeSelector, podGC, "
        "serviceAccountName, tolerations (cluster-only: scheduling, images, resources, pod and "
        "security settings, garbage collection, metrics, archiving)"]
    check_workflow(workflow)  # accepted all the same
    bare = {"spec": {"entrypoint": "main", "templates": [
        {"name": "main", "container": {"command": ["true"]}}]}}
    assert cluster_only_note(bare) is None


def test_an_image_volume_is_refused_not_ignored() -> None:
    """``image`` is cluster-only on a container, but an image *volume* would mount nothing."""
    workflow, concrete = _with_field("spec.volumes[].image")
    with pytest.raises(ManifestError, match=re.escape(f"{concrete}: field is not supported")):
        check_workflow(workflow)


def test_cluster_only_names_are_no_template_key() -> None:
    """plan.py leaves a template's CLUSTER_ONLY_FIELDS keys unsubstituted: none may be a
    supported template field."""
    template_keys = {path.removeprefix("spec.templates[].") for path in paths_with(SUPPORTED)
                     if path.startswith("spec.templates[].")}
    assert not CLUSTER_ONLY_FIELDS & template_keys


def test_the_run_path_does_not_read_the_schema() -> None:
    code = ("import sys; import sublimate.pipelines.runner.manifest.load; "
            "print(sorted(m for m in ('jsonschema', 'gzip', 'sublimate.pipelines.lint.schema') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"
