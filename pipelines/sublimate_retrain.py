"""The ``sublimate-retrain`` pipeline: stage-data -> train -> evaluate -> gate -> register-model,
with a notification on exit.

A WorkflowTemplate of its own rather than steps behind a flag in ``sublimate-train``: the
interactive job stays three steps with no registry to set up, and the scheduled one always gates and
publishes (a retraining that a forgotten parameter could let skip the gate would not be one to
trust). Both are built from the very same step templates and task wiring
(:func:`sublimate.pipelines.sublimate_train.training_tasks`), so a training setting added once
reaches both.

The gate scores the registry's champion on this run's test split with the evaluate step's own
code, and promotes the challenger only when it wins by more than ``promote-margin``; the
register-model step publishes every challenger as a version with its lineage and moves the
champion pointer only on the gate's word. The exit handler (``notify``) posts the outcome to a
webhook whose URL only a Secret holds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sublimate.components.base.runtime import DEFAULT_CLAIM, DEFAULT_IMAGE
from sublimate.components.steps import gate, notify, register_model
from sublimate.pipelines.sublimate_train import (
    STEPS,
    global_outputs,
    pipeline_parameters,
    training_outputs,
    training_tasks,
    training_templates,
    workflow_options,
)

if TYPE_CHECKING:
    from hera.workflows import WorkflowTemplate

# sublimate-train's steps, and the gate's settings (registry, promote-margin, metric-goal).
RETRAIN_STEPS = (*STEPS, gate.STEP)


def retrain_pipeline(
    name: str = "sublimate-retrain",
    image: str = DEFAULT_IMAGE,
    claim_name: str = DEFAULT_CLAIM,
) -> WorkflowTemplate:
    """Build the ``sublimate-retrain`` WorkflowTemplate."""
    from hera.workflows import DAG, WorkflowTemplate

    parameters = pipeline_parameters(RETRAIN_STEPS)
    parameter = {p.name: p.reference() for p in parameters}
    step_options: dict[str, object] = {"image": image, "claim_name": claim_name}
    with WorkflowTemplate(
        name=name,
        entrypoint="retrain-pipeline",
        on_exit=notify.STEP,
        **workflow_options(parameters, "retrain",
                           "Retrain on fresh data, evaluate, and replace the registry's "
                           "champion only with a better model; every challenger is published "
                           "with its lineage, and the outcome is posted to a webhook."),
    ) as workflow:
        steps = training_templates(step_options)
        # Cheap, idempotent steps: a pod lost to the cluster is simply run again. (A second
        # publish after a lost pod is a second version with the same lineage, never a wrong
        # champion: the gate's decision is an input, not recomputed.)
        gate_step = gate.template(**step_options, retries=2)
        register_step = register_model.template(**step_options, retries=2)
        notify.template(**step_options, retries=1)
        with DAG(name="retrain-pipeline", outputs=[
            *training_outputs(),
            *global_outputs({"promoted": ("gate", "promote"), "reason": ("gate", "reason"),
                             "version": ("register-model", "version"),
                             "champion": ("register-model", "champion")}),
        ]):
            staged, trained, evaluated = training_tasks(parameter, *steps)
            decided = gate_step(arguments={
                **{s.name: parameter[s.name] for s in gate.gate_settings()},
                "data-dir": staged.get_parameter("dataset-dir"),
                "model-dir": trained.get_parameter("run-dir"),
                "challenger-metric": evaluated.get_parameter("metric"),
                "workflow-uid": "{{workflow.uid}}",
            })
            published = register_step(arguments={
                **{s.name: parameter[s.name] for s in register_model.template_settings()},
                "dataset": parameter["dataset"],
                "data-dir": staged.get_parameter("dataset-dir"),
                "model-dir": trained.get_parameter("run-dir"),
                "promote": decided.get_parameter("promote"),
                "reason": decided.get_parameter("reason"),
                "gate-champion": decided.get_parameter("champion"),
                "workflow-name": "{{workflow.name}}",
                "workflow-uid": "{{workflow.uid}}",
                "workflow-created": "{{workflow.creationTimestamp}}",
            })
            staged >> trained >> evaluated >> decided >> published
    return workflow
