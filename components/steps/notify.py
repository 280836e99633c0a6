"""The retraining pipeline's exit handler: post the outcome to a Slack-compatible webhook.

It runs after the workflow, whatever its end, and posts one JSON message (``text``, and Slack
``blocks`` with the same facts as fields): the outcome, the chosen metric, whether the
challenger was promoted and why, the published version, and for a failed run every failed step
with its message (Argo's ``{{workflow.failures}}``).

The webhook's URL is a credential (whoever holds it can post to the channel), so it comes only
from the environment, ``SUBLIMATE_NOTIFY_URL``, which a cluster fills from the optional Secret
``sublimate-notify`` (key ``webhook-url``) and a local run takes from the runner's own
environment. It never appears in a manifest, a parameter or a log line, error messages included.
No URL: nothing is posted, and the log says so once.

A notification is best effort: a webhook that is down is reported in the log and the step still
succeeds, because turning a good retraining into a failed workflow would be the wrong news.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

from sublimate.components.base import run_files
from sublimate.components.steps import gate, register_model

STEP = "notify"
URL_ENV = "SUBLIMATE_NOTIFY_URL"
SECRET = "sublimate-notify"
SECRET_KEY = "webhook-url"
TIMEOUT_SECONDS = 10
MAX_FAILURES = 10  # a message is read by a person: the first ones, then a count


def failures(text: str) -> list[dict[str, str]]:
    """Argo's ``{{workflow.failures}}`` as a list, one per failed node.

    operator.go sets it to the compact JSON list *quoted as a Go string* (``strconv.Quote``),
    so it is decoded twice; no failures is the quoted ``"null"``. Plain JSON is read too.
    """
    try:
        listed = json.loads(text) if text.strip() else []
        if isinstance(listed, str):  # the quoted form
            listed = json.loads(listed)
    except ValueError:
        return [{"displayName": "?", "message": text.strip()}]
    seen: dict[tuple[str, str], dict[str, str]] = {}
    for failure in listed if isinstance(listed, list) else []:
        if isinstance(failure, dict):
            key = (str(failure.get("displayName", "")), str(failure.get("message", "")))
            seen.setdefault(key, {"displayName": key[0], "message": key[1],
                                  "templateName": str(failure.get("templateName", ""))})
    return list(seen.values())


def _metric_from_evaluation(run_dir: Path, metric: str, created: str) -> Any:
    """The chosen metric from ``metrics.json`` when this workflow's evaluate wrote it (the
    gate never ran, so there is no decision to take it from)."""
    path = run_dir / run_files.EVALUATION
    try:
        if created and path.stat().st_mtime < datetime.fromisoformat(created).timestamp():
            return None  # an earlier workflow's, in a reused run folder
        return json.loads(path.read_text()).get(metric)
    except (OSError, ValueError, AttributeError):
        return None


def outcome(args: argparse.Namespace) -> dict[str, Any]:
    """What happened, from Argo's variables and the records the gate and publish steps left."""
    from sublimate.components.base.runtime import RUNS_PATH

    run_dir = Path(args.runs_root or RUNS_PATH) / (args.run_id or args.workflow_name)
    decision = gate.read_record(run_dir / gate.RECORD, args.workflow_uid) or {}
    published = gate.read_record(run_dir / register_model.RECORD, args.workflow_uid) or {}
    value = decision.get("challenger")
    if value is None:
        value = _metric_from_evaluation(run_dir, args.metric, args.workflow_created)
    return {
        "workflow": args.workflow_name, "status": args.workflow_status,
        "metric": args.metric, "value": value,
        "promoted": decision.get("promote") if published else None,
        "decided": bool(decision), "reason": decision.get("reason", ""),
        "champion_metric": decision.get("champion_metric"),
        "version": published.get("version", ""), "champion": published.get("champion", ""),
        "failures": failures(args.workflow_failures),
    }


