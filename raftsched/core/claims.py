"""Claim transitions of the state machine: plan (assign), start, finish, release.

The commands of a claim's life, over the building blocks of :mod:`~raftsched.core.runs`.
Every function here runs inside ``ClusterState.apply`` — pure, deterministic, time from
the command.
Batched commands accept or reject each item on its own; a rejected item changes
nothing (the rejection goes out as an effect, for events and metrics).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from raftsched.core import conc, heldids
from raftsched.core.cmdbase import HELD_IDS_VERSION
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
    FireCovered,
    NodeLost,
    PlanRejected,
    RunEnded,
    RunStarted,
)
from raftsched.core.errors import Conflict, InvalidArgument
from raftsched.core.items import ClaimResult, ReleaseScope
from raftsched.core.model import FireAction, MissReason, OnNodeLost, RunState, run_id_of
from raftsched.core.records import RunRecord
from raftsched.core.runs import (
    MAX_ACTIVE_PER_JOB,
    assign,
    end_run,
    history_of,
    new_run,
    push,
    record_miss,
    release_queued,
)
from raftsched.core.runtable import CONC_WAIT, may

if TYPE_CHECKING:
    from raftsched.core.state import StateData

_ASSIGNED = RunState.assigned.value
_STARTED = RunState.started.value
#: Characters of a run's output tail a finish may carry.
MAX_TAIL = 65536


# ---------------------------------------------------------------- commands

def apply_plan(st: StateData, cmd: Plan) -> dict[str, Any]:
    """The leader's batch (see :class:`~raftsched.core.commands.Plan`).

    ``fires`` holds, in time order per job, runs for fire times above the job's
    high-water mark (raising the mark; assigned at once if a node is named) and missed
    ranges (the mark rises to their last fire time). ``place`` assigns pending runs (a
    new fence), ``drop`` ends active runs (shed, cancelled), ``next`` sets the next
    fire time after the mark. Each item is refused on its own.
    """
    _check_leader(st, cmd.term, cmd.leader, "plan")
    at, versions = cmd.at, cmd.versions
    # Version 6 plans cover a fire time whose run id a kept record holds (see heldids);
    # older ones are applied as they were written.
    covered = heldids.covered_in(st, cmd) if cmd.v >= HELD_IDS_VERSION else None
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
            rec.hwm_ms = item.last_ms
            record_miss(st, rec, item.first_ms, item.last_ms, item.fire_count,
                        item.outcome, item.reason[:64], at)
            continue
        sched, node = item.scheduled_ms, item.node
        if covered and rec is not None and (item.job, sched) in covered \
                and sched > rec.hwm_ms:
            rec.hwm_ms = sched  # accounted for by the record that holds its id
            st.effects.append(FireCovered(run_id_of(item.job, sched)))
            continue
        if (rec is None or sched <= rec.hwm_ms or rec.spec.paused
                or len(rec.active) >= MAX_ACTIVE_PER_JOB
                or run_id_of(item.job, sched) in st.runs):  # e.g. a manual run's id
            rejected.append(["run", item.job, sched])
            continue
        rec.hwm_ms = sched
        admitted = conc.admission(st, rec)
        if admitted == FireAction.skip:
            record_miss(st, rec, sched, sched, 1, RunState.skipped,
                        MissReason.concurrency.value, at)
            continue
        waits = item.queued or admitted == FireAction.queue
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
                or not end_run(st, ending, at, d.outcome, d.reason[:64])):
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
    st.leader.last_ms = max(st.leader.last_ms, at)
    if rejected:
        st.effects.append(PlanRejected(rejected[:50]))
    return {"ok": True, "rejected": rejected[:200], "fence": st.fence}


def _check_leader(st: StateData, term: int, leader: Any, op: str) -> None:
    """A plan or release is the current leader's only: its term and node must be the
    leadership record's (committed by that leader before it planned anything)."""
    lead = st.leader
    if term != lead.term:
        raise Conflict(op, f"from term {term}; the current leader's term is {lead.term}")
    if leader != lead.node:
        raise Conflict(op, f"from {leader!r}; term {term} is led by {lead.node!r}")


def _node_ok(st: StateData, node: str) -> bool:
    rec = st.nodes.get(node)
    return rec is not None and rec.alive


