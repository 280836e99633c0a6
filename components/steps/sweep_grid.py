"""The ``sweep-grid`` step of ``sublimate-sweep``: check a grid of settings and expand it into
the points to train.

The grid is a JSON object, axis -> list of values, e.g. ``{"algorithm": ["sync", "bmuf"],
"global-batch-size": [64, 512]}``; its points are the product of the axes, in the order the
axes are written, the last axis varying fastest (as ``itertools.product``). An axis is any
train or evaluate setting of the pipeline (:mod:`sublimate.components.base.settings`) except
``run-id``, which each point gets for itself; each value is checked by that setting's own
declaration (kind, choices, bounds, pattern) and each point by the rules that tie settings
together (:func:`settings.check`), with the messages a pipeline parameter gets. The same
checks run in ``sublimate run``/``submit`` before any step starts (:func:`check_texts`).

Outputs, as JSON:

- ``runs``: one object per point with *every* train and evaluate setting (the workflow's fixed
  value, replaced by the point's axes), ``id`` (``p00``, ``p01``, ...) and ``run-id``
  (``<run-id or workflow name>-<id>``, so a resubmitted sweep with the same ``run-id`` resumes
  its points): the fan-out's items, read as plain ``{{item.<setting>}}``;
- ``points``: the compare step's list, ``{"id", "run-id", "params": {axis: value}}``;
- ``size``: the number of points, and ``sweep-dir``: where the comparison report goes.
"""

from __future__ import annotations

import difflib
import itertools
import json
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sublimate.components.base import settings as declared
from sublimate.components.base.runtime import SHARED_VOLUME_PATH
from sublimate.components.base.termination import OneLineParser, fail

STEP = "sweep-grid"
# The steps whose settings a point carries: sublimate-train's.
POINT_STEPS = ("train", "evaluate")
# Every point is a training job and its settings live in the workflow's status (Argo keeps the
# whole workflow object in etcd, under 1.5 MB without a status-offload database): 64 points of
# ~6 KB of node status each stay well under it, and a grid larger than that is a search better
# done another way (random search, successive halving).
MAX_POINTS = 64
# Set per point: one run folder each.
PER_POINT = "run-id"
# Where each sweep's comparison report goes, beside the runs' folders.
SWEEPS_PATH = f"{SHARED_VOLUME_PATH}/sweeps"


@dataclass(frozen=True)
class Point:
    """One point of the grid: its id, its run folder's name, its axes' values (typed, for the
    report) and every setting's text (for the train and evaluate steps)."""

    id: str
    run_id: str
    params: dict[str, Any]
    settings: dict[str, str]

    def run(self) -> dict[str, str]:
        """The fan-out's item: every setting, ``id`` and ``run-id``."""
        return {"id": self.id, **self.settings, PER_POINT: self.run_id}

    def summary(self) -> dict[str, Any]:
        """The compare step's view: ``id``, ``run-id`` and the axes' values."""
        return {"id": self.id, "run-id": self.run_id, "params": self.params}


def point_settings() -> list[declared.Setting]:
    """The settings every point carries: those of sublimate-train's train and evaluate steps."""
    return [s for s in declared.SETTINGS if s.in_pipeline and s.step in POINT_STEPS]


def axis_settings() -> dict[str, declared.Setting]:
    """What an axis may name, by name."""
    return {s.name: s for s in point_settings() if s.name != PER_POINT}


