"""The commands clients and operators ask for (retried under one request id): jobs
put, applied, deleted, paused, resumed and triggered; nodes drained; leadership
transferred; members changed.

Part of the command vocabulary (:mod:`raftsched.core.commands` is its facade).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from raftsched.core.cmdbase import (
    DEPS_VERSION,
    MAX_PUT_BATCH,
    ClientCommand,
    bool_field,
    client_fields,
    is_int,
    job_field,
    opt_limit,
    str_field,
)
from raftsched.core.errors import InvalidArgument
from raftsched.core.specprep import Checked, check_specs, keeps_env


@dataclass(frozen=True, slots=True, kw_only=True)
class PutJob(ClientCommand):
    """Create or replace one job."""

    spec: Any
    """The job spec as ``JobSpec.to_spec()`` writes it (as sent: validated on apply)."""
    max_jobs: int | None = None
    """The proposing node's job limit, or None for none."""

    checked: tuple[Checked, ...] = field(default=(), compare=False, repr=False)
    """``spec`` prepared by ``from_wire`` outside the state lock (not replicated;
    empty: prepared in the apply)."""

    OP = "put_job"
    WIRE = ("spec", "max_jobs", "rid", "at")
    OMIT = {"max_jobs": None, "rid": None}

    @classmethod
    def from_wire(cls, cmd: dict[str, Any]) -> PutJob:
        spec = cmd.get("spec")
        return cls(spec=spec, max_jobs=opt_limit(cmd), checked=check_specs((spec,), cmd.get("at")),
                   **client_fields(cmd))


@dataclass(frozen=True, slots=True, kw_only=True)
class PutJobs(ClientCommand):
    """Create or replace several jobs: each on its own, or with ``atomic`` all or none."""

    specs: tuple[Any, ...]
    """The specs (1..MAX_PUT_BATCH), each checked on its own when applied."""
    max_jobs: int | None = None
    """The proposing node's job limit, or None for none."""
    atomic: bool = False
    """All specs or none (a job file is one change)."""
    if_changed: bool = False
    """Declarations (every app instance declares its jobs at start): a spec equal to
    the stored one (``paused`` aside) makes no new version. (Command version 3: a node
    that would ignore the key stops instead of making versions the others do not.)"""
    checked: tuple[Checked, ...] = field(default=(), compare=False, repr=False)
    """``specs`` prepared by ``from_wire`` outside the state lock, one per spec (not
    replicated; empty: prepared in the apply)."""

    OP = "put_jobs"
    WIRE = ("specs", "max_jobs", "atomic", "if_changed", "rid", "at")
    OMIT = {"max_jobs": None, "atomic": False, "if_changed": False, "rid": None}

    @classmethod
    def from_wire(cls, cmd: dict[str, Any]) -> PutJobs:
        specs = cmd.get("specs")
        if not isinstance(specs, list) or not 0 < len(specs) <= MAX_PUT_BATCH:
            raise InvalidArgument("specs", f"must be a list of 1..{MAX_PUT_BATCH} specs")
        return cls(specs=tuple(specs), max_jobs=opt_limit(cmd),
                   checked=check_specs(specs, cmd.get("at")),
                   atomic=bool_field(cmd, "atomic", False),
                   if_changed=bool_field(cmd, "if_changed", False), **client_fields(cmd))


@dataclass(frozen=True, slots=True, kw_only=True)
class ApplyJobs(ClientCommand):
    """Make the jobs equal ``specs`` in one all-or-nothing change (``raftsched apply``)."""

    specs: tuple[Any, ...]
    """The specs as given (``{keep = true}`` env values resolved when applied)."""
    prune: bool = False
    """Also remove the jobs not in ``specs``."""
    max_jobs: int | None = None
    """The proposing node's job limit, or None for none."""
    expect: dict[str, int] | None = None
    """Job id -> the version the reviewed diff saw (0: absent); a job changed since
    refuses the whole apply. None: no check."""

    checked: tuple[Checked, ...] = field(default=(), compare=False, repr=False)
    """``specs`` prepared by ``from_wire`` outside the state lock, one per spec, None for
    one with a ``{keep = true}`` env value (resolved against the state in the apply)
    (not replicated; empty: prepared in the apply)."""

    OP = "apply"
    WIRE = ("specs", "prune", "max_jobs", "expect", "rid", "at")
    OMIT = {"max_jobs": None, "expect": None, "rid": None}

    @classmethod
    def from_wire(cls, cmd: dict[str, Any]) -> ApplyJobs:
        specs = cmd.get("specs")
        if not isinstance(specs, list) or len(specs) > MAX_PUT_BATCH:
            raise InvalidArgument("specs", f"must be a list of at most {MAX_PUT_BATCH} specs")
        prune = bool_field(cmd, "prune", False)
        expect = cmd.get("expect")
        if expect is not None and not isinstance(expect, dict):
            raise InvalidArgument("expect", "must be a map of job id to version")
        return cls(specs=tuple(specs), prune=prune, max_jobs=opt_limit(cmd), expect=expect,
                   checked=check_specs(specs, cmd.get("at"), skip=keeps_env),
                   **client_fields(cmd))


