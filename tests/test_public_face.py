"""One public face: ``sublimate.components`` and ``sublimate.pipelines`` export, in ``__all__``,
the names users' code may rely on, and the documented code imports nothing else.

"Documented code" is every python block of README.md and docs/*.md, every file of examples/ and
the notebook's code cells. A private path is any module below ``sublimate.components.<room>`` or
``sublimate.pipelines.<room>`` (``sublimate.components.data.streaming``), or a name those two
packages do not export; a public module (``sublimate.components.training``) may be imported by
its own path, with the names of its own ``__all__``.
"""

from __future__ import annotations

import ast
import importlib
import json
import re
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.conftest import REPO

FACES = ("sublimate.components", "sublimate.pipelines")
FENCE = re.compile(r"^```(?:python|py)\n(.*?)^```", re.M | re.S)


def _documented_code() -> Iterator[tuple[str, str]]:
    """(where, source) of every piece of documented Python."""
    for document in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        text = document.read_text()
        for match in FENCE.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            yield f"{document.relative_to(REPO)}:{line}", match.group(1)
    for example in sorted((REPO / "examples").rglob("*.py")):
        yield str(example.relative_to(REPO)), example.read_text()
    notebook = REPO / "notebooks" / "getting-started.ipynb"
    for index, cell in enumerate(json.loads(notebook.read_text())["cells"]):
        if cell["cell_type"] == "code":
            yield f"{notebook.relative_to(REPO)} cell {index}", "".join(cell["source"])


def _imports(source: str) -> Iterator[tuple[str, list[str]]]:
    """(module, names imported from it) of every import of sublimate in ``source``; a block
    that is not whole Python (an excerpt) is read statement by statement."""
    try:
        trees = [ast.parse(source)]
    except SyntaxError:
        trees = []
        for line in source.splitlines():
            stripped = line.strip()
            if stripped.startswith(("import ", "from ")):
                try:
                    trees.append(ast.parse(stripped))
                except SyntaxError:
                    continue
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                yield node.module, [alias.name for alias in node.names]
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    yield alias.name, []


def _exported(package: str) -> list[str]:
    return list(importlib.import_module(package).__all__)


def _public_module(module: str) -> bool:
    """Whether ``module`` is a module the faces export under its own path."""
    face, _, name = module.rpartition(".")
    if face not in FACES or name not in _exported(face):
        return False
    exported = getattr(importlib.import_module(face), name)
    return getattr(exported, "__name__", None) == module


def private_import(module: str, names: list[str]) -> str | None:
    """Why importing ``names`` from ``module`` reaches past the public face (None: it does
    not)."""
    if module != "sublimate" and not module.startswith("sublimate."):
        return None
    if module in ("sublimate", *FACES):
        hidden = [name for name in names if module != "sublimate" and name != "*"
                  and name not in _exported(module)]
        if names == ["*"] or hidden:
            return f"{', '.join(hidden) or '*'} from {module}: not in its __all__"
        return None
    if _public_module(module):
        own = getattr(importlib.import_module(module), "__all__", [])
        hidden = [name for name in names if name not in own]
        return f"{', '.join(hidden)} from {module}: not in its __all__" if hidden else None
    return f"{module}: a private path (import from {module.split('.')[0]}."\
        f"{module.split('.')[1]} instead)"


def test_documented_code_imports_only_the_public_face() -> None:
    found = []
    for where, source in _documented_code():
        for module, names in _imports(source):
            why = private_import(module, names)
            if why:
                found.append(f"{where}: {why}")
    assert not found, "\n".join(found)


def test_the_documented_code_is_all_read() -> None:
    places = [where for where, _ in _documented_code()]
    assert any(p.startswith("docs/own-code.md:") for p in places)  # the README's code moved here
    assert any(p.startswith("docs/pipelines.md:") for p in places)
    assert any(p.startswith("docs/registry.md:") for p in places)
    assert any(p.startswith("examples/cnn_bmuf/train.py") for p in places)
    assert any(p.startswith("notebooks/getting-started.ipynb cell") for p in places)
    modules = {module for _, source in _documented_code() for module, _ in _imports(source)}
    assert set(FACES) <= modules  # the check has something to judge


@pytest.mark.parametrize(("module", "names", "private"), [
    ("sublimate.components", ["ShardReader", "training"], False),
    ("sublimate.pipelines", ["run_workflow", "train_pipeline"], False),
    ("sublimate.components.training", ["start", "Job"], False),
    ("sublimate.components.data.streaming", ["ShardReader"], True),
    ("sublimate.pipelines.runner", ["RunOptions"], True),
    ("sublimate.components", ["settings"], True),
    ("sublimate.components.training", ["Reporter", "not_there"], True),
    ("torch", ["nn"], False),
])
def test_what_counts_as_private(module: str, names: list[str], private: bool) -> None:
    assert (private_import(module, names) is not None) is private


@pytest.mark.parametrize("face", FACES)
def test_every_public_name_resolves(face: str) -> None:
    package = importlib.import_module(face)
    assert package.__all__ and len(set(package.__all__)) == len(package.__all__)
    for name in package.__all__:
        assert getattr(package, name) is not None, name
        assert name in dir(package)
    with pytest.raises(AttributeError):
        package.no_such_name  # noqa: B018


def test_the_faces_load_nothing_until_a_name_is_used() -> None:
    program = ("import sys\n"
               "import sublimate.components, sublimate.pipelines\n"
               "print(sorted(m for m in sys.modules if m.startswith('sublimate.')),\n"
               "      [m for m in ('torch', 'hera', 'numpy', 'yaml') if m in sys.modules])\n"
               "from sublimate.components import training\n"
               "print(training.start.__module__)\n")
    completed = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                               check=True)
    loaded, used = completed.stdout.splitlines()
    # the faces' one shared loader (standard library only) and its package, nothing else
    assert loaded == ("['sublimate.components', 'sublimate.components.base', "
                      "'sublimate.components.base.public_face', 'sublimate.pipelines'] []")
    assert used == "sublimate.components.training.job"
