"""Memoization: a template's ``memoize`` (``{key, maxAge, cache: {configMap: {name}}}``), as
Argo's controller does it (``workflow/controller/operator.go`` executeTemplate,
``workflow/controller/cache/``).

Before a memoized invocation runs (after its inputs are resolved and its synchronization lock is
held, as in executeTemplate), its ``key`` is looked up in the cache its ConfigMap names. A hit
(an entry younger than ``maxAge``; any entry when ``maxAge`` is empty) finishes the node
``Succeeded`` with the entry's outputs, without running it; a miss runs it, and on success only
its outputs are saved under the key (a pod's, a steps' or a DAG's, an http's; a suspend node
is never saved, as Argo saves none). Either way the node carries Argo's
``memoizationStatus: {hit, key, cacheName}``. A save that fails errors the node, as in Argo.

The ConfigMap stands as a folder, ``$SUBLIMATE_HOME/memo/<name>/``, one file per key holding
Argo's entry as its ConfigMap holds it (``cache.Entry``: ``nodeID``, ``outputs``,
``creationTimestamp``, ``lastHitTimestamp``), written whole under a temporary name and renamed
into place, so a reader never sees half an entry. Keys are checked as Argo checks them
(``cacheKeyRegex``: letters, digits and ``-``), so a key is always a plain file name.

Two local departures, each said in a note: an entry that cannot be read is a miss (Argo errors
the node on a malformed entry: here the run redoes the work and overwrites it), and an entry
whose outputs name what no longer exists locally (an artifact in the home's repository, or a
path on a persistentVolumeClaim volume the template mounts: a staged dataset someone removed)
is a miss, so that a hit never hands the next step a path to nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sublimate.pipelines.argo_terms import NodePhase, NodeType

from ..errors import NodeError
from ..expressions.substitution import Vars, as_text, substitute_text
from ..manifest.durations import parse_go_duration
from ..manifest.template_checks import key_problems, name_problem
from ..records.run_types import NodeResult, iso, now, parse_iso

if TYPE_CHECKING:
    from .context import RunContext

MEMO_FOLDER = "memo"


@dataclass
class Memo:
    """One invocation's memoize, substituted; ``done`` once the lookup finished the node (a
    hit, or an error)."""

    key: str
    cache_name: str
    max_age_s: float | None
    done: bool = False

    def status(self, hit: bool) -> dict:
        """Argo's ``MemoizationStatus``, as the node status carries it."""
        return {"hit": hit, "key": self.key, "cacheName": self.cache_name}


def memo_of(template: dict, local: Vars) -> Memo:
    """The template's ``memoize`` with its variables substituted (as executeTemplate's
    processed template holds it); ``NodeError`` naming the field for what cannot be used."""
    memoize = template["memoize"]
    where = f"templates.{template['name']}.memoize"
    key = substitute_text(as_text(memoize.get("key", "")), local, f"{where}.key")
    problems = key_problems(key)
    if problems:
        raise NodeError(f"{where}.key: {problems[0]}")
    name = substitute_text(as_text(((memoize.get("cache") or {}).get("configMap") or {})
                                   .get("name", "")), local, f"{where}.cache.configMap.name")
    if problem := name_problem(name):
        raise NodeError(f"{where}.cache.configMap.name: {problem}")
    max_age = substitute_text(as_text(memoize.get("maxAge") or ""), local, f"{where}.maxAge")
    age = None
    if max_age:  # operator.go: an empty maxAge never expires
        try:
            age = parse_go_duration(max_age)
        except ValueError as exc:
            raise NodeError(f"{where}.maxAge: {exc}") from None
    return Memo(key, name, age)


def entry_path(home: Path, memo: Memo) -> Path:
    return home / MEMO_FOLDER / memo.cache_name / memo.key


