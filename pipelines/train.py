"""The ``sublimate-train`` pipeline: stage-data -> train -> evaluate on one shared volume."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sublimate.components import evaluate, stage_data, train
from sublimate.components.paradigm import PARADIGMS
from sublimate.components.runtime import DEFAULT_CLAIM, DEFAULT_IMAGE, RUNS_PATH
from sublimate.pipelines.parameters import TYPES_ANNOTATION, PipelineParameter, type_annotation

if TYPE_CHECKING:
    from hera.workflows import WorkflowTemplate

PARAMETERS = [
    PipelineParameter("dataset", "digits",
                      "Built-in dataset (digits) or the path/URL (file://, s3://) of a dataset "
                      "folder in sublimate's layout; staged onto the shared volume."),
    PipelineParameter("algorithm", "sync", "Training paradigm. sync: synchronous SGD with DDP "
                      "all-reduce.", enum=tuple(sorted(PARADIGMS))),
    PipelineParameter("nodes", 2, "Training nodes (one torchrun agent each).",
                      type="integer", minimum=1, maximum=512),
    PipelineParameter("procs-per-node", 1, "Worker processes per node (one per GPU on GPU nodes).",
                      type="integer", minimum=1, maximum=64),
    PipelineParameter("epochs", 20, "Passes over the training set.",
                      type="integer", minimum=1, maximum=100000),
    PipelineParameter("global-batch-size", 64, "Examples per optimizer step across all workers; "
                      "must divide by nodes x procs-per-node.", type="integer", minimum=1),
    PipelineParameter("learning-rate", 0.1, "SGD learning rate.", type="number", minimum=0),
    PipelineParameter("momentum", 0.9, "SGD momentum.", type="number", minimum=0, maximum=1),
    PipelineParameter("weight-decay", 0.0001, "L2 weight decay.", type="number", minimum=0),
    PipelineParameter("seed", 0, "Seed for model initialisation and data order.",
                      type="integer", minimum=0),
    PipelineParameter("checkpoint-every", 100, "Steps between checkpoints on the shared volume "
                      "(0: only at the end).", type="integer", minimum=0),
    PipelineParameter("max-restarts", 0, "Times torchrun restarts the workers after one fails; "
                      "they resume from the last checkpoint.", type="integer", minimum=0,
                      maximum=100),
    PipelineParameter("backend", "auto", "torch.distributed backend. auto: nccl with GPUs, "
                      "gloo otherwise.", enum=("auto", "gloo", "nccl")),
    PipelineParameter("scheduler", "auto", "TorchX scheduler for the training job. auto: "
                      "kubernetes inside a cluster, local_cwd on one machine.",
                      enum=("auto", "local_cwd", "kubernetes")),
    PipelineParameter("cpu-per-node", 1, "CPUs requested per training node.",
                      type="integer", minimum=1),
    PipelineParameter("gpus-per-node", 0, "GPUs requested per training node.",
                      type="integer", minimum=0),
    PipelineParameter("memory-mb-per-node", 2048, "Memory requested per training node, in MB.",
                      type="integer", minimum=128),
    PipelineParameter("queue", "default", "Volcano queue for the training job (kubernetes)."),
]


def train_pipeline(
    name: str = "sublimate-train",
    image: str = DEFAULT_IMAGE,
    claim_name: str = DEFAULT_CLAIM,
) -> WorkflowTemplate:
    """Build the ``sublimate-train`` WorkflowTemplate."""
    from hera.workflows import DAG, Parameter, WorkflowTemplate
    from hera.workflows.models import ValueFrom

    parameter = {p.name: p.reference() for p in PARAMETERS}
    step_options = {"image": image, "claim_name": claim_name}
    with WorkflowTemplate(
        name=name,
        entrypoint="train-pipeline",
        arguments=[p.to_hera() for p in PARAMETERS],
        labels={"sublimate.dev/pipeline": "train"},
        annotations={TYPES_ANNOTATION: type_annotation(PARAMETERS),
                     "workflows.argoproj.io/description":
                         "Stage a dataset, train it on several nodes with TorchX, evaluate."},
    ) as workflow:
        stage_step = stage_data.template(**step_options)
        train_step = train.template(**step_options)
        evaluate_step = evaluate.template(**step_options)
        run_dir = f"{RUNS_PATH}/{{{{workflow.name}}}}"
        with DAG(name="train-pipeline", outputs=[Parameter(
                name="accuracy",
                value_from=ValueFrom(parameter="{{tasks.evaluate.outputs.parameters.accuracy}}"))]):
            staged = stage_step(arguments={"dataset": parameter["dataset"]})
            trained = train_step(arguments={
                **{name: parameter[name] for name in train.TEMPLATE_INPUTS if name in parameter},
                "data-dir": staged.get_parameter("dataset-dir"),
                "run-dir": run_dir,
            })
            evaluated = evaluate_step(arguments={
                "data-dir": staged.get_parameter("dataset-dir"),
                "model-dir": run_dir,
            })
            staged >> trained >> evaluated
    return workflow
