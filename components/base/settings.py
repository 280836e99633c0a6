"""Every setting of the train step, declared once.

Each :class:`Setting` is the single source of a training knob: its name (the pipeline parameter, the
template input and the ``--flag`` of the launcher and the workers), type, default, bounds or
choices, description (the Argo UI's tooltip and the ``--help`` text), which paradigms it applies to,
and who reads it (the launcher only, or passed on to every worker). From the declaration come the
pipeline's parameters and their types annotation (:mod:`sublimate.pipelines.sublimate_train`), the
template's inputs and the launcher's flags (:mod:`sublimate.components.steps.train`), the workers'
arguments (:mod:`sublimate.components.processes.worker`,
:mod:`sublimate.components.processes.async_sgd`), their typed form
(:class:`~sublimate.components.base.train_settings.TrainSettings`) and each paradigm's typed
``Config`` (through :func:`checked_values`). Rules that tie settings together live in
:func:`check` and run before any step starts (``sublimate run``/``submit``) and again inside
the step, with the same code and the same one-line message.

Adding a setting is one entry in :data:`SETTINGS` and its typed field in ``TrainSettings`` (a
test holds the two lists to each other), plus the code that uses it.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from sublimate.components.base.mlflow_connection import URI_PATTERN as TRACKING_URI_PATTERN
from sublimate.components.base.runtime import DEFAULT_IMAGE, SHARED_VOLUME_PATH

Kind = Literal["string", "integer", "number", "boolean"]
# The one list of the training paradigms: name -> "module:Class" of its implementation in
# ``sublimate.components.paradigms`` (kept as text here, so that settings import no torch). The
# ``algorithm`` setting's choices and the paradigms' registry (``paradigms.PARADIGMS``) both come
# from it; a new paradigm is one entry here and its module there.
PARADIGMS: dict[str, str] = {
    "sync": "sync_sgd:SyncSGD",
    "async": "async_sgd:AsyncSGD",
    "bmuf": "bmuf:BlockMomentumSGD",
    "easgd": "easgd:ElasticAveragingSGD",
    "diloco": "diloco:DiLoCo",
}
PARADIGM_NAMES = tuple(PARADIGMS)
AUTO = "auto"
# torchrun's rendezvous on an etcd server (v2 API): launch/etcd_server.py
ETCD_V2 = "etcd-v2"
RUN_ID_PATTERN = r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?)?$"
# A user's code: a module, module:function, or a script path (empty: sublimate's own).
ENTRYPOINT_PATTERN = r"^([A-Za-z_][\w.]*(:[A-Za-z_]\w*)?|[\w./-]+\.py)?$"


class SettingError(ValueError):
    """A setting's value is refused; the message is one line that names the setting."""


class NodeRange(int):
    """A node count: the int is the most nodes; ``minimum`` is fewer for an elastic job
    (``nodes=2:4``: start with up to 4, go on while at least 2 remain). ``ranged``: given as
    ``MIN:MAX`` (``4:4`` too: under per-step recovery, a step then needs all four)."""

    minimum: int
    ranged: bool

    def __new__(cls, maximum: int, minimum: int | None = None) -> NodeRange:
        value = super().__new__(cls, maximum)
        value.minimum = maximum if minimum is None else minimum
        value.ranged = minimum is not None
        return value

    @property
    def elastic(self) -> bool:
        return self.minimum < int(self)

    def __str__(self) -> str:
        return f"{self.minimum}:{int(self)}" if self.ranged else str(int(self))

    __repr__ = __str__


