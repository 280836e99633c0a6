"""The local runner: executes rendered Argo manifests on one machine (the embedded engine).

``load_manifest`` reads a Workflow, WorkflowTemplate or CronWorkflow; ``run_workflow`` checks
it against the supported feature set (``unsupported_fields``), resolves parameters and runs
every container/script template as a local process group (or in its image with
``RunOptions(containers=...)``: ``images``), with DAG/steps semantics, loops,
conditions, retries, deadlines, artifacts and volumes following Argo.

Deciding what runs is kept apart from running it: each pod is planned as a ``PodRequest``
(resolved command line, env, working dir, mounts, deadline; see ``plan``) and handed to an
``Executor`` (``RunOptions.executor``; ``LocalExecutor`` by default). ``preview.preview_workflow``
plans the first wave without running anything (``sublimate run --dry-run``).

Run dir ``<home>/runs/<workflow name>/``: ``workflow.yaml`` (manifest as run),
``status.json`` (rewritten atomically on every node transition), ``nodes/<display name>-<id
hash>/`` (``main.log``, the script file, the termination-message file, a private ``fs/`` for
absolute paths and ``volumes/`` for emptyDirs), ``artifacts/<node id>/<name>`` (the local
artifact store, unarchived), ``volumes/<claim>`` for volumeClaimTemplates and ``outputs/<name>``
links for workflow output parameters that name a folder on a volume. ``persistentVolumeClaim``
volumes live in ``<home>/volumes/<claimName>`` and persist across runs.

``harness.run`` runs a Hera ``Workflow``/``WorkflowTemplate`` (or any manifest) for a test and
returns a ``WorkflowRun`` to assert on; ``run_workflow`` takes a Hera object too, its parameters
and options optional (a temporary home). ``sublimate.pipelines.testing`` is the pytest fixture.

Each pod sees the whole tree through a private writable layer, its folders at the manifest's
paths (``views``); where that cannot be, in a mount namespace sharing this machine's files
(``mounts``), or, last, with the literal paths in commands, args, env values, script sources and
working directories rewritten to local folders (``paths``).
"""

from sublimate.components.base.public_face import lazy_exports
from sublimate.pipelines.argo_terms import NodePhase, NodeType

from .errors import ManifestError, ParameterError, RunInterrupted
from .manifest.fields import CLUSTER_ONLY_FIELDS
from .manifest.load import load_manifest, unsupported_fields
from .manifest.parameter_resolution import resolve_parameters
from .pods.executor import Executor, PodHooks, PodOutcome
from .pods.local_executor import LocalExecutor
from .pods.plan import Mount, PodRequest
from .records.run_folder import InterruptedRun, settle_interrupted_runs
from .records.run_types import NodeResult, RunEvent, RunOptions, RunResult

# Loaded on first use (PEP 562): `sublimate run FILE` needs neither the harness (Hera, test
# runs) nor, with -o json, the table.
_LAZY = {"console_reporter": "records.display:console_reporter",
         "format_table": "records.display:format_table", "NodeView": "harness:NodeView",
         "WorkflowRun": "harness:WorkflowRun", "run": "harness:run",
         "run_workflow": "harness:run_workflow"}
__getattr__, _ = lazy_exports(__name__, _LAZY)  # its dir() stays the module's own


__all__ = [
    "CLUSTER_ONLY_FIELDS",
    "Executor",
    "InterruptedRun",
    "LocalExecutor",
    "ManifestError",
    "Mount",
    "NodePhase",
    "NodeResult",
    "NodeType",
    "NodeView",
    "ParameterError",
    "PodHooks",
    "PodOutcome",
    "PodRequest",
    "RunEvent",
    "RunInterrupted",
    "RunOptions",
    "RunResult",
    "WorkflowRun",
    "console_reporter",
    "format_table",
    "load_manifest",
    "resolve_parameters",
    "run",
    "run_workflow",
    "settle_interrupted_runs",
    "unsupported_fields",
]
