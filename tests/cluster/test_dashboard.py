"""The web dashboard in a real browser: Debian's headless Chromium driven by Selenium
(through Debian's chromedriver; nothing is downloaded) against a real 3-node cluster.

It loads the overview from a follower, sees the members and the jobs (schedules in
words, next fire times, last outcomes), clicks pause and trigger and checks the
cluster through the API, opens a job's page (run timeline, fire times with DST days),
then SIGKILLs the leader and sees the live feed report the new leader and the runs
after it. A read-only token gets no buttons. Screenshots go to the test's temporary
dir, or to ``$RAFTSCHED_SCREENSHOT_DIR`` (docs/ holds the README's).

The test skips, saying why, only when no Chromium/chromedriver is installed (``.ci/run``
installs them from Debian's packages when it runs as root).
"""

from __future__ import annotations

import os
import re
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.browser import UI_S, headless_chrome, skip_without_browser, texts
from tests.support.harness import Cluster, wait_until
from tests.support.httputil import http_cluster, request, tokens, wait_serving

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

SECRET = "dashboard-test-secret-0123456789"
TOK = tokens(SECRET)
skip_without_browser(module_level=True)

from selenium.webdriver.common.by import By  # noqa: E402 - after the skip: only with a browser

JOBS = [
    {"id": "tick", "schedule": {"every": "1s"},
     "command": ["sh", "-c", "echo tick $RAFTSCHED_RUN_ID"]},
    {"id": "flaky", "schedule": {"every": "3s"}, "command": ["sh", "-c", "echo boom >&2; exit 3"]},
    {"id": "nightly-backup", "schedule": {"cron": "30 2 * * *", "tz": "Europe/Berlin"},
     "command": ["true"]},
    {"id": "report", "schedule": {"at": "2099-01-01T00:00:00Z"}, "command": ["echo", "report"]},
]


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with http_cluster("rs-dash-", SECRET) as c:
        for spec in JOBS:
            status, body, _ = request(c.http["n1"], "PUT", f"/api/v1/jobs/{spec['id']}",
                                      TOK["admin"], spec)
            assert status in (200, 201), body
        yield c


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with headless_chrome() as driver:
        yield driver


@pytest.fixture(scope="module")
def shots() -> Iterator[str]:
    out = os.environ.get("RAFTSCHED_SCREENSHOT_DIR")
    if out:
        os.makedirs(out, exist_ok=True)
        yield out
    else:
        with tempfile.TemporaryDirectory(prefix="rs-shots-") as tmp:
            yield tmp


# The page re-renders its tables as the cluster changes: an element found by one
# WebDriver call may be gone by the next (StaleElementReferenceException, seen on a
# loaded host). So reads are one script each, and a click is retried until it lands.


def attrs(driver: Any, css: str, *names: str) -> list[tuple[str | None, ...]]:
    """Each matching element's attributes ``names``, all read in one script (so a row's
    values always come from one element)."""
    return [tuple(row) for row in driver.execute_script(
        "return [...document.querySelectorAll(arguments[0])]"
        ".map(e => arguments[1].map(n => e.getAttribute(n)))", css, list(names))]


def cell(driver: Any, job: str, css: str) -> str:
    found = texts(driver, f'#jobs tr[data-job="{job}"] {css}')
    return found[0] if found else ""


def click(driver: Any, css: str) -> None:
    def clicked() -> bool:
        driver.find_element(By.CSS_SELECTOR, css).click()
        return True
    wait_until(clicked, UI_S, f"a click on {css}")


def api(cluster: Cluster, path: str) -> Any:
    status, body, _ = request(cluster.http["n1"], "GET", path, TOK["read"])
    assert status == 200, body
    return body