def apply_start(st: StateData, cmd: Start) -> dict[str, Any]:
    """A node starts assigned runs: each is accepted only with its current fence."""
    node, at = cmd.node, cmd.at
    results: list[ClaimResult] = []
    for item in cmd.items:
        run = st.runs.get(item.run_id) if isinstance(item.run_id, str) else None
        if (isinstance(item, BadClaim) or run is None or run.node != node
                or run.fence != item.fence or not st.table.move(run, RunState.started, at)):
            current = run.fence if run is not None else None
            results.append(ClaimResult(False, current))
            st.effects.append(ClaimRefused("start", item.run_id, node, item.fence, current))
            continue
        run.started_ms = at
        results.append(ClaimResult(True, item.fence))
        st.effects.append(RunStarted(run.run_id, node, item.fence))
    return {"ok": True, "results": results}


def apply_finish(st: StateData, cmd: Finish) -> dict[str, Any]:
    """A node reports outcomes (see :class:`~raftsched.core.commands.FinishItem`)."""
    node, at = cmd.node, cmd.at
    results: list[ClaimResult] = []
    for item in cmd.items:
        run = st.runs.get(item.run_id) if isinstance(item.run_id, str) else None
        # The outcome must be one the run may end in from where it is (a started run
        # cannot be missed; a run not started cannot have succeeded).
        if (isinstance(item, BadClaim) or run is None or run.node != node
                or run.fence != item.fence or not may(run, item.outcome)):
            current = run.fence if run is not None else None
            results.append(ClaimResult(False, current))
            st.effects.append(ClaimRefused("finish", item.run_id, node, item.fence, current))
            continue
        outcome, reason = item.outcome, item.reason
        run.exit_code = item.exit_code
        run.tail = item.tail[-MAX_TAIL:]
        rec = st.jobs.get(run.job_id)
        retries = rec.spec.retries if rec is not None else None
        if outcome is RunState.lost:
            # The node stopped the run itself (lost quorum, shutdown): as if lost.
            if (rec is not None and rec.spec.on_node_lost is OnNodeLost.retry
                    and not rec.spec.paused):
                _retry(st, run, at, RunState.lost, reason[:200], at)
            else:
                end_run(st, run, at, RunState.lost, reason[:200])
        elif (outcome in (RunState.failed, RunState.timed_out) and rec is not None
                and retries is not None and run.attempt <= retries.max and not rec.spec.paused):
            _retry(st, run, at, outcome, reason[:200],
                   at + retries.delay_ms(run.attempt))
        else:
            end_run(st, run, at, outcome, reason[:200])
        results.append(ClaimResult(True, item.fence))
    return {"ok": True, "results": results}


def _retry(st: StateData, run: RunRecord, at: int, outcome: RunState, reason: str,
           not_before: int) -> None:
    """Keep the failed attempt in history, then make the run pending for the next one."""
    attempt = run.copy()
    attempt.state = outcome.value
    attempt.reason = reason
    attempt.finished_ms = at
    attempt.note(at, "retrying")
    if run.job_id in st.jobs:
        push(history_of(st, run.job_id), attempt)
    st.totals[outcome.value] = st.totals.get(outcome.value, 0) + 1
    st.effects.append(RunEnded(run.run_id, outcome.value, run.node, reason + " (retrying)"))
    run.attempt += 1
    run.started_ms = None
    run.exit_code = None
    run.not_before_ms = not_before
    st.table.move(run, RunState.pending, at, f"retry attempt {run.attempt}", node=None)


def apply_release(st: StateData, cmd: Release) -> dict[str, Any]:
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
    if scope is ReleaseScope.all:
        nrec = st.nodes[node]
        if nrec.alive:
            nrec.alive = False
            nrec.lost_ms = at
            st.effects.append(NodeLost(node, reason[:64]))
    return {"ok": True, "released": released}


def release_node(st: StateData, node: str, at: int, scope: ReleaseScope, reason: str, *,
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
        if run.state == _ASSIGNED and scope is not ReleaseScope.started:
            st.table.move(run, RunState.pending, at, f"released: {reason}", node=None)
            released.append(run.run_id)
        elif run.state == _STARTED and scope is not ReleaseScope.assigned:
            rec = st.jobs.get(run.job_id)
            if (rec is not None and rec.spec.on_node_lost is OnNodeLost.retry
                    and not rec.spec.paused):
                due = at if seen_ms is None else min(at, max(seen_ms, run.started_ms or 0))
                _retry(st, run, at, RunState.lost, why, due)
            else:
                end_run(st, run, at, RunState.lost, why)
            released.append(run.run_id)
    if released:
        st.effects.append(ClaimsReleased(node, released, reason))
    return released
