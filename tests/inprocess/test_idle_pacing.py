"""Issue 31 item 3, an idle cluster's cost: with real replicas (real pysyncobj, loopback
TCP, journals), an idle follower answers its leader's appends only every few periods
while each of its answers that acknowledges a new entry still leaves at once
(raftsched.node.replica.pacing)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from raftsched.node.replica.pacing import answer_every
from tests.support.raftcluster import T0, Cluster, establish, heartbeat

pytestmark = pytest.mark.timeout(120)


def _answers_heard(c: Cluster, leader: str) -> dict[Any, list[tuple[float, int]]]:
    """(when, acknowledged index) of every answer the leader reads, by follower."""
    heard: dict[Any, list[tuple[float, int]]] = {}
    sync = c.nodes[leader].sync
    inner = sync._rs_on_message

    def counting(node: Any, message: Any) -> Any:
        if isinstance(message, dict) and message.get("type") == "next_node_idx":
            heard.setdefault(node, []).append((time.monotonic(), message["next_node_idx"]))
        return inner(node, message)

    sync._rs_on_message = counting
    return heard


def test_an_idle_follower_answers_every_few_periods_and_a_new_entry_at_once(tmp_path) -> None:
    c = Cluster(tmp_path)
    try:
        leader, _ = establish(c)
        conf = c.nodes[leader].sync._SyncObj__conf
        every = answer_every(conf.appendEntriesPeriod, conf.leaderFallbackTimeout,
                             connection_s=conf.connectionTimeout)
        heard = _answers_heard(c, leader)
        window = 3.0
        c.run_for(window)
        assert c.leader() == leader, "the leader kept its followers"
        followers = [n for n in c.nodes if n != leader]
        assert len(heard) == len(followers), heard
        appends = window / conf.appendEntriesPeriod  # one append per period to each
        for node, seen in heard.items():
            # Unpaced: one answer per append (~60 here); paced: one per `every`.
            assert len(seen) <= window / every + 3 < appends / 2, (node, len(seen))
            gaps = [b[0] - a[0] for a, b in zip(seen, seen[1:], strict=False)]
            # Check-quorum hears from it well within the leader's fallback timeout.
            assert gaps and max(gaps) < conf.leaderFallbackTimeout / 2, (node, gaps)
        # A new entry: each follower's answer acknowledging it is not held back, or the
        # entry would not commit (the leader alone is no majority).
        before = {node: seen[-1][1] for node, seen in heard.items()}
        assert c.commit(leader, heartbeat(leader, T0 + 1))["ok"]
        c.until(lambda: all(heard[node][-1][1] > before[node] for node in heard),
                "both followers' answers acknowledging the new entry")
    finally:
        c.close()


def _appends_heard(c: Cluster, nid: str) -> list[float]:
    """When ``nid`` reads each append_entries from now on."""
    heard: list[float] = []
    sync = c.nodes[nid].sync
    inner = sync._rs_on_message

    def counting(node: Any, message: Any) -> Any:
        if isinstance(message, dict) and message.get("type") == "append_entries":
            heard.append(time.monotonic())
        return inner(node, message)

    sync._rs_on_message = counting
    return heard


def test_a_calm_caught_up_leader_spaces_its_empty_appends_and_a_stalled_one_does_not(
        tmp_path) -> None:
    from raftsched.node.replica.compat import raft_now
    from raftsched.node.replica.pacing import IDLE_APPEND_PERIODS

    c = Cluster(tmp_path)
    try:
        leader, _ = establish(c)
        period = c.nodes[leader].sync._SyncObj__conf.appendEntriesPeriod
        follower = next(n for n in c.nodes if n != leader)
        window = 3.0
        calm = _appends_heard(c, follower)
        c.run_for(window)
        calm_n = len(calm)
        # Every two periods (~30 in 3 s), not every period (~60).
        assert calm_n <= window / (IDLE_APPEND_PERIODS * period) + 4, calm_n
        # A stall of its own Raft thread (a loaded host): the full rate for its window.
        c.nodes[leader].sync._rs_stalls.note(raft_now(), 5.0)
        stalled = _appends_heard(c, follower)
        c.run_for(window)
        assert len(stalled) >= 1.4 * calm_n, (len(stalled), calm_n)
        assert c.leader() == leader
        # An entry is sent at once and commits, spaced appends or not.
        assert c.commit(leader, heartbeat(leader, T0 + 2))["ok"]
    finally:
        c.close()


def test_the_poll_is_paced_once_however_often_the_first_tick_is_retried(tmp_path) -> None:
    # The journal's adoption (which installs the pacing) is retried at every tick while
    # it fails; wrapping the poll again each time nested the waits.
    c = Cluster(tmp_path)
    try:
        establish(c)
        sync = next(iter(c.nodes.values())).sync
        paced = sync._poller.poll
        sync._rs_pace_polls()
        assert sync._poller.poll is paced
    finally:
        c.close()
