"""Secrets and ConfigMaps for a local run: where they are found, how a pod reads them, and how
a secret's value is kept out of everything the runner writes.

On a cluster a pod reads these objects from its namespace; locally they are manifests. The
``ObjectLibrary`` finds them as the template library and the semaphores find theirs: in the
manifest itself, in the other ``*.yaml``/``*.yml`` files of its folder, in each ``--templates``
folder and in each ``--objects`` folder (the harness: ``objects=``), by kind and name. A name
given twice is an error naming both files, when a pod asks for it. Files are read only when a
workflow names an object, and only those that mention ``Secret`` or ``ConfigMap``.

A pod reads them with the kubelet's semantics (``pkg/kubelet/kubelet_pods.go``
``makeEnvironmentVariables``; the ``secret`` and ``configMap`` volume plugins):

- ``envFrom`` first, in order (a later source overrides an earlier one; ``prefix`` + each key;
  a key that is not a valid variable name is skipped), then ``env``, in order, overriding;
- ``env[].valueFrom.secretKeyRef`` / ``configMapKeyRef``: a missing object or key keeps the
  container from starting (``CreateContainerConfigError``) unless the reference is
  ``optional: true``, when the variable is simply not set. Argo shows such a pod Pending until a
  deadline; locally the node ends ``Error`` at once with the kubelet's message and, for a
  missing object, where it was looked for;
- volumes: every key a file (``items`` pick keys and name their paths), mode ``defaultMode``
  (0644) or the item's ``mode``; a missing object or item key fails the pod unless optional;
  an optional missing object is an empty folder. The folder is mounted read-only;
- Secret ``data`` is base64, ``stringData`` plain text and wins; ConfigMap ``data`` is text,
  ``binaryData`` base64.

Before manifests, an optional ``secretKeyRef`` was filled from the runner's own environment.
That stays for an optional reference that no manifest provides (``ContainerEnv.
from_environment``; the run names each such variable once, never its value); a required one
with no manifest fails the pod as above.

Secrecy, a local addition (Kubernetes does not mask logs): every value of a Secret the workflow
names, and every variable taken from the environment for an optional secret, is replaced by
``***`` in the pods' logs and the console (``local_process``), in ``status.json``, ``-o json``
and the harness's view (``run_folder``), and shown as ``<secret NAME/KEY>`` by the dry run. A
secret volume's files are written to a tmpfs (``/dev/shm``), never to the disk, and removed
when the pod ends.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from ..errors import NodeError

SECRET = "Secret"
CONFIG_MAP = "ConfigMap"
KINDS = (SECRET, CONFIG_MAP)
DEFAULT_MODE = 0o644  # the volumes' defaultMode (420 in JSON)
MASK = "***"
# Shorter values are not masked: masking "1" or "on" would garble every log that prints them.
MIN_MASKED = 4
SHM = Path("/dev/shm")


class KubeObject(NamedTuple):
    """A Secret or ConfigMap: its keys and their values, decoded to bytes."""

    kind: str
    name: str
    namespace: str
    data: dict[str, bytes]
    source: str  # the file (or "the objects given") it was read from
    # A ConfigMap's binaryData keys: files in a volume, never variables (the kubelet reads
    # only ``data`` for the environment).
    binary: frozenset[str] = frozenset()

    def text(self) -> dict[str, bytes]:
        """The keys a container's environment may read."""
        return {k: v for k, v in self.data.items() if k not in self.binary}

    @property
    def ref(self) -> str:
        """``namespace/name``, as the kubelet names an object in its messages."""
        return f"{self.namespace}/{self.name}"


