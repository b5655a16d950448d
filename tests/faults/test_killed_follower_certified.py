"""Issue 28, W3F on a real cluster: a follower's node process SIGKILLed just before an
instant whose runs it had pre-started. Its guard outlives it, kills and reaps every
process the node caused, and certifies the incarnation dead through another member; the
cluster releases its runs at once instead of waiting out its lease.

The node timeout is long (12 s): the lease path would release ~8 s after the instant,
so runs moving on within ``BOUND_S`` can only be the certificate's doing (the benchmark,
not this test, measures how soon: bench W3F)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from raftsched.core.nodes import CERTIFIED
from tests.support.followerkill import (
    FAIL,
    RETRY,
    alive_in_status,
    held_runs,
    kill_a_follower_holding_runs,
)
from tests.support.harness import read_witness, wait_until, witness_command

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

NODE_TIMEOUT_S = 12
#: Far below the lease release (>= 8 s after the instant with this node timeout), far
#: above the certified one (a fraction of a second) on a loaded machine.
BOUND_S = 5.0
#: How a run is recorded when its node's lease ended under it: its worker fenced it
#: (``self-fenced``, ``no lease``), or the leader released it (``node n1 silent for``,
#: ``disconnected, lease over``).
_LEASE_REASONS = ("self-fenced", "no lease", "silent for", "disconnected")


def _moved_on(recs: list[dict[str, Any]], victim: str, job: str) -> dict[str, Any] | None:
    if job in FAIL:
        return next((r for r in recs if r["state"] == "lost"), None)
    return next((r for r in recs if r["attempt"] >= 2 and r["started_ms"] is not None
                 and r["node"] not in (None, victim)), None)


def test_a_killed_followers_prestarted_runs_move_on_when_its_guard_certifies_it(
        cluster_factory, tmp_path):
    c = cluster_factory(3, workers=8, timing={"node_timeout": f"{NODE_TIMEOUT_S}s",
                                              "lookahead": "1s"})
    ran = str(tmp_path / "ran.jsonl")
    guards: dict[str, int | None] = {}

    def kill_node_only(nid: str) -> float:
        guards[nid] = c.guard_pid(nid)
        assert guards[nid] is not None, "the node has no guard process"
        return c.kill(nid)  # the node process only: its guard lives on

    leader, victim, instant, held = kill_a_follower_holding_runs(c, ran, kill_node_only)
    guard = guards[victim]

    def settled() -> dict[str, dict[str, Any]] | None:
        with c.client([leader]) as cl:
            now = held_runs(cl, victim, instant)
        moved = {j: _moved_on(recs, victim, j) for j, recs in now.items()}
        # A superset: a start the victim sent just before the kill can commit after
        # the first read of what it held; every run it held must move on.
        return moved if all(moved.values()) and set(held) <= set(moved) else None

    moved = wait_until(settled, 30, "the killed follower's runs to move on", 0.05)
    held = dict.fromkeys(moved)  # what it held, with a start that committed late
    delays = {}
    for j, rec in moved.items():
        at = rec["started_ms"] if j in RETRY else rec["finished_ms"]
        delays[j] = (at - instant) / 1000
    print(f"\nmoved on, seconds after the instant: {delays}")  # noqa: T201 - report only
    assert max(delays.values()) < BOUND_S, f"not released by a certificate: {delays}"
    for j in held:
        lost = [r for r in cl_runs(c, leader, j, instant) if r["state"] == "lost"]
        assert lost and all(r["reason"] == CERTIFIED for r in lost), (j, lost)
    # The victim is lost (certified), and its guard is gone once it has told the cluster.
    status = c.status(leader)
    assert not next(n for n in status["nodes"] if n["node_id"] == victim)["alive"]
    assert guard is not None
    wait_until(lambda: not _pid_alive(guard), 20, "the guard to exit after certifying")
    # Each run of that instant executed once per attempt, never on the dead node.
    runs = [w for w in read_witness(ran) if w["RUN_ID"] in {f"{j}@{instant}" for j in held}]
    assert all(w["NODE_ID"] != victim for w in runs), runs
    assert len({(w["RUN_ID"], w["ATTEMPT"]) for w in runs}) == len(runs), runs
    assert not any(w["RUN_ID"].startswith("f") for w in runs), runs
    # No later fire of an affected retry job was skipped for overlap because of the kill
    # (under the lease the dead node's runs blocked them for seconds).
    later = instant + 2000
    wait_until(lambda: all(any(r["scheduled_ms"] > later for r in cl_runs(c, leader, j))
                           for j in held if j in RETRY), 30, "later fires recorded")
    skipped = [(j, r["scheduled_ms"]) for j in held if j in RETRY
               for r in cl_runs(c, leader, j)
               if r["scheduled_ms"] >= later and r["state"] == "skipped"]
    assert not skipped, skipped


def cl_runs(c: Any, leader: str, job: str, instant: int | None = None
            ) -> list[dict[str, Any]]:
    with c.client([leader]) as cl:
        runs = cl.runs(job, limit=100)["runs"]
    return [r for r in runs if instant is None or r["scheduled_ms"] == instant]


def _pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_frozen_node_is_never_certified_and_comes_back(cluster_factory, tmp_path):
    """SIGSTOP freezes the node, not its guard: the node's socket stays open, so the
    guard never takes it for dead. Its runs move on only when its lease has ended, and
    once it runs again its heartbeats are welcome (its incarnation was not certified)."""
    import signal

    c = cluster_factory(3, workers=4)
    c.start_all()
    leader = c.wait_leader(30)
    ran = str(tmp_path / "ran.jsonl")
    with c.client() as cl:
        cl.put_jobs([{"id": f"s{i}", "schedule": {"every": "1s"}, "overlap": "allow",
                      "command": witness_command(ran, sleep_s=30)} for i in range(4)],
                    atomic=True)
    victim = next(n for n in sorted(c.ids) if n != leader)
    wait_until(lambda: any(w["NODE_ID"] == victim for w in read_witness(ran)), 30,
               f"a run executing on {victim}")
    c.signal(victim, signal.SIGSTOP)
    try:
        def released() -> list[dict[str, Any]] | None:
            out = [r for j in (f"s{i}" for i in range(4)) for r in cl_runs(c, leader, j)
                   if r["state"] == "lost" and r["node"] == victim]
            return out or None

        lost = wait_until(released, 30, "the frozen node's runs released")
        assert all("lease" in r["reason"] for r in lost), lost
        assert not any(r["reason"] == CERTIFIED for r in lost), lost
    finally:
        c.signal(victim, signal.SIGCONT)
    wait_until(lambda: alive_in_status(c, victim), 30, f"{victim} alive again")
    with c.client([leader]) as cl:
        assert cl.status()["leader"] is not None


def test_a_restarted_node_kills_what_its_dead_incarnation_left_and_certifies_it(
        cluster_factory, tmp_path):
    """Node and guard killed at once (kill_host) while a job runs: the job outlives both
    (an orphan). The node restarted on its data dir finds it by its run id and fence,
    kills it, and certifies its previous incarnation dead before its first heartbeat;
    the run is retried (attempt 2, or 3 when the new incarnation's lease fenced attempt 2
    on a loaded machine), and its attempt 1 is never running beside a retry."""
    c = cluster_factory(1)
    c.start_all()
    c.wait_leader(30)
    ran = str(tmp_path / "ran.jsonl")
    at = (int(time.time()) + 2) * 1000
    from raftsched.core.durations import format_timestamp
    with c.client() as cl:
        cl.put_job({"id": "long", "schedule": {"at": format_timestamp(at)},
                    "command": witness_command(ran, sleep_s=60, phases=True)})
    first = wait_until(lambda: [w for w in read_witness(ran) if w.get("phase") == "start"],
                       30, "the job to start")[0]
    c.kill_host("n1")
    assert _pid_alive(first["pid"]), "the job should outlive its node and guard here"
    c.start("n1")
    wait_until(lambda: not _pid_alive(first["pid"]), 30,
               "the restarted node to kill its dead incarnation's job")
    c.wait_leader(30)

    def retried() -> list[dict[str, Any]] | None:
        runs = cl_runs(c, "n1", "long")
        return runs if any(r["attempt"] >= 2 and r["started_ms"] for r in runs) else None

    runs = wait_until(retried, 30, "a retry started")
    lost = [r for r in runs if r["attempt"] == 1 and r["state"] == "lost"]
    assert lost and lost[0]["reason"] == CERTIFIED, runs
    starts = wait_until(lambda: (lambda s: s if len(s) >= 2 else None)(
        [w for w in read_witness(ran) if w.get("phase") == "start"]), 30, "a retry running")
    attempts = [int(w["ATTEMPT"]) for w in starts]
    assert attempts[0] == 1 and attempts == sorted(set(attempts)), starts
    ends = [w for w in read_witness(ran) if w.get("phase") in ("tick", "end")
            and w["ATTEMPT"] == "1"]
    # On a loaded machine (a 2 s node timeout here) the new incarnation can miss its own
    # lease right after spawning attempt 2 and fence it before its first line: then
    # attempt 3 runs instead (once; more would be a node that fences every retry). An
    # attempt that left no line must have been lost to that lease, and started only
    # after attempt 1 was dead, like any retry.
    assert attempts[1] <= 3, starts
    for a in range(2, attempts[1]):
        rec = next((r for r in cl_runs(c, "n1", "long") if r["attempt"] == a), None)
        assert rec is not None and rec["state"] == "lost", (a, rec)
        assert any(k in rec["reason"] for k in _LEASE_REASONS), (a, rec)
        # (Refused for want of a lease before it started, it has no start at all.)
        assert rec["started_ms"] is None or all(
            w["t"] * 1000 < rec["started_ms"] for w in ends), (a, rec, ends[-1:])
    assert all(w["t"] < starts[1]["t"] for w in ends), "attempt 1 still ran beside a retry"
