"""Items of the batched commands (plan, start, finish): one small named tuple each.

A named tuple is a msgpack array on the wire, exactly the list the item always was,
and costs a fraction of a dataclass to build (a plan holds up to 20,000 items, decoded
under the state lock). An item a decoder cannot read (wrong shape or types) is kept as
:class:`Refused` or :class:`BadClaim` in its place: the state machine refuses that item
alone and applies the rest.
"""

from __future__ import annotations

import enum
from typing import Any, NamedTuple

from raftsched.core.model import RunState

#: Outcomes a worker may report in ``finish``.
FINISH_OUTCOMES = frozenset({RunState.succeeded, RunState.failed, RunState.timed_out,
                             RunState.shed, RunState.cancelled, RunState.lost, RunState.missed})
#: Outcomes a leader may record for a fire time that did not run.
MISS_OUTCOMES = frozenset({RunState.missed, RunState.skipped, RunState.shed})
#: Outcomes a leader may impose on an active run.
DROP_OUTCOMES = frozenset({RunState.shed, RunState.cancelled, RunState.missed})
#: A state by its wire string: a dict lookup, not an enum call, per decoded item.
_STATE = {s.value: s for s in RunState}


# ---------------------------------------------------------------- items

class RunFire(NamedTuple):
    """A plan's run for a fire time: ``["run", job, scheduled_ms, node, queued]``."""

    job: str
    """The job id."""
    scheduled_ms: int
    """The fire time (above the job's high-water mark, which rises to it)."""
    node: str | None
    """The node to assign it to at once, or None to leave it pending."""
    queued: bool
    """``overlap = queue``: buffered behind the job's active run."""

    def to_wire(self) -> list[Any]:
        return ["run", *self]


class MissFire(NamedTuple):
    """Fire times that will not run:
    ``["miss", job, first_ms, last_ms, count, outcome, reason]``."""

    job: str
    """The job id."""
    first_ms: int
    """The first fire time of the range (above the job's high-water mark)."""
    last_ms: int
    """The last one; the mark rises to it."""
    fire_count: int
    """How many fire times the range stands for (at least 1)."""
    outcome: RunState
    """One of :data:`MISS_OUTCOMES`."""
    reason: str
    """Why (a ``MissReason`` value)."""

    def to_wire(self) -> list[Any]:
        return ["miss", *self]


class Place(NamedTuple):
    """Assign a pending run to a node (a new fence): ``[run_id, node]``."""

    run_id: str
    """The pending run."""
    node: str
    """The node that takes it."""


class Drop(NamedTuple):
    """End an active run: ``[run_id, outcome, reason]``."""

    run_id: str
    """The active run."""
    outcome: RunState
    """One of :data:`DROP_OUTCOMES`."""
    reason: str
    """Why (recorded with the run)."""


class Next(NamedTuple):
    """The next fire time after the job's mark: ``[job, next_ms]``."""

    job: str
    """The job id."""
    next_ms: int | None
    """Its next fire time, or None when the schedule has no more."""


class StartItem(NamedTuple):
    """A node starts an assigned run: ``[run_id, fence]``."""

    run_id: str
    """The run."""
    fence: int
    """The fence the node was given with the assignment."""


class FinishItem(NamedTuple):
    """A node reports a run's outcome:
    ``[run_id, fence, outcome, exit_code, tail, reason]``."""

    run_id: str
    """The run."""
    fence: int
    """The fence it ran under."""
    outcome: RunState
    """One of :data:`FINISH_OUTCOMES` (a string on the wire)."""
    exit_code: int | None
    """The process exit code, if any."""
    tail: str
    """The tail of its output."""
    reason: str
    """Why it ended so (empty for a plain exit)."""


class ReleaseScope(enum.StrEnum):
    """Which of a node's claims a release frees."""

    assigned = "assigned"
    """Runs placed on it and not started: back to pending."""
    started = "started"
    """Runs it started: each follows its job's ``on_node_lost``."""
    all = "all"
    """Both."""


class ClaimResult(NamedTuple):
    """The answer to one start or finish item: ``[accepted, fence]`` on the wire."""

    accepted: bool
    """The item took effect."""
    fence: int | None
    """The run's fence now (a refused item's holder can tell it was superseded); None:
    no such run."""


class Refused(NamedTuple):
    """A plan item that could not be read; the plan refuses it alone."""

    entry: list[Any]
    """The refusal as the plan's reply lists it (``["run", job, scheduled_ms]`` ...)."""
    raw: Any
    """The item as it came."""

    def to_wire(self) -> Any:
        return self.raw


class BadClaim(NamedTuple):
    """A start or finish item that could not be read; refused alone."""

    run_id: Any
    """Its first value as it came (a run id if it is one)."""
    fence: Any
    """Its second value as it came."""
    raw: Any
    """The item as it came."""

    def to_wire(self) -> Any:
        return self.raw


Fire = RunFire | MissFire | Refused


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def parse_fire(item: list[Any]) -> Fire:
    kind, job = item[0], item[1]
    if kind == "miss" and len(item) == 7:
        _, _, first, last, count, outcome, reason = item
        if (not isinstance(job, str) or not _is_int(first) or not _is_int(last)
                or not _is_int(count) or first > last or count < 1
                or not isinstance(outcome, str) or outcome not in MISS_OUTCOMES
                or not isinstance(reason, str)):
            return Refused(["miss", job, first], item)
        return MissFire(job, first, last, count, _STATE[outcome], reason)
    if kind == "run" and len(item) == 5:
        _, _, sched, node, queued = item
        if (not isinstance(job, str) or not _is_int(sched)
                or (node is not None and not isinstance(node, str))
                or not isinstance(queued, bool)):
            return Refused(["run", job, sched], item)
        return RunFire(job, sched, node, queued)
    return Refused(["fire", job], item)


def parse_place(item: list[Any]) -> Place | Refused:
    run_id, node = item
    if not isinstance(run_id, str) or not isinstance(node, str):
        return Refused(["place", run_id], item)
    return Place(run_id, node)


def parse_drop(item: list[Any]) -> Drop | Refused:
    run_id, outcome, reason = item
    if (not isinstance(run_id, str) or not isinstance(outcome, str)
            or outcome not in DROP_OUTCOMES or not isinstance(reason, str)):
        return Refused(["drop", run_id], item)
    return Drop(run_id, _STATE[outcome], reason)


def parse_next(item: list[Any]) -> Next | Refused:
    job, next_ms = item
    if not isinstance(job, str) or not (next_ms is None or _is_int(next_ms)):
        return Refused(["next", job], item)
    return Next(job, next_ms)


def parse_start(item: list[Any]) -> StartItem | BadClaim:
    run_id, fence = item
    if not isinstance(run_id, str) or not _is_int(fence):
        return BadClaim(run_id, fence, item)
    return StartItem(run_id, fence)


def parse_finish(item: list[Any]) -> FinishItem | BadClaim:
    run_id, fence, outcome, exit_code, tail, reason = item
    if (not isinstance(run_id, str) or not _is_int(fence) or not isinstance(outcome, str)
            or outcome not in FINISH_OUTCOMES
            or not (exit_code is None or _is_int(exit_code))
            or not isinstance(tail, str) or not isinstance(reason, str)):
        return BadClaim(run_id, fence, item)
    return FinishItem(run_id, fence, _STATE[outcome], exit_code, tail, reason)
