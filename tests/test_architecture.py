"""The drawing of the tree (modules as rooms, imports as arrows) has no cycle, and every room of
``components/`` is one layer of the import contract (docs/architecture.md).

The graph is grimp's (import-linter's own library): every import of the two packages, including
those under ``TYPE_CHECKING`` and those deferred into a function, so that a knot that only shows
at type-checking time or on one code path fails here too.
"""

from __future__ import annotations

import tomllib
from collections import deque
from functools import cache

import grimp
import pytest

from tests.conftest import REPO

PACKAGES = ("sublimate.components", "sublimate.pipelines")


@cache
def _graph() -> grimp.ImportGraph:
    return grimp.build_graph(*PACKAGES, cache_dir=None)


def _imports() -> dict[str, set[str]]:
    graph = _graph()
    return {module: set(graph.find_modules_directly_imported_by(module)) & graph.modules
            for module in graph.modules}


def _strongly_connected(edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's components with more than one module (or a module importing itself)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in edges[node]:
                    found.append(sorted(component))
    return found


def _one_cycle(edges: dict[str, set[str]], component: list[str]) -> list[str]:
    """A shortest cycle through the component's first module, as the modules along it."""
    members = set(component)
    start = component[0]
    previous: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for child in sorted(edges[node] & members):
            if child == start:
                path = [node]
                while path[-1] != start:
                    path.append(previous[path[-1]])
                return [start, *reversed(path[:-1]), start] if node != start else [start, start]
            if child not in previous:
                previous[child] = node
                queue.append(child)
    raise AssertionError(f"no cycle through {start}")


def test_the_graph_sees_deferred_and_type_checking_imports() -> None:
    # what the test relies on: both kinds of import are arrows of the drawing
    imports = _imports()
    # deferred into a function: the engine imports container mode only when it runs in it
    assert "sublimate.pipelines.runner.pods.images.executor" in \
        imports["sublimate.pipelines.runner.engine"]
    # under TYPE_CHECKING: the per-kind modules name the run's protocol only for annotations
    templates = "sublimate.pipelines.runner.templates"
    assert f"{templates}.context" in imports[f"{templates}.dag"]


def test_no_module_imports_itself_back_through_any_chain() -> None:
    edges = _imports()
    cycles = [" -> ".join(_one_cycle(edges, component))
              for component in _strongly_connected(edges)]
    assert not cycles, "import cycles (type-only and deferred imports count):\n" + \
        "\n".join(cycles)


def test_the_cycle_finder_finds_a_cycle() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _strongly_connected(edges) == [["a", "b", "c"]]
    assert _one_cycle(edges, ["a", "b", "c"]) == ["a", "b", "c", "a"]


def _contract(name_start: str) -> dict:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    return next(c for c in contracts if c["name"].startswith(name_start))


def test_every_room_of_components_is_one_layer_of_the_contract() -> None:
    contract = _contract("Component layers")
    assert contract["containers"] == ["sublimate.components"]
    layers = [name.strip() for layer in contract["layers"] for name in layer.split("|")]
    rooms = sorted(path.parent.name for path in (REPO / "components").glob("*/__init__.py"))
    assert sorted(layers) == rooms
    # no module lies loose beside the rooms: each belongs to a layer
    assert [path.name for path in (REPO / "components").glob("*.py")] == ["__init__.py"]


@pytest.mark.parametrize("package", PACKAGES)
def test_the_package_roots_import_nothing_of_their_own_at_import_time(package: str) -> None:
    # the public faces are lazy (module __getattr__): importing them costs nothing; their one
    # arrow is to the loader they share, which imports nothing of either package
    loader = "sublimate.components.base.public_face"
    assert _imports()[package] == {loader}
    assert not _imports()[loader]


RUNNER_TOP = ["__init__.py", "engine.py", "errors.py", "harness.py", "preview.py",
              "reruns.py"]


def test_every_room_of_the_runner_is_one_layer_of_the_contract() -> None:
    contract = _contract("Runner layers")
    assert contract["containers"] == ["sublimate.pipelines.runner"]
    layers = [name.strip() for layer in contract["layers"] for name in layer.split("|")]
    runner = REPO / "pipelines" / "runner"
    rooms = sorted(path.parent.name for path in runner.glob("*/__init__.py"))
    modules = sorted(path.stem for path in runner.glob("*.py") if path.name != "__init__.py")
    assert sorted(layers) == sorted(rooms + modules)
    # only the run's top (engine, harness, preview, reruns) and its exceptions lie beside the rooms
    assert sorted(path.name for path in runner.glob("*.py")) == RUNNER_TOP


def test_the_per_kind_modules_see_a_run_only_through_its_protocol() -> None:
    # the layers contract forbids templates -> engine; this names the arrow it relies on
    imports = _imports()
    templates = "sublimate.pipelines.runner.templates"
    assert "sublimate.pipelines.runner.engine" not in imports[f"{templates}.dag"]
    assert f"{templates}.context" in imports[f"{templates}.dag"]


def test_container_mode_lives_in_one_room_of_pods() -> None:
    pods = REPO / "pipelines" / "runner" / "pods"
    assert sorted(p.name for p in (pods / "images").glob("*.py")) == [
        "__init__.py", "engines.py", "executor.py", "keeper.py", "spec.py"]
    assert (pods / "container_set.py").is_file()
    # only the engine (deferred), the plan (a container's spec) and the room itself import it
    graph = _graph()
    importers = {importer for module in graph.modules
                 if module.startswith("sublimate.pipelines.runner.pods.images")
                 for importer in graph.find_modules_that_directly_import(module)}
    assert {m for m in importers if not m.startswith("sublimate.pipelines.runner.pods.images")} \
        == {"sublimate.pipelines.runner.engine", "sublimate.pipelines.runner.pods.plan"}


def test_the_map_holds_no_timings() -> None:
    # docs/architecture.md is a map of the structure; how long things took goes in a
    # benchmark's output or a change's closing note, where a date and a machine go with it
    import re

    text = (REPO / "docs" / "architecture.md").read_text()
    months = "January|February|March|April|May|June|July|August|September|October|November|December"
    durations = r"\b\d+(?:\.\d+)? ?(?:s|ms|min|minutes|seconds|CPU-s)\b"
    timings = re.findall(rf"{durations}|\b\d{{1,2}} (?:{months}) 20\d\d", text)
    assert not timings, timings
