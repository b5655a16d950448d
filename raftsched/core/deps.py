"""Dependent jobs in the state machine (``after = ["extract"]``, ``on = ...``).

A dependent job has no fire times of its own. When a run of one of its parents ends
(:func:`on_run_end`, called by ``runs.end_run`` in the very apply that records the
outcome), and every parent's run for that same fire time has ended in an outcome the
job's ``on`` accepts, one run ``<child>@<that fire time>`` is created — deterministically
on every replica, so no leader command and no window lies between the parent's outcome
and the child's run: a leader killed between them changes nothing. Its id makes it
exactly once (a second end of a parent's fire time finds it there).

Fan-in joins on the fire time: ``after = ["a", "b"]`` runs for fire time ``T`` once
``a@T`` and ``b@T`` both ended matching. Parents on different schedules share no fire
time, so their dependent never runs (documented in the Jobs page).

The graph is checked where a put or delete changes it (:func:`check_graph`,
:func:`check_removal`): unknown parents, cycles and removing a parent others depend on
are refused naming ``after``. Pure: no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import TYPE_CHECKING

from raftsched.core import conc, runs
from raftsched.core.errors import Conflict, InvalidSpec
from raftsched.core.misses import overlap_decision
from raftsched.core.model import FireAction, MissReason, Overlap, RunState, run_id_of
from raftsched.core.runtable import CONC_WAIT
from raftsched.core.specext import ON_STATES

if TYPE_CHECKING:
    from raftsched.core.model import JobSpec
    from raftsched.core.records import JobRecord, RunRecord
    from raftsched.core.state import StateData

_MISSED, _SKIPPED = RunState.missed, RunState.skipped


# ---------------------------------------------------------------- the graph

def index(st: StateData, spec: JobSpec, old: JobSpec | None) -> None:
    """Keep ``st.dependents`` (parent id -> its dependents' ids) in step with a put of
    ``spec`` over ``old`` (None: a new job), or a removal (``spec`` is ``old``, and
    ``old`` None... see :func:`unindex`)."""
    if old is not None:
        unindex(st, old)
    for parent in spec.after:
        st.dependents.setdefault(parent, set()).add(spec.id)


def unindex(st: StateData, spec: JobSpec) -> None:
    for parent in spec.after:
        kids = st.dependents.get(parent)
        if kids is not None:
            kids.discard(spec.id)
            if not kids:
                del st.dependents[parent]




def check_graph(st: StateData, spec: JobSpec,
                overlay: Mapping[str, JobSpec | None] | None = None) -> None:
    """Refuse (naming ``after``) a put of ``spec`` whose parents are unknown or that
    would close a cycle. ``overlay``: the jobs a batch puts (a spec) or removes (None)
    before it lands, as they will be."""
    if not spec.after:
        return
    lookup = _lookup(st, overlay or {}, spec)
    for i, parent in enumerate(spec.after):
        if lookup(parent) is None:
            raise InvalidSpec(f"after[{i}]", f"unknown job {parent!r}")
    # Walk the ancestors: reaching the job itself is a cycle (bounded by the jobs).
    stack: list[tuple[str, tuple[str, ...]]] = [(p, (spec.id, p)) for p in spec.after]
    seen: set[str] = set()
    while stack:
        job, path = stack.pop()
        if job == spec.id:
            raise InvalidSpec("after", "would make a cycle: " + " -> ".join(path))
        if job in seen:
            continue
        seen.add(job)
        found = lookup(job)
        if found is not None:
            stack.extend((p, (*path, p)) for p in found.after)


def check_removal(st: StateData, job_id: str, removing: Collection[str] = ()) -> None:
    """Refuse (naming ``after``) removing a job that others (not removed with it) run
    after."""
    kids = sorted(k for k in st.dependents.get(job_id, ()) if k not in removing)
    if kids:
        raise Conflict("after", f"{', '.join(kids[:5])} run(s) after {job_id}: remove "
                                f"them or change their after first")


def _lookup(st: StateData, overlay: Mapping[str, JobSpec | None],
            spec: JobSpec) -> Callable[[str], JobSpec | None]:
    def lookup(job_id: str) -> JobSpec | None:
        if job_id == spec.id:
            return spec
        if job_id in overlay:
            return overlay[job_id]
        rec = st.jobs.get(job_id)
        return None if rec is None else rec.spec
    return lookup


# ---------------------------------------------------------------- runs

def outcome_of(st: StateData, job_id: str, scheduled_ms: int) -> str | None:
    """The recorded outcome of ``job_id``'s fire time ``scheduled_ms``, or None while it
    is active or has none (the newest record of its id is its final one: the failed
    attempts of a retried run are pushed before it)."""
    run_id = run_id_of(job_id, scheduled_ms)
    if run_id in st.runs:
        return None
    for rec in reversed(st.history.get(job_id, ())):
        if rec.run_id == run_id or (rec.until_ms is not None
                                    and rec.scheduled_ms <= scheduled_ms <= rec.until_ms):
            return rec.state
    return None


def on_run_end(st: StateData, rec: JobRecord, run: RunRecord, at: int) -> None:
    """A run of ``rec`` ended in ``run.state``: make the runs of its dependents whose
    every parent has now ended matching for ``run.scheduled_ms``."""
    kids = st.dependents.get(rec.job_id)
    if not kids:
        return
    sched = run.scheduled_ms
    for kid in sorted(kids):  # sorted: every replica makes them in one order
        krec = st.jobs.get(kid)
        if krec is None:
            continue
        accepts = ON_STATES[krec.spec.on]
        if run.state not in accepts or any(
                outcome_of(st, p, sched) not in accepts
                for p in krec.spec.after if p != rec.job_id):
            continue
        run_id = run_id_of(kid, sched)
        if run_id in st.runs or any(r.run_id == run_id for r in st.history.get(kid, ())):
            continue  # this fire time has its run already
        create_run(st, krec, sched, at, overlap=krec.spec.overlap,
                   note=f"after {rec.job_id}")


def create_run(st: StateData, rec: JobRecord, sched: int, at: int, *, overlap: Overlap,
               note: str, attempt: int = 1) -> RunRecord | None:
    """A run of ``rec`` for fire time ``sched`` made outside the leader's plan (a
    dependent's, a backfill's), through the same gates as a planned one: paused (recorded
    ``missed``), ``overlap`` against the job's active runs, the active-runs cap and the
    concurrency key. Returns the run, or None when the fire time was recorded instead.
    Its grace counts from ``at`` (it may be for a fire time long past)."""
    active = [(r, st.runs[r].state) for r in rec.active]
    if rec.spec.paused:
        runs.record_miss(st, rec, sched, sched, 1, _MISSED, MissReason.paused.value, at)
        return None
    decision = overlap_decision(overlap, active)
    if decision.action is FireAction.skip or len(rec.active) >= runs.MAX_ACTIVE_PER_JOB:
        runs.record_miss(st, rec, sched, sched, 1, _SKIPPED, MissReason.overlap.value, at)
        return None
    for run_id in decision.cancel:
        runs.end_run(st, st.runs[run_id], at, RunState.cancelled, "replaced")
    admitted = conc.admission(st, rec)
    if admitted == FireAction.skip:
        runs.record_miss(st, rec, sched, sched, 1, _SKIPPED,
                           MissReason.concurrency.value, at)
        return None
    by_overlap = decision.action is FireAction.queue
    waits = by_overlap or admitted == FireAction.queue
    run = runs.new_run(st, rec, sched, at,
                         state=RunState.queued if waits else RunState.pending,
                         reason=CONC_WAIT if waits and not by_overlap else "",
                         note=note, not_before=at, attempt=attempt)
    if by_overlap:
        runs.release_queued(st, rec, at)
    return run


__all__ = ["check_graph", "check_removal", "create_run", "index", "on_run_end", "outcome_of",
           "unindex"]
