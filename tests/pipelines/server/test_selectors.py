"""Field selectors (``listOptions.fieldSelector``) as Argo Server takes them for workflows, and
the label selector's error naming the parameter it came from."""

from __future__ import annotations

import pytest

from sublimate.pipelines.server.errors import ApiError
from sublimate.pipelines.server.selectors import (
    parse_field_selector,
    parse_selector,
    selected_name,
    workflow_selector,
)


def workflow(name: str, namespace: str = "ns", started: str | None = None,
             **labels: str) -> dict:
    status = {"phase": "Running", **({"startedAt": started} if started else {})}
    return {"metadata": {"name": name, "namespace": namespace, "labels": labels},
            "spec": {}, "status": status}


def refused(text: str, namespace: str = "ns") -> str:
    with pytest.raises(ApiError) as caught:
        parse_field_selector(text, namespace)
    assert caught.value.http_status == 400 and caught.value.code == 3
    assert caught.value.message.startswith("listOptions.fieldSelector: ")
    return caught.value.message


def test_names_and_namespaces() -> None:
    one, other = workflow("one"), workflow("other")
    assert parse_field_selector("", "ns")(one)
    for text, chooses_one, chooses_other in (
            ("metadata.name=one", True, False), ("metadata.name==one", True, False),
            ("metadata.name!=one", False, True), (" metadata.name = one ", True, False),
            ("metadata.namespace=ns,metadata.name=other", False, True),
            ("metadata.namespace!=elsewhere", True, True),
            ("metadata.namespace!=ns", False, False),
            ("metadata.name=one,metadata.name=other", False, False),
            ("ext.showRemainingItemCount=true", True, True),
            ("metadata.name=one,", True, False)):
        test = parse_field_selector(text, "ns")
        assert (test(one), test(other)) == (chooses_one, chooses_other), text


def test_escapes_as_kubernetes_reads_them() -> None:
    # a backslash keeps a comma or an equals sign in a value (fields.ParseSelector)
    assert parse_field_selector(r"metadata.name=a\,b", "ns")(workflow("a,b"))
    assert parse_field_selector(r"metadata.name=a\=b", "ns")(workflow("a=b"))
    assert not parse_field_selector(r"metadata.name=a\,b", "ns")(workflow("a"))
    assert "invalid escape" in refused(r"metadata.name=a\x")
    assert "end with" in refused("metadata.name=a\\")


def test_started_at_as_argo_compares_it() -> None:
    early = workflow("early", started="2026-01-01T00:00:00Z")
    late = workflow("late", started="2026-03-01T12:00:00Z")
    unstarted = workflow("pending")
    after = parse_field_selector("spec.startedAt>2026-02-01T00:00:00Z", "ns")
    before = parse_field_selector("spec.startedAt<2026-02-01T01:00:00+01:00", "ns")
    assert (after(early), after(late), after(unstarted)) == (False, True, False)
    assert (before(early), before(late), before(unstarted)) == (True, False, False)
    assert "RFC 3339" in refused("spec.startedAt>yesterday")
    assert "time zone" in refused("spec.startedAt>2026-02-01T00:00:00")


def test_what_argo_refuses_is_refused() -> None:
    # Argo's BuildListOptions: anything else is an "unsupported requirement"
    message = refused("status.phase=Running")
    assert "unsupported requirement 'status.phase=Running'" in message
    assert "workflows.argoproj.io/phase" in message  # what to use instead
    assert "unsupported" in refused("metadata.labels=x")
    assert "unsupported" in refused("metadata.name>a")
    assert "not field=value" in refused("metadata.name")
    assert "not a boolean" in refused("ext.showRemainingItemCount=maybe")
    assert "contradict each other" in refused("metadata.namespace=other", namespace="ns")


def test_the_one_name_a_watch_asks_for() -> None:
    assert selected_name("metadata.name=one") == "one"
    assert selected_name("metadata.namespace=ns,metadata.name==two") == "two"
    assert selected_name("metadata.name!=one") is None
    assert selected_name("") is None


def test_both_selectors_together() -> None:
    chosen = workflow_selector("team=ml", "metadata.name!=skip", "ns")
    assert chosen(workflow("keep", team="ml"))
    assert not chosen(workflow("skip", team="ml"))
    assert not chosen(workflow("keep", team="other"))
    with pytest.raises(ApiError, match=r"listOptions\.labelSelector"):
        workflow_selector("a in (b", "", "ns")
    with pytest.raises(ApiError, match=r"^selector: "):
        parse_selector("a in (b", parameter="selector")
