"""Claim transitions of the state machine: plan (assign), start, finish, release.

Split from :mod:`raftsched.core.state` to keep each module on one job. Every function here
runs inside ``ClusterState.apply`` — pure, deterministic, time from the command.
Batched commands accept or reject each item on its own; a rejected item changes
nothing (the rejection goes out as an effect, for events and metrics).
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

from raftsched.core import backfill, conc, deps, notify
from raftsched.core.commands import (
    BadClaim,
    Finish,
    MissFire,
    Plan,
    Refused,
    Release,
    Start,
)
from raftsched.core.effects import (
    ClaimRefused,
    ClaimsReleased,
    NodeLost,
    PlanRejected,
    RangeMissed,
    RunAssigned,
    RunCreated,
    RunEnded,
    RunStarted,
    StopRun,
)
from raftsched.core.errors import Conflict, InvalidArgument
from raftsched.core.model import MissReason, RunState, run_id_of
from raftsched.core.records import RunRecord
from raftsched.core.runtable import CONC_WAIT, may
from raftsched.core.trigger import next_fire

if TYPE_CHECKING:
    from raftsched.core.records import JobRecord
    from raftsched.core.state import ClusterState

_PENDING = RunState.pending.value
_QUEUED = RunState.queued.value
_ASSIGNED = RunState.assigned.value
_STARTED = RunState.started.value
#: Only the newest runs of a job keep their output tail in the replicated state;
#: older history keeps its outcome but drops the text (bounded memory and snapshots).
TAILS_KEPT = 5
#: A job never has more active runs than this (``overlap = allow`` with slow runs).
MAX_ACTIVE_PER_JOB = 64
MAX_TAIL = 65536


# ---------------------------------------------------------------- building blocks

def new_run(st: ClusterState, rec: JobRecord, sched: int, at: int, *, manual: bool = False,
            state: RunState = RunState.pending, reason: str = "", note: str | None = None,
            not_before: int = 0, attempt: int = 1) -> RunRecord:
    """A new active run. ``reason`` ``CONC_WAIT`` (with ``state`` queued): queued for its
    concurrency key; ``not_before``: a run made for a fire time long past (a dependent's,
    a backfill's) counts its grace from there."""
    run = RunRecord(run_id=run_id_of(rec.spec.id, sched), job_id=rec.spec.id,
                    scheduled_ms=sched, created_ms=at, state=state.value, manual=manual,
                    reason=reason, not_before_ms=not_before, attempt=attempt)
    if note is None:
        note = "manual" if manual else ""
    if reason == CONC_WAIT:
        note = f"queued: concurrency {rec.spec.concurrency.key}" if rec.spec.concurrency \
            else note
    run.note(at, note)
    st.table.add(run)
    rec.add_active(run.run_id)
    st.effects.append(RunCreated(run.run_id))
    return run


def assign(st: ClusterState, run: RunRecord, node: str, at: int) -> bool:
    """Assign a pending run to ``node`` with a new fence (False if it is not pending)."""
    if not may(run, RunState.assigned):
        return False
    run.fence = st.table.next_fence()
    run.assigned_ms = at
    st.table.move(run, RunState.assigned, at, node=node)
    st.effects.append(RunAssigned(run.run_id, node, run.fence))
    return True


def end_run(st: ClusterState, run: RunRecord, at: int, state: RunState, reason: str, *,
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
        _push(_history(st, run.job_id), run)
        rec.last = (run.run_id, run.state, reason, at)
        notify.on_outcome(st, rec, run, at)
    release_queued(st, rec, at)
    if keep_history:
        # In this very apply, on every replica: a dependent's run, and a backfill's
        # next, follow the outcome with no window for a failover to fall into.
        deps.on_run_end(st, rec, run, at)
        backfill.on_run_end(st, rec, run, at)
    return True


def _history(st: ClusterState, job_id: str) -> deque[RunRecord]:
    """The job's history, created on first use: an empty deque costs ~600 bytes, and
    most of a million far-future jobs never run."""
    hist = st.history.get(job_id)
    if hist is None:
        hist = st.history[job_id] = deque(maxlen=st.history_limit)
    return hist


def _push(hist: Any, run: RunRecord) -> None:
    hist.append(run)
    if len(hist) > TAILS_KEPT and hist[-TAILS_KEPT - 1].tail:
        hist[-TAILS_KEPT - 1].tail = ""


def release_queued(st: ClusterState, rec: JobRecord, at: int) -> None:
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


def record_miss(st: ClusterState, rec: JobRecord, first: int, last: int, count: int,
                state: RunState, reason: str, at: int) -> None:
    """Record fire times ``first..last`` (``count`` of them) that did not run.

    Consecutive misses with the same outcome and reason fold into one range record,
    so a long outage or a long overload costs one history entry, not thousands."""
    hist = _history(st, rec.spec.id)
    st.totals[state.value] = st.totals.get(state.value, 0) + count
    rec.last = (run_id_of(rec.spec.id, first), state.value, reason, at)
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
    run = RunRecord(run_id=run_id_of(rec.spec.id, first), job_id=rec.spec.id,
                    scheduled_ms=first, created_ms=at, state=state.value, reason=reason,
                    finished_ms=at, until_ms=last if last != first else None, count=count)
    run.note(at, reason)
    hist.append(run)
    st.effects.append(RangeMissed(run.run_id, state.value, reason, first, last, count))
    notify.on_outcome(st, rec, run, at, first=first, last=last, count=count)


# ---------------------------------------------------------------- commands

def apply_plan(st: ClusterState, cmd: Plan) -> dict[str, Any]:
    """The leader's batch (see :class:`~raftsched.core.commands.Plan`).

    ``fires`` holds, in time order per job, runs for fire times above the job's
    high-water mark (raising the mark; assigned at once if a node is named) and missed
    ranges (the mark rises to their last fire time). ``place`` assigns pending runs (a
    new fence), ``drop`` ends active runs (shed, cancelled), ``next`` sets the next
    fire time after the mark. Each item is refused on its own.
    """
    _check_leader(st, cmd.term, cmd.leader, "plan")
    at, versions = cmd.at, cmd.versions
    rejected: list[list[Any]] = []
    for item in cmd.fires:
        if isinstance(item, Refused):
            rejected.append(item.entry)
            continue
        rec = st.jobs.get(item.job)
        if rec is not None and versions.get(item.job, rec.version) != rec.version:
            # Planned from an older version of the job (changed since): its schedule
            # and policies may differ, so none of its items apply; the next plan redoes it.
            rec = None
        if isinstance(item, MissFire):
            if rec is None or item.first_ms <= rec.hwm_ms:
                rejected.append(["miss", item.job, item.first_ms])
                continue
            record_miss(st, rec, item.first_ms, item.last_ms, item.fire_count,
                        RunState(item.outcome), item.reason[:64], at)
            rec.hwm_ms = item.last_ms
            continue
        sched, node = item.scheduled_ms, item.node
        if (rec is None or sched <= rec.hwm_ms or rec.spec.paused
                or len(rec.active) >= MAX_ACTIVE_PER_JOB
                or run_id_of(item.job, sched) in st.runs):  # e.g. a manual run's id
            rejected.append(["run", item.job, sched])
            continue
        rec.hwm_ms = sched
        admitted = conc.admission(st, rec)
        if admitted == conc.SKIP:
            record_miss(st, rec, sched, sched, 1, RunState.skipped,
                        MissReason.concurrency.value, at)
            continue
        waits = item.queued or admitted == conc.QUEUE
        run = new_run(st, rec, sched, at,
                      state=RunState.queued if waits else RunState.pending,
                      reason=CONC_WAIT if waits and not item.queued else "")
        if node is not None and not waits and _node_ok(st, node) and conc.may_place(st, run):
            assign(st, run, node, at)
        elif item.queued:
            # The run it queues behind may have ended since the plan was made.
            release_queued(st, rec, at)
    for d in cmd.drop:
        ending = None if isinstance(d, Refused) else st.runs.get(d.run_id)
        if (ending is None or isinstance(d, Refused)
                or not end_run(st, ending, at, RunState(d.outcome), d.reason[:64])):
            rejected.append(d.entry if isinstance(d, Refused) else ["drop", d.run_id])
    for p in cmd.place:
        placing = None if isinstance(p, Refused) else st.runs.get(p.run_id)
        if (placing is None or isinstance(p, Refused) or not _node_ok(st, p.node)
                or not conc.may_place(st, placing)  # the key's limit holds here
                or not assign(st, placing, p.node, at)):
            rejected.append(p.entry if isinstance(p, Refused) else ["place", p.run_id])
    for n in cmd.next:
        if isinstance(n, Refused):
            rejected.append(n.entry)
            continue
        rec = st.jobs.get(n.job)
        if rec is not None and versions.get(n.job, rec.version) != rec.version:
            rec = None
        if rec is None or not (n.next_ms is None or n.next_ms > rec.hwm_ms):
            rejected.append(["next", n.job])
            continue
        st.set_next(rec, n.next_ms)
    st.leader["last_ms"] = max(st.leader["last_ms"], at)
    if rejected:
        st.effects.append(PlanRejected(rejected[:50]))
    return {"ok": True, "rejected": rejected[:200], "fence": st.fence}


def _check_leader(st: ClusterState, term: int, leader: Any, op: str) -> None:
    """A plan or release is the current leader's only: its term and node must be the
    leadership record's (committed by that leader before it planned anything)."""
    lead = st.leader
    if term != lead["term"]:
        raise Conflict(op, f"from term {term}; the current leader's term is {lead['term']}")
    if leader != lead["node"]:
        raise Conflict(op, f"from {leader!r}; term {term} is led by {lead['node']!r}")


def _node_ok(st: ClusterState, node: str) -> bool:
    rec = st.nodes.get(node)
    return rec is not None and rec.alive


def apply_start(st: ClusterState, cmd: Start) -> dict[str, Any]:
    """A node starts assigned runs: each is accepted only with its current fence."""
    node, at = cmd.node, cmd.at
    results: list[Any] = []
    for item in cmd.items:
        run = st.runs.get(item.run_id) if isinstance(item.run_id, str) else None
        if (isinstance(item, BadClaim) or run is None or run.node != node
                or run.fence != item.fence or not st.table.move(run, RunState.started, at)):
            current = run.fence if run is not None else None
            results.append([False, current])
            st.effects.append(ClaimRefused("start", item.run_id, node, item.fence, current))
            continue
        run.started_ms = at
        results.append([True, item.fence])
        st.effects.append(RunStarted(run.run_id, node, item.fence))
    return {"ok": True, "results": results}


def apply_finish(st: ClusterState, cmd: Finish) -> dict[str, Any]:
    """A node reports outcomes (see :class:`~raftsched.core.commands.FinishItem`)."""
    node, at = cmd.node, cmd.at
    results: list[Any] = []
    for item in cmd.items:
        run = st.runs.get(item.run_id) if isinstance(item.run_id, str) else None
        # The outcome must be one the run may end in from where it is (a started run
        # cannot be missed; a run not started cannot have succeeded).
        if (isinstance(item, BadClaim) or run is None or run.node != node
                or run.fence != item.fence or not may(run, RunState(item.outcome))):
            current = run.fence if run is not None else None
            results.append([False, current])
            st.effects.append(ClaimRefused("finish", item.run_id, node, item.fence, current))
            continue
        outcome, reason = item.outcome, item.reason
        run.exit_code = item.exit_code
        run.tail = item.tail[-MAX_TAIL:]
        rec = st.jobs.get(run.job_id)
        retries = rec.spec.retries if rec is not None else None
        if outcome == "lost":
            # The node stopped the run itself (lost quorum, shutdown): as if lost.
            if (rec is not None and rec.spec.on_node_lost.value == "retry"
                    and not rec.spec.paused):
                _retry(st, run, at, RunState.lost, reason[:200], at)
            else:
                end_run(st, run, at, RunState.lost, reason[:200])
        elif (outcome in ("failed", "timed_out") and rec is not None and retries is not None
                and run.attempt <= retries.max and not rec.spec.paused):
            _retry(st, run, at, RunState(outcome), reason[:200],
                   at + retries.delay_ms(run.attempt))
        else:
            end_run(st, run, at, RunState(outcome), reason[:200])
        results.append([True, item.fence])
    return {"ok": True, "results": results}


def _retry(st: ClusterState, run: RunRecord, at: int, outcome: RunState, reason: str,
           not_before: int) -> None:
    """Keep the failed attempt in history, then make the run pending for the next one."""
    attempt = run.copy()
    attempt.state = outcome.value
    attempt.reason = reason
    attempt.finished_ms = at
    attempt.note(at, "retrying")
    if run.job_id in st.jobs:
        _push(_history(st, run.job_id), attempt)
    st.totals[outcome.value] = st.totals.get(outcome.value, 0) + 1
    st.effects.append(RunEnded(run.run_id, outcome.value, run.node, reason + " (retrying)"))
    run.attempt += 1
    run.started_ms = None
    run.exit_code = None
    run.not_before_ms = not_before
    st.table.move(run, RunState.pending, at, f"retry attempt {run.attempt}", node=None)


def apply_release(st: ClusterState, cmd: Release) -> dict[str, Any]:
    """The leader declares a node gone: its claims are released at once.

    Assigned (not started) runs go back to pending and are placed again with a new
    fence; with ``scope = all`` started runs follow the job's ``on_node_lost``."""
    if cmd.term is not None:  # v1 releases had no term
        _check_leader(st, cmd.term, cmd.leader, "release")
    node, scope, reason, at = cmd.node, cmd.scope, cmd.reason, cmd.at
    if node not in st.nodes:
        raise InvalidArgument("node", "must be a known node id")
    if cmd.hb is not None and st.nodes[node].last_hb_ms != cmd.hb:
        # Decided by the lease of the heartbeat stamped ``hb``: a newer one committed
        # before this release may have renewed the node's lease (see core/lease.py).
        raise Conflict("release", f"node {node} sent a heartbeat after the one this "
                                  "release counted from")
    released = release_node(st, node, at, scope, reason[:64])
    if scope == "all":
        nrec = st.nodes[node]
        if nrec.alive:
            nrec.alive = False
            nrec.lost_ms = at
            st.effects.append(NodeLost(node, reason[:64]))
    return {"ok": True, "released": released}


def release_node(st: ClusterState, node: str, at: int, scope: str, reason: str, *,
                 seen_ms: int | None = None, text: str | None = None) -> list[str]:
    """Release a node's claims: ``assigned`` runs (scope ``assigned`` or ``all``) go back
    to pending; ``started`` runs (scope ``started`` or ``all``) follow ``on_node_lost``.

    ``seen_ms``: when the node was last known to run them (its old process's last
    heartbeat, for a restart); their retries are due from then, not from ``at``, so the
    leader records a retry that fell due during a long outage as late (the misfire
    grace) instead of running it minutes late. Only ever earlier than ``at``: where a
    retry waits (its start time) does not change.

    ``text``: what a released started run records as its reason (default ``node
    <id> <reason>``)."""
    released: list[str] = []
    why = f"node {node} {reason}" if text is None else text
    for run in st.active_on(node):
        if run.state == _ASSIGNED and scope in ("assigned", "all"):
            st.table.move(run, RunState.pending, at, f"released: {reason}", node=None)
            released.append(run.run_id)
        elif run.state == _STARTED and scope in ("started", "all"):
            rec = st.jobs.get(run.job_id)
            if (rec is not None and rec.spec.on_node_lost.value == "retry"
                    and not rec.spec.paused):
                due = at if seen_ms is None else min(at, max(seen_ms, run.started_ms or 0))
                _retry(st, run, at, RunState.lost, why, due)
            else:
                end_run(st, run, at, RunState.lost, why)
            released.append(run.run_id)
    if released:
        st.effects.append(ClaimsReleased(node, released, reason))
    return released
