"""Scheduled retraining (issue 15): the rendered ``sublimate-retrain`` manifest run end to end.

Two runs in one SUBLIMATE_HOME: the first promotes (no champion yet), the second trains a worse
model, which is published but not promoted; a rollback restores the champion before; a local
webhook receives both outcomes and a failed run's failed step, and the webhook's secret URL is
nowhere in what a run leaves. The gate's rules and the champion's evaluation with a user's
eval-entrypoint are checked in process, without training.
"""

from __future__ import annotations

import json
import os
import secrets
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import pytest

from sublimate.components.steps import gate, notify
from tests.conftest import REPO, run_cli, run_outputs

MANIFEST = "argo/sublimate-retrain.yaml"
# Small and quick: 1 node, a few epochs of digits reach ~0.9 accuracy; 1 epoch at a tiny
# learning rate stays near chance.
GOOD = ("-p", "nodes=1", "-p", "epochs=4")
WORSE = ("-p", "nodes=1", "-p", "epochs=1", "-p", "learning-rate=0.0001")


@dataclass
class Webhook:
    url: str
    token: str
    messages: list[dict] = field(default_factory=list)


@pytest.fixture
def webhook() -> Iterator[Webhook]:
    """A Slack-like incoming webhook on 127.0.0.1; its URL carries a secret token."""
    token = "T" + secrets.token_hex(12)
    received: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if self.path.endswith(token):
                received.append(json.loads(body))
                self.send_response(200)
            else:
                self.send_response(404)
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield Webhook(f"http://127.0.0.1:{server.server_address[1]}/services/{token}", token,
                      received)
    finally:
        server.shutdown()
        server.server_close()


def _registry(home: Path):  # -> Registry
    from sublimate.components.model.registry import Registry

    return Registry(str(home / "volumes" / "sublimate-data" / "registry"))


def _assert_secret_nowhere(home: Path, token: str, *texts: str) -> None:
    for text in texts:
        assert token not in text
    for path in home.rglob("*"):
        if path.is_file() and path.stat().st_size < 50_000_000:
            assert token.encode() not in path.read_bytes(), f"the webhook URL is in {path}"


def _fields(message: dict) -> dict[str, str]:
    (section,) = [block for block in message["blocks"] if "fields" in block]
    return dict(f["text"].lstrip("*").split("*\n", 1) for f in section["fields"])


def test_retraining_promotes_then_keeps_the_champion_and_rolls_back(
        home: Path, webhook: Webhook) -> None:
    env = {notify.URL_ENV: webhook.url}
    first = run_cli("run", MANIFEST, *GOOD, home=home, env=env)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    outputs = run_outputs(first.stdout)
    assert outputs["promoted"] == "true"
    assert outputs["reason"].startswith("no champion yet")
    champion = outputs["champion"]
    assert outputs["version"] == champion

    second = run_cli("run", MANIFEST, *WORSE, home=home, env=env)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    worse = run_outputs(second.stdout)
    assert worse["promoted"] == "false" and worse["champion"] == champion
    assert f"vs champion {champion}" in worse["reason"] and "the champion stays" in worse["reason"]
    assert float(worse["metric"]) < float(outputs["metric"])

    registry = _registry(home)
    assert registry.champion().id == champion  # the loser is published, not promoted
    loser = registry.get(worse["version"])
    lineage = loser.lineage
    # typed as declared, not texts
    assert lineage["settings"]["epochs"] == 1 and lineage["settings"]["learning-rate"] == 0.0001
    assert lineage["settings"]["eval-every-epoch"] is True
    assert lineage["settings"]["block-momentum"] is None  # auto
    assert lineage["dataset"]["url"] == "digits"
    assert len(lineage["dataset"]["metadata_sha256"]) == 64
    assert lineage["workflow"]["name"].startswith("sublimate-retrain-")
    assert len(lineage["workflow"]["uid"]) == 36
    assert lineage["metrics"]["accuracy"] == pytest.approx(float(worse["metric"]))
    assert lineage["code"]["version"] and lineage["image"]
    assert lineage["gate"] == {"promote": False, "reason": worse["reason"],
                               "champion": champion,
                               "champion_metric": pytest.approx(float(outputs["metric"]))}
    assert lineage["times"]["published"] and lineage["times"]["workflow_created"]

    # A person overrides the gate, then changes their mind: the rollback restores the champion.
    registry.promote(loser.id, "by hand, to test the rollback")
    assert registry.champion().id == loser.id
    assert registry.rollback("the nightly was right").id == champion
    assert registry.champion().id == champion

    assert len(webhook.messages) == 2, webhook.messages
    promoted, kept = webhook.messages
    assert "Succeeded" in promoted["text"] and "promoted:" in promoted["text"]
    assert f"accuracy {float(outputs['metric']):.6g}" in promoted["text"]
    assert "no champion yet" in promoted["text"]
    assert _fields(promoted)["Promoted"] == "yes" and _fields(promoted)["Champion"] == champion
    assert "not promoted" in kept["text"] and f"accuracy {float(worse['metric']):.6g}" in \
        kept["text"]
    assert _fields(kept)["Promoted"] == "no" and _fields(kept)["Outcome"] == "Succeeded"
    _assert_secret_nowhere(home, webhook.token, first.stdout, first.stderr, second.stdout,
                           second.stderr)