def test_overview_buttons_job_page_and_feed_across_a_leader_kill(
        cluster: Cluster, browser: Any, shots: str) -> None:
    leader = cluster.wait_leader()
    follower = next(n for n in cluster.ids if n != leader)
    base = f"http://{cluster.http[follower]}/"
    browser.get(base + f"#token={TOK['admin']}")
    # The token left the address bar at once (it stays in the tab's session storage).
    wait_until(lambda: "token=" not in browser.current_url, UI_S, "the token out of the URL")
    wait_until(lambda: browser.find_element(By.ID, "health").text == "ok", UI_S,
               "the overview's health ok")
    assert browser.find_element(By.ID, "role").text == "admin"
    assert browser.find_element(By.ID, "leader").text == leader
    wait_until(lambda: len(browser.find_elements(By.CSS_SELECTOR, "#members tbody tr")) == 3,
               UI_S, "three members listed")
    wait_until(lambda: cell(browser, "nightly-backup", ".schedule")
               == "At 02:30 (Europe/Berlin)", UI_S, "the cron schedule in words")
    assert cell(browser, "tick", ".schedule") == "every second"
    wait_until(lambda: cell(browser, "tick", ".last") == "succeeded", UI_S,
               "tick's last outcome")
    wait_until(lambda: cell(browser, "flaky", ".last") == "failed", UI_S,
               "flaky's last outcome")
    assert cell(browser, "nightly-backup", ".next").endswith(")")  # "<time> (in ...)"
    assert len(browser.find_elements(
        By.CSS_SELECTOR, '#jobs tr[data-job="nightly-backup"] .later')) == 2  # then ..., then ...

    # Pause from the page; the cluster says so, and the page too.
    click(browser, '#jobs tr[data-job="nightly-backup"] button.pause')
    wait_until(lambda: api(cluster, "/api/v1/jobs/nightly-backup")["paused"] is True, UI_S,
               "the pause committed")
    wait_until(lambda: cell(browser, "nightly-backup", ".paused-cell") == "yes", UI_S,
               "the page shows it paused")
    # Trigger a job that would not run before 2099: the run happens, the feed shows it.
    click(browser, '#jobs tr[data-job="report"] button.trigger')
    wait_until(lambda: any(r["state"] == "succeeded"
                           for r in api(cluster, "/api/v1/jobs/report/runs")["runs"]),
               UI_S, "the triggered run of report succeeded")
    wait_until(lambda: browser.find_elements(
        By.CSS_SELECTOR, '#feed li[data-event="run.ended"][data-job="report"]'), UI_S,
        "the live feed shows report's run")
    wait_until(lambda: cell(browser, "report", ".last") == "succeeded", UI_S,
               "report's last outcome on the page")
    browser.save_screenshot(os.path.join(shots, "dashboard-overview.png"))

    # A job's page: fire times with the zone and DST days, the run timeline.
    browser.get(base + "#/jobs/nightly-backup")
    wait_until(lambda: len(browser.find_elements(By.CSS_SELECTOR, "#fires tbody tr")) == 10,
               UI_S, "ten fire times")
    assert browser.find_element(By.ID, "fires-zone").text == "Europe/Berlin"
    assert browser.find_element(By.ID, "job-title").get_attribute("data-paused") == "yes"
    click(browser, "#job-resume")
    wait_until(lambda: api(cluster, "/api/v1/jobs/nightly-backup")["paused"] is False, UI_S,
               "resumed from its page")
    browser.get(base + "#/jobs/flaky")
    wait_until(lambda: browser.find_element(By.ID, "job-title").text == "flaky"
               and len(browser.find_elements(By.CSS_SELECTOR, "#timeline .tick")) >= 2,
               UI_S, "flaky's runs on the timeline")
    states = [state for (state,) in attrs(browser, "#runs tbody tr", "data-state")]
    assert "failed" in states, states
    assert "exit 3" in texts(browser, "#runs tbody td.reason")
    # A pause recorded as one range (resume without catch-up: "missed (paused)" over
    # every fire time of the pause) shows its count and its end (issue 29 item 2: it
    # read as one miss).
    status, body, _ = request(cluster.http["n1"], "POST", "/api/v1/jobs/tick/pause",
                              TOK["admin"], {})
    assert status == 200, body
    paused_at = time.time()
    wait_until(lambda: time.time() > paused_at + 3.5, 10, "three fire times paused")
    status, body, _ = request(cluster.http["n1"], "POST", "/api/v1/jobs/tick/resume",
                              TOK["admin"], {})
    assert status == 200, body
    ranged = wait_until(lambda: next(
        (r for r in api(cluster, "/api/v1/jobs/tick/runs")["runs"]
         if r.get("until_ms") and r["count"] >= 3), None), UI_S, "tick's paused range")
    browser.get(base + "#/jobs/tick")
    wait_until(lambda: browser.find_element(By.ID, "job-title").text == "tick"
               and len(browser.find_elements(By.CSS_SELECTOR, "#timeline .tick")) >= 5,
               UI_S, "tick's runs on the timeline")
    row = f'#runs tbody tr[data-run="{ranged["run_id"]}"]'
    wait_until(lambda: texts(browser, row), UI_S, "the range's row")
    [text] = texts(browser, row)
    until = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ranged["until_ms"] / 1000))
    assert f"missed \u00d7{ranged['count']}" in text, text
    assert until in text, (until, text)
    lefts = set(browser.execute_script(
        "return [...document.querySelectorAll('#timeline .tick')]"
        ".map(e => getComputedStyle(e).left)"))
    assert len(lefts) >= 5, lefts  # spread along the time axis, not stacked
    browser.save_screenshot(os.path.join(shots, "dashboard-job.png"))

    # SIGKILL the leader: the follower's page keeps its feed and shows the new leader,
    # then runs under it.
    browser.get(base + "#/")
    wait_until(lambda: browser.find_element(By.ID, "feed-state").text == "live", UI_S,
               "the feed connected")
    cluster.kill(leader)
    killed_at = time.time()

    def new_leader_in_feed() -> bool:
        return any("leader is now " in t and leader not in t and "none" not in t
                   for t in texts(browser, '#feed li[data-event="leader.changed"]'))

    wait_until(new_leader_in_feed, 60, "the feed reporting a new leader")

    def tick_after_new_leader() -> bool:
        # Newest first; one script, so an event is never paired with another's job.
        events = attrs(browser, "#feed li", "data-event", "data-job")
        first_leader = next(i for i, (ev, _) in enumerate(events) if ev == "leader.changed")
        return ("run.ended", "tick") in events[:first_leader]

    wait_until(tick_after_new_leader, 60, "tick's runs in the feed after the new leader")
    wait_until(lambda: browser.find_element(By.ID, "leader").text not in ("", leader, "none"),
               UI_S, "the overview naming the new leader")
    wait_until(lambda: browser.find_element(By.ID, "health").text == "degraded", UI_S,
               "the overview degraded")
    assert time.time() - killed_at < 60
    browser.save_screenshot(os.path.join(shots, "dashboard-failover.png"))
    cluster.start(leader)
    wait_serving(cluster.http[leader])


