"""The one declaration of the train step's settings: parsing, bounds and cross-setting rules."""

from __future__ import annotations

import argparse

import pytest

from sublimate.components.base import settings as S
from sublimate.components.launch.request import plan_launch


@pytest.mark.parametrize(("name", "text", "message"), [
    ("sync-period", "0", "sync-period: 0 is below the minimum 1"),
    ("nodes", "two", "nodes: 'two' is not an integer"),
    ("nesterov", "yes", "nesterov: 'yes' is not true or false"),
    ("algorithm", "hogwild", "algorithm: 'hogwild' is not one of sync, async, bmuf, easgd"),
    ("block-momentum", "fast", "block-momentum: 'fast' is not a number or auto"),
    ("run-id", "../x", "run-id: '../x' does not match"),
])
def test_a_bad_value_is_one_line_naming_the_setting(name: str, text: str, message: str) -> None:
    with pytest.raises(S.SettingError) as error:
        S.BY_NAME[name].parse(text)
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


def test_values_are_typed() -> None:
    assert S.BY_NAME["nesterov"].parse("false") is False  # not bool("false")
    assert S.BY_NAME["block-momentum"].parse("auto") is None
    assert S.BY_NAME["block-momentum"].parse("0.5") == 0.5
    assert S.BY_NAME["epochs"].parse("3") == 3


@pytest.mark.parametrize(("texts", "message"), [
    ({"global-batch-size": "65"}, "global-batch-size 65 is not divisible by nodes x "
                                  "procs-per-node = 2"),
    ({"global-batch-size": "64", "nodes": "2", "procs-per-node": "2", "accumulation-steps": "3"},
     "global-batch-size 64 is not divisible by nodes x procs-per-node x accumulation-steps = "
     "2 x 2 x 3 = 12"),
    ({"algorithm": "bmuf", "block-momentum": "1"}, "block-momentum 1.0 must be below 1"),
    ({"algorithm": "easgd", "checkpoint-format": "dcp"}, "checkpoint-format dcp writes each "
     "replicated tensor once, so it needs algorithm sync"),
    ({"recovery": "per-step", "checkpoint-format": "dcp"}, "checkpoint-format dcp writes each "
     "replicated tensor once"),
    ({"rendezvous": "static", "nodes": "2:4", "recovery": "restart"}, "rendezvous static needs "
     "a fixed number of nodes and max-restarts 0"),
    ({"rendezvous": "static", "max-restarts": "2", "recovery": "restart"}, "rendezvous static "
     "needs a fixed number"),
    # etcd-v2's server: the launcher starts one on one machine; a cluster's is the user's
    ({"rendezvous": "etcd-v2", "scheduler": "kubernetes"}, "rendezvous etcd-v2 on kubernetes "
     "needs rendezvous-endpoint"),
    ({"rendezvous": "etcd-v2", "recovery": "per-step"}, "rendezvous etcd-v2: under recovery "
     "per-step every node meets only itself"),
])
def test_cross_setting_rules(texts: dict[str, str], message: str) -> None:
    with pytest.raises(S.SettingError, match="^" + message.replace("(", r"\(")):
        S.check(S.parse_values(texts))
    S.check(S.parse_values({}))  # the defaults are consistent


@pytest.mark.parametrize(("texts", "advice"), [
    # the README's example: 64 on 3 nodes
    ({"nodes": "3"}, "use global-batch-size 63 or 66, or nodes 2 or 4"),
    ({"nodes": "3", "procs-per-node": "2", "global-batch-size": "100"},
     "use global-batch-size 96 or 102, or nodes 1 or 2"),
    # elastic: a batch that every size from 2 to 3 nodes divides
    ({"nodes": "2:3", "max-restarts": "1"}, "use global-batch-size 60 or 66"),
    ({"nodes": "2", "procs-per-node": "2", "accumulation-steps": "3"},
     "use global-batch-size 60 or 72"),
])
def test_a_batch_that_does_not_divide_is_refused_with_the_nearest_that_do(
        texts: dict[str, str], advice: str) -> None:
    with pytest.raises(S.SettingError) as refused:
        S.check(S.parse_values(texts))
    assert str(refused.value).endswith(": " + advice)
    suggested = [int(word) for word in advice.split(", or")[0].split() if word.isdigit()]
    for batch in suggested:  # each value it names passes
        S.check(S.parse_values({**texts, "global-batch-size": str(batch)}))


