"""Operators move work and leadership deliberately (issue 16, items 3-4): drain and
undrain a node, hand leadership over on request and on a clean stop of the leader, and
restart every node in turn under load without losing or doubling a run."""

from __future__ import annotations

import signal
import time

import pytest

from tests.support.harness import json_lines, read_witness, wait_until, witness_command

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(240)]


def started_on(ran: str, node: str, after: float) -> list[dict]:
    return [r for r in json_lines(ran) if r["NODE_ID"] == node and r["t"] > after]


def due_on(ran: str, node: str, after: float) -> list[dict]:
    """Executions on ``node`` of fire times later than ``after`` (by the fire time in the
    run id, not by when the process started: a loaded machine starts processes late)."""
    return [r for r in json_lines(ran) if r["NODE_ID"] == node
            and int(r["RUN_ID"].rpartition("@")[2]) > after * 1000]


def test_drain_moves_work_and_leadership_off_a_node_and_undrain_brings_it_back(
        cluster_factory, tmp_path):
    c = cluster_factory(3)
    c.start_all()
    leader = c.wait_leader()
    ran = str(tmp_path / "ran.jsonl")
    with c.client() as cl:
        for i in range(6):
            cl.put_job({"id": f"j{i}", "schedule": {"every": "1s"},
                        "command": witness_command(ran)})
        # The leader runs work only when the followers' slots are full (here they are
        # not): the drain below moves leadership, then undrain brings work back to it.
        wait_until(lambda: len(read_witness(ran)) >= 6, 20, "runs")
        assert cl.drain(leader) == {"node": leader, "draining": True}
        # A draining leader hands leadership away.
        wait_until(lambda: (lambda s: s["leader"] if s["leader"] not in (None, leader)
                            else None)(cl.status()), 20, "leadership off the drained node")
        drained_at = time.time()
        status = cl.status()
        assert next(n for n in status["nodes"] if n["node_id"] == leader)["draining"] is True
        # Runs already placed (250 ms ahead) may still start; nothing new after that.
        # (The new leader runs work only when the followers' slots are full: any other
        # node counts.)
        wait_until(lambda: [r for n in c.ids if n != leader
                            for r in due_on(ran, n, drained_at + 1.0)],
                   20, "the others took the work")
        time.sleep(max(0.0, drained_at + 3.0 - time.time()))
        late = due_on(ran, leader, drained_at + 1.0)
        assert not late, f"runs started on the drained node: {late[:3]}"
        cl.undrain(leader)
        undrained = time.time()
        wait_until(lambda: started_on(ran, leader, undrained), 20, "runs back on the node")


def test_transfer_leader_on_request_and_on_a_clean_stop(cluster_factory, tmp_path):
    c = cluster_factory(3)
    c.start_all()
    leader = c.wait_leader()
    target = next(n for n in c.ids if n != leader)
    with c.client() as cl:
        # The leader is reported before its first commits (the membership seed): a
        # transfer asked in between was refused as to an unknown node (CI, loaded).
        wait_until(lambda: {x["node_id"] for x in cl.status()["nodes"]} >= set(c.ids), 20,
                   "every node known to the cluster")
        reply = cl.transfer_leader(target)
        assert reply["from"] == leader and reply["to"] == target
        wait_until(lambda: cl.status()["leader"] == target, 20, f"{target} leads")
    # SIGTERM the leader: it hands leadership over before it leaves.
    c.signal(target, signal.SIGTERM)
    c.procs[target].wait(30)
    rest = [n for n in c.ids if n != target]
    c.wait_leader(among=rest)
    events = [e.get("event") for e in c.events(target) if e.get("event")]
    assert "leader.transferred" in events, events[-10:]
    assert events[-1] == "node.stopped"


def test_rolling_restart_with_drain_loses_and_doubles_nothing(cluster_factory, tmp_path):
    c = cluster_factory(3)
    c.start_all()
    c.wait_leader()
    ran = str(tmp_path / "ran.jsonl")
    with c.client() as cl:
        for i in range(8):
            # overlap = allow: a run slowed by a busy machine past the next fire time
            # must not turn that fire into an overlap skip (not what this tests).
            cl.put_job({"id": f"r{i}", "schedule": {"every": "1s"}, "overlap": "allow",
                        "command": witness_command(ran, 0.2)})
    wait_until(lambda: len(json_lines(ran)) >= 16, 30, "runs before the restarts")
    t_begin = time.time()
    for nid in c.ids:
        with c.client([n for n in c.ids if n != nid]) as cl:
            cl.drain(nid)
            drained_at = time.monotonic()
            # Its placed runs start and finish (awaited, not slept for): nothing assigned
            # to or running on it, a plan's lookahead after the drain committed.
            wait_until(lambda n=nid, t=drained_at: time.monotonic() > t + 0.5 and next(
                x["inflight"] for x in cl.status()["nodes"] if x["node_id"] == n) == 0,
                30, f"{nid}'s placed runs to end")
            c.signal(nid, signal.SIGTERM)
            c.procs[nid].wait(30)
            c.start(nid)
            wait_until(lambda n=nid: c.status(n)["leader"] is not None, 30, f"{nid} back")
            cl.undrain(nid)
            time.sleep(1.0)
    t_end = time.time() + 1.0

    def not_once() -> list:
        with c.client() as cl:
            runs = {j: cl.runs(j, limit=1000)["runs"] for j in (f"r{i}" for i in range(8))}
        bad = []
        for job, rs in runs.items():
            by_time: dict[int, list[str]] = {}
            for r in rs:
                for t in range(r["scheduled_ms"], (r["until_ms"] or r["scheduled_ms"]) + 1,
                               1000):
                    by_time.setdefault(t, []).append(f"{r['state']}:{r['reason']}")
            for t in range(int(t_begin) * 1000 + 1000, int(t_end) * 1000, 1000):
                outcomes = by_time.get(t, [])
                if outcomes != ["succeeded:exit 0"] and not (
                        len(outcomes) == 1 and outcomes[0].startswith("started")):
                    bad.append((job, t, outcomes))
        return bad

    # The last fire times start within ~2 s on an idle machine; a loaded one may take
    # longer to start them, so wait for them (a lost or doubled one never settles).
    deadline = time.monotonic() + 40
    while (bad := not_once()) and time.monotonic() < deadline:
        time.sleep(0.5)
    executed: dict[str, int] = {}
    for rec in json_lines(ran):
        executed[rec["RUN_ID"]] = executed.get(rec["RUN_ID"], 0) + 1
    doubled = {r: n for r, n in executed.items() if n > 1}
    assert not doubled, f"runs executed twice: {doubled}"
    assert not bad, f"fire times not run exactly once: {bad[:10]}"
