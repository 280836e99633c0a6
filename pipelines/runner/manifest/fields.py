"""What the local runner does with each field of an Argo Workflow spec: one table, ``FIELDS``.

A field is named by its path from the workflow's ``spec``, list items written ``[]``
(``spec.templates[].container.image``; a steps template's step is ``steps[][]``). Each is:

- ``SUPPORTED``: the runner implements it;
- ``REFUSED``: the runner refuses a manifest that uses it, with a message naming the field;
- ``CLUSTER_ONLY``: it means something only on a Kubernetes cluster (scheduling, images,
  resources, security, pod policy, garbage collection, metrics, archiving): accepted, not
  applied, and reported once per run as ``not applied locally: ...``.

The fields under a refused or cluster-only field are not listed: their parent decides. The table is
plain Python (no schema is read when a workflow runs);
tests/pipelines/runner/manifest/test_completeness.py walks Argo's JSON schema and fails on any
field the table does not classify, and feeds each entry
through the runner's checker so the table cannot lie.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

SUPPORTED: Final = "supported"
REFUSED: Final = "refused"
CLUSTER_ONLY: Final = "cluster-only"


@dataclass(frozen=True)
class Field:
    status: str
    reason: str = ""  # why a field is refused or cluster-only


_YES = Field(SUPPORTED)

# Reasons, shared by many fields.
_SCHEDULING = "pod scheduling (nodes, priority, scheduler)"
_POD = "pod and container settings of a Kubernetes pod"
_IMAGE = ("container images (the local runner runs commands on this machine; `--containers` "
          "runs them in the images)")
_RESOURCES = "resource requests and limits (the runner uses this machine's CPUs and GPUs)"
_SECURITY = "security contexts and service accounts"
_SECURITY_IDS = ("the user and group a container runs as (pods run as this machine's user, "
                 "without its capabilities; `--containers` runs them as declared)")
_GC = "garbage collection of pods, artifacts and workflows"
_METRICS = "Prometheus metrics"
_ARCHIVE = "log archiving and archive locations (the home's one artifact repository is used)"
_PROBES = "container probes and termination messages"
_META = "Kubernetes labels and annotations"
# Emulated in-process for the run's own nodes (runner/templates/synchronization.py); database
# locks need Argo's synchronization database.
_SYNC_FIELDS = {
    "synchronization": _YES,
    "synchronization.mutexes": _YES,
    "synchronization.mutexes[].name": _YES,
    "synchronization.mutexes[].namespace": _YES,
    "synchronization.mutexes[].database": Field(REFUSED, "database mutexes"),
    "synchronization.semaphores": _YES,
    "synchronization.semaphores[].namespace": _YES,
    "synchronization.semaphores[].configMapKeyRef": _YES,
    "synchronization.semaphores[].configMapKeyRef.name": _YES,
    "synchronization.semaphores[].configMapKeyRef.key": _YES,
    "synchronization.semaphores[].configMapKeyRef.optional": _YES,
    "synchronization.semaphores[].database": Field(REFUSED, "database semaphores"),
}
_PVC_CLAIM = "the claim's storage request (a local folder stands for the volume)"

_LOCATION = ("this artifact location (artifacts are stored in the home's artifact repository; "
             "http and git are only fetched, from this machine)")
_VOLUME_KIND = "volume kinds other than persistentVolumeClaim and emptyDir"


def _cluster(reason: str) -> Field:
    return Field(CLUSTER_ONLY, reason)


def _refused(reason: str) -> Field:
    return Field(REFUSED, reason)


def _under(prefix: str, table: dict[str, Field]) -> dict[str, Field]:
    return {f"{prefix}.{key}": field for key, field in table.items()}


# Secrets and ConfigMaps are read from manifests (pipelines/runner/pods/k8s_objects.py).
_KEY_REF = {"": _YES, ".name": _YES, ".key": _YES, ".optional": _YES}
_ENV = {
    "": _YES,
    "[].name": _YES,
    "[].value": _YES,
    "[].valueFrom": _YES,
    **{f"[].valueFrom.secretKeyRef{key}": field for key, field in _KEY_REF.items()},
    **{f"[].valueFrom.configMapKeyRef{key}": field for key, field in _KEY_REF.items()},
    "[].valueFrom.fieldRef": _refused("pod field references"),
    "[].valueFrom.fileKeyRef": _refused("file key references"),
    "[].valueFrom.resourceFieldRef": _refused("resource field references"),
}
_MOUNTS = {
    "": _YES,
    "[].name": _YES,
    "[].mountPath": _YES,
    "[].subPath": _YES,
    "[].readOnly": _YES,
    "[].mountPropagation": _refused("mount propagation"),
    "[].recursiveReadOnly": _refused("recursive read-only mounts"),
    "[].subPathExpr": _refused("subPathExpr"),
}
_CONTAINER = {
    "name": _YES,
    "command": _YES,
    "args": _YES,
    "workingDir": _YES,
    **{f"env{key}": field for key, field in _ENV.items()},
    **{f"volumeMounts{key}": field for key, field in _MOUNTS.items()},
    "image": _cluster(_IMAGE),
    "imagePullPolicy": _cluster(_IMAGE),
    # Limits are a cgroup of the pod's own; requests reserve nothing on one machine
    # (runner/pods/resource_limits.py).
    "resources": _YES,
    "resources.limits": _YES,
    "resources.requests": _cluster(_RESOURCES),
    "resources.claims": _cluster(_RESOURCES),
    # What contains the pod's processes (runner/pods/sandbox.py); the user and group ids are
    # an image's business (`--containers` applies them), this machine's files are the user's.
    "securityContext": _YES,
    "securityContext.privileged": _YES,
    "securityContext.capabilities": _YES,
    "securityContext.capabilities.add": _YES,
    "securityContext.capabilities.drop": _YES,
    "securityContext.allowPrivilegeEscalation": _YES,
    **{f"securityContext.{key}": _cluster(_SECURITY_IDS) for key in (
        "runAsUser", "runAsGroup", "runAsNonRoot")},
    **{f"securityContext.{key}": _cluster(_SECURITY) for key in (
        "readOnlyRootFilesystem", "procMount", "seLinuxOptions", "seccompProfile",
        "appArmorProfile", "windowsOptions")},
    "ports": _cluster(_POD),
    "livenessProbe": _cluster(_PROBES),
    "readinessProbe": _cluster(_PROBES),
    "startupProbe": _cluster(_PROBES),
    "terminationMessagePath": _cluster(_PROBES),
    "terminationMessagePolicy": _cluster(_PROBES),
    "envFrom": _YES,
    **{f"envFrom[].{key}": _YES for key in (
        "prefix", "secretRef", "secretRef.name", "secretRef.optional", "configMapRef",
        "configMapRef.name", "configMapRef.optional")},
    "lifecycle": _refused("container lifecycle handlers"),
    "resizePolicy": _refused("resize policies"),
    "restartPolicy": _refused("container restart policies"),
    "restartPolicyRules": _refused("container restart policies"),
    "stdin": _refused("interactive containers"),
    "stdinOnce": _refused("interactive containers"),
    "tty": _refused("interactive containers"),
    "volumeDevices": _refused("block volume devices"),
}


# A daemon's readiness probe (runner/templates/probes.py): in a container or script template;
# the other containers' probes change nothing on Argo either (nothing waits for them).
_MAIN_CONTAINER = {
    **_CONTAINER,
    "readinessProbe": _YES,
    **{f"readinessProbe.{key}": _YES for key in (
        "exec", "exec.command", "httpGet", "httpGet.host", "httpGet.path", "httpGet.port",
        "httpGet.scheme", "httpGet.httpHeaders", "httpGet.httpHeaders[].name",
        "httpGet.httpHeaders[].value", "tcpSocket", "tcpSocket.host", "tcpSocket.port",
        "initialDelaySeconds", "periodSeconds", "timeoutSeconds", "successThreshold",
        # a readiness failure only means "not ready yet": the threshold changes nothing
        "failureThreshold")},
    "readinessProbe.grpc": _refused("gRPC readiness probes"),
    "readinessProbe.terminationGracePeriodSeconds": _cluster(_PROBES),
}


def _artifact(*, supported: tuple[str, ...], cluster: tuple[str, ...] = ()) -> dict[str, Field]:
    """An Artifact's fields where it is used: ``supported`` ones, ``cluster`` ones, the rest
    refused (the storage locations with their own reason)."""
    fields = ("name", "path", "from", "optional", "mode", "archive", "archiveLogs", "artifactGC",
              "globalName", "raw", "deleted", "fromExpression", "recurseMode", "subPath",
              "artifactory", "azure", "gcs", "git", "hdfs", "http", "oss", "plugin", "s3")
    table: dict[str, Field] = {}
    for key in fields:
        if key in supported:
            table[key] = _YES
        elif key in cluster or key in ("archiveLogs", "artifactGC"):
            table[key] = _cluster(_ARCHIVE if key == "archive" else _GC if key == "artifactGC"
                                  else "log archiving")
        elif key in ("artifactory", "azure", "gcs", "git", "hdfs", "http", "oss", "plugin",
                     "s3"):
            table[key] = _refused(_LOCATION)
        else:
            table[key] = _refused(f"artifact {key}")
    if "raw" in supported:
        table["raw.data"] = _YES
    if "archive" in supported:  # pipelines/runner/pods/artifacts.py: none, tar (gzip), not zip
        table.update({"archive.none": _YES, "archive.tar": _YES,
                      "archive.tar.compressionLevel": _YES,
                      "archive.zip": _refused("zip archives")})
    for kind, (keys, others) in _LOCATION_FIELDS.items():
        if kind in supported:
            table.update({f"{kind}.{key}": _YES for key in keys})
            table.update({f"{kind}.{key}": field for key, field in others.items()})
    return table


# Bucket locations: the local repository (runner/manifest/repository.py) stands in for every
# bucket, so only the bucket and key mean something here; http and git are fetched from this
# machine only.
_BUCKET = "where a bucket is and its credentials (the home's artifact repository stands in)"
_LOCATION_FIELDS: dict[str, tuple[tuple[str, ...], dict[str, Field]]] = {
    "s3": (("bucket", "key"), {key: _cluster(_BUCKET) for key in (
        "accessKeySecret", "addressingStyle", "caSecret", "createBucketIfNotPresent",
        "encryptionOptions", "endpoint", "insecure", "region", "roleARN", "secretKeySecret",
        "sessionTokenSecret", "useSDKCreds")}),
    "gcs": (("bucket", "key"), {"serviceAccountKeySecret": _cluster(_BUCKET)}),
    "oss": (("bucket", "key"), {key: _cluster(_BUCKET) for key in (
        "accessKeySecret", "createBucketIfNotPresent", "endpoint", "lifecycleRule",
        "secretKeySecret", "securityToken", "useSDKCreds")}),
    "azure": (("container", "blob"), {key: _cluster(_BUCKET) for key in (
        "accountKeySecret", "endpoint", "useSDKCreds")}),
    "hdfs": (("path",), {key: _cluster(_BUCKET) for key in (
        "addresses", "dataTransferProtection", "force", "hdfsUser", "krbCCacheSecret",
        "krbConfigConfigMap", "krbKeytabSecret", "krbRealm", "krbServicePrincipalName",
        "krbUsername")}),
    "artifactory": (("url",), {key: _cluster(_BUCKET) for key in (
        "passwordSecret", "usernameSecret")}),
    "http": (("url", "headers", "headers[].name", "headers[].value"), {
        "auth": _refused("http artifact auth (secrets are not available locally)"),
        "saveStreamViaFile": _cluster("how an http download is buffered")}),
    "git": (("repo", "revision"), {
        **{key: _cluster(_BUCKET) for key in (
            "usernameSecret", "passwordSecret", "sshPrivateKeySecret", "insecureIgnoreHostKey",
            "insecureSkipTLS")},
        **{key: _refused(f"git {key}") for key in (
            "branch", "depth", "fetch", "singleBranch", "disableSubmodules")}}),
}
_BUCKETS = ("s3", "gcs", "oss", "azure", "hdfs", "artifactory")


def _parameter(*supported: str) -> dict[str, Field]:
    fields = ("name", "value", "default", "enum", "description", "globalName", "valueFrom")
    return {key: _YES if key in supported else _refused(f"parameter {key} here")
            for key in fields}


_ARGUMENTS = {
    "": _YES,
    "parameters": _YES,
    **_under("parameters[]", _parameter("name", "value")),
    "artifacts": _YES,
    **_under("artifacts[]", _artifact(supported=(
        "name", "from", "raw", "subPath", "archive", *_BUCKETS, "http", "git",
        "fromExpression"))),  # fromExpression: pipelines/runner/expressions/expr_lang.py
}
_CALL = {
    "name": _YES,
    "template": _YES,
    "when": _YES,
    "continueOn": _YES,
    "continueOn.failed": _YES,
    "continueOn.error": _YES,
    "withItems": _YES,
    "withParam": _YES,
    "withSequence": _YES,
    "withSequence.count": _YES,
    "withSequence.start": _YES,
    "withSequence.end": _YES,
    "withSequence.format": _YES,
    **{f"arguments{key and '.' + key}": field for key, field in _ARGUMENTS.items()},
    "hooks": _YES,  # exit and expression hooks (pipelines/runner/templates/hooks.py)
    "inline": _refused("inline templates"),
    "onExit": _YES,
    "templateRef": _refused("templateRef without templates to resolve it from"),
}
_TASK = {**_CALL, "dependencies": _YES, "depends": _YES}

_VOLUME = {
    "name": _YES,
    "persistentVolumeClaim": _YES,
    "persistentVolumeClaim.claimName": _YES,
    "persistentVolumeClaim.readOnly": _YES,
    "emptyDir": _YES,
    "emptyDir.medium": _cluster("emptyDir medium and size (a local folder)"),
    "emptyDir.sizeLimit": _cluster("emptyDir medium and size (a local folder)"),
    # from Secret and ConfigMap manifests (pipelines/runner/pods/k8s_objects.py)
    **{f"{kind}.{key}": _YES for kind, name in (("secret", "secretName"), ("configMap", "name"))
       for key in (name, "items", "items[].key", "items[].path", "items[].mode", "defaultMode",
                   "optional")},
    "secret": _YES,
    "configMap": _YES,
    **{kind: _refused(_VOLUME_KIND) for kind in (
        "awsElasticBlockStore", "azureDisk", "azureFile", "cephfs", "cinder", "csi",
        "downwardAPI", "ephemeral", "fc", "flexVolume", "flocker", "gcePersistentDisk",
        "gitRepo", "glusterfs", "hostPath", "image", "iscsi", "nfs", "photonPersistentDisk",
        "portworxVolume", "projected", "quobyte", "rbd", "scaleIO", "storageos",
        "vsphereVolume")},
}
_VALUE_FROM = {
    "path": _YES,
    "default": _YES,
    "parameter": _YES,
    "expression": _YES,  # a DAG/steps template's output (pipelines/runner/expressions/expr_lang.py)
    "supplied": _YES,  # a suspend node's, given by `sublimate resume` (runner/records/control.py)
    **{key: _refused(f"valueFrom.{key}") for key in (
        "configMapKeyRef", "event", "jqFilter", "jsonPath")},
}

_RETRY = {
    "limit": _YES,
    "retryPolicy": _YES,
    "backoff": _YES,
    "backoff.duration": _YES,
    "backoff.factor": _YES,
    "backoff.maxDuration": _YES,
    "backoff.cap": _YES,
    "expression": _refused("retryStrategy.expression"),
    "affinity": _cluster(_SCHEDULING),
}

_TEMPLATE = {
    "name": _YES,
    "inputs": _YES,
    "inputs.parameters": _YES,
    **_under("inputs.parameters[]",
             _parameter("name", "value", "default", "enum", "description")),
    "inputs.artifacts": _YES,
    **_under("inputs.artifacts[]", _artifact(supported=(
        "name", "path", "from", "optional", "raw", "mode", "archive", *_BUCKETS, "http",
        "git"))),
    "outputs": _YES,
    "outputs.parameters": _YES,
    **_under("outputs.parameters[]", {
        # value: a pod's static output; enum: what a suspend node's supplied value may be
        **_parameter("name", "description", "globalName", "valueFrom", "value", "enum"),
        **_under("valueFrom", _VALUE_FROM),
    }),
    "outputs.artifacts": _YES,
    **_under("outputs.artifacts[]", _artifact(
        supported=("name", "path", "from", "optional", "globalName", "mode", "archive",
                   *_BUCKETS, "fromExpression"))),
    "outputs.exitCode": _refused("outputs.exitCode"),
    "outputs.result": _refused("outputs.result"),
    "container": _YES,
    **_under("container", _MAIN_CONTAINER),
    "script": _YES,
    **_under("script", {**_MAIN_CONTAINER, "source": _YES}),
    "dag": _YES,
    "dag.failFast": _YES,
    "dag.tasks": _YES,
    **_under("dag.tasks[]", _TASK),
    "dag.target": _YES,
    "steps": _YES,
    **_under("steps[][]", _CALL),
    "retryStrategy": _YES,
    **_under("retryStrategy", _RETRY),
    "activeDeadlineSeconds": _YES,
    "timeout": _YES,
    "parallelism": _YES,
    "failFast": _YES,
    "volumes": _YES,
    **_under("volumes[]", _VOLUME),
    # other template kinds and pod additions: suspend.py, http_template.py, data_template.py,
    # daemons.py; resources need a cluster's API, plugins Argo's agent
    **{key: _refused(f"{key} templates") for key in ("resource", "plugin")},
    "suspend": _YES,
    "suspend.duration": _YES,
    "daemon": _YES,
    "http": _YES,
    **{f"http.{key}": _YES for key in (
        "method", "url", "body", "bodyFrom", "bodyFrom.bytes", "headers", "headers[].name",
        "headers[].value", "headers[].valueFrom", "timeoutSeconds", "insecureSkipVerify",
        "successCondition")},
    **{f"http.headers[].valueFrom.secretKeyRef{key}": field for key, field in _KEY_REF.items()},
    "data": _YES,
    "data.source": _YES,
    "data.source.artifactPaths": _YES,
    **_under("data.source.artifactPaths", _artifact(supported=("name", *_BUCKETS))),
    "data.transformation": _YES,
    "data.transformation[].expression": _YES,
    # pods of several containers: pipelines/runner/pods/container_set.py
    "containerSet": _YES,
    "containerSet.containers": _YES,
    **_under("containerSet.containers[]", {**_CONTAINER, "dependencies": _YES}),
    **{f"containerSet.volumeMounts{key}": field for key, field in _MOUNTS.items()},
    "containerSet.retryStrategy": _YES,
    "containerSet.retryStrategy.retries": _YES,
    "containerSet.retryStrategy.duration": _YES,
    "sidecars": _YES,
    **_under("sidecars[]", {**_CONTAINER, "mirrorVolumeMounts": _YES}),
    "initContainers": _YES,
    **_under("initContainers[]", {**_CONTAINER, "mirrorVolumeMounts": _YES}),
    # a folder per ConfigMap under the home: pipelines/runner/templates/memoize.py
    **{f"memoize{key}": _YES for key in ("", ".key", ".maxAge", ".cache", ".cache.configMap",
                                         ".cache.configMap.name")},
    "podSpecPatch": _refused("podSpecPatch"),
    "hostAliases": _refused("hostAliases"),
    # while the node waits for a synchronization lock (engine.Run.execute), as operator.go's
    # checkTemplateTimeouts; locally a pod is never pending otherwise
    "pendingTimeout": _YES,
    # cluster-only
    "podResources": _cluster(_RESOURCES),
    "resourceClaims": _cluster(_RESOURCES),
    "affinity": _cluster(_SCHEDULING),
    "nodeSelector": _cluster(_SCHEDULING),
    "tolerations": _cluster(_SCHEDULING),
    "priorityClassName": _cluster(_SCHEDULING),
    "schedulerName": _cluster(_SCHEDULING),
    "securityContext": _cluster(_SECURITY),
    "serviceAccountName": _cluster(_SECURITY),
    "automountServiceAccountToken": _cluster(_SECURITY),
    "executor": _cluster(_SECURITY),
    "metadata": _cluster(_META),
    "annotations": _cluster(_META),
    "metrics": _cluster(_METRICS),
    "archiveLocation": _cluster(_ARCHIVE),
    **_SYNC_FIELDS,
}

_CLAIM_METADATA = ("annotations", "creationTimestamp", "deletionGracePeriodSeconds",
                   "deletionTimestamp", "finalizers", "generateName", "generation", "labels",
                   "managedFields", "namespace", "ownerReferences", "resourceVersion",
                   "selfLink", "uid")

_SPEC = {
    "entrypoint": _YES,
    "arguments": _YES,
    "arguments.parameters": _YES,
    **_under("arguments.parameters[]",
             _parameter("name", "value", "default", "enum", "description")),
    "arguments.artifacts": _YES,  # the entrypoint's artifact arguments
    **_under("arguments.artifacts[]", _artifact(supported=(
        "name", "raw", "archive", *_BUCKETS, "http", "git"))),
    "templates": _YES,
    **_under("templates[]", _TEMPLATE),
    "onExit": _YES,
    "hooks": _YES,  # the exit hook and expression hooks (pipelines/runner/templates/hooks.py)
    "parallelism": _YES,
    "activeDeadlineSeconds": _YES,
    "volumes": _YES,
    **_under("volumes[]", _VOLUME),
    "volumeClaimTemplates": _YES,
    "volumeClaimTemplates[].metadata": _YES,
    "volumeClaimTemplates[].metadata.name": _YES,
    **{f"volumeClaimTemplates[].metadata.{key}": _cluster(_PVC_CLAIM)
       for key in _CLAIM_METADATA},
    "volumeClaimTemplates[].apiVersion": _cluster(_PVC_CLAIM),
    "volumeClaimTemplates[].kind": _cluster(_PVC_CLAIM),
    "volumeClaimTemplates[].spec": _cluster(_PVC_CLAIM),
    "volumeClaimTemplates[].status": _cluster(_PVC_CLAIM),
    "workflowTemplateRef": _YES,
    "workflowTemplateRef.name": _YES,
    "workflowTemplateRef.clusterScope": _YES,
    # refused
    "executorPlugins": _refused("executor plugins"),
    "hostAliases": _refused("hostAliases"),
    "podSpecPatch": _refused("podSpecPatch"),
    "retryStrategy": _YES,  # the default of every template (pipelines/runner/templates/retry.py)
    **_under("retryStrategy", _RETRY),
    "shutdown": _refused("spec.shutdown"),
    "suspend": _refused("suspending a workflow"),
    "templateDefaults": _refused("templateDefaults"),
    "volumeClaimGC": _refused("volumeClaimGC"),
    # cluster-only
    "podResources": _cluster(_RESOURCES),
    "resourceClaims": _cluster(_RESOURCES),
    "affinity": _cluster(_SCHEDULING),
    "nodeSelector": _cluster(_SCHEDULING),
    "tolerations": _cluster(_SCHEDULING),
    "priority": _cluster(_SCHEDULING),
    "podPriorityClassName": _cluster(_SCHEDULING),
    "schedulerName": _cluster(_SCHEDULING),
    "podDisruptionBudget": _cluster(_SCHEDULING),
    "dnsConfig": _cluster(_POD),
    "dnsPolicy": _cluster(_POD),
    "hostNetwork": _cluster(_POD),
    "imagePullSecrets": _cluster(_IMAGE),
    "securityContext": _cluster(_SECURITY),
    "serviceAccountName": _cluster(_SECURITY),
    "automountServiceAccountToken": _cluster(_SECURITY),
    "executor": _cluster(_SECURITY),
    "podMetadata": _cluster(_META),
    "workflowMetadata": _cluster(_META),
    "podGC": _cluster(_GC),
    "ttlStrategy": _cluster(_GC),
    "artifactGC": _cluster(_GC),
    "archiveLogs": _cluster(_ARCHIVE),
    # every reference names the home's one artifact repository (runner/manifest/repository.py)
    "artifactRepositoryRef": _YES,
    "artifactRepositoryRef.configMap": _YES,
    "artifactRepositoryRef.key": _YES,
    "metrics": _cluster(_METRICS),
    **_SYNC_FIELDS,
}

FIELDS: Final[dict[str, Field]] = {"spec": _YES, **_under("spec", _SPEC)}

_INDEX = re.compile(r"\[\d+\]")


def field_pattern(path: str) -> str:
    """The table's name of a concrete path: ``spec.templates[2].steps[0][1].name`` ->
    ``spec.templates[].steps[][].name``."""
    return _INDEX.sub("[]", path)


def classify(path: str) -> Field | None:
    """The table's entry for a concrete or pattern path; None when the table does not know it."""
    return FIELDS.get(field_pattern(path))


def paths_with(status: str) -> list[str]:
    return [path for path, field in FIELDS.items() if field.status == status]


# Fields that only mean something to a Kubernetes cluster (scheduling, images, pod policy,
# garbage collection, metrics, artifact archiving): their names, from the table above. The
# checker decides by path (``classify``); this set of names is for code that filters a
# template's own keys (``plan``).
CLUSTER_ONLY_FIELDS = frozenset(
    path.rsplit(".", 1)[-1] for path, field in FIELDS.items() if field.status == CLUSTER_ONLY
)


__all__ = ["CLUSTER_ONLY", "CLUSTER_ONLY_FIELDS", "FIELDS", "REFUSED", "SUPPORTED", "Field",
           "classify", "field_pattern", "paths_with"]
