"""msgpack encodings: replicated commands, API frames and state snapshots.

Every persisted or replicated envelope carries ``"v"``; a reader refuses a version
newer than it knows instead of guessing. Snapshots are built from rows in a fixed
order (jobs, runs, nodes sorted by id), so two replicas that applied the same log
produce byte-identical snapshots.
"""

from __future__ import annotations

import contextlib
import gc
import struct
from collections import OrderedDict, deque
from typing import Any

import msgpack

from raftsched.errors import FrameTooLarge, ProtocolError
from raftsched.model import (
    NO_ENV,
    JobSpec,
    MisfirePolicy,
    MisfireSpec,
    OnNodeLost,
    Overlap,
    RetrySpec,
)
from raftsched.records import JobRecord, NodeRecord, RunRecord
from raftsched.state import ClusterState
from raftsched.trigger import Schedule, ScheduleKind

#: Version of replicated commands written by this code.
COMMAND_VERSION = 1
#: Version of state snapshots written by this code.
SNAPSHOT_VERSION = 1
#: Version of API frames.
WIRE_VERSION = 1
FRAME_HEADER = struct.Struct(">I")


def packb(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def unpackb(data: bytes, *, max_len: int | None = None) -> Any:
    """Decode msgpack; every failure (truncated, nested too deep, bad types) becomes a
    :class:`ProtocolError`."""
    if max_len is not None and len(data) > max_len:
        raise ProtocolError(f"message of {len(data)} bytes is over {max_len}")
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=True, use_list=True)
    except Exception as exc:  # noqa: BLE001 - any decoder failure is the sender's fault
        raise ProtocolError(f"undecodable msgpack: {type(exc).__name__}") from None


# ------------------------------------------------------------------ commands

def encode_command(cmd: dict[str, Any]) -> bytes:
    """A command dict (with ``op`` and ``at``) as replicated bytes."""
    return packb(dict(cmd, v=COMMAND_VERSION))


def decode_command(blob: Any) -> dict[str, Any] | None:
    """The command in a log entry, or None if it is not one this code can apply."""
    if not isinstance(blob, (bytes, bytearray)):
        return None
    try:
        cmd = unpackb(bytes(blob))
    except ProtocolError:
        return None
    if not isinstance(cmd, dict) or type(cmd.get("v")) is not int \
            or cmd["v"] != COMMAND_VERSION:
        return None
    return cmd


# ------------------------------------------------------------------ frames

def encode_frame(msg: dict[str, Any]) -> bytes:
    body = packb(msg)
    return FRAME_HEADER.pack(len(body)) + body


def frame_length(header: bytes, limit: int) -> int:
    """The body length announced by a 4-byte header; refuses it before any read."""
    (size,) = FRAME_HEADER.unpack(header)
    if size > limit:
        raise FrameTooLarge(size, limit)
    return size


# ------------------------------------------------------------------ specs as rows
# Rows instead of spec dicts in snapshots: restoring a million jobs must not re-run
# cron validation, and equal sub-records (schedules, policies) are shared in memory.

def spec_to_row(spec: JobSpec) -> list[Any]:
    s = spec.schedule
    return [spec.id, [s.kind.value, s.cron, s.tz, s.every_ms, s.offset_ms, s.at_ms],
            list(spec.command) if spec.command is not None else None, spec.call,
            spec.timeout_ms, spec.overlap.value,
            [spec.misfire.policy.value, spec.misfire.grace_ms, spec.misfire.max_catchup],
            [spec.retries.max, spec.retries.backoff_ms, spec.retries.backoff_max_ms],
            spec.on_node_lost.value, list(spec.tags), spec.jitter_ms, spec.paused,
            dict(spec.env)]


class _Interner:
    """Builds each distinct sub-record once per restore, keyed by its raw row."""

    def __init__(self) -> None:
        self.cache: dict[Any, Any] = {}

    def get(self, key: Any, build: Any) -> Any:
        found = self.cache.get(key)
        if found is None:
            found = self.cache[key] = build()
        return found


_OVERLAP = {m.value: m for m in Overlap}
_LOST = {m.value: m for m in OnNodeLost}


