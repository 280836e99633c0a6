"""What `sublimate run FILE` imports: what a local run uses, nothing more.

Start-up is most of a short run's time (each module a few ms on a loaded machine), so the set
of modules is held here, not a time (timings are noisy; ``benchmarks/runner_overhead.py``
measures them against KFP's local mode). A new import on the way to a local run fails this test
with its name: defer it into the function that needs it, or raise the budget knowingly.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

# Loaded only by what needs them: other commands, other template kinds, expressions, tests.
NEVER = (
    "sublimate.pipelines.argo_server",  # sublimate submit/get/list/logs
    "sublimate.pipelines.server",  # sublimate server
    "sublimate.pipelines.runner.harness",  # tests and Hera users
    "sublimate.pipelines.run_lookup",  # sublimate report
    "sublimate.components.monitoring",
    "sublimate.components.base.settings",  # sublimate-train's parameters only
    "sublimate.pipelines.runner.templates.synchronization",  # a workflow with locks
    "sublimate.pipelines.runner.expressions.expr_lang",  # a workflow with {{=...}}
    "sublimate.pipelines.runner.expressions.jsonpath",
    "sublimate.pipelines.runner.pods.container_set",  # a pod of several containers
    "sublimate.pipelines.runner.templates.hooks",
    "sublimate.pipelines.runner.preview",  # --dry-run
    "sublimate.pipelines.runner.pods.images",  # --containers
    "lark", "jsonpath_ng", "jsonschema", "hera", "torch", "numpy", "tempfile", "uuid",
)
# The sublimate modules a three-step DAG of echo commands loads: 55 when this budget was set
# (63 before it, with the harness, the Argo Server client and the report); 61 since the
# runner's 5 rooms (a package with a docstring each) and the public faces' loader; 66 since
# every pod is contained (pods/sandbox) and gets its environment from one place
# (pods/environment); a few to spare.
SUBLIMATE_MODULES = 68

MANIFEST = """
apiVersion: argoproj.io/v1alpha1
kind: Workflow
metadata: {generateName: three-steps-}
spec:
  entrypoint: main
  templates:
  - name: main
    dag:
      tasks:
      - {name: a, template: step}
      - {name: b, template: step, depends: a}
      - {name: c, template: step, depends: b}
  - name: step
    container: {image: alpine, command: [echo, step]}
"""

LOADED = """
import json, sys
from sublimate.pipelines.cli import main
code = main(["run", sys.argv[1], "-q", "-o", "json"])
print(json.dumps({"code": code, "modules": sorted(sys.modules)}), file=sys.stderr)
"""


def test_a_local_run_imports_only_what_it_uses(tmp_path: Path) -> None:
    manifest = tmp_path / "three.yaml"
    manifest.write_text(textwrap.dedent(MANIFEST))
    done = subprocess.run([sys.executable, "-c", LOADED, str(manifest)], capture_output=True,
                          text=True, timeout=120, check=False,
                          env={"SUBLIMATE_HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin"})
    report = json.loads(done.stderr.strip().splitlines()[-1])
    assert report["code"] == 0, done.stderr
    loaded = report["modules"]
    unwanted = [name for name in loaded if any(
        name == never or name.startswith(never + ".") for never in NEVER)]
    assert unwanted == []
    ours = [name for name in loaded if name.startswith("sublimate.")]
    assert len(ours) <= SUBLIMATE_MODULES, ours
