"""The ``gate`` step of retraining: does the challenger beat the registry's champion?

The champion is downloaded from the registry and evaluated *now*, on this run's staged test split,
with the very code the evaluate step scored the challenger with
(:func:`sublimate.components.steps.evaluate.measure`: the user's ``eval-entrypoint``, else the
built-in evaluation, else the metrics its training wrote). Comparing against the champion's metrics
as recorded when it was trained would compare two different test sets whenever the data moved on,
which is exactly when a nightly retraining matters.

The challenger is promoted when there is no champion yet, or when it is better on ``metric`` by
more than ``promote-margin`` (``metric-goal`` says which way is better). A champion that cannot
be evaluated on this split (the data's shape changed, the metric is new) is not silently
replaced: the gate keeps it, says why, and leaves ``sublimate models promote`` to a person.

Outputs ``promote`` (true/false), ``reason`` (one line), ``champion`` (the champion's version id,
empty when there is none) and ``champion-metric``; the same decision goes to ``gate.json`` in the
run's folder for the exit handler's notification.
"""

from __future__ import annotations

import json
import math
import re
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sublimate.components.base import settings as declared
from sublimate.components.base.disk_full import explain
from sublimate.components.base.durable_files import write_json
from sublimate.components.base.termination import OneLineParser, disk_full_in_one_line, fail

STEP = "gate"
RECORD = "gate.json"  # the decision, in the run's folder (read by the notify step)
# metric-goal auto: names that mean "lower is better" (as whole words: val_loss, test-error).
_LOWER_IS_BETTER = re.compile(r"(^|[^a-z])(loss|error|err|mse|mae|rmse|perplexity|ppl|wer|cer)"
                              r"($|[^a-z])", re.IGNORECASE)


@dataclass(frozen=True)
class Decision:
    promote: bool
    reason: str
    metric: str
    goal: str  # "max" or "min": the direction that was applied
    challenger: float
    champion: str = ""  # the champion's version id; empty when there is none
    champion_metric: float | None = None
    margin: float = 0.0
    workflow_uid: str = ""
    decided: str = ""


def goal_of(metric: str, goal: str) -> str:
    """``max`` or ``min`` for ``metric`` (``goal`` auto: by the metric's name)."""
    if goal != declared.AUTO:
        return goal
    return "min" if _LOWER_IS_BETTER.search(metric) else "max"


