"""Suspend nodes that wait for a person, and ``sublimate resume`` / ``sublimate stop`` reaching
them from another process, as ``argo resume``, ``argo node set`` and ``argo stop`` do.

``Suspensions`` holds a run's active suspend nodes (``suspend`` runs them) and applies Argo's
rules (``workflow/util/util.go``):

- ``resume`` without a selector (``ResumeWorkflow``): every active suspend node; the supplied
  output parameters given (``-p name=value``, ``argo node set --output-parameter``) are set,
  each checked against its ``enum`` (the parameter's own, else that of the input parameter of
  the same name, which the Argo UI offers); every other supplied output takes its default
  (``OverrideOutputParametersWithDefault``: ``valueFrom.default``, else the same-named input
  parameter's default, else the error ``raw output parameter 'x' has not been set and does
  not have a default value``, and nothing is resumed); the nodes end Succeeded,
  ``Resumed by: <user>``.
- with ``--node-field-selector`` (``updateSuspendedNode``): only the matching nodes, and no
  defaults are filled; none matching is the error ``currently, set only targets suspend nodes:
  no suspend nodes matching nodeFieldSelector: S``. Fields (``SelectorMatchesNode``):
  ``displayName``, ``templateName``, ``phase``, ``name``, ``id``, ``templateRef.name``,
  ``templateRef.template``, ``inputs.parameters.<name>.value``; ``a=b``, ``a==b``, ``a!=b``,
  a comma for "and".
- ``stop`` with a selector: the matching nodes end Failed with the message. Without one the
  CLI stops the whole run as Ctrl-C does (``argo stop``).

A request from another process is a file, ``<run>/control/<id>.request.json``, written
atomically; the run's ``ControlChannel`` (a thread, started only for a workflow with suspend
templates, which creates the folder) reads it within ``POLL_S``, applies it and answers in
``<id>.reply.json``, which the CLI waits for. A file rather than a signal: the runner may be
embedded in a program (a test) that has no handler for one, and whose default would kill it.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from sublimate.components.base.disk_full import DiskFullError, disk_full_cause, disk_full_error
from sublimate.pipelines.argo_terms import NodePhase

from .run_types import NodeResult, SuspendAnswer

CONTROL_DIR = "control"
POLL_S = 0.2
REPLY_TIMEOUT_S = 10.0


class ControlError(ValueError):
    """A resume or stop that cannot be applied (nothing was changed), or a bad selector."""


# ------------------------------------------------------------------------------- selectors


def parse_selector(text: str) -> list[tuple[str, bool, str]]:
    """A Kubernetes field selector: ``(field, equal, value)`` terms, all of which must hold."""
    terms = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        for op, equal in (("!=", False), ("==", True), ("=", True)):
            key, sep, value = part.partition(op)
            if sep:
                terms.append((key.strip(), equal, value.strip()))
                break
        else:
            raise ControlError(f"invalid node field selector {text!r}: {part!r} is not "
                               "field=value, field==value or field!=value")
    if not terms:
        raise ControlError(f"invalid node field selector {text!r}")
    return terms


def selector_matches(terms: list[tuple[str, bool, str]], fields: Mapping[str, str]) -> bool:
    return all((fields.get(key) == value) == equal for key, equal, value in terms)


def node_fields(node: NodeResult, inputs: Mapping[str, str]) -> dict[str, str]:
    """What a selector may test of a node (``SelectorMatchesNode``); ``inputs``: the node's
    input parameters by name. A templateRef'd template is named ``<WorkflowTemplate>.<name>``
    here (``library``)."""
    template = node.template.rsplit(".", 1)
    fields = {"displayName": node.display_name, "templateName": template[-1],
              "phase": str(node.phase), "name": node.name, "id": node.id}
    if len(template) == 2:
        fields.update({"templateRef.name": template[0], "templateRef.template": template[1]})
    fields.update({f"inputs.parameters.{k}.value": v for k, v in inputs.items()})
    return fields


# ---------------------------------------------------------------------------- suspend nodes


@dataclass
class Verdict:
    """How a suspend node ends: its phase, message and supplied output parameters."""

    phase: NodePhase
    message: str = ""
    outputs: dict[str, str] = field(default_factory=dict)


class Waiting:
    """One active suspend node: the outputs it expects, and its verdict once given."""

    def __init__(self, node: NodeResult, fields: dict[str, str], outputs: Iterable[dict],
                 inputs: Iterable[dict]) -> None:
        self.node = node
        self.fields = fields
        inputs_by_name = {p.get("name"): p for p in inputs}
        self.supplied: dict[str, dict] = {}
        self.defaults: dict[str, str] = {}
        self.choices: dict[str, list[str]] = {}
        for param in outputs:
            source = param.get("valueFrom") or {}
            if "supplied" not in source:
                continue
            name = str(param["name"])
            same = inputs_by_name.get(name) or {}
            self.supplied[name] = param
            # operator.go addRawOutputFields: the input parameter's default stands in
            default = source.get("default", same.get("default"))
            if default is not None:
                self.defaults[name] = str(default)
            enum = param.get("enum") or same.get("enum")
            if enum:
                self.choices[name] = [str(choice) for choice in enum]
        self.verdict: Verdict | None = None
        self.event = threading.Event()

    def stop(self) -> None:
        """The node's scope was stopped (a deadline, Ctrl-C): it ends, unresumed."""
        self.event.set()

    def values(self, given: Mapping[str, str], fill_defaults: bool) -> dict[str, str]:
        """The supplied outputs after setting ``given`` (``updateSuspendedNode``) and, with
        ``fill_defaults``, defaulting the rest (``OverrideOutputParametersWithDefault``)."""
        if given and not self.supplied:
            raise ControlError("cannot set output parameters because node is not expecting "
                               "any raw parameters")
        values: dict[str, str] = {}
        for name, value in given.items():
            if name not in self.supplied:
                raise ControlError(f"node is not expecting output parameter '{name}'")
            choices = self.choices.get(name)
            if choices and value not in choices:
                raise ControlError(f"output parameter '{name}': {value!r} is not one of "
                                   f"{', '.join(choices)}")
            values[name] = value
        if fill_defaults:
            for name in self.supplied:
                if name in values:
                    continue
                if name not in self.defaults:
                    raise ControlError(f"raw output parameter '{name}' has not been set and "
                                       "does not have a default value")
                values[name] = self.defaults[name]
        return values


