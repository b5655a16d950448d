"""The replicated command vocabulary: one frozen class per log operation.

Every change to the cluster state is one of these commands, committed through the
Raft log and applied by :meth:`raftsched.core.machine.ClusterState.apply`. On the wire
(and in journals) a command is a msgpack map ``{"op": ..., <fields>, "v": 2}``;
:meth:`Command.encode` writes exactly the bytes the dict form always had (same keys,
same order), so journals written before these classes existed replay unchanged and
old and new nodes agree byte for byte (``tests/unit/test_commands.py`` pins it).

Batched commands carry their items as small named tuples (:mod:`raftsched.core.items`).
This module holds the node and leader commands and the registry, and is the facade of
the whole vocabulary: the base class and field checks are in :mod:`~raftsched.core.cmdbase`,
the client commands in :mod:`~raftsched.core.clientcmds`.

:func:`from_wire` checks every field and raises :class:`InvalidArgument` naming the
first bad one; the state machine turns that into a refusal (it never raises).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from raftsched.core.clientcmds import (
    ApplyJobs,
    Backfill,
    BackfillCancel,
    DeleteJob,
    Drain,
    Member,
    Pause,
    PutJob,
    PutJobs,
    Resume,
    Transfer,
    Trigger,
)
from raftsched.core.cmdbase import (
    COMMAND_VERSION,
    COMMAND_VERSIONS,
    MAX_AT_MS,
    MAX_BATCH,
    MAX_PUT_BATCH,
    PAST_AT_VERSION,
    ClientCommand,
    Command,
    base_fields,
    client_fields,
    int_field,
    is_int,
    items_field,
    node_field,
    str_field,
    term_field,
)
from raftsched.core.errors import InvalidArgument, ProtocolError, RaftschedError
from raftsched.core.items import (
    DROP_OUTCOMES,
    FINISH_OUTCOMES,
    MISS_OUTCOMES,
    BadClaim,
    ClaimResult,
    Drop,
    FinishItem,
    Fire,
    MissFire,
    Next,
    Place,
    Refused,
    ReleaseScope,
    RunFire,
    StartItem,
    parse_drop,
    parse_finish,
    parse_fire,
    parse_next,
    parse_place,
    parse_start,
)
from raftsched.core.packing import unpackb

# ---------------------------------------------------------------- node and leader commands

@dataclass(frozen=True, slots=True, kw_only=True)
class Heartbeat(Command):
    """A node says it lives (and what it offers)."""

    node: str
    """The node id."""
    boot: int
    """When its process started (a new value means it restarted)."""
    slots: int
    """Its worker slots."""
    queue: int
    """Runs it accepts beyond its slots."""
    tags: tuple[str, ...] = ()
    """Its tags."""
    api: str = ""
    """Its API address."""
    pid: int | None = None
    """Its process id (absent in heartbeats of older nodes)."""
    features: tuple[str, ...] | None = None
    """The commands its release knows beyond the original set (``apply``, ``notify``);
    absent in heartbeats of older nodes. New commands are proposed only once every
    member says it knows them (a rolling upgrade finished)."""

    OP = "heartbeat"
    WIRE = ("node", "at", "boot", "slots", "queue", "tags", "api", "pid", "features")
    OMIT = {"pid": None, "features": None}

    @classmethod
    def from_wire(cls, cmd: dict[str, Any]) -> Heartbeat:
        node_id = str_field(cmd, "node")
        boot, slots = int_field(cmd, "boot"), int_field(cmd, "slots")
        queue = int_field(cmd, "queue")
        tags = cmd.get("tags", [])
        api = cmd.get("api", "")
        pid = cmd.get("pid")
        if pid is not None and (isinstance(pid, bool) or not isinstance(pid, int)):
            raise InvalidArgument("pid", "must be an integer")
        if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
            raise InvalidArgument("tags", "must be a list of strings")
        if not isinstance(api, str):
            raise InvalidArgument("api", "must be a string")
        features = cmd.get("features")
        if features is not None and (not isinstance(features, list) or len(features) > 64
                                     or not all(isinstance(f, str) for f in features)):
            raise InvalidArgument("features", "must be a list of strings")
        return cls(node=node_id, boot=boot, slots=slots, queue=queue, tags=tuple(tags),
                   api=api, pid=pid,
                   features=tuple(features) if features is not None else None, **base_fields(cmd))


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaderRecord(Command):
    """A leader records its leadership (and the clock skews it observed)."""

    node: str
    """The leader's node id."""
    term: int
    """Its Raft term."""
    skew: dict[str, int]
    """Node id -> that node's clock minus the leader's, in ms."""

    OP = "leader"
    WIRE = ("node", "term", "at", "skew")

    @classmethod
    def from_wire(cls, cmd: dict[str, Any]) -> LeaderRecord:
        node_id = str_field(cmd, "node")
        term = int_field(cmd, "term")
        skew = cmd.get("skew", {})
        if not isinstance(skew, dict):
            raise InvalidArgument("skew", "must be a map")
        return cls(node=node_id, term=term, skew=skew, **base_fields(cmd))


