"""What the cluster agrees on: the replicated state as data, its derived indexes and its
reads — the bottom of the core's stack.

The command handlers above it (:mod:`~raftsched.core.runs`, :mod:`~raftsched.core.claims`,
:mod:`~raftsched.core.jobs`, :mod:`~raftsched.core.nodes`, ...) change it, and the
dispatcher on top (:mod:`~raftsched.core.machine`, whose ``ClusterState`` is this class
with ``apply``) routes each command to its handler. Nothing here imports a handler.

Claims: every assignment takes a new value of the cluster-wide ``fence`` counter;
``start`` and ``finish`` are accepted only with the run's current fence and from the
node it is assigned to. The per-job high-water mark makes a second assignment of the
same fire time impossible, whichever leader proposes it.

Each accepted change appends an *effect* record (:mod:`raftsched.core.effects`) to
``self.effects``; the node drains them after apply to wake its worker, write events
and count metrics. Effects are not state: they are never snapshotted.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict, deque
from collections.abc import Collection
from typing import Any

from raftsched.core.effects import Effect
from raftsched.core.errors import UnknownJob
from raftsched.core.notifydata import NotifyState
from raftsched.core.records import (
    BackfillRecord,
    JobRecord,
    Leadership,
    MemberRecord,
    NodeRecord,
    RunRecord,
    stored_spec,
)
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

class StateData:
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
        self.members: dict[str, MemberRecord] = {}
        self.applied = 0
        self.leader = Leadership()
        self.totals: dict[str, int] = {}
        self.dedupe: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.notify = NotifyState()
        #: Backfills by id, oldest first (core/backfill.py), and the last id's number.
        self.backfills: dict[str, BackfillRecord] = {}
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
        #: Job id -> the latest instant a record of it holds above its mark: a filter
        #: for the fire times such a record covers (core/heldids.py).
        self.held_ahead: dict[str, int] = {}
        self.effects: list[Effect] = []

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

    def set_next(self, rec: JobRecord, next_ms: int | None) -> None:
        """Set a job's next fire time (and index it for ``due_jobs``).

        The index keeps an entry per change and drops stale ones only as the leader's
        plans read past them: on a follower nobody does, so it is rebuilt from the jobs
        once it holds twice their number (amortised O(1) per change). Unbounded, a
        follower's index grew by one entry per fire time of every job (a leak), and the
        first ``next_due_ms`` after a storm cleaned 10^6 entries under the Raft lock."""
        rec.next_ms = next_ms
        if next_ms is not None:
            heapq.heappush(self.due, (next_ms, rec.job_id))
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

    def due_counts(self, until_ms: int, cap: int) -> dict[int, int]:
        """Fire time -> how many unpaused jobs are due then, for the fire times by
        ``until_ms``, leaving out the jobs held by plans in flight (parked); ``cap``
        jobs counted at most in all. Walks only the heap's entries due by then (and
        their children): O(cap), not O(jobs), with at most ``4 * cap`` entries looked
        at when stale ones or copies (a re-put with the same schedule) are many."""
        due, jobs, parked = self.due, self.jobs, self.due_parked
        out: dict[int, int] = {}
        seen: set[str] = set()
        looked = 0
        stack = [0] if due else []
        size = len(due)
        while stack and len(seen) < cap and looked < 4 * cap:
            i = stack.pop()
            looked += 1
            entry = due[i]
            when, job_id = entry
            if when > until_ms:
                continue  # nor is any entry below it
            rec = jobs.get(job_id)
            if (rec is not None and rec.next_ms == when and not rec.spec.paused
                    and job_id not in seen and parked.get(job_id) != entry):
                seen.add(job_id)
                out[when] = out.get(when, 0) + 1
            for child in (2 * i + 1, 2 * i + 2):
                if child < size:
                    stack.append(child)
        return out

    def active_on(self, node_id: str) -> list[RunRecord]:
        return self.table.active_on(node_id)

    def after_run_end(self, rec: JobRecord, run: RunRecord, at: int) -> None:
        """What a run's recorded outcome sets going in the same apply (its dependents'
        runs, its backfill's next): the dispatcher's class provides it, so that the run
        lifecycle below the handlers can call up into them. Data alone cannot apply."""
        raise NotImplementedError("apply commands through raftsched.core.machine.ClusterState")

    def take_effects(self) -> list[Effect]:
        out, self.effects = self.effects, []
        return out

    def rebuild_indexes(self) -> None:
        """Recompute the derived indexes after a restore: one pass over the jobs (a
        restart of a million jobs waits for it)."""
        table = self.table
        job_keys: dict[str, str] = {}
        key_max: dict[Any, dict[str, int]] = {}
        dependents: dict[str, set[str]] = {}
        self.held_ahead = {}
        history = self.history
        for job_id, rec in self.jobs.items():
            spec = stored_spec(rec)  # a restored record's own copy is not made here
            conc = spec.concurrency
            if conc is not None:
                job_keys[job_id] = conc.key
                key_max.setdefault(conc.key, {})[job_id] = conc.max
            for parent in spec.after:
                dependents.setdefault(parent, set()).add(job_id)
            # Only a job with a kept record can hold an instant ahead: a million
            # far-future jobs with none restored 0.8 s sooner without asking each.
            if rec.active or job_id in history:
                self.refresh_held(rec)
        table.job_keys, table.key_max = job_keys, key_max
        table.rebuild()
        self.rebuild_due()
        self.dependents = dependents
        self.bf_runs = {r: bf.id for bf in self.backfills.values() for r in bf.active}

    def held_above(self, rec: JobRecord) -> list[int]:
        """The instants above ``rec``'s mark that a kept record of it (live or history)
        was made for (see core/heldids.py)."""
        mark, runs = rec.hwm_ms, self.runs
        out = [runs[r].scheduled_ms for r in rec.active if runs[r].scheduled_ms > mark]
        out.extend(r.scheduled_ms for r in self.history.get(rec.job_id, ())
                   if r.scheduled_ms > mark)
        return out

    def refresh_held(self, rec: JobRecord) -> None:
        """``held_ahead`` for one job from its kept records (a restore, a lowered mark)."""
        top = max(self.held_above(rec), default=None)
        if top is None:
            self.held_ahead.pop(rec.job_id, None)
        else:
            self.held_ahead[rec.job_id] = top

    def rebuild_due(self) -> None:
        """The due index from the jobs alone (no stale entry)."""
        self.due = [(r.next_ms, r.job_id) for r in self.jobs.values() if r.next_ms is not None]
        heapq.heapify(self.due)
        self.due_parked = {}


__all__ = ["DEFAULT_HISTORY_LIMIT", "DEDUPE_ITEMS_LIMIT", "DEDUPE_LIMIT", "StateData"]
