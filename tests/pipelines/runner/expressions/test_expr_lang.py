"""Argo's expressions (expr-lang) in the local runner, and ``when``'s govaluate tokens.

Expected values follow expr-lang's documented semantics (docs/language-definition.md,
parser/operator/operator.go, vm/runtime/runtime.go) and Argo's use of them
(util/template/expression_template.go, util/expr/env/env.go, workflow/controller/scope.go,
workflow/controller/steps.go shouldExecute). The manifests are ours.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sublimate.pipelines.runner import ManifestError
from sublimate.pipelines.runner.expressions.conditions import ExpressionError, evaluate_when
from sublimate.pipelines.runner.expressions.expr_lang import (
    evaluate,
    go_format,
    output_parameter,
    render_tag,
)
from sublimate.pipelines.runner.harness import WorkflowRun, run

SCOPE = {
    "inputs.parameters.n": "21",
    "inputs.parameters.name": "World",
    "inputs.parameters.empty": "",
    "tasks.foo-bar.outputs.result": "hyphen",
    "tasks.a.status": "Succeeded",
    "workflow.name": "wf-1",
}


@pytest.mark.parametrize(("source", "expected"), [
    # precedence: * before +, ** right-associative and above unary minus, ! below *
    ("1 + 2 * 3", 7),
    ("(1 + 2) * 3", 9),
    ("2 ** 3 ** 2", 512.0),
    ("-2 ** 2", -4.0),
    ("!true == false", True),
    ("not false and true", True),
    ("true || false && false", True),
    # / is always float; % on integers, truncating toward zero like Go
    ("7 / 2", 3.5),
    ("6 / 3", 2.0),
    ("-7 % 3", -1),
    # strings: + joins; contains/startsWith/endsWith/matches; comparisons
    ('"a" + "b"', "ab"),
    ('"foobar" contains "oba"', True),
    ('"foobar" startsWith "foo" and "foobar" endsWith "bar"', True),
    ('"abc" matches "^a.c$"', True),
    ('"abc" < "abd"', True),
    # mixed types: == across types is false, numbers compare across int and float
    ('"1" == 1', False),
    ("1 == 1.0", True),
    ("2 > 1.5", True),
    # chained comparison: a < b < c is a < b && b < c
    ("1 < 2 < 3", True),
    ("3 > 2 > 2", False),
    # in / not in, ranges
    ("2 in [1, 2, 3]", True),
    ('"k" in {"k": 1}', True),
    ("4 not in 1..3", True),
    ("1..3", [1, 2, 3]),
    # ?: and ??, ternary right-associative
    ("true ? 1 : 2", 1),
    ("false ? 1 : true ? 2 : 3", 2),
    ("false ?: true", True),
    ("nil ?? 5", 5),
    ("inputs.parameters.missing ?? 'dflt'", "dflt"),
    ("inputs.parameters.empty ?? 'dflt'", ""),  # "" is not nil
    # member and index access on the expanded scope
    ("inputs.parameters.name", "World"),
    ("inputs['parameters']['n']", "21"),
    ('tasks["foo-bar"].outputs.result', "hyphen"),
    ("tasks.a?.missing?.deeper", None),
    ("[1, 2, 3][-1]", 3),
    ("[1, 2, 3][1:]", [2, 3]),
    ('{"a": {"b": 1}}.a.b', 1),
    # predicates with #, and the pipe
    ("filter([1, 2, 3, 4], # % 2 == 0)", [2, 4]),
    ("map([1, 2], {# * 10})", [10, 20]),
    ("all([1, 2], # > 0) && any([1, 2], # > 1) && none([1], # > 1)", True),
    ("count([1, 2, 3], # > 1)", 2),
    ('map([{"n": 1}, {"n": 2}], .n)', [1, 2]),
    ("[3, 1] | map(# + 1)", [4, 2]),
    # Argo's helpers and expr builtins
    ("asInt(inputs.parameters.n) * 2", 42),
    ("asFloat('1.5') + 1", 2.5),
    ("string(42) + '!'", "42!"),
    ("len('abc') + len([1])", 4),
    ("toJson({'b': [1, 'x'], 'a': true})", '{"a":true,"b":[1,"x"]}'),
    ("jsonpath('{\"a\": {\"b\": [5, 6]}}', '$.a.b[1]')", 6.0),  # Go's float64
    ("upper('x') + lower('Y') + trim('  z ')", "Xyz"),
    ("split('a,b', ',')", ["a", "b"]),
    ("join(['a', 'b'], '-')", "a-b"),
    ("max(1, 5, 3) + min([4, 2])", 7),
    # sprig, with sprig's argument order
    ("sprig.upper(inputs.parameters.name)", "WORLD"),
    ("sprig.replace('o', '0', 'foo')", "f00"),
    ("sprig.trim('  x ')", "x"),
    ("sprig.contains('ob', 'foobar')", True),
    ("sprig.hasPrefix('foo', 'foobar') && sprig.hasSuffix('bar', 'foobar')", True),
    ("sprig.default('d', inputs.parameters.empty)", "d"),
    ("sprig.default('d', 'given')", "given"),
    ("sprig.add(1, '2', 3) + sprig.sub(10, 4) + sprig.mul(2, 3) + sprig.div(7, 2)", 21),
    ("sprig.max(1, 9, 3) - sprig.min(4, 2)", 7),
    ("sprig.atoi('12') + 1", 13),
    ("sprig.toString(5) + sprig.join('/', ['a', 'b'])", "5a/b"),
    ("sprig.splitList(',', 'x,y')", ["x", "y"]),
])
def test_expr_semantics(source: str, expected: object) -> None:
    result = evaluate(source, SCOPE)
    assert result == expected and type(result) is type(expected)


@pytest.mark.parametrize(("source", "message"), [
    ("inputs.parameters.n * 2", "invalid operation: string * int"),  # parameters are strings
    ("'a' + 1", "invalid operation: string + int"),
    ("'a' < 1", "invalid operation: string < int"),
    ("1 && true", "bool is needed"),
    ("undefined_name", "unknown name undefined_name"),
    ("inputs.parameters.missing.deeper", "cannot fetch deeper from <nil>"),
    ("[1][5]", "index out of range"),
    ("asInt('1.5')", 'strconv.Atoi: parsing "1.5"'),
    ("1 % 0", "integer divide by zero"),
    ("nil ?? 1 + 2", "coalesce expressions (??) cannot be mixed"),
    ("groupBy([1], #)", "groupBy() is not supported"),
    ("sprig.regexFind('a', 'b')", "sprig.regexFind is not supported"),
    ("nosuch(1)", "unknown function nosuch()"),
    ("let x = 1; x", "'let' is not supported"),
    ("# > 1", "predicates are only allowed"),
    ("1 +", "unexpected end of expression"),
])
def test_expr_errors_name_what_is_wrong(source: str, message: str) -> None:
    with pytest.raises(ExpressionError) as caught:
        evaluate(source, SCOPE)
    assert message in str(caught.value)


def test_tag_text_and_output_parameter_text_follow_go() -> None:
    # {{=...}}: JSON of the result, a string's quotes dropped (expressionReplaceCore)
    assert render_tag("asInt(inputs.parameters.n) * 2", SCOPE) == "42"
    assert render_tag("6 / 3", SCOPE) == "2"
    assert render_tag("'a<b'", SCOPE) == "a<b"
    assert render_tag("['a<b', 1.5]", SCOPE) == '["a\\u003cb",1.5]'
    assert render_tag("{'k': true}", SCOPE) == '{"k":true}'
    # a name or member path the scope lacks is "missing", unless guarded by ??
    with pytest.raises(ExpressionError, match=r"inputs\.parameters\.nope is missing"):
        render_tag("inputs.parameters.nope == nil", SCOPE)
    assert render_tag("inputs.parameters.nope ?? 'x'", SCOPE) == "x"
    with pytest.raises(ExpressionError, match="result is nil"):
        render_tag("nil", SCOPE)
    # valueFrom.expression: Go's %v (wfv1.AnyStringPtr)
    assert output_parameter("[1, 'a']", SCOPE) == "[1 a]"
    assert output_parameter("1000000.0", SCOPE) == "1e+06"
    assert output_parameter("2.50", SCOPE) == "2.5"
    assert go_format({"b": 1, "a": "x"}) == "map[a:x b:1]"


@pytest.mark.parametrize(("when", "expected"), [
    ("heads == heads", True),
    ("tails != heads", True),
    ('"foo-bar" == "foo-bar"', True),
    ("'prod-eu' == 'prod-eu'", True),
    ("1 + 2 == 3", True),
    ("-1 < 0", True),
    ("a.b == a.b", True),
])
def test_when_keeps_govaluate_grammar(when: str, expected: bool) -> None:
    assert evaluate_when(when) is expected


@pytest.mark.parametrize(("when", "message"), [
    # govaluate reads foo-bar as foo - bar; Argo makes the variables strings, and '-' refuses
    ("foo-bar == foo-bar", "Value 'foo' cannot be used with the modifier '-'"),
    ("prod-eu == prod-eu", "cannot be used with the modifier '-'"),
    ("_x == _x", "Invalid token: '_'"),
    ("1.2.3 == 1", "Unable to parse numeric value '1.2.3'"),
])
def test_when_rejects_what_govaluate_rejects(when: str, message: str) -> None:
    with pytest.raises(ExpressionError) as caught:
        evaluate_when(when)
    assert message in str(caught.value)


# ------------------------------------------------------------------------------ end to end

def _wf(templates: str, args: str = "") -> str:
    return textwrap.dedent("""
        apiVersion: argoproj.io/v1alpha1
        kind: Workflow
        metadata: {generateName: expr-}
        spec:
          entrypoint: main
        """) + textwrap.indent(textwrap.dedent(args), "  ") + "  templates:\n" + \
        textwrap.indent(textwrap.dedent(templates), "  ")


def _run(text: str, tmp_path: Path) -> WorkflowRun:
    return run(text, home=tmp_path / "home", echo=False, timeout=60)


ECHO = """
- name: echo
  inputs: {parameters: [{name: text}]}
  script:
    command: [sh]
    source: "printf '%s' '{{inputs.parameters.text}}'"
