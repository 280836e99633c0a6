"""Everything that defines, checks, runs or submits workflows: the Hera pipelines, the
``sublimate`` CLI, the linter, the local runner and the Argo Server client
(docs/architecture.md).

This module is the public face: the names below are what users' code, the docs, the examples
and the notebook may rely on (``from sublimate.pipelines import run_workflow,
train_pipeline``). Everything else is internal and may move. The names load on first use, so
importing ``sublimate.pipelines`` costs nothing (``sublimate run FILE.yaml`` starts in tens of
milliseconds).
"""

from __future__ import annotations

from sublimate.components.base.public_face import lazy_exports

# public name -> "module" (the module itself) or "module:attribute", under this package
_EXPORTS: dict[str, str] = {
    # the pipelines, as Hera objects (sublimate render writes them to argo/)
    "train_pipeline": "sublimate_train:train_pipeline",
    "nightly_retraining": "sublimate_train:nightly_retraining",
    "retrain_pipeline": "sublimate_retrain:retrain_pipeline",
    "sweep_pipeline": "sublimate_sweep:sweep_pipeline",
    # the local runner (docs/local-runner.md): run a Hera object or a manifest here
    "run": "runner:run",
    "run_workflow": "runner:run_workflow",
    "RunOptions": "runner:RunOptions",
    "RunResult": "runner:RunResult",
    "WorkflowRun": "runner:WorkflowRun",
    "load_manifest": "runner:load_manifest",
    "format_table": "runner:format_table",
    "console_reporter": "runner:console_reporter",
    "ManifestError": "runner:ManifestError",
    "ParameterError": "runner:ParameterError",
    "RunInterrupted": "runner:RunInterrupted",
    # testing workflows with pytest: the argo_run fixture's type (the fixture comes by itself)
    "ArgoRun": "testing:ArgoRun",
    # a run's results, found by any name, and its report (sublimate report)
    "resolve_run": "run_lookup:resolve_run",
    "format_summary": "run_lookup:format_summary",
}

__all__ = list(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