class ObjectLibrary:
    """Secrets and ConfigMaps by kind and name, read from manifests.

    ``folders``: where to look (``*.yaml`` and ``*.yml``, not recursively); ``documents``:
    (document, source) pairs already at hand (the manifest's own, a test's dicts);
    ``own_file``: the manifest, whose documents ``documents`` already holds."""

    def __init__(self, folders: Sequence[Path] = (), documents: Iterable[tuple[dict, str]] = (),
                 own_file: Path | None = None) -> None:
        self.folders = list(dict.fromkeys(Path(f) for f in folders))
        self._documents = [(d, s) for d, s in documents if d.get("kind") in KINDS]
        self._own_file = own_file
        self._index: dict[tuple[str, str], list[tuple[dict, str]]] | None = None

    def _load(self) -> dict[tuple[str, str], list[tuple[dict, str]]]:
        if self._index is not None:
            return self._index
        from ..manifest.library import folder_documents

        found = list(self._documents)
        found += [(d, source) for d, source in folder_documents(self.folders, KINDS,
                                                                self._own_file)
                  if d.get("kind") in KINDS]
        index: dict[tuple[str, str], list[tuple[dict, str]]] = {}
        for doc, source in found:
            name = str((doc.get("metadata") or {}).get("name") or "")
            index.setdefault((doc["kind"], name), []).append((doc, source))
        self._index = index
        return index

    def find(self, kind: str, name: str) -> KubeObject | None:
        """The object, or None; ``NodeError`` when it is defined twice or cannot be decoded."""
        hits = self._load().get((kind, str(name)), [])
        if len(hits) > 1:
            sources = " and ".join(source for _, source in hits)
            raise NodeError(f"{kind} {name!r} is defined twice: in {sources}")
        if not hits:
            return None
        return _decode(*hits[0])

    def objects(self, kind: str) -> list[KubeObject]:
        """Every readable object of a kind (the first of a name given twice), by name."""
        found = []
        for (k, _), hits in sorted(self._load().items()):
            if k == kind:
                with contextlib.suppress(NodeError):  # a broken one fails the pod reading it
                    found.append(_decode(*hits[0]))
        return found

    def searched(self) -> str:
        places = [f"{folder}/" for folder in self.folders]
        if self._documents or self._own_file is not None:
            places.insert(0, "the manifest" if self._own_file else "the objects given")
        return "looked in " + (", ".join(places) if places else "nothing")


def manifest_objects(manifest: Path | None, folders: Iterable[Path] = ()) -> ObjectLibrary:
    """The objects of a run from a file: those of the manifest's folder (the manifest itself
    among them) and of ``folders`` (``--templates``, ``--objects``)."""
    places = [manifest.parent] if manifest is not None else []
    return ObjectLibrary([*places, *folders])


def _decode(doc: dict, source: str) -> KubeObject:
    import base64
    import binascii

    meta = doc.get("metadata") or {}
    name = str(meta.get("name") or "")
    data: dict[str, bytes] = {}
    binary, text = ("data", "stringData") if doc["kind"] == SECRET else ("binaryData", "data")
    for key, value in (doc.get(binary) or {}).items():
        try:
            data[str(key)] = base64.b64decode(_scalar(value), validate=True)
        except (binascii.Error, ValueError):
            raise NodeError(f"{doc['kind']} {name!r} ({source}): {binary}.{key} is not "
                            "base64") from None
    for key, value in (doc.get(text) or {}).items():
        data[str(key)] = _scalar(value).encode()  # stringData wins over data (Kubernetes)
    binary_keys = frozenset(map(str, doc.get("binaryData") or {})) \
        if doc["kind"] == CONFIG_MAP else frozenset()
    return KubeObject(doc["kind"], name, str(meta.get("namespace") or "default"), data, source,
                      binary_keys)


