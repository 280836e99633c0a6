"""The execution engine: walks DAG/steps templates and runs leaf templates as processes.

Each running task or step is a thread; leaf nodes drive a local process group. Node
naming, phases and variable scopes follow Argo so that manifests behave the same here
as on a cluster, for the features the runner supports.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import queue
import signal
import string
import sys
import threading
import time
from pathlib import Path

import yaml

from . import artifacts
from .durations import parse_duration
from .errors import ManifestError, NodeError
from .expressions import (
    FAILURE_HANDLING_RESULTS,
    ExpressionError,
    depends_references,
    evaluate_depends,
    evaluate_when,
    parse_depends,
)
from .manifest import CLUSTER_ONLY_FIELDS, check_workflow, normalise_workflow
from .model import NodeResult, RunEvent, RunOptions, RunResult, iso, now
from .parameters import declared_value, enum_choices, resolve_parameters
from .paths import PathMap
from .process import KILL_GRACE_S, LocalProcess
from .scope import CancelScope
from .substitution import as_text, substitute, substitute_text

_FAILED = ("Failed", "Error")
_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
_ALPHABET = string.ascii_lowercase + string.digits
Vars = dict[str, str]


def _suffix() -> str:
    # os.urandom rather than secrets/uuid: those imports cost more than the whole run setup.
    return "".join(_ALPHABET[b % len(_ALPHABET)] for b in os.urandom(5))


def _uuid4() -> str:
    h = os.urandom(16).hex()
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{'89ab'[int(h[16], 16) % 4]}{h[17:20]}-{h[20:32]}"


def _loop_index(node: NodeResult) -> int:
    """The item index of a loop child named like Argo's ``task(3:value)``."""
    _, _, rest = node.display_name.partition("(")
    index, _, _ = rest.partition(":")
    return int(index) if index.isdigit() else 0


def _node_folder(node: NodeResult) -> str:
    """``nodes/<display name>-<id hash>``: readable in a listing, unique like the node id."""
    readable = "".join(c if c.isalnum() or c in "._-" else "-" for c in node.display_name)
    readable = "-".join(part for part in readable.split("-") if part) or "node"
    return f"{readable}-{node.id.rsplit('-', 1)[-1]}"


def _fnv32a(text: str) -> int:
    value = 0x811C9DC5
    for byte in text.encode():
        value = ((value ^ byte) * 0x01000193) & 0xFFFFFFFF
    return value


def _seconds(value: object) -> str:
    return f"{float(value):g}s"  # type: ignore[arg-type]


def run_workflow(workflow: dict, parameters: dict[str, str], options: RunOptions) -> RunResult:
    """Validate, then run a workflow to completion; see the package docstring."""
    if workflow.get("kind", "Workflow") != "Workflow" or "workflowTemplateRef" in workflow.get(
        "spec", {}
    ):
        workflow = normalise_workflow(workflow)
    check_workflow(workflow)
    resolved = resolve_parameters(workflow, parameters)
    return _Run(workflow, resolved, options).run()


