"""Issue 29 item 10: a run never shows as begun before its fire time. A node commits a
pre-start up to the lookahead ahead and spawns the run at the instant; the API, the
CLI and the live feed say when it ran, and keep the commit as its own time."""

from __future__ import annotations

import pytest

from raftsched.core.effects import RunStarted
from raftsched.core.records import RunRecord
from raftsched.faces.cliformat import format_runs
from raftsched.node.observe.events import feed_event

pytestmark = pytest.mark.timeout(10)

T = 1_796_090_509_000


def _run(started: int) -> RunRecord:
    return RunRecord(run_id=f"hello@{T}", job_id="hello", scheduled_ms=T, created_ms=T - 900,
                     state="succeeded", fence=1, node="n1", started_ms=started,
                     finished_ms=T + 40)


def test_a_pre_started_run_shows_its_fire_time_as_when_it_ran() -> None:
    view = _run(T - 98).view()
    assert view["executed_ms"] == T and view["started_ms"] == T - 98
    late = _run(T + 2500).view()  # a catch-up or a retry: it ran when committed
    assert late["executed_ms"] == T + 2500


def test_the_cli_start_column_is_the_execution_not_the_commit() -> None:
    text = format_runs({"job": "hello", "runs": [_run(T - 98).view()]})
    assert "T02:01:48.902Z" not in text and text.count("T02:01:49Z") == 2, text


def test_the_feed_says_started_at_the_fire_time_and_keeps_the_commit() -> None:
    ev = feed_event(RunStarted(f"hello@{T}", "n1", 1), node="n2", seq=7, ts_ms=T - 98)
    assert ev is not None and ev["ts_ms"] == T and ev["committed_ms"] == T - 98
    late = feed_event(RunStarted(f"hello@{T}", "n1", 2), node="n2", seq=8, ts_ms=T + 900)
    assert late is not None and late["ts_ms"] == T + 900 and "committed_ms" not in late
