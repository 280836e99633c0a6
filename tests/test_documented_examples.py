"""The Python examples of the docs and docstrings are run, so that they stay true.

An example is a ```python block of README.md, docs/*.md or examples/**/*.md, or a literal block
(``::``) of a docstring under components/, pipelines/ or examples/ that is Python and calls
something. (The shell blocks are another test's.) Every example found must have an entry in
RUNS, which says how it runs: with the names it leaves to the reader (``model``, ``data_dir``,
``total_steps``...) bound to small real things, as a script in a one-process torch job where it
joins one, through the ``argo_run`` fixture where it is a test. Only an example that this machine
cannot run as written is checked instead, with the reason in CHECKED_ONLY: its imports resolve
and every call of an imported function or class binds to that callable's signature (a missing
or unknown argument fails). Every example, run or not, gets that check too.
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import json
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sublimate.components.base.ports import free_port
from tests.conftest import REPO


@dataclass(frozen=True)
class Example:
    source: str  # relative to the repository
    line: int  # where the block starts in it (1-based; docstrings: the module's line)
    code: str

    @property
    def key(self) -> tuple[str, str]:
        """The example's name, steadier than its line: its file and its first line of code."""
        first = next(line for line in self.code.splitlines() if line.strip())
        return self.source, first.split("  #")[0].strip()

    def __str__(self) -> str:
        return f"{self.source}:{self.line}"


def _is_example(code: str) -> bool:
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return False  # a layout, a formula, a shell line
    return any(isinstance(node, (ast.Call, ast.Import, ast.ImportFrom))
               for node in ast.walk(tree))


def markdown_examples() -> Iterator[Example]:
    paths = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")),
             *sorted((REPO / "examples").glob("**/*.md"))]
    for path in paths:
        text = path.read_text()
        for match in re.finditer(r"^```python\n(.*?)^```", text, re.S | re.M):
            yield Example(str(path.relative_to(REPO)), text[:match.start()].count("\n") + 2,
                          match.group(1))


def docstring_examples() -> Iterator[Example]:
    for folder in ("components", "pipelines", "examples"):
        for path in sorted((REPO / folder).glob("**/*.py")):
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                         ast.AsyncFunctionDef)):
                    continue
                docstring = ast.get_docstring(node)
                for match in re.finditer(r"::\n\n((?:[ \t]+\S.*\n|[ \t]*\n)+)",
                                         (docstring or "") + "\n"):
                    code = textwrap.dedent(match.group(1))
                    if _is_example(code):
                        yield Example(str(path.relative_to(REPO)), getattr(node, "lineno", 1),
                                      code)


EXAMPLES = [*markdown_examples(), *docstring_examples()]


# ---------------------------------------------------------------------------------------------
# The check every example gets: imports resolve, calls bind


# Modules an example imports that another example of the docs is: the reader saves it under
# that name (docs/pipelines.md's pipeline, imported by its test). Its own example is checked.
DOC_MODULES = frozenset({"my_pipeline"})


