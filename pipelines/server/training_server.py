"""What the web page shows of a training run (sublimate's additions under
``/api/sublimate/v1/``, not Argo's): a workflow's train step, live while it trains, and two runs
side by side.

Everything is read from what the run leaves on the shared volume (docs/monitoring.md), with the
readers ``sublimate report`` uses: :func:`~sublimate.components.monitoring.run_report.build_report`
(the job's curve, the time split, stragglers, the test figures, the fault-tolerance section of
``train-summary.json``) and, while a per-step job still runs, the launcher's own reader of
``fault-tolerance/`` (:mod:`sublimate.components.launch.per_step`). Nothing is written.

A train step is a node whose template runs ``sublimate.components.steps.train``. Its run folder
is the node's ``run-dir`` output once it has one (a container path, mapped to this machine
through the template's volume mounts and the workflow's claims: ``/mnt/sublimate/...`` is
``$SUBLIMATE_HOME/volumes/sublimate-data/...``), and while it trains the one
``sublimate fault`` finds for a running job (the workflow's ``run-id``, else its name). Every
folder and file is resolved and must stay inside the home; a plot is named, never given as a
path."""

from __future__ import annotations

import contextlib
import re
from pathlib import Path
from typing import Any

from .errors import NOT_FOUND, ApiError, invalid
from .routing import Raw, Request, route
from .store import NAME

TRAIN_MODULE = "sublimate.components.steps.train"
PLOT_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,63}")
PLOT_TITLES = {"overview": "overview", "loss": "training loss", "accuracy": "test accuracy",
               "throughput": "throughput", "time-split": "step time per rank",
               "recovery": "steps each node took part in"}
# Per-epoch fields of one process's record (metrics/<label>.jsonl) the page charts.
PROCESS_FIELDS = ("epoch", "step", "time", "seconds", "loss", "local_loss",
                  "samples_per_second", "local_samples_per_second", "data_seconds",
                  "compute_seconds", "comm_seconds", "test_accuracy", "learning_rate",
                  "participants", "leader", "staleness_mean")
# What the compare view puts side by side: report key -> (what it is, which way is better).
NOT_RECORDED = [
    "loss, accuracy and throughput per step: the workers write one record per epoch "
    "(the live per-step figures are on each process's Prometheus endpoint, "
    "metrics-endpoints.json)",
    "GPU memory and utilisation, and process CPU: Prometheus only, while the run lives",
]


# --------------------------------------------------------------------------------------------
# Finding the train step and its run folder


def _find_workflow(request: Request, name: str) -> tuple[dict, dict]:
    """The record and the runner's status of workflow ``name`` in the request's namespace."""
    namespace = request.namespace
    store = request.server.store
    record = store.record(name) if NAME.fullmatch(name or "") else None
    if record is None or record.get("namespace") != namespace:
        raise ApiError(NOT_FOUND, f'workflows.argoproj.io "{name}" not found '
                                  f'(namespace "{namespace}")')
    return record, store.status(name) or {}


def _spec(request: Request, name: str, record: dict) -> dict:
    """The spec that ran (templates resolved), else the one submitted."""
    return request.server.store.manifest_spec(name) or record.get("spec") or {}


def _runs_train(template: dict) -> bool:
    body = template.get("container") or template.get("script") or {}
    words = [str(word) for word in [*(body.get("command") or []), *(body.get("args") or [])]]
    return any(TRAIN_MODULE in word for word in words) \
        or TRAIN_MODULE in str(body.get("source") or "")


def train_templates(spec: dict) -> dict[str, dict]:
    return {template["name"]: template for template in spec.get("templates") or []
            if isinstance(template, dict) and template.get("name") and _runs_train(template)}


def _train_node(status: dict, templates: dict[str, dict], node_id: str) -> dict | None:
    """The node asked for (it must run a train template), else the job's first train pod."""
    nodes = [node for node in status.get("nodes") or [] if isinstance(node, dict)]
    if node_id:
        node = next((node for node in nodes if node.get("id") == node_id), None)
        if node is None:
            raise ApiError(NOT_FOUND, f"node {node_id!r}: no such node")
        if node.get("template") not in templates:
            raise invalid(f"node {node_id!r}: not a sublimate train step")
        return node
    trains = [node for node in nodes if node.get("template") in templates]
    trains.sort(key=lambda node: (node.get("type") != "Pod", node.get("started_at") or ""))
    return trains[0] if trains else None


def _inside(path: Path, home: Path) -> Path | None:
    """``path`` resolved, if it stays inside ``home``; else None."""
    try:
        resolved = path.resolve()
    except (OSError, RuntimeError):
        return None
    return resolved if resolved.is_relative_to(home.resolve()) else None


