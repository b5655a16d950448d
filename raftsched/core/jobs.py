"""The job commands of the state machine: put (one, bulk), delete, pause, resume, trigger.

Handlers the dispatcher (:mod:`raftsched.core.machine`) routes commands to. Every
function here runs inside ``StateData.apply`` — pure, deterministic, time from the
command — and raises :class:`~raftsched.core.errors.RaftschedError` to refuse (apply
turns that into the reply), so a refused command must change nothing before it raises.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from raftsched.core import backfill, conc, deps, heldids, runs
from raftsched.core.cmdbase import BOUNDS_VERSION, DEPS_VERSION, HELD_IDS_VERSION
from raftsched.core.commands import (
    PAST_AT_VERSION,
    DeleteJob,
    Pause,
    PutJob,
    PutJobs,
    Resume,
    Trigger,
)
from raftsched.core.durations import format_duration
from raftsched.core.effects import JobPaused, JobPut, JobRemoved, JobResumed
from raftsched.core.errors import (
    Conflict,
    InvalidSpec,
    LimitExceeded,
    RaftschedError,
    UnknownJob,
    unknown_hint,
)
from raftsched.core.model import (
    FIELDS_BEFORE_BOUNDS,
    FIELDS_BEFORE_DEPS,
    FireAction,
    JobSpec,
    MissReason,
    Overlap,
    RunState,
    run_id_of,
)
from raftsched.core.records import JobRecord
from raftsched.core.runs import MAX_ACTIVE_PER_JOB
from raftsched.core.runtable import CONC_WAIT
from raftsched.core.specprep import CheckedSpec, checked_spec
from raftsched.core.trigger import (
    AtSchedule,
    Schedule,
    count_fires,
    latest_fire_at_or_before,
    next_fire,
)

if TYPE_CHECKING:
    from raftsched.core.state import StateData


def apply_put_job(st: StateData, cmd: PutJob) -> dict[str, Any]:
    return put_spec(st, checked_spec(cmd.spec, cmd.checked, 0), cmd.max_jobs, cmd.at, cmd.v)


def put_spec(st: StateData, ready: CheckedSpec, max_jobs: int | None, at: int,
             v: int, if_changed: bool = False, *,
             graph: Mapping[str, JobSpec | None] | None = None,
             checked: bool = False) -> dict[str, Any]:
    """Put a prepared spec (see :mod:`~raftsched.core.specprep`); ``if_changed``: a
    spec equal to the stored one (paused aside) is no new version. ``graph``: the other
    jobs of an all-or-nothing batch as they will be (``after`` may name them);
    ``checked``: the caller checked the graph for the whole batch already."""
    spec = ready.spec
    rec = st.jobs.get(spec.id)
    late_at = late_one_shot(spec, rec, at, v)
    if not checked:
        deps.check_graph(st, spec, graph)
    old = None if rec is None else rec.spec
    if rec is None:
        if max_jobs is not None and len(st.jobs) >= max_jobs:
            raise LimitExceeded("max_jobs", f"the cluster holds {len(st.jobs)} jobs")
        if ready.like is None:
            rec = JobRecord(spec, version=1, created_ms=at, updated_ms=at, hwm_ms=at,
                            next_ms=None)
        else:
            # Holds the template, not this copy: a million jobs put from one template
            # keep one spec, ~170 bytes a job less (the copy is made when first read).
            rec = JobRecord.restored(ready.like, spec.id, 1, at, at, at, None, None, None)
        st.jobs[spec.id] = rec
        created = True
    else:
        if if_changed and replace_paused(spec, rec.spec.paused) == rec.spec:
            # A declaration (each app instance declares its jobs at start): the same
            # definition again is not a new version, also when instances race.
            return {"ok": True, "job": spec.id, "version": rec.version, "created": False,
                    "changed": False}
        if spec.schedule != rec.spec.schedule:
            # A new schedule never fires its own past: start accounting from now.
            rec.hwm_ms = max(rec.hwm_ms, at)
        if spec.paused != rec.spec.paused:
            # Pausing and resuming have their own accounting (cancelled runs, the
            # missed range): an update keeps the current state; use pause/resume.
            spec = replace_paused(spec, rec.spec.paused)
        rec.spec = spec
        rec.version += 1
        rec.updated_ms = at
        created = False
    if late_at is not None:
        # An `at` up to its grace in the past fires now, late, as any late run does.
        rec.hwm_ms = late_at - 1
        st.refresh_held(rec)  # a run of the old schedule may hold late_at's id
    if spec.after or (old is not None and old.after):
        deps.index(st, spec, old)
    conc.track(st, rec, at)
    st.set_next(rec, ready.next_after(rec.hwm_ms))
    st.effects.append(JobPut(spec.id, rec.version, created))
    return {"ok": True, "job": spec.id, "version": rec.version, "created": created}


def apply_put_jobs(st: StateData, cmd: PutJobs) -> dict[str, Any]:
    """Bulk import: each spec is put on its own (one bad spec refuses only itself),
    or with ``atomic`` all of them or none (a job file is one change)."""
    if cmd.atomic:
        _check_all(st, cmd, cmd.max_jobs, cmd.at, cmd.v)
    results: list[dict[str, Any]] = []
    for i, raw in enumerate(cmd.specs):
        try:
            reply = put_spec(st, checked_spec(raw, cmd.checked, i), cmd.max_jobs, cmd.at,
                             cmd.v, cmd.if_changed, checked=cmd.atomic)
            results.append({"ok": True, "job": reply["job"], "version": reply["version"],
                            "created": reply["created"],
                            "changed": reply.get("changed", True)})
        except RaftschedError as exc:
            results.append({"ok": False, "error": exc.to_wire()})
    return {"ok": True, "results": results}


def _check_all(st: StateData, cmd: PutJobs, max_jobs: int | None, at: int,
               v: int) -> None:
    """Raise (changing nothing) unless every spec of an atomic put would be accepted:
    each valid, no id twice, and the new ones within ``max_jobs``. What ``put_spec``
    can refuse is exactly this, so after it the puts cannot fail half-way."""
    seen: set[str] = set()
    new = 0
    for i, raw in enumerate(cmd.specs):
        try:
            spec = checked_spec(raw, cmd.checked, i).spec
        except InvalidSpec as exc:
            raise InvalidSpec(f"specs[{i}].{exc.field}",
                              exc.message.partition(": ")[2]) from None
        if spec.id in seen:
            raise InvalidSpec(f"specs[{i}].id", f"{spec.id!r} appears twice")
        try:
            late_one_shot(spec, st.jobs.get(spec.id), at, v)
        except InvalidSpec as exc:
            raise InvalidSpec(f"specs[{i}].{exc.field}",
                              exc.message.partition(": ")[2]) from None
        seen.add(spec.id)
        new += spec.id not in st.jobs
    # The graph as the batch leaves it: a job may run after one put later in the batch.
    batch = {s.id: s for s in (checked_spec(raw, cmd.checked, i).spec
                               for i, raw in enumerate(cmd.specs))}
    for i, spec in enumerate(batch.values()):
        try:
            deps.check_graph(st, spec, batch)
        except InvalidSpec as exc:
            raise InvalidSpec(f"specs[{i}].{exc.field}",
                              exc.message.partition(": ")[2]) from None
    if max_jobs is not None and new and len(st.jobs) + new > max_jobs:
        raise LimitExceeded("max_jobs", f"the cluster holds {len(st.jobs)} jobs; "
                                        f"{new} more would exceed {max_jobs}")


def apply_delete_job(st: StateData, cmd: DeleteJob, *,
                     checked: bool = False) -> dict[str, Any]:
    """``checked``: the caller checked that no job left runs after it (an apply)."""
    rec, at = job_of(st, cmd.job), cmd.at
    if cmd.if_done is not None and (rec.version != cmd.if_done or rec.next_ms is not None
                                    or rec.active or rec.spec.after):
        # The leader's retention of finished one-shot jobs removes only the very
        # version it saw done: a put since, or a run under way, keeps the job.
        raise Conflict(rec.job_id, "no longer the finished version the leader saw")
    if not checked:
        deps.check_removal(st, rec.job_id)
    for run_id in list(rec.active):
        runs.end_run(st, st.runs[run_id], at, RunState.cancelled, "job removed",
                       keep_history=False)
    del st.jobs[rec.job_id]
    st.history.pop(rec.job_id, None)
    st.held_ahead.pop(rec.job_id, None)
    deps.unindex(st, rec.spec)
    conc.untrack(st, rec.job_id, at)
    if st.backfills:
        backfill.job_removed(st, rec.job_id, at)
    st.effects.append(JobRemoved(rec.job_id))
    return {"ok": True, "job": rec.job_id}


def apply_pause(st: StateData, cmd: Pause) -> dict[str, Any]:
    rec, at = job_of(st, cmd.job), cmd.at
    if not rec.spec.paused:
        rec.spec = replace_paused(rec.spec, True)
        rec.version += 1
        rec.updated_ms = at
        # Runs not yet started never start while paused; a started run finishes.
        for run_id in list(rec.active):
            run = st.runs[run_id]
            if run.state != RunState.started.value:
                runs.end_run(st, run, at, RunState.cancelled, MissReason.paused.value)
        st.effects.append(JobPaused(rec.job_id))
    return {"ok": True, "job": rec.job_id, "version": rec.version}


def apply_resume(st: StateData, cmd: Resume) -> dict[str, Any]:
    rec, at = job_of(st, cmd.job), cmd.at
    catch_up, count = cmd.catch_up, cmd.missed
    reply: dict[str, Any] = {"ok": True, "job": rec.job_id}
    if rec.spec.paused:
        rec.spec = replace_paused(rec.spec, False)
        rec.version += 1
        rec.updated_ms = at
        if not catch_up:
            sched = rec.spec.schedule
            first = next_fire(sched, rec.hwm_ms)
            if cmd.v >= HELD_IDS_VERSION:
                # v6: the range and its count from the state and ``at`` (the proposer's
                # count is its own clock's estimate, 0 before it saw the pause), and
                # never a record beside one holding its id.
                skipped = 0
                if first is not None and first <= at:
                    last = latest_fire_at_or_before(sched, rec.hwm_ms, at) or first
                    rest = heldids.skip_held(st, rec, first, last)
                    if rest is not None:
                        skipped = count_fires(sched, rest - 1, last)
                        runs.record_miss(st, rec, rest, last, skipped, RunState.missed,
                                         MissReason.paused.value, at)
                # What was recorded, for the caller's answer (the estimate it sent may
                # differ: its clock, covered fire times).
                reply["missed"] = skipped
            elif first is not None and first <= at and count > 0:  # as v1..v5 did
                until = latest_fire_at_or_before(sched, rec.hwm_ms, at) or first
                runs.record_miss(st, rec, first, until, count, RunState.missed,
                                 MissReason.paused.value, at)
            rec.hwm_ms = max(rec.hwm_ms, at)
        st.set_next(rec, next_fire(rec.spec.schedule, rec.hwm_ms))
        st.effects.append(JobResumed(rec.job_id, catch_up))
        if st.backfills:
            backfill.on_job_change(st, rec.job_id, at)
    reply["version"] = rec.version
    return reply


def apply_trigger(st: StateData, cmd: Trigger) -> dict[str, Any]:
    rec, at, force = job_of(st, cmd.job), cmd.at, cmd.force
    if rec.spec.paused and not force:
        raise Conflict(rec.job_id, "job is paused (use --force to run it anyway)")
    sched = at
    # A manual run id must be new, and must not take the id of a future fire time
    # (the plan creating that fire would overwrite it).
    used = {r.run_id for r in st.history.get(rec.job_id, ())}
    while (run_id_of(rec.job_id, sched) in st.runs
           or run_id_of(rec.job_id, sched) in used
           or (sched > rec.hwm_ms and next_fire(rec.spec.schedule, sched - 1) == sched)):
        sched += 1
    run_id = run_id_of(rec.job_id, sched)
    running = [st.runs[r] for r in rec.active]
    if running and not force:
        overlap = rec.spec.overlap
        if overlap is Overlap.skip:
            raise Conflict(rec.job_id, "previous run still active (overlap = skip; "
                                        "use --force)")
        if overlap is Overlap.queue:
            if any(r.state == RunState.queued.value for r in running):
                raise Conflict(rec.job_id, "a run is already queued (overlap = queue)")
            run = runs.new_run(st, rec, sched, at, manual=True,
                                 state=RunState.queued)
            return {"ok": True, "run_id": run.run_id, "state": run.state}
        if overlap is Overlap.replace:
            for r in running:
                runs.end_run(st, r, at, RunState.cancelled, "replaced by trigger")
    if len(rec.active) >= MAX_ACTIVE_PER_JOB:
        raise LimitExceeded("max_active_runs", f"{rec.job_id} has {len(rec.active)}")
    admitted = conc.admission(st, rec)
    if admitted == FireAction.skip and not force:
        raise Conflict("concurrency", f"key {rec.spec.concurrency.key} is at its max "  # type: ignore[union-attr]
                                      "(policy = skip; use --force to queue it)")
    waits = admitted != FireAction.run
    run = runs.new_run(st, rec, sched, at, manual=True,
                         state=RunState.queued if waits else RunState.pending,
                         reason=CONC_WAIT if waits else "")
    return {"ok": True, "run_id": run_id, "state": run.state}


def job_of(st: StateData, job_id: str) -> JobRecord:
    rec = st.jobs.get(job_id)
    if rec is None:
        raise UnknownJob(job_id)
    return rec


def late_one_shot(spec: JobSpec, rec: JobRecord | None, at: int, v: int) -> int | None:
    """The instant of a new or changed ``at`` schedule that has already passed at the
    put (it fires at once, late), None otherwise; see :func:`late_at`. Every put path
    of the state machine calls it before it changes anything, so it also refuses what
    a command of version ``v`` may not hold: bounds before ``BOUNDS_VERSION``, refused
    as the release that wrote such a command refused them (an unknown field)."""
    if v < DEPS_VERSION:
        sched = spec.schedule
        known = FIELDS_BEFORE_BOUNDS if v < BOUNDS_VERSION else FIELDS_BEFORE_DEPS
        new = [key for key, used in (("after", bool(spec.after)),
                                     ("concurrency", spec.concurrency is not None),
                                     ("end", sched.end_ms is not None),
                                     ("start", sched.start_ms is not None))
               if used and key not in known]
        if new:  # the first unknown key, sorted, as that release named it
            raise InvalidSpec(new[0], unknown_hint("unknown field", new[0], known))
    return late_at(spec, None if rec is None else rec.spec.schedule, at, v)


def late_at(spec: JobSpec, stored: Schedule | None, at: int, v: int) -> int | None:
    """:func:`late_one_shot` of a put of ``spec`` over a job whose schedule is
    ``stored`` (None: a new job). Raise :class:`InvalidSpec` when the ``at`` passed more
    than ``misfire.grace`` ago (it could never run, so nothing would ever record it:
    every fire time ends in exactly one recorded outcome). Commands before
    ``PAST_AT_VERSION`` keep their meaning on replay (such a job never fired). Also
    what a dry run of the put checks, so it refuses what the put would."""
    sched = spec.schedule
    if (v < PAST_AT_VERSION or not isinstance(sched, AtSchedule)
            or sched.at_ms > at
            # The same instant (its bounds may differ): not a new one-shot to run late.
            or (isinstance(stored, AtSchedule) and stored.at_ms == sched.at_ms)):
        return None
    late_ms = at - sched.at_ms
    if late_ms > spec.misfire.grace_ms:
        raise InvalidSpec("schedule.at", f"is {format_duration(late_ms)} in the past, beyond "
                                         f"misfire.grace ({format_duration(spec.misfire.grace_ms)}"
                                         "): it would never run")
    return sched.at_ms


def replace_paused(spec: JobSpec, paused: bool) -> JobSpec:
    return replace(spec, paused=paused)