@dataclass(frozen=True, slots=True, kw_only=True)
class Release(Command):
    """The leader declares a node gone (or disconnected): its claims are released."""

    node: str
    """The node id."""
    scope: ReleaseScope = ReleaseScope.all
    """``assigned``: its not-yet-started runs; ``all``: every run, and it is lost."""
    reason: str = "node lost"
    """Why (recorded with the runs)."""
    term: int | None = None
    """The proposer's term (None only in v1 commands, which predate it)."""
    leader: Any = None
    """The proposer's node id."""
    hb: int | None = None
    """The ``at`` of the node's newest heartbeat the proposer had seen: set on a release
    decided by the lease (:mod:`raftsched.core.lease`), which is refused if a newer
    heartbeat of the node was committed before it. None: no such condition."""

    OP = "release"
    WIRE = ("node", "scope", "reason", "term", "leader", "at", "hb")
    OMIT = {"hb": None}

    @classmethod
    def from_wire(cls, cmd: dict[str, Any]) -> Release:
        term = None if cmd.get("v") == 1 and "term" not in cmd else term_field(cmd)
        node = cmd.get("node")
        scope = cmd.get("scope", "all")
        reason = cmd.get("reason", "node lost")
        if not isinstance(node, str):
            raise InvalidArgument("node", "must be a known node id")
        if scope not in ("assigned", "all") or not isinstance(reason, str):
            raise InvalidArgument("scope", "must be 'assigned' or 'all'")
        scope = ReleaseScope(scope)
        hb = cmd.get("hb")
        if hb is not None and (isinstance(hb, bool) or not isinstance(hb, int)):
            raise InvalidArgument("hb", "must be epoch milliseconds")
        return cls(node=node, scope=scope, reason=reason, term=term, leader=cmd.get("leader"),
                   hb=hb, **base_fields(cmd))


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan(Command):
    """The leader's batch: fire times, placements, drops and next-fire hints."""

    term: int
    """The proposer's term."""
    leader: Any
    """The proposer's node id."""
    fires: tuple[Fire, ...] = ()
    """Runs and missed ranges, in time order per job."""
    place: tuple[Place | Refused, ...] = ()
    """Pending runs to assign."""
    drop: tuple[Drop | Refused, ...] = ()
    """Active runs to end."""
    next: tuple[Next | Refused, ...] = ()
    """Next fire times after the marks."""
    versions: dict[str, int]
    """Job id -> the job version the plan was made from (an item of a changed job is
    refused)."""

    OP = "plan"
    WIRE = ("at", "term", "leader", "fires", "place", "drop", "next", "versions")

    @classmethod
    def from_wire(cls, cmd: dict[str, Any]) -> Plan:
        term = term_field(cmd)
        fires = cmd.get("fires", [])
        if not isinstance(fires, list) or len(fires) > MAX_BATCH or not all(
                isinstance(f, list) and len(f) in (5, 7) for f in fires):
            raise InvalidArgument("fires", "must be a list of run/miss items")
        place = [parse_place(i) for i in items_field(cmd, "place", 2)]
        drop = [parse_drop(i) for i in items_field(cmd, "drop", 3)]
        nxt = [parse_next(i) for i in items_field(cmd, "next", 2)]
        versions = cmd.get("versions", {})
        if not isinstance(versions, dict):
            raise InvalidArgument("versions", "must be a map of job id to version")
        return cls(term=term, leader=cmd.get("leader"),
                   fires=tuple(parse_fire(f) for f in fires),
                   place=tuple(place), drop=tuple(drop), next=tuple(nxt), versions=versions,
                   **base_fields(cmd))

    def size(self) -> int:
        """Items in all (a plan whose every item was refused made no progress)."""
        return len(self.fires) + len(self.place) + len(self.drop) + len(self.next)