def _local(container_path: str, template: dict, spec: dict, home: Path) -> Path | None:
    """A path the step saw, on this machine: through the template's mount of a claim (the
    local runner keeps claim ``C`` in ``$SUBLIMATE_HOME/volumes/C``)."""
    if not container_path.startswith("/"):
        return None
    claims = {volume.get("name"): (volume.get("persistentVolumeClaim") or {}).get("claimName")
              for volume in [*(spec.get("volumes") or []), *(template.get("volumes") or [])]
              if isinstance(volume, dict)}
    body = template.get("container") or template.get("script") or {}
    mounts = sorted((mount for mount in body.get("volumeMounts") or []
                     if isinstance(mount, dict) and mount.get("mountPath")),
                    key=lambda mount: -len(mount["mountPath"]))
    for mount in mounts:
        root = mount["mountPath"].rstrip("/")
        claim = claims.get(mount.get("name"))
        if not claim or not (container_path == root or container_path.startswith(root + "/")):
            continue
        relative = container_path[len(root):].lstrip("/")
        if ".." in Path(relative).parts:
            return None
        return _inside(home / "volumes" / claim / relative, home)
    return None


def run_folder(request: Request, name: str, status: dict, node: dict | None,
               templates: dict[str, dict], spec: dict) -> Path | None:
    """The train step's run folder on this machine (inside the home), or None before it has
    one."""
    from sublimate.pipelines.run_lookup import results_of_runner_folder

    home = request.server.store.home
    if node is not None:
        given = ((node.get("outputs") or {}).get("parameters") or {}).get("run-dir")
        if isinstance(given, str):
            found = _local(given, templates[node["template"]], spec, home)
            if found is not None and found.is_dir():
                return found
    runner_folder = request.server.store.runs / name
    if not runner_folder.is_dir():
        return None
    with contextlib.suppress(OSError, ValueError):
        found = _inside(results_of_runner_folder(runner_folder, require_results=False), home)
        if found is not None and found.is_dir():
            return found
    return None


# --------------------------------------------------------------------------------------------
# What a run recorded


def _process_logs(run_dir: Path) -> dict[str, list[dict[str, Any]]]:
    """Each process's epoch records (metrics/<label>.jsonl), the last per epoch."""
    from sublimate.components.monitoring.metrics import iter_jsonl
    from sublimate.components.monitoring.run_report import _by_epoch

    logs = {}
    for path in sorted((run_dir / "metrics").glob("*.jsonl")):
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            records = _by_epoch(list(iter_jsonl(path)))
            logs[path.stem] = [{key: record[key] for key in PROCESS_FIELDS if key in record}
                               for record in records]
    return logs


def _latest_stragglers(run_dir: Path) -> list[dict[str, Any]]:
    """The stragglers flagged in the newest epoch record that judged (rank 0's, the leader's)."""
    from sublimate.components.monitoring.metrics import iter_jsonl

    newest: tuple[float, list] = (0.0, [])
    for path in (run_dir / "metrics").glob("*.jsonl"):
        with contextlib.suppress(OSError, ValueError, TypeError):
            for record in iter_jsonl(path):
                if isinstance(record.get("stragglers"), list) \
                        and float(record.get("time") or 0) >= newest[0]:
                    newest = (float(record.get("time") or 0), record["stragglers"])
    return newest[1]


def _live_fault_tolerance(run_dir: Path) -> dict[str, Any] | None:
    """While a per-step job runs: which node took part in which steps so far (the launcher's
    own reader of ``fault-tolerance/``), and the losses its files show: a node's process that
    left no ``end`` record and was followed by another on the same node (a replacement). A loss
    whose replacement has not recorded its start yet shows only once the job ends
    (``train-summary.json``'s ``fault_tolerance``, which the launcher writes then)."""
    from sublimate.components.launch import per_step

    if not (run_dir / "fault-tolerance").is_dir():
        return None
    try:
        records = list(per_step._records(run_dir).values())
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not records:
        return None
    by_node: dict[int, list[dict[str, Any]]] = {}
    for record in sorted(records, key=lambda r: r["start"] or 0):
        by_node.setdefault(record["node"], []).append(record)
    failures = []
    for node, incarnations in sorted(by_node.items()):
        for record in incarnations[:-1]:
            if per_step._event(record, "end") is None \
                    and per_step._event(record, "no_peer") is None:
                moment = (per_step._event(record, "killed") or {}).get("time") or (
                    record["events"][-1]["time"] if record["events"] else record["start"])
                failures.append({"node": node, "time": round(moment or 0, 3),
                                 "step": record["counters"].get("last_step")})
    spans = []
    for record in sorted(records, key=lambda r: (r["node"], r["start"] or 0)):
        first = per_step._event(record, "first_commit")
        last = record["counters"].get("last_step")
        if first is not None and last:
            spans.append({"node": record["node"], "from_step": first["step"], "to_step": last,
                          "replacement": bool((per_step._event(record, "start") or {})
                                              .get("replacement")),
                          "ended": per_step._event(record, "end") is not None})
    per_commit = max((event.get("steps_per_commit", 1) for record in records
                      for event in record["events"] if event.get("event") == "start"),
                     default=1)
    return {"live": True, "unit": "step", "steps_per_commit": per_commit,
            "nodes": sorted(by_node), "failures": sorted(failures, key=lambda f: f["time"]),
            "timeline": spans,
            "steps_attempted": sum(r["counters"].get("attempted", 0) for r in records),
            "steps_committed": sum(r["counters"].get("committed", 0) for r in records)}