def test_accumulation_does_not_apply_to_async() -> None:
    S.check(S.parse_values({"algorithm": "async", "accumulation-steps": "3"}))


def test_flags_round_trip_through_argparse() -> None:
    chosen = S.settings(reader="worker")
    parser = argparse.ArgumentParser()
    S.add_arguments(parser, chosen)
    values = vars(parser.parse_args(["--nesterov", "false", "--block-momentum", "auto",
                                     "--sync-period", "4"]))
    assert values["nesterov"] is False and values["block_momentum"] is None
    again = vars(parser.parse_args(S.to_flags(values, chosen)))
    assert again == values
    with pytest.raises(SystemExit):
        parser.parse_args(["--sync-period", "0"])


def test_a_paradigm_sees_only_the_settings_that_apply_to_it() -> None:
    from sublimate.components.paradigms import paradigm_class

    config = paradigm_class("bmuf").configure(S.parse_values({"sync-period": "4"}))
    assert config.sync_period == 4 and config.nesterov is True
    with pytest.raises(AttributeError, match="sync_period"):
        _ = paradigm_class("sync").configure(S.parse_values({})).sync_period
    with pytest.raises(S.SettingError, match="sync-period"):  # checked by its declaration
        paradigm_class("easgd").configure({"sync_period": 0})


@pytest.mark.parametrize("algorithm", S.PARADIGM_NAMES)
def test_each_paradigm_config_field_is_a_setting_declared_for_that_paradigm(
        algorithm: str) -> None:
    import dataclasses

    from sublimate.components.paradigms import paradigm_class

    kinds = {"integer": int, "number": float, "boolean": bool, "string": str}
    config = paradigm_class(algorithm).Config
    assert dataclasses.is_dataclass(config) and config.__dataclass_params__.frozen
    declared = {s.attribute: s for s in S.settings(paradigm=algorithm)}
    hints = __import__("typing").get_type_hints(config)
    for field in dataclasses.fields(config):
        assert field.name in declared, f"{algorithm}: {field.name} is no setting of it"
        setting = declared[field.name]
        expected = kinds[setting.kind] | None if setting.auto else kinds[setting.kind]
        assert hints[field.name] == expected, (field.name, hints[field.name])


def test_the_typed_settings_are_the_declared_ones_field_for_field() -> None:
    import dataclasses
    import typing

    from sublimate.components.base.train_settings import TrainSettings

    kinds = {"integer": int, "number": float, "boolean": bool, "string": str}
    fields = dataclasses.fields(TrainSettings)
    declared = S.settings(step="train")
    # the same settings in the same order: a setting added to one list and not the other fails
    assert [f.name for f in fields] == [s.attribute for s in declared]
    hints = typing.get_type_hints(TrainSettings)
    for field, setting in zip(fields, declared, strict=True):
        kind = S.NodeRange if setting.elastic else kinds[setting.kind]
        assert hints[field.name] == (kind | None if setting.auto else kind), field.name
        default = field.default_factory() if field.default is dataclasses.MISSING \
            else field.default
        assert default == setting.default_value, field.name
    assert TrainSettings().nodes.minimum == 2 and not TrainSettings().nodes.ranged


