"""msgpack encodings: replicated commands and state snapshots (API frames: ``wire.framing``).

Every persisted or replicated envelope carries ``"v"``; a reader refuses a version
newer than it knows instead of guessing. Snapshots are built from rows in a fixed
order (jobs, runs, nodes sorted by id), so two replicas that applied the same log
produce byte-identical snapshots.
"""

from __future__ import annotations

from collections import deque
from dataclasses import replace
from typing import Any

import msgpack

from raftsched.core import backfill
from raftsched.core.commands import COMMAND_VERSION, COMMAND_VERSIONS, Command
from raftsched.core.errors import ProtocolError
from raftsched.core.httpspec import HttpSpec
from raftsched.core.machine import ClusterState
from raftsched.core.model import (
    NO_ENV,
    JobSpec,
    MisfirePolicy,
    MisfireSpec,
    OnNodeLost,
    Overlap,
    RetrySpec,
)
from raftsched.core.notifydata import BODY_VERSION as NOTIFY_VERSION
from raftsched.core.notifydata import NotifySpec, NotifyState
from raftsched.core.packing import packb, unpackb
from raftsched.core.records import JobRecord, Leadership, MemberRecord, NodeRecord, RunRecord
from raftsched.core.specext import ConcurrencySpec, DepOn
from raftsched.core.trigger import AtSchedule, bounded, schedule_from_row, schedule_to_row

#: Version of state snapshots written by this code. Keys added to a snapshot without
#: changing the meaning of the others keep the version (readers skip keys they do not
#: know); a change an older reader would misread takes a new version.
#: 2: a job's spec row may end in its schedule's bounds ``[start_ms, end_ms]``. Written
#: only when some job has bounds (a state without them is written as version 1, byte for
#: byte as before), so a release that would read the jobs unbounded stops instead.
#: 3: a job's spec row may end in ``[bounds or None, ext]`` where ``ext`` holds its
#: ``after``/``on``/``concurrency``, and the state may hold ``backfills``. Written only
#: when some job uses them or a backfill is kept (else as version 2 or 1, byte for byte
#: as before), so a release that would read such jobs as scheduled ones, or drop the
#: backfills, stops instead.
SNAPSHOT_VERSION = 3
#: The version of snapshots in which some job has bounds (and nothing of version 3).
BOUNDED_SNAPSHOT_VERSION = 2
#: The version of snapshots in which no job has bounds.
UNBOUNDED_SNAPSHOT_VERSION = 1
#: Versions of state snapshots this code reads.
SNAPSHOT_VERSIONS = frozenset({1, 2, 3})


# ------------------------------------------------------------------ commands

def encode_command(cmd: Command | dict[str, Any]) -> bytes:
    """A command (or its map, with ``op`` and ``at``) as replicated bytes."""
    if isinstance(cmd, Command):
        return cmd.encode()
    return packb(dict(cmd, v=COMMAND_VERSION))


def _command_map(blob: Any) -> dict[str, Any] | None:
    """The msgpack map in a log entry with an integer ``v``, else None."""
    if not isinstance(blob, (bytes, bytearray)):
        return None
    try:
        cmd = unpackb(bytes(blob))
    except ProtocolError:
        return None
    return cmd if isinstance(cmd, dict) and type(cmd.get("v")) is int else None


def decode_command(blob: Any) -> dict[str, Any] | None:
    """The command in a log entry, or None if it is not one this code can apply."""
    cmd = _command_map(blob)
    return cmd if cmd is not None and cmd["v"] in COMMAND_VERSIONS else None


def unknown_command_version(blob: Any) -> int | None:
    """The format version of a raftsched command this code does not know (a newer
    release wrote it), else None (a known command, or no command at all)."""
    cmd = _command_map(blob)
    return int(cmd["v"]) if cmd is not None and cmd["v"] not in COMMAND_VERSIONS else None


def format_problem(what: str, version: Any, known: frozenset[int]) -> str:
    """The message a node gives when it meets a ``what`` format it cannot read."""
    lo, hi = min(known), max(known)
    span = f"v{lo}" if lo == hi else f"v{lo}..v{hi}"
    if type(version) is int and version > hi:
        return (f"{what} format v{version} was written by a newer raftsched; this release "
                f"reads {span}: upgrade raftsched on this node")
    return f"{what} format {version!r:.20} is not one this release reads ({span})"


# ------------------------------------------------------------------ specs as rows
# Rows instead of spec dicts in snapshots: restoring a million jobs must not re-run
# cron validation, and equal sub-records (schedules, policies) are shared in memory.

