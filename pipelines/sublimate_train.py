"""The ``sublimate-train`` pipeline: stage-data -> train -> evaluate on one shared volume."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sublimate.components.base import settings as declared
from sublimate.components.base.runtime import DEFAULT_CLAIM, DEFAULT_IMAGE
from sublimate.components.steps import evaluate, stage_data, train
from sublimate.pipelines.typed_parameters import (
    TYPES_ANNOTATION,
    PipelineParameter,
    type_annotation,
)

if TYPE_CHECKING:
    from hera.workflows import CronWorkflow, WorkflowTemplate

DATASET_LABEL = ("sprig.trunc(63, sprig.trimAll(\"-\", sprig.regexReplaceAll("
                 "\"[^A-Za-z0-9_.-]+\", workflow.parameters.dataset, \"-\")))")

# The steps whose settings sublimate-train exposes; sublimate-retrain adds its gate's.
STEPS = ("train", "evaluate")


def pipeline_parameters(steps: tuple[str, ...] = STEPS) -> list[PipelineParameter]:
    """The stage-data step's one input, then every setting of these steps from its
    declaration (:mod:`sublimate.components.base.settings`)."""
    return [
        PipelineParameter("dataset", "digits",
                          "Built-in dataset (digits; mnist1d: 50,000 examples), the path/URL "
                          "(file://, s3://, gs://) of a dataset in sublimate's layout, or "
                          "py:module:function; staged onto the shared volume."),
        *(PipelineParameter.from_setting(setting) for setting in declared.SETTINGS
          if setting.in_pipeline and setting.step in steps),
    ]


PARAMETERS = pipeline_parameters()


def train_pipeline(
    name: str = "sublimate-train",
    image: str = DEFAULT_IMAGE,
    claim_name: str = DEFAULT_CLAIM,
) -> WorkflowTemplate:
    """Build the ``sublimate-train`` WorkflowTemplate."""
    from hera.workflows import DAG, WorkflowTemplate

    parameters = pipeline_parameters()
    parameter = {p.name: p.reference() for p in parameters}
    step_options: dict[str, object] = {"image": image, "claim_name": claim_name}
    with WorkflowTemplate(
        name=name,
        entrypoint="train-pipeline",
        **workflow_options(parameters, "train",
                           "Stage a dataset, train it on several nodes with TorchX, evaluate."),
    ) as workflow:
        steps = training_templates(step_options)
        # Global names make them the workflow's own outputs (status.outputs, `argo get`), and
        # the local runner links `results` from the run folder.
        with DAG(name="train-pipeline", outputs=training_outputs()):
            staged, trained, evaluated = training_tasks(parameter, *steps)
            staged >> trained >> evaluated
    return workflow


def training_templates(step_options: dict[str, object]) -> tuple[Any, Any, Any]:
    """The stage-data, train and evaluate templates (inside a WorkflowTemplate's context)."""
    return (stage_data.template(**step_options, retries=2),
            train.template(**step_options, retries=1),
            evaluate.template(**step_options, retries=2))


def training_tasks(parameter: dict[str, str], stage_step: Any, train_step: Any,
                   evaluate_step: Any) -> tuple[Any, Any, Any]:
    """The stage-data, train and evaluate tasks (inside a DAG's context), each taking its
    settings from the workflow parameters of the same names and the results of the one before;
    the caller orders them."""
    staged = stage_step(arguments={"dataset": parameter["dataset"]})
    trained = train_step(arguments={
        **{name: parameter[name] for name in train.template_inputs() if name in parameter},
        "data-dir": staged.get_parameter("dataset-dir"),
        "workflow-name": "{{workflow.name}}",
    })
    evaluated = evaluate_step(arguments={
        **{s.name: parameter[s.name] for s in declared.settings(step="evaluate")},
        "data-dir": staged.get_parameter("dataset-dir"),
        "model-dir": trained.get_parameter("run-dir"),
    })
    return staged, trained, evaluated


def global_outputs(outputs: dict[str, tuple[str, str]]) -> list[Any]:
    """A DAG's outputs that are also the workflow's (``global_name``): output name -> (task,
    the task's output parameter)."""
    from hera.workflows import Parameter
    from hera.workflows.models import ValueFrom

    return [Parameter(name=name, global_name=name, value_from=ValueFrom(
                parameter=f"{{{{tasks.{task}.outputs.parameters.{output}}}}}"))
            for name, (task, output) in outputs.items()]


def training_outputs() -> list[Any]:
    """The workflow outputs of training: ``accuracy``, ``metric`` (the one the ``metric``
    parameter chose: accuracy, loss, mAP, ...) and ``results``."""
    return global_outputs({"accuracy": ("evaluate", "accuracy"), "metric": ("evaluate", "metric"),
                           "results": ("train", "run-dir")})


def workflow_options(parameters: list[PipelineParameter], pipeline: str,
                     description: str) -> dict[str, object]:
    """What every sublimate WorkflowTemplate shares: its parameters with their types, the
    service account, security context, clean-up and labels; ``pipeline`` is its
    ``sublimate.dev/pipeline`` label (which picks its parameter checks in ``render``)."""
    from hera.workflows.models import PodGC, PodSecurityContext, TTLStrategy, WorkflowMetadata

    from sublimate.pipelines.cluster import SERVICE_ACCOUNT

    return {
        "arguments": [p.to_hera() for p in parameters],
        "labels": {"sublimate.dev/pipeline": pipeline},
        "service_account_name": SERVICE_ACCOUNT,
        # The runtime image's unprivileged user; fs_group lets it write the shared claim.
        "security_context": PodSecurityContext(run_as_non_root=True, run_as_user=10001,
                                               run_as_group=10001, fs_group=10001),
        # Keep a failed run's pods for debugging; clean up after success, and drop finished
        # workflows after a week.
        "pod_gc": PodGC(strategy="OnPodSuccess"),
        "ttl_strategy": TTLStrategy(seconds_after_success=7 * 86400,
                                    seconds_after_failure=14 * 86400),
        "workflow_metadata": WorkflowMetadata(
            labels={"sublimate.dev/pipeline": pipeline},
            labels_from={
                "sublimate.dev/algorithm": {"expression": "workflow.parameters.algorithm"},
                # Label values allow [A-Za-z0-9_.-] only, so the dataset URL is folded to that.
                "sublimate.dev/dataset": {"expression": DATASET_LABEL},
            },
        ),
        "annotations": {TYPES_ANNOTATION: type_annotation(parameters),
                        "workflows.argoproj.io/description": description},
    }


def nightly_retraining(
    name: str = "sublimate-train-nightly",
    template: str = "sublimate-retrain",
    schedule: str = "0 2 * * *",
    timezone: str = "UTC",
) -> CronWorkflow:
    """A CronWorkflow that submits ``template`` with its defaults every night: the retraining
    pipeline (:mod:`sublimate.pipelines.sublimate_retrain`), which only replaces the champion with a
    better model, so an unattended run can never make the served model worse."""
    from hera.workflows import CronWorkflow
    from hera.workflows.models import WorkflowTemplateRef

    return CronWorkflow(
        name=name,
        schedules=[schedule],
        timezone=timezone,
        # A retraining run that is still going when the next one is due keeps the volume.
        concurrency_policy="Forbid",
        starting_deadline_seconds=3600,
        successful_jobs_history_limit=3,
        failed_jobs_history_limit=5,
        labels={"sublimate.dev/pipeline": "retrain"},
        workflow_template_ref=WorkflowTemplateRef(name=template),
    )
