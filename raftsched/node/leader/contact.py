"""An idle follower's liveness read from its Raft thread's answers (issue 31 item 3).

A node holding no run has nothing the leader would release, so its heartbeat entries
were only there to say it lives: three of an idle 3-node cluster's 3.2 entries a
second, each appended, synced and applied by every node, about half its leader's CPU.
Once every member lists the ``contact`` feature, an idle node heartbeats only every
``core.lease.contact_heartbeat_ms`` (a refresh of its record), and the leader counts
it alive while its Raft thread answers the leader's appends (every 300-400 ms by default:
``replica/pacing.py``).

Only for nodes holding no run. A node that holds one must show that its whole process
lives (its heartbeat loop runs on the event loop that starts and watches its runs),
and its lease counts from its heartbeats alone. Contact only ever moves a node's
silence on: a release comes later for it, never sooner, so the lease's argument
(core/lease.py) is untouched.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from raftsched.core import lease
from raftsched.core.cmdbase import CONTACT_FEATURE
from raftsched.node.replica import pacing

if TYPE_CHECKING:
    from raftsched.core.machine import ClusterState
    from raftsched.node.config.addressbook import AddressBook
    from raftsched.node.config.config import Timing
    from raftsched.node.replica.raft import RaftNode

#: The followers' answers are read at most this often (the leader's loop may turn
#: hundreds of times a second under load; a node timeout is seconds).
CHECK_S = 0.25
#: Whether every member lists ``contact`` is read again after this long.
FEATURE_RECHECK_S = 1.0


def _holding(st: ClusterState) -> set[str]:
    return {node for node, held in st.by_node.items() if held}


class ContactWatch:
    """When each idle follower last answered this leader. Runs on the event loop.

    :param raft: the replica (its Raft thread's answer times, and the state's claims).
    :param raft_to_id: Raft address -> node id.
    :param missing_feature: the members whose heartbeats lack a feature.
    :param fits: the timing leaves room for it (``lease.contact_fits``; the same on
        every member, as the whole timing is).
    """

    def __init__(self, *, raft: RaftNode, raft_to_id: AddressBook,
                 missing_feature: Callable[[str], list[str]], fits: bool = True) -> None:
        self.raft = raft
        self.fits = fits
        self.raft_to_id = raft_to_id
        self.missing_feature = missing_feature
        self._next_check = 0.0
        self._next_feature = 0.0
        self._on = False

    def enabled(self, mono: float) -> bool:
        """Every member reads an idle node's contact as its liveness (an older leader
        would count such a node lost between its rare heartbeats)."""
        if mono >= self._next_feature:
            self._next_feature = mono + FEATURE_RECHECK_S
            self._on = self.fits and not self.missing_feature(CONTACT_FEATURE)
        return self._on

    def seen(self, mono: float, candidates: Iterable[str]) -> dict[str, float]:
        """Node id -> when (``mono``'s clock) its Raft thread last answered us, for each
        of ``candidates`` that holds no run; empty between checks, while not every
        member lists ``contact``, or while not leading."""
        if mono < self._next_check or not self.enabled(mono):
            return {}
        self._next_check = mono + CHECK_S
        ages = self.raft.contact_ages()
        if not ages:
            return {}
        holding = self.raft.read(_holding)
        out: dict[str, float] = {}
        for node_id in candidates:
            addr = self.raft_to_id.raft_of(node_id)
            age = None if addr is None else ages.get(addr)
            if age is not None and node_id not in holding:
                out[node_id] = mono - age
        return out


def heard_every_s(append_period_s: float, fallback_s: float, *, connection_s: float) -> float:
    """How stale an idle follower's contact may be when the leader reads it: the longest
    gap between its answers (replica/pacing.py) plus the leader's reading interval."""
    return pacing.answered_within(append_period_s, fallback_s,
                                  connection_s=connection_s) + CHECK_S


def timing_fits(timing: Timing) -> bool:
    """Whether this timing leaves room to read idle nodes' liveness from their Raft
    answers (``core.lease.contact_fits``)."""
    return lease.contact_fits(timing.node_timeout_ms, heard_every_s(
        timing.append_period_ms / 1000, timing.leader_fallback_ms / 1000,
        connection_s=timing.connection_timeout_ms / 1000))


__all__ = ["CHECK_S", "ContactWatch", "heard_every_s", "timing_fits"]