@dataclass(frozen=True)
class Setting:
    name: str
    default: str | int | float | bool
    description: str
    kind: Kind = "string"
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    maximum: float | None = None
    pattern: str | None = None  # a regular expression the whole text must match
    auto: bool = False  # "auto" is accepted and means None (the paradigm's own default)
    paradigms: frozenset[str] = field(default_factory=lambda: frozenset(PARADIGM_NAMES))
    # "worker": passed on to every training process; "launcher": read by the train step itself.
    reader: Literal["worker", "launcher"] = "worker"
    in_pipeline: bool = True  # False: a step flag only (no pipeline parameter)
    # the step whose input it is ("gate": the retraining pipeline's gate and publish steps)
    step: Literal["train", "evaluate", "gate"] = "train"
    elastic: bool = False  # an integer that may also be a range MIN:MAX (a NodeRange)

    @property
    def attribute(self) -> str:
        return self.name.replace("-", "_")

    @property
    def flag(self) -> str:
        return f"--{self.name}"

    def default_text(self) -> str:
        return self.text(self.default)

    @property
    def default_value(self) -> Any:
        return self.parse(self.default_text())

    def text(self, value: Any) -> str:
        """A typed value as the text of a flag or parameter (the inverse of :meth:`parse`)."""
        if value is None and self.auto:
            return AUTO
        if isinstance(value, bool):
            return "true" if value else "false"
        return str(value)

    def parse(self, text: str | int | float | bool) -> Any:
        """The typed value of ``text``; raises :class:`SettingError` naming the setting."""
        text = self.text(text).strip()
        if self.auto and text == AUTO:
            return None
        if self.elastic:
            return self._parse_range(text)
        value: Any
        try:
            if self.kind == "integer":
                value = int(text)
            elif self.kind == "number":
                value = float(text)
            elif self.kind == "boolean":
                lowered = text.lower()
                if lowered not in ("true", "false"):
                    raise ValueError
                value = lowered == "true"
            else:
                value = text
        except ValueError:
            what = {"integer": "an integer", "number": "a number",
                    "boolean": "true or false", "string": "text"}[self.kind]
            extra = " or auto" if self.auto else ""
            raise SettingError(f"{self.name}: '{text}' is not {what}{extra}") from None
        if self.choices and text not in self.choices:
            raise SettingError(f"{self.name}: '{text}' is not one of {', '.join(self.choices)}")
        if self.minimum is not None and value < self.minimum:
            raise SettingError(f"{self.name}: {text} is below the minimum {_number(self.minimum)}")
        if self.maximum is not None and value > self.maximum:
            raise SettingError(f"{self.name}: {text} is above the maximum {_number(self.maximum)}")
        if self.pattern and re.search(self.pattern, text) is None:  # as the runner checks it
            raise SettingError(f"{self.name}: '{text}' does not match {self.pattern}")
        return value

    def _parse_range(self, text: str) -> NodeRange:
        low, _, high = text.partition(":")
        try:
            minimum, maximum = int(low), int(high or low)
        except ValueError:
            raise SettingError(f"{self.name}: '{text}' is not an integer or a range MIN:MAX "
                               "(e.g. 2:4)") from None
        for value in (minimum, maximum):
            if self.minimum is not None and value < self.minimum:
                raise SettingError(f"{self.name}: {text} is below the minimum "
                                   f"{_number(self.minimum)}")
            if self.maximum is not None and value > self.maximum:
                raise SettingError(f"{self.name}: {text} is above the maximum "
                                   f"{_number(self.maximum)}")
        if minimum > maximum:
            raise SettingError(f"{self.name}: {text}: the minimum is above the maximum")
        return NodeRange(maximum, minimum if high else None)

    def argparse_type(self) -> Any:
        def convert(text: str) -> Any:
            try:
                return self.parse(text)
            except SettingError as error:  # argparse prefixes "argument --name:"
                raise argparse.ArgumentTypeError(str(error).split(": ", 1)[1]) from None

        convert.__name__ = self.kind
        return convert

    @property
    def auto_pattern(self) -> str | None:
        """For a number that may also be ``auto``: the regular expression its text matches (a
        pipeline parameter of such a setting is text, checked by this pattern); else None."""
        if self.elastic:
            return r"^[0-9]+(:[0-9]+)?$"
        if not self.auto or self.pattern is not None:
            return None
        number = r"[0-9]+" if self.kind == "integer" else r"[0-9]*\.?[0-9]+([eE][-+]?[0-9]+)?"
        return rf"^(auto|{number})$"


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


_PERIODIC = frozenset({"bmuf", "easgd", "diloco"})
_DILOCO = frozenset({"diloco"})
# diloco's outer-codec choices (components/paradigms/outer_codecs.py's CODEC_NAMES)
OUTER_CODECS = ("none", "bf16", "int8", "topk")
# The paradigms whose workers run one shared step loop under torchrun (processes.worker): all
# but the parameter server, whose processes TorchX starts as an app of their own.
COLLECTIVE_PARADIGMS = tuple(name for name in PARADIGM_NAMES if name != "async")
_COLLECTIVE = frozenset(COLLECTIVE_PARADIGMS)
RESTART, PER_STEP = "restart", "per-step"
RECOVERY_MODES = (RESTART, PER_STEP)
# max-restarts when left at auto: elastic jobs and per-step recovery exist to survive lost nodes,
# so they get a few relaunches (per-step: replacements of each node) without being asked.
DEFAULT_RESTARTS = {"elastic": 3, PER_STEP: 10, "otherwise": 0}
# commit-every: steps per transaction under sync per-step recovery (benchmarks/fault_tolerance.py
# measured what a transaction costs against restart's throughput).
DEFAULT_STEPS_PER_COMMIT = 16
# collective-timeout when left at auto, by recovery mode.
COLLECTIVE_TIMEOUTS = {RESTART: 300.0, PER_STEP: 30.0}

