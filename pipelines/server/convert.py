"""A local run as Argo's Workflow object: ``status.json`` (the runner's record, already masked:
``RunRecord.result`` redacts secret values) and the server's record of the submission become
``metadata``, ``spec`` and ``status`` with ``nodes`` keyed by id, as Argo's controller writes
them (``workflow/v1alpha1/workflow_types.go``)."""

from __future__ import annotations

import re
from typing import Any

API_VERSION = "argoproj.io/v1alpha1"
# Labels Argo's controller keeps on every workflow; `argo list` and the UI filter on them.
LABEL_PHASE = "workflows.argoproj.io/phase"
LABEL_COMPLETED = "workflows.argoproj.io/completed"
DONE_PHASES = frozenset({"Succeeded", "Failed", "Error"})


def to_workflow(record: dict, status: dict | None, live: bool) -> dict:
    """The Workflow ``record`` (the server's ``WorkflowStore`` entry) is, its run's ``status``
    (None before the runner wrote one); ``live``: this server is running it now."""
    interrupted = record.get("interrupted")
    workflow_status = _status(record, status, live, interrupted)
    phase = workflow_status.get("phase", "")
    labels = dict(record.get("labels") or {})
    if phase:
        labels[LABEL_PHASE] = phase
    labels[LABEL_COMPLETED] = "true" if phase in DONE_PHASES else "false"
    metadata: dict[str, Any] = {
        "name": record["name"],
        "namespace": record["namespace"],
        "uid": record["uid"],
        "creationTimestamp": record["creationTimestamp"],
        "labels": labels,
        # Kubernetes' optimistic-concurrency token; a local run has no etcd, so its status
        # version stands in (clients only compare it for equality).
        "resourceVersion": str(record.get("resourceVersion", "1")),
    }
    for key in ("generateName", "annotations"):
        if record.get(key):
            metadata[key] = record[key]
    return {"apiVersion": API_VERSION, "kind": "Workflow", "metadata": metadata,
            "spec": record.get("spec") or {}, "status": workflow_status}


def _status(record: dict, status: dict | None, live: bool, interrupted: str | None) -> dict:
    if status is None:
        if live:  # accepted, the runner has not written its first status yet
            return {"phase": "Running", "progress": "0/0"}
        if record.get("source") == "sublimate run":  # its runner has yet to write one
            return {"phase": "Pending", "progress": "0/0"}
        # The server stopped between accepting the workflow and its run's first status.
        return {"phase": "Failed", "message": interrupted or "the workflow never started",
                "progress": "0/0"}
    runner_message = status.get("message") or ""
    message = interrupted or runner_message
    nodes = {}
    for node in status.get("nodes") or []:
        converted = _node(node)
        if interrupted and node.get("message") == runner_message:
            converted["message"] = interrupted  # the runner's "killed" line, said as the server's
        nodes[converted["id"]] = converted
    result: dict[str, Any] = {"phase": status.get("phase") or "Running",
                              "startedAt": seconds(status.get("started_at")),
                              "nodes": nodes, "progress": _progress(nodes)}
    if status.get("finished_at") and result["phase"] in DONE_PHASES:
        result["finishedAt"] = seconds(status["finished_at"])
    if message:
        result["message"] = message
    outputs = _outputs(status.get("outputs") or {})
    if outputs:
        result["outputs"] = outputs
    return {key: value for key, value in result.items() if value is not None}


def seconds(moment: str | None) -> str | None:
    """A runner's timestamp (microseconds) as Kubernetes writes a ``metav1.Time``: RFC 3339 in
    whole seconds."""
    return _FRACTION.sub("Z", moment) if moment else moment


_FRACTION = re.compile(r"\.\d+Z$")


def _node(node: dict) -> dict:
    converted: dict[str, Any] = {
        "id": node["id"],
        "name": node["name"],
        "displayName": node.get("display_name") or node["name"],
        "type": node.get("type") or "Pod",
        "templateName": node.get("template") or "",
        "phase": node.get("phase") or "Pending",
    }
    for ours, argo in (("started_at", "startedAt"), ("finished_at", "finishedAt")):
        if node.get(ours):
            converted[argo] = seconds(node[ours])
    for ours, argo in (("message", "message"), ("children", "children"), ("pod_ip", "podIP")):
        if node.get(ours):
            converted[argo] = node[ours]
    if node.get("daemoned"):
        converted["daemoned"] = True
    if node.get("memoizationStatus"):  # a memoized node; ``hit``: taken from the cache
        converted["memoizationStatus"] = dict(node["memoizationStatus"])
    parameters = (node.get("inputs") or {}).get("parameters") or {}
    if parameters:
        converted["inputs"] = {"parameters": [{"name": name, "value": str(value)}
                                              for name, value in parameters.items()]}
    outputs = _outputs(node.get("outputs") or {})
    if outputs:
        converted["outputs"] = outputs
    return converted


def _outputs(outputs: dict) -> dict:
    """The runner's ``{"parameters": {name: value}, "artifacts": {name: path}, "result",
    "exitCode"}`` as Argo's ``Outputs``: lists of named parameters and artifacts."""
    converted: dict[str, Any] = {}
    parameters = outputs.get("parameters") or {}
    if parameters:
        converted["parameters"] = [{"name": name, "value": str(value)}
                                   for name, value in parameters.items()]
    artifacts = outputs.get("artifacts") or {}
    if artifacts:
        # The local path is this machine's, not a repository's key: only the name is Argo's.
        converted["artifacts"] = [{"name": name} for name in artifacts]
    for key in ("result", "exitCode"):
        if outputs.get(key) is not None:
            converted[key] = str(outputs[key])
    return converted


def _progress(nodes: dict[str, dict]) -> str:
    """Argo's ``progress``: pods done over pods known."""
    pods = [node for node in nodes.values() if node["type"] == "Pod"]
    done = sum(1 for node in pods if node["phase"] in DONE_PHASES | {"Skipped", "Omitted"})
    return f"{done}/{len(pods)}"