def one_line(driver: Any, css: str) -> list[tuple[str, int]]:
    """Each matching element's text and the number of lines it is laid out on."""
    return [tuple(x) for x in driver.execute_script(
        "return [...document.querySelectorAll(arguments[0])].map(e => {"
        " const r = document.createRange(); r.selectNodeContents(e);"
        " const tops = new Set([...r.getClientRects()].map(b => Math.round(b.top)));"
        " return [e.innerText.trim(), tops.size]; })", css)]


def visible_headers(driver: Any) -> list[str]:
    return driver.execute_script(
        "return [...document.querySelectorAll('#fires thead th')]"
        ".filter(e => e.offsetParent !== null).map(e => e.innerText.trim())")


def test_next_fire_times_are_in_the_job_s_zone_on_one_line_and_utc_shown_once(
        cluster: Cluster, browser: Any) -> None:
    """Issue 29 papercut: the overview showed the next fire time in UTC and the two
    after it in the job's zone, wrapped mid-date; a UTC job's page had two UTC columns."""
    cluster.wait_leader()
    node = next(n for n in cluster.ids if cluster.alive(n))
    wait_serving(cluster.http[node], UI_S)
    base = f"http://{cluster.http[node]}/"
    browser.get(base + "#/")
    browser.execute_script("sessionStorage.clear()")
    browser.set_window_size(1100, 1000)  # the jobs table has to share the width
    try:
        browser.get(base + f"#token={TOK['read']}")
        rows = '#jobs tr[data-job="nightly-backup"]'
        wait_until(lambda: len(texts(browser, f"{rows} .later")) == 2, UI_S,
                   "nightly-backup's next fire times")
        wait_until(lambda: len(texts(browser, '#jobs tr[data-job="tick"] .later')) == 2,
                   UI_S, "tick's next fire times")
        berlin = re.compile(r"\d{4}-\d\d-\d\dT0[23]:30:00\+0[12]:00")
        shown = one_line(browser, f"{rows} .next, {rows} .later")
        assert len(shown) == 3 and all(berlin.search(text) for text, _ in shown), \
            f"not all Europe/Berlin wall times: {shown}"
        # Every timestamp on the page (in the schedule's words too) on one line.
        # Three of each every/cron job, report's one and the one in its words. (The page
        # re-renders every second: a 1 s job's later times can lag its next for a render,
        # so the count is awaited, not read once.)
        stamps = wait_until(lambda: (lambda st: st if len(st) == 3 + 3 + 3 + 2 else None)(
            one_line(browser, "#jobs .when")), UI_S, "every job's fire times shown")
        for text, lines in stamps:
            assert lines == 1, f"{text!r} wraps over {lines} lines"
        utc = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")
        ticks = texts(browser, '#jobs tr[data-job="tick"] .next, #jobs tr[data-job="tick"] .later')
        assert len(ticks) == 3 and all(utc.search(text) for text in ticks), ticks
    finally:
        browser.set_window_size(1500, 1000)

    browser.get(base + "#/jobs/tick")
    wait_until(lambda: browser.find_element(By.ID, "job-title").text == "tick"
               and len(browser.find_elements(By.CSS_SELECTOR, "#fires tbody tr")) == 10,
               UI_S, "tick's ten fire times")
    assert visible_headers(browser) == ["#", "UTC", "note"]
    first = browser.execute_script(
        "return [...document.querySelectorAll('#fires tbody tr')[0].cells]"
        ".filter(e => e.offsetParent !== null).map(e => e.innerText.trim())")
    assert len(first) == 3 and utc.search(first[1]), first
    browser.get(base + "#/jobs/nightly-backup")
    wait_until(lambda: browser.find_element(By.ID, "fires-zone").text == "Europe/Berlin",
               UI_S, "nightly-backup's fire times")
    assert visible_headers(browser) == ["#", "Europe/Berlin", "UTC", "note"]


