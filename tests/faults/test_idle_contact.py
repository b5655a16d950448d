"""Issue 31 item 3, real processes: once every member lists ``contact``, an idle node's
Raft thread answering its leader is its liveness (raftsched/node/leader/contact.py).
An idle cluster then commits almost nothing: no heartbeat entries, which were 3 of its
3.2 entries a second. Yet every node stays alive in the leader's eyes, a frozen idle
node (SIGSTOP) is still counted lost, and once it runs again it heartbeats and is back.
A node holding a run still lives by its heartbeats: every test that runs jobs covers
that path (and ``tests/unit/test_leader_liveness.py`` pins both rules on a fake clock)."""

from __future__ import annotations

import signal
import time
from typing import Any

import pytest

from tests.support.harness import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

#: The harness's node timeout (tests/support/harness.py).
NODE_TIMEOUT_S = 2.0
#: Seconds the idle cluster is watched: over four node timeouts.
WINDOW_S = 9.0
#: Entries it may commit meanwhile: a leader record when a skew moved (at most one per
#: 5 s), a refresh heartbeat now and then (each node's every 20 s), a retried heartbeat
#: on a loaded host, the closing status's read. At 0.25-0.67 s per node (the harness's
#: timing), heartbeats alone were 40 or more.
MAX_ENTRIES = 10


def _alive(c: Any, leader: str, nid: str) -> bool:
    nodes = {n["node_id"]: n for n in c.status(leader)["nodes"]}
    return bool(nodes[nid]["alive"])


def _quiet_window(c: Any) -> tuple[dict[str, Any], int]:
    """The leader's status after ``WINDOW_S`` of an idle cluster, and the entries it
    committed meanwhile; watched from outside (every status asks a consistent read,
    an entry of its own, so nothing is asked until it ends). A window with an election
    in it (a loaded host) measures that election: it is watched again, three times at
    most."""
    for _ in range(3):
        leader = c.wait_leader()
        before = c.status(leader)
        time.sleep(WINDOW_S)
        st = c.status(leader)
        if st["leader"] == leader and st["term"] == before["term"]:
            return st, st["commit_index"] - before["commit_index"]
    pytest.fail("an election in each of three windows of an idle cluster")


def test_an_idle_cluster_commits_no_heartbeats_and_a_frozen_idle_node_is_still_lost(
        cluster_factory: Any) -> None:
    c = cluster_factory(3)
    c.start_all()
    leader = c.wait_leader()
    wait_until(lambda: c.status(leader)["health"] == "ok", 30, "the cluster ok")
    # Past the boot heartbeats and the leader's first records.
    wait_until(lambda: all(_alive(c, leader, n) for n in c.ids), 30, "every node alive")
    time.sleep(2.0)
    st, entries = _quiet_window(c)
    leader = st["node"]
    victim = next(n for n in c.ids if n != leader)
    assert all(n["alive"] for n in st["nodes"]), st["nodes"]
    assert entries <= MAX_ENTRIES, f"{entries} entries in {WINDOW_S}s of an idle cluster"
    # Its last heartbeat entry is old, yet the leader reports it just heard from it.
    seen = {n["node_id"]: n["last_seen_ms"] for n in st["nodes"]}
    assert st["now_ms"] - seen[victim] < 2000, st["nodes"]

    c.signal(victim, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        wait_until(lambda: not _alive(c, leader, victim), 30, "the frozen idle node lost")
        # Not before the node timeout (the harness's 2 s) after its Raft thread last
        # answered (every 300-400 ms, later on a loaded host).
        took = time.monotonic() - stopped
        assert took >= NODE_TIMEOUT_S / 2, took
    finally:
        c.signal(victim, signal.SIGCONT)
    # Counted lost, it heartbeats at its next turn (not at its next refresh, 20 s away).
    wait_until(lambda: _alive(c, leader, victim), 15, "the node back once it runs again")
    lost = [e for e in c.events(leader) if e.get("event") == "node.lost"]
    assert [e.get("lost_node") for e in lost] == [victim], lost