SETTINGS: tuple[Setting, ...] = (
    Setting("algorithm", "sync", "Training paradigm. sync: synchronous SGD (DDP all-reduce every "
            "step); async: asynchronous SGD with a parameter server; bmuf: block-momentum SGD "
            "(Chen & Huo 2016); easgd: elastic-averaging SGD (Zhang et al. 2015); diloco: inner "
            "steps, then an outer Nesterov step on the averaged pseudo-gradient (Douillard et "
            "al. 2023; torchft's, always with per-step recovery).",
            choices=PARADIGM_NAMES, reader="launcher"),
    Setting("entrypoint", "", "Your own training code, run by torchrun on every node instead of "
            "the built-in loop: a module (mypkg.train), module:function, or a script path in "
            "the image (train.py). It gets the contract of docs/own-code.md (dataset, run "
            "folder, settings, TF_CONFIG). Empty: the built-in loop.",
            pattern=ENTRYPOINT_PATTERN, reader="launcher"),
    Setting("entrypoint-args", "", "Arguments for entrypoint, split like a shell command "
            "line.", reader="launcher"),
    Setting("framework", "pytorch", "What entrypoint is written with. tensorflow: the workers "
            "also get TF_CONFIG, for MultiWorkerMirroredStrategy.",
            choices=("pytorch", "tensorflow"), reader="launcher"),
    Setting("model", "mlp", "Model: the built-in mlp, or module:function(num_features, "
            "num_classes) returning a torch.nn.Module (importable in the image), e.g. "
            "sublimate.components.examples.example_models:small_cnn.",
            pattern=r"^(mlp|[A-Za-z_][\w.]*:[A-Za-z_]\w*)$"),
    Setting("run-id", "", "Name of the run's folder on the shared volume (default: the "
            "workflow's name). Submit again with a previous run's id to resume it from its last "
            "checkpoint.", pattern=RUN_ID_PATTERN, reader="launcher"),
    Setting("nodes", 2, "Training nodes (one torchrun agent each); MIN:MAX (e.g. 2:4) for "
            "elastic training: the job goes on from its last checkpoint while at least MIN "
            "nodes remain, and a node that comes back rejoins (sync only).", kind="integer",
            minimum=1, maximum=512, reader="launcher", elastic=True),
    Setting("rendezvous", AUTO, "How the nodes meet (torchrun's rendezvous). static: each node "
            "is told its rank and joins node 0's store once, no polling (it scales to thousands "
            "of nodes, docs/scale.md); c10d: the nodes agree on a shared state, which elastic "
            "nodes (MIN:MAX) and max-restarts need; etcd-v2: the same protocol, its state in an "
            "etcd server (started beside the job on one machine; on a cluster, give "
            "rendezvous-endpoint). auto: static for a fixed number of nodes with max-restarts "
            "0, else c10d.", choices=(AUTO, "static", "c10d", ETCD_V2),
            reader="launcher", paradigms=_COLLECTIVE),
    Setting("rendezvous-endpoint", "", "rendezvous etcd-v2 on a cluster: the etcd server's "
            "HOST:PORT (its v2 API enabled), reachable from every node. On one machine the "
            "launcher starts one.", pattern=r"^([A-Za-z0-9]([-A-Za-z0-9.]*[A-Za-z0-9])?:[0-9]+)?$",
            reader="launcher", paradigms=_COLLECTIVE),
    Setting("rendezvous-timeout", 300, "Seconds the nodes may take to meet (at start and after "
            "a restart) before the job fails.", kind="number", minimum=10, reader="launcher",
            paradigms=_COLLECTIVE),
    Setting("procs-per-node", 1, "Worker processes per node (one per GPU on GPU nodes).",
            kind="integer", minimum=1, maximum=64, reader="launcher"),
    Setting("epochs", 20, "Passes over the training set.", kind="integer", minimum=1,
            maximum=100000),
    Setting("global-batch-size", 64, "Examples per optimizer step across all workers; must "
            "divide by nodes x procs-per-node (x accumulation-steps).", kind="integer",
            minimum=1),
    Setting("learning-rate", 0.1, "SGD learning rate at reference-batch-size (scaled for other "
            "batch sizes, see lr-scaling).", kind="number", minimum=0),
    Setting("momentum", 0.9, "SGD momentum of each worker's optimizer (async: the server's).",
            kind="number", minimum=0, maximum=1),
    Setting("weight-decay", 0.0001, "L2 weight decay of the optimizer.", kind="number",
            minimum=0),
    Setting("hidden", 128, "Width of the built-in mlp's hidden layers.", kind="integer",
            minimum=1, in_pipeline=False),
    Setting("seed", 0, "Seed for model initialisation and data order.", kind="integer",
            minimum=0),
    Setting("checkpoint-every", 100, "Steps between checkpoints on the shared volume (0: only "
            "at the end).", kind="integer", minimum=0),
    Setting("checkpoint-format", "files", "How checkpoints are written. files: every worker "
            "writes its whole state, and training waits for the files. dcp (sync, recovery "
            "restart): torch.distributed.checkpoint writes the model and optimizer sharded, each "
            "replicated tensor once, in the background while training goes on (training waits "
            "only for an in-memory copy, kept between checkpoints); any number of nodes resumes "
            "it.", choices=("files", "dcp"), paradigms=_COLLECTIVE),
    Setting("max-restarts", AUTO, "Times torchrun restarts the workers after one fails, and times "
            "the launcher relaunches a stalled job or one that lost a node (they resume from the "
            "last checkpoint); with recovery per-step, also times each lost node is replaced. "
            f"auto: {DEFAULT_RESTARTS['elastic']} for elastic nodes (MIN:MAX), "
            f"{DEFAULT_RESTARTS[PER_STEP]} with recovery {PER_STEP}, else 0.", kind="integer",
            minimum=0, maximum=100, auto=True, reader="launcher"),
    Setting("recovery", AUTO, "What a lost node costs. per-step: torchft; every node is a "
            "replica group and every few steps (commit-every) are committed by the groups alive "
            "at that moment, so a lost node costs the steps since the last commit while the "
            "others go on, and its replacement copies the weights from a live peer "
            "(docs/fault-tolerance.md). restart: the job stops and every node resumes from the "
            "last checkpoint (max-restarts times), as torchrun, Kubeflow and Ray do. auto: "
            "per-step for the built-in loop of sync on 2 nodes or more (with checkpoint-format "
            "files, data held in memory and a rendezvous other than etcd-v2), where it costs "
            "nothing measurable; restart otherwise (bmuf and easgd, whose rounds as "
            "transactions cost 12 to 15% of their throughput; async, your own entrypoint, one "
            "node). diloco always runs per-step.",
            choices=(AUTO, *RECOVERY_MODES), paradigms=_COLLECTIVE),
    Setting("commit-every", DEFAULT_STEPS_PER_COMMIT, "sync with recovery per-step: steps the "
            "groups commit together, as one transaction (an epoch's end and a checkpoint end "
            "one too). A lost node then costs the steps since the last commit (at most this "
            "many) instead of one, and the quorum and commit, a millisecond of CPU per node, "
            "are paid once per transaction instead of every step (docs/fault-tolerance.md).",
            kind="integer", minimum=1, maximum=1024, paradigms=frozenset({"sync"})),
    Setting("chaos-mtbf", 0, "local_netns: kill a random training node (all its processes at "
            "once) after exponentially distributed intervals of this mean, in seconds, to see "
            "a recovery mode at work; 0: no chaos.", kind="number", minimum=0,
            reader="launcher", paradigms=_COLLECTIVE),
    Setting("chaos-kills", 0, "chaos-mtbf: stop after this many kills (0: until training ends).",
            kind="integer", minimum=0, reader="launcher", paradigms=_COLLECTIVE),
    Setting("chaos-seed", 0, "chaos-mtbf: seed of the kills' times and nodes (the same seed, "
            "the same schedule: to compare recovery modes).", kind="integer", minimum=0,
            reader="launcher", paradigms=_COLLECTIVE),
    Setting("lr-scaling", "linear", "Scale the learning rate with the batch one update "
            "averages / reference-batch-size (Goyal et al. 2017): the global batch (sync, "
            "easgd), a trainer's (async); bmuf also divides by its block gain zeta/(1-eta).",
            choices=("linear", "none")),
    Setting("reference-batch-size", 64, "Batch size at which learning-rate applies unscaled.",
            kind="integer", minimum=1),
    Setting("warmup-epochs", 0, "Epochs of gradual warmup from learning-rate to the scaled rate "
            "(Goyal et al. use 5 for large batches).", kind="number", minimum=0),
    Setting("accumulation-steps", 1, "Micro-batches accumulated per optimizer step (sync, "
            "bmuf, easgd, diloco).", kind="integer", minimum=1, paradigms=_COLLECTIVE),
    Setting("sync-period", 8, "bmuf: steps per block; easgd: steps between elastic updates; "
            "diloco: inner steps H per outer step (of each fragment).",
            kind="integer", minimum=1, paradigms=_PERIODIC),
    Setting("outer-lr", 0.7, "diloco: the outer SGD's learning rate (the paper's 0.7).",
            kind="number", minimum=0, paradigms=_DILOCO),
    Setting("outer-momentum", 0.9, "diloco: the outer SGD's Nesterov momentum (the paper's "
            "0.9; 0: plain outer SGD).", kind="number", minimum=0, maximum=0.999,
            paradigms=_DILOCO),
    Setting("fragments", 1, "diloco: Streaming DiLoCo's fragments (consecutive top-level "
            "modules of the model), synced in turn every sync-period / fragments steps, so "
            "each every sync-period steps (1: plain DiLoCo).", kind="integer", minimum=1,
            paradigms=_DILOCO),
    Setting("fragment-delay", 0, "diloco: Streaming DiLoCo's overlap (torchft's "
            "fragment_sync_delay, the paper's tau): a round's average is sent this many inner "
            "steps before the outer step applies it, and the workers keep computing while it "
            "travels (0: no overlap; below sync-period / fragments).", kind="integer",
            minimum=0, paradigms=_DILOCO),
    Setting("fragment-update-alpha", 0.0, "diloco with fragment-delay: how much of a worker's "
            "own steps taken while its round travelled it keeps after the outer step (torchft's "
            "fragment_update_alpha: 0 takes the new global weights, 1 keeps the local ones; the "
            "paper's 0.5).", kind="number", minimum=0, maximum=1, paradigms=_DILOCO),
    Setting("outer-gradient-dtype", "float32", "diloco: the pseudo-gradients' type on the "
            "wire (bfloat16: half the bytes, the same as outer-codec bf16).",
            choices=("float32", "bfloat16"), paradigms=_DILOCO),
    Setting("outer-codec", "none", "diloco: how the pseudo-gradient is sent (none: float32; "
            "bf16: bfloat16; int8: 8-bit, a scale per 256 values, a quarter of the bytes at 2 "
            "nodes; topk: the outer-codec-topk largest values of each 4096 at 2 bits, with "
            "their positions, as SparseLoCo). int8 and topk keep what they drop and send it "
            "with the next rounds (error feedback), and are all-gathered (docs/paradigms.md).",
            choices=OUTER_CODECS, paradigms=_DILOCO),
    Setting("outer-codec-topk", 0.03, "diloco with outer-codec topk: the fraction of the "
            "pseudo-gradient's values each round sends (above 0, at most 1).", kind="number",
            minimum=0, maximum=1, paradigms=_DILOCO),
    Setting("block-momentum", AUTO, "bmuf: block momentum eta (auto: 1 - 1/N for N workers).",
            kind="number", minimum=0, auto=True, paradigms=frozenset({"bmuf"})),
    Setting("block-lr", 1.0, "bmuf: block learning rate zeta.", kind="number", minimum=0,
            paradigms=frozenset({"bmuf"})),
    Setting("nesterov", True, "bmuf: Nesterov-style look-ahead between blocks.", kind="boolean",
            paradigms=frozenset({"bmuf"})),
    Setting("moving-rate", AUTO, "easgd: moving rate alpha toward the center (auto: 0.9 / N).",
            kind="number", minimum=0, auto=True, paradigms=frozenset({"easgd"})),
    Setting("staleness-bound", 0, "async: most pushes a trainer may run ahead of the slowest "
            "(0: unbounded, pure Downpour).", kind="integer", minimum=0,
            paradigms=frozenset({"async"})),
    Setting("eval-every-epoch", True, "Evaluate test accuracy after every epoch (rank 0), for "
            "the report's accuracy curve.", kind="boolean"),
    Setting("collective-timeout", AUTO, "Seconds a collective may wait for a peer before the "
            "job fails (and restarts, with max-restarts) instead of torch's 30 minutes; with "
            "recovery per-step, before the step is dropped and retried without that peer. "
            f"auto: {COLLECTIVE_TIMEOUTS[RESTART]:g} ({COLLECTIVE_TIMEOUTS[PER_STEP]:g} with "
            "recovery per-step, whose point is to lose little to a peer that died silently).",
            kind="number", minimum=1, auto=True, paradigms=_COLLECTIVE),
    Setting("data-loading", "auto", "memory: every worker holds the training split; stream: "
            "each rank streams its own shards from the volume through a shuffle buffer (data "
            "larger than memory); auto: stream above 1 GiB.",
            choices=("auto", "memory", "stream"), paradigms=_COLLECTIVE),
    Setting("shuffle-buffer", 16384, "stream: examples in one shuffle window per rank.",
            kind="integer", minimum=1, paradigms=_COLLECTIVE, in_pipeline=False),
    Setting("loader-workers", 0, "stream: DataLoader worker processes per rank (0: a thread "
            "of the worker reads 4 batches ahead; processes pay off when cores are spare).",
            kind="integer", minimum=0, maximum=64, paradigms=_COLLECTIVE, in_pipeline=False),
    Setting("stall-seconds", 300, "Seconds without a step from any rank before the launcher's "
            "watchdog stops the job, names the ranks and nodes that stopped, and relaunches it "
            "from the last checkpoint (max-restarts times); 0: no watchdog.", kind="number",
            minimum=0, reader="launcher", paradigms=_COLLECTIVE),
    Setting("startup-seconds", 900, "Seconds the watchdog allows for start-up, rendezvous, "
            "restarts, evaluation and checkpoints.", kind="number", minimum=1,
            reader="launcher", paradigms=_COLLECTIVE, in_pipeline=False),
    Setting("progress-every", 5, "Seconds between a rank's heartbeats to the watchdog.",
            kind="number", minimum=0.01, paradigms=_COLLECTIVE, in_pipeline=False),
    Setting("backend", "auto", "torch.distributed backend. auto: nccl with GPUs, gloo "
            "otherwise.", choices=("auto", "gloo", "nccl"), paradigms=_COLLECTIVE),
    Setting("scheduler", "auto", "TorchX scheduler for the training job. auto: kubernetes "
            "inside a cluster, local_cwd on one machine; local_netns: every node in its own "
            "network namespace on a bridge, with link-rate (needs root).",
            choices=("auto", "local_cwd", "local_netns", "kubernetes"), reader="launcher"),
    Setting("link-rate", "", "local_netns: each node's link rate, both ways (tc syntax: "
            "100mbit, 1gbit); empty: unlimited.", pattern=r"^([0-9]+(\.[0-9]+)?[kmg]?(bit|bps))?$",
            reader="launcher"),
    Setting("link-delay", "", "local_netns: added one-way delay per link (e.g. 2ms; needs "
            "the kernel's netem).", pattern=r"^([0-9]+(\.[0-9]+)?(us|ms|s))?$",
            reader="launcher"),
    Setting("link-loss", "", "local_netns: packet loss per link (e.g. 0.1%; needs netem).",
            pattern=r"^([0-9]+(\.[0-9]+)?%)?$", reader="launcher"),
    Setting("cpu-per-node", 1, "CPUs requested per training node.", kind="integer", minimum=1,
            reader="launcher"),
    Setting("gpus-per-node", 0, "GPUs requested per training node.", kind="integer", minimum=0,
            reader="launcher"),
    Setting("memory-mb-per-node", 2048, "Memory requested per training node, in MB.",
            kind="integer", minimum=128, reader="launcher"),
    Setting("queue", "default", "Volcano queue for the training job (kubernetes).",
            reader="launcher"),
    Setting("image", DEFAULT_IMAGE, "Container image of the training workers (kubernetes; the "
            "steps' own image is set at install).", reader="launcher"),
    Setting("tracking", "", "MLflow tracking server the run logs to (docs/mlflow.md): every "
            "setting as a parameter, the per-epoch metrics as they happen, the model, "
            "metrics.json, the report and the summary as artifacts; a sweep as a parent run "
            "with a child per point. A URI (http://mlflow:5000); empty: $MLFLOW_TRACKING_URI "
            "(on a cluster from the Secret sublimate-mlflow, with its credentials), no tracking "
            "without it; off: no tracking.", pattern=TRACKING_URI_PATTERN, reader="launcher"),
    Setting("tracking-required", True, "With tracking: a server that cannot be reached fails "
            "the step in one line (true), or the step warns once and goes on without tracking "
            "(false).", kind="boolean", reader="launcher"),
    Setting("eval-entrypoint", "", "Your own evaluation, run once after training: a module, "
            "module:function or script that writes metrics.json (any named metrics) into "
            "$SUBLIMATE_RUN_DIR. Empty: the built-in evaluation (accuracy, loss), or the "
            "metrics.json your training wrote.", pattern=ENTRYPOINT_PATTERN, reader="launcher",
            step="evaluate"),
    Setting("metric", "accuracy", "The metric of metrics.json that the pipeline outputs as "
            "`metric` (e.g. accuracy, loss, mAP).", pattern=r"^[A-Za-z_][\w.-]*$",
            reader="launcher", step="evaluate"),
    # The retraining pipeline (sublimate-retrain) only: its gate and publish steps.
    Setting("registry", f"{SHARED_VOLUME_PATH}/registry", "The model registry every "
            "challenger is published to and whose champion it must beat: a path (default: on "
            "the shared volume), an fsspec URL (s3://bucket/models), or mlflow: MLflow's Model "
            "Registry on the tracking server, the champion its alias `champion` (mlflow:NAME "
            "for a registered model other than `sublimate`).", reader="launcher",
            step="gate"),
    Setting("promote-margin", 0.0, "The challenger replaces the champion only when it beats "
            "it on `metric`, both evaluated on this run's test split, by more than this, in the "
            "metric's own units (0: any improvement; a tie keeps the champion).",
            kind="number", minimum=0, reader="launcher", step="gate"),
    Setting("metric-goal", AUTO, "Whether a higher or a lower `metric` is better. auto: lower "
            "for a metric named like a loss or an error (loss, val_loss, error, mse, mae, rmse, "
            "perplexity, wer, cer), higher for anything else (accuracy, f1, mAP).",
            choices=(AUTO, "max", "min"), reader="launcher", step="gate"),
)
BY_NAME: dict[str, Setting] = {setting.name: setting for setting in SETTINGS}