def spec_from_row(row: list[Any], intern: _Interner | None = None) -> JobSpec:
    it = intern or _Interner()
    (job_id, sch, command, call, timeout, overlap, mis, ret, lost, tags, jitter, paused,
     env) = row
    schedule = it.get(("s", *sch), lambda: Schedule(
        kind=ScheduleKind(sch[0]), cron=sch[1], tz=sch[2], every_ms=sch[3], offset_ms=sch[4],
        at_ms=sch[5]))
    misfire = it.get(("m", *mis), lambda: MisfireSpec(
        policy=MisfirePolicy(mis[0]), grace_ms=mis[1], max_catchup=mis[2]))
    retries = it.get(("r", *ret), lambda: RetrySpec(max=ret[0], backoff_ms=ret[1],
                                                    backoff_max_ms=ret[2]))
    return JobSpec(
        id=job_id, schedule=schedule,
        command=it.get(("c", *command), lambda: tuple(command)) if command is not None
        else None, call=call, timeout_ms=timeout, overlap=_OVERLAP[overlap],
        misfire=misfire, retries=retries, on_node_lost=_LOST[lost],
        tags=it.get(("t", *tags), lambda: tuple(tags)) if tags else (), jitter_ms=jitter,
        paused=paused, env=env if env else NO_ENV)


# ------------------------------------------------------------------ snapshots

@contextlib.contextmanager
def _gc_paused() -> Any:
    """Building or walking millions of small objects triggers full collections that
    find nothing (the state is acyclic) and cost more than the work itself."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def encode_state(st: ClusterState) -> bytes:
    """The whole state as versioned msgpack (deterministic for a given state)."""
    with _gc_paused():
        return _encode_state(st)


def _encode_state(st: ClusterState) -> bytes:
    jobs = [[spec_to_row(r.spec), r.version, r.created_ms, r.updated_ms, r.hwm_ms, r.next_ms,
             list(r.active), list(r.last) if r.last else None]
            for _, r in sorted(st.jobs.items())]
    runs = [r.to_row() for _, r in sorted(st.runs.items())]
    history = [[job_id, [r.to_row() for r in hist]]
               for job_id, hist in sorted(st.history.items()) if hist]
    nodes = [n.to_row() for _, n in sorted(st.nodes.items())]
    return packb({
        "v": SNAPSHOT_VERSION,
        "fence": st.fence,
        "applied": st.applied,
        "history_limit": st.history_limit,
        "leader": dict(sorted(st.leader.items())),
        "totals": dict(sorted(st.totals.items())),
        "jobs": jobs,
        "runs": runs,
        "history": history,
        "nodes": nodes,
        "dedupe": [[k, v] for k, v in st.dedupe.items()],
    })


def decode_state(blob: bytes) -> ClusterState:
    """Rebuild a state from :func:`encode_state` bytes; refuses unknown versions."""
    with _gc_paused():
        return _decode_state(blob)


def _decode_state(blob: bytes) -> ClusterState:
    d = unpackb(blob)
    if not isinstance(d, dict) or type(d.get("v")) is not int or d["v"] != SNAPSHOT_VERSION:
        raise ProtocolError(f"snapshot version {d.get('v') if isinstance(d, dict) else '?'} "
                            f"is not {SNAPSHOT_VERSION}")
    st = ClusterState(history_limit=d["history_limit"])
    st.fence = d["fence"]
    st.applied = d["applied"]
    st.leader = d["leader"]
    st.totals = d["totals"]
    intern = _Interner()
    for spec_row, version, created, updated, hwm, nxt, active, last in d["jobs"]:
        spec = spec_from_row(spec_row, intern)
        st.jobs[spec.id] = JobRecord(spec, version=version, created_ms=created,
                                     updated_ms=updated, hwm_ms=hwm, next_ms=nxt,
                                     active=active, last=tuple(last) if last else None)
    for row in d["runs"]:
        run = RunRecord.from_row(row)
        st.runs[run.run_id] = run
    for job_id, rows in d["history"]:
        hist = st.history.setdefault(job_id, deque(maxlen=st.history_limit))
        hist.extend(RunRecord.from_row(r) for r in rows)
    for row in d["nodes"]:
        node = NodeRecord.from_row(row)
        st.nodes[node.node_id] = node
    st.dedupe = OrderedDict((k, v) for k, v in d["dedupe"])
    st.rebuild_indexes()
    return st
