"""The records held by the replicated state, and their msgpack-friendly forms.

These are mutable ``__slots__`` classes on purpose: they live only inside
:class:`raftsched.core.machine.ClusterState`, are changed by ``apply`` thousands of times a
second, and are never handed out — readers get ``to_dict()`` copies. Everything
public (specs, events, statistics) is a frozen dataclass.
"""

from __future__ import annotations

from collections.abc import Callable
from operator import attrgetter
from typing import Any

from raftsched.core.model import JobSpec, RunState
from raftsched.core.specclone import with_id

#: A run keeps its last few transitions; enough to tell its story, bounded.
MAX_TRANSITIONS = 16
#: The names of a transition's parts in ``RunRecord.to_dict()`` (the API shape); the
#: state and snapshots keep them as positional rows.
TRANSITION_KEYS = ("at_ms", "state", "node", "fence", "note")
#: The names of ``JobRecord.last``'s parts in ``JobRecord.to_dict()``.
LAST_KEYS = ("run_id", "state", "reason", "at_ms")


class JobRecord:
    """One job in the state.

    :var spec: the validated spec (``spec.paused`` is the paused flag).
    :var job_id: ``spec.id``, kept beside it: a record may make its spec only when it
        is first read (:class:`LazyJobRecord`).
    :var version: incremented by every accepted put/pause/resume.
    :var created_ms: when the job was first put.
    :var updated_ms: when it was last changed.
    :var hwm_ms: the high-water mark: every fire time ``<= hwm_ms`` is accounted for
        (assigned, or recorded missed/skipped/shed); an assign at or below it is refused.
    :var next_ms: the next fire time after ``hwm_ms`` (a hint kept by put and plan).
    :var active: ids of the job's active runs (pending, queued, assigned, started),
        oldest first: the shared empty tuple while there are none, a list otherwise.
        Change it only through :meth:`add_active` and :meth:`drop_active`.
    :var last: ``(run_id, state, reason, at_ms)`` of the latest terminal outcome, or None.
    """

    __slots__ = ("spec", "job_id", "version", "created_ms", "updated_ms", "hwm_ms",
                 "next_ms", "active", "last")

    def __init__(self, spec: JobSpec, *, version: int, created_ms: int, updated_ms: int,
                 hwm_ms: int, next_ms: int | None, active: list[str] | None = None,
                 last: tuple[str, str, str, int] | None = None) -> None:
        self.spec = spec
        self.job_id = spec.id
        self.version = version
        self.created_ms = created_ms
        self.updated_ms = updated_ms
        self.hwm_ms = hwm_ms
        self.next_ms = next_ms
        # Most jobs of a large table have no active run: an empty list per job would
        # cost 56 bytes each (56 MB for a million far-future jobs).
        self.active: list[str] | tuple[()] = list(active) if active else ()
        self.last = last

    @classmethod
    def restored(cls, spec: JobSpec, job_id: str, version: int, created_ms: int,
                 updated_ms: int, hwm_ms: int, next_ms: int | None, active: list[str] | None,
                 last: tuple[str, str, str, int] | None) -> JobRecord:
        """The record of a snapshot's row, as ``__init__`` makes it without parsing its
        keywords: a million of them took 0.47 s that way, 0.21 s this one. ``spec`` may
        be another job's, equal to this one's in every field but the id (the spec of its
        shared row, or the template a put copied): then the record is a
        :class:`LazyJobRecord`."""
        rec = object.__new__(cls if spec.id == job_id else LazyJobRecord)
        _SPEC_SLOT.__set__(rec, spec)  # not through a lazy record's property
        rec.job_id = job_id
        rec.version = version
        rec.created_ms = created_ms
        rec.updated_ms = updated_ms
        rec.hwm_ms = hwm_ms
        rec.next_ms = next_ms
        rec.active = list(active) if active else ()
        rec.last = last
        return rec

    def add_active(self, run_id: str) -> None:
        if self.active:
            self.active.append(run_id)
        else:
            self.active = [run_id]

    def drop_active(self, run_id: str) -> None:
        """Forget ``run_id`` if it is active (back to the shared ``()`` when none is)."""
        if run_id in self.active:
            self.active.remove(run_id)  # type: ignore[union-attr]
            if not self.active:
                self.active = ()

    def to_dict(self, *, redact: bool = True) -> dict[str, Any]:
        # A lazy record is shown from a copy it does not keep: a listing of a million
        # jobs must not make each one's spec for good.
        spec = self.spec if type(self) is JobRecord else with_id(stored_spec(self),
                                                                 self.job_id)
        return {
            "id": self.job_id,
            "spec": spec.redacted() if redact else spec.to_spec(),
            "version": self.version,
            "created_ms": self.created_ms,
            "updated_ms": self.updated_ms,
            "hwm_ms": self.hwm_ms,
            "next_ms": self.next_ms,
            "paused": spec.paused,
            # A one-shot whose fire time has its outcome: nothing more will ever run.
            "done": self.next_ms is None and not self.active and not spec.after,
            "active": list(self.active),
            "last": dict(zip(LAST_KEYS, self.last, strict=True)) if self.last else None,
        }


