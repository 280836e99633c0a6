"""``jsonpath()`` in expressions answers as Argo's does, or is refused by name.

The reference is the Go library Argo calls (github.com/evilmonkeyinc/jsonpath v0.8.1), recorded
on 286 cases in ``data/jsonpath_go_results.jsonl`` (see ``data/README.md``). The manifests are
ours, shaped like Argo's ``examples/expression-destructure-json-complex.yaml``.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from sublimate.pipelines.runner import ManifestError
from sublimate.pipelines.runner.expressions.conditions import ExpressionError
from sublimate.pipelines.runner.expressions.expr_lang import evaluate, go_json
from sublimate.pipelines.runner.expressions.jsonpath import Unsupported, compile_path
from sublimate.pipelines.runner.harness import run

CASES = [json.loads(line) for line in
         (Path(__file__).parent / "data" / "jsonpath_go_results.jsonl").read_text().splitlines()]
GO_TYPES = {float: "float64", str: "string", bool: "bool", list: "[]interface {}",
            dict: "map[string]interface {}", type(None): "<nil>"}

EMPLOYEES = ('{"employees": [{"name": "Baris", "age":43},{"name": "Mo", "age": 42}, '
             '{"name": "Jai", "age" :44}]}')


def _answer(case: dict) -> tuple[str, str] | None:
    """(Go type, JSON text) of the expression's value, ("error", "") when it fails, None when
    the local runner refuses the path."""
    try:
        compile_path(case["selector"])
    except Unsupported:
        return None
    except ValueError:
        return "error", ""
    try:
        value = evaluate("jsonpath(doc, path)", {"doc": case["data"], "path": case["selector"]})
    except ExpressionError:
        return "error", ""
    return GO_TYPES[type(value)], go_json(value)


def test_every_recorded_case_is_answered_as_go_does_or_refused() -> None:
    same, refused, different = 0, [], []
    for case in CASES:
        answer = _answer(case)
        if answer is None:
            refused.append(case["selector"])
            continue
        expected = ("error", "") if case["error"] else (case["type"], case["result_json"])
        if answer == expected:
            same += 1
        else:
            different.append((case["selector"], case["data"], answer, expected))
    assert different == []
    # What the adapter answers today: a new refusal would show here as a lower count.
    assert same >= 171 and len(refused) <= 115, (same, refused)


@pytest.mark.parametrize(("selector", "text"), [
    # the filters, slice and wildcard of Argo's expression-destructure-json-complex example
    ('$.employees[?(@.name=="Baris")].age', "[43]"),
    ("$.employees[?(@.age>42 && @.age<44)].age", "[43]"),
    ("$.employees[?(@.age!=42)].name", '["Baris","Jai"]'),
    ("$.employees[0:1]", '[{"age":43,"name":"Baris"}]'),
    ("$.employees[*].name", '["Baris","Mo","Jai"]'),
    ("$.employees[?(@.name=='Nobody')].age", "[]"),
    ("$.employees[1].age", "42"),
])
def test_argo_example_paths_match_the_go_library(selector: str, text: str) -> None:
    recorded = [c for c in CASES if c["selector"] == selector and c["data"] == EMPLOYEES]
    if recorded:  # the fixture's own answer, where Go was asked this very question
        assert recorded[0]["result_json"] == text
    value = evaluate("jsonpath(doc, path)", {"doc": EMPLOYEES, "path": selector})
    assert go_json(value) == text


def test_numbers_are_go_float64_and_a_definite_miss_is_an_error() -> None:
    scope = {"doc": '{"id": 7, "tags": {"b": 2, "a": 1}}'}
    assert evaluate("type(jsonpath(doc, '$.id'))", scope) == "float"
    assert evaluate("jsonpath(doc, '$.id') == 7", scope) is True
    assert go_json(evaluate("jsonpath(doc, '$.tags.*')", scope)) == "[1,2]"  # sorted keys
    with pytest.raises(ExpressionError, match="not found"):
        evaluate("jsonpath(doc, '$.missing')", scope)
    with pytest.raises(ExpressionError, match="unexpected end of JSON input"):
        evaluate("jsonpath('', '$.a')", scope)  # what a YAML mapping value becomes on Argo


def _workflow(path: str) -> str:
    path = path.replace('"', '\\"')  # inside a double-quoted YAML string, as Argo's example
    return textwrap.dedent(f"""
        apiVersion: argoproj.io/v1alpha1
        kind: Workflow
        metadata: {{generateName: staff-}}
        spec:
          entrypoint: main
          arguments:
            parameters:
            - name: staff
              value: '{{"staff": [{{"name": "Ada", "age": 36}}, {{"name": "Alan", "age": 41}}]}}'
          templates:
          - name: main
            inputs:
              parameters:
              - name: picked
                value: "{{{{=jsonpath(workflow.parameters.staff, '{path}')}}}}"
              - name: names
                value: "{{{{=jsonpath(workflow.parameters.staff, '$.staff[*].name')}}}}"
            script:
              image: busybox
              command: [sh]
              source: |
                printf '%s %s' '{{{{inputs.parameters.picked}}}}' '{{{{inputs.parameters.names}}}}'
        """)


def test_a_filter_and_a_wildcard_in_a_workflow(tmp_path: Path) -> None:
    result = run(_workflow('$.staff[?(@.name=="Alan")].age'), home=tmp_path / "home",
                 echo=False, timeout=60)
    assert result.phase == "Succeeded", result.message
    assert result.node(result.name).result == '[41] ["Ada","Alan"]'


def test_a_path_the_runner_refuses_stops_the_run_before_it_starts(tmp_path: Path) -> None:
    with pytest.raises(ManifestError) as caught:
        run(_workflow("$.staff.length"), home=tmp_path / "home", echo=False, timeout=60)
    message = str(caught.value)
    assert "spec.templates[0].inputs.parameters[0].value" in message
    assert "'.length' is not supported by the local runner" in message
    assert not (tmp_path / "home" / "runs").exists() or not any(
        (tmp_path / "home" / "runs").iterdir())
