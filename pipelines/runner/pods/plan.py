"""What a pod runs, as plain data: one container/script template invocation, fully resolved.

``plan_pod`` turns a template, its variables and the run's folder layout into a ``PodRequest``:
the command line with its ``{{...}}`` variables substituted (its container paths as written
where the pod sees them at those paths: its private view, ``views``; else rewritten to local
folders, ``paths``), the environment the template sets, the working directory, the
mounts, the input artifacts to place, the outputs to read back and the deadline. It reads and
writes nothing, so a dry run shows exactly what a run would start, and an executor gets all it
needs in one value (see ``executor``). A pod with init containers, sidecars or a
``containerSet`` lists them in ``PodRequest.containers``, each planned the same way
(``container_set`` runs them).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from sublimate.pipelines.argo_terms import NodeType, sub_path_problem

from ..errors import NodeError
from ..expressions.substitution import Vars, as_text, substitute, substitute_text
from ..manifest.durations import parse_duration
from ..manifest.fields import CLUSTER_ONLY_FIELDS
from ..manifest.repository import repository_root
from .artifacts import Input as InputArtifact
from .artifacts import input_source
from .mounts import SCRIPT_PATH, Bind, binds_for
from .paths import PathMap, inside

if TYPE_CHECKING:
    from .images.spec import InImage
    from .inside import InRoot
    from .k8s_objects import ObjectLibrary, Projection
    from .resource_limits import Limits
    from .views import View

# The small immutable records are NamedTuples rather than frozen dataclasses: every
# `sublimate run` defines them at start-up, and a NamedTuple costs a sixth as much to define.


MAX_READABLE = 96


def node_folder(display_name: str, node_id: str) -> str:
    """``<display name>-<id hash>`` under ``nodes/``: readable in a listing, unique like the id."""
    readable = "".join(c if c.isalnum() or c in "._-" else "-" for c in display_name)
    readable = "-".join(part for part in readable.split("-") if part) or "node"
    # A loop child is named after its whole item (a kilobyte for a sweep's point): a file name
    # holds 255 bytes, and the id's hash alone keeps the folder unique.
    return f"{readable[:MAX_READABLE].rstrip('-')}-{node_id.rsplit('-', 1)[-1]}"


class Layout(NamedTuple):
    """Where a run's files live: the run folder, the home of persistent volumes, and the
    volumes the workflow declares (``spec.volumes``, one folder per ``volumeClaimTemplates``)."""

    home: Path
    run_dir: Path
    volumes: tuple[dict, ...] = ()
    claims: tuple[tuple[str, Path], ...] = ()
    # "overlay": each pod has a private view of the whole tree, its folders bound at the
    # manifest's paths (``views``); "namespace": pods see their folders mounted at the
    # manifest's paths, sharing this machine's files (``mounts``); "rewrite": the paths are
    # rewritten to local folders (``paths``); "image": each pod runs in its template's image
    # (``images``), its folders bound at the manifest's paths.
    mounts: str = "rewrite"
    # spec.securityContext: the pods' own unless a template sets one (container mode).
    pod_security: dict | None = None
    # The Secrets and ConfigMaps pods read (env, envFrom, volumes): ``k8s_objects``.
    objects: ObjectLibrary | None = None
    # False: a pod that asks for more than a container's privileges fails to start
    # (``sandbox.privilege_requests``; workflows that came over HTTP: ``server.policy``).
    privileged_allowed: bool = True

    @classmethod
    def of(cls, home: Path, run_dir: Path, spec: dict, mounts: str = "rewrite",
           objects: ObjectLibrary | None = None, privileged_allowed: bool = True) -> Layout:
        claims = tuple((c["metadata"]["name"], run_dir / "volumes" / c["metadata"]["name"])
                       for c in spec.get("volumeClaimTemplates") or [])
        return cls(home, run_dir, tuple(spec.get("volumes") or []), claims, mounts,
                   spec.get("securityContext"), objects, privileged_allowed)


class Mount(NamedTuple):
    """A container path and the local folder standing in for it."""

    path: str
    local: Path
    # The volume's name and kind ("persistentVolumeClaim sublimate-data", "emptyDir", ...);
    # both empty for a path the template declares outside any volume, private to the pod.
    volume: str = ""
    kind: str = ""
    # Outlives the pod (not in its node folder): workflow outputs may point here.
    shared: bool = False
    read_only: bool = False  # volumeMounts[].readOnly (applied in a mount namespace)


class Container(NamedTuple):
    """A container of the pod other than a plain template's own one: an init container, a
    sidecar, or a member of a ``containerSet`` (the set's ``main`` included), resolved like the
    main container (its own path map: its volume mounts, and its own ``workingDir`` in
    ``ctr/<name>/fs/``; ``main`` keeps the pod's map)."""

    name: str
    role: str  # "init", "set" or "sidecar"
    argv: list[str]
    env: dict[str, str]
    cwd: Path
    folder: Path  # the pod's node folder: its log is <name>.log, as Argo keeps one per container
    mounts: tuple[Mount, ...] = ()
    from_environment: tuple[str, ...] = ()
    dependencies: tuple[str, ...] = ()  # containerSet only: names that must succeed first
    in_image: InImage | None = None  # container mode: what it runs in its image
    view: View | None = None  # overlay mode: its own private view (``views``)

    @property
    def log(self) -> Path:
        return self.folder / f"{self.name}.log"

    @property
    def termination_log(self) -> Path:
        name = "termination-log" if self.name == "main" else f"{self.name}.termination-log"
        return self.folder / name


class SetRetry(NamedTuple):
    """``containerSet.retryStrategy``: attempts of each container's command, in place."""

    attempts: int
    pause_s: float = 0.0


@dataclass
class PodRequest:
    """Everything needed to run one pod locally, resolved. ``argv`` keeps ``python`` as the
    template wrote it: standing in the runner's interpreter is the executor's business."""

    node_id: str
    node_name: str
    display_name: str
    template: str
    argv: list[str]
    env: dict[str, str]  # only what the template sets, paths rewritten
    cwd: Path
    folder: Path  # the node folder: log, script, private fs/, emptyDirs
    run_dir: Path
    mounts: list[Mount] = field(default_factory=list)  # in path-map order
    script: str | None = None  # a script template's source, written to ``script_path``
    # Variables the template takes from optional secrets no manifest provides: the local
    # environment provides them (``k8s_objects``).
    from_environment: list[str] = field(default_factory=list)
    # `sublimate run --env`: this shell's variables the user passed to every container of the
    # pod (``environment``); secrets, masked in every output. Set by the run, not planned.
    passed_env: dict[str, str] = field(default_factory=dict)
    # The main container's variables read from Secrets: name -> "SECRET/KEY" (the dry run
    # shows that, never the value).
    secret_env: dict[str, str] = field(default_factory=dict)
    # Secret and configMap volumes' files, written when the pod is staged.
    projections: list[Projection] = field(default_factory=list)
    # What is masked in the pod's output: its own secrets' values; the run adds its others.
    masked: frozenset[str] = frozenset()
    inputs: list[InputArtifact] = field(default_factory=list)
    outputs: dict = field(default_factory=dict)  # the template's outputs section, resolved
    deadline_s: float | None = None  # the template's own activeDeadlineSeconds/timeout
    # Init containers, sidecars and a containerSet's containers (see ``container_set``); empty
    # for a plain container/script pod, which runs ``argv`` alone.
    containers: list[Container] = field(default_factory=list)
    set_retry: SetRetry | None = None
    # Mount-namespace mode (``mounts``): the folders to mount at container paths (None: the
    # paths were rewritten), the container working directory, and why a pod was rewritten.
    binds: list[Bind] | None = None
    working_dir: str = ""
    mounts_note: str = ""
    # Container mode (``images``): what the pod's main container runs in its image.
    in_image: InImage | None = None
    # Overlay mode (``views``): the main container's private view of the whole tree.
    view: View | None = None
    # resources.limits, applied in cgroups of the pod's own (``resource_limits``).
    limits: Limits | None = None

    @property
    def log(self) -> Path:
        return self.folder / "main.log"

    @property
    def script_path(self) -> Path:
        return self.folder / "script"

    @property
    def termination_log(self) -> Path:
        # Kubernetes' /dev/termination-log: what a failed step writes here is its message.
        return self.folder / "termination-log"

    @property
    def runner_env(self) -> dict[str, str]:
        """What the local runner adds to every step's environment, after the template's
        (``environment.pod_environment`` builds the rest)."""
        return {
            "SUBLIMATE_LOCAL_RUN": "1",
            "SUBLIMATE_LOCAL_RUN_FOLDER": str(self.run_dir),
            # Where `sublimate run` was started: a step resolves a user's relative paths
            # (e.g. the train step's entrypoint=examples/x/train.py) from there, as on a laptop.
            "SUBLIMATE_LOCAL_CWD": os.getcwd(),
            "SUBLIMATE_TERMINATION_LOG": str(self.termination_log),
            # Each volume's folder here: a step's messages name a file by the path its user
            # can open ($SUBLIMATE_HOME/volumes/...), not the one the step sees (/mnt/...).
            "SUBLIMATE_LOCAL_VOLUMES": json.dumps(
                {mount.path: str(mount.local) for mount in self.mounts if mount.volume}),
        }

    @cached_property
    def paths(self) -> PathMap:
        """The path map the command line was rewritten with (to restore reported paths)."""
        paths = PathMap(self.folder / "fs")
        for mount in self.mounts:
            paths.mount(mount.path, mount.local)
        return paths

    def local(self, container_path: str) -> Path:
        return self.paths.local(container_path)

    def message_paths(self) -> PathMap:
        """The path map for the pod's message: its own folders read as the container's paths,
        as on Argo; a volume that outlives it (the shared volume) keeps this machine's path,
        where its user opens the file the message names (runtime.shown_path)."""
        shared = {mount.local for mount in self.mounts if mount.shared}
        paths = PathMap(self.folder / "fs")
        for container, local in self.paths.entries.items():
            if local not in shared:
                paths.mount(container, local)
        return paths

    def locate(self, container_path: str) -> InRoot:
        """Where the runner reads what the pod left at a container path (an output): in
        overlay mode where its view says (a bound folder, else the pod's layer), else its
        volume's folder or the node's ``fs/``; resolved inside that root when read
        (``inside``: a link the pod left is never followed out of it)."""
        from .inside import InRoot  # a pod with outputs pays for it

        if self.view is not None:
            return self.view.locate(container_path)
        root = self.paths.root_of(container_path)
        return InRoot(root, os.path.relpath(self.local(container_path), root))

    def output_files(self) -> dict[str, Path]:
        """Output parameter name -> the local file the pod writes it to (``valueFrom.path``)."""
        return {p["name"]: self.local(p["valueFrom"]["path"])
                for p in self.outputs.get("parameters") or []
                if (p.get("valueFrom") or {}).get("path")}

    def artifact_paths(self) -> dict[str, Path]:
        """Output artifact name -> the local file or folder the pod leaves it in."""
        return {a["name"]: self.local(a["path"]) for a in self.outputs.get("artifacts") or []
                if a.get("path")}


def template_kind(template: dict) -> NodeType:
    if "dag" in template:
        return NodeType.DAG
    if "steps" in template:
        return NodeType.STEPS
    if "suspend" in template:
        return NodeType.SUSPEND
    if "http" in template:
        return NodeType.HTTP
    return NodeType.POD  # container, script, containerSet, and data (it runs a pod on Argo)


def template_deadline(template: dict, local: Vars) -> float | None:
    """Seconds a template invocation may run (the smaller of activeDeadlineSeconds and
    timeout), or None. An unresolvable value sets no deadline rather than failing the node."""
    limits = []
    with contextlib.suppress(NodeError, ValueError):
        if template.get("activeDeadlineSeconds") is not None:
            limits.append(float(substitute_text(
                str(template["activeDeadlineSeconds"]), local, "activeDeadlineSeconds")))
        if template.get("timeout") is not None:
            limits.append(parse_duration(
                substitute_text(str(template["timeout"]), local, "timeout")))
    return min(limits) if limits else None


PENDING_TIMEOUT = "timeout"  # operator.go ErrTimeout's text, the node's message


def pending_limit(template: dict, local: Vars) -> float | None:
    """``pendingTimeout`` in seconds (``ParseStringToDuration``), or None: how long the node
    may stay Pending, from its start (operator.go ``checkTemplateTimeouts``). Locally a node
    is Pending only while it waits for a synchronization lock."""
    if template.get("pendingTimeout") is None:
        return None
    text = substitute_text(str(template["pendingTimeout"]), local, "pendingTimeout")
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise NodeError(f"pendingTimeout: invalid timeout format {exc}") from None


def plan_pod(template: dict, local: Vars, *, node_id: str, node_name: str, display_name: str,
             layout: Layout, art_args: dict[str, dict] | None = None) -> PodRequest:
    """Resolve a container/script template invocation; ``NodeError`` when it cannot be."""
    where = f"templates.{template['name']}"
    body_key = "script" if "script" in template else "container"
    if "containerSet" in template:
        body_key = "containerSet"
    local = {**local, **path_variables(template, local, where)}
    # Cluster-only fields (metrics use Argo's {{duration}}/{{status}}, ...) are not ours to
    # resolve: they mean nothing locally.
    tmpl: dict = substitute({k: v for k, v in template.items()  # type: ignore[assignment]
                             if k != "name" and k not in CLUSTER_ONLY_FIELDS}, local, where)
    body = set_main(tmpl[body_key]) if body_key == "containerSet" else tmpl[body_key]
    folder = layout.run_dir / "nodes" / node_folder(display_name, node_id)
    mounts = _mounts(tmpl, body, folder, layout)
    paths = PathMap(folder / "fs")
    for mount in mounts:
        paths.mount(mount.path, mount.local)
    binds, mounts_note = namespace_binds(tmpl, body, body_key, mounts, folder, layout)
    annotations = local_annotations(template, local, where)
    if not layout.privileged_allowed:
        from .sandbox import privilege_requests

        asked = privilege_requests(tmpl, annotations)
        if asked:
            raise NodeError(f"{where}.{asked[0]}: this run allows no pod more privileges than "
                            "a container's (sublimate server without --allow-privileged)")
    view = None
    if layout.mounts == "overlay":
        from .sandbox import plan_sandbox  # deferred: only overlay mode pays for them
        from .views import plan_view

        view = plan_view(folder, mounts, declared_outputs(tmpl), str(body.get("workingDir") or ""),
                         folder / "termination-log",
                         folder / "script" if body_key == "script" and body.get("source")
                         else None, plan_sandbox(body, annotations, f"{where}.{body_key}"))
    # In a view, a namespace or the image, the manifest's paths are real: commands keep them.
    as_written = binds is not None or view is not None or layout.mounts == "image"
    text = PathMap(folder / "fs") if as_written else paths
    argv = [text.rewrite(str(a)) for a in body.get("command") or []]
    script = None
    argv += [text.rewrite(as_text(a)) for a in body.get("args") or []]
    if body_key == "script" and body.get("source"):
        # operator.go executeScript appends the script's path after command and args (none
        # for an empty source); the executor writes it executable (executor.go StageFiles).
        script = text.rewrite(str(body["source"]))
        argv.append(SCRIPT_PATH if as_written else str(folder / "script"))
    environment = _environment(body, text, layout.objects)
    containers = plan_containers(tmpl, body, mounts, folder, layout,
                                 template.get("securityContext") or layout.pod_security, view,
                                 annotations)
    projections, masked = _projections(tmpl, [mounts, *(c.mounts for c in containers)],
                                       folder, layout)
    masked |= _secret_forms(environment.env[name] for name in environment.secret)
    in_image = None
    if layout.mounts == "image":
        from .images.spec import image_spec  # deferred: only container mode pays for it

        in_image = image_spec(body, template.get("securityContext") or layout.pod_security,
                              argv[len(body.get("command") or []):], _input_paths(tmpl))
    return PodRequest(
        node_id=node_id,
        node_name=node_name,
        display_name=display_name,
        template=template["name"],
        argv=argv,
        env=environment.env,
        # in a view, the process starts in the node folder and its view moves it (``views``)
        cwd=paths.local(body["workingDir"]) if body.get("workingDir") and view is None
        else folder,
        folder=folder,
        run_dir=layout.run_dir,
        mounts=mounts,
        script=script,
        from_environment=environment.from_environment,
        secret_env=environment.secret,
        projections=projections,
        masked=frozenset(masked),
        inputs=_input_artifacts(tmpl, paths, art_args or {}, layout.home),
        outputs=tmpl.get("outputs") or {},
        deadline_s=template_deadline(template, local),
        containers=containers,
        set_retry=set_retry(tmpl),
        binds=binds,
        working_dir=str(body.get("workingDir") or folder) if binds is not None else "",
        mounts_note=mounts_note,
        in_image=in_image,
        view=view,
        limits=_limits(body, annotations, f"{where}.{body_key}", layout),
    )


def _limits(body: dict, annotations: dict, where: str, layout: Layout) -> Limits | None:
    """The main container's ``resources.limits`` (``resource_limits``); container mode's are
    the engine's."""
    if layout.mounts == "image" or not (body.get("resources") or {}).get("limits"):
        return None
    from .resource_limits import plan_limits  # deferred: only pods with limits pay for it

    return plan_limits(body, annotations, where)


def local_annotations(template: dict, local: Vars, where: str) -> dict:
    """The template's pod annotations (``metadata.annotations``), substituted: the local
    runner reads its own there (``sandbox``, ``resource_limits``)."""
    found = (template.get("metadata") or {}).get("annotations") or {}
    if not isinstance(found, dict) or not any(str(k).startswith("sublimate.dev/local-")
                                              for k in found):
        return {}
    return substitute(found, local, f"{where}.metadata.annotations")  # type: ignore[return-value]


def path_variables(template: dict, local: Vars, where: str) -> Vars:
    """``{{outputs.parameters.<name>.path}}``, ``{{outputs.artifacts.<name>.path}}`` and
    ``{{inputs.artifacts.<name>.path}}`` as Argo's ``SubstituteParams`` sets them for a pod
    template: each path as written, after the pass with the globals and locals but not the
    inputs (a tag that pass cannot resolve stays in the value, and values are not scanned
    again), so the pod sees the same text it would on Argo."""
    first_pass = {k: v for k, v in local.items() if not k.startswith("inputs.")}
    found: Vars = {}

    def add(name: str, path: object, field: str) -> None:
        found[name] = substitute_text(str(path), first_pass, f"{where}.{field}",
                                      keep_unresolved=True)

    for index, art in enumerate((template.get("inputs") or {}).get("artifacts") or []):
        if art.get("path"):
            add(f"inputs.artifacts.{art['name']}.path", art["path"],
                f"inputs.artifacts[{index}].path")
    outputs = template.get("outputs") or {}
    for index, art in enumerate(outputs.get("artifacts") or []):
        if art.get("path"):
            add(f"outputs.artifacts.{art['name']}.path", art["path"],
                f"outputs.artifacts[{index}].path")
    for index, param in enumerate(outputs.get("parameters") or []):
        if (param.get("valueFrom") or {}).get("path"):
            add(f"outputs.parameters.{param['name']}.path", param["valueFrom"]["path"],
                f"outputs.parameters[{index}].valueFrom.path")
    return found


def declared_outputs(tmpl: dict) -> list[str]:
    """The container paths of a template's output parameters (``valueFrom.path``) and
    artifacts."""
    outputs = tmpl.get("outputs") or {}
    found = [str((p.get("valueFrom") or {}).get("path") or "")
             for p in outputs.get("parameters") or []]
    found += [str(a.get("path") or "") for a in outputs.get("artifacts") or []]
    return [path for path in found if path.startswith("/")]


def _input_paths(tmpl: dict) -> list[str]:
    """The container paths of a template's input artifacts."""
    return [str(a["path"]) for a in (tmpl.get("inputs") or {}).get("artifacts") or []
            if a.get("path")]


def namespace_binds(tmpl: dict, body: dict, body_key: str, mounts: list[Mount], folder: Path,
                    layout: Layout) -> tuple[list[Bind] | None, str]:
    """In namespace mode, what to mount where (``mounts.binds_for``); None, with why, when
    this pod's paths are rewritten instead."""
    if layout.mounts != "namespace":
        return None, ""
    if tmpl.get("initContainers") or tmpl.get("sidecars") or body_key == "containerSet":
        return None, ("paths rewritten: a pod of several containers runs without a namespace "
                      "(overlay mode gives each container its own view)")
    working_dir = str(body.get("workingDir") or "")
    binds, why = binds_for(mounts, folder, working_dir,
                           body_key == "script" and bool(body.get("source")))
    if why:
        return None, f"paths rewritten: {why}"
    return binds, ""


def set_main(container_set: dict) -> dict:
    """The body that stands for a containerSet in the pod's plan: its container named ``main``
    (Argo loads inputs and saves outputs from ``main`` only: docs/container-set-template.md),
    with the set's ``volumeMounts`` added as ``ContainerSetTemplate.GetContainers`` adds them
    to every container; with no ``main``, just those mounts (nothing runs as the pod's own
    command)."""
    shared = list(container_set.get("volumeMounts") or [])
    for node in container_set.get("containers") or []:
        if node.get("name") == "main":
            return {**node, "volumeMounts": [*(node.get("volumeMounts") or []), *shared]}
    return {"volumeMounts": shared}


def set_retry(tmpl: dict) -> SetRetry | None:
    """``containerSet.retryStrategy`` as the emissary applies it: ``retry.OnError`` with
    ``wait.Backoff{Steps: retries, Duration: duration}`` (``ContainerSetTemplate.
    GetRetryStrategy``), so ``retries`` is the number of attempts in all (Argo's own
    emissary_test.go: ``retries: 1`` fails a command that succeeds on its second try), each
    ``duration`` after the last (factor 0: a constant pause)."""
    strategy = (tmpl.get("containerSet") or {}).get("retryStrategy")
    if not strategy or strategy.get("retries") is None:
        return None
    try:
        attempts = int(str(strategy["retries"]))
        pause = parse_duration(str(strategy["duration"])) if strategy.get("duration") else 0.0
    except ValueError as exc:
        raise NodeError(f"containerSet.retryStrategy: {exc}") from exc
    if attempts < 1:
        raise NodeError(f"containerSet.retryStrategy.retries: {attempts} would never run the "
                        "containers (the emissary makes `retries` attempts in all)")
    return SetRetry(attempts, pause)


def plan_containers(tmpl: dict, main: dict, main_mounts: list[Mount], folder: Path,
                    layout: Layout, pod_security: dict | None = None,
                    main_view: View | None = None, annotations: dict | None = None
                    ) -> list[Container]:
    """Init containers (in order), then a containerSet's containers, then sidecars; in
    container mode each with what it runs in its own image (``pod_security``: the pod's
    securityContext); in overlay mode each with its own view (the set's ``main`` with the
    pod's, ``main_view``)."""
    images = layout.mounts == "image"
    views = main_view is not None
    volumes_only = {"volumes": tmpl.get("volumes") or []}
    # mirrorVolumeMounts: the main container's volume mounts, input artifacts included
    # (workflowpod.go addInitContainers/addSidecars -> mirrorVolumeMounts, called "after all
    # volumes have been manipulated in the main container").
    main_paths = PathMap(folder / "fs")
    for mount in main_mounts:
        main_paths.mount(mount.path, mount.local)
    mirrored = [m for m in main_mounts if m.volume]
    mirrored += [Mount(a["path"], main_paths.local(a["path"]))
                 for a in (tmpl.get("inputs") or {}).get("artifacts") or [] if a.get("path")]

    def plan(body: dict, role: str) -> Container:
        name = str(body.get("name") or "")
        view = None
        if name == "main" and role == "set":
            mounts, paths, view = main_mounts, main_paths, main_view
        else:
            root = folder / "ctr" / name / "fs"
            mounts = _mounts(volumes_only, body, folder, layout, fs_root=root)
            if role != "set" and body.get("mirrorVolumeMounts"):
                mounts = [*mirrored, *mounts]
            paths = PathMap(root)
            for mount in mounts:
                paths.mount(mount.path, mount.local)
            if views:
                from .sandbox import plan_sandbox
                from .views import plan_view

                view = plan_view(root.parent, mounts, [], str(body.get("workingDir") or ""),
                                 folder / f"{name}.termination-log", None,
                                 plan_sandbox(body, annotations, f"{role} container {name}"))
        # in its image or its view: as written
        text = PathMap(folder / "fs") if images or views else paths
        environment = _environment(body, text, layout.objects)
        in_image = None
        if images:
            from .images.spec import image_spec

            inputs = _input_paths(tmpl) if (role == "set" and name == "main") or (
                role != "set" and body.get("mirrorVolumeMounts")) else []
            in_image = image_spec(body, pod_security, inputs=inputs)
        return Container(
            name=name, role=role,
            argv=[text.rewrite(str(a)) for a in body.get("command") or []]
            + [text.rewrite(as_text(a)) for a in body.get("args") or []],
            env=environment.env,
            cwd=paths.local(body["workingDir"]) if body.get("workingDir") and not views
            else folder,
            folder=folder, mounts=tuple(mounts),
            from_environment=tuple(environment.from_environment),
            dependencies=tuple(str(d) for d in body.get("dependencies") or []),
            in_image=in_image, view=view)

    found = [plan(c, "init") for c in tmpl.get("initContainers") or []]
    container_set = tmpl.get("containerSet")
    if container_set is not None:
        shared = list(container_set.get("volumeMounts") or [])
        for node in container_set.get("containers") or []:
            body = main if node.get("name") == "main" else \
                {**node, "volumeMounts": [*(node.get("volumeMounts") or []), *shared]}
            found.append(plan(body, "set"))
    found += [plan(c, "sidecar") for c in tmpl.get("sidecars") or []]
    return found


class _Environment(NamedTuple):
    env: dict[str, str]
    secret: dict[str, str]
    from_environment: list[str]


def _environment(body: dict, paths: PathMap, objects: ObjectLibrary | None) -> _Environment:
    """A container's variables; those from Secrets and ConfigMaps (``envFrom``, ``valueFrom``)
    as the kubelet resolves them (``k8s_objects``), the literal ones with their paths
    rewritten."""
    if body.get("envFrom") or any("valueFrom" in item for item in body.get("env") or []):
        from .k8s_objects import container_env  # only a pod that reads objects pays for it

        return _Environment(*container_env(body, objects, paths.rewrite))
    env = {item["name"]: paths.rewrite(as_text(item.get("value", "")))
           for item in body.get("env") or []}
    return _Environment(env, {}, [])


def _projections(tmpl: dict, mount_lists: list, folder: Path, layout: Layout
                 ) -> tuple[list[Projection], set[str]]:
    """The pod's secret and configMap volumes' files, and the secret values among them."""
    used = [m.volume for mounts in mount_lists for m in mounts
            if m.kind.startswith(("secret ", "configMap "))]
    if not used:
        return [], set()
    from .k8s_objects import project_volumes

    projections = project_volumes([*layout.volumes, *(tmpl.get("volumes") or [])], used,
                                  folder, layout.objects)
    return projections, _secret_forms(content.decode("utf-8", "surrogateescape")
                                      for p in projections if p.secret
                                      for _, content, _ in p.files)


def _secret_forms(values: Iterable[str]) -> set[str]:
    """What to mask in a pod's output for these secret values (``k8s_objects.masked_forms``)."""
    found: set[str] = set()
    for value in values:
        from .k8s_objects import masked_forms  # only a pod with secrets pays for it

        found |= masked_forms(value)
    return found


def _volume_folders(volumes: list | tuple, folder: Path, home: Path
                    ) -> dict[str, tuple[Path, str]]:
    """Volume name -> (its local folder, what it is)."""
    found: dict[str, tuple[Path, str]] = {}
    for volume in volumes or []:
        if "persistentVolumeClaim" in volume:
            claim = volume["persistentVolumeClaim"]["claimName"]
            found[volume["name"]] = (home / "volumes" / claim, f"persistentVolumeClaim {claim}")
        elif "emptyDir" in volume:
            found[volume["name"]] = (folder / "volumes" / volume["name"], "emptyDir")
        elif "secret" in volume or "configMap" in volume:
            from .k8s_objects import volume_folder

            place = volume_folder(volume, folder)
            if place is not None:
                found[volume["name"]] = place
    return found


def _mounts(tmpl: dict, body: dict, folder: Path, layout: Layout,
            fs_root: Path | None = None) -> list[Mount]:
    # emptyDir volumes belong to one pod, so workflow-level ones are resolved per node too.
    volumes = {
        **{name: (path, "volumeClaimTemplate") for name, path in layout.claims},
        **_volume_folders(layout.volumes, folder, layout.home),
        **_volume_folders(tmpl.get("volumes") or [], folder, layout.home),
    }
    paths = PathMap(fs_root or folder / "fs")
    mounts: list[Mount] = []
    for index, mount in enumerate(body.get("volumeMounts") or []):
        if mount["name"] not in volumes:
            # workflowpod.go addVolumeReferences, on the substituted name (it may come from a
            # parameter: validate.go does not check mounts' names).
            raise NodeError(f"volume '{mount['name']}' not found in workflow spec")
        local, kind = volumes[mount["name"]]
        if mount.get("subPath"):
            # checked once substituted (a parameter may hold ../..), as Kubernetes checks the
            # pod; and resolved inside the volume, as a container runtime does
            sub_path, field = str(mount["subPath"]), f"volumeMounts[{index}].subPath"
            problem = sub_path_problem(sub_path)
            if problem is not None:
                raise NodeError(f"{field}: {problem}")
            target = inside(local, sub_path)
            if target is None:
                raise NodeError(f"{field}: {sub_path!r} leaves volume {mount['name']!r} through "
                                "a link on it")
            local = target
        paths.mount(mount["mountPath"], local)
        mounts.append(Mount(mount["mountPath"], local, mount["name"], kind,
                            # outside the node folder: shared, but for a secret (its tmpfs)
                            shared=not local.is_relative_to(folder) and
                            not kind.startswith("secret "),
                            # Kubernetes mounts secret and configMap volumes read-only
                            read_only=bool(mount.get("readOnly"))
                            or kind.startswith(("secret ", "configMap "))))
    outputs = tmpl.get("outputs") or {}
    declared = [(p.get("valueFrom") or {}).get("path") for p in outputs.get("parameters") or []]
    declared += [a.get("path") for a in outputs.get("artifacts") or []]
    declared += [a.get("path") for a in (tmpl.get("inputs") or {}).get("artifacts") or []]
    declared.append(body.get("workingDir"))
    for path in declared:
        # Any other absolute path the template declares gets a place in the node's own fs/.
        if path and str(path).startswith("/") and not paths.covers(str(path)):
            paths.private(str(path))
            mounts.append(Mount(str(path), paths.local(str(path))))
    return mounts


def _input_artifacts(tmpl: dict, paths: PathMap, art_args: dict[str, dict], home: Path
                     ) -> list[InputArtifact]:
    """Each input artifact as the executor loads it. An argument replaces the template's
    artifact but for its path and mode (workflow/common/util.go ProcessArgs); a ``from`` is a
    stored object's path, whose archive is detected (the output's ``archive`` went with it in
    Argo: a tarball unless ``none``)."""
    found = []
    for art in (tmpl.get("inputs") or {}).get("artifacts") or []:
        name = art["name"]
        source = art_args.get(name) or art
        target = paths.local(art["path"])
        optional = bool(art.get("optional") or source.get("optional"))
        mode = int(art["mode"]) if art.get("mode") is not None else None
        archive = source.get("archive") or {}
        kind = "none" if "none" in archive else "tar" if "tar" in archive else None
        # Put inside its volume or the pod's own files (``inside``), made first in the node
        # folder, the runner's own.
        place: dict[str, Any] = {
            "path": str(art["path"]), "root": paths.root_of(art["path"]),
            "staging": paths.fs_root.parent, "repository": repository_root(home)}
        common: dict[str, Any] = {"optional": optional, "mode": mode, **place}
        if "raw" in source:
            found.append(InputArtifact(name, target, raw=str(source["raw"].get("data", "")),
                                       mode=mode, **place))
        elif isinstance(source.get("http"), dict):
            headers = tuple((str(h.get("name", "")), str(h.get("value", "")))
                            for h in source["http"].get("headers") or [])
            found.append(InputArtifact(name, target, url=str(source["http"].get("url", "")),
                                       headers=headers, archive=kind, **common))
        elif isinstance(source.get("git"), dict):
            found.append(InputArtifact(name, target, git=source["git"], **common))
        elif (stored := input_source({**source, "name": name}, home)) is not None:
            found.append(InputArtifact(name, target, source=stored,
                                       archive=None if source.get("from") else kind, **common))
        elif not optional:
            raise NodeError(f"input artifact {name!r} was not supplied")
    return found