#: The ``spec`` slot as stored, read past :class:`LazyJobRecord`'s property.
_SPEC_SLOT = JobRecord.__dict__["spec"]
#: ``stored_spec(rec)``: a spec equal to the job's in every field but maybe the id,
#: without making a lazy record's own copy: for a pass over the whole table (the
#: derived indexes, a snapshot's rows), which needs no id from the spec.
stored_spec: Callable[[JobRecord], JobSpec] = _SPEC_SLOT.__get__


class LazyJobRecord(JobRecord):
    """A job whose ``spec`` slot holds another job's spec, equal but for the id (its
    snapshot row's, or the template its put copied), until the spec is first read:
    then it makes its own and becomes a plain :class:`JobRecord`, so that every later
    read costs a slot's.

    A restart reads every job of a million-job snapshot before it answers, and most of
    them (far-future jobs) are not read again for hours: a spec copied per job was
    ~1 s of the decode and ~170 bytes a job. A new job put as a copy of an earlier
    spec (a bulk put from a template) is held the same way.
    """

    __slots__ = ()

    # A reader (under the state's lock) may make the copy as the Raft thread's
    # ``prepare`` (outside it) does for the same record: both write equal specs, the
    # slot before the class, so either one's is a whole and equal spec. Nothing else
    # a reader does changes the state.
    @property
    def spec(self) -> JobSpec:
        own = with_id(stored_spec(self), self.job_id)
        self.spec = own
        return own

    @spec.setter
    def spec(self, spec: JobSpec) -> None:
        _SPEC_SLOT.__set__(self, spec)
        # The same layout (no slot of its own): a plain record from now on.
        object.__setattr__(self, "__class__", JobRecord)