def test_the_feed_shows_a_run_as_its_start_and_its_end(cluster: Cluster, browser: Any) -> None:
    """Issue 29 papercut: each run was three lines (assigned, started, ended)."""
    cluster.wait_leader()
    node = next(n for n in cluster.ids if cluster.alive(n))
    wait_serving(cluster.http[node], UI_S)
    base = f"http://{cluster.http[node]}/"
    browser.get(base + "#/")
    browser.execute_script("sessionStorage.clear()")
    browser.get(base + f"#token={TOK['read']}")
    wait_until(lambda: len(browser.find_elements(
        By.CSS_SELECTOR, '#feed li[data-event="run.ended"][data-job="tick"]')) >= 3, UI_S,
        "three of tick's runs ended in the feed")
    kinds = {ev for (ev,) in attrs(browser, '#feed li[data-job="tick"]', "data-event")}
    assert "run.assigned" not in kinds and {"run.started", "run.ended"} <= kinds, kinds


def test_a_read_only_token_gets_no_buttons_and_a_bad_one_the_form(
        cluster: Cluster, browser: Any) -> None:
    cluster.wait_leader()
    node = next(n for n in cluster.ids if cluster.alive(n))
    wait_serving(cluster.http[node], UI_S)
    base = f"http://{cluster.http[node]}/"
    browser.get(base + "#/")
    browser.execute_script("sessionStorage.clear()")
    browser.get(base + f"#token={TOK['read']}")
    wait_until(lambda: browser.find_element(By.ID, "role").text == "read-only", UI_S,
               "the read-only role shown")
    wait_until(lambda: cell(browser, "tick", ".schedule") == "every second", UI_S, "jobs")
    # Counted in one script (offsetParent is null for an element not displayed).
    count, shown = browser.execute_script(
        "const b = [...document.querySelectorAll('#jobs button')];"
        "return [b.length, b.filter(e => e.offsetParent !== null).length];")
    assert count and not shown, f"{shown} of {count} buttons shown to a read-only token"
    browser.execute_script("sessionStorage.clear()")
    browser.get(base + "#token=" + "0" * 64)
    wait_until(lambda: browser.find_element(By.ID, "login").is_displayed(), UI_S,
               "the token form after a wrong token")
    assert "bearer" in browser.find_element(By.ID, "login-error").text.lower()
    browser.find_element(By.ID, "token-input").send_keys(TOK["admin"])
    click(browser, "#token-form button")
    wait_until(lambda: browser.find_element(By.ID, "role").text == "admin", UI_S,
               "admin after pasting the token")