# A waiting suspend node's message begins so: how to resume it (``suspend.resume_hint``), the
# runner's own, never kept once it is resumed.
WAITING = "waiting: "


def resumed_message(node: NodeResult, by: str) -> str:
    message = f"Resumed by: {by}"
    earlier = "" if node.message.startswith(WAITING) else node.message
    return f"{earlier}; {message}" if earlier else message


class Suspensions:
    """The run's active suspend nodes, and the answers given before the run started."""

    def __init__(self, answers: Mapping[str, SuspendAnswer] | None = None) -> None:
        self.lock = threading.Lock()
        self.waiting: dict[str, Waiting] = {}
        self.answers = dict(answers or {})
        for key in self.answers:
            if "=" in key:
                parse_selector(key)  # a bad one is refused before the run starts

    def enter(self, waiting: Waiting) -> None:
        """A suspend node is active: it waits, unless an answer given up front matches it."""
        with self.lock:
            self.waiting[waiting.node.id] = waiting
            for key, answer in self.answers.items():
                if not self._answers(key, waiting):
                    continue
                if answer.stop:
                    verdict = Verdict(NodePhase.FAILED, answer.message or "Stopped by: answers")
                else:
                    try:
                        values = waiting.values(answer.outputs, fill_defaults=True)
                    except ControlError as exc:
                        verdict = Verdict(NodePhase.ERROR, f"answer {key!r}: {exc}")
                    else:
                        message = answer.message or resumed_message(waiting.node, "answers")
                        verdict = Verdict(NodePhase.SUCCEEDED, message, values)
                self._decide(waiting, verdict)
                return

    @staticmethod
    def _answers(key: str, waiting: Waiting) -> bool:
        if "=" in key:
            return selector_matches(parse_selector(key), waiting.fields)
        return key in (waiting.node.display_name, waiting.node.name)

    def leave(self, waiting: Waiting) -> None:
        with self.lock:
            self.waiting.pop(waiting.node.id, None)

    def expire(self, waiting: Waiting) -> Verdict:
        """A timed suspend's duration has passed: it resumes with its defaults (operator.go
        ``executeSuspend``); ``ControlError`` when one has none."""
        with self.lock:
            if waiting.verdict is None:
                self._decide(waiting, Verdict(NodePhase.SUCCEEDED, waiting.node.message,
                                              waiting.values({}, fill_defaults=True)))
            assert waiting.verdict is not None
            return waiting.verdict

    def _targets(self, selector: str) -> list[Waiting]:
        active = [w for w in self.waiting.values() if w.verdict is None]
        if not selector:
            if not active:
                raise ControlError("no suspend node is waiting")
            return active
        terms = parse_selector(selector)
        found = [w for w in active if selector_matches(terms, w.fields)]
        if not found:
            raise ControlError("currently, set only targets suspend nodes: no suspend nodes "
                               f"matching nodeFieldSelector: {selector}")
        return found

    def resume(self, selector: str, outputs: Mapping[str, str], by: str,
               message: str = "") -> list[str]:
        """``argo node set --output-parameter`` then ``argo resume``, in one step: all the
        nodes or none. The names of the nodes resumed."""
        with self.lock:
            targets = self._targets(selector)
            verdicts = [(w, Verdict(NodePhase.SUCCEEDED,
                                    message or resumed_message(w.node, by),
                                    w.values(outputs, fill_defaults=not selector)))
                        for w in targets]
            for waiting, verdict in verdicts:
                self._decide(waiting, verdict)
        return [w.node.name for w in targets]

    def stop(self, selector: str, message: str, by: str) -> list[str]:
        """``argo stop --node-field-selector``: the matching nodes fail."""
        with self.lock:
            targets = self._targets(selector)
            for waiting in targets:
                self._decide(waiting, Verdict(NodePhase.FAILED,
                                              message or f"Stopped by: {by}"))
        return [w.node.name for w in targets]

    @staticmethod
    def _decide(waiting: Waiting, verdict: Verdict) -> None:
        if waiting.verdict is None:
            waiting.verdict = verdict
            waiting.event.set()

    def handle(self, request: Mapping[str, object]) -> dict[str, object]:
        """A request from ``sublimate resume``/``stop``, answered."""
        selector = str(request.get("selector") or "")
        by = str(request.get("user") or "sublimate")
        message = str(request.get("message") or "")
        try:
            if request.get("action") == "resume":
                outputs = request.get("outputs") or {}
                if not isinstance(outputs, dict):
                    raise ControlError("outputs: expected a mapping")
                nodes = self.resume(selector, {str(k): str(v) for k, v in outputs.items()},
                                    by, message)
            elif request.get("action") == "stop":
                nodes = self.stop(selector, message, by)
            else:
                raise ControlError(f"unknown action {request.get('action')!r}")
        except ControlError as exc:
            return {"ok": False, "error": str(exc)}
        return {"ok": True, "nodes": nodes}


