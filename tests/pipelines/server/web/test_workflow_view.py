"""The workflow view in a real browser over a real server: the graph follows the run live (no
reload), tasks not started yet are drawn greyed, loops and retries are grouped, a running
pod's logs are followed, and the graph is reached and used from the keyboard."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ..argo_api import Server, ended, wait_for


def _pod(command: str) -> dict:
    return {"image": "alpine:3.20", "command": ["sh", "-c", command]}


def _submit(server: Server, name: str, templates: list[dict], entrypoint: str = "main") -> None:
    status, body = server.call("POST", "/api/v1/workflows/ns", json={"workflow": {
        "metadata": {"name": name}, "spec": {"entrypoint": entrypoint, "templates": templates}}})
    assert status == 200, body


def _click(tab: Any, element: Any) -> None:
    """A click on a node wherever the graph's view has it (in view or not)."""
    tab.driver.execute_script(
        "arguments[0].dispatchEvent(new MouseEvent('click', {bubbles: true}))", element)


def _phase(tab: Any, display_name: str) -> str | None:
    return tab.driver.execute_script(
        "const g = document.querySelector(`g.node[data-display-name=\"${arguments[0]}\"]`);"
        "return g ? g.dataset.phase : null;", display_name)


def test_the_graph_follows_the_run_live_and_says_when_it_is_deleted(
        start: Callable[..., Server], page: Callable[[Server], Any]) -> None:
    server = start()
    _submit(server, "diamond", [
        {"name": "main", "dag": {"tasks": [
            {"name": "first", "template": "work"},
            {"name": "left", "template": "slow", "dependencies": ["first"]},
            {"name": "right", "template": "slow", "dependencies": ["first"]},
            {"name": "last", "template": "work", "depends": "left && right.Succeeded"}]}},
        {"name": "work", "container": _pod("sleep 0.7")},
        # long enough to be seen running however late the page's first draw comes (a loaded
        # machine: CI)
        {"name": "slow", "container": _pod("sleep 2.5")}])
    tab = page(server)
    tab.open("/workflows/ns/diamond")
    tab.wait('[data-view="workflow"] g.node[data-display-name="first"]')
    tab.driver.execute_script("window.__sameDocument = true")
    seen: dict[str, set[str]] = {name: set() for name in ("first", "left", "last")}
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for name, phases in seen.items():
            phase = _phase(tab, name)
            if phase:
                phases.add(phase)
        if _phase(tab, "left") == "Running" and not seen["last"] - {"Pending"}:
            tab.shot("workflow-running")  # for the docs: done, running and waiting at once
        if "Succeeded" in seen["last"]:  # what was read above (a second read could see a
            break  # later phase than the one recorded, and end the loop without it)
        time.sleep(0.05)
    # nodes seen running (or waiting) and then done: the page changed as the run went
    assert "Succeeded" in seen["first"], seen
    assert seen["left"] >= {"Running", "Succeeded"}, seen
    assert "Succeeded" in seen["last"] and len(seen["last"]) > 1, seen
    tab.wait('[data-view="workflow"] .workflow-phase [data-phase="Succeeded"]', timeout=10)
    assert tab.driver.execute_script("return window.__sameDocument") is True  # never reloaded
    # the edges follow the dependencies: 'last' is drawn below both 'left' and 'right'
    ys = tab.driver.execute_script(
        "const y = (n) => document.querySelector(`g.node[data-display-name=\"${n}\"]`)"
        ".getBoundingClientRect().top; return [y('first'), y('left'), y('right'), y('last')];")
    assert ys[0] < ys[1] == ys[2] < ys[3], ys

    assert server.call("DELETE", "/api/v1/workflows/ns/diamond")[0] == 200
    gone = tab.wait(".workflow-gone", condition=lambda element: element.is_displayed())
    assert "deleted" in gone.text


def test_tasks_not_started_yet_are_drawn_greyed(start: Callable[..., Server],
                                              page: Callable[[Server], Any]) -> None:
    server = start()
    _submit(server, "waits", [
        {"name": "main", "dag": {"tasks": [
            {"name": "slow", "template": "slow"},
            {"name": "after", "template": "steps", "dependencies": ["slow"]}]}},
        {"name": "slow", "container": _pod("sleep 4")},
        {"name": "steps", "steps": [[{"name": "one", "template": "quick"}]]},
        {"name": "quick", "container": _pod("true")}])
    wait_for(server, "ns", "waits", lambda body: any(
        node["displayName"] == "slow" and node["phase"] == "Running"
        for node in body["status"].get("nodes", {}).values()))
    tab = page(server)
    tab.open("/workflows/ns/waits")
    after = tab.wait('g.node[data-display-name="after"]')
    assert after.get_attribute("data-pending") == "true"
    assert after.get_attribute("data-phase") == "Pending"
    assert _phase(tab, "slow") == "Running"
    assert tab.wait('g.node[data-display-name="slow"]').get_attribute("data-pending") is None
    # greyed, and said so to whoever reads it
    assert "not started" in after.get_attribute("aria-label")
    # once it runs, the real node takes its place; its own steps were never guessed
    tab.wait('g.node[data-display-name="after"]:not([data-pending])', timeout=20)
    tab.wait('g.node[data-display-name="one"][data-phase="Succeeded"]', timeout=20)
    assert not tab.all("g.node[data-pending]")


