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

from raftsched.core import backfill, members
from raftsched.core.cmdbase import SHARED_SPECS_FEATURE
from raftsched.core.commands import COMMAND_VERSION, COMMAND_VERSIONS, Command
from raftsched.core.errors import ProtocolError
from raftsched.core.httpspec import HttpSpec
from raftsched.core.machine import ClusterState
from raftsched.core.notifydata import BODY_VERSION as NOTIFY_VERSION
from raftsched.core.notifydata import NotifySpec, NotifyState
from raftsched.core.packing import packb, unpackb
from raftsched.core.records import (
    Leadership,
    MemberRecord,
    NodeRecord,
    RunRecord,
    stored_spec,
)
from raftsched.core.specrows import (
    SHARED_SPECS_MIN_JOBS,
    Interner,
    JobTable,
    job_rows,
    uses_v3,
)

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
#: 4: the job table shares its spec rows (``specs``, before ``jobs``; see
#: :func:`raftsched.core.specrows.job_rows`). Written only for a state of at least
#: ``SHARED_SPECS_MIN_JOBS`` jobs, where it makes a restart ~2x faster, and only once
#: every member's heartbeats say its release reads it (:func:`_all_read_shared_specs`).
SNAPSHOT_VERSION = 4
#: The version of snapshots in which some job has dependencies or a concurrency limit,
#: or a backfill is kept (and the job table is not shared).
DEPS_SNAPSHOT_VERSION = 3
#: The version of snapshots in which some job has bounds (and nothing of version 3).
BOUNDED_SNAPSHOT_VERSION = 2
#: The version of snapshots in which no job has bounds.
UNBOUNDED_SNAPSHOT_VERSION = 1
#: Versions of state snapshots this code reads.
SNAPSHOT_VERSIONS = frozenset({1, 2, 3, 4})


# ------------------------------------------------------------------ commands

def encode_command(cmd: Command | dict[str, Any]) -> bytes:
    """A command (or its map, with ``op`` and ``at``) as replicated bytes."""
    if isinstance(cmd, Command):
        return cmd.encode()
    # A map keeps the version it names (it was silently rewritten to the current one,
    # which changed what a v6 resume means on replay); one that names none is current.
    return packb(dict(cmd, v=cmd.get("v", COMMAND_VERSION)))


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


# ------------------------------------------------------------------ snapshots

def encode_state(st: ClusterState) -> bytes:
    """The whole state as versioned msgpack (deterministic for a given state). For a
    big state, pause the cyclic collector around it (the node does:
    :func:`raftsched.node.observe.gcwatch.paused`)."""
    shared = len(st.jobs) >= SHARED_SPECS_MIN_JOBS and _all_read_shared_specs(st)
    specs, jobs = job_rows(st.jobs, shared)
    if shared:
        version = SNAPSHOT_VERSION
    elif st.backfills or any(uses_v3(stored_spec(r)) for r in st.jobs.values()):
        version = DEPS_SNAPSHOT_VERSION
    elif any(stored_spec(r).schedule.start_ms is not None
             or stored_spec(r).schedule.end_ms is not None for r in st.jobs.values()):
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
        # Before "jobs", which the reader streams: its rows name these (version 4 only).
        **({"specs": specs} if specs is not None else {}),
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


def _all_read_shared_specs(st: ClusterState) -> bool:
    """Whether every member reads ``specs``: a snapshot goes to any follower, and a
    release before version 4 would stop on it (a rolling upgrade writes the old form
    until its last node is upgraded), as in the node's feature check."""
    return members.all_have(st, SHARED_SPECS_FEATURE)


def _notify_snapshot(st: ClusterState) -> dict[str, Any]:
    """The ``notify`` key (only when there is something to keep: older snapshots stay
    as they were): the cluster default, pending deliveries, delivery status per run,
    and the jobs' notify specs (beside the spec rows, whose shape older readers know)."""
    data = st.notify.to_snapshot()
    # The few jobs with a notify spec are picked before sorting: not a million ids.
    specs = sorted([job_id, n.to_spec()] for job_id, r in st.jobs.items()
                   if (n := stored_spec(r).notify) is not None)
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
    specs = sorted([job_id, h.to_spec()] for job_id, r in st.jobs.items()
                   if (h := stored_spec(r).http) is not None)
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
    intern = Interner()
    rest: dict[str, Any] = {}
    specs = None
    for _ in range(keys - 1):
        key = up.unpack()
        if key == "specs" and version >= SNAPSHOT_VERSION:
            specs = up.unpack()
            if not isinstance(specs, list) or not all(isinstance(r, list) for r in specs):
                raise ProtocolError("malformed snapshot spec rows")
        elif key == "jobs":
            if (specs is None) != (version < SNAPSHOT_VERSION):
                raise ProtocolError(f"snapshot version {version} with"
                                    f"{'out' if specs is None else ''} shared spec rows")
            table = JobTable(specs, intern)
            for _ in range(up.read_array_header()):
                rec = table.record(up.unpack())
                st.jobs[rec.job_id] = rec
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


def _run_from_row(row: list[Any], st: ClusterState, intern: Interner) -> RunRecord:
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
    return rec.job_id if rec is not None else job_id


def _shared_reply(st: ClusterState, reply: Any) -> Any:
    if isinstance(reply, dict):
        if "job" in reply:
            reply["job"] = _shared_id(st, reply["job"])
        for item in reply.get("results", ()):
            if isinstance(item, dict) and "job" in item:
                item["job"] = _shared_id(st, item["job"])
    return reply