def spec_to_row(spec: JobSpec) -> list[Any]:
    sched = spec.schedule
    row = [spec.id, schedule_to_row(sched),
           list(spec.command) if spec.command is not None else None, spec.call,
           spec.timeout_ms, spec.overlap.value,
           [spec.misfire.policy.value, spec.misfire.grace_ms, spec.misfire.max_catchup],
           [spec.retries.max, spec.retries.backoff_ms, spec.retries.backoff_max_ms],
           spec.on_node_lost.value, list(spec.tags), spec.jitter_ms, spec.paused,
           dict(spec.env)]
    bounds = sched.start_ms is not None or sched.end_ms is not None
    ext = _ext_row(spec)
    if bounds or ext:
        # Only then (snapshot version 2): an unbounded job's row is the 13 values it was.
        row.append([sched.start_ms, sched.end_ms] if bounds else None)
    if ext:
        row.append(ext)  # only then (snapshot version 3)
    return row


def _ext_row(spec: JobSpec) -> dict[str, Any] | None:
    """A spec's third-wave fields as a row's 15th value, None when it has none."""
    ext: dict[str, Any] = {}
    if spec.after:
        ext["after"] = list(spec.after)
        ext["on"] = spec.on.value
    if spec.concurrency is not None:
        ext["conc"] = spec.concurrency.to_row()
    return ext or None


def uses_v3(spec: JobSpec) -> bool:
    """Whether a job's row needs snapshot version 3."""
    return bool(spec.after) or spec.concurrency is not None


class _Interner:
    """Builds each distinct sub-record once per restore, keyed by its raw row, and
    shares equal strings and integers: msgpack makes a fresh object for every value
    it decodes, so a restored million-job state would otherwise hold a million copies
    of the same call string (64 bytes each) and of each timestamp (32 bytes)."""

    #: Bound on the value cache (cleared when reached): most distinct values are
    #: met again within a few rows (jobs sorted by id were mostly put together).
    LIMIT = 100_000

    def __init__(self) -> None:
        self.cache: dict[Any, Any] = {}
        self.values: dict[Any, Any] = {}

    def get(self, key: Any, build: Any) -> Any:
        found = self.cache.get(key)
        if found is None:
            found = self.cache[key] = build()
        return found

    def share(self, value: Any) -> Any:
        """An equal object met before, else ``value``. Exact ints and strings only (no
        int equals a string): a bool or a float must not come back as an equal int."""
        if type(value) is not int and type(value) is not str:
            return value
        values = self.values
        if len(values) >= self.LIMIT:
            values.clear()
        return values.setdefault(value, value)


_OVERLAP = {m.value: m for m in Overlap}
_LOST = {m.value: m for m in OnNodeLost}


def spec_from_row(row: list[Any], intern: _Interner | None = None) -> JobSpec:
    it = intern or _Interner()
    (job_id, sch, command, call, timeout, overlap, mis, ret, lost, tags, jitter, paused,
     env) = row[:13]
    if len(row) > 13 and row[13] is not None:
        start, end = row[13]
        schedule = it.get(("s", *sch, start, end),
                          lambda: bounded(schedule_from_row(sch), start, end))
    else:
        schedule = it.get(("s", *sch), lambda: schedule_from_row(sch))
    ext = row[14] if len(row) > 14 else None
    misfire = it.get(("m", *mis), lambda: MisfireSpec(
        policy=MisfirePolicy(mis[0]), grace_ms=mis[1], max_catchup=mis[2]))
    retries = it.get(("r", *ret), lambda: RetrySpec(max=ret[0], backoff_ms=ret[1],
                                                    backoff_max_ms=ret[2]))
    return JobSpec(
        id=job_id, schedule=schedule,
        command=it.get(("c", *command), lambda: tuple(command)) if command is not None
        else None, call=it.share(call), timeout_ms=it.share(timeout),
        overlap=_OVERLAP[overlap], misfire=misfire, retries=retries, on_node_lost=_LOST[lost],
        tags=it.get(("t", *tags), lambda: tuple(tags)) if tags else (),
        jitter_ms=it.share(jitter), paused=paused,
        # Equal envs are shared like the state shares them (never mutated).
        env=it.get(("e", *env.items()), lambda: env) if env else NO_ENV,
        **(_ext_fields(ext, it) if ext else {}))


def _ext_fields(ext: dict[str, Any], it: _Interner) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if "after" in ext:
        out["after"] = tuple(ext["after"])
        out["on"] = DepOn(ext["on"])
    if "conc" in ext:
        conc = ext["conc"]
        out["concurrency"] = it.get(("k", *conc), lambda: ConcurrencySpec.from_row(conc))
    return out


# ------------------------------------------------------------------ snapshots

