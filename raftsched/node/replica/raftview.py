"""A node's view of Raft and of its replica: roles, terms, peers and their contact, the
Raft thread's stalls, progress, and the replica's read port.

A base of :class:`~raftsched.node.replica.raft.RaftNode` (its state is the node's, set
in its ``__init__``). Its methods read, from any thread (pysyncobj's fields they read
are single values; the state is read under the replica's lock), except
``take_tick_gap``, which resets the gap it returns, and ``observe_lock_holds``, which
registers an observer.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from raftsched.core import lease
from raftsched.node.replica.compat import raft_now
from raftsched.node.replica.durable import SyncStats

if TYPE_CHECKING:
    from raftsched.core.machine import ClusterState
    from raftsched.node.replica.raftsync import RaftSyncObj
    from raftsched.node.replica.replica import Replica

T = TypeVar("T")


class RaftView:
    """The read side of :class:`~raftsched.node.replica.raft.RaftNode`."""

    # The node's state these methods read (set by RaftNode).
    sync: RaftSyncObj
    replica: Replica
    self_addr: str
    _lead_term: int | None
    _last_tick: float
    _tick_gap: float

    def is_leader(self) -> bool:
        return bool(self.sync._isLeader())

    def leader_term(self) -> int | None:
        """The term this node leads, or None. Leader-only commands carry it: the state
        machine refuses them unless the log entry is of that same term."""
        return self._lead_term

    def leader_addr(self) -> str | None:
        leader = self.sync._getLeader()
        return None if leader is None else str(getattr(leader, "address", leader))

    def term(self) -> int:
        return int(self.sync.raftCurrentTerm)

    def connected_peers(self) -> dict[str, bool]:
        """Raft address -> is the TCP connection to it up (a SIGKILL shows in ~5 ms)."""
        return {str(node.address): bool(self.sync.isNodeConnected(node))
                for node in self.sync.otherNodes}

    def contact_ages(self) -> dict[str, float]:
        """Leading: Raft address -> seconds since that follower last answered an append
        (its Raft thread lives and hears us); empty when not leading. Read from another
        thread: pysyncobj changes the dict only as members change."""
        s = self.sync
        if not s._isLeader():
            return {}
        now = raft_now()
        try:
            answered = list(s._SyncObj__lastResponseTime.items())
        except RuntimeError:  # a membership change resized it meanwhile: next time
            return {}
        return {str(getattr(node, "address", node)): max(0.0, now - at)
                for node, at in answered}

    def quorum_contact_age(self) -> float | None:
        """Seconds since this node last knew a leader in contact with a quorum: leading,
        since a majority (itself included) last answered it; following, since its
        leader's last append (a leader out of a quorum's contact steps down within the
        leader fallback timeout). None with no leader known."""
        s = self.sync
        if s._isLeader():
            # The voting members only (not a read-only node's or a removed one's stamp).
            voters = {str(getattr(node, "address", node)) for node in s.otherNodes}
            return lease.majority_contact_age(
                [age for addr, age in self.contact_ages().items() if addr in voters],
                len(voters) + 1)
        seen = s._rs_leader_seen
        if s._getLeader() is None or not seen:
            return None
        return max(0.0, raft_now() - seen)

    def take_tick_gap(self) -> float:
        """The longest gap between two Raft ticks since the last call (seconds)."""
        gap, self._tick_gap = self._tick_gap, 0.0
        return max(gap, time.monotonic() - self._last_tick)

    def stalls(self) -> tuple[float, float, int]:
        """(this node's longest Raft-thread stall of the last 30 s, the longest its leader
        reported, how many of that leader's silences it waited out past the election
        timeout): see raftsched.node.replica.stalls. Read from another thread: floats and ints."""
        s = self.sync
        window = s._rs_stalls
        own = window.longest(raft_now()) if window is not None else 0.0
        return own, float(s.rs_leader_stall), int(s.rs_silences_waited)

    def follower_lag(self) -> int:
        """On the leader, the entries its slowest connected follower lacks (else 0)."""
        try:
            return int(self.sync.rs_follower_lag())
        except Exception:  # noqa: BLE001 - a signal, best effort (a dict resized meanwhile)
            return 0

    def raft_members(self) -> set[str]:
        """The Raft addresses of the voting members as this replica's pysyncobj knows
        them (itself included): the membership the quorum is counted on."""
        return {self.self_addr} | {str(node.address) for node in self.sync.otherNodes}

    def joining(self) -> bool:
        """Started with ``join`` and no leader has reached it yet."""
        return bool(self.sync._rs_joining)

    def ready(self) -> bool:
        """True once this replica has applied the log up to the leader's commit index
        after start (before that its state may be a half-replayed past)."""
        return bool(self.sync.isReady())

    def has_quorum(self) -> bool:
        return bool(self.sync.hasQuorum)

    def status(self) -> dict[str, Any]:
        try:
            return dict(self.sync.getStatus())
        except Exception:  # noqa: BLE001 - status is best effort
            return {}

    def durability_stats(self) -> SyncStats:
        """What group commit cost so far (read from any thread: a few ints)."""
        journal = self.sync.rs_journal
        if journal is None:
            mode = "sync" if self.sync._rs_sync_journal else "none"
            return SyncStats(mode=mode, syncs=0, sync_seconds=0.0, max_sync_seconds=0.0,
                             synced_index=0)
        stats: SyncStats = journal.rs_stats()
        return stats

    def tick_alive(self) -> bool:
        return bool(self.sync.tick_thread_alive())

    def read(self, fn: Callable[[ClusterState], T]) -> T:
        """``fn(state)`` under the state lock: see :meth:`Replica.read`."""
        return self.replica.read(fn)

    def position(self) -> tuple[int, int]:
        """(index, term) of the log entry the state is at; call inside :meth:`read`."""
        return self.replica.position()

    @property
    def fatal(self) -> str | None:
        """Why this replica stopped applying (a format it cannot read), else None."""
        return self.replica.fatal

    @property
    def apply_seconds(self) -> float:
        """Seconds spent applying entries since start."""
        return self.replica.apply_seconds

    @property
    def apply_count(self) -> int:
        """Entries applied since start."""
        return self.replica.apply_count

    @property
    def lock_max_hold_s(self) -> float:
        """The longest hold of the state lock since start (seconds)."""
        return self.replica.lock_max_hold_s

    def observe_lock_holds(self, observer: Callable[[float], None]) -> None:
        """Call ``observer(seconds)`` after every hold of the state lock."""
        self.replica.observe_lock_holds(observer)
