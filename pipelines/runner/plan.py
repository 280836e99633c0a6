"""What a pod runs, as plain data: one container/script template invocation, fully resolved.

``plan_pod`` turns a template, its variables and the run's folder layout into a ``PodRequest``:
the command line with its ``{{...}}`` variables substituted and its container paths rewritten to
local folders (see ``paths``), the environment the template sets, the working directory, the
mounts, the input artifacts to place, the outputs to read back and the deadline. It reads and
writes nothing, so a dry run shows exactly what a run would start, and an executor gets all it
needs in one value (see ``executor``).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import NamedTuple

from sublimate.pipelines.argo_terms import NodeType

from .durations import parse_duration
from .errors import NodeError
from .manifest import CLUSTER_ONLY_FIELDS
from .paths import PathMap
from .run_folder import node_folder
from .substitution import Vars, as_text, substitute, substitute_text

# The small immutable records are NamedTuples rather than frozen dataclasses: every
# `sublimate run` defines them at start-up, and a NamedTuple costs a sixth as much to define.


class Layout(NamedTuple):
    """Where a run's files live: the run folder, the home of persistent volumes, and the
    volumes the workflow declares (``spec.volumes``, one folder per ``volumeClaimTemplates``)."""

    home: Path
    run_dir: Path
    volumes: tuple[dict, ...] = ()
    claims: tuple[tuple[str, Path], ...] = ()

    @classmethod
    def of(cls, home: Path, run_dir: Path, spec: dict) -> Layout:
        claims = tuple((c["metadata"]["name"], run_dir / "volumes" / c["metadata"]["name"])
                       for c in spec.get("volumeClaimTemplates") or [])
        return cls(home, run_dir, tuple(spec.get("volumes") or []), claims)


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


class InputArtifact(NamedTuple):
    """An input artifact to put at ``target`` before the pod starts: raw text or a stored copy."""

    name: str
    target: Path
    source: Path | None = None
    raw: str | None = None
    optional: bool = False


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
    # Variables the template takes from (optional) secrets: the local environment provides them.
    from_environment: list[str] = field(default_factory=list)
    inputs: list[InputArtifact] = field(default_factory=list)
    outputs: dict = field(default_factory=dict)  # the template's outputs section, resolved
    deadline_s: float | None = None  # the template's own activeDeadlineSeconds/timeout

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
        """What the local runner adds to every step's environment, after the template's."""
        return {
            "SUBLIMATE_LOCAL_RUN": "1",
            "SUBLIMATE_LOCAL_RUN_FOLDER": str(self.run_dir),
            # Where `sublimate run` was started: a step resolves a user's relative paths
            # (e.g. the train step's entrypoint=examples/x/train.py) from there, as on a laptop.
            "SUBLIMATE_LOCAL_CWD": os.getcwd(),
            "SUBLIMATE_TERMINATION_LOG": str(self.termination_log),
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
    return NodeType.POD


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


def plan_pod(template: dict, local: Vars, *, node_id: str, node_name: str, display_name: str,
             layout: Layout, art_args: dict[str, dict] | None = None) -> PodRequest:
    """Resolve a container/script template invocation; ``NodeError`` when it cannot be."""
    where = f"templates.{template['name']}"
    body_key = "script" if "script" in template else "container"
    # Cluster-only fields (metrics use Argo's {{duration}}/{{status}}, ...) are not ours to
    # resolve: they mean nothing locally.
    tmpl: dict = substitute({k: v for k, v in template.items()  # type: ignore[assignment]
                             if k != "name" and k not in CLUSTER_ONLY_FIELDS}, local, where)
    body = tmpl[body_key]
    folder = layout.run_dir / "nodes" / node_folder(display_name, node_id)
    mounts = _mounts(tmpl, body, folder, layout)
    paths = PathMap(folder / "fs")
    for mount in mounts:
        paths.mount(mount.path, mount.local)
    argv = [paths.rewrite(str(a)) for a in body["command"]]
    script = None
    if body_key == "script":
        script = paths.rewrite(str(body.get("source", "")))
        argv.append(str(folder / "script"))
    argv += [paths.rewrite(as_text(a)) for a in body.get("args") or []]
    env: dict[str, str] = {}
    from_environment: list[str] = []
    for item in body.get("env") or []:
        if "valueFrom" in item:
            from_environment.append(item["name"])  # an optional secret: ours, or nobody's
            continue
        env[item["name"]] = paths.rewrite(as_text(item.get("value", "")))
    return PodRequest(
        node_id=node_id,
        node_name=node_name,
        display_name=display_name,
        template=template["name"],
        argv=argv,
        env=env,
        cwd=paths.local(body["workingDir"]) if body.get("workingDir") else folder,
        folder=folder,
        run_dir=layout.run_dir,
        mounts=mounts,
        script=script,
        from_environment=from_environment,
        inputs=_input_artifacts(tmpl, paths, art_args or {}),
        outputs=tmpl.get("outputs") or {},
        deadline_s=template_deadline(template, local),
    )


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
    return found


def _mounts(tmpl: dict, body: dict, folder: Path, layout: Layout) -> list[Mount]:
    # emptyDir volumes belong to one pod, so workflow-level ones are resolved per node too.
    volumes = {
        **{name: (path, "volumeClaimTemplate") for name, path in layout.claims},
        **_volume_folders(layout.volumes, folder, layout.home),
        **_volume_folders(tmpl.get("volumes") or [], folder, layout.home),
    }
    paths = PathMap(folder / "fs")
    mounts: list[Mount] = []
    for mount in body.get("volumeMounts") or []:
        local, kind = volumes[mount["name"]]
        if mount.get("subPath"):
            local = local / mount["subPath"]
        paths.mount(mount["mountPath"], local)
        mounts.append(Mount(mount["mountPath"], local, mount["name"], kind,
                            shared=not local.is_relative_to(folder)))
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


def _input_artifacts(tmpl: dict, paths: PathMap, art_args: dict[str, dict]
                     ) -> list[InputArtifact]:
    found = []
    for art in (tmpl.get("inputs") or {}).get("artifacts") or []:
        name = art["name"]
        source = art_args.get(name) or art
        target = paths.local(art["path"])
        if "raw" in source:
            found.append(InputArtifact(name, target, raw=str(source["raw"].get("data", ""))))
        elif source.get("from"):
            found.append(InputArtifact(name, target, source=Path(source["from"]),
                                       optional=bool(art.get("optional"))))
        elif not art.get("optional"):
            raise NodeError(f"input artifact {name!r} was not supplied")
    return found