def encode_state(st: ClusterState) -> bytes:
    """The whole state as versioned msgpack (deterministic for a given state). For a
    big state, pause the cyclic collector around it (the node does:
    :func:`raftsched.node.observe.gcwatch.paused`)."""
    jobs = [[spec_to_row(r.spec), r.version, r.created_ms, r.updated_ms, r.hwm_ms, r.next_ms,
             list(r.active), list(r.last) if r.last else None]
            for _, r in sorted(st.jobs.items())]
    if st.backfills or any(uses_v3(r.spec) for r in st.jobs.values()):
        version = SNAPSHOT_VERSION
    elif any(r.spec.schedule.start_ms is not None or r.spec.schedule.end_ms is not None
             for r in st.jobs.values()):
        version = BOUNDED_SNAPSHOT_VERSION
    else:
        version = UNBOUNDED_SNAPSHOT_VERSION
    runs = [r.to_row() for _, r in sorted(st.runs.items())]
    history = [[job_id, [r.to_row() for r in hist]]
               for job_id, hist in sorted(st.history.items()) if hist]
    nodes = [n.to_row() for _, n in sorted(st.nodes.items())]
    return packb({
        "v": version,
        "fence": st.fence,
        "applied": st.applied,
        "history_limit": st.history_limit,
        "leader": st.leader.to_row(),
        "totals": dict(sorted(st.totals.items())),
        "jobs": jobs,
        "runs": runs,
        "history": history,
        "nodes": nodes,
        "dedupe": [[k, v] for k, v in st.dedupe.items()],
        **_notify_snapshot(st),
        **_http_snapshot(st),
        # Added after version 1 was released: readers of version 1 skip it.
        "members": [m.to_row() for _, m in sorted(st.members.items())],
        # Only when there is one (the snapshot is then version 3).
        **backfill.to_snapshot(st),
    })


def _notify_snapshot(st: ClusterState) -> dict[str, Any]:
    """The ``notify`` key (only when there is something to keep: older snapshots stay
    as they were): the cluster default, pending deliveries, delivery status per run,
    and the jobs' notify specs (beside the spec rows, whose shape older readers know)."""
    data = st.notify.to_snapshot()
    specs = [[job_id, r.spec.notify.to_spec()] for job_id, r in sorted(st.jobs.items())
             if r.spec.notify is not None]
    if data is None and not specs:
        return {}
    return {"notify": dict(data or {"v": NOTIFY_VERSION}, jobs=specs)}


def _notify_restore(st: ClusterState, data: Any) -> None:
    if not isinstance(data, dict):
        return
    st.notify = NotifyState.from_snapshot(data)
    for job_id, spec in data.get("jobs", ()):
        rec = st.jobs.get(job_id)
        if rec is not None:
            rec.spec = replace(rec.spec, notify=NotifySpec.from_spec(spec))


def state_version(blob: bytes) -> int | None:
    """The format version an :func:`encode_state` blob was written with (read from its
    first entry only), or None when the blob does not start like a snapshot."""
    up = msgpack.Unpacker(raw=False)
    up.feed(blob[:16])
    try:
        if up.read_map_header() and up.unpack() == "v":
            version = up.unpack()
            return version if type(version) is int else None
    except (msgpack.OutOfData, ValueError, msgpack.UnpackException):
        pass
    return None


def _http_snapshot(st: ClusterState) -> dict[str, Any]:
    """The ``http`` key: the HTTP jobs' ``http`` tables, beside the spec rows (whose
    shape every reader knows: such a job's row has neither command nor call). Only
    when a job has one: a snapshot without HTTP jobs is byte for byte what it was."""
    specs = [[job_id, r.spec.http.to_spec()]
             for job_id, r in sorted(st.jobs.items()) if r.spec.http is not None]
    return {"http": specs} if specs else {}


def _http_restore(st: ClusterState, data: Any) -> None:
    for job_id, spec in data if isinstance(data, list) else ():
        rec = st.jobs.get(job_id)
        if rec is not None:
            # Validated again against the job's env, restored with its row.
            rec.spec = replace(rec.spec, http=HttpSpec.from_spec(spec, rec.spec.env))


def decode_state(blob: bytes) -> ClusterState:
    """Rebuild a state from :func:`encode_state` bytes; refuses unknown versions. For
    a big state, pause the cyclic collector around it, as for :func:`encode_state`."""
    try:
        return _decode_state(blob)
    except ProtocolError:
        raise
    except Exception as exc:  # noqa: BLE001 - truncated, reshaped: not our snapshot
        raise ProtocolError(f"undecodable snapshot: {type(exc).__name__}: "
                            f"{exc}"[:300]) from None


