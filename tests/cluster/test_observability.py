"""Issue 5: metrics, health endpoints, the event story of a run, and `raftsched local`."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from raftsched.wire.client import Client
from tests.support.harness import ROOT, read_witness, wait_until, witness_command
from tests.support.localproc import free_local_base

pytestmark = [pytest.mark.integration]


def _scrape(addr: str) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://{addr}/metrics", timeout=5).read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def _http_code(url: str) -> int:
    try:
        return urllib.request.urlopen(url, timeout=5).status
    except urllib.error.HTTPError as exc:
        return exc.code


@pytest.mark.timeout(60)
def test_metrics_move_as_runs_happen_and_health_endpoints_answer(cluster_factory, tmp_path):
    c = cluster_factory(1)
    c.start_all()
    c.wait_leader()
    addr = c.metrics["n1"]
    wait_until(lambda: _http_code(f"http://{addr}/readyz") == 200, 10, "/readyz ok")
    assert _http_code(f"http://{addr}/healthz") == 200
    assert _http_code(f"http://{addr}/nope") == 404
    before = _scrape(addr)
    ran = str(tmp_path / "ran.jsonl")
    with c.client() as cl:
        cl.put_job({"id": "m", "schedule": {"every": "1s"}, "command": witness_command(ran)})
        wait_until(lambda: len(read_witness(ran)) >= 3, 15, "three runs")
    after = wait_until(lambda: (m := _scrape(addr)).get(
        'raftsched_runs{outcome="succeeded"}', 0) >= 2 and m, 10, "succeeded runs counted")
    assert after['raftsched_runs{outcome="succeeded"}'] > before.get(
        'raftsched_runs{outcome="succeeded"}', 0)
    assert after["raftsched_schedule_lag_seconds_count"] >= 3
    assert after["raftsched_schedule_lag_seconds_count"] > before.get(
        "raftsched_schedule_lag_seconds_count", 0)
    assert after["raftsched_jobs"] == 1
    assert after["raftsched_worker_started_total"] >= 3
    assert after["raftsched_raft_commit_index"] > before["raftsched_raft_commit_index"]
    assert after["raftsched_is_leader"] == 1
    assert after["raftsched_commit_latency_seconds_count"] > 0
    # Every hold of the Raft lock is timed (issue 13); nothing here holds it long:
    # docs/benchmarks.md's figure is <= 14 ms of work; the margin is a loaded machine preempting the
    # holder (the metric is wall time).
    assert after["raftsched_raft_lock_hold_seconds_count"] > before.get(
        "raftsched_raft_lock_hold_seconds_count", 0)
    assert 0 < after["raftsched_raft_lock_hold_max_seconds"] < 0.5
    # The stall figures (raftsched.node.replica.stalls) are there; this one-node cluster has no
    # leader reporting to it and waited out no silence.
    assert after["raftsched_raft_stall_seconds"] >= 0
    assert after["raftsched_leader_stall_seconds"] == 0
    assert after["raftsched_leader_silences_waited_total"] == 0
    # A node's process watches its garbage collections (raftsched.node.observe.gcwatch).
    for gen in "012":
        assert after[f'raftsched_gc_collections_total{{generation="{gen}"}}'] >= 0
        assert after[f'raftsched_gc_seconds_total{{generation="{gen}"}}'] >= 0


@pytest.mark.timeout(90)
def test_the_events_of_one_run_tell_its_story_in_order_without_secrets(cluster_factory,
                                                                      tmp_path):
    c = cluster_factory(3)
    c.start_all()
    leader = c.wait_leader()
    ran = str(tmp_path / "ran.jsonl")
    at = (int(time.time()) + 2) * 1000
    secret_value = "env-value-that-must-never-be-logged-7f3a"
    with c.client() as cl:
        cl.put_job({"id": "story", "schedule": {"at": time.strftime(
            "%Y-%m-%dT%H:%M:%SZ", time.gmtime(at / 1000))}, "env": {"TOKEN": secret_value},
            "command": witness_command(ran)})
        wait_until(lambda: [r for r in cl.runs("story")["runs"] if r["state"] == "succeeded"],
                   15, "the run succeeded")
    run_id = f"story@{at}"

    def story_of_run() -> list[dict]:
        return sorted((e for n in c.ids for e in c.events(n) if e.get("run_id") == run_id),
                      key=lambda e: e["ts_ms"])

    # The leader writes run.ended when it applies the finish: awaited (a loaded machine
    # may take longer than the 0.5 s this used to sleep), then the whole story is checked.
    wait_until(lambda: any(e["event"] == "run.ended" for e in story_of_run()), 20,
               "run.ended logged", interval=0.25)
    time.sleep(0.5)  # a wrong extra event would have been logged by now
    story = story_of_run()
    kinds = [e["event"] for e in story]
    assert kinds == ["run.assigned", "run.started", "run.finished", "run.ended"], kinds
    by_kind = {e["event"]: e for e in story}
    worker = read_witness(ran)[0]["NODE_ID"]
    assert by_kind["run.assigned"]["node"] == leader
    assert by_kind["run.assigned"]["assigned_to"] == worker
    assert by_kind["run.started"]["node"] == worker == by_kind["run.finished"]["node"]
    assert by_kind["run.ended"]["outcome"] == "succeeded"
    assert by_kind["run.started"]["fence"] == by_kind["run.assigned"]["fence"]
    for nid in c.ids:
        with open(c.logs[nid], encoding="utf-8", errors="replace") as f:
            assert secret_value not in f.read(), f"env value leaked into {nid}'s log"


@pytest.mark.timeout(90)
def test_local_starts_a_cluster_feeds_runs_and_stops_on_ctrl_c(tmp_path):
    base = free_local_base()
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.Popen([sys.executable, "-m", "raftsched", "local", "--nodes", "3",
                             "--base-port", str(base), "--data-dir", str(tmp_path / "local")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, start_new_session=True)
    lines: list[str] = []
    try:
        addrs = [f"127.0.0.1:{base + 100 + i}" for i in (1, 2, 3)]
        with Client(addrs, timeout=5) as cl:
            wait_until(lambda: cl.status()["health"] == "ok", 30, "a healthy local cluster")
            cl.put_job({"id": "feed", "schedule": {"every": "1s"}, "command": ["true"]})
            os.set_blocking(proc.stdout.fileno(), False)

            def fed() -> bool:
                chunk = proc.stdout.read()
                if chunk:
                    lines.extend(chunk.splitlines())
                return any("run.started" in ln and "feed@" in ln for ln in lines)

            wait_until(fed, 20, "a run in the live feed")
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(20)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    rest = proc.stdout.read() or ""
    lines.extend(rest.splitlines())
    assert proc.returncode == 0, lines[-20:]
    assert any("raftsched local: stopped" in ln for ln in lines)
    started = [ln for ln in lines if "run.started" in ln]
    assert re.search(r"\[n[123]\] run\.started +feed@\d+", started[0]), started[0]


def test_status_apply_lag_is_the_log_position_not_a_count_of_commands(cluster_factory):
    """Issue 29 item 3: the lag is the commit index minus the index of the last entry
    applied on this node. Counting the state machine's commands instead left a gap
    (the no-op each election appends, membership entries) that never closed."""
    c = cluster_factory(3)
    c.start_all()
    leader = c.wait_leader()
    with c.client() as cl:
        cl.put_job({"id": "lag", "schedule": {"every": "1h"}, "command": ["true"]})

    def settled() -> dict | None:
        st = c.status(leader)
        return st if st.get("apply_lag") == 0 else None

    st = wait_until(settled, 20, "an idle leader with nothing left to apply")
    assert st["applied_index"] == st["commit_index"]
    # The old figure: commands applied, fewer than the log's entries (the precondition
    # that made it a false lag).
    assert st["applied"] < st["commit_index"]
