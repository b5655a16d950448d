"""Backfills in the state machine: a job's past fire times run as ordinary runs.

``raftsched job backfill ID --from T1 --to T2`` makes one ``backfill`` command holding the
fire times of the job's schedule in that range (found by the node that took the request,
outside the state lock, from the job version the command names: a job changed since is
refused). Its progress is replicated state (:class:`BackfillRecord`): which fire time is
next and which runs are its own. It moves on inside ``apply`` alone — when it is made,
and whenever a run of its job ends (:func:`on_run_end`, called by ``runs.end_run``) —
so a failover mid-way loses and doubles nothing: the new leader reads the same record.

Each fire time ``T`` runs once as run ``<job>@<T>``: one already recorded (its id in the
job's history, or ``T`` within the span the job's mark has accounted for) is counted as
``skipped`` unless ``rerun``, which makes it a new *attempt* of that run id (attempt =
the last recorded attempt + 1; the fence is new). A fire time above the job's mark is
the schedule's own to run (counted ``later``).

Throttled: at most ``max_active`` runs of a backfill are active at once; the leader places
them only on idle worker slots, after the on-time runs of its plan, and the schedule's
overlap decisions do not see them, so a backfill never starves on-time runs. Its
``overlap`` is about the job's on-time runs: ``allow`` runs beside them, ``skip`` records
the fire time ``skipped`` while one is active, ``queue`` waits until none is.
Pure: no clock, no I/O.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from raftsched.core import deps, runs
from raftsched.core.errors import Conflict, InvalidArgument, LimitExceeded, RaftschedError
from raftsched.core.model import MissReason, Overlap, RunState, run_id_of
from raftsched.core.records import (
    CANCELLED,
    DONE,
    KEPT_FINISHED,
    MAX_ACTIVE,
    MAX_FIRES,
    MAX_RUNNING,
    OVERLAPS,
    RUNNING,
    BackfillRecord,
)

if TYPE_CHECKING:
    from raftsched.core.clientcmds import Backfill, BackfillCancel
    from raftsched.core.records import JobRecord, RunRecord
    from raftsched.core.state import StateData

# ---------------------------------------------------------------- commands

def apply_backfill(st: StateData, cmd: Backfill) -> dict[str, Any]:
    """Make a backfill and start its first runs (see the module docstring)."""
    rec = st.jobs.get(cmd.job)
    if rec is None:
        from raftsched.core.errors import UnknownJob
        raise UnknownJob(cmd.job)
    if rec.version != cmd.version:
        raise Conflict(cmd.job, f"changed since its fire times were found (version "
                                f"{rec.version}, not {cmd.version}); run backfill again")
    if rec.spec.after:
        raise Conflict("after", f"{cmd.job} has no schedule of its own (it runs after "
                                f"{', '.join(rec.spec.after)}): backfill its parents")
    check_fires(cmd.fires, cmd.from_ms, cmd.to_ms, cmd.at)
    running = sum(1 for b in st.backfills.values() if b.status == RUNNING)
    if running >= MAX_RUNNING:
        raise LimitExceeded("backfills", f"{running} backfills are running (at most "
                                         f"{MAX_RUNNING}); wait or cancel one")
    st.backfill_seq += 1
    bf = BackfillRecord(id=f"bf-{st.backfill_seq}", job=cmd.job, from_ms=cmd.from_ms,
                        to_ms=cmd.to_ms, fires=tuple(cmd.fires), overlap=cmd.overlap,
                        max_active=cmd.max_active, rerun=cmd.rerun, created_ms=cmd.at)
    st.backfills[bf.id] = bf
    advance(st, bf, cmd.at)
    return {"ok": True, "backfill": bf.view()}


def check_fires(fires: tuple[int, ...], from_ms: int, to_ms: int, at: int) -> None:
    """The fire times a command carries: ascending, in range, past, bounded."""
    if not 0 < len(fires) <= MAX_FIRES:
        raise InvalidArgument("to", f"a backfill holds 1..{MAX_FIRES} fire times; split "
                                    f"the range")
    if from_ms > to_ms or to_ms > at:
        raise InvalidArgument("to", "must not be before from, nor in the future")
    prev = from_ms - 1
    for t in fires:
        if not prev < t <= to_ms:
            raise InvalidArgument("fires", "must ascend within from..to")
        prev = t


def apply_cancel(st: StateData, cmd: BackfillCancel) -> dict[str, Any]:
    """Cancel a backfill: no further fire time starts, its runs not yet started are
    recorded ``cancelled`` (a started one finishes and is counted)."""
    bf = st.backfills.get(cmd.backfill)
    if bf is None:
        raise InvalidArgument("backfill", f"no backfill {cmd.backfill!r}")
    if bf.status == RUNNING:
        finish(st, bf, CANCELLED, cmd.at, "cancelled")
        for run_id in list(bf.active):
            run = st.runs.get(run_id)
            if run is not None and run.state != RunState.started.value:
                runs.end_run(st, run, cmd.at, RunState.cancelled, f"backfill {bf.id} "
                                                                     "cancelled")
    return {"ok": True, "backfill": bf.view()}


# ---------------------------------------------------------------- progress

def on_run_end(st: StateData, rec: JobRecord, run: RunRecord, at: int) -> None:
    """A run of ``rec`` ended: count it for its backfill, and let the job's running
    backfills move on (a freed place, or no on-time run left to wait for)."""
    bf_id = st.bf_runs.pop(run.run_id, None)
    if bf_id is not None:
        bf = st.backfills.get(bf_id)
        if bf is not None:
            if run.run_id in bf.active:
                bf.active.remove(run.run_id)
            bf.counts[run.state] = bf.counts.get(run.state, 0) + 1
    if st.backfills:
        for bf in list(st.backfills.values()):
            if bf.status == RUNNING and bf.job == rec.job_id:
                advance(st, bf, at)


def on_job_change(st: StateData, job_id: str, at: int) -> None:
    """The job was resumed or removed: its backfills move on or end."""
    for bf in list(st.backfills.values()):
        if bf.status == RUNNING and bf.job == job_id:
            advance(st, bf, at)


def advance(st: StateData, bf: BackfillRecord, at: int) -> None:
    """Start fire times of ``bf`` while it has room (bounded: its fire times)."""
    if bf.status != RUNNING:
        return
    rec = st.jobs.get(bf.job)
    if rec is None:
        for run_id in bf.active:
            st.bf_runs.pop(run_id, None)
        bf.active = []
        finish(st, bf, CANCELLED, at, "job removed")
        return
    if rec.spec.paused:
        return  # resumes with the job
    known = _recorded(st, rec)
    while len(bf.active) < bf.max_active and bf.pos < len(bf.fires):
        t = bf.fires[bf.pos]
        run_id = run_id_of(rec.job_id, t)
        if t > rec.hwm_ms:
            _count(bf, "later")  # the schedule's own to run
        elif run_id in st.runs:
            _count(bf, "skipped")  # running now
        else:
            prev = known.get(t)
            if prev is None and rec.created_ms < t:
                prev = 0  # accounted for by the mark, its record no longer kept
            if prev is not None and not bf.rerun:
                _count(bf, "skipped")
            else:
                on_time = [r for r in rec.active if r not in st.bf_runs]
                if on_time and bf.overlap == Overlap.queue:
                    return  # waits for the job's on-time run to end
                if on_time and bf.overlap == Overlap.skip:
                    runs.record_miss(st, rec, t, t, 1, RunState.skipped,
                                       MissReason.overlap.value, at)
                    _count(bf, "skipped_overlap")
                else:
                    made = deps.create_run(st, rec, t, at, overlap=Overlap.allow,
                                           note=f"backfill {bf.id}",
                                           attempt=1 if prev is None else max(prev, 1) + 1)
                    if made is not None:
                        bf.active.append(made.run_id)
                        st.bf_runs[made.run_id] = bf.id
                        _count(bf, "created")
                    else:
                        _count(bf, "recorded")
        bf.pos += 1
    if bf.pos >= len(bf.fires) and not bf.active:
        finish(st, bf, DONE, at, "")


def _recorded(st: StateData, rec: JobRecord) -> dict[int, int]:
    """Fire time -> its last recorded attempt, from the job's kept history (a missed
    range counts for each fire time it covers: looked up by :func:`_covers`)."""
    out: dict[int, int] = {}
    for r in st.history.get(rec.job_id, ()):
        out[r.scheduled_ms] = max(out.get(r.scheduled_ms, 0), r.attempt)
        if r.until_ms is not None:
            out[r.until_ms] = max(out.get(r.until_ms, 0), r.attempt)
    return out


def _count(bf: BackfillRecord, what: str) -> None:
    bf.counts[what] = bf.counts.get(what, 0) + 1


def finish(st: StateData, bf: BackfillRecord, state: str, at: int, reason: str) -> None:
    """End ``bf`` and drop the oldest finished backfills beyond ``KEPT_FINISHED``."""
    bf.status, bf.finished_ms, bf.reason = state, at, reason
    finished = [b.id for b in st.backfills.values() if b.status != RUNNING]
    for old in finished[:-KEPT_FINISHED] if len(finished) > KEPT_FINISHED else ():
        for run_id in st.backfills[old].active:
            st.bf_runs.pop(run_id, None)
        del st.backfills[old]


def job_removed(st: StateData, job_id: str, at: int) -> None:
    """The job was deleted (its runs ended without history): its backfills end."""
    on_job_change(st, job_id, at)




def to_snapshot(st: StateData) -> dict[str, Any]:
    """The ``backfills`` key (only when there is one: a state without keeps its bytes)."""
    if not st.backfills:
        return {}
    return {"backfills": {"seq": st.backfill_seq,
                          "items": [b.to_row() for b in st.backfills.values()]}}


def restore(st: StateData, data: Any) -> None:
    if not isinstance(data, dict):
        return
    st.backfill_seq = data["seq"]
    for row in data["items"]:
        bf = BackfillRecord.from_row(row)
        st.backfills[bf.id] = bf


def views(st: StateData) -> list[dict[str, Any]]:
    """Every kept backfill, newest first."""
    return [b.view() for b in reversed(st.backfills.values())]


__all__ = ["CANCELLED", "DONE", "KEPT_FINISHED", "MAX_ACTIVE", "MAX_FIRES", "MAX_RUNNING",
           "OVERLAPS", "RUNNING", "BackfillRecord", "RaftschedError", "advance",
           "apply_backfill", "apply_cancel", "check_fires", "on_job_change", "on_run_end",
           "restore", "to_snapshot", "views"]