def _imported(tree: ast.Module) -> dict[str, Any]:
    import importlib

    names: dict[str, Any] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in DOC_MODULES:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                module = importlib.import_module(alias.name)
                names[alias.asname or alias.name.split(".")[0]] = \
                    module if alias.asname else importlib.import_module(alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.module:
            module = importlib.import_module(node.module)
            for alias in node.names:
                names[alias.asname or alias.name] = getattr(module, alias.name) \
                    if hasattr(module, alias.name) \
                    else importlib.import_module(f"{node.module}.{alias.name}")  # a submodule
    return names


def _callee(node: ast.expr, names: dict[str, Any]) -> Any:
    """The imported callable a call names (``f(...)``, ``module.f(...)``), else None."""
    if isinstance(node, ast.Name):
        return names.get(node.id)
    if isinstance(node, ast.Attribute):
        owner = _callee(node.value, names)
        if inspect.ismodule(owner) or inspect.isclass(owner):
            return getattr(owner, node.attr)  # AttributeError: the example names nothing
    return None


def check_calls(example: Example) -> int:
    """Bind every call of an imported function or class to its signature; how many bound."""
    tree = ast.parse(example.code)
    names = _imported(tree)
    checked = 0
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        target = _callee(node.func, names)
        if target is None or not callable(target) or inspect.ismodule(target):
            continue
        if any(isinstance(arg, ast.Starred) for arg in node.args) or \
                any(keyword.arg is None for keyword in node.keywords):
            continue  # *args or **kwargs: nothing to count
        try:
            signature = inspect.signature(target)
        except (TypeError, ValueError):  # a builtin without one
            continue
        try:
            signature.bind(*node.args, **{keyword.arg: keyword.value
                                          for keyword in node.keywords if keyword.arg})
        except TypeError as error:
            raise AssertionError(f"{example}: {ast.unparse(node)}: {error} (the signature is "
                                 f"{getattr(target, '__qualname__', target)}{signature})"
                                 ) from None
        checked += 1
    return checked


# ---------------------------------------------------------------------------------------------
# Running them


def _one_process_job(tmp_path: Path, prelude: str, example: Example, epilogue: str = "",
                     settings: dict[str, Any] | None = None) -> str:
    """Run ``example`` as a script of a one-process torch job (what torchrun and sublimate's
    launcher give a training process), after ``prelude``; returns its output."""
    from sublimate.components.base.contract import contract_env

    script = tmp_path / "example.py"
    script.write_text(f"{textwrap.dedent(prelude)}\n# ---- {example}\n{example.code}\n"
                      f"# ----\n{textwrap.dedent(epilogue)}")
    env = {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "GROUP_RANK": "0",
           "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
           "OMP_NUM_THREADS": "1",
           **contract_env(tmp_path / "data", tmp_path / "run", {
               "algorithm": "sync", "seed": 0, "collective_timeout": 60,
               "progress_every": 5, **(settings or {})})}
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, f"{example} failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
    return done.stdout


# The names the training library's outlines leave to the reader: a model, the loop's figures.
TRAINING_PRELUDE = """
    import torch
    from torch import nn
    from sublimate.components import training

    class MyNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = nn.Linear(4, 2)

        def forward(self, x):
            return self.layer(x)

    model = MyNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    total_steps, local_batch, epoch, epoch_steps = 1, 8, 0, 1
    data_seconds = compute_seconds = comm_seconds = data_s = compute_s = comm_s = 0.001
    mean_loss = loss = 0.69
    accuracy = 0.9
    epoch_seconds = seconds = 0.01
    steps = epoch_steps
"""
TRAINING_EPILOGUE = """
    import json, os, pathlib
    run = pathlib.Path(os.environ["SUBLIMATE_RUN_DIR"])
    print("RESULT", json.dumps({
        "model": (run / "model.pt").is_file(),
        "checkpoint": json.loads((run / "checkpoints" / "latest.json").read_text())["step"],
        "metrics": json.loads((run / "metrics.json").read_text())
        if (run / "metrics.json").is_file() else None,
        "epochs": [json.loads(line)["epoch"]
                   for line in (run / "metrics" / "rank-0.jsonl").read_text().splitlines()]}))
"""


def run_training_outline(example: Example, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    output = _one_process_job(tmp_path, TRAINING_PRELUDE, example, TRAINING_EPILOGUE)
    result = json.loads(output.split("RESULT ", 1)[1])
    # It ran through: the model saved, the checkpoint committed, the epoch recorded.
    assert result["model"] and result["epochs"] == [1]
    assert result["checkpoint"] in (0, 1)  # the outline's step: from restore, maybe plus one
    if "job.write_metrics(" in example.code:  # what the evaluate step reports
        assert result["metrics"] == {"accuracy": 0.9}


def run_tf_config(example: Example, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    (tmp_path / "user_code.py").write_text(
        "import os, pathlib\npathlib.Path('tf_config.json').write_text(os.environ['TF_CONFIG'])\n")
    _one_process_job(tmp_path, "import os, runpy\nscript = 'user_code.py'\n", example)
    config = json.loads((tmp_path / "tf_config.json").read_text())
    assert config["task"] == {"type": "worker", "index": 0}
    assert len(config["cluster"]["worker"]) == 1


def _exec(example: Example, namespace: dict[str, Any], folder: Path) -> dict[str, Any]:
    """Run the example in this process with the given names bound (from a file of its own:
    Hera's ``@script`` reads its functions' source)."""
    path = folder / "example.py"
    path.write_text(example.code)
    exec(compile(example.code, str(path), "exec"), namespace)  # running it is the point
    return namespace


def run_plain(example: Example, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    import torch

    _exec(example, {"torch": torch}, tmp_path)


def run_argo_test(example: Example, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """A test in the example: defined, then called with the real ``argo_run`` fixture."""
    from tests.pipelines.runner.test_harness import adder

    namespace = _exec(example, {"adder_workflow": adder()}, tmp_path)
    tests = [value for name, value in namespace.items() if name.startswith("test_")]
    assert tests, f"{example} defines no test"
    for test in tests:
        test(request.getfixturevalue("argo_run"))


def run_pipeline_test(example: Example, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """The test of docs/pipelines.md's own pipeline: the page's pipeline saved as the
    ``my_pipeline.py`` the test imports, then the test, called with the real ``argo_run``."""
    page = (REPO / "docs" / "pipelines.md").read_text()
    pipeline = re.search(r"```python\n(from hera.workflows import DAG, Parameter, "
                         r"WorkflowTemplate\n.*?)```", page, re.S)
    assert pipeline, "docs/pipelines.md: the pipeline's block moved"
    (tmp_path / "my_pipeline.py").write_text(pipeline.group(1))
    sys.path.insert(0, str(tmp_path))
    try:
        namespace = _exec(example, {}, tmp_path)
        tests = [value for name, value in namespace.items() if name.startswith("test_")]
        assert tests, f"{example} defines no test"
        for test in tests:
            test(request.getfixturevalue("argo_run"))
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("my_pipeline", None)


def run_shard_reader(example: Example, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    from sublimate.components.data.datasets import build_builtin

    data_dir = tmp_path / "digits"
    build_builtin("digits", data_dir)
    _exec(example, {"data_dir": data_dir, "rank": 0, "world": 1, "seed": 0, "epoch": 0},
          tmp_path)


def run_registry(example: Example, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """On the real S3 server, in a bucket named as the example's URL names it, with one
    champion already there for the example's rollback to return to."""
    from sublimate.components.model.registry import Registry

    server = request.getfixturevalue("s3_env")
    url = re.search(r'Registry\("(s3://[^"]+)"\)', example.code)
    assert url, f"{example}: expected Registry(\"s3://...\")"
    bucket = url.group(1).removeprefix("s3://").split("/")[0]
    filesystem = server.filesystem()
    if filesystem.exists(bucket):
        filesystem.rm(bucket, recursive=True)
    filesystem.mkdir(bucket)
    for name, text in (("runs/x/model.pt", "weights"), ("runs/x/metrics.json", '{"accuracy": 1}'),
                       ("earlier/model.pt", "old weights")):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    registry = Registry(url.group(1))
    earlier = registry.publish(tmp_path / "earlier", {"note": "the champion before"})
    registry.promote(earlier.id, "the first")
    with contextlib.chdir(tmp_path):
        namespace = _exec(example, {"Path": Path, "lineage": {"note": "the example's"}},
                          tmp_path)
    assert registry.champion().id == earlier.id  # type: ignore[union-attr]  # rolled back
    assert (tmp_path / "champion" / "model.pt").read_text() == "weights"
    assert namespace["v"].lineage == {"note": "the example's"}


Runner = Callable[[Example, Path, pytest.FixtureRequest], None]

RUNS: dict[tuple[str, str], Runner] = {
    ("components/training/__init__.py", "from sublimate.components import training"):
        run_training_outline,
    ("docs/own-code.md", "job = training.start()"): run_training_outline,
    ("components/processes/tf_config.py", "from sublimate.components.processes import tf_config"):
        run_tf_config,
    ("docs/local-runner.md", "from hera.workflows import DAG, Workflow, script"): run_argo_test,
    ("pipelines/testing.py", "def test_adder(argo_run):"): run_argo_test,
    ("docs/pipelines.md", "from hera.workflows import DAG, Parameter, WorkflowTemplate"):
        run_plain,
    ("docs/pipelines.md", "from my_pipeline import workflow"): run_pipeline_test,
    ("docs/datasets.md", "def build(num_features: int, num_classes: int) -> torch.nn.Module: ..."):
        run_plain,
    ("docs/datasets.md",
     "from sublimate.components import ShardReader, evaluation_batches, steps_per_epoch"):
        run_shard_reader,
    ("docs/registry.md", "from sublimate.components import ModelVersion, Registry, RegistryError"):
        run_registry,
}

CHECKED_ONLY: dict[tuple[str, str], str] = {
    ("docs/local-cluster.md", "from torchx.runner import Runner"):
        "needs root and a host folder /srv/sublimate; tests/components/launch/"
        "test_netns_scheduler.py runs the scheduler with these run options",
    ("docs/local-cluster.md", "from sublimate.components import faults"):
        "its cut blocks for 20 s and its delay needs the netem qdisc, which this kernel lacks; "
        "tests/components/launch/test_faults.py runs every call on a real cluster",
}


@pytest.mark.parametrize("example", EXAMPLES, ids=str)
def test_documented_python_example(example: Example, tmp_path: Path,
                                   request: pytest.FixtureRequest) -> None:
    assert example.key in RUNS or example.key in CHECKED_ONLY, (
        f"{example} is a Python example that no test runs: add it to RUNS in {__file__} "
        f"(key {example.key!r}), with the names it leaves to the reader bound")
    check_calls(example)
    if example.key in RUNS:
        RUNS[example.key](example, tmp_path, request)


def test_the_examples_are_found() -> None:
    """The search finds what it must (an empty search would pass every test above)."""
    assert set(RUNS) | set(CHECKED_ONLY) <= {example.key for example in EXAMPLES}


def test_the_check_catches_a_call_that_omits_an_argument() -> None:
    example = Example("x.md", 1, "from sublimate.components.launch import faults\n"
                                 "faults.cut_link(cluster, 1)\n")
    with pytest.raises(AssertionError, match=r"missing a required argument: 'seconds'"):
        check_calls(example)
    assert check_calls(Example("x.md", 1, "from sublimate.components.launch import faults\n"
                                          "faults.cut_link(cluster, 1, 20.0)\n")) == 1
