"""What a plan reads, copied from the state at one moment under the state lock: the
pending runs and the due jobs (bounded per plan), so that :func:`~raftsched.core.leader.
plan_from` needs no lock (see :mod:`raftsched.core.leader`).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from raftsched.core import heldids, members
from raftsched.core.cmdbase import RUN_IDS_FEATURE

if TYPE_CHECKING:
    from raftsched.core.model import JobSpec
    from raftsched.core.state import StateData

#: Due jobs read (under the lock) and examined per plan; the rest wait for the next plan,
#: which the leader makes at once. Reading one costs ~4 us, applying its run ~12 us
#: unloaded, 10x that on a 2-core host at load 20 (a plan of 128 runs then held the
#: lock 14-22 ms).
MAX_JOBS_PER_PLAN = 64
#: Runs created or placed per plan (and pending runs read for it).
MAX_RUNS_PER_PLAN = 64
#: Pending runs of backfills read per plan, besides the others.
MAX_BACKFILL_READ = 16


@dataclass(frozen=True, slots=True, kw_only=True)
class PendingRun:
    """A run waiting for a node, as copied for a plan.

    :var run_id: the run.
    :var scheduled_ms: its fire time.
    :var not_before_ms: not to start before this (a retry's backoff).
    :var tags: its job's tags.
    :var grace_ms: its job's misfire grace.
    :var attempt: its attempt (above 1: a retry, due at ``not_before_ms``).
    :var key: its job's concurrency key, if any.
    :var backfill: a backfill's run (placed after on-time runs, on idle slots only,
        never shed: it waits for room).
    """

    run_id: str
    scheduled_ms: int
    not_before_ms: int
    tags: tuple[str, ...]
    grace_ms: int
    attempt: int = 1
    key: str | None = None
    backfill: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class DueJob:
    """A job with a fire time due, as copied for a plan.

    :var spec: its spec (immutable; a put replaces it).
    :var hwm_ms: its high-water mark.
    :var next_ms: its next fire time as the state indexed it.
    :var version: its version (the plan is refused for a job changed since).
    :var active: ``(run_id, state)`` of its active runs.
    :var held: fire times above the mark whose run id a kept record holds: the plan
        covers them (see :mod:`~raftsched.core.heldids`); empty until every member
        applies such a plan.
    """

    spec: JobSpec
    hwm_ms: int
    next_ms: int | None
    version: int
    active: tuple[tuple[str, str], ...]
    held: frozenset[int] = heldids.NONE


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanInput:
    """Everything :func:`plan_from` reads, copied from the state at one moment.

    :var pending: runs waiting for a node, due by the horizon (at most
        ``MAX_RUNS_PER_PLAN``).
    :var due: jobs due by the horizon, oldest first (at most ``MAX_JOBS_PER_PLAN``).
    :var last_leader_ms: when the previous leader was last heard of (miss reasons).
    :var member_tags: every member's tags (None: some member's are not known yet), so
        that a job no member could run is recorded as that, not as overload.
    :var keys: concurrency key -> (its runs on nodes, its max), for the keys of the
        pending runs and due jobs copied.
    """

    pending: tuple[PendingRun, ...]
    due: tuple[DueJob, ...]
    last_leader_ms: int
    member_tags: tuple[frozenset[str], ...] | None = None
    keys: dict[str, tuple[int, int]] = field(default_factory=dict)


def plan_input(st: StateData, horizon_ms: int, *, skip_jobs: Collection[str] = (),
               skip_runs: Collection[str] = ()) -> PlanInput:
    """Copy what a plan up to ``horizon_ms`` reads (call with the state lock held):
    at most ``MAX_RUNS_PER_PLAN`` pending runs and ``MAX_JOBS_PER_PLAN`` due jobs,
    leaving out ``skip_jobs`` and ``skip_runs`` (those of plans not yet committed)."""
    pending: list[PendingRun] = []
    bf_runs = st.bf_runs
    keys: dict[str, tuple[int, int]] = {}
    table = st.table
    read = backfills = 0
    for run_id in st.pending:
        is_bf = run_id in bf_runs
        if is_bf and backfills >= MAX_BACKFILL_READ:
            continue  # backfills' runs never take the on-time runs' share of a plan
        if not is_bf and read >= MAX_RUNS_PER_PLAN:
            if backfills >= MAX_BACKFILL_READ or not bf_runs:
                break
            continue
        run = st.runs[run_id]
        rec = st.jobs.get(run.job_id)
        if run.not_before_ms > horizon_ms or rec is None or run_id in skip_runs:
            continue
        key = table.job_keys.get(run.job_id)
        if key is not None and key not in keys:
            keys[key] = (table.on_node(key), table.limit(key))
        backfills += is_bf
        read += not is_bf
        pending.append(PendingRun(run_id=run.run_id, scheduled_ms=run.scheduled_ms,
                                  not_before_ms=run.not_before_ms, tags=rec.spec.tags,
                                  grace_ms=rec.spec.misfire.grace_ms, attempt=run.attempt,
                                  key=key, backfill=is_bf))
    due = []
    covering: bool | None = None  # every member applies a plan that covers (asked once)
    for rec in st.due_jobs(horizon_ms, MAX_JOBS_PER_PLAN, skip_jobs):
        held = heldids.held(st, rec) if st.held_ahead else heldids.NONE
        if held:
            if covering is None:
                covering = members.all_have(st, RUN_IDS_FEATURE)
            if not covering:
                held = heldids.NONE
        conc = rec.spec.concurrency
        if conc is not None and conc.key not in keys:
            keys[conc.key] = (table.on_node(conc.key), table.limit(conc.key))
        # A backfill's runs are not the schedule's previous runs (overlap ignores them).
        due.append(DueJob(spec=rec.spec, hwm_ms=rec.hwm_ms, next_ms=rec.next_ms,
                          version=rec.version,
                          active=tuple((r, st.runs[r].state) for r in rec.active
                                       if r not in bf_runs), held=held))
    return PlanInput(pending=tuple(pending), due=tuple(due),
                     last_leader_ms=st.leader.prev_ms,
                     member_tags=members.member_tags(st), keys=keys)


__all__ = ["MAX_BACKFILL_READ", "MAX_JOBS_PER_PLAN", "MAX_RUNS_PER_PLAN", "DueJob",
           "PendingRun", "PlanInput", "plan_input"]
