"""The dashboard shows issue 32's dependent jobs, concurrency keys and backfills, in a
real browser (Debian's headless Chromium) against a real 3-node cluster: a dependent
job's "after extract" and its parent's "then load", the key's badge and its use, and a
running backfill whose cancel button cancels it in the cluster."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.harness import Cluster, wait_until
from tests.support.httputil import http_cluster, request, tokens

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

SECRET = "dashboard-deps-secret-0123456789"
TOK = tokens(SECRET)
CHROMIUM = next((p for p in ("/usr/bin/chromium", "/usr/bin/chromium-browser")
                 if os.path.exists(p)), None)
CHROMEDRIVER = "/usr/bin/chromedriver" if os.path.exists("/usr/bin/chromedriver") else None
UI_S = 30

if CHROMIUM is None or CHROMEDRIVER is None:
    pytest.skip("no headless browser: install Debian's chromium and chromium-driver "
                "(`apt-get install -y chromium chromium-driver`; .ci/run does when root)",
                allow_module_level=True)

from selenium import webdriver  # noqa: E402 - after the skip: only with a browser
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402

JOBS = [
    {"id": "extract", "schedule": {"every": "2s"}, "command": ["true"]},
    {"id": "load", "after": ["extract"], "command": ["sleep", "0.5"],
     "concurrency": {"key": "warehouse", "max": 1}},
    {"id": "daily", "schedule": {"cron": "0 3 * * *"}, "command": ["sleep", "2"]},
]


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with http_cluster("rs-dashdeps-", SECRET) as c:
        for spec in JOBS:
            status, body, _ = request(c.http["n1"], "PUT", f"/api/v1/jobs/{spec['id']}",
                                      TOK["admin"], spec)
            assert status in (200, 201), body
        yield c


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1500,1200", "--no-first-run", "--disable-extensions"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)
    driver.set_page_load_timeout(UI_S)
    try:
        yield driver
    finally:
        driver.quit()


def texts(driver: Any, css: str) -> list[str]:
    return driver.execute_script(
        "return [...document.querySelectorAll(arguments[0])].map(e => e.innerText.trim())",
        css)


def first(driver: Any, css: str) -> str:
    found = texts(driver, css)
    return found[0] if found else ""


def test_the_graph_keys_and_a_cancellable_backfill(cluster: Cluster, browser: Any) -> None:
    status, bf, _ = request(cluster.http["n1"], "POST", "/api/v1/jobs/daily/backfill",
                            TOK["admin"], {"from": "2025-01-01T00:00:00Z",
                                           "to": "2025-03-01T00:00:00Z"})
    assert status == 201, bf
    browser.get(f"http://{cluster.http['n2']}/#token={TOK['admin']}")
    wait_until(lambda: first(browser, '#jobs tr[data-job="load"] .schedule')
               .startswith("after extract"), UI_S, "load shown after extract")
    assert "warehouse \u22641" in first(browser, '#jobs tr[data-job="load"] .schedule')
    wait_until(lambda: first(browser, '#jobs tr[data-job="extract"] .then') == "then load",
               UI_S, "extract's dependent shown")
    assert first(browser, '#jobs tr[data-job="load"] .next') == "after extract"
    wait_until(lambda: first(browser, '#concurrency tr[data-key="warehouse"] td') ==
               "warehouse", UI_S, "the concurrency key listed")
    wait_until(lambda: first(browser, f'#backfills tr[data-backfill="{bf["id"]}"] .bf-state')
               == "running", UI_S, "the backfill listed as running")
    assert first(browser, f'#backfills tr[data-backfill="{bf["id"]}"] .bf-done').endswith(
        f"/{bf['fire_times']}")
    out = os.environ.get("RAFTSCHED_SCREENSHOT_DIR") or tempfile.gettempdir()
    browser.save_screenshot(os.path.join(out, "dashboard-deps.png"))

    def clicked() -> bool:
        browser.find_element(
            By.CSS_SELECTOR, f'#backfills tr[data-backfill="{bf["id"]}"] button.cancel').click()
        return True

    wait_until(clicked, UI_S, "a click on the backfill's cancel button")

    def cancelled() -> bool:
        status, body, _ = request(cluster.http["n1"], "GET", "/api/v1/backfills?job=daily",
                                  TOK["read"])
        return status == 200 and body["backfills"][0]["state"] == "cancelled"

    wait_until(cancelled, UI_S, "the backfill cancelled in the cluster")
    wait_until(lambda: first(browser, f'#backfills tr[data-backfill="{bf["id"]}"] .bf-state')
               .startswith("cancelled"), UI_S, "the page shows it cancelled")