def _plots(run_dir: Path, home: Path) -> dict[str, Path]:
    """The report's PNGs by name: only plain files directly in the run's report folder."""
    from sublimate.components.monitoring.run_report import REPORT_DIR

    folder = _inside(run_dir / REPORT_DIR, home)
    if folder is None or not folder.is_dir():
        return {}
    found = {}
    for path in sorted(folder.glob("*.png")):
        name = path.stem
        resolved = _inside(path, home)
        if PLOT_NAME.fullmatch(name) and resolved is not None and resolved.parent == folder \
                and resolved.is_file():
            found[name] = resolved
    return found


def _progress(run_dir: Path) -> dict[str, Any]:
    """Each process's heartbeat (progress/rank-R.json): the step it reached, and its state."""
    from sublimate.components.monitoring.run_report import read_json

    ranks = {}
    for path in sorted((run_dir / "progress").glob("rank-*.json")):
        record = read_json(path)
        if isinstance(record, dict):
            ranks[path.stem] = {key: record.get(key) for key in ("node", "step", "time", "state")}
    steps = [entry["step"] for entry in ranks.values() if isinstance(entry.get("step"), int)]
    return {"step": max(steps) if steps else None, "ranks": ranks}


def _report(run_dir: Path) -> dict[str, Any] | None:
    from sublimate.components.monitoring.run_report import ReportError, build_report

    try:
        return build_report(run_dir)
    except (ReportError, OSError, ValueError, KeyError, TypeError):
        return None  # nothing recorded yet, or a file half written: the next poll sees it


def _number(text: Any) -> int | None:
    with contextlib.suppress(TypeError, ValueError):
        return int(str(text))
    return None


def training(request: Request) -> tuple[int, dict]:
    """``GET /api/sublimate/v1/workflows/{namespace}/{name}/training[?node=ID]``: a train
    step's run so far."""
    name = request.name
    record, status = _find_workflow(request, name)
    spec = _spec(request, name, record)
    templates = train_templates(spec)
    if not templates:
        raise ApiError(NOT_FOUND, f"workflow {name!r} has no sublimate train step "
                                  f"(a template running {TRAIN_MODULE})")
    node = _train_node(status, templates, request.one("node"))
    parameters = status.get("parameters") or {}
    answer: dict[str, Any] = {
        "workflow": name, "namespace": request.namespace,
        "phase": status.get("phase") or "Pending",
        "node": None if node is None else {
            "id": node.get("id"), "displayName": node.get("display_name") or node.get("name"),
            "phase": node.get("phase") or "Pending", "startedAt": node.get("started_at"),
            "finishedAt": node.get("finished_at"), "message": node.get("message") or ""},
        "settings": parameters,
        "epochs_total": _number(parameters.get("epochs")),
        "run": None, "state": "waiting", "epochs": [], "processes": {}, "time_split": {},
        "stragglers": None, "stragglers_now": [], "fault_tolerance": None, "plots": [],
        "progress": {"step": None, "ranks": {}}, "summary": None,
        "not_recorded": list(NOT_RECORDED),
    }
    run_dir = run_folder(request, name, status, node, templates, spec)
    if run_dir is None:
        return 200, answer
    home = request.server.store.home
    report = _report(run_dir)
    ended = node is not None and node.get("phase") in ("Succeeded", "Failed", "Error",
                                                       "Skipped", "Omitted")
    answer["run"] = run_dir.name
    answer["progress"] = _progress(run_dir)
    if report is None:
        answer["state"] = "ended" if ended else "waiting"
        return 200, answer
    answer["state"] = "ended" if ended else "training"
    answer["epochs"] = report.get("epochs_log") or []
    answer["processes"] = _process_logs(run_dir)
    answer["time_split"] = report.get("time_split") or {}
    answer["stragglers"] = report.get("stragglers")
    answer["stragglers_now"] = _latest_stragglers(run_dir)
    if report.get("fault_tolerance"):
        answer["fault_tolerance"] = {"live": False, **report["fault_tolerance"]}
    else:
        answer["fault_tolerance"] = _live_fault_tolerance(run_dir)
    plots = _plots(run_dir, home)
    base = f"/api/sublimate/v1/workflows/{request.namespace}/{name}/training/plots"
    query = f"?node={node['id']}" if node is not None and request.one("node") else ""
    answer["plots"] = [{"name": plot, "title": PLOT_TITLES.get(plot, plot.replace("-", " ")),
                        "url": f"{base}/{plot}{query}"} for plot in plots]
    answer["summary"] = {key: report.get(key) for key in (
        "algorithm", "world_size", "epochs", "steps", "global_batch_size", "train_seconds",
        "samples_per_second", "final_loss", "test", "metrics", "failures",
        "launch_to_first_step_seconds") if report.get(key) is not None}
    if not any(point.get("test_accuracy") is not None for point in answer["epochs"]):
        answer["not_recorded"].append(
            "test accuracy per epoch (eval-every-epoch is off, or the paradigm does not "
            "evaluate while it trains): the evaluate step's figure comes at the end")
    if not answer["time_split"]:
        answer["not_recorded"].append("the compute/communication split (no step timings)")
    return 200, answer


