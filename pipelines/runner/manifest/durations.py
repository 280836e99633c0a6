"""The duration values Argo accepts, parsed as Argo's Go code parses them.

``parse_go_duration`` is Go's ``time.ParseDuration`` (``"1h30m"``, ``"500ms"``, ``"1.5h"``,
``"-2m"``, ``"0"``; units ns, us, µs, ms, s, m, h; no days, no bare numbers but ``0``): Argo
uses it alone for ``memoize.maxAge``. ``parse_duration`` is Argo's ``ParseStringToDuration``
(``pkg/apis/workflow/v1alpha1/utils.go``): an integer is seconds, anything else a Go duration;
Argo uses it for ``timeout``, ``pendingTimeout`` and ``retryStrategy.backoff``'s ``duration``,
``cap`` and ``maxDuration`` (``workflow/controller/operator.go``).
"""

from __future__ import annotations

import re

_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0,
          "h": 3600.0}
# One number and its unit, as Go's ParseDuration reads them: digits, an optional fraction
# (at least one digit in all), then a unit.
_PART = re.compile(r"(\d+\.?\d*|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_INTEGER = re.compile(r"[+-]?\d+")


def parse_go_duration(value: object) -> float:
    """Seconds; ``ValueError`` for what Go's ``time.ParseDuration`` refuses."""
    text = str(value)
    body = text[1:] if text[:1] in "+-" else text
    if body == "0":
        return 0.0
    pos, total = 0, 0.0
    for match in _PART.finditer(body):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _UNITS[match.group(2)]
        pos = match.end()
    if not body or pos != len(body):
        raise ValueError(f"invalid duration {text!r} (Go syntax: 1h30m, 500ms, 1.5h)")
    return -total if text.startswith("-") else total


def parse_duration(value: object) -> float:
    """Seconds, as ``ParseStringToDuration``: an integer (``10``, ``"10"``) is seconds, any
    other value a Go duration; ``ValueError`` otherwise."""
    if isinstance(value, bool | float):
        raise ValueError(f"invalid duration {value!r}")
    if isinstance(value, int) or _INTEGER.fullmatch(str(value)):
        return float(int(value))  # type: ignore[arg-type]
    return parse_go_duration(value)


def is_integer(value: object) -> bool:
    """Whether ``strconv.Atoi`` reads ``value``: what a ``timeout`` may not be (validate.go)."""
    return not isinstance(value, bool) and (
        isinstance(value, int) or bool(_INTEGER.fullmatch(str(value))))


def timing_problems(template: dict, path: str) -> list[str]:
    """What Argo's validate.go refuses in a template's timing fields, and what Go cannot parse:
    ``timeout``, ``pendingTimeout`` and ``activeDeadlineSeconds`` on leaf templates only (a DAG
    or steps template's ``timeout`` would never apply: operator.go checks it on Pending nodes
    and pods), a
    ``timeout`` that is not a whole number, ``parallelism`` on DAG and steps templates only,
    and ``retryStrategy.backoff``'s durations and integer ``factor``."""
    problems = []
    kind = "DAG" if "dag" in template else "Steps" if "steps" in template else ""
    timeout = template.get("timeout")
    if timeout is not None:
        if kind:
            problems.append(f"{path}.timeout: {kind} template doesn't support timeout field")
        elif "{{" not in str(timeout):
            if is_integer(timeout):
                problems.append(f"{path}.timeout: {template.get('name')} has invalid duration "
                                f"format in timeout ({timeout!r}: write {timeout}s)")
            else:
                try:
                    parse_duration(timeout)
                except ValueError as exc:
                    problems.append(f"{path}.timeout: {exc}")
    pending = template.get("pendingTimeout")
    if pending is not None:
        if kind:
            problems.append(f"{path}.pendingTimeout: {kind} template doesn't support "
                            "pendingTimeout field")
        elif "{{" not in str(pending):
            try:
                parse_duration(pending)
            except ValueError as exc:
                problems.append(f"{path}.pendingTimeout: {exc}")
    if kind and template.get("activeDeadlineSeconds") is not None:
        problems.append(f"{path}.activeDeadlineSeconds: templates.{template.get('name')}"
                        ".activeDeadlineSeconds is only valid for leaf templates")
    if not kind and template.get("parallelism") is not None:
        problems.append(f"{path}.parallelism: templates.{template.get('name')}.parallelism "
                        "is only valid for steps and dag templates")
    backoff = (template.get("retryStrategy") or {}).get("backoff") or {}
    for key in ("duration", "maxDuration", "cap"):
        if key in backoff and "{{" not in str(backoff[key]):
            try:
                parse_duration(backoff[key])
            except ValueError as exc:
                problems.append(f"{path}.retryStrategy.backoff.{key}: {exc}")
    factor = backoff.get("factor")
    if factor is not None and "{{" not in str(factor) and not is_integer(factor):
        # operator.go reads it with intstr.Int32: an integer, or a string of one
        problems.append(f"{path}.retryStrategy.backoff.factor: {factor!r} is not an integer")
    return problems
