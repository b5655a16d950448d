"""Issue 12 items 2 and 4 with the embedded ``raftsched.Scheduler``: on an existing
data dir it answers the stored jobs from the first call; stopping it drains running
callables (one execution, its real outcome recorded, no second attempt)."""

from __future__ import annotations

import threading
import time

import pytest

import raftsched
from raftsched.core.durations import format_timestamp
from tests.support.harness import free_ports, wait_until

pytestmark = pytest.mark.timeout(120)


def _sched(tmp_path, ports, **kw) -> raftsched.Scheduler:
    return raftsched.Scheduler(data_dir=str(tmp_path / "data"), raft=f"127.0.0.1:{ports[0]}",
                               api=f"127.0.0.1:{ports[1]}", **kw)


def test_an_embedded_scheduler_on_an_existing_data_dir_reads_its_jobs_at_once(tmp_path):
    ports = free_ports(2)
    specs = [{"id": f"e{i}", "schedule": {"at": "2099-01-01T00:00:00Z"}, "command": ["true"]}
             for i in range(300)]
    with _sched(tmp_path, ports) as sched:
        sched.client.put_jobs(specs)
    for _ in range(2):
        with _sched(tmp_path, ports) as sched:
            assert sched.client.list_jobs(limit=1)["total"] == 300
            assert sched.client.get_job("e299")["id"] == "e299"
            assert sched.client.status()["health"] == "ok"


# ------------------------------------------------------------------ item 4: stop drains

_LOG: list[str] = []
_LOG_LOCK = threading.Lock()


def _note(text: str) -> None:
    with _LOG_LOCK:
        _LOG.append(text)


def slow(ctx: raftsched.RunContext) -> str:
    """Takes 3 s; notes its start and end."""
    _note(f"start {ctx.run_id} {ctx.attempt}")
    time.sleep(3)
    _note(f"end {ctx.run_id} {ctx.attempt}")
    return "slept 3s"


def sentinel(ctx: raftsched.RunContext) -> None:
    _note(f"sentinel {ctx.run_id}")


def _soon(ms: int) -> str:
    return format_timestamp((int(time.time() * 1000) + ms) // 1000 * 1000 + 1000)


def _notes(prefix: str) -> list[str]:
    with _LOG_LOCK:
        return [n for n in _LOG if n.startswith(prefix)]


def test_stopping_the_scheduler_lets_a_running_callable_finish_and_records_it(tmp_path):
    _LOG.clear()
    ports = free_ports(2)
    with _sched(tmp_path, ports) as sched:
        sched.add_job(slow, id="slow", schedule={"at": _soon(0)}, timeout="1m")
        wait_until(lambda: _notes("start slow@"), 15, "the callable to start")
        time.sleep(1)
        t0 = time.monotonic()
    # stop() waited for the callable (about 2 s more: its end is noted by the time stop
    # returns), not for the stop timeout. (No lower bound on the wait: on a loaded
    # machine the start may be seen late, leaving less than a second of the callable.)
    assert time.monotonic() - t0 < 10
    assert len(_notes("end slow@")) == 1
    # Restarted without add_job: the stored callable job is known (no PermissionError),
    # its run was recorded succeeded, and it never runs a second time.
    with _sched(tmp_path, ports) as sched:
        runs = sched.client.runs("slow")["runs"]
        assert [(r["state"], r["attempt"], r["tail"]) for r in runs] == \
            [("succeeded", 1, "slept 3s")], runs
        sched.add_job(sentinel, id="sentinel", schedule={"at": _soon(0)})
        wait_until(lambda: _notes("sentinel"), 15, "a later job to run after the restart")
        assert [r["state"] for r in sched.client.runs("slow")["runs"]] == ["succeeded"]
    assert len(_notes("start slow@")) == 1, _LOG


def test_a_persisted_callable_job_runs_after_a_restart_before_add_job(tmp_path):
    _LOG.clear()
    ports = free_ports(2)
    with _sched(tmp_path, ports) as sched:
        sched.add_job(sentinel, id="later", schedule={"every": "1s"})
        wait_until(lambda: _notes("sentinel later@"), 15, "a first run")
    _LOG.clear()
    with _sched(tmp_path, ports) as sched:
        wait_until(lambda: _notes("sentinel later@"), 15, "a run with no add_job")
        runs = sched.client.runs("later")["runs"]
    assert not any("PermissionError" in (r.get("tail") or "") for r in runs), runs


def test_a_run_that_outlives_the_stop_timeout_is_stopped_and_follows_on_node_lost(tmp_path):
    _LOG.clear()
    ports = free_ports(2)
    with _sched(tmp_path, ports, stop_timeout=0.5) as sched:
        sched.add_job(slow, id="slow", schedule={"at": _soon(0)}, on_node_lost="fail")
        wait_until(lambda: _notes("start slow@"), 15, "the callable to start")
        t0 = time.monotonic()
    assert time.monotonic() - t0 < 2.5
    with _sched(tmp_path, ports) as sched:
        runs = sched.client.runs("slow")["runs"]
    assert [(r["state"], r["reason"]) for r in runs] == [("lost", "node stopping")], runs
