"""The spawn gate: may a run whose start was committed begin its process here now?

The start was committed up to the pre-start window ago (longer for a big instant, and a
run may then wait for a slot); a node paused since (SIGSTOP, a frozen VM) may meanwhile
have been declared lost and the run handed to another node with a new fence. A fresh
lease — a heartbeat the cluster acknowledged within ``lease_s``, sent after the pause —
proves this replica has applied everything committed before it, so the run's record
here is current; and the leader releases a node's started runs only after the lease of
its newest committed heartbeat has ended (``lease_s``, then this node's self-fence and
its guard: :mod:`raftsched.core.lease`), so a run released meanwhile was never spawned
here, or is dead.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from raftsched.node.observe.clock import Clock

if TYPE_CHECKING:
    from raftsched.core.machine import ClusterState
    from raftsched.node.replica.port import ReplicaPort
    from raftsched.node.worker.localrun import LocalRun


class SpawnGate:
    """See the module docstring. ``lease()`` is the send time (monotonic) of this
    node's newest acknowledged heartbeat (None: no lease, as in unit tests)."""

    def __init__(self, *, node_id: str, raft: ReplicaPort, clock: Clock,
                 lease: Callable[[], float] | None, lease_s: float) -> None:
        self.node_id = node_id
        self.raft = raft
        self.clock = clock
        self.lease = lease
        self.lease_s = lease_s

    def fresh(self) -> bool:
        """Is this node's lease fresh (or is there no lease)?"""
        return self.lease is None or self.clock.monotonic() - self.lease() <= self.lease_s

    def held(self, group: Iterable[LocalRun]) -> frozenset[str] | None:
        """The run ids of ``group`` still started on this node under their fences, in
        one read of the state (a whole instant, not one read per run); None without a
        fresh lease: not yet."""
        if not self.fresh():
            return None
        group = list(group)
        if not group:
            return frozenset()
        return self.raft.read(functools.partial(_all_held, group, self.node_id))

    def may(self, loc: LocalRun) -> bool | None:
        """May ``loc``'s process start now? True: yes. None: not yet (no fresh lease).
        False: never (the cluster moved the run on while this node was away)."""
        if not self.fresh():
            return None
        return self.started_here(loc)

    def started_here(self, loc: LocalRun) -> bool:
        """Is ``loc``'s run started on this node under its fence (one read)? Also how a
        retried start whose first try did commit knows it holds the run."""
        return self.raft.read(functools.partial(_holds_started, loc, self.node_id))


def _all_held(group: list[LocalRun], node_id: str, st: ClusterState) -> frozenset[str]:
    """The run ids of ``group`` started on ``node_id`` under their fences."""
    return frozenset(loc.run_id for loc in group if _holds_started(loc, node_id, st))


def _holds_started(loc: LocalRun, node_id: str, st: ClusterState) -> bool:
    """Is ``loc``'s run started on ``node_id`` under its fence (the claim still ours)?"""
    run = st.runs.get(loc.run_id)
    return (run is not None and run.state == "started" and run.node == node_id
            and run.fence == loc.fence)


__all__ = ["SpawnGate"]
