"""The replicated state machine: what the cluster agrees on, and the one dispatcher
that applies a command to it.

The command handlers live with their subject (:mod:`~raftsched.core.jobs`,
:mod:`~raftsched.core.nodes`, :mod:`~raftsched.core.claims`,
:mod:`~raftsched.core.members`, :mod:`~raftsched.core.notify`,
:mod:`~raftsched.core.apply`); this module holds the state, the checks every command
passes first (time, proposer term, request-id dedupe) and the reads.

Pure and deterministic: :meth:`ClusterState.apply` takes one command dict (already
decoded from msgpack) and returns a reply dict; it reads no clock, does no I/O and
never raises — a command that cannot be applied is rejected and changes nothing.
Times come inside the command (epoch ms stamped by the sender).

Claims: every assignment takes a new value of the cluster-wide ``fence`` counter;
``start`` and ``finish`` are accepted only with the run's current fence and from the
node it is assigned to. The per-job high-water mark makes a second assignment of the
same fire time impossible, whichever leader proposes it.

Each accepted change appends an *effect* record (:mod:`raftsched.core.effects`) to
``self.effects``; the node drains
them after apply to wake its worker, write events and count metrics. Effects are
not state: they are never snapshotted.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict, deque
from collections.abc import Callable, Collection
from typing import Any

from raftsched.core import apply as declarative
from raftsched.core import backfill, claims, deps, jobs, members, nodes, notify
from raftsched.core.cmdbase import DEPS_VERSION, REFUSAL_REMEMBERED_VERSION
from raftsched.core.commands import (
    MAX_AT_MS,
    MAX_PUT_BATCH,
    ApplyJobs,
    Command,
    command_class,
)
from raftsched.core.effects import Effect
from raftsched.core.errors import (
    Conflict,
    InvalidArgument,
    InvalidSpec,
    RaftschedError,
    UnknownJob,
)
from raftsched.core.records import JobRecord, NodeRecord, RunRecord
from raftsched.core.runtable import RunTable

#: Replies to client commands are kept this long (by count) so a retried request id
#: gets the original answer instead of being applied twice.
DEDUPE_LIMIT = 8192
#: ... and at most this many reply items in all (bulk puts have one per spec).
DEDUPE_ITEMS_LIMIT = 50_000
#: Terminal runs kept per job; older ones are dropped (the history is bounded).
DEFAULT_HISTORY_LIMIT = 100


#: Stale entries the due index may hold beyond twice the jobs before it is rebuilt.
DUE_SLACK = 1024

class ClusterState:
    """Everything the cluster agrees on. See the module docstring."""

    def __init__(self, *, history_limit: int = DEFAULT_HISTORY_LIMIT) -> None:
        self.history_limit = history_limit
        self.jobs: dict[str, JobRecord] = {}
        #: The active runs, their indexes and the fence (changed only through its methods).
        self.table = RunTable()
        self.history: dict[str, deque[RunRecord]] = {}
        self.nodes: dict[str, NodeRecord] = {}
        #: The replicated membership (core/members.py); empty until the first leader
        #: seeds it from the config file.
        self.members: dict[str, members.MemberRecord] = {}
        self.applied = 0
        self.leader: dict[str, Any] = {"node": None, "term": 0, "since_ms": 0, "changes": 0,
                                       "last_ms": 0, "prev_ms": 0}
        self.totals: dict[str, int] = {}
        self.dedupe: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.notify = notify.NotifyState()
        #: Backfills by id, oldest first (core/backfill.py), and the last id's number.
        self.backfills: dict[str, backfill.BackfillRecord] = {}
        self.backfill_seq = 0
        # Derived indexes (rebuilt on restore, never snapshotted).
        self.due: list[tuple[int, str]] = []
        #: Job id -> its valid ``due`` entry, taken out of the heap while the leader's
        #: plans in flight hold the job (``due_jobs``'s ``skip``).
        self.due_parked: dict[str, tuple[int, str]] = {}
        #: Parent job id -> the ids of the jobs that run after it (core/deps.py).
        self.dependents: dict[str, set[str]] = {}
        #: Run id -> the backfill it belongs to, for its active runs.
        self.bf_runs: dict[str, str] = {}
        self.effects: list[Effect] = []
        #: (commands applied, the command, its prepared work): see ``prepare``.
        self._prepared: tuple[int, Command, Any] | None = None

    # The run table's parts, for readers (views, the planner, snapshots, tests).

    @property
    def runs(self) -> dict[str, RunRecord]:
        """Active runs by id (read; changed through ``self.table``)."""
        return self.table.runs

    @property
    def pending(self) -> dict[str, None]:
        """Ids of the pending runs (read only)."""
        return self.table.pending

    @property
    def by_node(self) -> dict[str, set[str]]:
        """Node id -> ids of the runs holding a claim on it (read only)."""
        return self.table.by_node

    @property
    def fence(self) -> int:
        """The last fence handed out."""
        return self.table.fence

    @fence.setter
    def fence(self, value: int) -> None:  # a snapshot restore only
        self.table.fence = value

    # ------------------------------------------------------------------ apply

    def apply(self, cmd: Any, entry_term: int | None = None, *,
              parsed: Command | RaftschedError | None = None) -> dict[str, Any]:
        """Apply one command (a :class:`~raftsched.core.commands.Command` or its decoded
        map); never raises. Returns ``{"ok": True, ...}`` or
        ``{"ok": False, "error": {code, message}}``.

        ``entry_term`` is the Raft term of the log entry holding the command (the same
        on every replica). A leader-only command is applied only if it was proposed in
        that very term: a log entry of term T is appended by T's leader alone, so a
        command a deposed leader proposed (and pysyncobj forwarded to the new leader,
        which appended it in its own term) is refused.

        ``parsed`` is ``commands.from_wire(cmd)`` (or the error it raised) computed by a
        caller outside the state lock: a plan of 20,000 items takes ~40 ms to read."""
        self.applied += 1
        try:
            if isinstance(cmd, Command):
                cmd, parsed = dict(cmd.to_wire(), v=cmd.v), cmd
            cls = command_class(cmd)
            op, handler = cls.OP, _HANDLERS[cls.OP]
            at = cmd.get("at")
            if isinstance(at, bool) or not isinstance(at, int) or not 0 <= at < MAX_AT_MS:
                raise InvalidArgument("at", "must be epoch milliseconds before year 10000")
            if op in LEADER_ONLY:
                _check_proposer(cmd, op, entry_term)
            rid = cmd.get("rid")
            if rid is not None:
                if not isinstance(rid, str) or len(rid) > 64:
                    raise InvalidArgument("rid", "must be a short string")
                seen = self.dedupe.get(rid)
                if seen is not None:
                    self._prepared = None
                    return dict(seen, duplicate=True)
            if parsed is None:
                parsed = cls.from_wire(cmd)
            elif isinstance(parsed, RaftschedError):
                raise parsed
            try:
                reply = handler(self, parsed)
            except RaftschedError as exc:
                reply = {"ok": False, "error": exc.to_wire()}
                if rid is not None and parsed.v >= REFUSAL_REMEMBERED_VERSION:
                    # A copy of this request still in flight (a node's retry, a forward
                    # over a slow link) may commit after the client heard this refusal
                    # and went on: it must get the same answer, not be applied against
                    # a state the client has changed since (a late ``delete`` of a job
                    # absent then would delete the job put since).
                    self._remember(rid, reply)
                return reply
            if rid is not None:
                self._remember(rid, reply)
            return reply
        except RaftschedError as exc:
            return {"ok": False, "error": exc.to_wire()}
        except Exception as exc:  # noqa: BLE001 - apply must never raise (pysyncobj wedges)
            return {"ok": False, "error": {"code": "internal",
                                           "message": f"{type(exc).__name__}: {exc}"[:300]}}

    def prepare(self, cmd: Command | RaftschedError | None) -> None:
        """Do the pure part of ``cmd``'s apply now, before the state lock is taken: the
        replica calls this on the thread that then applies ``cmd``. Only applies change
        the jobs, and that thread alone applies, so the jobs read here are the ones the
        apply sees (the apply checks that no command came between). Other threads change
        only the derived ``due`` index (the leader's planner, under the lock): nothing
        prepared here may read it. Today: a ``raftsched apply``'s diff of up to 1,000
        jobs (~70 ms of CPU), or the refusal it gets. Never raises."""
        self._prepared = None
        if isinstance(cmd, ApplyJobs):
            try:
                work: Any = declarative.prepare_apply(self, cmd)
            except RaftschedError as exc:  # the apply raises it: no second try under the lock
                work = exc
            except Exception:  # noqa: BLE001 - the apply does the work and answers for it
                return
            self._prepared = (self.applied, cmd, work)

    def take_prepared(self, cmd: Command) -> Any:
        """What ``prepare`` made for ``cmd``, if ``cmd`` is the command being applied and
        nothing was applied in between; else None."""
        found, self._prepared = self._prepared, None
        if found is not None and found[1] is cmd and found[0] == self.applied - 1:
            return found[2]
        return None

    def _remember(self, rid: str, reply: dict[str, Any]) -> None:
        self.dedupe[rid] = reply
        # Bounded by replies and by their items (a put_jobs reply holds one per spec).
        weight = sum(1 + len(r.get("results", ())) for r in self.dedupe.values()) \
            if len(reply.get("results", ())) else None
        while len(self.dedupe) > DEDUPE_LIMIT or (weight is not None
                                                  and weight > DEDUPE_ITEMS_LIMIT):
            _, old = self.dedupe.popitem(last=False)
            if weight is not None:
                weight -= 1 + len(old.get("results", ()))

    def set_next(self, rec: JobRecord, next_ms: int | None) -> None:
        """Set a job's next fire time (and index it for ``due_jobs``).

        The index keeps an entry per change and drops stale ones only as the leader's
        plans read past them: on a follower nobody does, so it is rebuilt from the jobs
        once it holds twice their number (amortised O(1) per change). Unbounded, a
        follower's index grew by one entry per fire time of every job (a leak), and the
        first ``next_due_ms`` after a storm cleaned 10^6 entries under the Raft lock."""
        rec.next_ms = next_ms
        if next_ms is not None:
            heapq.heappush(self.due, (next_ms, rec.spec.id))
            if len(self.due) > 2 * len(self.jobs) + DUE_SLACK:
                self.rebuild_due()

    # ------------------------------------------------------------------ reads

    def job_view(self, job_id: str) -> dict[str, Any]:
        rec = self.jobs.get(job_id)
        if rec is None:
            raise UnknownJob(job_id)
        return rec.to_dict()

    def run_views(self, job_id: str, limit: int, before_ms: int | None = None
                  ) -> list[dict[str, Any]]:
        """Newest first: the job's active runs, then its history; with ``before_ms``
        only runs scheduled before it (the next page after a page's last run)."""
        return [r.view() for r in self.run_records(job_id, limit, before_ms)]

    def run_records(self, job_id: str, limit: int, before_ms: int | None = None
                    ) -> list[RunRecord]:
        """The records :meth:`run_views` shows (live objects: view them under the lock)."""
        rec = self.jobs.get(job_id)
        if rec is None:
            raise UnknownJob(job_id)
        runs = [self.runs[r] for r in reversed(rec.active)]
        runs.extend(reversed(self.history.get(job_id, ())))
        if before_ms is not None:
            runs = [r for r in runs if r.scheduled_ms < before_ms]
        return runs[:limit]

    def due_jobs(self, until_ms: int, limit: int,
                 skip: Collection[str] = ()) -> list[JobRecord]:
        """Jobs whose next fire time is ``<= until_ms`` (at most ``limit``), oldest first,
        leaving out the jobs in ``skip`` (the leader's, planned but not yet committed).
        Drops index entries made stale by later changes; keeps the valid ones.

        The entries of the jobs returned and of the jobs skipped are parked beside the
        heap, not pushed back: the leader's plans in flight hold the oldest due jobs, so
        re-pushing them made every plan pop and push all of them again (O(in flight
        log n) per plan, 7 % of a leader's CPU in a storm). A parked entry goes back at
        the first call whose ``skip`` no longer names its job (its plan committed, which
        made the entry stale, or was given up, or never took the job). Costs
        O((limit + stale entries) log n + parked)."""
        out: list[JobRecord] = []
        due = self.due
        parked = self.due_parked
        if parked:
            for job_id in [j for j in parked if j not in skip]:
                heapq.heappush(due, parked.pop(job_id))
        jobs = self.jobs
        while due and due[0][0] <= until_ms and len(out) < limit:
            entry = heapq.heappop(due)
            job_id = entry[1]
            rec = jobs.get(job_id)
            if rec is None or rec.next_ms != entry[0] or rec.spec.paused:
                continue
            if parked.get(job_id) == entry:
                continue  # a copy of an entry parked already (one fire time, one read)
            parked[job_id] = entry  # replaces a stale one: its job's fire time moved
            if job_id not in skip:
                out.append(rec)
        return out

    def next_due_ms(self) -> int | None:
        """The earliest next fire time of any unpaused job (cleaning stale entries)."""
        due = self.due
        first = None
        while due:
            when, job_id = due[0]
            rec = self.jobs.get(job_id)
            if rec is not None and rec.next_ms == when and not rec.spec.paused:
                first = when
                break
            heapq.heappop(due)
        for when, job_id in self.due_parked.values():
            rec = self.jobs.get(job_id)
            if (rec is not None and rec.next_ms == when and not rec.spec.paused
                    and (first is None or when < first)):
                first = when
        return first

    def active_on(self, node_id: str) -> list[RunRecord]:
        return self.table.active_on(node_id)

    def take_effects(self) -> list[Effect]:
        out, self.effects = self.effects, []
        return out

    def rebuild_indexes(self) -> None:
        """Recompute the derived indexes after a restore."""
        table = self.table
        table.job_keys, table.key_max = {}, {}
        for job_id, rec in self.jobs.items():
            conc = rec.spec.concurrency
            if conc is not None:
                table.job_keys[job_id] = conc.key
                table.key_max.setdefault(conc.key, {})[job_id] = conc.max
        table.rebuild()
        self.rebuild_due()
        deps.rebuild(self)
        backfill.rebuild(self)

    def rebuild_due(self) -> None:
        """The due index from the jobs alone (no stale entry)."""
        self.due = [(r.next_ms, r.spec.id) for r in self.jobs.values() if r.next_ms is not None]
        heapq.heapify(self.due)
        self.due_parked = {}


#: Commands only the leader proposes; each carries the proposer's ``term``.
LEADER_ONLY = frozenset({"leader", "plan", "release", "notify_default"})


def _check_proposer(cmd: dict[str, Any], op: str, entry_term: int | None) -> None:
    """A leader-only command must come from the leader of the log entry's term.

    Commands written before version 2 (``v`` 1) predate the check and keep their
    meaning when a journal is replayed."""
    term = cmd.get("term")
    if cmd.get("v") == 1 and term is None:
        return
    if isinstance(term, bool) or not isinstance(term, int) or term < 0:
        raise InvalidArgument("term", "a leader-only command must carry its proposer's term")
    if entry_term is not None and term != entry_term:
        raise Conflict("term", f"{op} proposed in term {term} but appended in term "
                               f"{entry_term}: the proposer no longer leads")


_HANDLERS: dict[str, Callable[[ClusterState, Any], dict[str, Any]]] = {
    "put_job": jobs.apply_put_job,
    "put_jobs": jobs.apply_put_jobs,
    "delete_job": jobs.apply_delete_job,
    "pause": jobs.apply_pause,
    "resume": jobs.apply_resume,
    "trigger": jobs.apply_trigger,
    "heartbeat": nodes.apply_heartbeat,
    "leader": nodes.apply_leader,
    "read": nodes.apply_read,
    "drain": nodes.apply_drain,
    "transfer": nodes.apply_transfer,
    "certify": nodes.apply_certify,
    "apply": declarative.apply_apply,
    "notified": notify.apply_notified,
    "notify_default": notify.apply_default,
    "member": members.apply_member,
    "plan": claims.apply_plan,
    "start": claims.apply_start,
    "finish": claims.apply_finish,
    "release": claims.apply_release,
    "backfill": lambda st, cmd: backfill.apply_backfill(st, _v5(cmd)),
    "backfill_cancel": lambda st, cmd: backfill.apply_cancel(st, _v5(cmd)),
}


def _v5(cmd: Any) -> Any:
    """A backfill command written below version 5 is refused as the release before them
    refused an unknown op (none was ever written: this keeps replay exact regardless)."""
    if cmd.v < DEPS_VERSION:
        raise InvalidArgument("op", f"unknown operation {cmd.OP!r:.40}")
    return cmd

__all__ = ["MAX_AT_MS", "MAX_PUT_BATCH", "ClusterState", "InvalidSpec"]
