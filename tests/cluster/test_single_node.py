"""Issue 2: one real node end to end — runs, environment, restart, bad input."""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
import time

import pytest

from raftsched.core.errors import InvalidSpec, UnknownJob
from tests.support.harness import (
    ROOT,
    outcomes_by_fire_time,
    read_witness,
    wait_until,
    witness_command,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

#: The default timing.lookahead: a run is never assigned earlier than this before its
#: fire time (plus a little for the leader's tick).
LOOKAHEAD_MS = 250 + 50


def _iso_ms(run: dict) -> int:
    return run["scheduled_ms"]


def test_every_second_job_runs_every_second_with_its_own_id_and_fence(cluster_factory, tmp_path):
    c = cluster_factory(1)
    c.start_all()
    c.wait_leader()
    ran = str(tmp_path / "ran.jsonl")
    with c.client() as cl:
        cl.put_job({"id": "tick", "schedule": {"every": "1s"}, "command": witness_command(ran)})
        wait_until(lambda: len(read_witness(ran)) >= 5, 15, "five executed runs")
        runs = {r["run_id"]: r for r in cl.runs("tick", limit=50)["runs"]}
    seen = read_witness(ran)[:5]
    # One run per second: consecutive scheduled seconds, each with its own run id and fence.
    sched = [int(r["RUN_ID"].rpartition("@")[2]) for r in seen]
    assert sched == [sched[0] + 1000 * i for i in range(5)], sched
    assert len({r["FENCE"] for r in seen}) == 5
    for rec in seen:
        run = runs[rec["RUN_ID"]]
        assert str(run["fence"]) == rec["FENCE"], "the job saw the fence the cluster recorded"
        assert rec["JOB_ID"] == "tick" and rec["ATTEMPT"] == "1" and rec["NODE_ID"] == "n1"
        assert run["node"] == "n1"
        assert rec["SCHEDULED_AT"].endswith("Z")
        assert run["state"] in ("succeeded", "started")
        # It started at (not before) its scheduled instant.
        assert rec["t"] * 1000 >= run["scheduled_ms"] - 5


def test_sigkill_and_restart_keeps_jobs_history_and_accounts_for_the_downtime(
        cluster_factory, tmp_path):
    """What the product promises across a crash, whatever the machine's load: the job
    and its history survive; every fire time has exactly one recorded outcome; a fire
    time that fell while the node was down (so was never assigned) is recorded missed
    once its grace has passed; a run executed before the kill is recorded succeeded or,
    when its finish did not commit before the kill, follows on_node_lost (retried with
    a new attempt, or recorded lost)."""
    c = cluster_factory(1)
    c.start_all()
    c.wait_leader()
    ran = str(tmp_path / "ran.jsonl")
    spec = {"id": "beat", "schedule": {"every": "1s"}, "command": witness_command(ran),
            "misfire": {"policy": "skip", "grace": "1s"}}
    with c.client() as cl:
        cl.put_job(spec)
        wait_until(lambda: len(read_witness(ran)) >= 3, 15, "three runs before the crash")
    t_kill = c.kill("n1")  # taken before the signal
    before_kill = read_witness(ran)
    # Keep it down for a few fire times (a real outage, not a wait for a condition).
    time.sleep(3.5)
    t_restart = time.time()  # taken before the new process exists
    c.start("n1")
    c.wait_leader()
    with c.client() as cl:
        job = cl.get_job("beat")
        assert job["spec"]["command"] == spec["command"]
        wait_until(lambda: any(r["t"] > t_restart for r in read_witness(ran)), 20,
                   "a run after the restart")
        runs = cl.runs("beat", limit=100)["runs"]
    executed = read_witness(ran)
    # A retried run keeps each attempt in its history: the newest attempt is its outcome.
    by_id: dict[str, dict] = {}
    for run in sorted(runs, key=lambda r: r["attempt"]):
        earlier = by_id.get(run["run_id"])
        assert earlier is None or (earlier["attempt"] < run["attempt"] and earlier["state"]
                                   in ("lost", "failed", "timed_out")), (earlier, run)
        by_id[run["run_id"]] = run
    acc = outcomes_by_fire_time(list(by_id.values()))
    # Every fire time from the first executed to the last accounted has exactly one
    # outcome: nothing silently dropped, nothing recorded twice.
    first = min(int(r["RUN_ID"].rpartition("@")[2]) for r in executed)
    span = range(first, max(acc) + 1, 1000)
    assert not [t for t in span if t not in acc], f"fire times with no record: {sorted(acc)}"
    assert all(len(acc[t]) == 1 for t in span), {t: acc[t] for t in span if len(acc[t]) > 1}
    # Never assigned before the kill (planned at most a lookahead ahead) and already
    # older than the grace when the restarted node could first plan: missed, with why.
    outage = [t for t in span if t_kill * 1000 + LOOKAHEAD_MS < t < t_restart * 1000 - 1000]
    assert outage, (t_kill, t_restart, sorted(acc))
    assert all(acc[t][0] in ("missed:cluster_down", "missed:no_leader") for t in outage), \
        {t: acc[t] for t in outage}
    # Runs executed before the kill: their history survived, and each is recorded as
    # succeeded, or (its finish lost with the node) retried as a new attempt, or lost.
    assert len(before_kill) >= 3
    for rec in before_kill:
        run = by_id.get(rec["RUN_ID"])
        assert run is not None, f"{rec['RUN_ID']} executed but has no record"
        attempt = int(rec["ATTEMPT"])
        assert (run["state"] == "succeeded" and run["attempt"] == attempt) \
            or run["attempt"] > attempt or run["state"] == "lost", (rec, run)


def test_bad_specs_are_refused_with_the_field_named_and_change_nothing(cluster_factory):
    c = cluster_factory(1)
    c.start_all()
    c.wait_leader()
    bad = [
        ({"id": "x y", "schedule": {"every": "1s"}, "command": ["true"]}, "id"),
        ({"id": "a", "schedule": {"cron": "61 * * * *"}, "command": ["true"]}, "schedule.cron"),
        ({"id": "a", "schedule": {"every": "1s"}, "command": []}, "command"),
        ({"id": "a", "schedule": {"every": "1s"}, "command": ["true"], "timeout": "soon"},
         "timeout"),
        ({"id": "a", "schedule": {"every": "1s"}, "command": ["true"], "overlap": "maybe"},
         "overlap"),
        ({"id": "a", "schedule": {"every": "1s"}, "command": ["true"], "bogus": 1}, "bogus"),
        ({"id": "a", "schedule": {"every": "1s"}, "call": "os:system"}, "call"),
        ({"id": "a", "schedule": {"cron": "* * * * *", "tz": "Mars/Base"},
          "command": ["true"]}, "schedule.tz"),
    ]
    with c.client() as cl:
        cl.put_job({"id": "keep", "schedule": {"every": "1h"}, "command": ["true"]})
        before = cl.list_jobs()
        for spec, field in bad:
            with pytest.raises(InvalidSpec) as info:
                cl.put_job(spec)
            assert field in str(info.value), (field, str(info.value))
        with pytest.raises(UnknownJob):
            cl.get_job("a")
        after = cl.list_jobs()
    assert [j["id"] for j in after["jobs"]] == [j["id"] for j in before["jobs"]] == ["keep"]
    assert after["jobs"][0]["version"] == before["jobs"][0]["version"]


def test_garbage_frames_get_errors_and_the_node_keeps_serving(cluster_factory):
    c = cluster_factory(1)
    c.start_all()
    c.wait_leader()
    host, port = c.api["n1"].split(":")
    payloads = [
        struct.pack(">I", 0x7FFFFFFF),                       # oversized: refused unread
        struct.pack(">I", 5) + b"\xc1\xc1\xc1\xc1\xc1",     # not msgpack
        struct.pack(">I", 3) + b"\x93\x01\x02",             # a list, not a map
        struct.pack(">I", 2) + b"\x81\xa2",                 # truncated map
    ]
    for data in payloads:
        with socket.create_connection((host, int(port)), timeout=5) as s:
            s.sendall(data)
            head = s.recv(4)
            assert len(head) == 4, "the node answered with a frame"
    with c.client() as cl:
        assert cl.status()["health"] == "ok"
    assert c.alive("n1")


def test_bad_config_fails_the_boot_naming_the_key(tmp_path):
    cfg = tmp_path / "bad.toml"
    cfg.write_text('[cluster]\ndata_dir = "x"\n\n[[nodes]]\nid = "n1"\nraft = "127.0.0.1:7001"\n'
                   'api = "127.0.0.1:7101"\nwrkers = 4\n')
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, "-m", "raftsched", "node", "--config", str(cfg)],
                          capture_output=True, text=True, timeout=30, env=env)
    assert proc.returncode == 1
    assert "nodes[0].wrkers" in proc.stderr, proc.stderr
