"""Headless Chromium for the dashboard tests: where it is, one driver, the page's text.

Selenium is imported inside :func:`headless_chrome`, after the caller's skip: a machine
without a browser skips those tests (and ``.ci/run`` fails on such a skip, it installs
Debian's ``chromium`` and ``chromium-driver`` when root)."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterable, Iterator
from typing import Any

import pytest

CHROMIUM = next((p for p in ("/usr/bin/chromium", "/usr/bin/chromium-browser")
                 if os.path.exists(p)), None)
CHROMEDRIVER = shutil.which("chromedriver") or (
    "/usr/bin/chromedriver" if os.path.exists("/usr/bin/chromedriver") else None)
#: How long a page may take to show something (a loaded 2-core machine: generous).
UI_S = 30
NO_BROWSER = ("no headless browser: install Debian's chromium and chromium-driver "
              "(`apt-get install -y chromium chromium-driver`; .ci/run does when root)")


def skip_without_browser(module_level: bool = False) -> None:
    """Skip the calling test (or module) when there is no headless browser here."""
    if CHROMIUM is None or CHROMEDRIVER is None:
        pytest.skip(NO_BROWSER, allow_module_level=module_level)


@contextlib.contextmanager
def headless_chrome(height: int = 1000, extra_args: Iterable[str] = ()) -> Iterator[Any]:
    """A headless Chromium driver, 1500 pixels wide, quit on exit."""
    skip_without_browser()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                f"--window-size=1500,{height}", "--no-first-run", "--disable-extensions",
                *extra_args):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)
    driver.set_page_load_timeout(UI_S)
    try:
        yield driver
    finally:
        driver.quit()


def texts(driver: Any, css: str) -> list[str]:
    """The visible text of every element matching ``css``, trimmed."""
    return driver.execute_script(  # type: ignore[no-any-return]
        "return [...document.querySelectorAll(arguments[0])].map(e => e.innerText.trim())",
        css)


__all__ = ["CHROMEDRIVER", "CHROMIUM", "UI_S", "headless_chrome", "skip_without_browser",
           "texts"]
