"""The base of the command vocabulary: the ``Command`` class, the command versions and
the field checks every command's ``from_wire`` uses.

See :mod:`raftsched.core.commands` for the vocabulary itself (and its facade: import
commands from there).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Self

from raftsched.core.errors import InvalidArgument
from raftsched.core.packing import packb

#: The commands this release knows beyond those of the release before it, as its
#: heartbeats announce them: ``apply`` (the ``apply`` command), ``notify`` (the
#: ``notify`` spec field, ``notify_default`` and ``notified``), ``lease`` (a
#: ``release`` carrying ``hb``), ``certify`` (the ``certify`` command: death
#: certificates), ``bounds`` (the ``start``/``end`` spec fields), ``http`` (the
#: ``http`` spec field: an older release refuses such a spec in its apply) and ``deps``
#: (the ``after``/``on``/``concurrency`` spec fields and the ``backfill`` commands:
#: command version 5, snapshot version 3) and ``specs`` (it reads snapshot version 4,
#: the shared spec table) and ``runids`` (it applies plan command version 6).
FEATURES = ("apply", "notify", "lease", "certify", "bounds", "http", "deps", "specs", "seal",
            "idlebeat", "contact", "runids")
#: Plans that cover a fire time whose run id a kept record holds (command version 6,
#: core/heldids.py): only once every member applies them.
RUN_IDS_FEATURE = "runids"
#: Dependent jobs, concurrency keys and backfills: only once every member has them.
DEPS_FEATURE = "deps"
#: Snapshots with the shared spec table (version 4): only once every member reads them.
SHARED_SPECS_FEATURE = "specs"
#: Raft messages sealed with the AEAD (node/replica/raftkeys.py): only once every
#: member opens them.
SEAL_FEATURE = "seal"
#: Idle nodes' heartbeats at the idle period (core/lease.py): only once every member's
#: leader loop measures their lateness against it.
IDLE_BEAT_FEATURE = "idlebeat"
#: An idle node's liveness read from Raft contact, its heartbeat entries only a refresh
#: (core/lease.py contact_heartbeat_ms): only once every member's leader loop reads it.
CONTACT_FEATURE = "contact"
#: A release decided by a node's lease (``Release.hb``): only once every member checks it.
LEASE_FEATURE = "lease"

#: Version of replicated commands written by this code. 2: every leader-only command
#: (``leader``, ``plan``, ``release``) carries its proposer's term and node, checked
#: against the log entry's own term (a v1 ``release`` had neither); and a client
#: command refused under a request id has its refusal remembered like a success (a v1
#: refusal was not, so a late copy of the request could still apply).
COMMAND_VERSION = 2
#: The first version whose refusals are remembered (see ``COMMAND_VERSION``).
REFUSAL_REMEMBERED_VERSION = 2
#: 3: a put of an ``at`` schedule whose instant has passed runs it within its grace and
#: refuses it beyond (v2 accepted it and never ran it), and ``delete_job`` may carry
#: ``if_done``. Written only by the commands that need it (:meth:`Command.written`), so
#: an older node meets v3 only then — and stops saying so, never misreads it.
PAST_AT_VERSION = 3
#: 4: a put's specs may carry ``start``/``end`` (bounds on the schedule). A release that
#: knows only v3 refused those keys as unknown fields, so it must stop on such a command,
#: not refuse it where the others accept it; and a v1..v3 command holding them (sent to
#: an older release, which refused it) is refused on replay too. Written only by the
#: commands that carry bounds (:meth:`Command.written`).
BOUNDS_VERSION = 4
#: 5: a put's specs may carry ``after``/``on`` (dependent jobs) and ``concurrency``, and
#: the ``backfill``/``backfill_cancel`` commands exist. A release that knows only v4
#: refused those keys as unknown fields (and those ops as unknown), so it must stop on
#: such a command rather than refuse it where the others accept it; a v1..v4 command
#: holding the keys is refused on replay as its release refused it. Written only by the
#: commands that carry them (:meth:`Command.written`; the backfill commands always).
DEPS_VERSION = 5
#: 6: a plan's run item for a fire time whose run id a kept record already holds (a
#: manual run stamped ahead, a run of the schedule before a past ``at`` was put) only
#: raises the job's mark: the record covers it (core/heldids.py); and a ``resume``'s
#: missed range starts after such fire times and is counted by the apply (a v1..v5
#: resume recorded the proposer's count, and no range when that was 0). A v1..v5 plan
#: or resume made a record
#: beside the one holding the id (two records, one id). Written only once every member
#: lists ``runids``: by a plan holding such an item, and by every resume.
HELD_IDS_VERSION = 6
#: Versions this code applies (older ones with the semantics they were written with).
COMMAND_VERSIONS = frozenset({1, 2, 3, 4, 5, 6})
#: Items per batched command (plan, start, finish).
MAX_BATCH = 20000
#: Specs per put_jobs command: applying one costs ~45 us per spec on every node, and an
#: apply must stay far below the election timeout (300 ms).
MAX_PUT_BATCH = 1000
#: Times beyond year 9999 are refused: derived times (next fire, backoff) must stay
#: far inside msgpack's 64-bit integers, or snapshots could not be written.
MAX_AT_MS = 253_402_300_800_000


@dataclass(frozen=True, slots=True, kw_only=True)
class Command:
    """Fields every command has. Subclasses list their wire keys in ``WIRE``, in the
    order the map is written (that order is part of the bytes)."""

    at: int
    """Epoch ms stamped by the proposer (the only clock the state machine sees)."""
    v: int = COMMAND_VERSION
    """The command version it was written with (decoded ones keep theirs)."""

    OP: ClassVar[str] = ""
    WIRE: ClassVar[tuple[str, ...]] = ()
    #: Keys left off the map while they hold this value (absent means this default).
    OMIT: ClassVar[dict[str, Any]] = {}

    def to_wire(self) -> dict[str, Any]:
        """The command as the map it is replicated as (without ``v``), items as lists."""
        return self._map(_plain)

    def encode(self) -> bytes:
        """The replicated bytes (items packed as they are: a tuple is a msgpack array,
        the same bytes as the list ``to_wire`` gives)."""
        out = self._map(_packable)
        out["v"] = self.v
        return packb(out)

    def _map(self, convert: Any) -> dict[str, Any]:
        out: dict[str, Any] = {"op": self.OP}
        omit = self.OMIT
        for name in self.WIRE:
            value = getattr(self, name)
            if name in omit and value is omit[name]:
                continue
            out[name] = convert(value)
        return out

    def written(self) -> Self:
        """This command as a proposer writes it once ``at`` is stamped: with the lowest
        version that carries its meaning (see ``PAST_AT_VERSION``)."""
        specs = getattr(self, "specs", None)
        spec = getattr(self, "spec", None)
        if specs is None:
            specs = (spec,) if spec is not None else ()
        v = self.v
        if v < PAST_AT_VERSION and any_past_at(specs, self.at):
            v = PAST_AT_VERSION
        if v < BOUNDS_VERSION and any_bounds(specs):
            v = BOUNDS_VERSION
        if v < DEPS_VERSION and any_deps(specs):
            v = DEPS_VERSION
        if v == self.v:
            return self
        from dataclasses import replace
        return replace(self, v=v)

    @classmethod
    def from_wire(cls, cmd: dict[str, Any]) -> Command:
        raise NotImplementedError


def _packable(value: Any) -> Any:
    """``value`` with the items that need a tag (plan fires) in wire form; everything
    else as it is."""
    if isinstance(value, tuple) and value and isinstance(value[0], tuple):
        return [x.to_wire() if hasattr(x, "to_wire") else x for x in value]
    return value


def _plain(value: Any) -> Any:
    if isinstance(value, tuple):
        to_wire = getattr(value, "to_wire", None)
        if to_wire is not None:
            return to_wire()
        return [_plain(x) for x in value]
    return value


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientCommand(Command):
    """A command an operator or client asked for, retried under one request id."""

    rid: str | None = None
    """The request id: a retried command gets the first reply, not a second apply."""



# ---------------------------------------------------------------- field checks

def any_past_at(specs: Any, at: int) -> bool:
    """Some spec has an ``at`` schedule at or before ``at`` (unparsable ones are left
    to validation on apply)."""
    from raftsched.core.durations import parse_timestamp
    from raftsched.core.errors import InvalidSpec
    for spec in specs or ():
        sched = spec.get("schedule") if isinstance(spec, dict) else None
        when = sched.get("at") if isinstance(sched, dict) else None
        if isinstance(when, str):
            try:
                if parse_timestamp(when, "schedule.at") <= at:
                    return True
            except InvalidSpec:
                continue
    return False


def any_bounds(specs: Any) -> bool:
    """Some spec has a ``start`` or an ``end`` key (see ``BOUNDS_VERSION``)."""
    return any(isinstance(spec, dict) and ("start" in spec or "end" in spec)
               for spec in specs or ())


def any_deps(specs: Any) -> bool:
    """Some spec has ``after``, ``on`` or ``concurrency`` (see ``DEPS_VERSION``)."""
    from raftsched.core.specext import uses_new_fields
    return any(uses_new_fields(spec) for spec in specs or ())


def base_fields(cmd: dict[str, Any]) -> dict[str, Any]:
    at = cmd.get("at")
    if isinstance(at, bool) or not isinstance(at, int) or not 0 <= at < MAX_AT_MS:
        raise InvalidArgument("at", "must be epoch milliseconds before year 10000")
    v = cmd.get("v", COMMAND_VERSION)
    return {"at": at, "v": v if type(v) is int else COMMAND_VERSION}


def client_fields(cmd: dict[str, Any]) -> dict[str, Any]:
    rid = cmd.get("rid")
    if rid is not None and (not isinstance(rid, str) or len(rid) > 64):
        raise InvalidArgument("rid", "must be a short string")
    return dict(base_fields(cmd), rid=rid)


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def str_field(cmd: dict[str, Any], key: str) -> str:
    value = cmd.get(key)
    if not isinstance(value, str) or not value or len(value) > 256:
        raise InvalidArgument(key, "must be a non-empty string")
    return value


def int_field(cmd: dict[str, Any], key: str) -> int:
    value = cmd.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidArgument(key, "must be a non-negative integer")
    return value


def bool_field(cmd: dict[str, Any], key: str, default: bool) -> bool:
    value = cmd.get(key, default)
    if not isinstance(value, bool):
        raise InvalidArgument(key, "must be a boolean")
    return value


def job_field(cmd: dict[str, Any]) -> str:
    job_id = cmd.get("job")
    if not isinstance(job_id, str):
        raise InvalidArgument("job", "must be a job id string")
    return job_id


def node_field(cmd: dict[str, Any]) -> str:
    node = cmd.get("node")
    if not isinstance(node, str):
        raise InvalidArgument("node", "must be a node id")
    return node


def term_field(cmd: dict[str, Any]) -> int:
    term = cmd.get("term")
    if not isinstance(term, int) or isinstance(term, bool):
        raise InvalidArgument("term", "must be an integer")
    return term


def opt_limit(cmd: dict[str, Any]) -> int | None:
    value = cmd.get("max_jobs")
    return value if isinstance(value, int) else None


def items_field(cmd: dict[str, Any], key: str, width: int) -> list[list[Any]]:
    items = cmd.get(key, [])
    if not isinstance(items, list) or len(items) > MAX_BATCH:
        raise InvalidArgument(key, f"must be a list of at most {MAX_BATCH} items")
    for item in items:
        if not isinstance(item, list) or len(item) != width:
            raise InvalidArgument(key, f"each item must be a list of {width} values")
    return items


__all__ = [
    "DEPS_FEATURE",
    "FEATURES",
    "IDLE_BEAT_FEATURE",
    "CONTACT_FEATURE",
    "LEASE_FEATURE",
    "RUN_IDS_FEATURE",
    "SEAL_FEATURE",
    "SHARED_SPECS_FEATURE",
    "BOUNDS_VERSION", "COMMAND_VERSION", "COMMAND_VERSIONS", "DEPS_VERSION", "HELD_IDS_VERSION",
    "MAX_AT_MS",
    "MAX_BATCH", "MAX_PUT_BATCH", "PAST_AT_VERSION", "REFUSAL_REMEMBERED_VERSION",
    "ClientCommand", "Command", "any_bounds", "any_deps", "any_past_at", "base_fields",
    "bool_field", "client_fields",
    "int_field", "is_int", "items_field", "job_field", "node_field", "opt_limit", "str_field",
    "term_field",
]
