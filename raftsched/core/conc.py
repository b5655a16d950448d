"""Cluster-wide concurrency limits in the state machine (``concurrency = { key, max }``).

The run table counts, per key, the runs holding one of its places (pending, assigned or
started: :attr:`~raftsched.core.runtable.RunTable.holding`) and keeps the runs queued
for one (:attr:`~raftsched.core.runtable.RunTable.waiting`). Here are the two decisions
every replica makes alike from them, inside ``apply``:

* :func:`admission` — a new run of a keyed job takes a place if one is free; else it is
  queued (``policy = queue``: recorded ``queued``, it becomes pending when a run of the
  key ends, oldest first) or skipped (``policy = skip``: recorded ``skipped``, reason
  ``concurrency``).
* :func:`may_place` — a run is assigned to a node only while fewer than ``max`` runs of
  its key hold a claim on a node. The leader's plan respects it too (so it asks for
  nothing the apply would refuse), but the apply is what makes the limit hold, whatever
  leader, or stale copy of the state, made the plan.

Pure: no clock, no I/O.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from raftsched.core.model import FireAction
from raftsched.core.records import stored_spec
from raftsched.core.specext import ConcPolicy

if TYPE_CHECKING:
    from raftsched.core.records import JobRecord, RunRecord
    from raftsched.core.state import StateData

def admission(st: StateData, rec: JobRecord) -> FireAction:
    """What a new run of ``rec`` does now: ``run`` (a place is free, or no key),
    ``queue`` or ``skip`` (its key is full; by its ``policy``)."""
    conc = rec.spec.concurrency
    if conc is None:
        return FireAction.run
    table = st.table
    if len(table.holding.get(conc.key, ())) < table.limit(conc.key):
        return FireAction.run
    return FireAction.skip if conc.policy is ConcPolicy.skip else FireAction.queue


def may_place(st: StateData, run: RunRecord) -> bool:
    """Whether ``run`` may be assigned a node now (its key has a free claim)."""
    table = st.table
    key = table.job_keys.get(run.job_id)
    return key is None or table.on_node(key) < table.limit(key)


def track(st: StateData, rec: JobRecord, at: int) -> None:
    """Index ``rec``'s active runs under its (new) key, after a put."""
    conc = stored_spec(rec).concurrency  # a new job's own spec is not made here
    key = None if conc is None else conc.key
    if key == st.table.job_keys.get(rec.job_id) and (
            key is None or st.table.key_max[key].get(rec.job_id) == conc.max):  # type: ignore[union-attr]
        return
    st.table.set_job_key(rec.job_id, key, 0 if conc is None else conc.max,
                         list(rec.active), at)


def untrack(st: StateData, job_id: str, at: int) -> None:
    """Forget a removed job's key (its runs ended first)."""
    if job_id in st.table.job_keys:
        st.table.set_job_key(job_id, None, 0, [], at)


def key_view(st: StateData) -> list[dict[str, object]]:
    """Each key: its limit, runs on nodes, holding (incl. pending) and queued."""
    table = st.table
    return [{"key": key, "max": table.limit(key), "running": table.on_node(key),
             "holding": len(table.holding.get(key, ())),
             "queued": len(table.waiting.get(key, ())),
             "jobs": sorted(table.key_max[key])}
            for key in sorted(table.key_max)]


__all__ = ["admission", "key_view", "may_place", "track", "untrack"]
