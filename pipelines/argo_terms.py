"""Argo's vocabulary, shared by the linter and the local runner so that the two never disagree.

Node phases and types, the task results a DAG ``depends`` expression may test and its grammar,
the ``{{...}}`` tag pattern, the annotation that carries sublimate's parameter types, and the
Kubernetes rules a volumeMount's ``subPath`` and an object's name must keep. Both
``sublimate lint`` and ``sublimate run`` import this module on every start: standard library only.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from enum import StrEnum
from typing import Any


class NodePhase(StrEnum):
    """``status.nodes[].phase`` (Argo's ``wfv1.NodePhase``); compares equal to the plain text."""

    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    ERROR = "Error"
    SKIPPED = "Skipped"
    OMITTED = "Omitted"

    @property
    def done(self) -> bool:
        return self not in (NodePhase.PENDING, NodePhase.RUNNING)

    @property
    def failed(self) -> bool:
        return self in (NodePhase.FAILED, NodePhase.ERROR)


class NodeType(StrEnum):
    """``status.nodes[].type`` (Argo's ``wfv1.NodeType``)."""

    POD = "Pod"
    DAG = "DAG"
    STEPS = "Steps"
    STEP_GROUP = "StepGroup"
    TASK_GROUP = "TaskGroup"
    RETRY = "Retry"
    SKIPPED = "Skipped"
    SUSPEND = "Suspend"
    HTTP = "HTTP"  # an http template's node (it runs in Argo's agent, not in a pod of its own)
    CONTAINER = "Container"  # a containerSet's container, a child of its pod's node


# The task results a DAG `depends` expression may test (`task.Succeeded`, ...).
DEPENDS_RESULTS = (
    "Succeeded",
    "Failed",
    "Errored",
    "Skipped",
    "Omitted",
    "Daemoned",
    "AnySucceeded",
    "AllFailed",
)
# Results that mean "this dependency's failure is handled by whoever depends on it".
FAILURE_HANDLING_RESULTS = frozenset({"Failed", "Errored", "AnySucceeded", "AllFailed"})

# A `{{...}}` tag anywhere in a string (Argo's template substitution).
TAG = re.compile(r"\{\{(.*?)\}\}", re.DOTALL)
# `{{=...}}`: an expression tag (expr-lang), not a plain variable reference.
EXPRESSION_TAG = re.compile(r"\{\{=")

# validate.go paramRegex: a DAG target holding a simple tag is checked once substituted.
PARAMETER_TAG = re.compile(r"\{\{[-a-zA-Z0-9]+(\.[-a-zA-Z0-9_]+)*\}\}")


def unknown_targets(target: str, tasks: Iterable[str]) -> list[str]:
    """The names in a DAG's ``target`` that name no task, as Argo reads them (validate.go
    ``validateDAGTargets``, dag.go ``executeDAG``): split on single spaces, so two spaces (or
    one at either end) give an empty name, which names no task; a name holding a parameter tag
    is skipped (it is checked once substituted)."""
    if not target:
        return []
    known = set(tasks)
    return [name for name in target.split(" ")
            if name not in known and not PARAMETER_TAG.search(name)]


# Workflow annotation with the JSON types and bounds of the parameters (Argo ignores it; the
# local runner and `sublimate submit` check it before a run starts).
TYPES_ANNOTATION = "sublimate.dev/parameter-types"


# ---------------------------------------------------------------------------------- depends


class ExpressionError(ValueError):
    """An expression (`depends`, `when`) that does not parse."""


Ast = tuple  # ("ref", task, result | None) | ("not", Ast) | ("and" | "or", Ast, Ast)

_DEP_TOKEN = re.compile(r"\s*(?:(&&|\|\||!|\(|\))|([A-Za-z0-9_][\w\-.]*))")


def tokenize_depends(expr: str) -> list[str]:
    tokens: list[str] = []
    pos = 0
    text = expr.rstrip()
    while pos < len(text):
        match = _DEP_TOKEN.match(text, pos)
        if not match:
            raise ExpressionError(f"unexpected {text[pos:].strip()!r} in depends {expr!r}")
        tokens.append(match.group(1) or match.group(2))
        pos = match.end()
    return tokens


class TokenCursor:
    """The place in a list of tokens of a recursive-descent parser (``depends`` here, ``when``
    in the runner), and its one-line errors naming the expression."""

    def __init__(self, tokens: list[Any], source: str) -> None:
        self.tokens = tokens
        self.pos = 0
        self.source = source

    def peek(self) -> Any:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self) -> Any:
        token = self.peek()
        if token is None:
            raise ExpressionError(f"unexpected end of expression {self.source!r}")
        self.pos += 1
        return token

    def expect_end(self) -> None:
        if self.pos != len(self.tokens):
            raise ExpressionError(f"unexpected {self.peek()!r} in expression {self.source!r}")


class _DependsParser(TokenCursor):
    """Recursive descent over ``||`` (lowest), ``&&``, ``!`` and parentheses."""

    def parse(self) -> Ast:
        ast = self.parse_or()
        self.expect_end()
        return ast

    def parse_or(self) -> Ast:
        left = self.parse_and()
        while self.peek() == "||":
            self.take()
            left = ("or", left, self.parse_and())
        return left

    def parse_and(self) -> Ast:
        left = self.parse_unary()
        while self.peek() == "&&":
            self.take()
            left = ("and", left, self.parse_unary())
        return left

    def parse_unary(self) -> Ast:
        token = self.take()
        if token == "!":
            return ("not", self.parse_unary())
        if token == "(":
            inner = self.parse_or()
            if self.take() != ")":
                raise ExpressionError(f"missing ')' in depends {self.source!r}")
            return inner
        if token in ("&&", "||", ")"):
            raise ExpressionError(f"unexpected {token!r} in depends {self.source!r}")
        task, _, result = token.rpartition(".")
        if task and result in DEPENDS_RESULTS:
            return ("ref", task, result)
        return ("ref", token, None)  # a plain task name (`a.Bogus` is then an unknown task)