@dataclass(frozen=True, slots=True, kw_only=True)
class _JobCommand(ClientCommand):
    """A client command naming one job and nothing else."""

    job: str
    """The job id."""

    WIRE: ClassVar[tuple[str, ...]] = ("job", "rid", "at")
    OMIT = {"rid": None}

    @classmethod
    def from_wire(cls, cmd: dict[str, Any]) -> _JobCommand:
        return cls(job=job_field(cmd), **client_fields(cmd))


@dataclass(frozen=True, slots=True, kw_only=True)
class DeleteJob(_JobCommand):
    """Remove a job (its active runs are cancelled, its history dropped)."""

    if_done: int | None = None
    """Only if the job is this version and done (a finished one-shot): the leader's
    ``done_retention``. None: unconditionally. (Command version 3.)"""

    OP = "delete_job"
    WIRE = ("job", "if_done", "rid", "at")
    OMIT = {"if_done": None, "rid": None}

    @classmethod
    def from_wire(cls, cmd: dict[str, Any]) -> DeleteJob:
        if_done = cmd.get("if_done")
        if if_done is not None and not is_int(if_done):
            raise InvalidArgument("if_done", "must be the job's version")
        return cls(job=job_field(cmd), if_done=if_done, **client_fields(cmd))


@dataclass(frozen=True, slots=True, kw_only=True)
class Pause(_JobCommand):
    """Pause a job: runs not started yet are cancelled; started ones finish."""

    OP = "pause"


@dataclass(frozen=True, slots=True, kw_only=True)
class Resume(ClientCommand):
    """Resume a paused job."""

    job: str
    """The job id."""
    catch_up: bool = False
    """Run the fire times missed while paused (else record them as one range)."""
    missed: int = 0
    """How many fire times were skipped (counted by the proposer, informational)."""

    OP = "resume"
    WIRE = ("job", "catch_up", "missed", "rid", "at")
    OMIT = {"rid": None}

    @classmethod
    def from_wire(cls, cmd: dict[str, Any]) -> Resume:
        job = job_field(cmd)
        catch_up = bool_field(cmd, "catch_up", False)
        count = cmd.get("missed", 0)
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise InvalidArgument("missed", "must be a count")
        return cls(job=job, catch_up=catch_up, missed=count, **client_fields(cmd))


@dataclass(frozen=True, slots=True, kw_only=True)
class Trigger(ClientCommand):
    """Run a job now, outside its schedule."""

    job: str
    """The job id."""
    force: bool = False
    """Run even if paused or if the overlap policy would refuse."""

    OP = "trigger"
    WIRE = ("job", "force", "rid", "at")
    OMIT = {"rid": None}

    @classmethod
    def from_wire(cls, cmd: dict[str, Any]) -> Trigger:
        return cls(job=job_field(cmd), force=bool_field(cmd, "force", False), **client_fields(cmd))


@dataclass(frozen=True, slots=True, kw_only=True)
class Drain(ClientCommand):
    """An operator drains (or undrains) a node."""

    node: str
    """The node id."""
    draining: bool
    """True to drain, False to undrain."""

    OP = "drain"
    WIRE = ("node", "draining", "rid", "at")
    OMIT = {"rid": None}

    @classmethod
    def from_wire(cls, cmd: dict[str, Any]) -> Drain:
        node = str_field(cmd, "node")
        draining = cmd.get("draining")
        if not isinstance(draining, bool):
            raise InvalidArgument("draining", "must be a boolean")
        return cls(node=node, draining=draining, **client_fields(cmd))


@dataclass(frozen=True, slots=True, kw_only=True)
class Transfer(ClientCommand):
    """Ask the leader to hand leadership over."""

    to: str | None
    """The node to hand it to, or None for the most caught-up peer."""

    OP = "transfer"
    WIRE = ("to", "rid", "at")
    OMIT = {"rid": None}

    @classmethod
    def from_wire(cls, cmd: dict[str, Any]) -> Transfer:
        to = cmd.get("to")
        if to is not None and not isinstance(to, str):
            raise InvalidArgument("to", "must be the id of a node of the cluster, or null")
        return cls(to=to, **client_fields(cmd))


