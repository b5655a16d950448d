"""Fire times whose run id a kept run already holds.

A run id is ``<job>@<scheduled_ms>``, and a fire time is planned only above the job's
mark. Two things can put a kept record above the mark: a manual run (``trigger``
stamps its instant, so a node whose clock is ahead makes one a few seconds ahead; the
trigger steps past the fire times of the schedule it sees, not those of a schedule put
later), and a put of a one-shot ``at`` already past, which lowers the mark to its
instant (a run of the old schedule may hold that very id). If the job's schedule then
fires at that instant, its run would take an id a kept record holds: two records, one
id. Instead the fire time is *covered*: accounted for by the record that holds its id
(the mark rises past it, no run is made, ``FireCovered`` says so), and a missed range
that would start on it starts after it. A plan that covers one, and a resume, are
written as command version 6 (``HELD_IDS_VERSION``) only once every member lists
``runids``; before that they are written, and applied, as older releases did.

``StateData.held_ahead`` is a filter, not state: job -> the latest instant a record of
the job was made for above its mark (or after a put lowered the mark). A job absent
from it holds nothing above its mark, so the hot paths pay one dict lookup; the answer
itself always comes from the kept records (the same on every replica), never from the
filter. Rebuilt on restore (``StateData.refresh_held``), never snapshotted.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from raftsched.core.commands import RunFire
from raftsched.core.effects import FireCovered
from raftsched.core.model import run_id_of
from raftsched.core.trigger import next_fire

if TYPE_CHECKING:
    from raftsched.core.commands import Plan
    from raftsched.core.records import JobRecord
    from raftsched.core.state import StateData

#: No instant is held.
NONE: frozenset[int] = frozenset()


def note(st: StateData, rec: JobRecord, sched: int) -> None:
    """A record of ``rec`` is being made for ``sched``: remember it if above the mark."""
    if sched > rec.hwm_ms:
        job = rec.job_id
        if sched > st.held_ahead.get(job, sched - 1):
            st.held_ahead[job] = sched


def held(st: StateData, rec: JobRecord) -> frozenset[int]:
    """The instants above ``rec``'s mark whose run id a kept record holds. The leader
    calls it under the state lock while it copies a plan's input (a read), and it may
    drop the job's filter entry: derived data, the same answer on every replica."""
    top = st.held_ahead.get(rec.job_id)
    if top is None:
        return NONE
    if top <= rec.hwm_ms:  # the mark has passed them all
        del st.held_ahead[rec.job_id]
        return NONE
    return frozenset(st.held_above(rec))


def covers(st: StateData, rec: JobRecord, sched: int) -> bool:
    """Whether a kept record of ``rec`` holds the run id of fire time ``sched``."""
    top = st.held_ahead.get(rec.job_id)
    if top is None or sched > top:
        return False
    run_id = run_id_of(rec.job_id, sched)
    return run_id in st.runs or any(r.run_id == run_id
                                    for r in st.history.get(rec.job_id, ()))


def covered_in(st: StateData, plan: Plan) -> set[tuple[str, int]]:
    """The run items of a version 6 plan whose fire time a kept record holds, found
    before any item applies (an earlier item's record could push the holder out of a
    short history; what the leader meant to cover stays covered)."""
    out: set[tuple[str, int]] = set()
    for item in plan.fires:
        if isinstance(item, RunFire):
            rec = st.jobs.get(item.job)
            if rec is not None and item.scheduled_ms > rec.hwm_ms \
                    and covers(st, rec, item.scheduled_ms):
                out.add((item.job, item.scheduled_ms))
    return out


def skip_held(st: StateData, rec: JobRecord, first: int, last: int) -> int | None:
    """A missed range ``first..last`` about to be recorded: its leading fire times whose
    id a kept record holds are covered (an effect each). Returns where the range now
    starts, or None when nothing is left of it."""
    cur: int | None = first
    while cur is not None and cur <= last and covers(st, rec, cur):
        st.effects.append(FireCovered(run_id_of(rec.job_id, cur)))
        cur = next_fire(rec.spec.schedule, cur)
    return None if cur is None or cur > last else cur


__all__ = ["NONE", "covered_in", "covers", "held", "note", "skip_held"]
