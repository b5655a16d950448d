"""Effects: what an applied command tells the node it applied on.

``ClusterState.apply`` appends one record per fact to ``ClusterState.effects``; the node
drains them after each apply (in the Raft thread, handed to its event loop) to wake its
worker and leader loop, write events and count metrics. Effects are not state: they
are never snapshotted or replicated, so their shape may change freely between releases.

Each kind is a small named tuple (a plan of 5,000 runs emits 10,000 of them under the
state lock: a named tuple costs a fraction of a dataclass to build). Consumers match
on the class; ``tests/unit/test_effects.py`` checks every kind has one.
"""

from __future__ import annotations

from typing import Any, NamedTuple


class JobPut(NamedTuple):
    """A job was created or replaced."""

    job_id: str
    """The job."""
    version: int
    """Its new version."""
    created: bool
    """True if it did not exist before."""


class JobRemoved(NamedTuple):
    """A job was deleted."""

    job_id: str
    """The job."""


class JobPaused(NamedTuple):
    """A job was paused."""

    job_id: str
    """The job."""


class JobResumed(NamedTuple):
    """A job was resumed."""

    job_id: str
    """The job."""
    catch_up: bool
    """Its missed fire times will run."""


class NodeJoined(NamedTuple):
    """A node heartbeated for the first time."""

    node_id: str
    """The node."""


class NodeBack(NamedTuple):
    """A node declared lost heartbeated again."""

    node_id: str
    """The node."""


class HeartbeatSeen(NamedTuple):
    """A node's heartbeat was applied."""

    node_id: str
    """The node."""
    at_ms: int
    """Its clock when it sent it."""


class LeaderChanged(NamedTuple):
    """A new leadership record (another node or another term)."""

    node_id: str
    """The leader."""
    term: int
    """Its term."""


class NodeDraining(NamedTuple):
    """An operator drained or undrained a node."""

    node_id: str
    """The node."""
    draining: bool
    """Drained (True) or undrained."""


class TransferAsked(NamedTuple):
    """An operator asked the leader to hand leadership over."""

    to: str | None
    """The node to hand it to, or None for any."""
    term: int
    """The term of the leader asked."""


class RunCreated(NamedTuple):
    """A run was created (by a plan or a trigger)."""

    run_id: str
    """The run."""


class RunAssigned(NamedTuple):
    """A run was assigned to a node with a new fence."""

    run_id: str
    """The run."""
    node: str
    """The node that holds the claim."""
    fence: int
    """The claim's fence."""


class RunStarted(NamedTuple):
    """A node's start of a run was accepted."""

    run_id: str
    """The run."""
    node: str
    """The node running it."""
    fence: int
    """Its fence."""


class StopRun(NamedTuple):
    """A started run was cancelled: its node must stop the process."""

    run_id: str
    """The run."""
    node: str
    """The node running it."""
    fence: int
    """The cancelled attempt's fence: a newer attempt of the same run id (a one-shot
    job removed and put again) is not this one."""


class RunEnded(NamedTuple):
    """A run (or one attempt of it, when it is retried) ended."""

    run_id: str
    """The run."""
    state: str
    """Its terminal state (a ``RunState`` value)."""
    node: str | None
    """The node it was on, if any."""
    reason: str
    """Why."""


class RangeMissed(NamedTuple):
    """Fire times that did not run were recorded (one range record)."""

    run_id: str
    """The id of the range's record."""
    state: str
    """missed, skipped or shed."""
    reason: str
    """Why (a ``MissReason`` value)."""
    first_ms: int
    """The range's first fire time."""
    last_ms: int
    """Its last one."""
    fire_count: int
    """How many fire times this record adds."""


class ClaimRefused(NamedTuple):
    """A node's start or finish was refused (stale fence, wrong node, wrong state)."""

    op: str
    """``start`` or ``finish``."""
    run_id: Any
    """The run id as the node sent it."""
    node: str
    """The node that sent it."""
    fence: Any
    """The fence it sent."""
    current: int | None
    """The run's current fence (None if the run is not active)."""


class PlanRejected(NamedTuple):
    """Items of a plan were refused (a plan from a stale copy, usually harmless)."""

    items: list[list[Any]]
    """The refusals (at most 50), as the plan's reply lists them."""


class ClaimsReleased(NamedTuple):
    """The leader released a node's claims."""

    node: str
    """The node."""
    runs: list[str]
    """The released runs."""
    reason: str
    """Why."""


class NodeCertified(NamedTuple):
    """A death certificate was applied: an incarnation of a node is dead."""

    node: str
    """The node."""
    boot: int
    """The dead incarnation."""
    by: str
    """Who proved it (``guard`` or ``restart``)."""
    released: int
    """How many of its runs were released."""


class NodeLost(NamedTuple):
    """The leader declared a node lost."""

    node: str
    """The node."""
    reason: str
    """Why."""


class NotifyPending(NamedTuple):
    """A failure notification was queued for delivery."""

    key: str
    """The delivery's key."""


class NotifyDone(NamedTuple):
    """A notification was delivered, or given up on."""

    key: str
    """The delivery's key."""
    state: str
    """``delivered`` or ``failed``."""
    attempts: int
    """Delivery attempts made."""


class MembersChanged(NamedTuple):
    """The cluster's membership changed (a node added or removed)."""


class MemberRemoved(NamedTuple):
    """A node was removed from the cluster."""

    node_id: str
    """The node."""


class FireCovered(NamedTuple):
    """A fire time was accounted for by the kept record that already holds its run id
    (core/heldids.py): no second record, no run."""

    run_id: str
    """The id, and the record that holds it."""


class Restored(NamedTuple):
    """This replica's state was replaced by a snapshot."""


#: Every effect kind (consumers must handle each: tests/unit/test_effects.py).
EFFECTS: tuple[type[tuple[Any, ...]], ...] = (
    JobPut, JobRemoved, JobPaused, JobResumed, NodeJoined, NodeBack, HeartbeatSeen,
    LeaderChanged, NodeDraining, TransferAsked, RunCreated, RunAssigned, RunStarted, StopRun,
    RunEnded, RangeMissed, FireCovered, ClaimRefused, PlanRejected, ClaimsReleased, NodeLost,
    NodeCertified, NotifyPending, NotifyDone, MembersChanged, MemberRemoved, Restored)

Effect = (JobPut | JobRemoved | JobPaused | JobResumed | NodeJoined | NodeBack | HeartbeatSeen
          | LeaderChanged | NodeDraining | TransferAsked | RunCreated | RunAssigned | RunStarted
          | StopRun | RunEnded | RangeMissed | FireCovered | ClaimRefused | PlanRejected
          | ClaimsReleased | NodeLost | NodeCertified | NotifyPending | NotifyDone | MembersChanged
          | MemberRemoved | Restored)

__all__ = [cls.__name__ for cls in EFFECTS] + ["EFFECTS", "Effect"]
