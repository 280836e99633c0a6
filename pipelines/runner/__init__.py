"""The local runner: executes rendered Argo manifests on one machine (the embedded engine).

``load_manifest`` reads a Workflow, WorkflowTemplate or CronWorkflow; ``run_workflow`` checks
it against the supported feature set (``unsupported_fields``), resolves parameters and runs
every container/script template as a local process group, with DAG/steps semantics, loops,
conditions, retries, deadlines, artifacts and volumes following Argo.

Run dir ``<home>/runs/<workflow name>/``: ``workflow.yaml`` (manifest as run),
``status.json`` (rewritten atomically on every node transition), ``nodes/<node id>/``
(``main.log``, the script file, a private ``fs/`` for absolute paths and ``volumes/`` for
emptyDirs), ``artifacts/<node id>/<name>`` (the local artifact store, unarchived) and
``volumes/<claim>`` for volumeClaimTemplates. ``persistentVolumeClaim`` volumes live in
``<home>/volumes/<claimName>`` and persist across runs.

Container paths are mapped onto local folders by rewriting the literal paths in commands,
args, env values, script sources and working directories (see ``paths``); paths computed
at run time (``os.path.join("/mnt", "x")``) are not rewritten.
"""

from .display import console_reporter, format_table
from .engine import run_workflow
from .errors import ManifestError, ParameterError
from .manifest import CLUSTER_ONLY_FIELDS, load_manifest, unsupported_fields
from .model import NodeResult, RunEvent, RunOptions, RunResult
from .parameters import resolve_parameters

__all__ = [
    "CLUSTER_ONLY_FIELDS",
    "ManifestError",
    "NodeResult",
    "ParameterError",
    "RunEvent",
    "RunOptions",
    "RunResult",
    "console_reporter",
    "format_table",
    "load_manifest",
    "resolve_parameters",
    "run_workflow",
    "unsupported_fields",
]
