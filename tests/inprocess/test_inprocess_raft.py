"""Issue 13 item 5: an in-process cluster of real replicas, ticked by the test.

Three :class:`~raftsched.node.replica.raft.RaftNode` replicas (real pysyncobj, real loopback
TCP, real journals) are made with ``auto_tick=False``: there is no Raft thread, the
test calls each replica's ``tick`` in turn, and a replica it does not tick is paused —
exactly like a SIGSTOPped process, its sockets open, its peers' messages waiting in
the kernel — but chosen step by step, with no process, no signal and no sleep. What
only real processes show (a SIGKILL, a lost journal, a network namespace) stays in the
process tests; here: one log order everywhere, and a deposed leader's verdict, the
mechanism behind issue 14's violation 1, refused by every replica however it reaches
the log.
"""

from __future__ import annotations

import time
from concurrent.futures import Future
from typing import Any

import pytest

from raftsched.core.commands import LeaderRecord, Release
from raftsched.core.errors import NotReady
from tests.support.raftcluster import T0, Cluster, establish, heartbeat

pytestmark = pytest.mark.timeout(120)


def test_commands_submitted_on_any_replica_apply_in_one_order_everywhere(cluster) -> None:
    c = cluster
    establish(c)
    # Followers forward to the leader; every submission resolves with its reply.
    for i, nid in enumerate(c.nodes):
        assert c.commit(nid, heartbeat(nid, T0 + i))["ok"]
    c.until(c.converged, "replicas with identical states")
    assert c.nodes["n1"].read(lambda st: sorted(st.nodes)) == ["n1", "n2", "n3"]


def test_a_paused_leaders_release_is_refused_by_every_replica_however_it_is_proposed(
        cluster) -> None:
    c = cluster
    old, old_term = establish(c)
    for nid in c.nodes:
        assert c.commit(nid, heartbeat(nid, T0 + 10))["ok"]
    healthy = sorted(n for n in c.nodes if n != old)
    # The leader stops running; the other two elect one of them and record it.
    c.paused.add(old)
    new = c.until(c.leader, "new leader")
    assert new in healthy
    new_term = c.nodes[new].leader_term()
    assert new_term is not None and new_term > old_term

    # It wakes still believing it leads (nothing told it otherwise while it slept) and
    # at once declares the others lost, as its stale view says. Appended to its own
    # log in its old term, such a command never commits (the new leader's no-op
    # overwrites it); queued until it hears of the new term, it is forwarded.
    c.paused.clear()
    assert c.nodes[old].leader_term() == old_term, "it did not run: it still leads"
    woke: list[Future[Any]] = [c.nodes[old].submit(Release(
        node=n, scope="all", reason="silent for 4.5s", term=old_term, leader=old,
        at=T0 + 30)) for n in healthy]
    leader = c.until(c.leader, "one leader followed by all three")
    assert leader != old and c.nodes[old].leader_term() is None

    # Following now, it still proposes a release with its old term: forwarded, the
    # leader appends it in the new term. The new leader has not recorded its
    # leadership yet (a window of a few ms in a node), so the state still names the
    # old one: only the log entry's term tells that the proposer no longer leads.
    assert c.nodes[leader].read(lambda st: st.leader.term) == old_term
    late = c.commit(old, Release(node=healthy[0], scope="all", reason="silent for 4.5s",
                                 term=old_term, leader=old, at=T0 + 40))
    assert late["ok"] is False and late["error"]["code"] == "conflict", late
    assert "no longer leads" in late["error"]["message"], late
    c.until(lambda: all(f.done() for f in woke), "outcome of the woken leader's releases")
    for fut in woke:
        exc = fut.exception()
        if exc is None:
            assert fut.result()["ok"] is False, fut.result()
        else:
            assert isinstance(exc, NotReady), exc

    lead_term = c.nodes[leader].leader_term()
    assert c.commit(leader, LeaderRecord(node=leader, term=lead_term, at=T0 + 50,
                                         skew={}))["ok"]
    c.until(c.converged, "replicas with identical states")
    alive = c.nodes[leader].read(lambda st: {n: rec.alive for n, rec in st.nodes.items()})
    assert alive == {"n1": True, "n2": True, "n3": True}, "a deposed leader's verdict held"


def test_a_dead_leaders_closed_sockets_start_the_next_election_at_once(tmp_path) -> None:
    """A killed leader's kernel closes its sockets: its followers read the close and
    campaign within half the minimum election timeout (uniformly drawn), not a whole
    timeout after its last message (issue 14: failover's cost). Destroying the
    replica closes its sockets as a SIGKILL does; election timeouts of 4-8 s make the
    two outcomes far apart: at most 2 s with the early campaign, at least ~3.9 s (the
    last heartbeat, ≤ 0.1 s before the close, plus 4 s) without it."""
    c = Cluster(tmp_path, election_ms=(4000, 8000))
    try:
        old, term = establish(c)
        c.paused.add(old)
        c.nodes[old].destroy()
        closed = time.monotonic()
        survivors = [n for n in c.nodes if n != old]
        campaign = c.until(lambda: time.monotonic() if any(
            c.nodes[n].term() > term for n in survivors) else None, "a campaign")
        new = c.until(c.leader, "a new leader")
        assert new in survivors
        assert campaign - closed < 3.0, f"first campaign {campaign - closed:.2f}s after the close"
    finally:
        c.close()



def test_the_link_between_two_followers_survives_their_idleness(tmp_path) -> None:
    """Followers exchange nothing in Raft, and pysyncobj drops a connection that has
    read nothing for its connection timeout the moment it next sends on it. That
    moment was the next election: the first vote request after a leader's death was
    dropped with the survivors' link, and the vote waited for a reconnect (0.5 s) and
    one more election timeout (W2: 0.76 s median to a new leader, 0.32 s with the
    link alive). Followers ping each other, so after two idle connection timeouts a
    send between them still goes out (issue 14: failover's cost)."""
    from pysyncobj.tcp_connection import CONNECTION_STATE

    c = Cluster(tmp_path, election_ms=(1000, 2000), connection_ms=2000)
    try:
        establish(c)
        idle_until = time.monotonic() + 4.5
        c.until(lambda: time.monotonic() > idle_until, "two idle connection timeouts")
        leader = c.until(c.leader, "a leader")
        a, b = (n for n in c.nodes if n != leader)
        transport = c.nodes[a].sync._SyncObj__transport
        node_b = next(n for n in transport._connections if n.address == c.addr[b])
        conn = transport._connections[node_b]
        transport.send(node_b, {"type": "rs_ping"})
        assert conn.state == CONNECTION_STATE.CONNECTED, "the idle follower link was dropped"
    finally:
        c.close()
