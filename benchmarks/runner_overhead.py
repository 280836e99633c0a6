"""How much the local runner adds to a workflow's own work, against Kubeflow Pipelines' local mode.

Runs a three-step pipeline (``a -> b -> c``, each step trivial) several times, every variant once
per round, round after round (interleaved, so that the machine's load falls on all of them
alike), and prints medians with their spread:

- ``sublimate run`` on the pipeline with ``echo`` steps, and with ``python -c`` steps, as a user
  types it (a fresh process each time: interpreter start-up and imports included);
- the same three ``echo`` / ``python -c`` commands run by hand, one after another;
- with ``--kfp-python PY``: the same pipeline in KFP's local mode, its fastest runner
  (``SubprocessRunner(use_venv=False)``, three lightweight Python components that skip their
  ``pip install kfp``), run as a script by that interpreter. kfp pins protobuf<7,
  kubernetes<31 and urllib3==2.8, which the project's constraints exclude, so it lives in a venv
  of its own:
  ``python -m venv .venv-kfp && .venv-kfp/bin/pip install kfp``;
- with ``--baseline-python PY``: ``sublimate run`` again under another interpreter whose
  ``sublimate`` is an older tree (a before/after comparison in one run). One way:
  ``git archive REV | tar -x -C /tmp/old``, ``python -m venv /tmp/old/.venv``,
  ``/tmp/old/.venv/bin/pip install --no-deps -e /tmp/old`` and a ``.pth`` file in its
  site-packages naming this venv's site-packages (for the dependencies).

The ratio that matters is ``sublimate run`` (echo steps) over KFP local, computed per round (both
ran within a second of each other) and given as the median of those ratios. The machines are
shared: the load average (``os.getloadavg``) is printed before and after, and a change is only
a change when it moves a median by more than its spread.

``--smoke`` (tests/test_benchmarks.py): one round, no warm-up, this interpreter as the baseline
(KFP only with ``--kfp-python``): seconds, figures that mean nothing.

Usage: python benchmarks/runner_overhead.py [--repeat N] [--kfp-python PY] [--baseline-python PY]
       [--mounts auto|overlay|namespace|rewrite]
       python benchmarks/runner_overhead.py --smoke
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

PYTHON_STEP = [sys.executable, "-c", "print('step')"]
ECHO_STEP = ["echo", "step"]
SMOKE_LINE = "smoke mode: sizes too small for the figures to mean anything"


def manifest(step: list[str]) -> str:
    return f"""
apiVersion: argoproj.io/v1alpha1
kind: Workflow
metadata: {{generateName: three-steps-}}
spec:
  entrypoint: main
  templates:
  - name: main
    dag:
      tasks:
      - {{name: a, template: step}}
      - {{name: b, template: step, depends: a}}
      - {{name: c, template: step, depends: b}}
  - name: step
    container:
      image: python:3.11
      command: {json.dumps(step)}
"""


# The same pipeline in KFP: each step's output is the next one's input, as a -> b -> c above.
KFP_PIPELINE = """
from kfp import dsl, local

local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root={root!r})


# install_kfp_package=False: no `pip install kfp` before each step (kfp is installed).
@dsl.component(install_kfp_package=False)
def step(text: str) -> str:
    print(text)
    return text


@dsl.pipeline
def three_steps() -> str:
    a = step(text="a")
    b = step(text=a.output)
    return step(text=b.output).output


