"""Failure notifications in the replicated state: who is told what, and whether it was.

Pure. A job's ``notify = { on = [...], url = "..." }`` (or the cluster default, which the
leader commits from its ``[notify]`` config with the ``notify_default`` command) names the
outcomes worth a webhook. When a run ends in one of them (or fire times are recorded
``missed``/``shed``), the same apply that records the outcome adds a pending
:class:`Delivery` carrying the JSON body, so every replica has it: a new leader delivers
what the old one did not. The leader's notifier (``raftsched/node/notifier.py``) posts
due deliveries outside ``raft.lock`` and commits each attempt's result (``notified``):
delivered, retry at a time it chose, or given up. Delivery is **at least once**: a leader
that dies after the receiver answered but before ``delivered`` committed is followed by a
new leader posting the same delivery again, with the same idempotency key.

The per-run delivery status (``notify`` in ``runs``) and the pending deliveries are kept
beside the runs, not inside their rows, so a snapshot stays readable by the release
before this one (it skips the ``notify`` key it does not know).
"""

from __future__ import annotations

import re
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from raftsched.core.effects import NotifyDone, NotifyPending
from raftsched.core.errors import InvalidSpec, unknown_hint

if TYPE_CHECKING:
    from raftsched.core.commands import NotifyDefault, NotifyResults
    from raftsched.core.records import JobRecord, RunRecord
    from raftsched.core.state import ClusterState

#: The outcomes a notification may be asked for.
OUTCOMES = ("failed", "timed_out", "lost", "missed", "shed")
#: Pending deliveries the state holds at most; beyond, the oldest is dropped (recorded
#: ``dropped`` in its run's status and counted in ``totals`` as ``notify_dropped``).
MAX_PENDING = 10_000
#: Runs whose delivery status is remembered (oldest forgotten first).
MAX_STATUS = 50_000
#: Output tail characters carried in a notification body.
BODY_TAIL = 1024
MAX_URL = 2048
_KEYS = frozenset({"on", "url"})
#: scheme://[userinfo@]host[:port][/path?query#fragment] (no I/O, no urllib in the core).
_URL_RE = re.compile(r"(?i)https?://(?:[^/?#@]+@)?(?:[a-z0-9](?:[a-z0-9.-]*[a-z0-9])?"
                     r"|\[[0-9a-f:.]+\])(?::(?P<port>\d{1,5}))?(?:[/?#].*)?\Z")
#: Version of the notification body (``"v"`` in it) and of the snapshot's ``notify`` key.
BODY_VERSION = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class NotifySpec:
    """Where and when to send failure notifications.

    :var on: the outcomes that notify (a subset of :data:`OUTCOMES`; empty: none).
    :var url: the webhook (http or https); None in a job's spec: the cluster default's.
    """

    on: tuple[str, ...] = OUTCOMES
    url: str | None = None

    @classmethod
    def from_spec(cls, value: object, field: str = "notify") -> NotifySpec:
        if not isinstance(value, dict):
            raise InvalidSpec(field, "must be a table/map like { on = [\"failed\"], "
                                     "url = \"https://...\" }")
        unknown = sorted(str(k) for k in value if k not in _KEYS)
        if unknown:
            raise InvalidSpec(f"{field}.{unknown[0][:64]}",
                              unknown_hint("unknown field", unknown[0], _KEYS))
        on = value.get("on", list(OUTCOMES))
        if not isinstance(on, (list, tuple)):
            raise InvalidSpec(f"{field}.on", f"must be a list of {' | '.join(OUTCOMES)}")
        for i, item in enumerate(on):
            if not isinstance(item, str) or item not in OUTCOMES:
                raise InvalidSpec(f"{field}.on[{i}]", unknown_hint(
                    f"must be one of {' | '.join(OUTCOMES)}", str(item), OUTCOMES))
        url = value.get("url")
        if url is not None:
            check_url(url, f"{field}.url")
        return cls(on=tuple(o for o in OUTCOMES if o in on), url=url)

    def to_spec(self) -> dict[str, Any]:
        out: dict[str, Any] = {"on": list(self.on)}
        if self.url is not None:
            out["url"] = self.url
        return out


def check_url(url: object, field: str) -> None:
    """Refuse ``url`` unless it is an http(s) URL with a host (``InvalidSpec(field)``)."""
    if not isinstance(url, str) or not 0 < len(url) <= MAX_URL \
            or any(c.isspace() or not c.isprintable() for c in url):
        raise InvalidSpec(field, f"must be an http(s) URL of at most {MAX_URL} chars")
    m = _URL_RE.match(url)
    if m is None:
        raise InvalidSpec(field, "must be an http:// or https:// URL with a host")
    if m.group("port") is not None and not 0 < int(m.group("port")) < 65536:
        raise InvalidSpec(field, f"port {m.group('port')} out of range 1-65535")