class RunRecord:
    """One run (one fire time of one job), or a coalesced range of missed fire times.

    :var run_id: ``<job_id>@<scheduled_ms>``.
    :var job_id: the job.
    :var scheduled_ms: the fire time (for a range: the first missed fire time).
    :var attempt: 1 for the first execution, +1 per retry or node-lost retry.
    :var fence: the fencing token of the current assignment (0 before any).
    :var state: a :class:`RunState` value.
    :var node: the node it is assigned to (None when pending).
    :var reason: why it ended as it did (``exit 3``, ``no_leader``, ``overload`` ...).
    :var created_ms: when the run record was created.
    :var assigned_ms: when it was last assigned.
    :var started_ms: when its node committed its start (up to ``lookahead`` before the
        fire time; the API's ``executed_ms`` is when it began to run, see :meth:`view`).
    :var finished_ms: when it reached a terminal state.
    :var exit_code: the process exit code, if any.
    :var tail: the bounded tail of its stdout/stderr.
    :var not_before_ms: a retry waits until this instant.
    :var manual: started by ``trigger`` rather than the schedule.
    :var until_ms: for a range of missed fire times, the last one (else None).
    :var count: how many fire times this record stands for (1, or the range size).
    :var transitions: the last ``MAX_TRANSITIONS`` ``(at_ms, state, node, fence, note)``
        (written as arrays).
    """

    __slots__ = ("run_id", "job_id", "scheduled_ms", "attempt", "fence", "state", "node",
                 "reason", "created_ms", "assigned_ms", "started_ms", "finished_ms",
                 "exit_code", "tail", "not_before_ms", "manual", "until_ms", "count",
                 "transitions")

    _FIELDS = __slots__

    def __init__(self, *, run_id: str, job_id: str, scheduled_ms: int, created_ms: int,
                 state: str = RunState.pending.value, attempt: int = 1, fence: int = 0,
                 node: str | None = None, reason: str = "", assigned_ms: int | None = None,
                 started_ms: int | None = None, finished_ms: int | None = None,
                 exit_code: int | None = None, tail: str = "", not_before_ms: int = 0,
                 manual: bool = False, until_ms: int | None = None, count: int = 1,
                 transitions: tuple[Any, ...] | list[Any] | None = None) -> None:
        self.run_id = run_id
        self.job_id = job_id
        self.scheduled_ms = scheduled_ms
        self.attempt = attempt
        self.fence = fence
        self.state = state
        self.node = node
        self.reason = reason
        self.created_ms = created_ms
        self.assigned_ms = assigned_ms
        self.started_ms = started_ms
        self.finished_ms = finished_ms
        self.exit_code = exit_code
        self.tail = tail
        self.not_before_ms = not_before_ms
        self.manual = manual
        self.until_ms = until_ms
        self.count = count
        self.transitions = tuple(transitions) if transitions is not None else ()

    def note(self, at_ms: int, note: str = "") -> None:
        """Record the current state as a transition (bounded)."""
        # Tuples of atomic values: the cyclic GC stops tracking them after their first
        # collection, where lists stay tracked. Five lists per run were three quarters
        # of what a collection walked (250 ms for 67,000 runs, ``bench/lockwork``).
        self.transitions = (*self.transitions[1 - MAX_TRANSITIONS:],
                            (at_ms, self.state, self.node, self.fence, note))

    def copy(self) -> RunRecord:
        out = RunRecord.__new__(RunRecord)
        for name in self._FIELDS:
            setattr(out, name, getattr(self, name))
        out.transitions = tuple(tuple(t) for t in self.transitions)
        return out

    def to_dict(self) -> dict[str, Any]:
        d = {name: getattr(self, name) for name in self._FIELDS}
        d["transitions"] = [dict(zip(TRANSITION_KEYS, t, strict=True)) for t in self.transitions]
        return d

    def view(self) -> dict[str, Any]:
        """What the API shows: the record, and ``executed_ms``, when it began to run. A
        node commits a start up to ``lookahead`` before the fire time (``started_ms``)
        and spawns the run at the fire time, so a run never shows as begun before it
        was due; a late start (a retry, a catch-up) began at its commit."""
        d = self.to_dict()
        d["executed_ms"] = (None if self.started_ms is None
                            else max(self.started_ms, self.scheduled_ms))
        return d

    def to_row(self) -> tuple[Any, ...]:
        """The snapshot row: every field in ``_FIELDS`` order, the transitions as arrays.
        msgpack writes a tuple as it writes a list, so these are the bytes of the list
        this once built field by field: a snapshot writer encodes every kept run, and
        that Python loop was 60 % of its CPU where one C call is a fourteenth of it."""
        return _RUN_ROW(self)

    @classmethod
    def from_row(cls, row: list[Any]) -> RunRecord:
        out = cls.__new__(cls)
        for name, value in zip(cls._FIELDS, row, strict=True):
            setattr(out, name, value)
        return out


_RUN_ROW = attrgetter(*RunRecord._FIELDS)


