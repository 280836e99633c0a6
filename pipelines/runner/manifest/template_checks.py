"""What the checker (``manifest.check_workflow``) says about a template's containers
(``containerSet``, ``initContainers``, sidecars) and about hooks (``hooks``, ``onExit``): the
rules of Argo's validation that the local runner needs, and what it cannot run.

Plain checks on the manifest's dicts: nothing here runs anything (``container_set`` runs the
containers, ``hooks`` the hooks), so the checker never imports an executor or the engine.
"""

from __future__ import annotations

import re

from sublimate.pipelines.argo_terms import (
    container_setting_problems,
    object_name_problem,
    sub_path_problem,
)

from ..expressions.conditions import ExpressionError

EXIT = "exit"  # wfv1.ExitLifecycleEvent: the hook that runs when its node (or the workflow) ends

# Why a container without a command is refused in process mode: in container mode
# (``images``) the image's entrypoint stands in for it, and ``check_workflow`` lets it be.
COMMAND_REQUIRED = "command: required by the local runner (the image's entrypoint is unknown " \
    "locally)"


def mount_problems(mount: object, where: str) -> list[str]:
    """What Kubernetes refuses in a volumeMount written out in the manifest (its ``subPath``;
    one from a parameter is checked once substituted, when the pod is planned)."""
    if not isinstance(mount, dict) or not mount.get("subPath") or "{{" in str(mount["subPath"]):
        return []
    problem = sub_path_problem(str(mount["subPath"]))
    return [f"{where}.subPath: {problem}"] if problem is not None else []


def container_problems(template: dict, path: str, volumes: set[str]) -> list[str]:
    """What the checker says about a template's containerSet, initContainers and sidecars
    (``workflow/validate/validate.go`` and ``ContainerSetTemplate.Validate``)."""
    problems: list[str] = []
    groups: list[tuple[str, list]] = []
    container_set = template.get("containerSet")
    if container_set is not None:
        if not isinstance(container_set, dict):
            return [f"{path}.containerSet: expected a mapping"]
        members = [c for c in container_set.get("containers") or [] if isinstance(c, dict)]
        if not members:
            problems.append(f"{path}.containerSet.containers: must have at least one container")
        names = [c.get("name") for c in members]
        for j, container in enumerate(members):
            for dependency in container.get("dependencies") or []:
                if dependency not in names:
                    problems.append(f"{path}.containerSet.containers[{j}].dependencies: "
                                    f"{dependency!r} is not a container of the set")
        if _cyclic({c.get("name"): list(c.get("dependencies") or []) for c in members}):
            problems.append(f"{path}.containerSet.containers: dependency cycle")
        inputs = (template.get("inputs") or {}).get("artifacts")
        outputs = template.get("outputs") or {}
        if (inputs or outputs.get("parameters") or outputs.get("artifacts")) \
                and "main" not in names:
            problems.append(f'{path}.containerSet.containers: must have a container named '
                            '"main" for input or output')
        problems += volume_mount_problems(container_set, f"{path}.containerSet", volumes)
        retries = (container_set.get("retryStrategy") or {}).get("retries")
        if retries is not None and "{{" not in str(retries):
            try:
                if int(str(retries)) < 1:
                    problems.append(f"{path}.containerSet.retryStrategy.retries: {retries} "
                                    "would never run the containers (the emissary makes "
                                    "`retries` attempts in all)")
            except ValueError:
                problems.append(f"{path}.containerSet.retryStrategy.retries: {retries!r} is "
                                "not an integer")
        groups.append(("containerSet.containers", members))
    for key in ("initContainers", "sidecars"):
        if template.get(key) and not any(k in template for k in
                                         ("container", "script", "containerSet")):
            problems.append(f"{path}.{key}: only a container, script or containerSet "
                            "template runs a pod")
        groups.append((key, [c for c in template.get(key) or [] if isinstance(c, dict)]))
    seen: set[str] = set()
    for key, containers in groups:
        for j, container in enumerate(containers):
            where = f"{path}.{key}[{j}]"
            name = container.get("name")
            if not name:
                problems.append(f"{where}.name: missing")
            elif name in seen or name in ("wait", "init") or \
                    (name == "main" and key != "containerSet.containers"):
                problems.append(f"{where}.name: {name!r} is taken (container names are "
                                "unique in a pod; main, init and wait are Argo's)")
            seen.add(name)
            problems += container_body_problems(container, where, volumes)
    return problems