def _unknown_axis(name: str, known: dict[str, declared.Setting]) -> str:
    if name == PER_POINT:
        return (f"grid: {PER_POINT} cannot be an axis: every point gets its own run folder "
                f"(<run-id or workflow name>-p00, -p01, ...)")
    if name == "dataset":
        return "grid: dataset cannot be an axis: a sweep stages one dataset for all its points"
    close = difflib.get_close_matches(name, known, n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return (f"grid: unknown axis '{name}'{hint}; an axis is a train or evaluate setting: "
            f"{', '.join(sorted(known))}")


def _value_text(setting: declared.Setting, value: Any) -> str:
    """A JSON value of an axis as the setting's text; SettingError for what no setting takes."""
    if value is None or isinstance(value, list | dict):
        raise declared.SettingError(f"grid: {setting.name}: {json.dumps(value)} is not a "
                                    "value (give text, a number or true/false)")
    return setting.text(value)


def _report_value(setting: declared.Setting, typed: Any) -> Any:
    """A typed value as the report shows it: numbers stay numbers, ``auto`` and node ranges
    text."""
    if typed is None or (isinstance(typed, declared.NodeRange) and typed.elastic):
        return setting.text(typed)
    if isinstance(typed, declared.NodeRange):
        return int(typed)
    return typed


def parse_grid(text: str) -> dict[str, list[tuple[str, Any]]]:
    """The grid's axes in their order, each a list of (text, typed value); raises
    :class:`settings.SettingError` with one line that names what is wrong."""
    try:
        grid = json.loads(text)
    except json.JSONDecodeError as error:
        raise declared.SettingError(f"grid: not JSON ({error.msg} at character {error.pos}): "
                                    'give an object of lists, e.g. {"algorithm": ["sync", '
                                    '"bmuf"]}') from None
    if not isinstance(grid, dict):
        raise declared.SettingError(f"grid: expected a JSON object of axis -> list of values, "
                                    f"got {type(grid).__name__}")
    if not grid:
        raise declared.SettingError('grid: no axis; give at least one, e.g. {"algorithm": '
                                    '["sync", "bmuf"]}')
    known = axis_settings()
    axes: dict[str, list[tuple[str, Any]]] = {}
    for name, values in grid.items():
        if name not in known:
            raise declared.SettingError(_unknown_axis(name, known))
        setting = known[name]
        if not isinstance(values, list):
            raise declared.SettingError(f"grid: {name}: expected a list of values, got "
                                        f"{json.dumps(values)}")
        if not values:
            raise declared.SettingError(f"grid: {name}: the list of values is empty")
        axis: list[tuple[str, Any]] = []
        seen: set[str] = set()
        for value in values:
            text = _value_text(setting, value)
            try:
                typed = setting.parse(text)
            except declared.SettingError as error:
                raise declared.SettingError(f"grid: {error}") from None
            canonical = setting.text(typed)  # 0.1 and "0.10" are one value
            if canonical in seen:
                raise declared.SettingError(f"grid: {name}: {text} is listed twice")
            seen.add(canonical)
            axis.append((text, _report_value(setting, typed)))
        axes[name] = axis
    size = 1
    for axis in axes.values():
        size *= len(axis)
    if size > MAX_POINTS:
        shape = " x ".join(f"{len(v)} {k}" for k, v in axes.items())
        raise declared.SettingError(f"grid: {shape} = {size} points, more than the "
                                    f"{MAX_POINTS} a sweep runs")
    return axes


def point_id(index: int, size: int) -> str:
    """``p00``, ``p01``, ...: zero-padded to sort as they run."""
    return f"p{index:0{max(2, len(str(size - 1)))}d}"


def expand(grid_text: str, fixed: Mapping[str, str], base: str) -> list[Point]:
    """The grid's points: every setting from ``fixed`` (texts by name; a missing one takes its
    declared default), replaced by the point's axes, each point checked by
    :func:`settings.check`. ``base`` names the run folders (``<base>-p00``)."""
    axes = parse_grid(grid_text)
    settings_of_points = point_settings()
    common: dict[str, str] = {}
    for setting in settings_of_points:
        text = fixed.get(setting.name, setting.default_text())
        if setting.name not in axes:  # an axis's fixed value is not used: it need not parse
            setting.parse(text)
        common[setting.name] = text
    if not base or re.fullmatch(declared.RUN_ID_PATTERN, base) is None:
        raise declared.SettingError(f"run-id: '{base}' must be lowercase letters, digits, '-' "
                                    "and '.', starting and ending with a letter or digit")
    combinations = list(itertools.product(*axes.values()))
    points = []
    for index, values in enumerate(combinations):
        identifier = point_id(index, len(combinations))
        chosen = dict(zip(axes, values, strict=True))
        texts = {**common, **{name: text for name, (text, _) in chosen.items()}}
        described = ", ".join(f"{name}={text}" for name, (text, _) in chosen.items())
        try:
            declared.check(declared.parse_values(texts))
        except declared.SettingError as error:
            raise declared.SettingError(f"grid point {identifier} ({described}): "
                                        f"{error}") from None
        points.append(Point(identifier, f"{base}-{identifier}",
                            {name: typed for name, (_, typed) in chosen.items()}, texts))
    return points


def check_texts(texts: Mapping[str, str]) -> None:
    """The sweep's parameter check before any step runs (``sublimate run``/``submit``): the
    grid and every point, as the ``sweep-grid`` step will check them."""
    expand(texts.get("grid", ""), texts, texts.get(PER_POINT) or "sweep")


def parse_args(argv: list[str] | None) -> Any:
    parser = OneLineParser(prog=STEP, description=__doc__.splitlines()[0])
    parser.add_argument("--grid", required=True, help="JSON object: axis -> list of values")
    parser.add_argument("--workflow-name", required=True,
                        help="names the run folders when run-id is empty")
    parser.add_argument("--sweeps-root", type=Path, required=True,
                        help="folder of the sweeps' reports (the report goes in "
                             "<sweeps-root>/<run-id or workflow name>)")
    for setting in point_settings():
        # Texts, checked by expand(): a point passes them on to its steps as they were given.
        parser.add_argument(setting.flag, dest=setting.attribute,
                            default=setting.default_text(), help=setting.description)
    for output in ("runs", "points", "size", "sweep-dir"):
        parser.add_argument(f"--{output}-output", type=Path, help=f"file to write {output} to")
    return parser.parse_args(argv)


def write_outputs(args: Any, points: list[Point], sweep_dir: Path) -> None:
    compact = (",", ":")
    for path, value in ((args.runs_output, json.dumps([p.run() for p in points],
                                                      separators=compact)),
                        (args.points_output,
                         json.dumps([p.summary() for p in points], separators=compact)),
                        (args.size_output, str(len(points))),
                        (args.sweep_dir_output, str(sweep_dir))):
        if path:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(value)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    fixed = {s.name: getattr(args, s.attribute) for s in point_settings()}
    base = fixed[PER_POINT] or args.workflow_name
    try:
        points = expand(args.grid, fixed, base)
    except declared.SettingError as error:
        return fail(STEP, str(error))
    sweep_dir = args.sweeps_root / base
    problem = _start_tracking(args, fixed, base, sweep_dir)
    if problem is not None:
        return fail(STEP, problem)
    write_outputs(args, points, sweep_dir)
    print(f"{STEP}: {len(points)} points, report in {sweep_dir}", flush=True)
    for point in points:
        axes = ", ".join(f"{name}={point.settings[name]}" for name in point.params)
        print(f"  {point.id}  {point.run_id}  {axes}", flush=True)
    return 0


def _start_tracking(args: Any, fixed: Mapping[str, str], base: str,
                    sweep_dir: Path) -> str | None:
    """With tracking on: the sweep's parent run in MLflow (its points' runs become its
    children); None, or the one line to fail with (a required server that does not answer)."""
    from sublimate.components.base.mlflow_connection import TrackingError, tracking_uri

    if tracking_uri(args.tracking) is None:
        return None
    from sublimate.components.monitoring.mlflow_tracking import NOT_PARAMETERS, start_sweep

    required = declared.BY_NAME["tracking-required"].parse(args.tracking_required)
    params = {"grid": args.grid, **{name: text for name, text in fixed.items()
                                    if name.replace("-", "_") not in NOT_PARAMETERS}}
    try:
        start_sweep(args.tracking, required, args.workflow_name, base, params, sweep_dir)
    except TrackingError as error:
        return str(error)
    return None


def template(name: str = STEP, **step_options: object):
    """The ``sweep-grid`` step: inputs ``grid``, ``workflow-name`` and every setting of the
    train and evaluate steps; outputs ``runs``, ``points``, ``size`` and ``sweep-dir``."""
    from hera.workflows import Parameter

    from sublimate.components.base.mlflow_connection import credentials_env as mlflow_env
    from sublimate.components.base.runtime import python_step

    step = python_step(
        name, "sublimate.components.steps.sweep_grid",
        inputs={"grid": "--grid", "workflow-name": "--workflow-name",
                **{setting.name: setting.flag for setting in point_settings()}},
        outputs={output: f"--{output}-output" for output in ("runs", "points", "size",
                                                             "sweep-dir")},
        extra_args=["--sweeps-root", SWEEPS_PATH],
        env=mlflow_env(),  # tracking's server: a Secret, optional
        cpu="100m", memory="256Mi",  # reads and writes a few kilobytes of JSON
        **step_options,  # type: ignore[arg-type]
    )
    # A setting the pipeline does not pass takes its declared default, as the train step's do.
    step.inputs = [p if p.name in ("grid", "workflow-name")
                   else Parameter(name=p.name, default=declared.BY_NAME[p.name].default_text())
                   for p in step.inputs]
    return step


if __name__ == "__main__":
    sys.exit(main())