"""


def test_expression_tag_in_an_argument(tmp_path: Path) -> None:
    wf = _wf(textwrap.dedent("""
        - name: main
          inputs: {parameters: [{name: n}, {name: who}]}
          steps:
          - - name: double
              template: echo
              arguments:
                parameters:
                - {name: text, value: "{{=asInt(inputs.parameters.n) * 2}}"}
            - name: shout
              template: echo
              arguments:
                parameters:
                - name: text
                  value: "hello {{=sprig.upper(inputs.parameters.who)}}!"
        """) + ECHO, """
        arguments:
          parameters: [{name: n, value: "21"}, {name: who, value: world}]
        """)
    result = _run(wf, tmp_path)
    assert result.phase == "Succeeded"
    assert result.node("double").result == "42"
    assert result.node("shout").result == "hello WORLD!"


def test_value_from_expression_chooses_between_two_task_outputs(tmp_path: Path) -> None:
    wf = _wf("""
        - name: main
          dag:
            tasks:
            - {name: flip, template: emit, arguments: {parameters: [{name: v, value: tails}]}}
            - name: heads
              template: emit
              depends: flip
              when: "{{tasks.flip.outputs.result}} == heads"
              arguments: {parameters: [{name: v, value: from-heads}]}
            - name: tails
              template: emit
              depends: flip
              when: "{{tasks.flip.outputs.result}} == tails"
              arguments: {parameters: [{name: v, value: from-tails}]}
          outputs:
            parameters:
            - name: chosen
              globalName: chosen
              valueFrom:
                expression: >-
                  tasks.heads.status == 'Succeeded' ? tasks.heads.outputs.result
                  : tasks.tails.outputs.result
            - name: count
              valueFrom: {expression: "len(filter(['a', 'b', 'c'], # != 'b'))"}
        - name: emit
          inputs: {parameters: [{name: v}]}
          script:
            command: [sh]
            source: "printf '%s' '{{inputs.parameters.v}}'"
        """)
    result = _run(wf, tmp_path)
    assert result.phase == "Succeeded"
    assert result.node("heads").phase == "Skipped"
    assert result.outputs == {"chosen": "from-tails"}
    main = next(n for n in result.nodes.values() if "count" in n.outputs)  # the DAG's node
    assert main.outputs == {"chosen": "from-tails", "count": "2"}


def test_from_expression_artifact(tmp_path: Path) -> None:
    wf = _wf("""
        - name: main
          inputs: {parameters: [{name: pick}]}
          steps:
          - - {name: a, template: make, arguments: {parameters: [{name: v, value: A}]}}
            - {name: b, template: make, arguments: {parameters: [{name: v, value: B}]}}
          - - name: show
              template: show
              arguments:
                artifacts:
                - name: in
                  fromExpression: >-
                    inputs.parameters.pick == 'a' ? steps.a.outputs.artifacts.out
                    : steps.b.outputs.artifacts.out
          outputs:
            artifacts:
            - {name: picked, fromExpression: "steps.b.outputs.artifacts.out"}
        - name: make
          inputs: {parameters: [{name: v}]}
          script:
            command: [sh]
            source: "printf '%s' '{{inputs.parameters.v}}' > /tmp/out.txt"
          outputs:
            artifacts: [{name: out, path: /tmp/out.txt}]
        - name: show
          inputs: {artifacts: [{name: in, path: /tmp/in.txt}]}
          container: {command: [cat, /tmp/in.txt]}
        """, """
        arguments: {parameters: [{name: pick, value: a}]}
        """)
    result = _run(wf, tmp_path)
    assert result.phase == "Succeeded", result.message
    assert result.node("show").log_text().strip() == "A"


def test_from_expression_must_name_an_artifact(tmp_path: Path) -> None:
    wf = _wf("""
        - name: main
          steps:
          - - name: show
              template: show
              arguments:
                artifacts: [{name: in, fromExpression: "'just a string'"}]
        - name: show
          inputs: {artifacts: [{name: in, path: /tmp/in.txt}]}
          container: {command: [cat, /tmp/in.txt]}
        """)
    result = _run(wf, tmp_path)
    assert result.node("show").phase == "Error"
    assert "is not an artifact" in result.node("show").message


def test_unsupported_function_is_refused_before_the_run(tmp_path: Path) -> None:
    wf = _wf(textwrap.dedent("""
        - name: main
          steps:
          - - name: a
              template: echo
              arguments:
                parameters: [{name: text, value: "{{=sprig.regexFind('a+', 'caab')}}"}]
        """) + ECHO)
    with pytest.raises(ManifestError, match=r"sprig\.regexFind is not supported"):
        _run(wf, tmp_path)


def test_when_with_an_unquoted_hyphenated_word_errors(tmp_path: Path) -> None:
    wf = _wf(textwrap.dedent("""
        - name: main
          inputs: {parameters: [{name: region}]}
          steps:
          - - name: a
              template: echo
              when: "{{inputs.parameters.region}} == eu-west"
              arguments: {parameters: [{name: text, value: x}]}
        """) + ECHO, """
        arguments: {parameters: [{name: region, value: eu-west}]}
        """)
    result = _run(wf, tmp_path)
    assert result.node("a").phase == "Error"
    assert "cannot be used with the modifier '-'" in result.node("a").message


def test_a_run_without_expressions_does_not_load_lark() -> None:
    code = ("import sys; from sublimate.pipelines.runner.manifest.load import check_workflow; "
            "import sublimate.pipelines.runner.engine; "
            "print('lark' in sys.modules,"
            " 'sublimate.pipelines.runner.expressions.expr_lang' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["False", "False"]
