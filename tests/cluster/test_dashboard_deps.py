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

from tests.support.browser import UI_S, headless_chrome, skip_without_browser, texts
from tests.support.harness import Cluster, wait_until
from tests.support.httputil import http_cluster, request, tokens

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

SECRET = "dashboard-deps-secret-0123456789"
TOK = tokens(SECRET)
skip_without_browser(module_level=True)

from selenium.webdriver.common.by import By  # noqa: E402 - after the skip: only with a browser

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
    with headless_chrome(height=1200) as driver:
        yield driver



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