# --------------------------------------------------------------------- the files between them


class ControlChannel:
    """The run's end: a thread that answers the requests written into ``<run>/control/``."""

    def __init__(self, run_dir: Path, suspensions: Suspensions) -> None:
        self.folder = run_dir / CONTROL_DIR
        self.suspensions = suspensions
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="control", daemon=True)

    def start(self) -> None:
        self.folder.mkdir(exist_ok=True)  # also says "this run takes requests"
        self._thread.start()

    def close(self) -> None:
        self._closed.set()
        if self._thread.is_alive():
            self._thread.join()
        self.poll()  # a request that came in meanwhile is answered, not left waiting

    def _serve(self) -> None:
        while not self._closed.wait(POLL_S):
            self.poll()

    def poll(self) -> None:
        try:
            requests = sorted(self.folder.glob("*.request.json"))
        except OSError:
            return
        for path in requests:
            try:
                request = json.loads(path.read_text())
                reply = self.suspensions.handle(request) if isinstance(request, dict) else \
                    {"ok": False, "error": "expected a JSON object"}
            except (OSError, ValueError) as exc:
                reply = {"ok": False, "error": f"unreadable request: {exc}"}
            if self._closed.is_set() and reply.get("ok") is False:
                reply["error"] = f"{reply['error']} (the run has ended)"
            # A reply that does not fit (a full disk) is not written: the request was applied,
            # so it is not taken again, and the sender says the run did not answer.
            with contextlib.suppress(OSError):
                _write(path.with_name(path.name.replace(".request.", ".reply.")), reply)
            path.unlink(missing_ok=True)


def _write(path: Path, value: object) -> None:
    """``path`` written whole or not at all: a temporary file renamed, removed when it fails;
    a full disk is a ``DiskFullError`` that names it."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(json.dumps(value))
        os.replace(tmp, path)
    except OSError as error:
        tmp.unlink(missing_ok=True)
        cause = disk_full_cause(error)
        if cause is None:
            raise
        raise disk_full_error(cause, path, f"writing {path}") from error


def send(run_dir: Path, request: Mapping[str, object],
         timeout: float = REPLY_TIMEOUT_S) -> dict:
    """Write a request for the run in ``run_dir`` and wait for its answer; ``ControlError``
    when the run takes no requests or does not answer in ``timeout`` seconds."""
    folder = run_dir / CONTROL_DIR
    if not folder.is_dir():
        raise ControlError(f"run {run_dir.name} has no suspend template: nothing to resume "
                           "or stop by node")
    stem = f"{time.time_ns()}-{os.getpid()}"
    try:
        _write(folder / f"{stem}.request.json", dict(request))
    except DiskFullError as error:
        raise ControlError(str(error)) from error
    reply_path = folder / f"{stem}.reply.json"
    deadline = time.monotonic() + timeout
    while not reply_path.exists():
        if time.monotonic() > deadline:
            (folder / f"{stem}.request.json").unlink(missing_ok=True)
            raise ControlError(f"run {run_dir.name} did not answer in {timeout:g}s (has it "
                               "ended?)")
        time.sleep(0.02)
    reply = json.loads(reply_path.read_text())
    reply_path.unlink(missing_ok=True)
    return reply
