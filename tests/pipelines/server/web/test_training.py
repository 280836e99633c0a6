"""The training panel and the compare view in a real browser: a train step's charts fill in as
it trains (submitted through the API); a finished run that lost a node shows its lanes, the
loss and the report's plots; two runs compared show both and what differs."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import requests

from ..argo_api import Server
from ..test_training_api import NS, cli_run, submit


def test_a_train_nodes_charts_gain_points_while_it_trains(
        start: Callable[..., Server], page: Callable[[Server], Any]) -> None:
    server = start()
    submit(server, "live-run", epochs=300)
    tab = page(server)
    try:
        tab.open(f"/workflows/{NS}/live-run/training")
        panel = tab.wait("section.training[data-state=training]", timeout=60,
                         condition=lambda e: int(e.get_attribute("data-epochs")) >= 1)
        first = int(panel.get_attribute("data-epochs"))
        # more epochs while the step still trains: the panel polls, the charts redraw
        tab.wait("section.training[data-state=training]", timeout=30,
                 condition=lambda e: int(e.get_attribute("data-epochs")) > first)
        assert tab.all(".chart[data-chart='Training loss'] .chart-line")
        assert tab.all(".chart[data-chart='Test accuracy'] .chart-line")
        assert len(tab.all(".chart[data-chart='Throughput'] .chart-series")) >= 3  # job, ranks
        assert len(tab.all(".bar-row")) == 2  # each process's compute/communication split
        tab.wait(".lane[data-lane='1'] .lane-span")  # per-step recovery's lanes, live
        tab.shot("training-live")
        # the contract with the workflow view: null for a node that is not a train step
        workflow = requests.get(f"{server.url}/api/v1/workflows/{NS}/live-run",
                                timeout=30).json()
        kinds = tab.driver.execute_async_script("""
            const [workflow, done] = arguments;
            import('/static/training.js').then(({ trainingPanel }) => {
              const kinds = {};
              for (const node of Object.values(workflow.status.nodes)) {
                const panel = trainingPanel(workflow, node);
                kinds[node.templateName + ':' + node.type] = panel === null ? 'none' : 'panel';
                if (panel) panel.stop();
              }
              done(kinds);
            });""", workflow)
        assert kinds["train:Pod"] == "panel" and kinds["stage-data:Pod"] == "none"
        assert kinds["train-pipeline:DAG"] == "none"
    finally:
        requests.put(f"{server.url}/api/v1/workflows/{NS}/live-run/terminate", json={},
                     timeout=60)


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, str, str]]:
    """Two finished runs: one on 3 nodes that lost node1, one on 2 at half the rate."""
    home = tmp_path_factory.mktemp("finished") / "home"
    a = cli_run(home, "-p", "epochs=3", "-p", "nodes=3", "-p", "global-batch-size=66",
                "--env", "SUBLIMATE_FAIL_AT_STEP=30", "--env", "SUBLIMATE_FAIL_RANK=1")
    b = cli_run(home, "-p", "epochs=2", "-p", "learning-rate=0.05")
    server = Server(home)
    yield server, a, b
    server.stop()


def test_a_finished_run_shows_its_lanes_losses_and_plots(
        finished: tuple[Server, str, str], page: Callable[[Server], Any]) -> None:
    server, a, _ = finished
    tab = page(server)
    tab.open(f"/workflows/{NS}/{a}/training")
    tab.wait("section.training[data-state=ended]")
    tab.wait("[data-timeline=final]")
    assert len(tab.all(".lane[data-lane]")) == 3
    assert tab.all(".lane[data-lane='1'] .lane-loss")  # node1 lost
    assert not tab.all(".lane[data-lane='0'] .lane-loss")
    assert "node1 lost after step" in tab.wait("[data-timeline=final] ul.losses").text
    # the report's PNGs, fetched with the API (and its token, were there one)
    tab.wait("img[data-plot=recovery]",
             condition=lambda e: e.get_attribute("src").startswith("blob:")
             and tab.driver.execute_script("return arguments[0].naturalWidth", e) > 0)
    assert {img.get_attribute("data-plot") for img in tab.all("img[data-plot]")} >= {
        "loss", "accuracy", "throughput", "time-split", "recovery"}
    assert tab.wait("[data-stragglers]").text.startswith("Stragglers")
    # keyboard: the chart takes focus, the arrow keys show a point's values
    from selenium.webdriver.common.keys import Keys

    frame = tab.wait(".chart[data-chart='Training loss'] .chart-frame")
    frame.send_keys(Keys.ARROW_RIGHT)
    tip = tab.wait(".chart[data-chart='Training loss'] .chart-tip",
                   condition=lambda e: e.is_displayed())
    assert "epoch 1" in tip.text and "job:" in tip.text
    # for the docs: the per-step run's lanes in view
    tab.driver.execute_script(
        "document.querySelector('.lane').scrollIntoView({block: 'center'})")
    tab.shot("training-timeline")


def test_compare_shows_both_runs_and_their_differences(
        finished: tuple[Server, str, str], page: Callable[[Server], Any]) -> None:
    server, a, b = finished
    tab = page(server)
    tab.open("/compare")
    form = tab.wait("form.compare-form")
    from selenium.webdriver.support.ui import Select

    Select(form.find_element("css selector", "select[name=a]")).select_by_value(a)
    Select(form.find_element("css selector", "select[name=b]")).select_by_value(b)
    form.find_element("css selector", "button[type=submit]").click()
    tab.wait(f".compare-run[data-run='{b}']")
    assert tab.driver.current_url.endswith(f"/compare?a={a}&b={b}")
    assert tab.wait(f".compare-run[data-run='{a}']").text.count("3 workers") == 1
    settings = {row.get_attribute("data-setting") for row in tab.all("tr[data-setting]")}
    assert {"epochs", "learning-rate", "nodes"} <= settings and "dataset" not in settings
    accuracy = tab.wait("tr[data-figure='test.accuracy'] td.delta")
    assert accuracy.get_attribute("data-delta") in ("better", "worse", "same")
    lost = tab.wait("tr[data-figure='fault_tolerance.nodes_lost'] td.delta")
    assert lost.get_attribute("data-delta") == "better" and lost.text.startswith("\u22121")
    # both loss curves on one chart
    assert len(tab.all(".chart[data-chart='Training loss'] .chart-line")) == 2
    tab.shot("compare")
    # from the address alone, and swapped
    tab.open(f"/compare?a={b}&b={a}")
    tab.wait(f".compare-run.run-a[data-run='{b}']")
    time.sleep(0.2)  # any late script error is caught by the page fixture