class Delivery:
    """One notification to deliver (pending) — a row of the replicated state.

    :var key: the idempotency key, ``<run_id>/<outcome>`` (a run id names one fire time;
        for missed/shed fire times the first one of this record's range).
    :var run_id: the run record (history entry) it is about.
    :var url: where it goes.
    :var body: the JSON body (a map), fixed when the outcome was recorded.
    :var created_ms: when the outcome was recorded.
    :var attempts: attempts made so far (committed results).
    :var next_ms: not before this instant (the leader's retry backoff).
    :var error: the last attempt's error, or "".
    """

    __slots__ = ("key", "run_id", "url", "body", "created_ms", "attempts", "next_ms", "error")

    def __init__(self, *, key: str, run_id: str, url: str, body: dict[str, Any],
                 created_ms: int, attempts: int = 0, next_ms: int = 0,
                 error: str = "") -> None:
        self.key = key
        self.run_id = run_id
        self.url = url
        self.body = body
        self.created_ms = created_ms
        self.attempts = attempts
        self.next_ms = next_ms
        self.error = error

    def to_row(self) -> list[Any]:
        return [getattr(self, n) for n in self.__slots__]

    @classmethod
    def from_row(cls, row: list[Any]) -> Delivery:
        return cls(**dict(zip(cls.__slots__, row, strict=True)))

    def copy(self) -> Delivery:
        return Delivery.from_row(self.to_row())


class NotifyState:
    """The notification part of :class:`ClusterState` (``st.notify``).

    :var default: the cluster default (committed by the leader from its config), or None.
    :var pending: pending deliveries by key, oldest first.
    :var status: per run id, ``{key, state, attempts, at_ms, error}`` of its latest
        notification (``state``: pending, delivered, failed, dropped).
    """

    def __init__(self) -> None:
        self.default: NotifySpec | None = None
        self.pending: OrderedDict[str, Delivery] = OrderedDict()
        self.status: OrderedDict[str, dict[str, Any]] = OrderedDict()

    def to_snapshot(self) -> dict[str, Any] | None:
        if self.default is None and not self.pending and not self.status:
            return None
        return {"v": BODY_VERSION,
                "default": self.default.to_spec() if self.default else None,
                "pending": [d.to_row() for d in self.pending.values()],
                "status": [[k, v] for k, v in self.status.items()]}

    @classmethod
    def from_snapshot(cls, data: Any) -> NotifyState:
        out = cls()
        if not isinstance(data, dict) or data.get("v") != BODY_VERSION:
            return out
        if data.get("default") is not None:
            out.default = NotifySpec.from_spec(data["default"])
        for row in data.get("pending", ()):
            d = Delivery.from_row(row)
            out.pending[d.key] = d
        for k, v in data.get("status", ()):
            out.status[k] = v
        return out

    def set_status(self, run_id: str, **fields: Any) -> None:
        st = self.status.pop(run_id, None) or {}
        st.update(fields)
        self.status[run_id] = st
        while len(self.status) > MAX_STATUS:
            self.status.popitem(last=False)


# ------------------------------------------------------------------ in apply

def effective(st: ClusterState, rec: JobRecord) -> NotifySpec | None:
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


def on_outcome(st: ClusterState, rec: JobRecord, run: RunRecord, at: int, *,
               first: int | None = None, last: int | None = None,
               count: int = 1) -> None:
    """Called where an outcome is recorded (``end_run``, ``record_miss``): queue a
    delivery if the job wants to hear about it."""
    spec = effective(st, rec)
    if spec is None or run.state not in spec.on or spec.url is None:
        return
    fire = first if first is not None else run.scheduled_ms
    key = f"{rec.spec.id}@{fire}/{run.state}"
    ns = st.notify
    if key in ns.pending:
        return
    body = {"v": BODY_VERSION, "delivery": key, "job_id": rec.spec.id,
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


def apply_notified(st: ClusterState, cmd: NotifyResults) -> dict[str, Any]:
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


def apply_default(st: ClusterState, cmd: NotifyDefault) -> dict[str, Any]:
    """:class:`~raftsched.core.commands.NotifyDefault`: the cluster default (the leader's
    ``[notify]`` config), or none."""
    spec = cmd.spec
    st.notify.default = None if spec is None else NotifySpec.from_spec(spec, "spec")
    return {"ok": True}


def due(st: ClusterState, now_ms: int, skip: set[str], limit: int) -> list[Delivery]:
    """Copies of up to ``limit`` pending deliveries due at ``now_ms`` (not in ``skip``)."""
    out: list[Delivery] = []
    for d in st.notify.pending.values():
        if d.next_ms <= now_ms and d.key not in skip:
            out.append(d.copy())
            if len(out) >= limit:
                break
    return out


__all__ = ["OUTCOMES", "Delivery", "check_url", "NotifySpec", "NotifyState", "apply_default",
           "apply_notified", "due", "effective", "on_outcome"]