def _decode_state(blob: bytes) -> ClusterState:
    # Streamed, one row at a time: unpacking the whole blob first made every row's
    # lists and strings (~1 KB per job) at once, and the records built next were
    # scattered among them, so the freed rows left the allocator's arenas pinned —
    # a restored node held ~1.2 KB per job more than the one that applied the log.
    up = msgpack.Unpacker(_BlobReader(blob), raw=False, strict_map_key=True, use_list=True)
    keys = up.read_map_header()
    first = up.unpack() if keys else None
    version = up.unpack() if first == "v" else None
    if type(version) is not int or version not in SNAPSHOT_VERSIONS:
        raise ProtocolError(format_problem("snapshot", version if first == "v" else None,
                                           SNAPSHOT_VERSIONS))
    st = ClusterState()
    intern = _Interner()
    rest: dict[str, Any] = {}
    for _ in range(keys - 1):
        key = up.unpack()
        if key == "jobs":
            _decode_jobs(up, st, intern)
        elif key == "runs":
            for _ in range(up.read_array_header()):
                run = _run_from_row(up.unpack(), st, intern)
                st.runs[run.run_id] = run
        elif key == "history":
            for _ in range(up.read_array_header()):
                if up.read_array_header() != 2:
                    raise ProtocolError("malformed snapshot history")
                job_id = _shared_id(st, up.unpack())
                hist = st.history.setdefault(job_id, deque(maxlen=st.history_limit))
                for _ in range(up.read_array_header()):
                    hist.append(_run_from_row(up.unpack(), st, intern))
        elif key == "dedupe":
            for _ in range(up.read_array_header()):
                rid, reply = up.unpack()
                st.dedupe[rid] = _shared_reply(st, reply)
        elif key == "history_limit":
            # Written before "history", whose deques take it as their bound.
            st.history_limit = up.unpack()
        else:
            rest[key] = up.unpack()
    try:
        up.skip()
    except msgpack.OutOfData:
        pass
    else:
        raise ProtocolError("trailing data after the snapshot")
    st.fence = rest["fence"]
    st.applied = rest["applied"]
    st.leader = Leadership.from_row(rest["leader"])
    st.totals = rest["totals"]
    for row in rest["nodes"]:
        node = NodeRecord.from_row(row)
        st.nodes[node.node_id] = node
    _notify_restore(st, rest.get("notify"))
    _http_restore(st, rest.get("http"))
    for row in rest.get("members", ()):  # absent from snapshots written before it
        member = MemberRecord.from_row(row)
        st.members[member.node_id] = member
    backfill.restore(st, rest.get("backfills"))
    st.rebuild_indexes()
    return st


class _BlobReader:
    """The blob as the file-like object an Unpacker pulls from, a small slice at a
    time: ``Unpacker.feed`` would copy all of it (as much memory again as the
    snapshot). The unpacker wants bytes, not a memoryview."""

    def __init__(self, blob: bytes) -> None:
        self.blob = blob
        self.pos = 0

    def read(self, size: int) -> bytes:
        chunk = self.blob[self.pos:self.pos + size]
        self.pos += len(chunk)
        return chunk


def _decode_jobs(up: msgpack.Unpacker, st: ClusterState, intern: _Interner) -> None:
    share = intern.share
    for _ in range(up.read_array_header()):
        spec_row, version, created, updated, hwm, nxt, active, last = up.unpack()
        spec = spec_from_row(spec_row, intern)
        # An "at" job's next fire is its schedule's instant: one int for all such jobs.
        # The other times repeat from row to row (jobs put by one command share its
        # "at"), hence share().
        if nxt is not None and isinstance(spec.schedule, AtSchedule) \
                and nxt == spec.schedule.at_ms:
            nxt = spec.schedule.at_ms
        st.jobs[spec.id] = JobRecord(spec, version=version, created_ms=share(created),
                                     updated_ms=share(updated), hwm_ms=share(hwm),
                                     next_ms=share(nxt), active=active,
                                     last=tuple(map(share, last)) if last else None)


def _run_from_row(row: list[Any], st: ClusterState, intern: _Interner) -> RunRecord:
    """A run with its repeated strings (job id, state, node, reason) shared."""
    run = RunRecord.from_row(row)
    share = intern.share
    run.job_id, run.state, run.node = _shared_id(st, run.job_id), share(run.state), \
        share(run.node)
    run.reason = share(run.reason)
    run.transitions = tuple((t[0], share(t[1]), share(t[2]), t[3], share(t[4]))
                            for t in run.transitions)
    return run


def _shared_id(st: ClusterState, job_id: Any) -> Any:
    """The job's own id string when the job exists (a fresh copy costs ~60 bytes)."""
    rec = st.jobs.get(job_id) if isinstance(job_id, str) else None
    return rec.spec.id if rec is not None else job_id


def _shared_reply(st: ClusterState, reply: Any) -> Any:
    if isinstance(reply, dict):
        if "job" in reply:
            reply["job"] = _shared_id(st, reply["job"])
        for item in reply.get("results", ()):
            if isinstance(item, dict) and "job" in item:
                item["job"] = _shared_id(st, item["job"])
    return reply