class NodeRecord:
    """A node as the cluster knows it from its heartbeats.

    :var node_id: the node's id.
    :var boot_ms: when the node process started (changes on restart).
    :var last_hb_ms: the node's own clock in its last heartbeat.
    :var slots: worker slots.
    :var queue: how many runs may wait on it beyond its slots.
    :var tags: the node's tags.
    :var api: its API address.
    :var alive: false once the leader released it, true again on its next heartbeat.
    :var lost_ms: when it was last declared lost.
    :var skew_ms: its clock minus the leader's, as the leader last observed it.
    :var pid: the node's process id on its host, as it reported it (None from nodes, or
        snapshots, older than the field).
    :var draining: an operator drained it: no new runs are placed on it (its running
        ones finish) and it does not stay leader.
    :var features: the newer commands its release knows (``apply``, ``notify``), as its
        last heartbeat said; None from nodes (or snapshots) older than the field.
    :var dead: its incarnations (``boot_ms`` values) certified dead, newest last (at most
        :data:`DEAD_KEPT`): a heartbeat of one of them, still in flight when it died,
        is refused rather than bringing the node back to life.
    """

    __slots__ = ("node_id", "boot_ms", "last_hb_ms", "slots", "queue", "tags", "api",
                 "alive", "lost_ms", "skew_ms", "pid", "draining", "features", "dead")

    def __init__(self, *, node_id: str, boot_ms: int, last_hb_ms: int, slots: int, queue: int,
                 tags: tuple[str, ...], api: str, alive: bool = True,
                 lost_ms: int | None = None, skew_ms: int | None = None,
                 pid: int | None = None, draining: bool = False,
                 features: tuple[str, ...] | None = None, dead: tuple[int, ...] = ()) -> None:
        self.node_id = node_id
        self.boot_ms = boot_ms
        self.last_hb_ms = last_hb_ms
        self.slots = slots
        self.queue = queue
        self.tags = tags
        self.api = api
        self.alive = alive
        self.lost_ms = lost_ms
        self.skew_ms = skew_ms
        self.pid = pid
        self.draining = draining
        self.features = features
        self.dead = dead

    def to_row(self) -> list[Any]:
        row = [self.node_id, self.boot_ms, self.last_hb_ms, self.slots, self.queue,
               list(self.tags), self.api, self.alive, self.lost_ms, self.skew_ms, self.pid,
               self.draining]
        # Trailing fields only when set: a snapshot without them keeps its old bytes.
        if self.features is not None or self.dead:
            row.append(list(self.features) if self.features is not None else None)
        if self.dead:
            row.append(list(self.dead))
        return row

    @classmethod
    def from_row(cls, row: list[Any]) -> NodeRecord:
        # Rows of snapshots written before ``pid`` (10 fields), ``draining`` (11) or
        # ``features`` (12; a row without features still has 12).
        (node_id, boot, hb, slots, queue, tags, api, alive, lost, skew, *rest) = row
        return cls(node_id=node_id, boot_ms=boot, last_hb_ms=hb, slots=slots, queue=queue,
                   tags=tuple(tags), api=api, alive=alive, lost_ms=lost, skew_ms=skew,
                   pid=rest[0] if rest else None,
                   draining=bool(rest[1]) if len(rest) > 1 else False,
                   features=tuple(rest[2]) if len(rest) > 2 and rest[2] is not None
                   else None,
                   dead=tuple(rest[3]) if len(rest) > 3 else ())

    def to_dict(self) -> dict[str, Any]:
        d = dict(zip(self.__slots__[:12], self.to_row()[:12], strict=True))
        d["features"] = list(self.features) if self.features is not None else None
        return d


#: Certified-dead incarnations a node record remembers (each refuses its own late
#: heartbeats; an incarnation older than these has been dead for several restarts).
DEAD_KEPT = 4


# ---------------------------------------------------------------- members

#: A member's ``status``.
ACTIVE = "active"
REMOVED = "removed"


class MemberRecord:
    """One member of the cluster.

    :var node_id: the node's id.
    :var raft: its Raft ``host:port`` (pysyncobj's name for it).
    :var api: its API ``host:port``.
    :var status: ``active`` or ``removed``.
    :var since_ms: when it got that status (the proposer's clock).
    """

    __slots__ = ("node_id", "raft", "api", "status", "since_ms")

    def __init__(self, *, node_id: str, raft: str, api: str, status: str, since_ms: int) -> None:
        self.node_id = node_id
        self.raft = raft
        self.api = api
        self.status = status
        self.since_ms = since_ms

    def to_row(self) -> list[Any]:
        return [self.node_id, self.raft, self.api, self.status, self.since_ms]

    @classmethod
    def from_row(cls, row: list[Any]) -> MemberRecord:
        node_id, raft, api, status, since, *_ = row
        return cls(node_id=node_id, raft=raft, api=api, status=status, since_ms=since)

    def to_dict(self) -> dict[str, Any]:
        return dict(zip(self.__slots__, self.to_row(), strict=True))


# ---------------------------------------------------------------- leadership

class Leadership:
    """The replicated record of who leads: written by each new leader's first command
    (``leader``), read by every plan and release (which only that leader may propose)
    and by the miss detector (when leadership last did anything)."""

    __slots__ = ("node", "term", "since_ms", "changes", "last_ms", "prev_ms")

    def __init__(self, *, node: str | None = None, term: int = 0, since_ms: int = 0,
                 changes: int = 0, last_ms: int = 0, prev_ms: int = 0) -> None:
        self.node = node
        """The leader's node id; None before the first leader recorded itself."""
        self.term = term
        """Its Raft term."""
        self.since_ms = since_ms
        """When it recorded itself (its clock)."""
        self.changes = changes
        """Leadership changes recorded since the cluster began."""
        self.last_ms = last_ms
        """The ``at`` of its newest plan: the last time this leadership did anything."""
        self.prev_ms = prev_ms
        """The previous leadership's ``last_ms``: fire times after it fell due with no
        leader (the miss detector's reason)."""

    def to_row(self) -> dict[str, Any]:
        """Its snapshot map (keys sorted: the bytes snapshots always had)."""
        return {"changes": self.changes, "last_ms": self.last_ms, "node": self.node,
                "prev_ms": self.prev_ms, "since_ms": self.since_ms, "term": self.term}

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Leadership:
        return cls(**{k: row[k] for k in cls.__slots__ if k in row})

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Leadership) and self.to_row() == other.to_row()

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        return f"Leadership({self.to_row()})"