@dataclass(frozen=True, slots=True, kw_only=True)
class Start(Command):
    """A node starts assigned runs; each is accepted only with its current fence."""

    node: str
    """The node id."""
    items: tuple[StartItem | BadClaim, ...]
    """The runs and their fences."""

    OP = "start"
    WIRE = ("node", "items", "at")

    @classmethod
    def from_wire(cls, cmd: dict[str, Any]) -> Start:
        node = node_field(cmd)
        return cls(node=node, items=tuple(parse_start(i) for i in items_field(cmd, "items", 2)),
                   **base_fields(cmd))


@dataclass(frozen=True, slots=True, kw_only=True)
class Finish(Command):
    """A node reports outcomes of runs it ran (or gave up)."""

    node: str
    """The node id."""
    items: tuple[FinishItem | BadClaim, ...]
    """The outcomes."""

    OP = "finish"
    WIRE = ("node", "items", "at")

    @classmethod
    def from_wire(cls, cmd: dict[str, Any]) -> Finish:
        node = node_field(cmd)
        return cls(node=node, items=tuple(parse_finish(i) for i in items_field(cmd, "items", 6)),
                   **base_fields(cmd))


@dataclass(frozen=True, slots=True, kw_only=True)
class Certify(ClientCommand):
    """A death certificate: incarnation ``boot`` of ``node`` is dead and nothing of it
    runs or can still start (its guard killed and reaped every process of it, or the
    node restarted on its data dir). Any member proposes it for the guard or for
    itself; it is honoured only for the node's current incarnation."""

    node: str
    """The dead node's id."""
    boot: int
    """The dead incarnation: the ``boot`` of its heartbeats."""
    by: str = "guard"
    """Who proved it: ``guard`` (the node's guard saw it die and killed what it left)
    or ``restart`` (a new incarnation holds its data dir)."""

    OP = "certify"
    WIRE = ("node", "boot", "by", "rid", "at")
    OMIT = {"rid": None}

    @classmethod
    def from_wire(cls, cmd: dict[str, Any]) -> Certify:
        node = str_field(cmd, "node")
        boot = int_field(cmd, "boot")
        by = cmd.get("by", "guard")
        if by not in CERTIFIERS:
            raise InvalidArgument("by", f"must be one of {', '.join(CERTIFIERS)}")
        return cls(node=node, boot=boot, by=by, **client_fields(cmd))


#: Who may prove a death (:attr:`Certify.by`).
CERTIFIERS = ("guard", "restart")


@dataclass(frozen=True, slots=True, kw_only=True)
class Read(Command):
    """A read barrier: its apply proves the node applied everything before it."""

    node: Any = None
    """The node that asked (informational)."""

    OP = "read"
    WIRE = ("at", "node")

    @classmethod
    def from_wire(cls, cmd: dict[str, Any]) -> Read:
        return cls(node=cmd.get("node"), **base_fields(cmd))


@dataclass(frozen=True, slots=True, kw_only=True)
class NotifyDefault(Command):
    """The leader commits the cluster-default webhook of its ``[notify]`` config."""

    term: int
    """The proposer's term (leader-only)."""
    spec: dict[str, Any] | None
    """``{on, url}`` (validated when applied), or None for no default."""

    OP = "notify_default"
    WIRE = ("term", "spec", "at")

    @classmethod
    def from_wire(cls, cmd: dict[str, Any]) -> NotifyDefault:
        spec = cmd.get("spec")
        if spec is not None and not isinstance(spec, dict):
            raise InvalidArgument("spec", "must be a map or null")
        return cls(term=int_field(cmd, "term"), spec=spec, **base_fields(cmd))


@dataclass(frozen=True, slots=True, kw_only=True)
class NotifyResults(Command):
    """The results of webhook delivery attempts (``core/notify.py``)."""

    items: tuple[tuple[str, bool, str, int | None], ...]
    """``(key, delivered, error, retry_at_ms)``; not delivered and no retry: given up."""

    OP = "notified"
    WIRE = ("items", "at")

    @classmethod
    def from_wire(cls, cmd: dict[str, Any]) -> NotifyResults:
        items = cmd.get("items")
        if not isinstance(items, list) or len(items) > 1000:
            raise InvalidArgument("items", "must be a list of at most 1000 results")
        out = []
        for item in items:
            if not (isinstance(item, list) and len(item) == 4 and isinstance(item[0], str)
                    and isinstance(item[1], bool) and isinstance(item[2], str)
                    and (item[3] is None or is_int(item[3]))):
                raise InvalidArgument("items", "each must be [key, delivered, error, "
                                               "retry_at_ms|null]")
            out.append((item[0], item[1], item[2], item[3]))
        return cls(items=tuple(out), **base_fields(cmd))