def settings(reader: str | None = None, paradigm: str | None = None,
             step: str | None = None) -> list[Setting]:
    """The declared settings, optionally those one reader uses, one paradigm applies or one
    step takes."""
    return [s for s in SETTINGS if (reader is None or s.reader == reader)
            and (paradigm is None or paradigm in s.paradigms)
            and (step is None or s.step == step)]


def add_training_arguments(parser: argparse.ArgumentParser,
                           paradigms: Iterable[str] = COLLECTIVE_PARADIGMS) -> None:
    """The flags of the settings the launcher passes to these paradigms' training processes."""
    add_arguments(parser, worker_settings(paradigms))


def worker_settings(paradigms: Iterable[str]) -> list[Setting]:
    """What the launcher passes to the training processes of these paradigms (one program runs
    the collective ones, another the parameter server's)."""
    family = set(paradigms)
    return [s for s in SETTINGS if s.reader == "worker" and family & s.paradigms]


def add_arguments(parser: argparse.ArgumentParser, chosen: Iterable[Setting]) -> None:
    """One ``--flag`` per setting, typed and bounded by its declaration."""
    for setting in chosen:
        parser.add_argument(setting.flag, dest=setting.attribute, type=setting.argparse_type(),
                            default=setting.default_value,
                            metavar=setting.kind.upper() if not setting.choices else None,
                            # argparse formats help with %: a literal one (0.1%) is doubled
                            help=setting.description.replace("%", "%%"))


