"""The web page in a real browser: Debian's chromium, headless, driven by selenium through
Debian's chromedriver (.ci/run installs both). Every test also fails on an error the page's
own scripts logged (a page that half works looks like one that works)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ..argo_api import Server

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# A folder: the tests' screenshots of each view land there (docs/images/web/ for the docs:
# `SUBLIMATE_WEB_SHOTS=docs/images/web python -m pytest tests/pipelines/server/web`)
SHOTS = os.environ.get("SUBLIMATE_WEB_SHOTS")
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"


def _prerequisites() -> str:
    missing = [path for path in (CHROMIUM, CHROMEDRIVER) if not os.path.exists(path)]
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("selenium (pip install -e '.[test]')")
    return ", ".join(missing)


class Page:
    """A browser tab on a server: ``open`` a path, ``wait`` for what the page shows."""

    def __init__(self, driver: Any, server: Server) -> None:
        self.driver = driver
        self.server = server

    def open(self, path: str) -> None:
        self.driver.get(self.server.url + path)

    def wait(self, css: str, timeout: float = 30, condition: Callable[[Any], bool] | None = None
             ) -> Any:
        """The first element matching ``css`` (for which ``condition`` holds), waited for."""
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support.ui import WebDriverWait

        def found(driver: Any) -> Any:
            for element in driver.find_elements(By.CSS_SELECTOR, css):
                try:
                    if condition is None or condition(element):
                        return element
                except Exception:  # the element was redrawn under us: look again
                    continue
            return False

        return WebDriverWait(self.driver, timeout, poll_frequency=0.05).until(
            found, f"no {css} on {self.driver.current_url}")

    def all(self, css: str) -> list[Any]:
        from selenium.webdriver.common.by import By

        return self.driver.find_elements(By.CSS_SELECTOR, css)

    def errors(self) -> list[str]:
        """What the page's scripts logged as errors since the last call."""
        return [entry["message"] for entry in self.driver.get_log("browser")
                if entry["level"] == "SEVERE" and "favicon" not in entry["message"]]

    def screenshot(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.driver.save_screenshot(str(path))

    def shot(self, name: str) -> None:
        """The page as it is now, as ``<SUBLIMATE_WEB_SHOTS>/<name>.png`` when that is set."""
        if SHOTS:
            self.screenshot(Path(SHOTS) / f"{name}.png")


@pytest.fixture
def browser() -> Iterator[Any]:
    missing = _prerequisites()
    if missing:
        if os.environ.get("CI"):
            pytest.fail(f"the browser tests need {missing} (.ci/run installs them)")
        pytest.skip(f"needs {missing}")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu",
                     "--disable-dev-shm-usage", "--window-size=1400,900",
                     "--disable-extensions", "--no-first-run"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def page(browser: Any) -> Iterator[Callable[[Server], Page]]:
    """A tab on the given server; at the end, the page's script errors fail the test."""
    opened: list[Page] = []

    def on(server: Server) -> Page:
        opened.append(Page(browser, server))
        return opened[-1]

    yield on
    for tab in opened:
        assert tab.errors() == [], "the page's scripts logged errors"