#: Every command class by its ``op``.
COMMANDS: dict[str, type[Command]] = {c.OP: c for c in (
    PutJob, PutJobs, ApplyJobs, DeleteJob, Pause, Resume, Trigger, Drain, Transfer, Heartbeat,
    LeaderRecord, Release, Plan, Start, Finish, Read, NotifyDefault, NotifyResults,
    Member, Certify, Backfill, BackfillCancel)}


def command_class(cmd: Any) -> type[Command]:
    """The class of a decoded map's command (:class:`InvalidArgument` if none)."""
    if not isinstance(cmd, dict):
        raise InvalidArgument("command", "must be a map")
    op = cmd.get("op")
    cls = COMMANDS.get(op) if isinstance(op, str) else None
    if cls is None:
        raise InvalidArgument("op", f"unknown operation {op!r:.40}")
    return cls


def from_wire(cmd: Any) -> Command:
    """The typed command for a decoded map; :class:`InvalidArgument` names the first
    bad field."""
    return command_class(cmd).from_wire(cmd)


@dataclass(frozen=True, slots=True, kw_only=True)
class Unreadable:
    """A replicated entry that is not a command this code can read: the state machine
    counts it applied and refuses it (so every replica answers it the same way)."""

    error: dict[str, Any]
    """The refusal, as a reply carries it (``{code, message}``)."""
    rid: str | None = None
    """Its request id, if it has a valid one (and a known op and a valid ``at``): a
    repeat of a request already answered gets that answer, as any repeat does."""


def read(cmd: Any) -> Command | Unreadable:
    """What the state machine applies for a decoded map (a command passes through):
    the typed command, or why it cannot be read. Never raises."""
    if isinstance(cmd, Command):
        return cmd
    try:
        return from_wire(cmd)
    except RaftschedError as exc:
        error = exc.to_wire()
    except Exception as exc:  # noqa: BLE001 - a replica must answer whatever it holds
        error = {"code": "internal", "message": f"{type(exc).__name__}: {exc}"[:300]}
    return Unreadable(error=error, rid=_repeatable_rid(cmd))


def _repeatable_rid(cmd: Any) -> str | None:
    if not isinstance(cmd, dict) or not isinstance(cmd.get("op"), str) \
            or cmd["op"] not in COMMANDS:
        return None
    at, rid = cmd.get("at"), cmd.get("rid")
    if not isinstance(at, int) or isinstance(at, bool) or not 0 <= at < MAX_AT_MS:
        return None
    return rid if isinstance(rid, str) and len(rid) <= 64 else None


def decode(blob: bytes) -> Command:
    """The typed command in replicated bytes (:class:`ProtocolError` if not one this
    code applies; :class:`InvalidArgument` naming a bad field)."""
    cmd = unpackb(bytes(blob))
    if not isinstance(cmd, dict) or type(cmd.get("v")) is not int \
            or cmd["v"] not in COMMAND_VERSIONS:
        raise ProtocolError("not a command of a known version")
    return from_wire(cmd)


__all__ = [
    "CERTIFIERS", "COMMANDS", "COMMAND_VERSION", "COMMAND_VERSIONS", "Certify",
    "DROP_OUTCOMES", "FINISH_OUTCOMES",
    "MAX_AT_MS", "MAX_BATCH", "MAX_PUT_BATCH", "MISS_OUTCOMES", "PAST_AT_VERSION",
    "ApplyJobs", "Backfill", "BackfillCancel", "BadClaim", "ClientCommand", "Command",
    "DeleteJob", "Drain", "Drop",
    "ClaimResult", "Finish", "FinishItem", "Heartbeat", "LeaderRecord", "Member", "MissFire",
    "Next", "NotifyDefault", "NotifyResults", "Pause", "Place", "Plan", "PutJob", "PutJobs",
    "Read", "Refused", "Release", "ReleaseScope", "Resume", "RunFire", "Start", "StartItem",
    "Transfer", "Trigger",
    "Unreadable", "command_class", "decode", "from_wire", "read",
]