def to_flags(values: Mapping[str, Any], chosen: Iterable[Setting]) -> list[str]:
    """``values`` (by attribute) as the command-line flags of ``chosen``."""
    flags: list[str] = []
    for setting in chosen:
        flags += [setting.flag, setting.text(values.get(setting.attribute))]
    return flags


def defaults() -> dict[str, Any]:
    """Every setting's typed default, by attribute."""
    return {s.attribute: s.default_value for s in SETTINGS}


def parse_values(texts: Mapping[str, str]) -> dict[str, Any]:
    """Typed values by attribute from texts by setting name (unknown names are ignored)."""
    values = defaults()
    for name, text in texts.items():
        if name in BY_NAME:
            values[BY_NAME[name].attribute] = BY_NAME[name].parse(text)
    return values


def check(values: Mapping[str, Any]) -> None:
    """The rules that tie settings together; raises :class:`SettingError` (one line).

    ``values`` are typed, by attribute (as argparse or :func:`parse_values` give them); missing
    settings take their defaults.
    """
    merged = defaults()
    merged.update({key: value for key, value in values.items() if key in merged})
    nodes = merged["nodes"]
    algorithm = merged["algorithm"]
    minimum = getattr(nodes, "minimum", nodes)
    per_step = recovery_mode(merged) == PER_STEP
    if minimum < nodes and algorithm != "sync" and not per_step:
        raise SettingError(f"nodes {nodes}: elastic training needs algorithm sync ({algorithm} "
                           "keeps per-worker state that cannot be re-divided among fewer nodes)")
    if minimum < nodes and merged["max_restarts"] == 0 and not per_step:
        raise SettingError(f"nodes {nodes}: elastic training needs max-restarts of at least 1 "
                           "(the nodes that remain restart their workers after a loss; leave "
                           f"it at auto for {DEFAULT_RESTARTS['elastic']})")
    if per_step and algorithm not in _COLLECTIVE:
        raise SettingError(f"recovery per-step: algorithm {algorithm} keeps its own parameter "
                           "server and does not support per-step recovery; use recovery restart")
    if per_step and merged["entrypoint"]:
        raise SettingError("recovery per-step runs sublimate's own step loop, which commits "
                           "every step through torchft; with entrypoint, use recovery restart")
    if merged["checkpoint_format"] == "dcp" and (algorithm != "sync" or per_step):
        raise SettingError("checkpoint-format dcp writes each replicated tensor once, so it "
                           "needs algorithm sync (bmuf and easgd keep a model per worker) and "
                           "recovery restart; use checkpoint-format files")
    if merged["rendezvous"] == "static" and not per_step and (
            minimum < nodes or max_restarts(merged)):
        raise SettingError("rendezvous static needs a fixed number of nodes and max-restarts 0 "
                           "(nodes that meet again after a loss need c10d); use rendezvous "
                           "auto or c10d")
    _check_rendezvous(merged, per_step)
    if merged["chaos_mtbf"] and merged["scheduler"] != "local_netns":
        raise SettingError("chaos-mtbf kills nodes of a local_netns cluster: set scheduler to "
                           "local_netns")
    accumulation = merged["accumulation_steps"] if algorithm in _COLLECTIVE else 1
    # Every size an elastic job can have; per-step recovery keeps every node's slice of the
    # batch (a lost node's is skipped), so only the full size counts.
    smallest = int(nodes) if per_step else minimum
    for count in range(int(nodes), smallest - 1, -1):
        workers = count * merged["procs_per_node"]
        divisor = workers * accumulation
        if merged["global_batch_size"] % divisor:
            parts = f"nodes x procs-per-node = {workers}"
            if accumulation > 1:
                parts = (f"nodes x procs-per-node x accumulation-steps = {count} x "
                         f"{merged['procs_per_node']} x {accumulation} = {divisor}")
            if minimum < nodes:
                parts += f" (nodes {nodes} may run on {count})"
            raise SettingError(f"global-batch-size {merged['global_batch_size']} is not "
                               f"divisible by {parts}: {_fitting(merged, minimum)}")
    if merged["entrypoint"] and algorithm == "async":
        raise SettingError("algorithm async runs sublimate's own parameter-server loop; with "
                           "entrypoint, use sync, bmuf, easgd or diloco (the library's paradigms)")
    links = [name for name in ("link_rate", "link_delay", "link_loss") if merged[name]]
    if links and merged["scheduler"] != "local_netns":
        raise SettingError(f"{links[0].replace('_', '-')} shapes the links of local_netns "
                           "nodes: set scheduler to local_netns")
    if merged["framework"] != "pytorch" and not merged["entrypoint"]:
        raise SettingError(f"framework {merged['framework']} needs your own code: set "
                           "entrypoint (the built-in loop is PyTorch)")
    if algorithm == "diloco":
        _check_diloco(merged)
    if algorithm == "bmuf" and merged["block_momentum"] is not None \
            and merged["block_momentum"] >= 1:
        raise SettingError(f"block-momentum {merged['block_momentum']} must be below 1 "
                           "(bmuf diverges at 1 and above)")


