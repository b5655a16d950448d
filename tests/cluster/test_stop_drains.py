"""Issue 12 item 4 with a real node process: SIGTERM drains — the running process
finishes, its outcome is committed before the node exits, it never runs twice; nothing
new starts meanwhile; a second SIGTERM stops at once."""

from __future__ import annotations

import signal
import time

import pytest

from raftsched.core.durations import format_timestamp
from tests.support.harness import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def _at(ms_from_now: int) -> str:
    return format_timestamp((int(time.time() * 1000) + ms_from_now) // 1000 * 1000 + 1000)


def _lines(path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def _job(job_id: str, witness, sleep_s: float, **kw) -> dict:
    script = f'echo start $RAFTSCHED_ATTEMPT >> {witness}; sleep {sleep_s}; echo end >> {witness}'
    return dict({"id": job_id, "schedule": {"at": _at(0)}, "command": ["sh", "-c", script]},
                **kw)


def test_sigterm_lets_the_running_process_finish_and_records_it_once(cluster_factory, tmp_path):
    c = cluster_factory(1)
    c.start_all()
    c.wait_leader()
    w = tmp_path / "w.txt"
    later = tmp_path / "later.txt"
    with c.client() as cl:
        cl.put_job(_job("slow", w, 2))
        wait_until(lambda: _lines(w) == ["start 1"], 15, "the process to start")
        # Fires while the node drains: it must not start here.
        cl.put_job({"id": "later", "schedule": {"every": "1s"},
                    "command": ["sh", "-c", f"echo x >> {later}"]})
    t0 = time.monotonic()
    c.signal("n1", signal.SIGTERM)
    c.procs["n1"].wait(30)
    took = time.monotonic() - t0
    assert _lines(w) == ["start 1", "end"]
    assert took < 15, took
    started_later = len(_lines(later))
    c.start("n1")
    c.wait_leader()
    with c.client() as cl:
        runs = cl.runs("slow")["runs"]
        assert [(r["state"], r["attempt"]) for r in runs] == [("succeeded", 1)], runs
        # The node works again (the every-second job runs) and slow did not run again.
        wait_until(lambda: len(_lines(later)) >= started_later + 2, 15, "runs after restart")
        assert [r["state"] for r in cl.runs("slow")["runs"]] == ["succeeded"]
    assert _lines(w) == ["start 1", "end"]
    events = [e for e in c.events("n1") if e.get("event") == "run.started"]
    # Between the SIGTERM and the exit nothing new started.
    assert not [e for e in events if t0 * 1000 < e["ts_ms"] < (t0 + took) * 1000]


def test_a_second_sigterm_exits_at_once_and_the_run_follows_on_node_lost(cluster_factory,
                                                                         tmp_path):
    c = cluster_factory(1)
    c.start_all()
    c.wait_leader()
    w = tmp_path / "w.txt"
    with c.client() as cl:
        cl.put_job(_job("long", w, 60, on_node_lost="fail"))
        wait_until(lambda: _lines(w) == ["start 1"], 15, "the process to start")
    t_first = time.monotonic()
    c.signal("n1", signal.SIGTERM)
    wait_until(lambda: any(e.get("event") == "node.draining" for e in c.events("n1")), 15,
               "the first SIGTERM to begin the drain")
    assert c.alive("n1")
    # A repeat counts as "now" only a second after the first (one signal may arrive
    # twice, to the process and to its group).
    time.sleep(max(0.0, t_first + 1.2 - time.monotonic()))
    t0 = time.monotonic()
    c.signal("n1", signal.SIGTERM)
    c.procs["n1"].wait(30)
    assert time.monotonic() - t0 < 10
    c.start("n1")
    c.wait_leader()
    with c.client() as cl:
        wait_until(lambda: [r["state"] for r in cl.runs("long")["runs"]] == ["lost"], 15,
                   "the interrupted run recorded lost (on_node_lost = fail)")
    assert _lines(w) == ["start 1"]