@dataclass(frozen=True, slots=True, kw_only=True)
class Member(ClientCommand):
    """Change the replicated membership (``core/members.py``): ``seed`` it from the
    config file (only while empty), ``add`` or ``remove`` one node."""

    action: str
    """``seed``, ``add`` or ``remove``."""
    node: str | None = None
    """The node added or removed (add, remove)."""
    raft: str | None = None
    """Its Raft address (add, remove)."""
    api: str | None = None
    """Its API address (add, remove)."""
    members: tuple[Any, ...] = ()
    """The seed: maps with node, raft and api (seed)."""

    OP = "member"
    WIRE = ("action", "node", "raft", "api", "members", "rid", "at")
    OMIT = {"node": None, "raft": None, "api": None, "members": (), "rid": None}

    @classmethod
    def from_wire(cls, cmd: dict[str, Any]) -> Member:
        action = cmd.get("action")
        if action not in ("seed", "add", "remove"):
            raise InvalidArgument("action", "must be seed, add or remove")
        items = cmd.get("members", [])
        if not isinstance(items, list):
            raise InvalidArgument("members", "must be a list")
        fields: dict[str, Any] = {}
        for key in ("node", "raft", "api"):
            value = cmd.get(key)
            if value is not None and not isinstance(value, str):
                raise InvalidArgument(key, "must be a string")
            fields[key] = value
        return cls(action=action, members=tuple(items), **fields, **client_fields(cmd))


@dataclass(frozen=True, slots=True, kw_only=True)
class Backfill(ClientCommand):
    """Run a job's past fire times as ordinary runs (``core/backfill.py``). Always
    written as command version 5 (an older release stops on it)."""

    job: str
    """The job id."""
    version: int
    """The job version whose schedule gave ``fires`` (a job changed since refuses it)."""
    from_ms: int
    """The range's start, as asked (inclusive)."""
    to_ms: int
    """The range's end (inclusive; not after the command's ``at``)."""
    fires: tuple[int, ...]
    """The job's fire times in the range, ascending, found by the proposing node."""
    overlap: str = "queue"
    """``allow``, ``skip`` or ``queue``: what a fire time does while an on-time run of
    the job is active."""
    max_active: int = 1
    """Runs of the backfill active at once at most."""
    rerun: bool = False
    """Run fire times already recorded again, as new attempts of their run ids."""
    v: int = DEPS_VERSION

    OP = "backfill"
    WIRE = ("job", "version", "from_ms", "to_ms", "fires", "overlap", "max_active", "rerun",
            "rid", "at")
    OMIT = {"rid": None}

    @classmethod
    def from_wire(cls, cmd: dict[str, Any]) -> Backfill:
        from raftsched.core.records import MAX_ACTIVE, MAX_FIRES, OVERLAPS
        job = job_field(cmd)
        ints: dict[str, int] = {}
        for key in ("version", "from_ms", "to_ms", "max_active"):
            value: Any = cmd.get(key)
            if not is_int(value) or value < 0:
                raise InvalidArgument(key, "must be a non-negative integer")
            ints[key] = value
        fires = cmd.get("fires")
        if not isinstance(fires, list) or len(fires) > MAX_FIRES \
                or not all(is_int(t) for t in fires):
            raise InvalidArgument("fires", f"must be a list of at most {MAX_FIRES} times")
        overlap = cmd.get("overlap")
        if overlap not in OVERLAPS:
            raise InvalidArgument("overlap", f"must be one of {' | '.join(OVERLAPS)}")
        if not 1 <= ints["max_active"] <= MAX_ACTIVE:
            raise InvalidArgument("max", f"must be 1..{MAX_ACTIVE}")
        return cls(job=job, fires=tuple(fires), overlap=overlap,
                   rerun=bool_field(cmd, "rerun", False), version=ints["version"],
                   from_ms=ints["from_ms"], to_ms=ints["to_ms"],
                   max_active=ints["max_active"], **client_fields(cmd))


@dataclass(frozen=True, slots=True, kw_only=True)
class BackfillCancel(ClientCommand):
    """Cancel a running backfill (command version 5)."""

    backfill: str
    """The backfill's id (``bf-<n>``)."""
    v: int = DEPS_VERSION

    OP = "backfill_cancel"
    WIRE = ("backfill", "rid", "at")
    OMIT = {"rid": None}

    @classmethod
    def from_wire(cls, cmd: dict[str, Any]) -> BackfillCancel:
        return cls(backfill=str_field(cmd, "backfill"), **client_fields(cmd))


__all__ = ["ApplyJobs", "Backfill", "BackfillCancel", "DeleteJob", "Drain", "Member", "Pause",
           "PutJob", "PutJobs", "Resume", "Transfer", "Trigger"]