def container_body_problems(container: dict, where: str, volumes: set[str]) -> list[str]:
    """A container's (or a script's) command and volume mounts, ``where`` naming it."""
    problems = []
    if not container.get("command"):
        problems.append(f"{where}.{COMMAND_REQUIRED}")
    elif not isinstance(container["command"], list):
        problems.append(f"{where}.command: expected a list")
    problems += [f"{where}.{field}: {problem}" for field, problem in
                 container_setting_problems(container)]
    return problems + volume_mount_problems(container, where, volumes)


def volume_mount_problems(holder: dict, where: str, volumes: set[str]) -> list[str]:
    """``holder``'s ``volumeMounts``: each names a declared volume (a name from a parameter is
    looked up once substituted, in the plan, as Argo does) and has a sound path and subPath."""
    problems = []
    for j, mount in enumerate(holder.get("volumeMounts") or []):
        if isinstance(mount, dict) and mount.get("name") not in volumes \
                and "{{" not in str(mount.get("name")):
            problems.append(f"{where}.volumeMounts[{j}].name: volume {mount.get('name')!r} "
                            "is not declared")
        problems += mount_problems(mount, f"{where}.volumeMounts[{j}]")
    return problems


def kind_problems(template: dict, path: str) -> list[str]:
    """What Argo's validation refuses, and what does not parse, in the template kinds that run
    no command of the template's own (``suspend``, ``data``, ``http``), a daemon, and output
    parameters (validate.go ``validateOutputParameter``)."""
    problems: list[str] = []
    suspend = template.get("suspend")
    if isinstance(suspend, dict) and suspend.get("duration") not in (None, "") \
            and "{{" not in str(suspend["duration"]):
        from .durations import parse_duration

        try:
            parse_duration(suspend["duration"])
        except ValueError as exc:
            problems.append(f"{path}.suspend.duration: {exc}")
    if template.get("daemon") not in (None, False, "false") and not any(
            key in template for key in ("container", "script", "containerSet")):
        problems.append(f"{path}.daemon: only a container, script or containerSet template "
                        "runs a pod that can serve as a daemon")
    expressions: list[tuple[str, object]] = []
    data = template.get("data")
    if isinstance(data, dict):
        if not isinstance((data.get("source") or {}).get("artifactPaths"), dict):
            problems.append(f"{path}.data.source.artifactPaths: required (the only data source)")
        expressions += [(f"{path}.data.transformation[{i}].expression", step.get("expression"))
                        for i, step in enumerate(data.get("transformation") or [])
                        if isinstance(step, dict)]
    http = template.get("http")
    if isinstance(http, dict):
        if not http.get("url"):
            problems.append(f"{path}.http.url: required")
        if http.get("successCondition"):
            expressions.append((f"{path}.http.successCondition", http["successCondition"]))
    for where, source in expressions:
        if "{{" in str(source):
            continue  # parsed once substituted
        from ..expressions.expr_lang import parse  # only a data or http template loads lark

        try:
            parse(str(source))
        except ExpressionError as exc:
            problems.append(f"{where}: {exc}")
    outputs = template.get("outputs") if isinstance(template.get("outputs"), dict) else {}
    for j, param in enumerate(outputs.get("parameters") or []):
        if isinstance(param, dict) and "value" in param and "valueFrom" in param:
            problems.append(f"{path}.outputs.parameters[{j}]: templates.{template.get('name')}"
                            f".outputs.parameters.{param.get('name')} has both valueFrom and "
                            "value specified, choose one")
    return problems


def _cyclic(graph: dict) -> bool:
    state: dict = {}

    def visit(name: object) -> bool:
        if state.get(name) == 1:
            return True
        if state.get(name) == 2 or name not in graph:
            return False
        state[name] = 1
        if any(visit(d) for d in graph[name]):
            return True
        state[name] = 2
        return False

    return any(visit(name) for name in graph)


