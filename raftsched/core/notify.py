"""Failure notifications in the replicated state: who is told what, and whether it was.

Pure. A job's ``notify = { on = [...], url = "..." }`` (or the cluster default, which the
leader commits from its ``[notify]`` config with the ``notify_default`` command) names the
outcomes worth a webhook. When a run ends in one of them (or fire times are recorded
``missed``/``shed``), the same apply that records the outcome adds a pending
:class:`Delivery` carrying the JSON body, so every replica has it: a new leader delivers
what the old one did not. The leader's notifier (``raftsched/node/leader/notifier.py``) posts
due deliveries outside ``raft.lock`` and commits each attempt's result (``notified``):
delivered, retry at a time it chose, or given up. Delivery is **at least once**: a leader
that dies after the receiver answered but before ``delivered`` committed is followed by a
new leader posting the same delivery again, with the same idempotency key.

The per-run delivery status (``notify`` in ``runs``) and the pending deliveries are kept
beside the runs, not inside their rows, so a snapshot stays readable by the release
before this one (it skips the ``notify`` key it does not know).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from raftsched.core.effects import NotifyDone, NotifyPending
from raftsched.core.notifydata import BODY_TAIL, BODY_VERSION, MAX_PENDING, Delivery, NotifySpec

if TYPE_CHECKING:
    from raftsched.core.commands import NotifyDefault, NotifyResults
    from raftsched.core.records import JobRecord, RunRecord
    from raftsched.core.state import StateData

# ------------------------------------------------------------------ in apply

def effective(st: StateData, rec: JobRecord) -> NotifySpec | None:
    """The job's notify spec with the cluster default filled in (None: nobody to tell)."""
    own: NotifySpec | None = rec.spec.notify
    default = st.notify.default
    if own is None:
        return default if default is not None and default.url else None
    if own.url is None:
        if default is None or not default.url:
            return None
        return NotifySpec(on=own.on, url=default.url)
    return own


def on_outcome(st: StateData, rec: JobRecord, run: RunRecord, at: int, *,
               first: int | None = None, last: int | None = None,
               count: int = 1) -> None:
    """Called where an outcome is recorded (``end_run``, ``record_miss``): queue a
    delivery if the job wants to hear about it."""
    spec = effective(st, rec)
    if spec is None or run.state not in spec.on or spec.url is None:
        return
    fire = first if first is not None else run.scheduled_ms
    key = f"{rec.job_id}@{fire}/{run.state}"
    ns = st.notify
    if key in ns.pending:
        return
    body = {"v": BODY_VERSION, "delivery": key, "job_id": rec.job_id,
            "outcome": run.state, "at_ms": at, "run": _run_body(run)}
    if first is not None:
        body["fire_times"] = {"first_ms": first, "last_ms": last, "count": count}
    ns.pending[key] = Delivery(key=key, run_id=run.run_id, url=spec.url, body=body,
                               created_ms=at, next_ms=at)
    ns.set_status(run.run_id, key=key, state="pending", attempts=0, at_ms=at, error="")
    st.effects.append(NotifyPending(key))
    while len(ns.pending) > MAX_PENDING:
        _, old = ns.pending.popitem(last=False)
        ns.set_status(old.run_id, key=old.key, state="dropped", at_ms=at,
                      error=f"more than {MAX_PENDING} notifications pending")
        st.totals["notify_dropped"] = st.totals.get("notify_dropped", 0) + 1


def _run_body(run: RunRecord) -> dict[str, Any]:
    d = run.to_dict()
    d.pop("transitions", None)
    d["tail"] = (d.get("tail") or "")[-BODY_TAIL:]
    return d


def apply_notified(st: StateData, cmd: NotifyResults) -> dict[str, Any]:
    """:class:`~raftsched.core.commands.NotifyResults`, the leader's results of delivery
    attempts ``(key, ok, error, next_ms)``: ``ok``: delivered; else retry not before
    ``next_ms``, or (``next_ms`` None) give up. A key no longer pending (a result
    committed twice) is skipped."""
    ns = st.notify
    at = cmd.at
    done = 0
    for key, ok, error, next_ms in cmd.items:
        d = ns.pending.get(key)
        if d is None:
            continue
        d.attempts += 1
        d.error = error[:200]
        done += 1
        if ok or next_ms is None:
            del ns.pending[key]
            state = "delivered" if ok else "failed"
            st.totals[f"notify_{state}"] = st.totals.get(f"notify_{state}", 0) + 1
            st.effects.append(NotifyDone(key, state, d.attempts))
        else:
            d.next_ms = next_ms
            state = "pending"
        ns.set_status(d.run_id, key=key, state=state, attempts=d.attempts, at_ms=at,
                      error="" if ok else d.error)
    return {"ok": True, "applied": done}


def apply_default(st: StateData, cmd: NotifyDefault) -> dict[str, Any]:
    """:class:`~raftsched.core.commands.NotifyDefault`: the cluster default (the leader's
    ``[notify]`` config), or none."""
    spec = cmd.spec
    st.notify.default = None if spec is None else NotifySpec.from_spec(spec, "spec")
    return {"ok": True}


def due(st: StateData, now_ms: int, skip: set[str], limit: int) -> list[Delivery]:
    """Copies of up to ``limit`` pending deliveries due at ``now_ms`` (not in ``skip``)."""
    out: list[Delivery] = []
    for d in st.notify.pending.values():
        if d.next_ms <= now_ms and d.key not in skip:
            out.append(d.copy())
            if len(out) >= limit:
                break
    return out


__all__ = ["apply_default", "apply_notified", "due", "effective", "on_outcome"]
