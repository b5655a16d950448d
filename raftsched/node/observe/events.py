"""Structured events: one JSON line per meaningful action, through ``logging``.

Events go to the ``raftsched.events`` logger so users route them like any log. An
event names its kind, the node that saw it, the ``run_id`` as correlation id, the
outcome and a few scalar details — never env values, specs, payloads or secrets:
:func:`emit` accepts only scalar detail values and drops keys that look sensitive.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from raftsched.core.effects import (
    Effect,
    FireCovered,
    JobPaused,
    JobPut,
    JobRemoved,
    JobResumed,
    LeaderChanged,
    NodeBack,
    NodeCertified,
    NodeLost,
    RangeMissed,
    RunAssigned,
    RunEnded,
    RunStarted,
)

log = logging.getLogger("raftsched.events")

#: Detail keys never written, whatever a caller passes (defence in depth).
_SENSITIVE = ("secret", "password", "env", "token", "mac", "nonce", "spec", "args", "tail")


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    """One structured event.

    :var ts_ms: when the emitting node saw it (its wall clock, epoch ms).
    :var event: the kind, e.g. ``run.started``, ``node.lost``, ``leader.changed``.
    :var node: the node that emitted it.
    :var run_id: the correlation id, when the event concerns a run.
    :var job_id: the job, when it concerns one.
    :var outcome: a run state or result, when there is one.
    :var detail: scalar extras (fence, attempt, reason, lag_ms ...).
    """

    ts_ms: int
    event: str
    node: str
    run_id: str | None = None
    job_id: str | None = None
    outcome: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        d = asdict(self)
        detail = d.pop("detail")
        d = {k: v for k, v in d.items() if v is not None}
        d.update(detail)
        return json.dumps(d, separators=(",", ":"), default=str)


def _clean(detail: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in detail.items():
        if any(s in key.lower() for s in _SENSITIVE):
            continue
        if value is None or isinstance(value, (bool, int, float)):
            out[key] = value
        elif isinstance(value, str):
            out[key] = value[:200]
        elif isinstance(value, (list, tuple)) and all(isinstance(v, (str, int)) for v in value):
            out[key] = list(value)[:50]
    return out


def emit(event: str, *, node: str, run_id: str | None = None, job_id: str | None = None,
         outcome: str | None = None, level: int = logging.INFO, **detail: Any) -> None:
    """Write one event (cheap when the events logger is disabled for ``level``)."""
    if not log.isEnabledFor(level):
        return
    if job_id is None and run_id is not None:
        job_id = run_id.rpartition("@")[0] or None
    ev = Event(ts_ms=time.time_ns() // 1_000_000, event=event, node=node, run_id=run_id,
               job_id=job_id, outcome=outcome, detail=_clean(detail))
    log.log(level, "%s", event, extra={"rs_event": ev})


class JsonFormatter(logging.Formatter):
    """Events as their JSON line; other records as ``{ts_ms, level, logger, msg}``."""

    def format(self, record: logging.LogRecord) -> str:
        ev = getattr(record, "rs_event", None)
        if ev is not None:
            return ev.to_json()
        d: dict[str, Any] = {"ts_ms": int(record.created * 1000), "level": record.levelname,
                             "logger": record.name, "msg": record.getMessage()}
        if record.exc_info:
            d["exc"] = self.formatException(record.exc_info)
        return json.dumps(d, separators=(",", ":"), default=str)


class TextFormatter(logging.Formatter):
    """A readable line: ``time level event key=value ...``."""

    def format(self, record: logging.LogRecord) -> str:
        ev = getattr(record, "rs_event", None)
        stamp = time.strftime("%H:%M:%S", time.gmtime(record.created))
        stamp += f".{int(record.msecs):03d}"
        if ev is None:
            text = f"{stamp} {record.levelname.lower()} {record.name}: {record.getMessage()}"
            if record.exc_info:
                text += "\n" + self.formatException(record.exc_info)
            return text
        parts = [stamp, ev.event, f"node={ev.node}"]
        if ev.run_id:
            parts.append(f"run={ev.run_id}")
        elif ev.job_id:  # job.put/paused/removed/resumed: the job is what they are about
            parts.append(f"job={ev.job_id}")
        if ev.outcome:
            parts.append(f"outcome={ev.outcome}")
        parts.extend(f"{k}={v}" for k, v in ev.detail.items())
        return " ".join(parts)


#: Effects shown in the live feed (the HTTP event stream), and their event names.
_FEED: dict[type, str] = {
    RunAssigned: "run.assigned", RunStarted: "run.started", RunEnded: "run.ended",
    RangeMissed: "run.missed", FireCovered: "run.covered", LeaderChanged: "leader.changed",
    NodeLost: "node.lost",
    NodeCertified: "node.certified",
    NodeBack: "node.back", JobPut: "job.put", JobRemoved: "job.removed",
    JobPaused: "job.paused", JobResumed: "job.resumed"}


def feed_event(eff: Effect, *, node: str, seq: int, ts_ms: int) -> dict[str, Any] | None:
    """The live-feed form of a state-machine effect, or None for effects not shown. Every
    node sees every committed effect, so any node's feed shows the whole cluster."""
    name = _FEED.get(type(eff))
    if name is None:
        return None
    ev: dict[str, Any] = {"seq": seq, "ts_ms": ts_ms, "event": name, "node": node}
    if isinstance(eff, RunStarted):
        # A start is committed up to the lookahead before its fire time and the run is
        # spawned at the fire time: the feed says when it runs, and when it was committed.
        due = _scheduled(eff.run_id)
        if due is not None and due > ts_ms:
            ev.update(ts_ms=due, committed_ms=ts_ms)
    match eff:
        case RunAssigned(run_id, on, fence) | RunStarted(run_id, on, fence):
            ev.update(run_id=run_id, on=on, fence=fence)
        case RunEnded(run_id, state, on, reason):
            ev.update(run_id=run_id, outcome=state, on=on, reason=str(reason)[:200])
        case RangeMissed(run_id, state, reason, _, _, count):
            ev.update(run_id=run_id, outcome=state, reason=str(reason)[:200], count=count)
        case FireCovered(run_id):
            ev.update(run_id=run_id, reason="a kept record holds its run id")
        case LeaderChanged(leader, term):
            ev.update(leader=leader, term=term)
        case NodeLost(subject, _) | NodeBack(subject):
            ev.update(subject=subject)
        case NodeCertified(subject, boot, by, released):
            ev.update(subject=subject, incarnation=boot, by=by, released=released)
        case JobPut(job_id, _, _) | JobRemoved(job_id) | JobPaused(job_id) | \
                JobResumed(job_id, _):
            ev.update(job_id=job_id)
    if "run_id" in ev:
        ev["job_id"] = str(ev["run_id"]).rpartition("@")[0]
    return ev


def _scheduled(run_id: str) -> int | None:
    tail = str(run_id).rpartition("@")[2]
    return int(tail) if tail.isdigit() else None


def configure(level: str = "info", fmt: str = "json", stream: Any = None) -> None:
    """Install one handler on the root logger (only the CLI calls this)."""
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper(), logging.INFO))
    # pysyncobj logs every reconnect attempt at warning; keep it quieter.
    logging.getLogger("pysyncobj").setLevel(logging.ERROR)