def test_a_failed_run_posts_the_failed_step_and_its_message(
        home: Path, webhook: Webhook, tmp_path: Path) -> None:
    missing = tmp_path / "no-such-dataset"
    failed = run_cli("run", MANIFEST, "-p", f"dataset={missing}", home=home,
                     env={notify.URL_ENV: webhook.url})
    assert failed.returncode == 1, failed.stdout[-3000:] + failed.stderr[-3000:]
    (message,) = webhook.messages
    assert _fields(message)["Outcome"] == "Failed" and _fields(message)["Promoted"] == "no"
    assert "Failed steps:" in message["text"]
    assert "- stage-data" in message["text"] and "no such directory" in message["text"]
    assert "the run ended before the gate" in message["text"]
    _assert_secret_nowhere(home, webhook.token, failed.stdout, failed.stderr)


def test_without_a_webhook_nothing_is_posted_and_it_is_said_once(
        home: Path, tmp_path: Path) -> None:
    environment = {key: value for key, value in os.environ.items() if key != notify.URL_ENV}
    failed = run_cli("run", MANIFEST, "-p", f"dataset={tmp_path / 'none'}", home=home,
                     env={**environment, notify.URL_ENV: ""})
    assert failed.returncode == 1
    (log,) = home.glob("runs/*/nodes/onExit*/main.log")
    assert log.read_text().count("no webhook configured") == 1


def test_the_gate_promotes_only_a_challenger_better_by_more_than_the_margin() -> None:
    assert gate.goal_of("accuracy", "auto") == "max"
    assert gate.goal_of("val_loss", "auto") == gate.goal_of("test-error", "auto") == "min"
    assert gate.goal_of("loss", "max") == "max"
    assert gate.decide("accuracy", "max", 0.0, 0.9)[0] is True
    assert gate.decide("accuracy", "max", 0.01, 0.95, "v1", 0.93) == (True, (
        "challenger accuracy 0.95 vs champion v1 0.93 on this test split (higher is better): "
        "better by 0.02 > promote-margin 0.01"))
    promote, reason = gate.decide("accuracy", "max", 0.05, 0.95, "v1", 0.93)
    assert not promote and "better by only 0.02, not more than promote-margin 0.05" in reason
    assert gate.decide("accuracy", "max", 0.0, 0.93, "v1", 0.93)[0] is False  # a tie keeps it
    assert gate.decide("loss", "min", 0.0, 0.10, "v1", 0.20)[0] is True
    assert gate.decide("loss", "min", 0.0, 0.30, "v1", 0.20)[1].endswith(
        "worse by 0.1; the champion stays")
    with pytest.raises(ValueError, match="the challenger's split is 'test', not a number"):
        gate.as_number("test", "the challenger's split")


