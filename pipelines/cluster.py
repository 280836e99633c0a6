"""The plain Kubernetes objects of an install: namespace, RBAC, shared volume, defaults.

They are rendered into ``argo/`` next to the Argo documents, and ``argo/kustomization.yaml``
ties everything together (``kubectl apply -k argo/``). Cluster-specific values (image, Volcano
queue, storage class) live in one ConfigMap; kustomize ``replacements`` copy them into the
WorkflowTemplate and the claim, so an overlay changes them in one place.
"""

from __future__ import annotations

from typing import Any

from sublimate.components.base.runtime import DEFAULT_CLAIM, DEFAULT_IMAGE

NAMESPACE = "sublimate"
SERVICE_ACCOUNT = "sublimate-workflow"
DEFAULTS_CONFIGMAP = "sublimate-defaults"
DEFAULT_QUEUE = "default"
DEFAULT_STORAGE_CLASS = "nfs-client"
VOLUME_SIZE = "100Gi"
LABELS = {"app.kubernetes.io/part-of": "sublimate"}


def namespace() -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": NAMESPACE, "labels": LABELS}}


def service_account() -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": SERVICE_ACCOUNT, "labels": LABELS}}


def role() -> dict[str, Any]:
    """What the workflow pods may do, and nothing more."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": SERVICE_ACCOUNT, "labels": LABELS},
        "rules": [
            # Argo's executor reports each step's outputs through WorkflowTaskResults (v3.4+).
            {"apiGroups": ["argoproj.io"], "resources": ["workflowtaskresults"],
             "verbs": ["create", "patch"]},
            # The train step's TorchX launcher submits, watches and cancels the Volcano job ...
            {"apiGroups": ["batch.volcano.sh"], "resources": ["jobs"],
             "verbs": ["create", "get", "list", "delete"]},
            {"apiGroups": ["batch.volcano.sh"], "resources": ["jobs/status"],
             "verbs": ["get"]},
            # ... and streams its workers' logs into the step's log.
            {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
            # Per-step recovery: the launcher follows each worker pod through its replacements,
            # and starts the job's Lighthouse beside it (a Deployment behind a Service, owned by
            # the job: deleted with it by Kubernetes, so no delete verb).
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
            {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["create"]},
            {"apiGroups": [""], "resources": ["services"], "verbs": ["create"]},
        ],
    }


def role_binding() -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": SERVICE_ACCOUNT, "labels": LABELS},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                    "name": SERVICE_ACCOUNT},
        "subjects": [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT}],
    }


def shared_volume_claim() -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": DEFAULT_CLAIM, "labels": LABELS},
        "spec": {
            # Every step and every training node mounts it at once: ReadWriteMany.
            "accessModes": ["ReadWriteMany"],
            "storageClassName": DEFAULT_STORAGE_CLASS,  # replaced from the ConfigMap
            "resources": {"requests": {"storage": VOLUME_SIZE}},
        },
    }


def defaults_configmap() -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": DEFAULTS_CONFIGMAP, "labels": LABELS},
        "data": {"image": DEFAULT_IMAGE, "queue": DEFAULT_QUEUE,
                 "storage-class": DEFAULT_STORAGE_CLASS},
    }


def _replacement(key: str, targets: list[dict[str, Any]]) -> dict[str, Any]:
    return {"source": {"kind": "ConfigMap", "name": DEFAULTS_CONFIGMAP,
                       "fieldPath": f"data.{key}"},
            "targets": targets}


DEFAULTS_COMPONENT = "defaults"


def kustomization(resources: list[str]) -> dict[str, Any]:
    """``argo/kustomization.yaml``: every file, then the defaults copied into place."""
    return {
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "namespace": NAMESPACE,
        "resources": resources,
        "components": [DEFAULTS_COMPONENT],
    }


def defaults_component(template: str, step_templates: list[str]) -> dict[str, Any]:
    """``argo/defaults/``: copies the ConfigMap's values into the template and the claim.

    A kustomize Component, because an overlay must re-apply it after changing the ConfigMap
    (replacements run when their kustomization is built, before an overlay's own patches)::

        components: [my-settings, ../argo/defaults]
    """
    workflow_template = {"kind": "WorkflowTemplate", "name": template}
    return {
        "apiVersion": "kustomize.config.k8s.io/v1alpha1", "kind": "Component",
        "replacements": [
            _replacement("image", [
                {"select": workflow_template,
                 "fieldPaths": [f"spec.templates.[name={name}].container.image"
                                for name in step_templates]
                 + ["spec.arguments.parameters.[name=image].value"]},
            ]),
            _replacement("queue", [
                {"select": workflow_template,
                 "fieldPaths": ["spec.arguments.parameters.[name=queue].value"]},
            ]),
            _replacement("storage-class", [
                {"select": {"kind": "PersistentVolumeClaim", "name": DEFAULT_CLAIM},
                 "fieldPaths": ["spec.storageClassName"]},
            ]),
        ],
    }


def core_objects() -> dict[str, dict[str, Any]]:
    """File name -> object, for the kustomization."""
    return {
        "namespace.yaml": namespace(),
        "serviceaccount.yaml": service_account(),
        "role.yaml": role(),
        "rolebinding.yaml": role_binding(),
        "shared-volume.yaml": shared_volume_claim(),
        "defaults.yaml": defaults_configmap(),
    }