def _check_rendezvous(values: Mapping[str, Any], per_step: bool) -> None:
    """etcd-v2's server: started by the launcher on one machine, the user's on a cluster."""
    if values["rendezvous"] != ETCD_V2:
        return
    if per_step:
        raise SettingError("rendezvous etcd-v2: under recovery per-step every node meets only "
                           "itself (no cross-node rendezvous); use rendezvous auto")
    if values["scheduler"] == "kubernetes" and not values["rendezvous_endpoint"]:
        raise SettingError("rendezvous etcd-v2 on kubernetes needs rendezvous-endpoint: the "
                           "HOST:PORT of an etcd server (v2 API enabled) every node can reach")


def _check_diloco(values: Mapping[str, Any]) -> None:
    """Streaming DiLoCo's schedule: one fragment at a time, each once per sync-period."""
    period, fragments = values["sync_period"], values["fragments"]
    if period % fragments:
        raise SettingError(f"fragments {fragments}: sync-period {period} must be a multiple of "
                           "fragments (each fragment is synced every sync-period steps, one "
                           "every sync-period / fragments steps)")
    delay = values["fragment_delay"]
    if delay >= period // fragments:
        raise SettingError(f"fragment-delay {delay}: a fragment's round must end before its "
                           f"next one starts; give fewer than sync-period / fragments = "
                           f"{period // fragments} steps")
    codec = values["outer_codec"]
    if values["outer_gradient_dtype"] == "bfloat16" and codec not in ("none", "bf16"):
        raise SettingError(f"outer-gradient-dtype bfloat16 contradicts outer-codec {codec}: "
                           "drop outer-gradient-dtype (outer-codec bf16 is bfloat16)")
    if codec == "topk" and not values["outer_codec_topk"] > 0:
        raise SettingError(f"outer-codec-topk {values['outer_codec_topk']}: topk must send "
                           "some values; give a fraction above 0 (e.g. 0.03)")