def plot(request: Request) -> Raw:
    """``GET .../training/plots/{plot}``: one PNG of the run's report folder, by name."""
    name, wanted = request.name, request.params["plot"]
    if not PLOT_NAME.fullmatch(wanted):
        raise ApiError(NOT_FOUND, f"plot {wanted!r}: no such plot")
    record, status = _find_workflow(request, name)
    spec = _spec(request, name, record)
    templates = train_templates(spec)
    node = _train_node(status, templates, request.one("node")) if templates else None
    run_dir = run_folder(request, name, status, node, templates, spec) if templates else None
    found = _plots(run_dir, request.server.store.home) if run_dir is not None else {}
    if wanted not in found:
        raise ApiError(NOT_FOUND, f"plot {wanted!r}: no such plot in the run's report")
    return Raw(found[wanted].read_bytes(), "image/png",
               {"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"})


# --------------------------------------------------------------------------------------------
# Two runs side by side


def _run_of(request: Request, name: str) -> tuple[dict, dict[str, Any]]:
    """Workflow ``name``'s status and its training report; 404 without one."""
    record, status = _find_workflow(request, name)
    spec = _spec(request, name, record)
    templates = train_templates(spec)
    node = _train_node(status, templates, "") if templates else None
    run_dir = run_folder(request, name, status, node, templates, spec)
    report = _report(run_dir) if run_dir is not None else None
    if report is None:
        raise ApiError(NOT_FOUND, f"workflow {name!r}: no training recorded (yet)")
    return status, report


def compare(request: Request) -> tuple[int, dict]:
    """``GET /api/sublimate/v1/compare/{namespace}?a=NAME&b=NAME``: what ``sublimate report A
    B`` computes for two workflows' runs (each run's report; the labels that tell them apart;
    what they share), with the settings that differ and the final figures' differences."""
    from sublimate.components.monitoring.run_report import (
        _shared_description,
        compare_figures,
        run_labels,
    )

    names = [request.one("a"), request.one("b")]
    for key, value in zip("ab", names, strict=True):
        if not value:
            raise invalid(f"{key}: required, a workflow's name")
    (status_a, report_a), (status_b, report_b) = (_run_of(request, name) for name in names)
    reports = [report_a, report_b]
    settings_a, settings_b = (status.get("parameters") or {} for status in (status_a, status_b))
    settings = [{"name": key, "a": settings_a.get(key), "b": settings_b.get(key)}
                for key in sorted(set(settings_a) | set(settings_b))
                if settings_a.get(key) != settings_b.get(key)]
    figures = compare_figures(report_a, report_b)
    runs = []
    for name, status, report in zip(names, (status_a, status_b), reports, strict=True):
        runs.append({"workflow": name, "run": report["run"], "phase": status.get("phase"),
                     "epochs": report.get("epochs_log") or [],
                     "time_split": report.get("time_split") or {},
                     "stragglers": report.get("stragglers"),
                     "fault_tolerance": report.get("fault_tolerance"),
                     "report": {key: value for key, value in report.items()
                                if key not in ("epochs_log", "run_dir")}})
    return 200, {"runs": runs, "labels": run_labels(reports),
                 "shared": _shared_description(reports), "settings": settings,
                 "figures": figures}


def _page(request: Request) -> Raw:
    from .web_server import page

    return page(request)


TRAINING_ROUTES = [
    route("GET", "/api/sublimate/v1/workflows/{namespace}/{name}/training", training),
    route("GET", "/api/sublimate/v1/workflows/{namespace}/{name}/training/plots/{plot}", plot),
    route("GET", "/api/sublimate/v1/compare/{namespace}", compare),
    # the page's full view of a workflow's train step (web/training.js)
    route("GET", "/workflows/{namespace}/{name}/training", _page, needs_token=False),
]
