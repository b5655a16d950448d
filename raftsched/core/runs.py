"""A run's life in the state: made, assigned, ended, recorded missed.

The building blocks every handler uses (:mod:`~raftsched.core.claims`,
:mod:`~raftsched.core.deps`, :mod:`~raftsched.core.backfill`,
:mod:`~raftsched.core.jobs`): pure, deterministic, time from the command. A run's end
sets more going in the same apply — its notification here, its dependents' runs and its
backfill's next run through ``st.after_run_end``, which the dispatcher
(:mod:`~raftsched.core.machine`) provides, so that this module sits below the handlers
that call back into it.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

from raftsched.core import heldids, notify
from raftsched.core.effects import RangeMissed, RunAssigned, RunCreated, RunEnded, StopRun
from raftsched.core.model import RunState, run_id_of
from raftsched.core.records import RunRecord
from raftsched.core.runtable import CONC_WAIT, may
from raftsched.core.trigger import next_fire

if TYPE_CHECKING:
    from raftsched.core.records import JobRecord
    from raftsched.core.state import StateData

_PENDING = RunState.pending.value
_QUEUED = RunState.queued.value
_ASSIGNED = RunState.assigned.value
_STARTED = RunState.started.value
#: Only the newest runs of a job keep their output tail in the replicated state;
#: older history keeps its outcome but drops the text (bounded memory and snapshots).
TAILS_KEPT = 5
#: A job never has more active runs than this (``overlap = allow`` with slow runs).
MAX_ACTIVE_PER_JOB = 64


def new_run(st: StateData, rec: JobRecord, sched: int, at: int, *, manual: bool = False,
            state: RunState = RunState.pending, reason: str = "", note: str | None = None,
            not_before: int = 0, attempt: int = 1) -> RunRecord:
    """A new active run. ``reason`` ``CONC_WAIT`` (with ``state`` queued): queued for its
    concurrency key; ``not_before``: a run made for a fire time long past (a dependent's,
    a backfill's) counts its grace from there."""
    run = RunRecord(run_id=run_id_of(rec.job_id, sched), job_id=rec.job_id,
                    scheduled_ms=sched, created_ms=at, state=state.value, manual=manual,
                    reason=reason, not_before_ms=not_before, attempt=attempt)
    if note is None:
        note = "manual" if manual else ""
    if reason == CONC_WAIT:
        note = f"queued: concurrency {rec.spec.concurrency.key}" if rec.spec.concurrency \
            else note
    run.note(at, note)
    heldids.note(st, rec, sched)
    st.table.add(run)
    rec.add_active(run.run_id)
    st.effects.append(RunCreated(run.run_id))
    return run


def assign(st: StateData, run: RunRecord, node: str, at: int) -> bool:
    """Assign a pending run to ``node`` with a new fence (False if it is not pending)."""
    if not may(run, RunState.assigned):
        return False
    run.fence = st.table.next_fence()
    run.assigned_ms = at
    st.table.move(run, RunState.assigned, at, node=node)
    st.effects.append(RunAssigned(run.run_id, node, run.fence))
    return True


def end_run(st: StateData, run: RunRecord, at: int, state: RunState, reason: str, *,
            keep_history: bool = True) -> bool:
    """Move an active run to a terminal state (and history), releasing its claim;
    False, changing nothing, if it may not end so (see :data:`transitions.LEGAL`)."""
    was_started = run.state == _STARTED
    if not st.table.move(run, state, at, reason):
        return False
    rec = st.jobs.get(run.job_id)
    if rec is not None:
        rec.drop_active(run.run_id)
    run.reason = reason
    run.finished_ms = at
    st.totals[run.state] = st.totals.get(run.state, 0) + 1
    if was_started and state is RunState.cancelled and run.node is not None:
        # The node must stop the process: its finish will be refused from now on.
        st.effects.append(StopRun(run.run_id, run.node, run.fence))
    st.effects.append(RunEnded(run.run_id, run.state, run.node, reason))
    if rec is None:
        return True
    if keep_history:
        push(history_of(st, run.job_id), run)
        rec.last = (run.run_id, run.state, reason, at)
        notify.on_outcome(st, rec, run, at)
    release_queued(st, rec, at)
    if keep_history:
        # In this very apply, on every replica: a dependent's run, and a backfill's
        # next, follow the outcome with no window for a failover to fall into.
        st.after_run_end(rec, run, at)
    return True


def history_of(st: StateData, job_id: str) -> deque[RunRecord]:
    """The job's history, created on first use: an empty deque costs ~600 bytes, and
    most of a million far-future jobs never run."""
    hist = st.history.get(job_id)
    if hist is None:
        hist = st.history[job_id] = deque(maxlen=st.history_limit)
    return hist


def push(hist: Any, run: RunRecord) -> None:
    """Append ``run`` to a job's history (only the newest keep their output tail)."""
    hist.append(run)
    if len(hist) > TAILS_KEPT and hist[-TAILS_KEPT - 1].tail:
        hist[-TAILS_KEPT - 1].tail = ""


def release_queued(st: StateData, rec: JobRecord, at: int) -> None:
    """``overlap = queue``: the buffered run becomes pending when nothing else runs (a
    run queued for its concurrency key, or a backfill's, is something else)."""
    queued = None
    bf_runs = st.bf_runs
    for run_id in rec.active:
        if run_id in bf_runs:
            continue  # a backfill's run never holds back the schedule's
        run = st.runs[run_id]
        if run.state == _QUEUED and run.reason != CONC_WAIT:
            queued = run
        else:
            return
    if queued is not None:
        st.table.move(queued, RunState.pending, at, "dequeued")


def record_miss(st: StateData, rec: JobRecord, first: int, last: int, count: int,
                state: RunState, reason: str, at: int) -> None:
    """Record fire times ``first..last`` (``count`` of them) that did not run.

    Consecutive misses with the same outcome and reason fold into one range record,
    so a long outage or a long overload costs one history entry, not thousands."""
    hist = history_of(st, rec.job_id)
    st.totals[state.value] = st.totals.get(state.value, 0) + count
    rec.last = (run_id_of(rec.job_id, first), state.value, reason, at)
    prev = hist[-1] if hist else None
    if (prev is not None and prev.state == state.value and prev.reason == reason
            and not prev.manual and prev.started_ms is None
            and (prev.until_ms or prev.scheduled_ms) < first
            # Only a contiguous range folds: a run between them must stay visible.
            and next_fire(rec.spec.schedule, prev.until_ms or prev.scheduled_ms) == first):
        prev.until_ms = last
        prev.count += count
        prev.finished_ms = at
        st.effects.append(RangeMissed(prev.run_id, state.value, reason, first, last, count))
        notify.on_outcome(st, rec, prev, at, first=first, last=last, count=count)
        return
    run = RunRecord(run_id=run_id_of(rec.job_id, first), job_id=rec.job_id,
                    scheduled_ms=first, created_ms=at, state=state.value, reason=reason,
                    finished_ms=at, until_ms=last if last != first else None, count=count)
    run.note(at, reason)
    heldids.note(st, rec, first)
    hist.append(run)
    st.effects.append(RangeMissed(run.run_id, state.value, reason, first, last, count))
    notify.on_outcome(st, rec, run, at, first=first, last=last, count=count)


__all__ = ["MAX_ACTIVE_PER_JOB", "TAILS_KEPT", "assign", "end_run", "history_of", "new_run",
           "push", "record_miss", "release_queued"]
