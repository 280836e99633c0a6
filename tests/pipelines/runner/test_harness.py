"""The test harness for Hera users (argoproj-labs/hera#892): a Hera workflow run locally through
``sublimate.pipelines.runner.run`` and the ``argo_run`` pytest fixture, with what a test asserts
on (phase, outputs, nodes, the order they started).

The script steps' arguments carry no annotations: Hera 7.1 reads them from the signature, and
this module's ``from __future__ import annotations`` makes them text it cannot read."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hera.workflows import DAG, Parameter, Workflow, WorkflowTemplate, script
from hera.workflows.models import ValueFrom

from sublimate.pipelines.runner import (
    NodePhase,
    NodeView,
    ParameterError,
    RunResult,
    WorkflowRun,
    run,
    run_workflow,
)
from tests.conftest import REPO

pytest_plugins = ["pytester"]



@script(outputs=[Parameter(name="total", value_from=ValueFrom(path="/tmp/total"),
                           global_name="total")])
def add(a, b):
    with open("/tmp/total", "w") as f:
        f.write(str(a + b))


@script()
def report(total):
    print(f"the total is {total}")


@script()
def celebrate(total):
    print(f"a big total: {total}")


@script()
def announce(total):
    print("announced", total)


def adder(kind: type[Workflow] = Workflow) -> Workflow:
    """sum -> report; sum -> big (only when the total is over 100) -> announce."""
    # a WorkflowTemplate has a name; a workflow submitted from it is named after it
    naming = {"name": "adder"} if kind is WorkflowTemplate else {"generate_name": "adder-"}
    with (kind(**naming, entrypoint="main", arguments={"x": "2", "y": "3"}) as workflow,
          DAG(name="main")):
        total = add(name="sum", arguments={"a": "{{workflow.parameters.x}}",
                                            "b": "{{workflow.parameters.y}}"})
        shown = report(name="report", arguments={"total": total.get_parameter("total")})
        big = celebrate(name="big", arguments={"total": total.get_parameter("total")},
                        when=f"{total.get_parameter('total')} > 100")
        told = announce(name="announce", arguments={"total": total.get_parameter("total")})
        total >> [shown, big]
        big.on_success(told)
    return workflow


def test_a_hera_workflow_runs_to_what_a_test_asserts_on(tmp_path: Path) -> None:
    result = run(adder(), home=tmp_path, echo=False)

    assert isinstance(result, WorkflowRun)
    assert result.phase == "Succeeded" and result.succeeded and result.message == ""
    assert result.name.startswith("adder-")
    assert result.outputs == {"total": "5"}
    assert result.node("sum").outputs == {"total": "5"}
    assert result.node("report").phase == NodePhase.SUCCEEDED
    assert "the total is 5" in result.node("report").log_text()
    # a false `when` skips the node; what depends on its success is omitted, as on Argo
    assert result.node("big").phase == "Skipped"
    assert result.node("big").message == "when '5 > 100' evaluated false"
    assert result.node("announce").phase == "Omitted"
    assert not result.node("announce").ran
    assert result.phases() == {result.name: "Succeeded", "sum": "Succeeded",
                               "report": "Succeeded", "big": "Skipped", "announce": "Omitted"}
    # the workflow's root first, then the DAG's order; nodes that never ran are not listed
    assert result.started_order == [result.name, "sum", "report"]
    sum_node = result.node("sum")
    assert isinstance(sum_node, NodeView) and sum_node.type == "Pod"
    assert sum_node.started is not None and sum_node.finished is not None
    assert sum_node.started <= sum_node.finished <= result.node("report").started
    assert result.run_folder == tmp_path / "runs" / result.name
    assert (result.run_folder / "status.json").is_file()
    assert result.assert_succeeded() is result


def test_parameters_change_the_run_and_any_value_is_made_text(tmp_path: Path) -> None:
    result = run(adder(), {"x": 200, "y": 1}, home=tmp_path, echo=False)

    assert result.outputs == {"total": "201"}
    assert result.phases()["big"] == "Succeeded"
    assert result.phases()["announce"] == "Succeeded"
    order = result.started_order
    assert order[:2] == [result.name, "sum"] and order.index("big") < order.index("announce")
    assert set(order) == {result.name, "sum", "report", "big", "announce"}


def test_an_unknown_node_names_the_known_ones(tmp_path: Path) -> None:
    result = run(adder(), home=tmp_path, echo=False)
    with pytest.raises(KeyError, match=r"no node 'sun' .*nodes: .*announce, big, report, sum"):
        result.node("sun")
    assert result.node(f"{result.name}.sum") == result.node("sum")  # the full node name works


@pytest.fixture
def temporary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where tempfile makes folders (the default homes), under tmp_path: nothing left in /tmp."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def test_a_workflow_template_runs_as_submitted_in_a_temporary_home(temporary: Path) -> None:
    template = adder(WorkflowTemplate)
    assert template.to_dict()["kind"] == "WorkflowTemplate"

    result = run(template, echo=False)

    assert result.phase == "Succeeded" and result.outputs == {"total": "5"}
    assert result.name.startswith("adder-")  # its name became the workflow's generateName
    assert len(result.name) == len("adder-") + 5
    home = result.run_folder.parent.parent
    assert home.parent == temporary and home.name.startswith("sublimate-run-")


def test_run_workflow_takes_a_hera_object_with_parameters_and_options_optional(
        temporary: Path) -> None:
    result = run_workflow(adder())
    assert isinstance(result, RunResult) and result.run_dir.parent.parent.parent == temporary
    assert result.phase == "Succeeded" and result.outputs["parameters"] == {"total": "5"}

    assert run_workflow(adder(), {"x": 98}).node("big").phase == "Succeeded"


def test_a_failed_run_says_which_node_failed_and_what_it_printed(tmp_path: Path) -> None:
    result = run(adder(), {"x": "two"}, home=tmp_path, echo=False)  # "two" + 3: a TypeError

    assert result.phase == "Failed" and not result.succeeded
    assert result.node("sum").phase == "Failed"
    assert result.node("report").phase == "Omitted"
    with pytest.raises(AssertionError, match=r"(?s)sum: Failed.*\| TypeError"):
        result.assert_succeeded()


@script()
def nap() -> None:
    import time

    time.sleep(30)


def test_a_timeout_stops_the_run_as_a_deadline_would(tmp_path: Path) -> None:
    with Workflow(generate_name="sleepy-", entrypoint="main") as workflow, DAG(name="main"):
        nap(name="nap")

    result = run(workflow, home=tmp_path, timeout=1, echo=False)

    assert result.phase == "Failed"
    assert "deadline of 1s" in result.message
    assert result.node("nap").phase == "Failed"
    duration = result.result.finished_at - result.result.started_at  # type: ignore[operator]
    assert duration.total_seconds() < 15


def test_unknown_parameters_and_other_objects_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ParameterError):
        run(adder(), {"z": 1}, home=tmp_path, echo=False)
    with pytest.raises(TypeError, match="expected a Hera Workflow"):
        run(42, home=tmp_path)  # type: ignore[arg-type]
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


FIXTURE_TEST = '''
from hera.workflows import DAG, Parameter, Workflow, script
from hera.workflows.models import ValueFrom


@script(outputs=[Parameter(name="greeting", value_from=ValueFrom(path="/tmp/out"),
                           global_name="greeting")])
def hello(name: str):
    with open("/tmp/out", "w") as f:
        f.write(f"hello {name}")


with (Workflow(generate_name="hello-", entrypoint="main", arguments={"name": "you"}) as wf,
      DAG(name="main")):
    hello(name="greet", arguments={"name": "{{workflow.parameters.name}}"})


def test_greeting(argo_run, tmp_path):
    run = argo_run(wf, {"name": "Argo"})
    assert run.phase == "Succeeded"
    assert run.outputs == {"greeting": "hello Argo"}
    assert run.node("greet").outputs == {"greeting": "hello Argo"}
    assert run.started_order[1:] == ["greet"]
    assert run.run_folder.parent.parent == argo_run.home
    assert argo_run.home.parent == tmp_path
'''


def test_the_argo_run_fixture_comes_with_the_installed_package(
        pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_hello=FIXTURE_TEST)

    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)
    # it is the `sublimate` pytest11 entry point's: without that plugin there is no fixture
    disabled = pytester.runpytest("-p", "no:sublimate", "-p", "no:cacheprovider")
    disabled.assert_outcomes(errors=1)
    disabled.stdout.fnmatch_lines(["*fixture 'argo_run' not found*"])


TYPO_TEST = '''
import pytest
from hera.workflows import Container, DAG, Parameter, Workflow

from sublimate.pipelines.runner import ManifestError

with Workflow(generate_name="typo-", entrypoint="main",
              arguments=[Parameter(name="name", value="you")]) as wf:
    say = Container(name="say", image="alpine:3.20", command=["echo"],
                    inputs=[Parameter(name="name")], args=["{{inputs.parameters.nmae}}"])
    with DAG(name="main"):
        say(name="greet", arguments={"name": "{{workflow.parameters.name}}"})


def test_linted_first(argo_run):
    with pytest.raises(ManifestError, match="sublimate lint: .*nmae"):
        argo_run(wf)
    assert not (argo_run.home / "runs").exists()  # nothing ran


def test_or_not(argo_run):
    assert argo_run(wf, lint=False).phase in ("Failed", "Error")  # what the runner makes of it
'''


def test_the_argo_run_fixture_lints_before_it_runs(pytester: pytest.Pytester) -> None:
    # a typo that `sublimate lint` catches up front is refused before anything runs
    pytester.makepyfile(test_typo=TYPO_TEST)
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=2)


def test_a_workflow_from_a_template_given_as_a_hera_object_or_a_yaml_file(
        tmp_path: Path) -> None:
    from hera.workflows.models import WorkflowTemplateRef

    submit = Workflow(generate_name="from-adder-", arguments={"x": "40"},
                      workflow_template_ref=WorkflowTemplateRef(name="adder"))

    joined = run(submit, templates=[adder(WorkflowTemplate)], home=tmp_path, echo=False)
    assert joined.phase == "Succeeded" and joined.outputs == {"total": "43"}

    manifest = tmp_path / "adder.yaml"
    manifest.write_text(adder(WorkflowTemplate).to_yaml())
    from_file = run(manifest, {"y": 4}, home=tmp_path, echo=False)
    assert from_file.outputs == {"total": "6"} and from_file.name.startswith("adder-")


def test_the_documented_example_passes(pytester: pytest.Pytester) -> None:
    page = (REPO / "docs" / "local-runner.md").read_text()
    section = page[page.index("### Testing your workflows (Hera)"):]
    block = re.search(r"```python\n(.*?)```", section, re.S)
    assert block is not None
    pytester.makepyfile(test_readme_example=block.group(1))

    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)