def parse_depends(expr: str) -> Ast:
    return _DependsParser(tokenize_depends(expr), expr).parse()


def depends_references(ast: Ast) -> list[tuple[str, str | None]]:
    """Every ``(task, result or None)`` pair a parsed `depends` mentions, in order."""
    if ast[0] == "ref":
        return [(ast[1], ast[2])]
    return [ref for child in ast[1:] for ref in depends_references(child)]


def sub_path_problem(sub_path: str) -> str | None:
    """Why Kubernetes refuses ``sub_path`` as a ``subPath`` (its API validation,
    ``validateLocalDescendingPath``: an absolute path, or a ``..`` element), in the words of its
    error; None when it takes it. A subPath that left its volume wrote into the host as root."""
    if sub_path.startswith("/"):
        return f"Invalid value: {sub_path!r}: must be a relative path"
    if ".." in re.split(r"[\\/]", sub_path):
        return f"Invalid value: {sub_path!r}: must not contain '..'"
    return None


# Kubernetes' object names (apimachinery's IsDNS1123Subdomain): what a Workflow is named by, and
# so the local runner's run folder.
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def object_name_problem(name: str, prefix: bool = False) -> str | None:
    """Why Kubernetes refuses ``name`` as an object's ``metadata.name`` (``prefix``: as its
    ``generateName``, which may end in '-'), in the words of its error; None when it takes it.
    A name with '/' or '..' put the local runner's run folder elsewhere on the host."""
    checked = name[:-1] if prefix and name.endswith("-") else name
    if len(name) > 253:
        return f"Invalid value: {name!r}: must be no more than 253 characters"
    if _SUBDOMAIN.fullmatch(checked) is None:
        return (f"Invalid value: {name!r}: a lowercase RFC 1123 subdomain must consist of lower "
                "case alphanumeric characters, '-' or '.', and must start and end with an "
                "alphanumeric character")
    return None


# Kubernetes' value syntaxes in a container's settings: resource quantities and Linux
# capability names (the runner applies them: runner/pods/sandbox.py, resource_limits.py).
_SUFFIXES = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15,
             "E": 10**18, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50,
             "Ei": 2**60, "m": 10**-3}
_QUANTITY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)"
                       r"(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E|m)?$")

# linux/capability.h, in order: the name Kubernetes writes (without CAP_) -> its number.
CAPABILITIES = {name: number for number, name in enumerate((
    "CHOWN", "DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID",
    "SETPCAP", "LINUX_IMMUTABLE", "NET_BIND_SERVICE", "NET_BROADCAST", "NET_ADMIN", "NET_RAW",
    "IPC_LOCK", "IPC_OWNER", "SYS_MODULE", "SYS_RAWIO", "SYS_CHROOT", "SYS_PTRACE", "SYS_PACCT",
    "SYS_ADMIN", "SYS_BOOT", "SYS_NICE", "SYS_RESOURCE", "SYS_TIME", "SYS_TTY_CONFIG", "MKNOD",
    "LEASE", "AUDIT_WRITE", "AUDIT_CONTROL", "SETFCAP", "MAC_OVERRIDE", "MAC_ADMIN", "SYSLOG",
    "WAKE_ALARM", "BLOCK_SUSPEND", "AUDIT_READ", "PERFMON", "BPF", "CHECKPOINT_RESTORE"))}


def quantity(text: object) -> float:
    """A Kubernetes quantity (``256Mi``, ``1.5G``, ``500m``, ``1e9``) as a number;
    ``ValueError`` saying what one looks like."""
    found = _QUANTITY.match(str(text).strip())
    if found is None:
        raise ValueError(f"{text!r} is not a quantity (e.g. 512Mi, 1Gi, 500m, 2)")
    return float(found.group(1)) * _SUFFIXES[found.group(2) or ""]


def capability(name: object) -> int | None:
    """A capability's number, None for ``ALL``; ``ValueError`` for a name Linux lacks."""
    text = str(name).upper().removeprefix("CAP_")
    if text == "ALL":
        return None
    if text not in CAPABILITIES:
        raise ValueError(f"unknown capability {name!r}")
    return CAPABILITIES[text]


def container_setting_problems(container: dict) -> list[tuple[str, str]]:
    """What Kubernetes would refuse in a container's ``resources.limits`` and
    ``securityContext.capabilities``, as (field below the container, problem); a value
    holding ``{{`` is checked once substituted (the runner's ``pods/``)."""
    problems: list[tuple[str, str]] = []
    limits = (container.get("resources") or {}).get("limits") or {}
    for key in ("memory", "cpu"):
        value = limits.get(key) if isinstance(limits, dict) else None
        if value is not None and "{{" not in str(value):
            try:
                if quantity(value) <= 0:
                    problems.append((f"resources.limits.{key}", "must be more than 0"))
            except ValueError as exc:
                problems.append((f"resources.limits.{key}", str(exc)))
    context = container.get("securityContext") or {}
    asked = context.get("capabilities") or {} if isinstance(context, dict) else {}
    for key in ("add", "drop"):
        for name in (asked.get(key) or []) if isinstance(asked, dict) else []:
            if "{{" not in str(name):
                try:
                    capability(name)
                except ValueError as exc:
                    problems.append((f"securityContext.capabilities.{key}", str(exc)))
    return problems