def _scalar(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else str(value)


def _text(value: bytes) -> str:
    # An environment variable holds the bytes as they are (os.fsencode gives them back).
    return value.decode("utf-8", "surrogateescape")


def _variable(value: bytes, ref: str) -> str:
    if b"\0" in value:  # no process can be given it
        raise NodeError(f"CreateContainerConfigError: {ref} holds a NUL byte: it cannot be an "
                        "environment variable")
    return _text(value)


# ----------------------------------------------------------------------------------- lookups


def _lookup(objects: ObjectLibrary | None, kind: str, name: str, optional: bool,
            reason: str) -> KubeObject | None:
    """The object a reference names; None when it is missing and optional; ``NodeError`` with
    the kubelet's words (``reason``: how the pod fails) when it is missing and required."""
    found = objects.find(kind, name) if objects is not None else None
    if found is None and not optional:
        where = objects.searched() if objects is not None else "no manifests given"
        raise NodeError(f'{reason}: {kind.lower()} "{name}" not found ({where}; give it as a '
                        f"{kind} manifest beside the workflow or in --objects DIR)")
    return found


def _missing_key(kind: str, key: str, found: KubeObject) -> NodeError:
    return NodeError(f"CreateContainerConfigError: couldn't find key {key} in {kind} "
                     f"{found.ref}")


class ContainerEnv(NamedTuple):
    """A container's environment as the kubelet builds it from ``envFrom`` and ``env``."""

    env: dict[str, str]
    secret: dict[str, str]  # variable -> "NAME/KEY" of the Secret it comes from
    # Optional secretKeyRefs that no manifest provides: this machine's environment fills them.
    from_environment: list[str]


def valid_env_name(name: str) -> bool:
    """Kubernetes 1.34's rule (RelaxedEnvironmentVariableValidation): printable ASCII but ``=``."""
    return bool(name) and all(" " <= c <= "~" and c != "=" for c in name)


def container_env(body: dict, objects: ObjectLibrary | None,
                  rewrite: Callable[[str], str]) -> ContainerEnv:
    """``rewrite``: what a literal ``value`` goes through (container paths to local ones); a
    value read from an object is used as it is. ``NodeError`` when the container cannot start."""
    from ..expressions.substitution import as_text

    env: dict[str, str] = {}
    secret: dict[str, str] = {}
    from_environment: list[str] = []
    for source in body.get("envFrom") or []:
        kind = SECRET if "secretRef" in source else CONFIG_MAP
        ref = source.get("secretRef" if kind == SECRET else "configMapRef") or {}
        found = _lookup(objects, kind, str(ref.get("name") or ""), bool(ref.get("optional")),
                        "CreateContainerConfigError")
        for key, value in (found.text() if found is not None else {}).items():
            name = f"{source.get('prefix') or ''}{key}"
            if not valid_env_name(name):
                continue  # the kubelet skips it (an InvalidEnvironmentVariableNames event)
            env[name] = _variable(value, f"{kind} {found.ref} key {key}")
            _mark(secret, name, f"{found.name}/{key}" if kind == SECRET else None)
    for item in body.get("env") or []:
        name = str(item["name"])
        source = item.get("valueFrom")
        if source is None:
            env[name] = rewrite(as_text(item.get("value", "")))
            _mark(secret, name, None)
            continue
        kind = SECRET if "secretKeyRef" in source else CONFIG_MAP
        ref = source.get("secretKeyRef" if kind == SECRET else "configMapKeyRef") or {}
        ref_name, key, optional = str(ref.get("name") or ""), str(ref.get("key") or ""), \
            bool(ref.get("optional"))
        found = _lookup(objects, kind, ref_name, optional, "CreateContainerConfigError")
        if found is None:  # optional, and no manifest has it
            if kind == SECRET:
                from_environment.append(name)
            continue
        if key not in found.text():
            if optional:
                continue
            raise _missing_key(kind, key, found)
        env[name] = _variable(found.data[key], f"{kind} {found.ref} key {key}")
        _mark(secret, name, f"{found.name}/{key}" if kind == SECRET else None)
    return ContainerEnv(env, secret, from_environment)


def _mark(secret: dict[str, str], name: str, ref: str | None) -> None:
    if ref is None:
        secret.pop(name, None)
    else:
        secret[name] = ref


def secret_key(objects: ObjectLibrary | None, ref: dict, where: str) -> str:
    """The value a ``secretKeyRef`` outside a container names (an http template's header);
    ``NodeError`` when it is missing (Argo's agent fails the request)."""
    name, key = str(ref.get("name") or ""), str(ref.get("key") or "")
    found = _lookup(objects, SECRET, name, False, where)
    assert found is not None
    if key not in found.data:
        raise NodeError(f"{where}: couldn't find key {key} in Secret {found.ref}")
    return _text(found.data[key])


# ----------------------------------------------------------------------------------- volumes


class Projection(NamedTuple):
    """A secret or configMap volume's files, written before the pod starts."""

    folder: Path
    files: tuple[tuple[str, bytes, int], ...]  # (relative path, content, mode)
    secret: bool


def volume_folder(volume: dict, folder: Path) -> tuple[Path, str] | None:
    """Where a pod's secret or configMap volume lives, and what it is; None for other kinds.
    ``folder``: the node folder (``<run>/nodes/<node>``). A secret's is on a tmpfs."""
    if isinstance(volume.get("secret"), dict):
        name = volume["secret"].get("secretName")
        return secret_root(folder.parent.parent) / folder.name / volume["name"], f"secret {name}"
    if isinstance(volume.get("configMap"), dict):
        name = volume["configMap"].get("name")
        return folder / "volumes" / volume["name"], f"configMap {name}"
    return None


def secret_root(run_dir: Path) -> Path:
    """The run's folder for secret volumes: on the tmpfs ``/dev/shm`` where there is one (the
    files never reach a disk), named after the run folder so that a runner killed outright
    leaves a folder the next run can find and remove."""
    if not SHM.is_dir():
        return run_dir / "secrets"
    import hashlib  # only a run with secret volumes pays for it

    digest = hashlib.blake2b(str(run_dir.resolve()).encode(), digest_size=8).hexdigest()
    return SHM / f"sublimate-{digest}"


def project_volumes(volumes: Sequence[dict], used: Iterable[str], folder: Path,
                    objects: ObjectLibrary | None) -> list[Projection]:
    """The files of each secret/configMap volume the pod mounts (``used``: their names;
    ``volumes``: the workflow's then the template's declarations, the later winning)."""
    declared = {v.get("name"): v for v in volumes}
    found: list[Projection] = []
    for name in dict.fromkeys(used):
        volume = declared[name]
        place = volume_folder(volume, folder)
        if place is None:
            continue
        is_secret = "secret" in volume
        source = volume["secret" if is_secret else "configMap"]
        kind = SECRET if is_secret else CONFIG_MAP
        obj_name = str(source.get("secretName" if is_secret else "name") or "")
        reason = f"MountVolume.SetUp failed for volume {name!r}"
        obj = _lookup(objects, kind, obj_name, bool(source.get("optional")), reason)
        found.append(Projection(place[0], _files(obj, source, kind, reason), is_secret))
    return found


def _files(obj: KubeObject | None, source: dict, kind: str, reason: str
           ) -> tuple[tuple[str, bytes, int], ...]:
    if obj is None:
        return ()
    default = int(source["defaultMode"]) if source.get("defaultMode") is not None \
        else DEFAULT_MODE
    items = source.get("items")
    if not items:
        return tuple((key, value, default) for key, value in sorted(obj.data.items()))
    files = []
    for item in items:
        key, path = str(item.get("key") or ""), str(item.get("path") or "")
        if key not in obj.data:
            if source.get("optional"):
                continue
            word = "secret key" if kind == SECRET else "config key"
            raise NodeError(f"{reason}: {kind.lower()} references non-existent {word}: {key}")
        if not path or path.startswith("/") or ".." in path.split("/"):
            raise NodeError(f"{reason}: items path {path!r} must be relative and may not "
                            "contain '..'")
        mode = int(item["mode"]) if item.get("mode") is not None else default
        files.append((path, obj.data[key], mode))
    return tuple(files)


def write_projection(projection: Projection) -> None:
    """Write a volume's files (a secret's folder and its parents private to this user)."""
    import shutil

    if projection.secret:
        root = projection.folder.parent.parent
        root.mkdir(mode=0o700, exist_ok=True)
        projection.folder.parent.mkdir(mode=0o700, exist_ok=True)
    shutil.rmtree(projection.folder, ignore_errors=True)  # a retry's leftovers
    # A secret's folders are its user's alone, and its files keep only the owner's read (and
    # execute) bits of their mode: the volume is read-only in the pod, and nobody else on
    # this machine is its pod (0644, the default, is 0400 here).
    folder_mode = 0o700 if projection.secret else 0o755
    projection.folder.mkdir(mode=folder_mode, parents=True)
    for path, content, mode in projection.files:
        target = projection.folder / path
        target.parent.mkdir(mode=folder_mode, parents=True, exist_ok=True)
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(content)
        os.chmod(target, mode & 0o500 if projection.secret else mode)


def remove_projections(projections: Iterable[Projection]) -> None:
    """The pod has ended: its secret files go (a configMap's stay in the node folder)."""
    import shutil

    for projection in projections:
        if projection.secret:
            shutil.rmtree(projection.folder.parent, ignore_errors=True)


def remove_secret_root(run_dir: Path) -> None:
    """The run has ended (or its runner was killed): remove what its pods left on the tmpfs."""
    import shutil

    with contextlib.suppress(OSError):
        shutil.rmtree(secret_root(run_dir))


# ----------------------------------------------------------------------------------- masking


def referenced_secrets(spec: Any) -> set[str]:
    """The names of the Secrets a spec names literally (env, envFrom, volumes, http headers):
    their values are masked from the run's start, whichever pod prints them."""
    names: set[str] = set()
    if isinstance(spec, dict):
        for key, value in spec.items():
            if key in ("secretKeyRef", "secretRef") and isinstance(value, dict):
                names.add(str(value.get("name") or ""))
            elif key == "secret" and isinstance(value, dict) and "secretName" in value:
                names.add(str(value["secretName"]))
            else:
                names |= referenced_secrets(value)
    elif isinstance(spec, list):
        for item in spec:
            names |= referenced_secrets(item)
    return {name for name in names if name and "{{" not in name}


def masked_forms(value: str) -> set[str]:
    """What to mask for one secret value: the value, and each of its lines (a log is read line
    by line), whichever are long enough to mask safely."""
    forms = {value, value.strip(), *(line.strip() for line in value.splitlines())}
    return {form for form in forms if len(form) >= MIN_MASKED}


def secret_values(objects: ObjectLibrary | None, names: Iterable[str]) -> set[str]:
    """The masked forms of every value of the named Secrets that the library holds."""
    found: set[str] = set()
    for name in names:
        with contextlib.suppress(NodeError):  # a broken one fails the pod that reads it
            obj = objects.find(SECRET, name) if objects is not None else None
            for value in (obj.data.values() if obj is not None else ()):
                found |= masked_forms(_text(value))
    return found


def redact(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every secret replaced by ``***``, longest first."""
    for secret in sorted(secrets, key=len, reverse=True):
        if secret in text:
            text = text.replace(secret, MASK)
    return text


def redact_result(result: Any, secrets: Iterable[str]) -> Any:
    """A ``RunResult`` as shown and written (``status.json``, ``-o json``, the harness): every
    text a pod could have put a secret in, masked; the run's own values stay as they are."""
    from dataclasses import replace

    def node(n: Any) -> Any:
        return replace(n, message=redact(n.message, secrets),
                       parameters={k: redact(v, secrets) for k, v in n.parameters.items()},
                       inputs={k: redact(v, secrets) for k, v in n.inputs.items()},
                       result=None if n.result is None else redact(n.result, secrets))

    return replace(result, message=redact(result.message, secrets),
                   nodes=[node(n) for n in result.nodes],
                   outputs={kind: {k: redact(v, secrets) for k, v in values.items()}
                            for kind, values in result.outputs.items()})
