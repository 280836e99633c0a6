"""`sublimate submit FILE`: your own workflow (a manifest, or a Hera module) to Argo Server,
linted and its parameters checked first, against `sublimate server`, every request checked
against Argo's OpenAPI document on the wire."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from sublimate.pipelines.cli import main as cli_main

from .argo_api import Server, on_the_wire

HERA_MODULE = '''
from hera.workflows import Container, Parameter, Workflow

with Workflow(generate_name="my-flow-", entrypoint="say",
              arguments=[Parameter(name="who", value="nobody")]) as wf:
    Container(name="say", image="alpine:3.20", command=["echo"],
              args=["hello {{workflow.parameters.who}}"])
'''

TEMPLATE = """
apiVersion: argoproj.io/v1alpha1
kind: WorkflowTemplate
metadata: {name: greet}
spec:
  entrypoint: say
  arguments:
    parameters: [{name: who, value: nobody}]
  templates:
  - name: say
    container: {image: alpine:3.20, command: [echo], args: ["hi {{workflow.parameters.who}}"]}
"""


def test_your_own_workflow_is_linted_then_submitted(
        start: Callable[..., Server], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    server = start()
    flags = ["--argo-server", server.url, "-n", "ml"]
    module = tmp_path / "my_flow.py"
    module.write_text(HERA_MODULE)
    seen = on_the_wire(monkeypatch)
    assert cli_main(["submit", str(module), "-p", "who=ci", "--wait", *flags]) == 0
    out = capsys.readouterr().out
    name = out.split()[1]
    assert name.startswith("my-flow-") and f"{name}: Succeeded" in out
    assert ("POST", "/api/v1/workflows/ml", 200) in seen
    _, created = server.call("GET", f"/api/v1/workflows/ml/{name}")
    assert {"name": "who", "value": "ci"} in created["spec"]["arguments"]["parameters"]

    # a WorkflowTemplate: installed (then updated), and a workflow submitted from it
    template = tmp_path / "greet.yaml"
    template.write_text(TEMPLATE)
    for version in ("1", "2"):
        assert cli_main(["submit", str(template), "-p", "who=you", *flags]) == 0
        assert "WorkflowTemplate/greet installed" in capsys.readouterr().out
        _, stored = server.call("GET", "/api/v1/workflow-templates/ml/greet")
        assert stored["metadata"]["resourceVersion"] == version

    # mistakes: one clear refusal each, before anything reaches the server
    posted = len([call for call in seen if call[0] == "POST"])
    typo = tmp_path / "typo.yaml"
    typo.write_text(TEMPLATE.replace("workflow.parameters.who", "workflow.parameters.whoo"))
    assert cli_main(["submit", str(typo), *flags]) == 2
    assert "does not pass sublimate lint" in capsys.readouterr().err
    assert cli_main(["submit", str(template), "-p", "whoo=x", *flags]) == 2
    assert "unknown parameter 'whoo' (did you mean 'who'?" in capsys.readouterr().err
    assert cli_main(["submit", str(tmp_path / "absent.yaml"), *flags]) == 2
    assert "nor a manifest (.yaml, .yml, .json) or Hera module (.py) that exists" in \
        capsys.readouterr().err
    assert len([call for call in seen if call[0] == "POST"]) == posted