def test_the_gate_scores_the_champion_with_the_users_eval_entrypoint(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The champion is evaluated by the user's own evaluation, on this run's data, not by the
    score it was published with."""
    monkeypatch.setattr(os, "environ", dict(os.environ))  # own evaluation sets the contract
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "my_eval.py").write_text(
        "import json, os, pathlib\n"
        "run = pathlib.Path(os.environ['SUBLIMATE_RUN_DIR'])\n"
        "data = pathlib.Path(os.environ['SUBLIMATE_DATA_DIR'])\n"
        "score = float((run / 'weights.txt').read_text()) * float((data / 'scale').read_text())\n"
        "(run / 'metrics.json').write_text(json.dumps({'f1': score}))\n")
    data = tmp_path / "data"
    data.mkdir()
    (data / "scale").write_text("0.5")
    published = tmp_path / "champion"
    published.mkdir()
    (published / "weights.txt").write_text("1.6")
    (published / "metrics.json").write_text(json.dumps({"f1": 0.99}))  # as it was published
    registry = _registry(tmp_path)
    champion = registry.publish(published, {"metrics": {"f1": 0.99}})
    registry.promote(champion.id, "first")

    def decide(challenger: str, margin: float) -> gate.Decision:
        return gate.run_gate(SimpleNamespace(
            metric="f1", metric_goal="auto", challenger_metric=challenger,
            promote_margin=margin, registry=str(tmp_path / "volumes" / "sublimate-data" /
                                                "registry"),
            workflow_uid="u", data_dir=data, eval_entrypoint="my_eval"))

    decision = decide("0.85", 0.01)  # 0.85 beats 1.6 x 0.5 = 0.8 now, not 0.99 as recorded
    assert decision.promote and decision.champion_metric == pytest.approx(0.8)
    assert decision.champion == champion.id and "better by 0.05 > promote-margin 0.01" in \
        decision.reason
    assert not decide("0.85", 0.1).promote
    assert registry.champion().id == champion.id  # the gate decides; it never promotes


def test_the_nightly_runs_the_retraining_pipeline() -> None:
    import yaml

    cron = yaml.safe_load((REPO / "argo" / "sublimate-train-nightly.yaml").read_text())
    assert cron["spec"]["workflowSpec"]["workflowTemplateRef"]["name"] == "sublimate-retrain"
    template = yaml.safe_load((REPO / MANIFEST).read_text())
    spec = template["spec"]
    assert spec["onExit"] == "notify"
    (dag,) = [t for t in spec["templates"] if "dag" in t]
    assert [t["name"] for t in dag["dag"]["tasks"]] == [
        "stage-data", "train", "evaluate", "gate", "register-model"]
    notify_template = next(t for t in spec["templates"] if t["name"] == "notify")
    (variable,) = notify_template["container"]["env"]
    assert variable["valueFrom"]["secretKeyRef"] == {
        "name": "sublimate-notify", "key": "webhook-url", "optional": True}
    parameters = {p["name"]: p for p in spec["arguments"]["parameters"]}
    assert parameters["registry"]["value"] == "/mnt/sublimate/registry"
    assert parameters["promote-margin"]["value"] == "0.0"
    assert parameters["metric-goal"]["enum"] == ["auto", "max", "min"]
    assert all(p.get("description") for p in parameters.values())
    # sublimate-train stays the simple interactive job
    train = yaml.safe_load((REPO / "argo" / "sublimate-train.yaml").read_text())
    assert "registry" not in {p["name"] for p in train["spec"]["arguments"]["parameters"]}
    assert "onExit" not in train["spec"]