def recovery_mode(values: Mapping[str, Any], streamed: bool = False) -> str:
    """The recovery mode a job runs with: ``recovery`` when it names one, except that the
    built-in loop runs diloco on torchft's Manager, that is always per-step (users' own loops,
    under torchrun alone, average over the job's process group). ``auto``: per-step wherever
    the job can run it, restart elsewhere. ``streamed``: the training split streams (the train
    step knows from the dataset's size under data-loading auto; per-step holds it in memory)."""
    algorithm = values.get("algorithm", "sync")
    own_code = bool(values.get("entrypoint"))
    if algorithm == "diloco" and not own_code:
        return PER_STEP
    chosen = values.get("recovery") or AUTO
    if chosen != AUTO:
        return str(chosen)
    # sync only: a bmuf or easgd round as a transaction cost 12 to 15% of their failure-free
    # throughput (benchmarks/fault_tolerance.py --algorithm), sync's transactions nothing
    # measurable; the default must cost at most 3%
    runs_per_step = (algorithm == "sync" and not own_code
                     and int(values.get("nodes", 2)) > 1
                     and values.get("checkpoint_format", "files") == "files"
                     and values.get("data_loading", "auto") != "stream" and not streamed
                     and values.get("rendezvous", AUTO) != ETCD_V2)
    return PER_STEP if runs_per_step else RESTART