class _Run:
    def __init__(self, workflow: dict, params: dict[str, str], options: RunOptions) -> None:
        self.workflow = workflow
        self.spec: dict = workflow["spec"]
        self.templates = {t["name"]: t for t in self.spec["templates"]}
        self.params = params
        self.options = options
        self.home = Path(options.home)
        self.lock = threading.RLock()
        self.nodes: dict[str, NodeResult] = {}
        self.outputs: dict[str, dict[str, str]] = {}
        self.name, self.run_dir = self._make_run_dir()
        self.started_at = now()
        self.finished_at = None
        self.phase = "Running"
        self.message = ""
        self.root_scope = CancelScope(self.lock)
        if options.reporter is not None:
            self.reporter = options.reporter
        else:
            from .display import console_reporter

            self.reporter = console_reporter(follow_logs=options.follow_logs)
        limit = options.parallelism or self.spec.get("parallelism")
        self.pod_slots = threading.Semaphore(int(limit)) if limit else None
        self.globals: Vars = {
            "workflow.name": self.name,
            "workflow.namespace": (workflow.get("metadata") or {}).get("namespace") or "default",
            "workflow.uid": _uuid4(),
            "workflow.creationTimestamp": iso(self.started_at) or "",
            "workflow.mainEntrypoint": self.spec["entrypoint"],
            "workflow.parameters": json.dumps(
                [{"name": k, "value": v} for k, v in params.items()]
            ),
        }
        for key, value in params.items():
            self.globals[f"workflow.parameters.{key}"] = value
        self.volumes: dict[str, Path] = {}
        # Container path -> local folder of every volume a step mounted that outlives its pod,
        # so that workflow outputs naming such paths can be linked from the run folder.
        self.shared_mounts = PathMap(self.run_dir / "fs")
        self.links: dict[str, Path] = {}
        for claim in self.spec.get("volumeClaimTemplates") or []:
            name = claim["metadata"]["name"]
            self.volumes[name] = self.run_dir / "volumes" / name

    # ------------------------------------------------------------------ run dir/status

    def _make_run_dir(self) -> tuple[str, Path]:
        meta = self.workflow.get("metadata") or {}
        runs = self.home / "runs"
        runs.mkdir(parents=True, exist_ok=True)
        fixed = meta.get("name")
        base = fixed or meta.get("generateName") or "workflow-"
        name = fixed or f"{base}{_suffix()}"
        while True:
            try:
                (runs / name).mkdir()
                return name, runs / name
            except FileExistsError:
                # Never reuse a run dir: a fixed name gets a suffix, like generateName.
                name = f"{fixed}-{_suffix()}" if fixed else f"{base}{_suffix()}"

    def _result(self) -> RunResult:
        return RunResult(
            name=self.name,
            phase=self.phase,
            message=self.message,
            started_at=self.started_at,
            finished_at=self.finished_at,
            run_dir=self.run_dir,
            nodes=list(self.nodes.values()),
            parameters=dict(self.params),
            outputs={k: dict(v) for k, v in self.outputs.items()},
            links=dict(self.links),
        )

    def _write_status(self) -> None:
        with self.lock:
            data = json.dumps(self._result().to_json(), indent=1)
            tmp = self.run_dir / "status.json.tmp"
            tmp.write_text(data)
            os.replace(tmp, self.run_dir / "status.json")

    def _emit(self, event: RunEvent) -> None:
        with contextlib.suppress(Exception):  # a broken reporter must not break the run
            self.reporter(event)

    # ------------------------------------------------------------------------- nodes

    def _node(
        self, name: str, display: str, template: str, kind: str, parent: NodeResult | None
    ) -> NodeResult:
        node_id = self.name if parent is None and name == self.name else (
            f"{self.name}-{_fnv32a(name)}"
        )
        node = NodeResult(node_id, name, display, template, kind,
                          parent=parent.id if parent else None)
        with self.lock:
            self.nodes[node_id] = node
            if parent is not None:
                parent.children.append(node_id)
        return node

    def _phase(self, node: NodeResult, phase: str, message: str = "") -> None:
        with self.lock:
            stamp = now()
            if phase == "Running" and node.started_at is None:
                node.started_at = stamp
            if phase in ("Succeeded", "Failed", "Error", "Skipped", "Omitted"):
                node.started_at = node.started_at or stamp
                node.finished_at = stamp
            node.phase = phase
            if message:
                node.message = message
            self._write_status()
        self._emit(RunEvent("node", self.name, stamp, phase=phase, node=node,
                            message=node.message))

    def _finish(self, node: NodeResult, phase: str, message: str = "") -> NodeResult:
        self._phase(node, phase, message)
        return node

    # ------------------------------------------------------------------------ driver

    def run(self) -> RunResult:
        self._dump_manifest()
        self._write_status()
        self._emit(RunEvent("workflow", self.name, self.started_at, phase="Running"))
        deadline = self.spec.get("activeDeadlineSeconds")
        if deadline is not None:
            self.root_scope.deadline(
                float(deadline), f"workflow exceeded its deadline of {_seconds(deadline)}"
            )
        done = threading.Event()
        worker = threading.Thread(target=self._drive, args=(done,), daemon=True)
        restore = None
        if threading.current_thread() is threading.main_thread():
            restore = signal.signal(signal.SIGTERM, _raise_interrupt)
        try:
            worker.start()
            done.wait()
        except KeyboardInterrupt:
            self.root_scope.stop("stopped")
            worker.join(timeout=KILL_GRACE_S + 2)
            self._conclude("Failed", "stopped")
            raise
        finally:
            if restore is not None:
                signal.signal(signal.SIGTERM, restore)
            self.root_scope.close()
        return self._result()

    def _dump_manifest(self) -> None:
        manifest = copy.deepcopy(self.workflow)
        manifest.setdefault("metadata", {})["name"] = self.name
        manifest["metadata"].pop("generateName", None)
        params = (manifest["spec"].get("arguments") or {}).get("parameters") or []
        for param in params:
            if param.get("name") in self.params:
                param["value"] = self.params[param["name"]]
        text = yaml.dump(manifest, Dumper=_DUMPER, sort_keys=False)
        (self.run_dir / "workflow.yaml").write_text(text)

    def _drive(self, done: threading.Event) -> None:
        try:
            root = self._execute(
                self.spec["entrypoint"],
                {"parameters": dict(self.params)},
                self.name,
                self.name,
                None,
                self.root_scope,
            )
            phase, message = root.phase, root.message
            stop = self.root_scope.reason
            if stop == "stopped":
                return
            if stop is not None:
                phase, message = "Failed", stop
            exit_handler = self.spec.get("onExit")
            if exit_handler:
                phase, message = self._exit_handler(exit_handler, phase, message)
            self._conclude(phase, message)
        except Exception as exc:  # an engine bug must still leave a readable status
            self._conclude("Error", f"internal error: {exc!r}")
        finally:
            done.set()

    def _exit_handler(self, template: str, phase: str, message: str) -> tuple[str, str]:
        failures = [
            {
                "displayName": n.display_name,
                "message": n.message,
                "templateName": n.template,
                "phase": n.phase,
                "podName": n.id,
                "finishedAt": iso(n.finished_at),
            }
            for n in list(self.nodes.values())
            if n.phase in _FAILED and n.type == "Pod"
        ]
        # The workflow deadline does not cover the exit handler, as in Argo.
        with self.lock:
            self.globals["workflow.status"] = phase
            self.globals["workflow.failures"] = json.dumps(failures)
        handler = self._execute(template, {}, f"{self.name}.onExit", "onExit", None,
                                CancelScope(self.lock))
        if handler.phase in _FAILED and phase == "Succeeded":
            return "Failed", f"exit handler failed: {handler.message}"
        return phase, message

    def _conclude(self, phase: str, message: str) -> None:
        with self.lock:
            for node in self.nodes.values():
                if not node.done:
                    node.phase = "Failed"
                    node.message = node.message or message or "stopped"
                    node.finished_at = now()
            self.phase = phase
            self.message = message
            self.finished_at = now()
            self._link_outputs()
            self._write_status()
        self._emit(RunEvent("workflow", self.name, self.finished_at, phase=phase,
                            message=message))

    def _link_outputs(self) -> None:
        """``outputs/<name>`` in the run folder for each workflow output parameter that names a
        path on a volume: the one place a user is pointed to reaches the results on it."""
        folder = self.run_dir / "outputs"
        for name, value in (self.outputs.get("parameters") or {}).items():
            if not value.startswith("/") or not self.shared_mounts.covers(value):
                continue
            target = self.shared_mounts.local(value)
            if not target.exists() or "/" in name:
                continue
            folder.mkdir(exist_ok=True)
            link = folder / name
            with contextlib.suppress(OSError):
                link.unlink(missing_ok=True)
                link.symlink_to(target)
                self.links[name] = link

    # ----------------------------------------------------------------------- templates

    def _execute(
        self,
        template_name: str,
        arguments: dict,
        name: str,
        display: str,
        parent: NodeResult | None,
        scope: CancelScope,
        extra: Vars | None = None,
    ) -> NodeResult:
        """Run a template invocation (with retries); ``arguments`` are already substituted."""
        template = self.templates[template_name]
        kind = "DAG" if "dag" in template else "Steps" if "steps" in template else "Pod"
        retry = template.get("retryStrategy")
        node = self._node(name, display, template_name, "Retry" if retry else kind, parent)
        try:
            inputs = self._inputs(template, arguments, node)
        except NodeError as exc:
            return self._finish(node, "Error", str(exc))
        inputs.update(extra or {})
        art_args = arguments.get("artifacts") or {}
        if not retry:
            return self._attempt(template, kind, inputs, node, scope, 0, art_args)
        try:
            retry = substitute(retry, {**self.globals, **inputs}, f"{template_name}.retryStrategy")
            limit = int(retry.get("limit", 0) if retry.get("limit") is not None else 0)
            backoff = retry.get("backoff") or {}
            delay = parse_duration(backoff.get("duration", 0))
            factor = float(backoff.get("factor", 1))
            max_total = parse_duration(backoff["maxDuration"]) if "maxDuration" in backoff else None
        except (NodeError, ValueError) as exc:
            return self._finish(node, "Error", f"retryStrategy: {exc}")
        policy = retry.get("retryPolicy") or "OnFailure"
        retry_on = {"Always": _FAILED, "OnFailure": ("Failed",), "OnError": ("Error",)}.get(
            policy, ()  # OnTransientError: nothing is transient locally
        )
        self._phase(node, "Running")
        started = time.monotonic()
        attempt = 0
        while True:
            child = self._node(f"{name}({attempt})", f"{display}({attempt})", template_name,
                               kind, node)
            child = self._attempt(template, kind, inputs, child, scope, attempt, art_args)
            if child.phase not in retry_on or attempt >= limit or scope.stop_reason():
                break
            wait = delay * factor**attempt
            if max_total is not None and time.monotonic() - started + wait > max_total:
                break
            if wait > 0:
                time.sleep(wait)
            attempt += 1
        node.parameters, node.artifacts = child.parameters, child.artifacts
        node.result, node.exit_code = child.result, child.exit_code
        return self._finish(node, child.phase, child.message)

    def _inputs(self, template: dict, arguments: dict, node: NodeResult) -> Vars:
        given = arguments.get("parameters") or {}
        values: Vars = {"pod.name": node.id}
        declared = (template.get("inputs") or {}).get("parameters") or []
        for param in declared:
            pname = param["name"]
            value = declared_value(param, as_text(given[pname]) if pname in given else None)
            if value is None:
                raise NodeError(f"input parameter {pname!r} of template "
                                f"{template['name']!r} was not supplied")
            allowed = enum_choices(param)
            if allowed and value not in allowed:
                raise NodeError(f"input parameter {pname!r}: {value!r} is not one of "
                                f"{', '.join(allowed)}")
            values[f"inputs.parameters.{pname}"] = value
        values["inputs.parameters"] = json.dumps(
            [{"name": p["name"], "value": values[f"inputs.parameters.{p['name']}"]}
             for p in declared]
        )
        given_arts = arguments.get("artifacts") or {}
        for art in (template.get("inputs") or {}).get("artifacts") or []:
            if art.get("path"):
                values[f"inputs.artifacts.{art['name']}.path"] = art["path"]
            source = given_arts.get(art["name"]) or art
            if source.get("from"):
                # Lets a DAG/steps template hand its input artifact on to its tasks.
                values[f"inputs.artifacts.{art['name']}"] = str(source["from"])
        return values

    def _attempt(
        self, template: dict, kind: str, inputs: Vars, node: NodeResult, parent_scope:
        CancelScope, attempt: int, art_args: dict[str, dict]
    ) -> NodeResult:
        scope = parent_scope.child()
        try:
            limits = []
            local = {**self.globals, **inputs, "retries": str(attempt)}
            with contextlib.suppress(NodeError, ValueError):
                if template.get("activeDeadlineSeconds") is not None:
                    limits.append(float(substitute_text(
                        str(template["activeDeadlineSeconds"]), local, "activeDeadlineSeconds")))
                if template.get("timeout") is not None:
                    limits.append(parse_duration(
                        substitute_text(str(template["timeout"]), local, "timeout")))
            if limits:
                scope.deadline(min(limits), f"{node.display_name!r} exceeded its deadline of "
                                            f"{_seconds(min(limits))}")
            if kind == "Pod":
                return self._run_pod(template, local, node, scope, art_args)
            if kind == "DAG":
                return self._run_dag(template, local, node, scope)
            return self._run_steps(template, local, node, scope)
        except NodeError as exc:
            return self._finish(node, "Error", str(exc))
        finally:
            scope.close()

    # ---------------------------------------------------------------------- leaf pods

    def _volume_dirs(self, volumes: list | None, node_dir: Path) -> dict[str, Path]:
        dirs: dict[str, Path] = {}
        for volume in volumes or []:
            if "persistentVolumeClaim" in volume:
                claim = volume["persistentVolumeClaim"]["claimName"]
                dirs[volume["name"]] = self.home / "volumes" / claim
            elif "emptyDir" in volume:
                dirs[volume["name"]] = node_dir / "volumes" / volume["name"]
        return dirs

    def _run_pod(self, template: dict, local: Vars, node: NodeResult, scope: CancelScope,
                 art_args: dict[str, dict]) -> NodeResult:
        where = f"templates.{template['name']}"
        body_key = "script" if "script" in template else "container"
        # Cluster-only fields (metrics use Argo's {{duration}}/{{status}}, ...) are not ours to
        # resolve: they mean nothing locally.
        tmpl = substitute({k: v for k, v in template.items()
                           if k != "name" and k not in CLUSTER_ONLY_FIELDS}, local, where)
        body = tmpl[body_key]
        node_dir = self.run_dir / "nodes" / _node_folder(node)
        node_dir.mkdir(parents=True, exist_ok=True)
        paths = self._path_map(tmpl, body, node_dir)
        outputs = tmpl.get("outputs") or {}
        for param in outputs.get("parameters") or []:
            path = (param.get("valueFrom") or {}).get("path")
            if path:
                paths.local(path).parent.mkdir(parents=True, exist_ok=True)
        for art in outputs.get("artifacts") or []:
            if art.get("path"):
                paths.local(art["path"]).parent.mkdir(parents=True, exist_ok=True)
        self._place_inputs(tmpl, paths, art_args)
        cwd = node_dir
        if body.get("workingDir"):
            cwd = paths.local(body["workingDir"])
            cwd.mkdir(parents=True, exist_ok=True)
        argv = [paths.rewrite(str(a)) for a in body["command"]]
        if body_key == "script":
            script = node_dir / "script"
            script.write_text(paths.rewrite(str(body.get("source", ""))))
            argv.append(str(script))
        argv += [paths.rewrite(as_text(a)) for a in body.get("args") or []]
        if argv[0] in ("python", "python3"):
            argv[0] = sys.executable  # so that the runner's venv is used
        env = dict(os.environ)
        env.setdefault("PYTHONUNBUFFERED", "1")  # lets follow_logs stream lines as they come
        for item in body.get("env") or []:
            if "valueFrom" in item:
                continue  # an optional secret: the local environment provides it, or nobody
            env[item["name"]] = paths.rewrite(as_text(item.get("value", "")))
        env["SUBLIMATE_LOCAL_RUN"] = "1"
        env["SUBLIMATE_RUN_DIR"] = str(self.run_dir)
        # The container's termination-message file (Kubernetes: /dev/termination-log); what a
        # failed step writes there becomes the node's message, as on Argo.
        termination_log = node_dir / "termination-log"
        termination_log.unlink(missing_ok=True)
        env["SUBLIMATE_TERMINATION_LOG"] = str(termination_log)
        node.log = node_dir / "main.log"

        def on_line(line: str) -> None:
            self._emit(RunEvent("log", self.name, now(), node=node, line=line))

        process = LocalProcess(argv, cwd, env, node.log, on_line)
        if self.pod_slots is not None:
            self.pod_slots.acquire()
        try:
            if scope.stop_reason():
                return self._finish(node, "Failed", scope.stop_reason() or "")
            try:
                process.start()
            except OSError as exc:
                return self._finish(node, "Error", f"failed to start {argv[0]!r}: "
                                                   f"{exc.strerror or exc}")
            scope.add(process)
            self._phase(node, "Running")
            code, stdout = process.wait()
            scope.discard(process)
        finally:
            if self.pod_slots is not None:
                self.pod_slots.release()
        node.exit_code = code
        node.result = paths.restore(stdout.strip())
        if process.stopped:
            phase, message = "Failed", scope.stop_reason() or "stopped"
        elif code != 0:
            phase, message = "Failed", f"Error (exit code {code})"
            with contextlib.suppress(OSError):
                reason = " ".join(termination_log.read_text(errors="replace").split())
                if reason:  # Argo: "<reason> (exit code N): <termination message>"
                    message = f"{message}: {paths.restore(reason)}"
        else:
            phase, message = "Succeeded", ""
        problem = self._collect_outputs(outputs, paths, node)
        if problem and phase == "Succeeded":
            phase, message = "Error", problem
        return self._finish(node, phase, message)

    def _path_map(self, tmpl: dict, body: dict, node_dir: Path) -> PathMap:
        paths = PathMap(node_dir / "fs")
        # emptyDir volumes belong to one pod, so workflow-level ones are resolved per node too.
        volumes = {
            **self.volumes,
            **self._volume_dirs(self.spec.get("volumes"), node_dir),
            **self._volume_dirs(tmpl.get("volumes"), node_dir),
        }
        for mount in body.get("volumeMounts") or []:
            folder = volumes[mount["name"]]
            if mount.get("subPath"):
                folder = folder / mount["subPath"]
            folder.mkdir(parents=True, exist_ok=True)
            paths.mount(mount["mountPath"], folder)
            if not folder.is_relative_to(node_dir):  # outlives the pod: outputs may point here
                with self.lock:
                    self.shared_mounts.mount(mount["mountPath"], folder)
        outputs = tmpl.get("outputs") or {}
        declared = [(p.get("valueFrom") or {}).get("path") for p in outputs.get("parameters") or []]
        declared += [a.get("path") for a in outputs.get("artifacts") or []]
        declared += [a.get("path") for a in (tmpl.get("inputs") or {}).get("artifacts") or []]
        declared.append(body.get("workingDir"))
        for path in declared:
            if path and str(path).startswith("/"):
                paths.private(str(path))
        return paths

    def _place_inputs(self, tmpl: dict, paths: PathMap, art_args: dict[str, dict]) -> None:
        for art in (tmpl.get("inputs") or {}).get("artifacts") or []:
            name = art["name"]
            source = art_args.get(name) or art
            target = paths.local(art["path"])
            if "raw" in source:
                artifacts.place_raw(str(source["raw"].get("data", "")), target)
            elif source.get("from"):
                stored = Path(source["from"])
                if not stored.exists():
                    if art.get("optional"):
                        continue
                    raise NodeError(f"input artifact {name!r}: {source['from']} not found")
                artifacts.place(stored, target)
            elif not art.get("optional"):
                raise NodeError(f"input artifact {name!r} was not supplied")

    def _collect_outputs(self, outputs: dict, paths: PathMap, node: NodeResult) -> str:
        problem = ""
        for param in outputs.get("parameters") or []:
            source = param.get("valueFrom") or {}
            if "path" not in source:
                continue
            try:
                value = paths.restore(paths.local(source["path"]).read_text().rstrip())
            except OSError:
                if "default" not in source:
                    problem = problem or (f"output parameter {param['name']!r}: "
                                          f"{source['path']} not found")
                    continue
                value = as_text(source["default"])
            self._set_param(node, param, value)
        for art in outputs.get("artifacts") or []:
            local = paths.local(art["path"])
            if not local.exists():
                if not art.get("optional"):
                    problem = problem or f"output artifact {art['name']!r}: {art['path']} not found"
                continue
            stored = artifacts.save(local, self.run_dir / "artifacts" / node.id / art["name"])
            self._set_artifact(node, art, str(stored))
        return problem

    def _set_param(self, node: NodeResult, param: dict, value: str) -> None:
        node.parameters[param["name"]] = value
        if param.get("globalName"):
            with self.lock:
                self.outputs.setdefault("parameters", {})[param["globalName"]] = value
                self.globals[f"workflow.outputs.parameters.{param['globalName']}"] = value

    def _set_artifact(self, node: NodeResult, art: dict, path: str) -> None:
        node.artifacts[art["name"]] = path
        if art.get("globalName"):
            with self.lock:
                self.outputs.setdefault("artifacts", {})[art["globalName"]] = path
                self.globals[f"workflow.outputs.artifacts.{art['globalName']}"] = path

    # ------------------------------------------------------------------ dag and steps

    def _template_outputs(self, template: dict, scope_vars: Vars, node: NodeResult) -> str:
        """Outputs of a DAG/steps template, taken from its tasks (``valueFrom.parameter``)."""
        outputs = template.get("outputs") or {}
        where = f"templates.{template['name']}.outputs"
        for param in outputs.get("parameters") or []:
            source = param.get("valueFrom") or {}
            if "parameter" not in source:
                continue
            try:
                value = substitute_text(str(source["parameter"]), scope_vars, where)
            except NodeError as exc:
                if "default" not in source:
                    return str(exc)
                value = as_text(source["default"])
            self._set_param(node, param, value)
        for art in outputs.get("artifacts") or []:
            if art.get("from"):
                try:
                    path = substitute_text(str(art["from"]), scope_vars, where)
                except NodeError as exc:
                    if art.get("optional"):
                        continue
                    return str(exc)
                self._set_artifact(node, art, path)
        return ""

    def _run_dag(self, template: dict, local: Vars, node: NodeResult, scope: CancelScope
                 ) -> NodeResult:
        self._phase(node, "Running")
        dag = template["dag"]
        tasks = {t["name"]: t for t in dag["tasks"]}
        logic = {}
        for name, task in tasks.items():
            if task.get("depends"):
                logic[name] = parse_depends(str(task["depends"]))
            elif task.get("dependencies"):
                ast: tuple = ("ref", task["dependencies"][0], None)
                for dep in task["dependencies"][1:]:
                    ast = ("and", ast, ("ref", dep, None))
                logic[name] = ast
        refs = {n: depends_references(a) for n, a in logic.items()}
        handled = {dep for r in refs.values() for dep, res in r if res in FAILURE_HANDLING_RESULTS}
        fail_fast = dag.get("failFast", True) not in (False, "false")
        slots = _slots(template, local)
        results: dict[str, NodeResult] = {}
        task_vars: Vars = {}
        done: queue.Queue[tuple[str, NodeResult]] = queue.Queue()
        pending = list(tasks)
        running: set[str] = set()
        halted = ""
        unhandled: list[str] = []

        def lookup(dep: str, result: str | None) -> bool:
            return _task_result(results[dep], tasks[dep], result, self.nodes)

        while pending or running:
            for name in list(pending):
                if any(dep not in results for dep, _ in refs.get(name, [])):
                    continue
                pending.remove(name)
                reason = halted or scope.stop_reason()
                if reason:
                    results[name] = self._omit(node, name, tasks[name], f"not started: {reason}")
                    continue
                if name in logic and not evaluate_depends(logic[name], lookup):
                    detail = tasks[name].get("depends") or tasks[name].get("dependencies")
                    results[name] = self._omit(node, name, tasks[name],
                                               f"omitted: depends condition {detail!r} is false")
                    continue
                running.add(name)
                call_vars = {**local, **task_vars}
                threading.Thread(
                    target=lambda n=name, v=call_vars: done.put((n, self._call(
                        tasks[n], v, f"{node.name}.{n}", n, node, scope, slots, "tasks"))),
                    daemon=True,
                ).start()
            if not running:
                for name in pending:  # only a dependency cycle can leave tasks here
                    results[name] = self._omit(node, name, tasks[name], "dependency cycle")
                break
            name, result = done.get()
            running.discard(name)
            results[name] = result
            task_vars.update(self._result_vars("tasks", name, result))
            if result.phase in _FAILED and not _continues(tasks[name], result.phase) and (
                name not in handled
            ):
                unhandled.append(name)
                if fail_fast and not halted:
                    halted = f"task {name!r} failed (failFast)"
        stop = scope.stop_reason()
        problem = self._template_outputs(template, {**local, **task_vars}, node)
        if stop:
            return self._finish(node, "Failed", stop)
        if unhandled:
            first = results[unhandled[0]]
            return self._finish(node, "Failed",
                                f"task {unhandled[0]!r} {first.phase.lower()}: {first.message}")
        if problem:
            return self._finish(node, "Error", problem)
        return self._finish(node, "Succeeded")

    def _omit(self, parent: NodeResult, name: str, task: dict, message: str) -> NodeResult:
        node = self._node(f"{parent.name}.{name}", name, task.get("template", ""), "Skipped",
                          parent)
        return self._finish(node, "Omitted", message)

    def _run_steps(self, template: dict, local: Vars, node: NodeResult, scope: CancelScope
                   ) -> NodeResult:
        self._phase(node, "Running")
        step_vars: Vars = {}
        slots = _slots(template, local)
        failure = ""
        for index, group in enumerate(template["steps"]):
            if scope.stop_reason():
                break
            group_node = self._node(f"{node.name}[{index}]", f"[{index}]", template["name"],
                                    "StepGroup", node)
            self._phase(group_node, "Running")
            call_vars = {**local, **step_vars}
            results: list[NodeResult | None] = [None] * len(group)

            def run(i: int, step: dict, gn: NodeResult = group_node, v: Vars = call_vars,
                    out: list[NodeResult | None] = results) -> None:
                out[i] = self._call(step, v, f"{gn.name}.{step['name']}", step["name"],
                                    gn, scope, slots, "steps")

            threads = [threading.Thread(target=run, args=(i, s), daemon=True)
                       for i, s in enumerate(group)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            for step, result in zip(group, results, strict=True):
                assert result is not None
                step_vars.update(self._result_vars("steps", step["name"], result))
                if result.phase in _FAILED and not _continues(step, result.phase) and not failure:
                    failure = f"step {step['name']!r} {result.phase.lower()}: {result.message}"
            self._finish(group_node, "Failed" if failure else "Succeeded", failure)
            if failure:
                break
        problem = self._template_outputs(template, {**local, **step_vars}, node)
        if scope.stop_reason():
            return self._finish(node, "Failed", scope.stop_reason() or "")
        if failure:
            return self._finish(node, "Failed", failure)
        if problem:
            return self._finish(node, "Error", problem)
        return self._finish(node, "Succeeded")

    # ------------------------------------------------------------ calls (task or step)

    def _call(
        self,
        call: dict,
        call_vars: Vars,
        name: str,
        display: str,
        parent: NodeResult,
        scope: CancelScope,
        slots: threading.Semaphore | None,
        prefix: str,
    ) -> NodeResult:
        """Run a DAG task or a step, expanding loops; returns its node (or TaskGroup)."""
        where = f"{prefix}.{call['name']}"
        try:
            items = self._loop_items(call, call_vars, where)
        except (NodeError, ValueError) as exc:
            node = self._node(name, display, call["template"], "Pod", parent)
            return self._finish(node, "Error", str(exc))
        if items is None:
            return self._call_one(call, call_vars, name, display, parent, scope, slots, where)
        group = self._node(name, display, call["template"], "TaskGroup", parent)
        if not items:
            return self._finish(group, "Skipped", "Skipped, empty loop items")
        self._phase(group, "Running")
        children: list[NodeResult | None] = [None] * len(items)

        def run(i: int, item: object) -> None:
            child_name = f"{display}({i}:{_item_label(item)})"
            children[i] = self._call_one(
                call, {**call_vars, **_item_vars(item)}, f"{parent.name}.{child_name}",
                child_name, group, scope, slots, where)

        threads = [threading.Thread(target=run, args=(i, item), daemon=True)
                   for i, item in enumerate(items)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        failed = [c for c in children if c is not None and c.phase in _FAILED
                  and not _continues(call, c.phase)]
        if failed:
            return self._finish(group, "Failed", f"child {failed[0].display_name!r} "
                                                  f"{failed[0].phase.lower()}")
        return self._finish(group, "Succeeded")

    def _call_one(self, call: dict, call_vars: Vars, name: str, display: str,
                  parent: NodeResult, scope: CancelScope, slots: threading.Semaphore | None,
                  where: str) -> NodeResult:
        try:
            if call.get("when") is not None:
                expr = substitute_text(as_text(call["when"]), call_vars, f"{where}.when")
                if not evaluate_when(expr):
                    node = self._node(name, display, call["template"], "Skipped", parent)
                    return self._finish(node, "Skipped", f"when {expr!r} evaluated false")
            args = substitute(call.get("arguments") or {}, call_vars, f"{where}.arguments")
        except (NodeError, ExpressionError) as exc:
            node = self._node(name, display, call["template"], "Pod", parent)
            return self._finish(node, "Error", str(exc))
        arguments = {
            "parameters": {p["name"]: p.get("value", "") for p in args.get("parameters") or []},
            "artifacts": {a["name"]: a for a in args.get("artifacts") or []},
        }
        if slots is not None:
            slots.acquire()
        try:
            if scope.stop_reason():
                node = self._node(name, display, call["template"], "Skipped", parent)
                return self._finish(node, "Omitted", f"not started: {scope.stop_reason()}")
            return self._execute(call["template"], arguments, name, display, parent, scope)
        finally:
            if slots is not None:
                slots.release()

    def _loop_items(self, call: dict, call_vars: Vars, where: str) -> list | None:
        if "withItems" in call:
            return list(substitute(call["withItems"], call_vars, f"{where}.withItems"))
        if "withParam" in call:
            text = substitute_text(as_text(call["withParam"]), call_vars, f"{where}.withParam")
            try:
                items = json.loads(text)
            except json.JSONDecodeError as exc:
                raise NodeError(f"{where}.withParam: {text!r} is not a JSON list") from exc
            if not isinstance(items, list):
                raise NodeError(f"{where}.withParam: {text!r} is not a JSON list")
            return items
        if "withSequence" in call:
            seq = substitute(call["withSequence"], call_vars, f"{where}.withSequence")
            start = int(seq.get("start", 0))
            if "count" in seq:
                numbers = list(range(start, start + int(seq["count"])))
            else:
                end = int(seq.get("end", 0))
                numbers = list(range(start, end + 1) if end >= start else range(start, end - 1, -1))
            fmt = seq.get("format")
            return [fmt % n if fmt else str(n) for n in numbers]
        return None

    def _result_vars(self, prefix: str, name: str, node: NodeResult) -> Vars:
        base = f"{prefix}.{name}"
        out: Vars = {f"{base}.status": node.phase, f"{base}.id": node.id}
        if node.started_at:
            out[f"{base}.startedAt"] = iso(node.started_at) or ""
        if node.finished_at:
            out[f"{base}.finishedAt"] = iso(node.finished_at) or ""
        if node.type == "TaskGroup":
            # Children register as their threads start; Argo aggregates in item order.
            children = sorted((self.nodes[c] for c in node.children), key=_loop_index)
            names = dict.fromkeys(p for c in children for p in c.parameters)
            for pname in names:
                out[f"{base}.outputs.parameters.{pname}"] = json.dumps(
                    [c.parameters[pname] for c in children if pname in c.parameters])
            out[f"{base}.outputs.parameters"] = json.dumps(
                [c.parameters for c in children if c.parameters])
            results = [_json_or_text(c.result) for c in children if c.result is not None]
            out[f"{base}.outputs.result"] = json.dumps(results)
            return out
        for pname, value in node.parameters.items():
            out[f"{base}.outputs.parameters.{pname}"] = value
        for aname, path in node.artifacts.items():
            out[f"{base}.outputs.artifacts.{aname}"] = path
        if node.result is not None:
            out[f"{base}.outputs.result"] = node.result
        if node.exit_code is not None:
            out[f"{base}.exitCode"] = str(node.exit_code)
        return out


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _slots(template: dict, local: Vars) -> threading.Semaphore | None:
    limit = template.get("parallelism")
    if limit is None:
        return None
    return threading.Semaphore(int(substitute_text(str(limit), local, "parallelism")))


def _continues(call: dict, phase: str) -> bool:
    cont = call.get("continueOn") or {}
    key = "failed" if phase == "Failed" else "error"
    return cont.get(key) in (True, "true")


def _task_result(node: NodeResult, task: dict, result: str | None,
                 nodes: dict[str, NodeResult]) -> bool:
    phase = node.phase
    if result is None:
        return phase in ("Succeeded", "Skipped") or (
            phase in _FAILED and _continues(task, phase))
    if result == "Errored":
        return phase == "Error"
    if result in ("AnySucceeded", "AllFailed"):
        children = [nodes[c] for c in node.children] if node.type == "TaskGroup" else [node]
        if result == "AnySucceeded":
            return any(c.phase == "Succeeded" for c in children)
        return bool(children) and all(c.phase in _FAILED for c in children)
    if result == "Daemoned":
        return False
    return phase == result


def _item_vars(item: object) -> Vars:
    out = {"item": as_text(item)}
    if isinstance(item, dict):
        for key, value in item.items():
            out[f"item.{key}"] = as_text(value)
    return out


def _item_label(item: object) -> str:
    if isinstance(item, dict):
        return ",".join(f"{k}:{as_text(v)}" for k, v in sorted(item.items()))
    return as_text(item)


def _json_or_text(text: str | None) -> object:
    try:
        value = json.loads(text or "")
    except json.JSONDecodeError:
        return text
    return value if isinstance(value, dict) else text


__all__ = ["ManifestError", "run_workflow"]
