"""A leader that stalls while alive is waited out, not deposed (raftsched.node.replica.stalls).

Three real replicas ticked by one thread (tests.support.raftcluster), so a stall of the
leader's Raft thread is exact: the leader is not ticked for a while, the followers are.
After a few stalls shorter than the election timeout, which the leader reports in its
appends, longer stalls (past the election timeout, under three times the longest
reported) change no term; the same stalls with the tolerance off do, so the check can
fail.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.support.raftcluster import Cluster, establish

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]

#: The election timeout (ms): the short stalls stay 0.6 s under it, the long ones end
#: 0.5 s before three times the short ones.
ELECTION_MS = (1500, 3000)
SHORT_S, LONG_S, RESUME_S = 0.9, 2.2, 1.5


def _stall(c: Cluster, nid: str, seconds: float) -> None:
    """Tick every replica but ``nid`` for ``seconds``, then all for ``RESUME_S``."""
    c.run_for(seconds, paused=nid)
    c.run_for(RESUME_S)


def _max_term(c: Cluster) -> int:
    return max(node.term() for node in c.nodes.values())


def test_a_leader_that_stalls_while_alive_is_waited_out_not_deposed(tmp_path: Path) -> None:
    c = Cluster(tmp_path, election_ms=ELECTION_MS)
    try:
        leader, term = establish(c)
        followers = [n for n in c.nodes if n != leader]
        for _ in range(3):
            _stall(c, leader, SHORT_S)
        assert _max_term(c) == term, "a stall under the election timeout changed the term"
        reported = {f: c.nodes[f].sync.rs_leader_stall for f in followers}
        assert all(s >= SHORT_S for s in reported.values()), reported

        for i in range(5):
            _stall(c, leader, LONG_S)
            assert _max_term(c) == term, f"stall {i + 1} of {LONG_S}s deposed the leader"
        assert c.leader() == leader
        waited = sum(c.nodes[f].sync.rs_silences_waited for f in followers)
        assert waited >= 1, "no follower's election deadline passed: the stalls were too short"

        # The same stalls with only the election timeout: an election.
        for node in c.nodes.values():
            node.sync._rs_stall_factor = 0.0
        for _ in range(8):
            _stall(c, leader, LONG_S)
            if _max_term(c) > term:
                break
        assert _max_term(c) > term, "without the tolerance the stalls deposed no leader"
    finally:
        c.close()


def test_a_whole_cluster_back_from_a_freeze_keeps_its_leader(tmp_path: Path) -> None:
    """Every replica stops for longer than the leader fallback (a paused VM, a host that
    froze them all). The leader's check-quorum would count its own stall as its
    followers' silence and step down the moment it runs again; its stall is credited
    instead, as its liveness timers are (docs/architecture.md), and the term holds."""
    c = Cluster(tmp_path, election_ms=ELECTION_MS)
    try:
        leader, term = establish(c)
        c.paused.update(c.nodes)
        time.sleep(8.6)  # the harness's leader fallback is 8 s; nothing ticks meanwhile
        c.paused.clear()
        c.run_for(4.0)
        assert _max_term(c) == term, "the leader stepped down after the freeze"
        assert c.until(c.leader, "leader") == leader
    finally:
        c.close()