def hook_problems(holder: dict, path: str, names: set, looped: bool = False) -> list[str]:
    """What the local runner cannot run in a spec's, step's or task's ``hooks``/``onExit``."""
    problems: list[str] = []
    hooks = holder.get("hooks")
    if looped and (hooks or holder.get("onExit")):
        field = "hooks" if hooks else "onExit"
        problems.append(f"{path}.{field}: hooks and onExit on a looped step or task are not "
                        "supported by the local runner")
    if holder.get("onExit") and holder["onExit"] not in names:
        problems.append(f"{path}.onExit: template {holder['onExit']!r} not found")
    if hooks is None:
        return problems
    if not isinstance(hooks, dict):
        return [*problems, f"{path}.hooks: expected a mapping of hook names to hooks"]
    if holder.get("onExit") and EXIT in hooks:
        problems.append(f"{path}: use either onExit or hooks.exit, not both (Argo runs onExit "
                        "and ignores hooks.exit)")
    for name, hook in hooks.items():
        where = f"{path}.hooks.{name}"
        if not isinstance(hook, dict):
            problems.append(f"{where}: expected a mapping")
            continue
        for key in hook:
            if key == "templateRef":
                problems.append(f"{where}.templateRef: templateRef in a hook is not supported "
                                "by the local runner (use template)")
            elif key not in ("template", "arguments", "expression"):
                problems.append(f"{where}.{key}: field is not supported by the local runner")
        if "template" in hook and hook["template"] not in names:
            problems.append(f"{where}.template: template {hook['template']!r} not found")
        elif "template" not in hook and "templateRef" not in hook:
            problems.append(f"{where}.template: missing")
        args = hook.get("arguments") or {}
        if not isinstance(args, dict) or set(args) - {"parameters", "artifacts"}:
            problems.append(f"{where}.arguments: only parameters and artifacts are supported")
        expression = hook.get("expression")
        if name != EXIT and not expression:
            problems.append(f"{where}.expression: required for a hook not named exit "
                            "(Argo: Expression required)")
        if expression:
            from ..expressions.expr_lang import parse  # only a hook with an expression loads lark

            try:
                parse(str(expression))
            except ExpressionError as exc:
                problems.append(f"{where}.expression: {exc}")
    return problems


# cache.go cacheKeyRegex; 253 is a ConfigMap data key's limit (Kubernetes refuses a longer one
# on the cache's update), which also keeps a key a legal file name.
KEY_PATTERN = re.compile(r"[a-zA-Z0-9][-a-zA-Z0-9]*")
MAX_KEY = 253


def key_problems(key: str) -> list[str]:
    """What makes ``key`` unusable as a memoization key (cache.go: "invalid cache key")."""
    if not KEY_PATTERN.fullmatch(key):
        return [f"invalid cache key: {key} (letters, digits and '-', starting with a letter "
                "or digit)"]
    if len(key) > MAX_KEY:
        return [f"invalid cache key: longer than {MAX_KEY} characters (a ConfigMap key)"]
    return []


def name_problem(name: str) -> str:
    """Why ``name`` cannot name the ConfigMap of a memoization cache; ``""`` if it can: an
    object name as Kubernetes takes one (``argo_terms``; never "." or "..", so a plain folder
    name)."""
    if object_name_problem(name) is not None:
        return f"{name!r} is not a ConfigMap name (lower-case letters, digits, '-' and '.')"
    return ""


def memoize_problems(memoize: object, path: str) -> list[str]:
    """What is wrong with a template's ``memoize`` as written (the parts without variables;
    ``templates/memoize`` checks the rest once substituted). Argo's validate.go checks none
    of it: its controller errors the node when it looks the key up."""
    where = f"{path}.memoize"
    if not isinstance(memoize, dict):
        return [f"{where}: expected a mapping"]
    problems = []
    if not memoize.get("key"):
        problems.append(f"{where}.key: missing")
    else:
        key = str(memoize["key"])
        if "{{" not in key:
            problems += [f"{where}.key: {p}" for p in key_problems(key)]
    name = ((memoize.get("cache") or {}).get("configMap") or {}).get("name")
    if not name:
        problems.append(f"{where}.cache.configMap.name: missing")
    elif "{{" not in str(name) and (problem := name_problem(str(name))):
        problems.append(f"{where}.cache.configMap.name: {problem}")
    max_age = memoize.get("maxAge")
    if max_age not in (None, "") and "{{" not in str(max_age):
        from .durations import parse_go_duration

        try:
            parse_go_duration(max_age)
        except ValueError as exc:
            problems.append(f"{where}.maxAge: {exc}")
    return problems
