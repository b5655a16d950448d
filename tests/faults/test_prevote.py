"""Pre-vote (Raft thesis §9.6): a follower back from a pause never deposes its leader.

Three real replicas ticked by one thread (:mod:`tests.support.raftcluster`'s
cluster: real pysyncobj, real loopback TCP), so a pause is exact: the paused follower
is simply not ticked while the others are, well past its election timeout. Without
pre-vote it campaigns the moment it runs again, with a higher term, and the working
leader steps down; with it, the term never moves. Each test runs the same pause with
pre-vote turned off on the paused replica too, so it proves it can fail.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from raftsched.node.replica.compat import raft_now
from tests.support.raftcluster import Cluster, establish

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]


def _pause(c: Cluster, nid: str, seconds: float) -> None:
    """Tick every replica but ``nid`` for ``seconds``."""
    c.run_for(seconds, paused=nid)


def _resume(c: Cluster, seconds: float) -> None:
    c.run_for(seconds)


def _terms(c: Cluster) -> set[int]:
    return {node.term() for node in c.nodes.values()}


def _wakes(c: Cluster, follower: str, pause_s: float, prevote: bool) -> int:
    """Pause ``follower`` past its election timeout, resume, and return the term
    change it caused (the leader's term after minus before)."""
    c.nodes[follower].sync._rs_prevote = prevote
    leader = c.until(c.leader, "leader")
    before = c.nodes[leader].term()
    _pause(c, follower, pause_s)
    _resume(c, 6.0)
    c.until(c.leader, "leader after the pause")
    return max(_terms(c)) - before


#: name -> (pause s, connection timeout ms).
CASES = {
    # Connections stay open: the leader's appends wait in the paused node's socket.
    "connections open": (5.0, 8000),
    # Longer than the connection timeout: the leader has dropped the connection, so
    # nothing waits; the resumed node asks for votes and is refused.
    "connection dropped": (4.0, 2500),
}


def _three_wakes_then_one_without_prevote(tmp_path: Path, pause_s: float,
                                          connection_ms: int) -> None:
    c = Cluster(tmp_path, election_ms=(1000, 2000), connection_ms=connection_ms)
    try:
        leader, _term = establish(c)
        follower = next(n for n in c.nodes if n != leader)
        changes = [_wakes(c, follower, pause_s, prevote=True) for _ in range(3)]
        assert changes == [0, 0, 0], f"term changes per wake-up with pre-vote: {changes}"
        assert c.leader() == leader
        # The same pause without pre-vote deposes the leader: the check above can fail.
        assert _wakes(c, follower, pause_s, prevote=False) >= 1
    finally:
        c.close()


def test_a_follower_back_from_a_pause_does_not_change_the_term(tmp_path: Path) -> None:
    """Each case on its own cluster, both at once: a cluster is ticked by one thread
    alone (its own), and each case spends its ~40 s waiting out pauses and what follows
    them, so side by side they take the time of one."""
    with ThreadPoolExecutor(len(CASES), thread_name_prefix="prevote-case") as pool:
        running = {name: pool.submit(_three_wakes_then_one_without_prevote,
                                     tmp_path / name.replace(" ", "-"), *args)
                   for name, args in CASES.items()}
    for name, fut in running.items():
        exc = fut.exception()
        if exc is not None:
            raise AssertionError(f"{name}: {exc}") from exc


def test_a_dead_leaders_followers_still_elect_a_new_one(tmp_path) -> None:
    """Pre-vote asks before campaigning; with the leader gone every peer says yes."""
    c = Cluster(tmp_path, election_ms=(1000, 2000), connection_ms=2500)
    try:
        leader, term = establish(c)
        c.nodes[leader].destroy()
        c.paused.add(leader)
        c.until(lambda: (new := c.leader()) is not None and new != leader,
                "a new leader among the survivors")
        new = c.leader()
        assert new is not None and c.nodes[new].term() > term
        assert sum(n.sync.rs_elections for n in c.nodes.values()) >= 1
    finally:
        c.close()


def test_a_node_back_from_a_pause_vouches_for_no_candidate_until_it_hears_a_leader(
        tmp_path) -> None:
    """A follower that did not run for a while cannot tell whether the leader lives: its
    silence is its own. Past the connection timeout the leader dropped its connection,
    so for up to a reconnect nothing tells it otherwise; a peer whose timer expired
    just then (its own stall, or a leader busy catching the woken node up) must not
    win a pre-vote with its yes (a CI run saw exactly that: term 1 -> 2 at a wake-up)."""
    c = Cluster(tmp_path, election_ms=(1000, 2000), connection_ms=2500)
    try:
        leader, term = establish(c)
        woken, other = (n for n in c.nodes if n != leader)
        _pause(c, woken, 4.0)
        c.nodes[woken].tick(0.002)  # its first tick back: nothing from the leader yet
        sync = c.nodes[woken].sync
        assert sync._rs_woke_at > 0, "the replica did not notice its own pause"
        peer = next(n for n in sync._SyncObj__otherNodes
                    if getattr(n, "address", None) == c.addr[other])
        mine = c.nodes[other].sync
        ask = {"type": "rs_prevote", "term": mine._SyncObj__raftCurrentTerm + 1,
               "last_log_index": mine._SyncObj__getCurrentLogIndex(),
               "last_log_term": mine._SyncObj__getCurrentLogTerm()}
        assert sync._rs_prevote_grant(peer, ask) is False
        woke_at, sync._rs_woke_at = sync._rs_woke_at, float("-inf")
        # Without the rule it would have said yes: the check above can fail.
        assert sync._rs_prevote_grant(peer, ask) is True
        sync._rs_woke_at = woke_at
        _resume(c, 4.0)
        assert c.until(c.leader, "leader after the pause") == leader
        assert _terms(c) == {term}
    finally:
        c.close()


def test_a_yes_read_late_by_a_node_back_from_a_pause_deposes_no_leader(tmp_path) -> None:
    """A CI run (loaded host): a follower stopped 5 s, and term 1 -> 2 when it woke.
    Its Raft thread stopped inside a tick's poll; the poll that returned read what had
    queued meanwhile before the next tick could notice the pause: the other follower's
    pre-vote asks, sent when its own timer once expired (the loaded leader late to
    reach it). The woken node said yes to an ask seconds old, and the asker, which had
    heard from its leader again since, counted that yes and campaigned. Now the woken
    node knows it was stopped before its tick says so, and a yes counts only for the
    round still open: not an older round's, not one asked before a leader reached us."""
    c = Cluster(tmp_path, election_ms=(1000, 2000), connection_ms=8000)
    try:
        leader, term = establish(c)
        woken, other = (n for n in c.nodes if n != leader)
        asker = c.nodes[other].sync
        ask = {"type": "rs_prevote", "term": term + 1, "round": 1,
               "last_log_index": asker._SyncObj__getCurrentLogIndex(),
               "last_log_term": asker._SyncObj__getCurrentLogTerm()}
        # The asker's round for term + 1 is open while ``woken`` is stopped...
        c.paused.add(woken)
        asker._rs_prevote_term, asker._rs_prevote_round = term + 1, 1
        asker._rs_prevote_asked_at = raft_now()
        # ... and then its leader reaches it again.
        _resume(c, 1.5)
        assert asker._rs_leader_seen > asker._rs_prevote_asked_at
        # ``woken`` stays stopped a while longer; when it runs again, the poll it
        # stopped in reads the ask before its next tick.
        end = time.monotonic() + 3.0
        while time.monotonic() < end:
            c.tick()
        sync = c.nodes[woken].sync
        back = next(n for n in asker._SyncObj__otherNodes
                    if getattr(n, "address", None) == c.addr[woken])
        to_asker = next(n for n in sync._SyncObj__otherNodes
                        if getattr(n, "address", None) == c.addr[other])
        assert sync._rs_prevote_grant(to_asker, ask) is False, "a stopped node vouched"
        # The yes, had it been given, counts for nothing: a leader reached the asker.
        reply = {"type": "rs_prevote_reply", "term": term + 1, "round": 1, "granted": True}
        asker._rs_prevote_message(back, reply)
        assert not asker._rs_prevote_won
        # An older round's yes counts for nothing either, even with no leader since.
        asker._rs_prevote_round, asker._rs_prevote_asked_at = 2, raft_now()
        asker._rs_prevote_message(back, reply)
        assert not asker._rs_prevote_won
        # The controls: the checks above can fail. A tick that had noticed nothing
        # would have said yes, and this round's yes, with no leader since, wins.
        sync._rs_last_tick, sync._rs_woke_at = raft_now(), float("-inf")
        assert sync._rs_prevote_grant(to_asker, ask) is True
        asker._rs_prevote_message(back, dict(reply, round=2))
        assert asker._rs_prevote_won
        asker._rs_prevote_won = False
        c.paused.discard(woken)
        _resume(c, 3.0)
        assert c.until(c.leader, "leader") == leader
        assert _terms(c) == {term}
    finally:
        c.close()


def test_a_leader_that_steps_down_waits_an_election_timeout_before_asking(tmp_path) -> None:
    """A leader deposed by a higher term's vote request it does not grant (its log is
    ahead: the old leader of a transfer) waits a whole election timeout before it asks
    to campaign. Its deadline was never moved while it led, so it asked at its next
    tick, and a follower that still knew it as leader said yes: leadership went back
    (CI, loaded: test_drain's transfer to n2 never held)."""
    c = Cluster(tmp_path, election_ms=(1000, 2000), connection_ms=2500)
    try:
        leader, term = establish(c)
        _resume(c, 2.2)  # lead past the deadline set when it campaigned (1-2 s)
        assert c.nodes[leader].leader_term() == term
        sync = c.nodes[leader].sync
        peer = next(iter(sync._SyncObj__otherNodes))
        asked = sync._rs_prevote_round
        before = raft_now()  # pysyncobj's clock, which its deadlines are on
        # A candidate of the next term whose log is behind ours: refused, and we step down.
        sync._SyncObj__onMessageReceived(peer, {
            "type": "request_vote", "term": term + 1, "last_log_index": 0,
            "last_log_term": 0})
        assert c.nodes[leader].leader_term() is None
        # A fresh timeout (1-2 s) from the step-down, however long the host stalled since.
        assert sync._rs_deadline >= before + 1.0
        c.paused.update(n for n in c.nodes if n != leader)  # only the deposed one runs
        end = time.monotonic() + 0.5
        while time.monotonic() < end:
            c.tick()
        assert sync._rs_prevote_round == asked, "asked to campaign at once"
    finally:
        c.close()


def test_a_follower_reads_its_election_deadline_on_pysyncobjs_clock(tmp_path,
                                                                     monkeypatch) -> None:
    """pysyncobj's deadlines are on CLOCK_MONOTONIC_RAW; ``time.monotonic`` drifts
    from it as it is slewed (0.25 s apart on our test host). Read on the wrong clock,
    a deadline looked expired right after the leader's append, and followers asked
    for elections while their leader was healthy. Here ``time.monotonic`` is pushed
    5 s ahead of pysyncobj's clock: a follower of a working leader asks nothing."""
    c = Cluster(tmp_path, election_ms=(1000, 2000), connection_ms=2500)
    try:
        leader, term = establish(c)
        rounds = {n: c.nodes[n].sync._rs_prevote_round for n in c.nodes}
        real = time.monotonic
        monkeypatch.setattr(time, "monotonic", lambda: real() + 5.0)
        end = real() + 3.0
        while real() < end:
            c.tick()
        monkeypatch.undo()
        asked = {n: c.nodes[n].sync._rs_prevote_round - rounds[n] for n in c.nodes}
        assert asked == {n: 0 for n in c.nodes}, f"pre-vote rounds asked: {asked}"
        assert c.leader() == leader and _terms(c) == {term}
    finally:
        c.close()


def test_a_node_paused_inside_its_tick_does_not_campaign_on_waking(tmp_path) -> None:
    """The pause lands inside a tick: after the pre-vote step (its deadline was not yet
    due) and before pysyncobj's own election check, which then finds the deadline long
    past. pysyncobj must not campaign on its own: only a pre-vote round may let it.
    (A CI run saw term 1 -> 3 this way.) Without pre-vote the same tick campaigns: the
    check can fail."""
    from pysyncobj.syncobj import SyncObj

    c = Cluster(tmp_path, election_ms=(1000, 2000), connection_ms=8000)
    try:
        leader, term = establish(c)
        fid = next(n for n in c.nodes if n != leader)
        follower = c.nodes[fid]
        c.paused.add(fid)  # not ticked by the cluster: this test ticks it
        # Woken from a pause: the deadline passed while the thread stood still.
        follower.sync._SyncObj__raftElectionDeadline = raft_now() - 5.0
        SyncObj._onTick(follower.sync, 0.0)  # pysyncobj's tick alone, no pre-vote step
        assert follower.term() == term and c.nodes[leader].term() == term
        follower.sync._rs_prevote = False
        follower.sync._SyncObj__raftElectionDeadline = raft_now() - 5.0
        SyncObj._onTick(follower.sync, 0.0)
        assert follower.term() == term + 1, "without pre-vote the woken tick campaigns"
    finally:
        c.close()
