"""The ``sublimate-sweep`` pipeline: stage a dataset once, train and evaluate every point of a
grid of settings, then compare them in one report.

::

    stage-data ─┐
    sweep-grid ─┴─> sweep: one sweep-point (train -> evaluate) per point, PARALLELISM at a time
                    ──> compare: report.md, plots, and the best point

The stage-data, train and evaluate steps are ``sublimate-train``'s own templates, called by
``templateRef`` (as an Argo user reuses a WorkflowTemplate's steps; the install holds
sublimate-train): no copy to drift, and a change to a step reaches the sweep when
sublimate-train is installed. Those templates read only their inputs, never
``{{workflow.parameters}}`` (which, in a templateRef'd template, are the *calling* workflow's),
so they behave in a sweep exactly as in sublimate-train.

``sweep-grid`` (:mod:`sublimate.components.steps.sweep_grid`) checks the grid and expands it into
one item per point that carries every train and evaluate setting (the workflow's value, replaced by
the point's axes), so the fan-out passes plain ``{{item.<setting>}}`` and an axis needs no wiring of
its own. A failed point does not fail the sweep (``continueOn: failed`` on the fan-out); ``compare``
reports it, and fails only when every point failed. See docs/sweeps.md.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from sublimate.components.base import settings as declared
from sublimate.components.base.runtime import DEFAULT_CLAIM, DEFAULT_IMAGE
from sublimate.components.steps import sweep_grid
from sublimate.pipelines.sublimate_train import (
    DATASET_LABEL,
    global_outputs,
    pipeline_parameters,
    workflow_options,
)
from sublimate.pipelines.typed_parameters import PipelineParameter

if TYPE_CHECKING:
    from hera.workflows import WorkflowTemplate

# The WorkflowTemplate whose stage-data, train and evaluate templates the sweep calls.
TRAIN_TEMPLATE = "sublimate-train"
# How many points train at once. Argo's template `parallelism` is a number fixed in the
# manifest (no parameter can set it): change it with a kustomize patch of the install, or
# `sweep_pipeline(parallelism=...)` and `sublimate render`.
PARALLELISM = 2
DEFAULT_GRID = '{"algorithm": ["sync", "bmuf"]}'
GRID_STEP = "sweep-grid"
POINT_TEMPLATE = "sweep-point"


def sweep_parameters() -> list[PipelineParameter]:
    """sublimate-train's parameters (the fixed settings of every point; ``run-id`` names the
    points' run folders), then ``metric-goal``, ``grid`` and ``target`` for the comparison."""
    run_id = ("Prefix of the points' run folders (<run-id>-p00, -p01, ...) and name of the "
              "sweep's report folder (default: the workflow's name). Submit again with a "
              "previous sweep's run-id to resume its points from their last checkpoints.")
    return [
        *(replace(p, description=run_id) if p.name == sweep_grid.PER_POINT else p
          for p in pipeline_parameters()),
        PipelineParameter.from_setting(declared.BY_NAME["metric-goal"]),
        PipelineParameter(
            "grid", DEFAULT_GRID,
            "The points to train: a JSON object of axis -> list of values, each axis a train "
            "or evaluate setting, e.g. {\"algorithm\": [\"sync\", \"bmuf\"], "
            "\"global-batch-size\": [64, 512]}; every combination is one point (at most "
            f"{sweep_grid.MAX_POINTS}), the other settings as given here."),
        PipelineParameter(
            "target", "0",
            "The value of `metric` for the report's time to target: each point's seconds "
            "until it first reached it (0: 95% of the best point's final metric).",
            type="number"),
    ]


def sweep_pipeline(
    name: str = "sublimate-sweep",
    image: str = DEFAULT_IMAGE,
    claim_name: str = DEFAULT_CLAIM,
    train_template: str = TRAIN_TEMPLATE,
    parallelism: int = PARALLELISM,
) -> WorkflowTemplate:
    """Build the ``sublimate-sweep`` WorkflowTemplate, calling ``train_template``'s steps."""
    from hera.workflows import DAG, Parameter, Task, WorkflowTemplate
    from hera.workflows.models import ContinueOn, TemplateRef, WorkflowMetadata

    from sublimate.components.steps import compare

    parameters = sweep_parameters()
    parameter = {p.name: p.reference() for p in parameters}
    step_options: dict[str, object] = {"image": image, "claim_name": claim_name}
    options = workflow_options(
        parameters, "sweep",
        "Stage a dataset once, train and evaluate every point of a grid of settings "
        f"(at most {parallelism} at a time), and compare them in one report with plots; the "
        "best point is the output.")
    # The points differ in the axes, so the workflow is labelled with its dataset only (an
    # `algorithm` label from the fixed parameter would be wrong whenever it is an axis).
    options["workflow_metadata"] = WorkflowMetadata(
        labels={"sublimate.dev/pipeline": "sweep"},
        labels_from={"sublimate.dev/dataset": {"expression": DATASET_LABEL}})
    point_settings = [s.name for s in sweep_grid.point_settings()]

    def step(template: str) -> TemplateRef:
        return TemplateRef(name=train_template, template=template)

    with WorkflowTemplate(name=name, entrypoint="sweep-pipeline", **options) as workflow:
        grid_step = sweep_grid.template(GRID_STEP, **step_options, retries=2)
        compare_step = compare.template("compare", **step_options, retries=2)

        # One point: sublimate-train's train then evaluate, with the point's settings.
        point_input = {name: f"{{{{inputs.parameters.{name}}}}}"
                       for name in ("data-dir", *point_settings)}
        with DAG(name=POINT_TEMPLATE,
                 inputs=[Parameter(name=name) for name in point_input]) as point:
            trained = Task(name="train", template_ref=step("train"), arguments={
                **{name: point_input[name] for name in point_settings
                   if declared.BY_NAME[name].step == "train"},
                "data-dir": point_input["data-dir"],
                "workflow-name": "{{workflow.name}}",
            })
            evaluated = Task(name="evaluate", template_ref=step("evaluate"), arguments={
                **{name: point_input[name] for name in point_settings
                   if declared.BY_NAME[name].step == "evaluate"},
                "data-dir": point_input["data-dir"],
                "model-dir": "{{tasks.train.outputs.parameters.run-dir}}",
            })
            trained >> evaluated

        # Template-level parallelism counts the DAG's running children: each point is one.
        with DAG(name="sweep-pipeline", parallelism=parallelism, outputs=global_outputs(
                {"best-point": ("compare", "best-point"), "report": ("compare", "report")})):
            staged = Task(name="stage-data", template_ref=step("stage-data"),
                          arguments={"dataset": parameter["dataset"]})
            expanded = grid_step(arguments={
                "grid": parameter["grid"],
                "workflow-name": "{{workflow.name}}",
                **{name: parameter[name] for name in point_settings},
            })
            swept = Task(
                name="sweep", template=point,
                with_param=_output(GRID_STEP, "runs"),
                # A failed point is the comparison's to report, not the sweep's end.
                continue_on=ContinueOn(failed=True),
                arguments={"data-dir": _output("stage-data", "dataset-dir"),
                           **{name: f"{{{{item.{name}}}}}" for name in point_settings}})
            compared = compare_step(arguments={
                "points": _output(GRID_STEP, "points"),
                "sweep-dir": _output(GRID_STEP, "sweep-dir"),
                "metric": parameter["metric"],
                "metric-goal": parameter["metric-goal"],
                "target": parameter["target"],
            })
            [staged, expanded] >> swept >> compared
    return workflow


def _output(task: str, name: str) -> str:
    return f"{{{{tasks.{task}.outputs.parameters.{name}}}}}"
