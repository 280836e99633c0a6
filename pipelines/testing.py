"""The pytest plugin of sublimate: the ``argo_run`` fixture, for testing Hera workflows locally.

Installing sublimate registers it (the ``pytest11`` entry point ``sublimate`` in
pyproject.toml), so any test can take ``argo_run``; ``pytest -p no:sublimate`` turns it off::

    def test_adder(argo_run):
        run = argo_run(adder_workflow, {"x": 2})
        assert run.phase == "Succeeded"
        assert run.outputs["total"] == "5"
        assert run.node("big").phase == "Skipped"

``argo_run(workflow, parameters=None, lint=True, **options)`` is
:func:`sublimate.pipelines.runner.harness.run` with ``home`` set to a folder under the test's
``tmp_path`` (``argo_run.home``, shared by the test's runs); the keyword options (``timeout``,
``templates``, ``parallelism``, ``echo``, ``reporter``, ``home``, ``objects``: Secret and
ConfigMap manifests, ``answers``: suspend nodes answered up front) pass through. It returns a
``WorkflowRun``. First the workflow is linted as ``sublimate lint`` lints it (Argo's schema,
references between templates, variables): a problem raises ``ManifestError`` listing them
all, before anything runs, as a cluster's Argo would refuse the workflow; ``lint=False`` skips
that (a test of what the runner does with a workflow Argo would refuse).

This module is imported at the start of every pytest session wherever sublimate is installed:
it imports the runner only when the fixture is used.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from sublimate.pipelines.runner.harness import WorkflowRun


class ArgoRun:
    """The ``argo_run`` fixture: runs workflows in one home folder (``home``), so that the runs
    of a test share their persistent volumes as workflows in one namespace share their claims.
    Annotate with it: ``def test_x(argo_run: ArgoRun)``."""

    def __init__(self, home: Path) -> None:
        self.home = home

    def __call__(self, workflow: object, parameters: Mapping[str, object] | None = None,
                 lint: bool = True, **options: Any) -> WorkflowRun:
        from sublimate.pipelines.runner.harness import as_manifest, run

        if lint:
            from sublimate.pipelines.lint import lint_document
            from sublimate.pipelines.runner import ManifestError

            manifest = as_manifest(workflow, options.get("templates", ()))
            errors = [str(p) for p in lint_document(manifest, "the workflow") if not p.warning]
            if errors:
                raise ManifestError("sublimate lint: " + "; ".join(errors)
                                    + " (argo_run(..., lint=False) runs it anyway)")
        options.setdefault("home", self.home)
        return run(workflow, parameters, **options)


@pytest.fixture
def argo_run(tmp_path: Path) -> ArgoRun:
    """Run a Hera ``Workflow``/``WorkflowTemplate`` (or a manifest dict, YAML file or text)
    with sublimate's local runner in a home under ``tmp_path``; returns a ``WorkflowRun``."""
    return ArgoRun(tmp_path / "sublimate-home")


__all__ = ["ArgoRun", "argo_run"]