def test_loops_and_retries_are_grouped_and_open(start: Callable[..., Server],
                                                page: Callable[[Server], Any]) -> None:
    from selenium.webdriver.common.keys import Keys

    server = start()
    _submit(server, "loops", [
        {"name": "main", "dag": {"tasks": [
            {"name": "each", "template": "quick", "withSequence": {"count": "30"}},
            {"name": "flaky", "template": "flaky"}]}},
        {"name": "quick", "container": _pod("true")},
        {"name": "flaky", "retryStrategy": {"limit": 2}, "container": _pod("exit 3")}])
    wait_for(server, "ns", "loops", ended)
    tab = page(server)
    tab.open("/workflows/ns/loops")
    more = tab.wait('g.node[data-kind="more"]')
    items = tab.all('g.node[data-display-name^="each("]')
    assert len(items) == 10, len(items)
    assert "+20 more" in more.get_attribute("textContent")
    assert more.get_attribute("aria-expanded") == "false"
    # the retry: one node with its attempts counted, the attempts not drawn
    retry = tab.wait('g.node[data-display-name="flaky"][data-type="Retry"]')
    assert "\u00d73" in retry.get_attribute("textContent")  # x3, three attempts
    assert retry.get_attribute("data-phase") == "Failed"
    assert not tab.all('g.node[data-display-name^="flaky("]')

    more.send_keys(Keys.ENTER)  # from the keyboard, as a click would
    tab.wait('g.node[data-display-name="each(29:29)"]')
    assert len(tab.all('g.node[data-display-name^="each("]')) == 30
    assert not tab.all('g.node[data-kind="more"]')

    # the retry's panel lists its attempts and opens them in the graph
    _click(tab, retry)
    panel = tab.wait("#node-panel h2", condition=lambda element: element.text == "flaky")
    assert panel.is_displayed()
    tab.wait("#node-panel .node-group button[aria-expanded]").click()
    tab.wait('g.node[data-display-name="flaky(2)"][data-phase="Failed"]')
    assert len(tab.all('g.node[data-display-name^="flaky("]')) == 3


def test_a_running_pods_logs_are_followed(start: Callable[..., Server],
                                          page: Callable[[Server], Any]) -> None:
    server = start()
    _submit(server, "talks", [{"name": "main", "container": _pod(
        "for i in $(seq 1 14); do echo line $i; sleep 0.3; done")}])
    body = wait_for(server, "ns", "talks", lambda body: any(
        node["phase"] == "Running" for node in body["status"].get("nodes", {}).values()))
    pod = next(node["id"] for node in body["status"]["nodes"].values() if node["type"] == "Pod")
    tab = page(server)
    tab.open(f"/workflows/ns/talks?node={pod}")  # a link to the node opens its panel
    logs = tab.wait("pre#node-logs", condition=lambda element: "line 2\n" in element.text + "\n")
    assert tab.wait(".logs-state").get_attribute("data-state") == "following"
    first = logs.text.count("line ")
    # more lines come while the pod still runs: followed, not read once
    tab.wait("pre#node-logs", timeout=10,
             condition=lambda element: element.text.count("line ") >= first + 3)
    assert _phase(tab, "talks") == "Running"
    tab.wait("pre#node-logs", timeout=15, condition=lambda element: "line 14" in element.text)
    tab.wait('g.node[data-display-name="talks"][data-phase="Succeeded"]', timeout=15)
    lines = tab.wait("pre#node-logs").text.splitlines()
    assert lines == [f"line {i}" for i in range(1, 15)], lines  # each once, in order


def test_the_graph_is_reached_and_used_from_the_keyboard(
        start: Callable[..., Server], page: Callable[[Server], Any]) -> None:
    from selenium.webdriver.common.keys import Keys

    server = start()
    _submit(server, "keys", [
        {"name": "main", "dag": {"tasks": [
            {"name": "one", "template": "quick"},
            {"name": "two", "template": "quick", "dependencies": ["one"]}]}},
        {"name": "quick", "container": _pod("echo said")}])
    wait_for(server, "ns", "keys", ended)
    tab = page(server)
    tab.open("/workflows/ns/keys")
    tab.wait('g.node[data-display-name="two"]')
    body = tab.driver.find_element("css selector", "body")
    body.click()
    focused = None
    for _ in range(40):
        tab.driver.switch_to.active_element.send_keys(Keys.TAB)
        focused = tab.driver.switch_to.active_element
        if focused.get_attribute("data-node-id"):
            break
    assert focused is not None and focused.get_attribute("data-node-id"), "Tab never reached a node"
    assert focused.get_attribute("data-display-name") == "keys"  # the graph's first node
    focused.send_keys(Keys.ARROW_DOWN)  # to its task
    focused = tab.driver.switch_to.active_element
    assert focused.get_attribute("data-display-name") == "one"
    focused.send_keys(Keys.ENTER)
    tab.wait("#node-panel h2", condition=lambda element: element.text == "one")
    assert "?node=" in tab.driver.current_url
    tab.wait("pre#node-logs", condition=lambda element: element.text == "said")
    assert focused.get_attribute("aria-current") == "true"