def read_entry(home: Path, memo: Memo) -> tuple[dict | None, str]:
    """The entry under the memo's key, or None; and why an entry that exists was not usable
    (unreadable, or older than ``maxAge``), for a note."""
    path = entry_path(home, memo)
    try:
        entry = json.loads(path.read_text())
        if not _well_formed(entry):
            raise ValueError("not a cache entry")
        created = parse_iso(entry["creationTimestamp"])
    except FileNotFoundError:
        return None, ""
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return None, f"cache entry {path} is unreadable ({exc}): treated as a miss"
    if not entry.get("nodeID"):  # cache.go Entry.Hit
        return None, ""
    if memo.max_age_s is not None and (now() - created).total_seconds() > memo.max_age_s:
        return None, ""  # GetOutputsWithMaxAge: expired, not a hit (Argo says nothing)
    return entry, ""


def _well_formed(entry: object) -> bool:
    """Whether ``entry`` has the shape of cache.Entry's JSON, to the depth it is read here."""
    if not isinstance(entry, dict) or not isinstance(entry.get("outputs") or {}, dict):
        return False
    outputs = entry.get("outputs") or {}
    return all(isinstance(outputs.get(kind) or [], list)
               and all(isinstance(item, dict) and item.get("name")
                       for item in outputs.get(kind) or [])
               for kind in ("parameters", "artifacts"))



def _stamp() -> str:
    # metav1.Time marshals RFC 3339 at whole seconds
    return iso(now().replace(microsecond=0)) or ""


def _write(path: Path, entry: dict) -> None:
    """Write ``entry`` whole at ``path``: a temporary file renamed over it (a key never starts
    with '.', so the temporary name is never a key)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.parent / f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
    try:
        temporary.write_text(json.dumps(entry, indent=1))
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def look_up(run: RunContext, template: dict, local: Vars, node: NodeResult,
            kind: NodeType) -> Memo:
    """Look the invocation up before it runs; on a hit the node is finished with the entry's
    outputs (``Memo.done``). A key, cache name or maxAge that cannot be used errors the node."""
    record = run.record
    try:
        memo = memo_of(template, local)
    except NodeError as exc:
        record.finish(node, NodePhase.ERROR, str(exc))
        return Memo("", "", None, done=True)
    home = run.layout.home
    entry, problem = read_entry(home, memo)
    if problem:
        record.note(f"memoize:{memo.cache_name}/{memo.key}", f"memoize: {problem}")
    if entry is not None:
        missing = _missing_output(run, template, entry["outputs"] or {})
        if missing:
            record.note(f"memoize:{memo.cache_name}/{memo.key}",
                        f"memoize: cache entry {memo.cache_name}/{memo.key} names {missing}, "
                        f"which no longer exists: {node.display_name} runs again")
            entry = None
    if entry is None:
        node.memoization = memo.status(False)
        return memo
    # cache.go load: a hit stamps the entry's lastHitTimestamp
    with contextlib.suppress(OSError):  # the hit stands without it: bookkeeping only
        _write(entry_path(home, memo), {**entry, "lastHitTimestamp": _stamp()})
    _restore(run, node, entry["outputs"] or {})
    if node.type == NodeType.RETRY:
        node.type = kind  # initializeCacheHitNode: the template's own node type, no retries
    node.memoization = memo.status(True)
    record.finish(node, NodePhase.SUCCEEDED)
    memo.done = True
    return memo


def save(run: RunContext, memo: Memo, template: dict, node: NodeResult, kind: NodeType
         ) -> None:
    """Save a succeeded node's outputs under the memo's key (operator.go podReconciliation,
    steps.go, dag.go: ``Save(key, node.ID, node.Outputs)``); a save that fails errors it."""
    if node.phase != NodePhase.SUCCEEDED or kind == NodeType.SUSPEND:
        return
    outputs: dict = {}
    declared = {p.get("name"): p
                for p in ((template.get("outputs") or {}).get("parameters") or [])}
    if node.parameters:
        outputs["parameters"] = [
            {"name": name, "value": value,
             **({"globalName": declared[name]["globalName"]}
                if (declared.get(name) or {}).get("globalName") else {})}
            for name, value in node.parameters.items()]
    if node.artifacts:
        outputs["artifacts"] = [{"name": name, "path": path}
                                for name, path in node.artifacts.items()]
    if node.result is not None:
        outputs["result"] = node.result
    if node.exit_code is not None:
        outputs["exitCode"] = str(node.exit_code)
    stamp = _stamp()
    entry = {"nodeID": node.id, "outputs": outputs, "creationTimestamp": stamp,
             "lastHitTimestamp": stamp}
    try:
        _write(entry_path(run.layout.home, memo), entry)
    except OSError as exc:
        run.record.finish(node, NodePhase.ERROR, f"could not save to the memoization cache "
                                                 f"{memo.cache_name}: {exc}")


def _restore(run: RunContext, node: NodeResult, outputs: dict) -> None:
    """The entry's outputs as the node's own; a ``globalName`` makes one the workflow's too, as
    addOutputsToGlobalScope does with a hit node's outputs."""
    from .outputs import set_artifact, set_param

    for param in outputs.get("parameters") or []:
        set_param(run, node, param, as_text(param.get("value", "")))
    for art in outputs.get("artifacts") or []:
        set_artifact(run, node, art, str(art.get("path", "")))
    if outputs.get("result") is not None:
        node.result = str(outputs["result"])
    if outputs.get("exitCode") not in (None, ""):
        with contextlib.suppress(ValueError):
            node.exit_code = int(outputs["exitCode"])