three_steps()
"""


def sublimate_run(python: str, manifest_file: Path, home: Path, mounts: str
                  ) -> Callable[[], float]:
    def once() -> float:
        started = time.perf_counter()
        completed = subprocess.run(
            [python, "-m", "sublimate.pipelines", "run", str(manifest_file), "-q", "-o", "json",
             "--mounts", mounts],
            capture_output=True, text=True,
            env={**os.environ, "SUBLIMATE_HOME": str(home)})
        wall = time.perf_counter() - started
        if completed.returncode != 0:
            raise SystemExit(f"{python}: sublimate run failed:\n{completed.stderr}")
        result = json.loads(completed.stdout)
        assert result["phase"] == "Succeeded", result
        return wall
    return once


def kfp_local(python: str, script: Path) -> Callable[[], float]:
    def once() -> float:
        started = time.perf_counter()
        completed = subprocess.run([python, str(script)], capture_output=True, text=True,
                                   cwd=script.parent)
        wall = time.perf_counter() - started
        if completed.returncode != 0 or "SUCCESS" not in completed.stderr + completed.stdout:
            raise SystemExit(f"kfp local failed:\n{completed.stderr}")
        return wall
    return once


def by_hand(step: list[str]) -> Callable[[], float]:
    def once() -> float:
        started = time.perf_counter()
        for _ in range(3):
            subprocess.run(step, capture_output=True, check=True)
        return time.perf_counter() - started
    return once


def byte_compile(python: str) -> None:
    """Write the .pyc files of ``python``'s ``sublimate`` (or ``kfp``) as a wheel install does;
    an editable install under PYTHONDONTWRITEBYTECODE=1 (set on our machines) would otherwise
    recompile on every start."""
    code = ("import compileall, importlib, pathlib, sys\n"
            "for name in sys.argv[1:]:\n"
            "    try: module = importlib.import_module(name)\n"
            "    except ImportError: continue\n"
            "    compileall.compile_dir(pathlib.Path(module.__file__).parent, quiet=1)\n")
    subprocess.run([python, "-c", code, "sublimate.pipelines", "sublimate.components", "kfp",
                    "google.protobuf", "yaml"],
                   check=True, capture_output=True, env={**os.environ,
                                                         "PYTHONDONTWRITEBYTECODE": ""})


def spread(values: list[float]) -> str:
    """``[q1-q3; min-max]``: how far apart the repeats were."""
    q1, _, q3 = statistics.quantiles(values, n=4) if len(values) > 1 else values * 3
    return f"[{q1:.3f}-{q3:.3f}; {min(values):.3f}-{max(values):.3f}]"


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--kfp-python", help="an interpreter with kfp installed")
    parser.add_argument("--baseline-python", help="an interpreter whose sublimate is a baseline")
    parser.add_argument("--mounts", default="auto")
    parser.add_argument("--smoke", action="store_true",
                        help="every code path at tiny sizes, in seconds (tests)")
    args = parser.parse_args()
    if args.smoke:
        parser.set_defaults(repeat=1, baseline_python=sys.executable)
        args = parser.parse_args()
        print(SMOKE_LINE, flush=True)
    for option in ("kfp_python", "baseline_python"):  # absolute, not resolved (a venv's link)
        if getattr(args, option):
            setattr(args, option, os.path.abspath(getattr(args, option)))
    interpreters = [sys.executable, *filter(None, [args.kfp_python, args.baseline_python])]
    for python in interpreters:
        byte_compile(python)
    with tempfile.TemporaryDirectory() as folder:
        base = Path(folder)
        echo_file, python_file = base / "three-echo.yaml", base / "three-python.yaml"
        echo_file.write_text(manifest(ECHO_STEP))
        python_file.write_text(manifest(PYTHON_STEP))
        home = base / "home"
        variants: dict[str, Callable[[], float]] = {
            "sublimate run, echo steps": sublimate_run(sys.executable, echo_file, home,
                                                       args.mounts),
            "sublimate run, python steps": sublimate_run(sys.executable, python_file, home,
                                                         args.mounts),
        }
        if args.baseline_python:
            # The baseline may predate --mounts overlay: it runs in its own default mode.
            variants["baseline, echo steps"] = sublimate_run(args.baseline_python, echo_file,
                                                             base / "home-baseline", "auto")
        if args.kfp_python:
            script = base / "kfp_three_steps.py"
            script.write_text(KFP_PIPELINE.format(root=str(base / "kfp-root")))
            variants["kfp.local, python steps"] = kfp_local(args.kfp_python, script)
        variants["by hand, echo"] = by_hand(ECHO_STEP)
        variants["by hand, python"] = by_hand(PYTHON_STEP)
        for once in variants.values() if not args.smoke else ():  # warm the page cache
            once()
        before = load()
        times: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(args.repeat):
            for name, once in variants.items():
                times[name].append(once())
        after = load()
    print(f"three trivial steps, {args.repeat} interleaved rounds, median [IQR; min-max] in s")
    print(f"load average (1, 5, 15 min): {before} before, {after} after")
    for name, values in times.items():
        print(f"  {name:42s} {statistics.median(values):5.3f}  {spread(values)}")
    kfp = times.get("kfp.local, python steps")
    for name in ("sublimate run, echo steps", "sublimate run, python steps",
                 "baseline, echo steps"):
        if kfp is not None and name in times:
            ratios = [a / b for a, b in zip(times[name], kfp, strict=True)]
            print(f"  {name + ' / kfp.local':42s} {statistics.median(ratios):5.2f}  "
                  f"[{min(ratios):.2f}-{max(ratios):.2f}] per round")
    if "baseline, echo steps" in times:
        ratios = [a / b for a, b in zip(times["sublimate run, echo steps"],
                                        times["baseline, echo steps"], strict=True)]
        print(f"  {'sublimate run / baseline, echo steps':42s} {statistics.median(ratios):5.2f}  "
              f"[{min(ratios):.2f}-{max(ratios):.2f}] per round")

if __name__ == "__main__":
    main()
