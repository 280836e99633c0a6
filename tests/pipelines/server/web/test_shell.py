"""The page's shell: served without a build step or anything from elsewhere, its paths
answered with the page, its files with a policy that lets them load nothing from elsewhere,
a token asked for when the server wants one."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import requests

from ..argo_api import Server


def test_the_page_is_served_with_its_own_files_only(start: Callable[..., Server]) -> None:
    server = start()
    for path in ("/", "/workflows", "/workflows/ns/some-run", "/workflow-templates", "/compare"):
        response = requests.get(server.url + path, timeout=30)
        assert response.status_code == 200, path
        assert response.headers["Content-Type"].startswith("text/html")
        assert "default-src 'self'" in response.headers["Content-Security-Policy"]
        assert '<meta name="sublimate-namespace" content="sublimate">' in response.text
    script = requests.get(server.url + "/static/app.js", timeout=30)
    assert script.headers["Content-Type"].startswith("text/javascript")
    for missing in ("/static/../app.py", "/static/nothing.js", "/static/.hidden.js",
                    "/static/web_server.py"):
        assert requests.get(server.url + missing, timeout=30).status_code == 404, missing
    # nothing from elsewhere: every file refers to this server's paths only
    from sublimate.pipelines.server.web_server import WEB

    for file in WEB.iterdir():
        text = file.read_text()
        assert "http://" not in text.replace("http://www.w3.org/2000/svg", "") \
            and "https://" not in text, file.name


def test_the_page_asks_for_the_token_and_keeps_it_for_the_tab(
        start: Callable[..., Server], page: Callable[[Server], Any]) -> None:
    server = start("--auth-token", "s3cret-token")
    # the page itself needs no token; its API calls do
    assert requests.get(server.url + "/workflows", timeout=30).status_code == 200
    tab = page(server)
    tab.open("/workflows")
    dialog = tab.wait("#token-dialog[open]")
    dialog.find_element("css selector", "input").send_keys("s3cret-token")
    dialog.find_element("css selector", "button[value=ok]").click()
    tab.wait("#main [data-view]", condition=lambda e: e.is_displayed())
    # the browser logs the 401 that made the page ask: that, and nothing else
    errors = tab.errors()
    assert all("status of 401 (Unauthorized)" in error for error in errors), errors
    assert tab.driver.execute_script("return sessionStorage.getItem('sublimate-token')") == \
        "s3cret-token"