def max_restarts(values: Mapping[str, Any]) -> int:
    """``max-restarts`` as the launcher applies it: the value given, or its auto default."""
    given = values.get("max_restarts")
    if given is not None:
        return int(given)
    if recovery_mode(values) == PER_STEP:
        return DEFAULT_RESTARTS[PER_STEP]
    nodes = values.get("nodes", 1)
    return DEFAULT_RESTARTS["elastic" if getattr(nodes, "elastic", False) else "otherwise"]


def rendezvous_backend(values: Mapping[str, Any]) -> str:
    """torchrun's backend for the ``rendezvous`` setting: ``auto`` is ``static`` for a fixed
    number of nodes that torchrun does not restart in place (a lost node relaunches the whole
    job), ``c10d`` for elastic nodes or ``max-restarts`` > 0, whose nodes meet again."""
    chosen = values.get("rendezvous") or AUTO
    if chosen != AUTO:
        return str(chosen)
    nodes = values.get("nodes", 2)
    fixed = getattr(nodes, "minimum", nodes) == nodes
    return "static" if fixed and not max_restarts(values) else "c10d"


def steps_per_commit(values: Mapping[str, Any]) -> int:
    """``commit-every`` as the per-step loop applies it: the value given, or its default."""
    given = values.get("commit_every")
    return DEFAULT_STEPS_PER_COMMIT if given is None else int(given)


def collective_timeout(values: Mapping[str, Any]) -> float:
    """``collective-timeout`` as the workers apply it: the value given, or its auto default."""
    given = values.get("collective_timeout")
    if given is not None:
        return float(given)
    return COLLECTIVE_TIMEOUTS[recovery_mode(values)]


def _fitting(merged: Mapping[str, Any], minimum: int) -> str:
    """The nearest settings that divide: global batch sizes (for every size an elastic job can
    have), and for a fixed size the node counts, e.g. ``use global-batch-size 63 or 66, or
    nodes 2 or 4``."""
    nodes, batch = int(merged["nodes"]), merged["global_batch_size"]
    per_node = merged["procs_per_node"] * (
        merged["accumulation_steps"] if merged["algorithm"] in _COLLECTIVE else 1)
    divisor = math.lcm(*(count * per_node for count in range(minimum, nodes + 1)))
    below, above = batch // divisor * divisor, (batch // divisor + 1) * divisor
    batches = " or ".join(str(size) for size in (below, above) if size > 0)
    advice = f"use global-batch-size {batches}"
    if minimum == nodes:
        fits = [count for count in range(1, 2 * nodes + 1) if batch % (count * per_node) == 0]
        near = sorted(fits, key=lambda count: (abs(count - nodes), count))[:2]
        if near:
            advice += f", or nodes {' or '.join(map(str, sorted(near)))}"
    return advice


def check_texts(texts: Mapping[str, str]) -> None:
    """:func:`check` on pipeline parameter texts by name (what ``sublimate run`` resolved)."""
    check(parse_values(texts))


def checked_values(attributes: Iterable[str], values: Mapping[str, Any]) -> dict[str, Any]:
    """The settings named by ``attributes`` from typed ``values`` (by attribute), each checked
    against its declaration (a bad value raises :class:`SettingError` naming it); a missing one
    takes its default. A paradigm's typed config is built from this."""
    typed = {}
    for attribute in attributes:
        setting = BY_NAME[attribute.replace("_", "-")]
        if attribute in values:
            value = values[attribute]
            setting.parse(setting.text(value))  # refuses what the declaration does not allow
            typed[attribute] = value
        else:
            typed[attribute] = setting.default_value
    return typed