def as_number(value: Any, what: str) -> float:
    """A metric's value as a float; ValueError in one line naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"{what} is {value!r}, not a number: the gate compares numbers")
    try:
        number = float(value)
    except ValueError:
        raise ValueError(f"{what} is '{value}', not a number: the gate compares "
                         "numbers") from None
    if math.isnan(number):
        raise ValueError(f"{what} is NaN: the gate cannot compare it")
    return number


def _text(value: float) -> str:
    return f"{value:.6g}"


def decide(metric: str, goal: str, margin: float, challenger: float,
           champion: str = "", champion_metric: float | None = None) -> tuple[bool, str]:
    """Whether to promote the challenger, and why, in one line."""
    if not champion:
        return True, (f"no champion yet: the challenger ({metric} {_text(challenger)}) becomes "
                      "the first")
    assert champion_metric is not None
    better = challenger - champion_metric if goal == "max" else champion_metric - challenger
    direction = "higher" if goal == "max" else "lower"
    compared = (f"challenger {metric} {_text(challenger)} vs champion {champion} "
                f"{_text(champion_metric)} on this test split ({direction} is better)")
    if better > margin:
        return True, f"{compared}: better by {_text(better)} > promote-margin {_text(margin)}"
    if better > 0:
        return False, (f"{compared}: better by only {_text(better)}, not more than "
                       f"promote-margin {_text(margin)}; the champion stays")
    worse = "no better" if better == 0 else f"worse by {_text(-better)}"
    return False, f"{compared}: {worse}; the champion stays"


def score_champion(registry: Any, version: Any, data_dir: Path, eval_entrypoint: str,
                   metric: str, work: Path) -> tuple[float | None, str]:
    """The champion's ``metric`` on ``data_dir``'s test split, measured as the evaluate step
    measured the challenger; (None, why) when it cannot be."""
    from sublimate.components.base import run_files
    from sublimate.components.steps import evaluate

    model_dir = registry.download(version.id, work / "champion")
    try:
        metrics, source = evaluate.measure(Path(model_dir), data_dir, eval_entrypoint)
        value = as_number(evaluate.chosen_metric(metrics, metric,
                                                 Path(model_dir) / run_files.EVALUATION),
                          f"the champion's {metric}")
    except evaluate.EVALUATION_ERRORS as error:
        return None, " ".join(str(error).split())
    if source not in (evaluate.BUILT_IN,) and not eval_entrypoint:
        # Neither an eval-entrypoint nor a model the built-in evaluation can rebuild: what its
        # training wrote is all there is, measured on the split of its own time.
        print(f"gate: the champion {version.id} cannot be re-evaluated here (no eval-entrypoint"
              f", not a sublimate model): comparing the {metric} its training recorded",
              flush=True)
    return value, ""


def run_gate(args: Any) -> Decision:
    """Evaluate the champion and decide; raises ``RegistryError``/``ValueError`` on bad input."""
    from sublimate.components.data.object_store import public_url
    from sublimate.components.model.mlflow_registry import open_registry

    goal = goal_of(args.metric, args.metric_goal)
    challenger = as_number(args.challenger_metric, f"the challenger's {args.metric}")
    registry = open_registry(args.registry)  # a folder, an fsspec URL or mlflow[:NAME]
    champion = registry.champion()
    decided = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    common = {"metric": args.metric, "goal": goal, "challenger": challenger,
              "margin": args.promote_margin, "workflow_uid": args.workflow_uid,
              "decided": decided}
    if champion is None:
        promote, reason = decide(args.metric, goal, args.promote_margin, challenger)
        reason += f" in {public_url(args.registry)}"
        return Decision(promote, reason, **common)
    print(f"gate: evaluating the champion {champion.id} on {args.data_dir} as evaluate did "
          "the challenger", flush=True)
    with tempfile.TemporaryDirectory(prefix="sublimate-gate-") as work:
        value, problem = score_champion(registry, champion, args.data_dir,
                                        args.eval_entrypoint, args.metric, Path(work))
    if value is None:
        return Decision(False, f"the champion {champion.id} cannot be evaluated on this test "
                        f"split ({problem}); it stays until a person decides (sublimate models "
                        "promote VERSION)", champion=champion.id, **common)
    promote, reason = decide(args.metric, goal, args.promote_margin, challenger,
                             champion.id, value)
    return Decision(promote, reason, champion=champion.id, champion_metric=value, **common)


def gate_settings() -> list[declared.Setting]:
    """The gate's inputs from the declarations: evaluate's (the champion is evaluated as the
    challenger was) and its own (registry, promote-margin, metric-goal)."""
    return [*declared.settings(step="evaluate"), *declared.settings(step=STEP)]


def parse_args(argv: list[str] | None) -> Any:
    parser = OneLineParser(prog=STEP, description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, required=True,
                        help="the challenger's run folder (the decision is kept there)")
    parser.add_argument("--data-dir", type=Path, required=True, help="staged dataset folder")
    parser.add_argument("--challenger-metric", required=True,
                        help="the challenger's metric, as the evaluate step output it")
    parser.add_argument("--workflow-uid", default="", help="stamps the decision's record")
    declared.add_arguments(parser, gate_settings())
    for output in ("promote", "reason", "champion", "champion-metric"):
        parser.add_argument(f"--{output}-path", type=Path, help=f"file to write {output} to")
    return parser.parse_args(argv)


def write_outputs(args: Any, decision: Decision) -> None:
    write_json(asdict(decision), args.model_dir / RECORD)  # read by notify
    champion_metric = "" if decision.champion_metric is None else _text(decision.champion_metric)
    for path, value in ((args.promote_path, "true" if decision.promote else "false"),
                        (args.reason_path, decision.reason),
                        (args.champion_path, decision.champion),
                        (args.champion_metric_path, champion_metric)):
        if path:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(value)


def read_record(path: Path, workflow_uid: str) -> dict[str, Any] | None:
    """The record at ``path`` if this workflow wrote it; None otherwise (a reused run-id's
    folder may hold an earlier workflow's)."""
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and record.get("workflow_uid") == workflow_uid \
        else None


@disk_full_in_one_line(STEP)
def main(argv: list[str] | None = None) -> int:
    from sublimate.components.data.object_store import redact
    from sublimate.components.model.registry import RegistryError

    args = parse_args(argv)
    try:
        decision = run_gate(args)
    except (RegistryError, ValueError, OSError) as error:
        # a bare OSError of a full disk: which disk, and what (the registry says its own)
        full = explain(error) if isinstance(error, OSError) else None
        return fail(STEP, redact(full or str(error)))
    write_outputs(args, decision)
    print(f"gate: {'promote' if decision.promote else 'keep the champion'}: {decision.reason}",
          flush=True)
    return 0



def template(name: str = STEP, **step_options: object):
    """The ``gate`` step: inputs ``data-dir``, ``model-dir``, ``challenger-metric``,
    ``workflow-uid`` and the settings of evaluate and the gate; outputs ``promote``, ``reason``,
    ``champion`` and ``champion-metric``."""
    from sublimate.components.base.mlflow_connection import credentials_env as mlflow_env
    from sublimate.components.base.runtime import python_step

    own = gate_settings()
    return python_step(
        name, "sublimate.components.steps.gate",
        inputs={"data-dir": "--data-dir", "model-dir": "--model-dir",
                "challenger-metric": "--challenger-metric", "workflow-uid": "--workflow-uid",
                **{setting.name: setting.flag for setting in own}},
        outputs={output: f"--{output}-path"
                 for output in ("promote", "reason", "champion", "champion-metric")},
        env=mlflow_env(),  # registry mlflow's server: a Secret, optional
        **step_options,  # type: ignore[arg-type]
    )


if __name__ == "__main__":
    sys.exit(main())