def _missing_output(run: RunContext, template: dict, outputs: dict) -> str:
    """The first output of an entry that names what no longer exists here: a stored artifact,
    or a path on a persistentVolumeClaim volume the template mounts; ``""`` if none."""
    for art in outputs.get("artifacts") or []:
        path = str(art.get("path", ""))
        if path.startswith("/") and not os.path.exists(path):
            return f"artifact {art.get('name')!r} ({path})"
    mounts = _claim_mounts(run, template)
    if not mounts:
        return ""
    for param in outputs.get("parameters") or []:
        value = as_text(param.get("value", "")).strip()
        for mount_path, local in mounts:
            if value == mount_path or value.startswith(mount_path.rstrip("/") + "/"):
                path = local / value[len(mount_path.rstrip("/")):].lstrip("/")
                if not os.path.exists(path):  # a dangling link too (NFS datasets)
                    return f"{value} (parameter {param.get('name')!r})"
    return ""


def _claim_mounts(run: RunContext, template: dict) -> list[tuple[str, Path]]:
    """(mount path, local folder) of each persistentVolumeClaim volume the template's
    container mounts: the volumes that outlive a run (``plan._volume_folders``)."""
    body = template.get("container") or template.get("script") or {}
    claims: dict[str, str] = {}
    volumes = [*run.layout.volumes, *(template.get("volumes") or [])]
    for volume in volumes:
        claim = (volume.get("persistentVolumeClaim") or {}).get("claimName")
        if claim:
            claims[volume.get("name")] = str(claim)
    found = []
    for mount in body.get("volumeMounts") or []:
        claim = claims.get(mount.get("name"))
        if claim is None or "{{" in claim or "{{" in str(mount.get("mountPath", "")):
            continue
        local = run.layout.home / "volumes" / claim
        if mount.get("subPath"):
            local = local / str(mount["subPath"])
        found.append((str(mount["mountPath"]), local))
    return found


def describe(template: dict, local: Vars, home: Path) -> str:
    """What a dry run says of a memoized invocation: where it would be looked up, and whether
    an entry is there now (read only: no hit is stamped)."""
    try:
        memo = memo_of(template, local)
    except NodeError as exc:
        return f"memoize: {exc}"
    head = f"memoized: looked up in cache {memo.cache_name} under key {memo.key}"
    entry, problem = read_entry(home, memo)
    if problem:
        return f"{head} ({problem})"
    if entry is None:
        return f"{head} (no entry: it runs, and its outputs are saved if it succeeds)"
    return (f"{head} (an entry of {entry['creationTimestamp']} is there: it would not run, "
            "unless what its outputs name is gone)")


__all__ = ["Memo", "describe", "look_up", "memo_of", "save"]
