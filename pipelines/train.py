"""The ``sublimate-train`` pipeline: stage-data -> train -> evaluate on one shared volume."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sublimate.components import evaluate, stage_data, train
from sublimate.components.runtime import DEFAULT_CLAIM, DEFAULT_IMAGE
from sublimate.pipelines.parameters import TYPES_ANNOTATION, PipelineParameter, type_annotation

if TYPE_CHECKING:
    from hera.workflows import CronWorkflow, WorkflowTemplate

DATASET_LABEL = ("sprig.trunc(63, sprig.trimAll(\"-\", sprig.regexReplaceAll("
                 "\"[^A-Za-z0-9_.-]+\", workflow.parameters.dataset, \"-\")))")
AUTO_OR_NUMBER = r"^(auto|[0-9]*\.?[0-9]+([eE][-+]?[0-9]+)?)$"

PARAMETERS = [
    PipelineParameter("dataset", "digits",
                      "Built-in dataset (digits), the path/URL (file://, s3://, gs://) of a "
                      "dataset in sublimate's layout, or py:module:function; staged onto the "
                      "shared volume."),
    PipelineParameter("algorithm", "sync", "Training paradigm. sync: synchronous SGD (DDP "
                      "all-reduce every step); async: asynchronous SGD with a parameter server; "
                      "bmuf: block-momentum SGD (Chen & Huo 2016); easgd: elastic-averaging SGD "
                      "(Zhang et al. 2015).", enum=("sync", "async", "bmuf", "easgd")),
    PipelineParameter("model", "mlp", "Model: the built-in mlp, or module:function(num_features, "
                      "num_classes) returning a torch.nn.Module (importable in the image), e.g. "
                      "sublimate.components.example_models:small_cnn.",
                      pattern=r"^(mlp|[A-Za-z_][\w.]*:[A-Za-z_]\w*)$"),
    PipelineParameter("run-id", "", "Name of the run's folder on the shared volume "
                      "(default: the workflow's name). Submit again with a previous run's id to "
                      "resume it from its last checkpoint.",
                      pattern=r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?)?$"),
    PipelineParameter("nodes", 2, "Training nodes (one torchrun agent each).",
                      type="integer", minimum=1, maximum=512),
    PipelineParameter("procs-per-node", 1, "Worker processes per node (one per GPU on GPU nodes).",
                      type="integer", minimum=1, maximum=64),
    PipelineParameter("epochs", 20, "Passes over the training set.",
                      type="integer", minimum=1, maximum=100000),
    PipelineParameter("global-batch-size", 64, "Examples per optimizer step across all workers; "
                      "must divide by nodes x procs-per-node.", type="integer", minimum=1),
    PipelineParameter("learning-rate", 0.1, "SGD learning rate at reference-batch-size (scaled "
                      "for other batch sizes, see lr-scaling).", type="number", minimum=0),
    PipelineParameter("momentum", 0.9, "SGD momentum of each worker's optimizer (async: the "
                      "server's).", type="number", minimum=0, maximum=1),
    PipelineParameter("weight-decay", 0.0001, "L2 weight decay of the optimizer.",
                      type="number", minimum=0),
    PipelineParameter("seed", 0, "Seed for model initialisation and data order.",
                      type="integer", minimum=0),
    PipelineParameter("checkpoint-every", 100, "Steps between checkpoints on the shared volume "
                      "(0: only at the end).", type="integer", minimum=0),
    PipelineParameter("max-restarts", 0, "Times torchrun restarts the workers after one fails; "
                      "they resume from the last checkpoint.", type="integer", minimum=0,
                      maximum=100),
    PipelineParameter("lr-scaling", "linear", "Scale the learning rate with "
                      "global-batch-size / reference-batch-size (Goyal et al. 2017); async scales "
                      "with each trainer's batch.", enum=("linear", "none")),
    PipelineParameter("reference-batch-size", 64, "Batch size at which learning-rate applies "
                      "unscaled.", type="integer", minimum=1),
    PipelineParameter("warmup-epochs", 0, "Epochs of gradual warmup from learning-rate to the "
                      "scaled rate (Goyal et al. use 5 for large batches).", type="number",
                      minimum=0),
    PipelineParameter("accumulation-steps", 1, "Micro-batches accumulated per optimizer step "
                      "(sync, bmuf, easgd).", type="integer", minimum=1),
    PipelineParameter("sync-period", 8, "bmuf: steps per block; easgd: steps between elastic "
                      "updates.", type="integer", minimum=1),
    PipelineParameter("block-momentum", "auto", "bmuf: block momentum eta (auto: 1 - 1/N for N "
                      "workers).", pattern=AUTO_OR_NUMBER),
    PipelineParameter("block-lr", 1.0, "bmuf: block learning rate zeta.", type="number",
                      minimum=0),
    PipelineParameter("nesterov", "true", "bmuf: Nesterov-style look-ahead between blocks.",
                      enum=("true", "false")),
    PipelineParameter("moving-rate", "auto", "easgd: moving rate alpha toward the center "
                      "(auto: 0.9 / N).", pattern=AUTO_OR_NUMBER),
    PipelineParameter("staleness-bound", 0, "async: most pushes a trainer may run ahead of the "
                      "slowest (0: unbounded, pure Downpour).", type="integer", minimum=0),
    PipelineParameter("eval-every-epoch", "true", "Evaluate test accuracy after every epoch "
                      "(rank 0), for the report's accuracy curve.", enum=("true", "false")),
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
    PipelineParameter("image", DEFAULT_IMAGE, "Container image of the training workers "
                      "(kubernetes; the steps' own image is set at install)."),
]


def train_pipeline(
    name: str = "sublimate-train",
    image: str = DEFAULT_IMAGE,
    claim_name: str = DEFAULT_CLAIM,
) -> WorkflowTemplate:
    """Build the ``sublimate-train`` WorkflowTemplate."""
    from hera.workflows import DAG, Parameter, WorkflowTemplate
    from hera.workflows.models import (
        PodGC,
        PodSecurityContext,
        TTLStrategy,
        ValueFrom,
        WorkflowMetadata,
    )

    from sublimate.pipelines.cluster import SERVICE_ACCOUNT

    parameter = {p.name: p.reference() for p in PARAMETERS}
    step_options: dict[str, object] = {"image": image, "claim_name": claim_name}
    with WorkflowTemplate(
        name=name,
        entrypoint="train-pipeline",
        arguments=[p.to_hera() for p in PARAMETERS],
        labels={"sublimate.dev/pipeline": "train"},
        service_account_name=SERVICE_ACCOUNT,
        # The runtime image's unprivileged user; fs_group lets it write the shared claim.
        security_context=PodSecurityContext(run_as_non_root=True, run_as_user=10001,
                                            run_as_group=10001, fs_group=10001),
        # Keep a failed run's pods for debugging; clean up after success, and drop finished
        # workflows after a week.
        pod_gc=PodGC(strategy="OnPodSuccess"),
        ttl_strategy=TTLStrategy(seconds_after_success=7 * 86400,
                                 seconds_after_failure=14 * 86400),
        workflow_metadata=WorkflowMetadata(
            labels={"sublimate.dev/pipeline": "train"},
            labels_from={
                "sublimate.dev/algorithm": {"expression": "workflow.parameters.algorithm"},
                # Label values allow [A-Za-z0-9_.-] only, so the dataset URL is folded to that.
                "sublimate.dev/dataset": {"expression": DATASET_LABEL},
            },
        ),
        annotations={TYPES_ANNOTATION: type_annotation(PARAMETERS),
                     "workflows.argoproj.io/description":
                         "Stage a dataset, train it on several nodes with TorchX, evaluate."},
    ) as workflow:
        stage_step = stage_data.template(**step_options, retries=2)
        train_step = train.template(**step_options, retries=1)
        evaluate_step = evaluate.template(**step_options, retries=2)
        # Global names make them the workflow's own outputs (status.outputs, `argo get`), and
        # the local runner links `results` from the run folder.
        with DAG(name="train-pipeline", outputs=[
            Parameter(name="accuracy", global_name="accuracy", value_from=ValueFrom(
                parameter="{{tasks.evaluate.outputs.parameters.accuracy}}")),
            Parameter(name="results", global_name="results", value_from=ValueFrom(
                parameter="{{tasks.train.outputs.parameters.run-dir}}")),
        ]):
            staged = stage_step(arguments={"dataset": parameter["dataset"]})
            trained = train_step(arguments={
                **{name: parameter[name] for name in train.TEMPLATE_INPUTS if name in parameter},
                "data-dir": staged.get_parameter("dataset-dir"),
                "workflow-name": "{{workflow.name}}",
            })
            evaluated = evaluate_step(arguments={
                "data-dir": staged.get_parameter("dataset-dir"),
                "model-dir": trained.get_parameter("run-dir"),
            })
            staged >> trained >> evaluated
    return workflow


def nightly_retraining(
    name: str = "sublimate-train-nightly",
    template: str = "sublimate-train",
    schedule: str = "0 2 * * *",
    timezone: str = "UTC",
) -> CronWorkflow:
    """A CronWorkflow that submits ``template`` with its defaults every night."""
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
        labels={"sublimate.dev/pipeline": "train"},
        workflow_template_ref=WorkflowTemplateRef(name=template),
    )
