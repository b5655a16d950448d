"""What a notification is, as data: the ``notify`` spec a job (or the cluster default)
carries, and the deliveries the replicated state owes (:class:`NotifyState`).

Pure data at the bottom of the core: the apply-time logic that fills these in lives in
:mod:`raftsched.core.notify`.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from raftsched.core.errors import InvalidSpec, unknown_hint

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


__all__ = ["BODY_TAIL", "BODY_VERSION", "MAX_PENDING", "MAX_STATUS", "MAX_URL", "OUTCOMES",
           "Delivery", "NotifySpec", "NotifyState", "check_url"]