def _number(value: Any) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def message(facts: dict[str, Any]) -> dict[str, Any]:
    """The Slack-compatible payload: ``text`` says it all; ``blocks`` lays it out."""
    metric = (f"{facts['metric']} {_number(facts['value'])}" if facts["value"] is not None
              else f"{facts['metric']}: not measured")
    if facts["promoted"] is True:
        promotion = f"promoted: {facts['version']} is the champion"
    elif facts["promoted"] is False:
        promotion = (f"not promoted: {facts['version']} published, the champion stays "
                     f"{facts['champion'] or '(none)'}")
    elif facts["decided"]:
        promotion = "not promoted: the gate decided but publishing failed"
    else:
        promotion = "not promoted: the run ended before the gate"
    lines = [f"sublimate retraining {facts['workflow']}: {facts['status']}. {metric}; "
             f"{promotion}."]
    if facts["reason"]:
        lines.append(f"Why: {facts['reason']}")
    shown = facts["failures"][:MAX_FAILURES]
    if shown:
        lines.append("Failed steps:")
        lines += [f"- {f['displayName']}: {f['message'] or '(no message)'}" for f in shown]
        if len(facts["failures"]) > len(shown):
            lines.append(f"... and {len(facts['failures']) - len(shown)} more")
    text = "\n".join(lines)
    fields = [("Outcome", facts["status"]), ("Metric", metric),
              ("Promoted", "yes" if facts["promoted"] else "no"),
              ("Version", facts["version"] or "(none published)"),
              ("Champion", facts["champion"] or "(unchanged)")]
    return {
        "text": text,
        "blocks": [
            {"type": "section", "text": {"type": "mrkdwn", "text": text}},
            {"type": "section", "fields": [{"type": "mrkdwn", "text": f"*{name}*\n{value}"}
                                           for name, value in fields]},
        ],
    }


def post(url: str, payload: dict[str, Any]) -> str | None:
    """POST ``payload`` as JSON; None on success, else why not, in words that never hold the
    URL (an error text may echo it, or its host, which can carry a token)."""
    import urllib.error
    import urllib.request
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return f"{URL_ENV} is not an http(s) URL"
    request = urllib.request.Request(url, data=json.dumps(payload).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_SECONDS) as response:
            response.read()
    except urllib.error.HTTPError as error:
        return f"the webhook answered HTTP {error.code}"
    except (urllib.error.URLError, OSError, ValueError) as error:
        reason = getattr(error, "reason", error)
        words = str(reason)
        for secret in {url, parts.netloc, parts.hostname or "", parts.path}:
            if secret and len(secret) > 1:
                words = words.replace(secret, "***")
        return f"the webhook could not be reached ({type(reason).__name__}: {words})"
    return None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=STEP, description=__doc__.splitlines()[0])
    parser.add_argument("--workflow-name", required=True)
    parser.add_argument("--workflow-uid", default="")
    parser.add_argument("--workflow-status", required=True, help="Succeeded, Failed or Error")
    parser.add_argument("--workflow-failures", default="", help="Argo's {{workflow.failures}}")
    parser.add_argument("--workflow-created", default="", help="the creation time (ISO 8601)")
    parser.add_argument("--run-id", default="", help="the run's folder (default: the workflow's)")
    parser.add_argument("--runs-root", default="", help="where run folders are")
    parser.add_argument("--metric", default="accuracy")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    import os

    args = parse_args(argv)
    payload = message(outcome(args))
    print(f"{STEP}: {payload['text']}", flush=True)
    url = os.environ.get(URL_ENV, "").strip()
    if not url:
        print(f"{STEP}: no webhook configured (optional Secret {SECRET}, key {SECRET_KEY}; "
              f"locally ${URL_ENV}); nothing posted", flush=True)
        return 0
    problem = post(url, payload)
    if problem:
        print(f"{STEP}: warning: {problem}; nothing posted, the run's outcome stands",
              file=sys.stderr, flush=True)
    else:
        print(f"{STEP}: posted to the webhook", flush=True)
    return 0



def template(name: str = STEP, **step_options: object):
    """The exit handler's container: Argo's workflow variables as flags (an ``onExit`` template
    is called without arguments) and the webhook URL from the optional Secret."""
    from hera.workflows import SecretEnv

    from sublimate.components.base.runtime import RUNS_PATH, python_step

    return python_step(
        name, "sublimate.components.steps.notify", inputs={},
        extra_args=["--workflow-name", "{{workflow.name}}", "--workflow-uid", "{{workflow.uid}}",
                    "--workflow-status", "{{workflow.status}}",
                    "--workflow-failures", "{{workflow.failures}}",
                    "--workflow-created", "{{workflow.creationTimestamp}}",
                    "--run-id", "{{workflow.parameters.run-id}}", "--runs-root", RUNS_PATH,
                    "--metric", "{{workflow.parameters.metric}}"],
        env=[SecretEnv(name=URL_ENV, secret_name=SECRET, secret_key=SECRET_KEY, optional=True)],
        **step_options,  # type: ignore[arg-type]
    )


if __name__ == "__main__":
    sys.exit(main())