def test_a_run_s_full_log_from_its_row_and_an_http_job_s_request(
        cluster: Cluster, browser: Any, shots: str) -> None:
    """Issue 32: a run row's ``log`` button shows the run's full log (read from the node
    that ran it, whichever node serves the page), stdout or stderr; an HTTP job is
    marked in the overview and its page says what it requests."""
    from tests.support.receiver import Receiver

    receiver = Receiver()
    try:
        receiver.answers["/hook"] = lambda req: (200, b"hook answered " +
                                                 req["headers"]["raftsched-run-id"].encode())
        status, body, _ = request(cluster.http["n1"], "PUT", "/api/v1/jobs/hook", TOK["admin"],
                                  {"schedule": {"at": "2099-01-01T00:00:00Z"},
                                   "http": {"url": receiver.url("/hook"), "expect": [200]}})
        assert status in (200, 201), body
        cluster.wait_leader()
        node = next(n for n in cluster.ids if cluster.alive(n))
        wait_serving(cluster.http[node], UI_S)
        base = f"http://{cluster.http[node]}/"
        browser.get(base + "#/")
        browser.execute_script("sessionStorage.clear()")
        browser.get(base + f"#token={TOK['read']}")
        wait_until(lambda: cell(browser, "hook", ".kind") == "http", UI_S, "hook marked http")
        status, trig, _ = request(cluster.http["n1"], "POST", "/api/v1/jobs/hook/trigger",
                                  TOK["admin"], {})
        assert status == 200, trig
        wait_until(lambda: any(r["state"] == "succeeded"
                               for r in api(cluster, "/api/v1/jobs/hook/runs")["runs"]),
                   UI_S, "hook's run succeeded")
        browser.get(base + "#/jobs/hook")
        wait_until(lambda: browser.find_element(By.ID, "job-exec").text ==
                   f"HTTP: GET {receiver.url('/hook')}, succeeds on status 200", UI_S,
                   "the request on hook's page")
        click(browser, f'#runs tbody tr[data-run="{trig["run_id"]}"] button.log')
        wait_until(lambda: browser.find_element(By.ID, "log-text").text ==
                   f"hook answered {trig['run_id']}", UI_S, "hook's log: the response body")
        assert "complete" in browser.find_element(By.ID, "log-state").text
        # flaky writes to stderr only: its stdout is empty, its stderr has the line.
        browser.get(base + "#/jobs/flaky")
        failed = '#runs tbody tr[data-state="failed"] button.log'
        wait_until(lambda: browser.find_elements(By.CSS_SELECTOR, failed), UI_S,
                   "flaky's failed runs with logs")
        click(browser, failed)
        wait_until(lambda: "bytes on stderr" in browser.find_element(By.ID, "log-state").text,
                   UI_S, "the stdout view saying stderr has output")
        click(browser, "#log-stderr")
        wait_until(lambda: browser.find_element(By.ID, "log-text").text == "boom", UI_S,
                   "flaky's stderr")
        # The runs table is re-rendered every 2 s (rows replaced); the log stays open.
        browser.execute_script("document.querySelector('#runs tbody tr').dataset.old = '1'")
        wait_until(lambda: not browser.find_elements(By.CSS_SELECTOR, "#runs tr[data-old]"),
                   UI_S, "the runs table re-rendered")
        assert browser.find_element(By.ID, "run-log").is_displayed()
        assert browser.find_element(By.ID, "log-text").text == "boom"
        browser.execute_script("document.getElementById('timeline').scrollIntoView()")
        browser.save_screenshot(os.path.join(shots, "dashboard-log.png"))
        click(browser, "#log-close")
        assert not browser.find_element(By.ID, "run-log").is_displayed()
    finally:
        receiver.close()