# ---------------------------------------------------------------- backfills

#: Fire times one backfill may hold (a longer range is several backfills).
MAX_FIRES = 1000
#: Backfills running at once, cluster-wide.
MAX_RUNNING = 8
#: ``max_active`` of one backfill at most.
MAX_ACTIVE = 8
#: Finished (done or cancelled) backfills kept for ``status``; older ones are dropped.
KEPT_FINISHED = 20
#: A backfill's ``overlap`` choices.
OVERLAPS = ("allow", "skip", "queue")
RUNNING, DONE, CANCELLED = "running", "done", "cancelled"


class BackfillRecord:
    """One backfill in the state (mutable, like the other records; readers get
    :meth:`view` copies).

    :var id: ``bf-<n>``, ``n`` counting backfills cluster-wide.
    :var job: the job.
    :var from_ms: the range asked for (inclusive).
    :var to_ms: its end (inclusive; not later than when it was asked).
    :var fires: the fire times of the job's schedule in the range, ascending.
    :var pos: how many of ``fires`` have been dealt with (run, or counted skipped).
    :var overlap: ``allow``, ``skip`` or ``queue`` (about the job's on-time runs).
    :var max_active: runs of this backfill active at once at most.
    :var rerun: run fire times already recorded again (as new attempts).
    :var status: ``running``, ``done`` or ``cancelled`` (``state`` in views).
    :var created_ms: when it was made.
    :var finished_ms: when it ended (None while running).
    :var reason: why it was cancelled ("" otherwise).
    :var active: ids of its runs still active.
    :var counts: outcome -> fire times (``created``, ``skipped`` recorded before,
        ``later`` left to the schedule, and each end state of its runs).
    """

    __slots__ = ("id", "job", "from_ms", "to_ms", "fires", "pos", "overlap", "max_active",
                 "rerun", "status", "created_ms", "finished_ms", "reason", "active", "counts")

    def __init__(self, *, id: str, job: str, from_ms: int, to_ms: int,  # noqa: A002
                 fires: tuple[int, ...], overlap: str, max_active: int, rerun: bool,
                 created_ms: int, pos: int = 0, status: str = RUNNING,
                 finished_ms: int | None = None, reason: str = "",
                 active: list[str] | None = None, counts: dict[str, int] | None = None
                 ) -> None:
        self.id = id
        self.job = job
        self.from_ms = from_ms
        self.to_ms = to_ms
        self.fires = fires
        self.pos = pos
        self.overlap = overlap
        self.max_active = max_active
        self.rerun = rerun
        self.status = status
        self.created_ms = created_ms
        self.finished_ms = finished_ms
        self.reason = reason
        self.active = list(active or ())
        self.counts = dict(counts or {})

    def to_row(self) -> list[Any]:
        return [self.id, self.job, self.from_ms, self.to_ms, list(self.fires), self.pos,
                self.overlap, self.max_active, self.rerun, self.status, self.created_ms,
                self.finished_ms, self.reason, list(self.active),
                dict(sorted(self.counts.items()))]

    @classmethod
    def from_row(cls, row: list[Any]) -> BackfillRecord:
        (id_, job, lo, hi, fires, pos, overlap, max_active, rerun, state, created, finished,
         reason, active, counts) = row
        return cls(id=id_, job=job, from_ms=lo, to_ms=hi, fires=tuple(fires), pos=pos,
                   overlap=overlap, max_active=max_active, rerun=rerun, status=state,
                   created_ms=created, finished_ms=finished, reason=reason, active=active,
                   counts=counts)

    def view(self) -> dict[str, Any]:
        """What ``status``, the API and the dashboard show."""
        return {"id": self.id, "job": self.job, "from_ms": self.from_ms, "to_ms": self.to_ms,
                "fire_times": len(self.fires), "done": self.pos - len(self.active),
                "next_ms": self.fires[self.pos] if self.pos < len(self.fires) else None,
                "overlap": self.overlap, "max": self.max_active, "rerun": self.rerun,
                "state": self.status, "created_ms": self.created_ms,
                "finished_ms": self.finished_ms, "reason": self.reason,
                "active": list(self.active), "counts": dict(sorted(self.counts.items()))}