def test_a_new_setting_appears_everywhere_from_its_one_declaration(
        monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """Add a setting's declaration and its typed field: the pipeline's parameter (UI form, types
    annotation), the train template's input, the launcher's flag, and the worker's argument
    all follow."""
    import dataclasses

    from sublimate.components.launch import launcher
    from sublimate.components.launch.request import TrainRequest
    from sublimate.components.processes import worker
    from sublimate.components.processes.request import WorkerRequest
    from sublimate.components.steps import train
    from sublimate.pipelines.sublimate_train import train_pipeline

    dropout = S.Setting("dropout", 0.1, "Dropout probability of the hidden layers.",
                        kind="number", minimum=0, maximum=1)
    monkeypatch.setattr(S, "SETTINGS", (*S.SETTINGS, dropout))
    monkeypatch.setattr(S, "BY_NAME", {**S.BY_NAME, "dropout": dropout})
    # its typed field (in TrainSettings, which both requests extend)
    for module, request in ((train, TrainRequest), (worker, WorkerRequest)):
        typed = dataclasses.make_dataclass(request.__name__, [("dropout", float, 0.1)],
                                           bases=(request,), frozen=True, kw_only=True)
        monkeypatch.setattr(module, request.__name__, typed)

    manifest = train_pipeline().to_dict()
    parameters = {p["name"]: p for p in manifest["spec"]["arguments"]["parameters"]}
    assert parameters["dropout"]["value"] == "0.1"
    assert parameters["dropout"]["description"] == "Dropout probability of the hidden layers."
    annotation = manifest["metadata"]["annotations"]["sublimate.dev/parameter-types"]
    assert '"dropout":{"maximum":1,"minimum":0,"type":"number"}' in annotation
    step = next(t for t in manifest["spec"]["templates"] if t["name"] == "train")
    assert {"name": "dropout", "default": "0.1"} in step["inputs"]["parameters"]
    assert "{{inputs.parameters.dropout}}" in step["container"]["args"]
    dag = next(t for t in manifest["spec"]["templates"] if "dag" in t)
    task = next(t for t in dag["dag"]["tasks"] if t["name"] == "train")
    assert {"name": "dropout", "value": "{{workflow.parameters.dropout}}"} in \
        task["arguments"]["parameters"]

    args = train.parse_args(["--data-dir", str(tmp_path), "--run-dir", str(tmp_path),
                                "--dropout", "0.3"])
    assert args.dropout == 0.3
    flags = launcher.training_flags(args, plan_launch(args))
    assert flags[flags.index("--dropout") + 1] == "0.3"  # passed on to every worker
    parsed = worker.parse_args(["--data-dir", "d", "--run-dir", "r", *flags])
    assert parsed.dropout == 0.3
    with pytest.raises(SystemExit):  # bounded by the declaration, in the worker too
        worker.parse_args(["--data-dir", "d", "--run-dir", "r", "--dropout", "2"])
    assert parsed.values()["dropout"] == 0.3


def test_every_step_cli_prints_its_help_with_a_literal_percent_in_a_description(
        capsys: pytest.CaptureFixture[str]) -> None:
    # link-loss's description says "0.1%": argparse reads % as a format code unless doubled.
    assert any("%" in setting.description for setting in S.SETTINGS)
    parser = argparse.ArgumentParser(prog="train")
    S.add_arguments(parser, S.SETTINGS)
    with pytest.raises(SystemExit) as exit_info:
        parser.parse_args(["--help"])
    assert exit_info.value.code == 0
    assert "e.g. 0.1%;" in capsys.readouterr().out


def test_etcd_v2_on_kubernetes_passes_with_an_endpoint_and_elastic_nodes() -> None:
    S.check(S.parse_values({"rendezvous": "etcd-v2", "scheduler": "kubernetes",
                            "rendezvous-endpoint": "etcd.default.svc:2379", "nodes": "1:2"}))
    S.check(S.parse_values({"rendezvous": "etcd-v2", "scheduler": "local_netns"}))
    with pytest.raises(S.SettingError, match=r"^rendezvous-endpoint: "):
        S.parse_values({"rendezvous-endpoint": "http://etcd:2379"})  # HOST:PORT, no scheme
