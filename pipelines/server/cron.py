"""Cron schedules as Argo's controller reads them (``robfig/cron/v3``'s ``ParseStandard``, with
``CRON_TZ=`` from ``spec.timezone``), and the expressions a CronWorkflow is governed by
(``stopStrategy.expression``, ``when``: ``workflow/cron/operator.go``). Pure functions of
their inputs: no clock, no server, so that the scheduler's decisions are tested with exact
times and zones.

Semantics kept from robfig: five fields (minute hour day-of-month month day-of-week), ``*``
and ``?``, ranges, steps, lists, month and weekday names, the ``@yearly``... descriptors and
``@every DURATION``; day-of-month and day-of-week OR'ed when both are restricted (AND'ed when
either is ``*``). A schedule fires at each instant whose wall-clock time in its zone matches:
a time skipped by a DST change does not fire that day, and a time repeated by one fires twice,
as robfig's ``SpecSchedule.Next`` does."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta, tzinfo
from typing import Any

# Argo's maxCharsInCronWorkflowName: "-<unix seconds>" must still fit a 63-character label.
MAX_NAME = 52
# robfig gives up after five years without a match (``yearLimit``): `0 0 30 2 *` never fires.
_YEARS_SEARCHED = 5

_MONTHS = {name: number for number, name in enumerate(
    ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"), 1)}
_WEEKDAYS = {name: number for number, name in enumerate(
    ("sun", "mon", "tue", "wed", "thu", "fri", "sat"))}
# (what the field is, its bounds, the names it takes): robfig's minutes ... dow
_FIELDS = (("minute", 0, 59, {}), ("hour", 0, 23, {}), ("day of month", 1, 31, {}),
           ("month", 1, 12, _MONTHS), ("day of week", 0, 6, _WEEKDAYS))
_DESCRIPTORS = {"@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *",
                "@weekly": "0 0 * * 0", "@daily": "0 0 * * *", "@midnight": "0 0 * * *",
                "@hourly": "0 * * * *"}
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0,
                 "m": 60.0, "h": 3600.0}


class ScheduleError(ValueError):
    """A schedule, time zone or expression Argo would refuse; the message says why."""


def zone(name: str | None) -> tzinfo:
    """``spec.timezone`` as Go's ``time.LoadLocation`` reads it: empty is the machine's local
    zone (Argo: "Default is machine's local time"), ``UTC`` and ``Local`` as Go names them."""
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    if not name or name == "Local":
        local = datetime.now().astimezone().tzinfo
        return local if local is not None else UTC
    if name == "UTC":
        return UTC
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as error:
        raise ScheduleError(f"unknown time zone {name}") from error


@dataclass(frozen=True)
class Schedule:
    """One parsed schedule: the sets of values each field matches, or a constant delay."""

    text: str
    zone: tzinfo
    minutes: frozenset[int] = frozenset()
    hours: frozenset[int] = frozenset()
    days: frozenset[int] = frozenset()
    months: frozenset[int] = frozenset()
    weekdays: frozenset[int] = frozenset()
    # robfig's starBit: a field written `*` or `?` (a step over it clears it)
    any_day: bool = False
    any_weekday: bool = False
    every: timedelta | None = None

    def next_after(self, moment: datetime, anchor: datetime | None = None) -> datetime | None:
        """The first instant strictly after ``moment`` at which this schedule fires (None if
        none in five years); ``anchor``: where an ``@every`` schedule counts from (robfig: when
        it was added), else ``moment``."""
        if self.every is not None:
            start = anchor or moment
            steps = max(0, (moment - start) // self.every) + 1
            found = start + steps * self.every
            while found <= moment:  # (floor division of timedeltas is exact; belt and braces)
                found += self.every
            return found
        local = moment.astimezone(self.zone)
        # (wall times hours before `moment` on its own day are not worth converting)
        earliest = local.replace(tzinfo=None) - timedelta(hours=3)
        for day in _days(local.date(), 1):
            later = [instant for instant in self._instants(day, earliest) if instant > moment]
            if later:
                return min(later)
        return None

    def last_between(self, after: datetime, until: datetime,
                     anchor: datetime | None = None) -> datetime | None:
        """The latest instant in ``(after, until]`` at which this schedule fires, or None."""
        if until <= after:
            return None
        if self.every is not None:
            start = anchor or after
            if until < start + self.every:
                return None
            found = start + ((until - start) // self.every) * self.every
            return found if found > after else None
        first = after.astimezone(self.zone).date()
        for day in _days(until.astimezone(self.zone).date(), -1):
            # (a day before the first one's holds nothing after `after`, bar a DST fold at
            # midnight: one day more is looked at)
            if day < first - timedelta(days=1):
                return None
            within = [instant for instant in self._instants(day) if after < instant <= until]
            if within:
                return max(within)
        return None

    def _instants(self, day: date, earliest: datetime | None = None) -> list[datetime]:
        """Every instant (UTC) on local ``day`` whose wall-clock time matches (those before the
        naive wall time ``earliest`` left out): none for a time a DST change skips, two for one
        it repeats."""
        if day.month not in self.months or not self._day_matches(day):
            return []
        found: list[datetime] = []
        for hour in sorted(self.hours):
            for minute in sorted(self.minutes):
                if earliest is not None and datetime(day.year, day.month, day.day, hour,
                                                     minute) < earliest:
                    continue
                for fold in (0, 1):
                    wall = datetime(day.year, day.month, day.day, hour, minute, tzinfo=self.zone,
                                    fold=fold)
                    instant = wall.astimezone(UTC)
                    back = instant.astimezone(self.zone)
                    if (back.replace(tzinfo=None) == wall.replace(tzinfo=None)
                            and instant not in found):
                        found.append(instant)
        return found

    def _day_matches(self, day: date) -> bool:
        in_month = day.day in self.days
        in_week = (day.weekday() + 1) % 7 in self.weekdays  # Go's Sunday is 0
        if self.any_day or self.any_weekday:
            return in_month and in_week
        return in_month or in_week


def _days(start: date, step: int) -> Iterator[date]:
    day = start
    for _ in range(366 * _YEARS_SEARCHED + 2):
        yield day
        try:
            day += timedelta(days=step)
        except OverflowError:
            return


def parse_schedule(text: str, timezone: tzinfo) -> Schedule:
    """``text`` as ``cron.ParseStandard`` reads it (a ``CRON_TZ=``/``TZ=`` prefix overrides
    ``timezone``); ``ScheduleError`` saying what is wrong."""
    if not isinstance(text, str) or not text.strip():
        raise ScheduleError("empty spec string")
    spec = text.strip()
    where = timezone
    if spec.startswith(("CRON_TZ=", "TZ=")):
        prefix, _, spec = spec.partition(" ")
        where = zone(prefix.split("=", 1)[1])
        spec = spec.strip()
    if spec.startswith("@every"):
        return Schedule(text, where, every=_every(spec.removeprefix("@every").strip()))
    if spec.startswith("@"):
        if spec not in _DESCRIPTORS:
            raise ScheduleError(f"unrecognized descriptor: {spec}")
        spec = _DESCRIPTORS[spec]
    fields = spec.split()
    if len(fields) != len(_FIELDS):
        raise ScheduleError(f"expected exactly 5 fields, found {len(fields)}: {fields}")
    parsed = [_field(field, *bounds) for field, bounds in zip(fields, _FIELDS, strict=True)]
    (minutes, _), (hours, _), (days, any_day), (months, _), (weekdays, any_weekday) = parsed
    return Schedule(text, where, minutes, hours, days, months, weekdays, any_day, any_weekday)


def _every(text: str) -> timedelta:
    """Go's ``time.ParseDuration``, then robfig's ``Every``: at least a second, whole seconds."""
    if not text or _DURATION_PART.sub("", text) != "":
        raise ScheduleError(f"failed to parse duration @every {text}: time: invalid duration "
                            f"\"{text}\"")
    seconds = sum(float(number) * _UNIT_SECONDS[unit]
                  for number, unit in _DURATION_PART.findall(text))
    return timedelta(seconds=max(1, int(seconds)))


def _field(text: str, what: str, low: int, high: int, names: Mapping[str, int]
           ) -> tuple[frozenset[int], bool]:
    values: set[int] = set()
    star = False
    for part in text.lower().split(","):
        chosen, part_star = _range(part, what, low, high, names)
        values |= chosen
        star = star or part_star
    return frozenset(values), star


def _range(text: str, what: str, low: int, high: int, names: Mapping[str, int]
           ) -> tuple[set[int], bool]:
    range_text, slash, step_text = text.partition("/")
    if "/" in step_text:
        raise ScheduleError(f"too many slashes: {text}")
    bounds = range_text.split("-")
    star = bounds[0] in ("*", "?")
    if star:
        if len(bounds) > 1:
            raise ScheduleError(f"too many hyphens: {text}")
        start, end = low, high
    else:
        if len(bounds) > 2:
            raise ScheduleError(f"too many hyphens: {text}")
        start = _number(bounds[0], names)
        end = _number(bounds[1], names) if len(bounds) == 2 else start
    step = 1
    if slash:
        step = _number(step_text, {})
        if len(bounds) == 1 and not star:
            end = high  # robfig: "N/step" means "N-max/step"
        if step > 1:
            star = False
    if start < low:
        raise ScheduleError(f"beginning of range ({start}) below minimum ({low}): {text} "
                            f"({what})")
    if end > high:
        raise ScheduleError(f"end of range ({end}) above maximum ({high}): {text} ({what})")
    if start > end:
        raise ScheduleError(f"beginning of range ({start}) beyond end of range ({end}): "
                            f"{text} ({what})")
    if step <= 0:
        raise ScheduleError(f"step of range should be a positive number: {text} ({what})")
    return set(range(start, end + 1, step)), star


def _number(text: str, names: Mapping[str, int]) -> int:
    if text in names:
        return names[text]
    if not re.fullmatch(r"[+-]?\d+", text):
        raise ScheduleError(f"failed to parse int from {text}: strconv.Atoi: parsing "
                            f"\"{text}\": invalid syntax")
    return int(text)


# ------------------------------------------------------------------- what governs a run


def variables(cron: dict) -> dict[str, Any]:
    """The ``cronworkflow.*`` variables of ``stopStrategy.expression`` and ``when``
    (operator.go ``expressionEnv``); ``lastScheduledTime`` is its RFC 3339 text here (expr-lang
    time arithmetic is not offered), or None."""
    import json

    metadata = cron.get("metadata") or {}
    status = cron.get("status") or {}
    labels = metadata.get("labels") or {}
    annotations = metadata.get("annotations") or {}
    return {"cronworkflow.name": metadata.get("name", ""),
            "cronworkflow.namespace": metadata.get("namespace", ""),
            "cronworkflow.labels": labels,
            # (Argo sets annotations from the labels: operator.go's expressionEnv, kept)
            "cronworkflow.annotations": labels,
            "cronworkflow.labels.json": json.dumps(labels, separators=(",", ":")),
            "cronworkflow.annotations.json": json.dumps(annotations, separators=(",", ":")),
            "cronworkflow.failed": int(status.get("failed") or 0),
            "cronworkflow.succeeded": int(status.get("succeeded") or 0),
            "cronworkflow.lastScheduledTime": status.get("lastScheduledTime")}


def stop_reached(expression: str, cron: dict) -> bool:
    """``stopStrategy.expression`` (expr-lang, ``argoexpr.EvalBool``): whether to stop."""
    from sublimate.pipelines.runner.expressions.conditions import ExpressionError
    from sublimate.pipelines.runner.expressions.expr_lang import environment, evaluate

    # As Argo gives it: one map under `cronworkflow`, keyed by the rest of each name.
    env = environment({})
    env["cronworkflow"] = {name.removeprefix("cronworkflow."): value
                           for name, value in variables(cron).items()}
    try:
        result = evaluate(expression, {}, env=env)
    except (ExpressionError, ValueError, TypeError, KeyError) as error:
        raise ScheduleError(f"failed to evaluate stop expression: {error}") from error
    if not isinstance(result, bool):
        raise ScheduleError(f"failed to evaluate stop expression: {expression!r} gives "
                            f"{result!r}, not a boolean")
    return result


def when_holds(when: str, cron: dict) -> bool:
    """``spec.when`` (operator.go ``evalWhen``): its ``{{cronworkflow.*}}`` and ``{{=...}}``
    tags replaced, then the text evaluated as a govaluate condition."""
    if not when:
        return True
    from sublimate.pipelines.argo_terms import TAG
    from sublimate.pipelines.runner.expressions.conditions import ExpressionError, evaluate_when
    from sublimate.pipelines.runner.expressions.expr_lang import go_format, render_tag

    scope = variables(cron)

    def replace(match: re.Match[str]) -> str:
        inner = match.group(1)
        if inner.startswith("="):
            return render_tag(inner[1:], scope)
        name = inner.strip()
        if name not in scope:
            raise ExpressionError(f"failed to resolve {{{{{name}}}}}")
        value = scope[name]
        return "<nil>" if value is None else go_format(value)

    try:
        return evaluate_when(TAG.sub(replace, when))
    except (ExpressionError, ValueError, TypeError) as error:
        raise ScheduleError(f"when {when!r}: {error}") from error
