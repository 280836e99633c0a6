"""Options, results and progress events of a local run."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from sublimate.pipelines.argo_terms import NodePhase, NodeType

if TYPE_CHECKING:
    from ..pods.executor import Executor
    from ..pods.k8s_objects import ObjectLibrary

PHASES_DONE = frozenset(phase for phase in NodePhase if phase.done)
# No workflow that fits a cluster comes near it: at Argo's ~1.9 KB of status per node, 10,000
# nodes are ~19 MB of status, which etcd's 1 MB holds only offloaded to a database.
DEFAULT_MAX_NODES = 10_000


def iso(moment: datetime | None) -> str | None:
    return moment.isoformat().replace("+00:00", "Z") if moment else None


def parse_iso(text: object) -> datetime:
    """A timestamp as ``iso`` writes it (or Kubernetes', whole seconds), back; one without a
    zone is UTC. ``ValueError`` for anything else."""
    moment = datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def now() -> datetime:
    return datetime.now(UTC)


@dataclass
class RunEvent:
    """A progress event: ``kind`` is ``"workflow"``, ``"node"`` (phase change), ``"log"``, or
    ``"note"`` (something the runner says once about the run as a whole, in ``message``)."""

    kind: str
    workflow: str
    time: datetime
    phase: NodePhase | None = None
    node: NodeResult | None = None
    line: str | None = None
    message: str = ""


@dataclass(frozen=True)
class SuspendAnswer:
    """How a test answers a suspend node before the run starts (``RunOptions.answers``), as a
    person would with ``sublimate resume`` or ``sublimate stop``."""

    # The supplied output parameters (``valueFrom.supplied``) to resume it with; the others
    # take their defaults, as ``argo resume`` gives them.
    outputs: Mapping[str, str] = field(default_factory=dict)
    stop: bool = False  # stop it instead: the node fails (``argo stop --node-field-selector``)
    message: str = ""


@dataclass
class CarriedNodes:
    """The nodes a run takes from an earlier one instead of running them (``sublimate retry``,
    ``resubmit --memoized``; planned by ``templates.rerun``): the earlier run's name (node names
    begin with it; a resubmitted run's begin with its own), its nodes by id as its
    ``status.json`` has them, the carried ones by name, and the display names of the execution
    nodes that run again (for the console)."""

    earlier_name: str
    earlier: dict[str, dict]
    carried: dict[str, dict]
    rerun: tuple[str, ...]
    taken: set[str] = field(default_factory=set)

    def take(self, run_name: str, name: str) -> dict | None:
        """The earlier node that node ``name`` of run ``run_name`` is carried from, if any
        (each once)."""
        earlier_name = self.earlier_name + name[len(run_name):]
        if earlier_name in self.taken:
            return None
        found = self.carried.get(earlier_name)
        if found is not None:
            self.taken.add(earlier_name)
        return found


@dataclass
class RunOptions:
    home: Path
    parallelism: int | None = None
    reporter: Callable[[RunEvent], None] | None = None
    follow_logs: bool = True
    # What runs each pod: None is the local process executor. Tests pass a fake one, so that
    # DAG/steps semantics are checked without starting processes.
    executor: Executor | None = None
    # Where pods find the manifest's absolute paths (``mounts``): "overlay" gives each pod a
    # private view of the whole tree (``views``), "namespace" mounts the run's folders there in
    # a private mount namespace, the host's files shared, "rewrite" rewrites the paths as
    # written, "auto" is the first of these this machine allows (for local processes).
    mounts: str = "auto"
    # ``--containers``: run each pod in its template's image through a container engine
    # (``images``): "auto" (the first of docker, podman, buildah that works) or one of them;
    # None: pods are local processes.
    containers: str | None = None
    # ``--semaphore NAME/KEY=N``: a synchronization semaphore's limit, by ConfigMap name and key
    # (``synchronization``); these win over the ConfigMap manifests among ``objects``.
    semaphores: dict[str, int] = field(default_factory=dict)
    # The Secrets and ConfigMaps pods and semaphores read (``k8s_objects``); None: no
    # manifests (an optional secret then comes from this machine's environment, a required
    # one fails its pod).
    objects: ObjectLibrary | None = None
    # Suspend nodes answered up front: a display name, or a node field selector
    # (``templateName=approve``), to its answer; one no answer matches waits for
    # ``sublimate resume`` as on a cluster.
    answers: Mapping[str, SuspendAnswer] = field(default_factory=dict)
    # ``--max-nodes``: the most nodes the run may make. Argo bounds a workflow by its object in
    # etcd (1 MiB, compressed, then offloaded to a database); a local run has no etcd, and its
    # memory and ``status.json`` grow with its nodes, so it counts them (``loops``).
    max_nodes: int = DEFAULT_MAX_NODES
    # ``sublimate run --env``: variables passed to every pod (nothing else of this process's
    # environment reaches one: ``pods.environment``); their values are masked as secrets.
    env: Mapping[str, str] = field(default_factory=dict)
    # ``sublimate retry``/``resubmit --memoized``: the nodes taken from an earlier run instead
    # of run (``templates.rerun``); ``run_folder``: a retry runs in its run's own folder, under
    # its name (as ``argo retry`` keeps the workflow), rather than in a new one.
    carried: CarriedNodes | None = None
    run_folder: Path | None = None
    # False: a pod asking for more than a container's privileges fails to start (what comes
    # over HTTP to ``sublimate server`` without --allow-privileged: ``server.policy``)
    allow_privileged: bool = True


@dataclass
class NodeResult:
    id: str
    name: str
    display_name: str
    template: str
    type: NodeType
    phase: NodePhase = NodePhase.PENDING
    started_at: datetime | None = None
    finished_at: datetime | None = None
    message: str = ""
    parameters: dict[str, str] = field(default_factory=dict)
    artifacts: dict[str, str] = field(default_factory=dict)
    result: str | None = None
    exit_code: int | None = None
    log: Path | None = None
    children: list[str] = field(default_factory=list)
    parent: str | None = None
    # A daemon (``daemons``) that is ready and running: its dependants may start; ``pod_ip`` is
    # its address, ``{{steps.<name>.ip}}`` (Argo records it only while daemoned).
    daemoned: bool = False
    pod_ip: str | None = None
    # A memoized template's node: Argo's ``memoizationStatus`` ({hit, key, cacheName}); a hit
    # is a node finished from the cache without running (``templates/memoize``).
    memoization: dict | None = None
    # The input parameters it was invoked with, as resolved (Argo's ``node.inputs``)
    inputs: dict[str, str] = field(default_factory=dict)

    @property
    def duration_s(self) -> float | None:
        if self.started_at is None:
            return None
        end = self.finished_at or now()
        return round((end - self.started_at).total_seconds(), 3)

    @property
    def done(self) -> bool:
        return self.phase in PHASES_DONE

    def to_json(self) -> dict:
        return {
            "id": self.id,
            "name": self.name,
            "display_name": self.display_name,
            "template": self.template,
            "type": self.type,
            "phase": self.phase,
            "started_at": iso(self.started_at),
            "finished_at": iso(self.finished_at),
            "duration_s": self.duration_s,
            "outputs": {
                "parameters": dict(self.parameters),
                "artifacts": dict(self.artifacts),
                "result": self.result,
                "exitCode": None if self.exit_code is None else str(self.exit_code),
            },
            "message": self.message,
            "log": str(self.log) if self.log else None,
            "parent": self.parent,
            "children": list(self.children),
            **({"daemoned": True} if self.daemoned else {}),
            **({"pod_ip": self.pod_ip} if self.pod_ip else {}),
            **({"memoizationStatus": dict(self.memoization)} if self.memoization else {}),
            **({"inputs": {"parameters": dict(self.inputs)}} if self.inputs else {}),
        }


@dataclass
class RunResult:
    name: str
    phase: NodePhase
    message: str
    started_at: datetime
    finished_at: datetime | None
    run_dir: Path
    nodes: list[NodeResult]
    parameters: dict[str, str]
    outputs: dict[str, dict[str, str]] = field(default_factory=dict)
    # outputs/<name> links in the run folder to the folders that output parameters name
    links: dict[str, Path] = field(default_factory=dict)
    # the process that ran it: pid, start_ticks (clock ticks since boot), host
    runner: dict[str, object] = field(default_factory=dict)

    def node(self, display_name: str) -> NodeResult:
        """The first node whose display name (or full name) matches; handy in tests/CLI."""
        for node in self.nodes:
            if display_name in (node.display_name, node.name):
                return node
        raise KeyError(display_name)

    def to_json(self) -> dict:
        duration = None
        if self.finished_at:
            duration = round((self.finished_at - self.started_at).total_seconds(), 3)
        return {
            "name": self.name,
            "phase": self.phase,
            "message": self.message,
            "started_at": iso(self.started_at),
            "finished_at": iso(self.finished_at),
            "duration_s": duration,
            "run_dir": str(self.run_dir),
            "parameters": dict(self.parameters),
            "outputs": {k: dict(v) for k, v in self.outputs.items()},
            "links": {name: str(path) for name, path in self.links.items()},
            "runner": dict(self.runner),
            "nodes": [node.to_json() for node in self.nodes],
        }
