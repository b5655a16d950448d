"""The node's side of declarative apply: the ``diff_apply`` read and the ``apply`` write.

Both validate every spec where it enters (as ``put_jobs`` does: size, call prefixes, the
env mask) and compute the change with :func:`raftsched.core.apply.plan_apply` from a copy
of the jobs it concerns, read through ``raft.read`` and compared outside the lock. ``apply``
then commits one command; the state machine plans it again against the state it applies
to (and refuses it whole if a job changed since the diff the client showed).
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from raftsched.core import queries
from raftsched.core.apply import Change, plan_apply
from raftsched.core.cmdbase import DEPS_FEATURE, any_bounds, any_deps
from raftsched.core.codec import packb
from raftsched.core.commands import ApplyJobs
from raftsched.core.errors import Conflict, InvalidArgument, LimitExceeded
from raftsched.core.machine import MAX_PUT_BATCH, ClusterState
from raftsched.core.members import REMOVED
from raftsched.core.model import ENV_MASK, JobSpec

if TYPE_CHECKING:
    from raftsched.node.config.config import Limits
    from raftsched.node.replica.port import ReplicaPort
    from raftsched.node.replica.reads import ReadBarrier
    from raftsched.node.replica.writes import ClientWrites

#: What a diff shows for an env value that the apply changes (values are never shown).
CHANGED_MASK = ENV_MASK + " (changed)"
_SPEC_OPS = frozenset({"put_job", "put_jobs", "apply", "diff_apply"})

Op = Callable[[dict[str, Any]], Awaitable[Any]]


@dataclass(frozen=True, kw_only=True)
class Features:
    """Which members announce the commands of this release (a rolling upgrade): built
    by the node, used by its router, the leader loop and the notifier."""

    #: The replica: the members' last heartbeats and the replicated membership.
    raft: ReplicaPort
    #: The config file's node ids: the members until the membership is seeded.
    config_ids: Sequence[str]

    def missing(self, feature: str) -> list[str]:
        """The members whose last heartbeat did not list ``feature`` (an older release:
        it would refuse the command and its state would part from the others')."""
        cfg_ids = list(self.config_ids)

        def missing(st: ClusterState) -> list[str]:
            known = st.nodes
            # The replicated membership once there is one (the TOML only seeds it).
            ids = [m.node_id for m in st.members.values() if m.status != REMOVED] \
                if st.members else cfg_ids
            return [n for n in ids if n in known and feature not in (known[n].features or ())]

        return sorted(self.raft.read(missing))

    def check(self, op: str, args: dict[str, Any]) -> None:
        """Refuse a request whose command an older member could not apply (until every
        member runs this release): ``apply``, backfills, and specs that use ``notify``,
        bounds, ``http``, ``after`` or ``concurrency``."""
        needed = []
        if op in ("apply", "diff_apply"):
            needed.append("apply")
        if op in _SPEC_OPS:
            specs = args.get("specs") if op != "put_job" else [args.get("spec")]
            for field in ("notify", "http"):
                if isinstance(specs, list) and any(isinstance(s, dict) and field in s
                                                   for s in specs):
                    needed.append(field)
            if isinstance(specs, list) and any_bounds(specs):
                needed.append("bounds")
            if isinstance(specs, list) and any_deps(specs):
                needed.append(DEPS_FEATURE)
        if op in ("backfill", "backfill_cancel"):
            needed.append(DEPS_FEATURE)
        for feature in needed:
            if (old := self.missing(feature)):
                raise Conflict(feature, f"node(s) {', '.join(old)} run an older raftsched "
                                        f"that cannot apply it; finish the upgrade of every "
                                        f"node first")


class ApplyOps:
    """``apply`` and ``diff_apply`` (see the module docstring). Every method runs on the
    node's event loop.

    :param raft: the replica read from.
    :param writes: commits the ``apply`` command.
    :param reads: the read barrier (the diff is against a caught-up state).
    :param limits: the cluster's size limits.
    :param allowed_call_prefixes: the ``call`` targets a spec may name (None: any), read
        at each request: an embedded app adds its own module while the node runs.
    """

    def __init__(self, *, raft: ReplicaPort, writes: ClientWrites, reads: ReadBarrier,
                 limits: Limits,
                 allowed_call_prefixes: Callable[[], tuple[str, ...] | None]) -> None:
        self.raft = raft
        self.writes = writes
        self.reads = reads
        self.limits = limits
        self.allowed = allowed_call_prefixes

    def ops(self) -> dict[str, Op]:
        """The API operations served here, by name."""
        return {"apply": self.apply, "diff_apply": self.diff_apply}

    def _args(self, args: dict[str, Any]) -> tuple[list[Any], bool]:
        specs = args.get("specs")
        if not isinstance(specs, list) or len(specs) > MAX_PUT_BATCH:
            raise InvalidArgument("specs", f"must be a list of at most {MAX_PUT_BATCH} specs")
        prune = args.get("prune", False)
        if not isinstance(prune, bool):
            raise InvalidArgument("prune", "must be a boolean")
        if not specs and not prune:
            raise InvalidArgument("specs",
                                  "no jobs given (an empty set applies only with prune)")
        limit = self.limits.max_spec_bytes
        for i, spec in enumerate(specs):
            if (size := len(packb(spec))) > limit:
                raise LimitExceeded("max_spec_bytes",
                                    f"specs[{i}] is {size} bytes, limit {limit}")
        return specs, prune

    async def _changes(self, specs: list[Any], prune: bool) -> list[Change]:
        await self.reads.wait()
        raft = self.raft
        named = {s.get("id") for s in specs if isinstance(s, dict)}
        ids = raft.read(queries.job_ids) if prune else []
        current = raft.read(functools.partial(
            queries.spec_versions, [j for j in named if isinstance(j, str)]))
        if prune:
            gone = [j for j in ids if j not in named]
            current.update(raft.read(functools.partial(queries.spec_versions, gone[:1001])))
        return plan_apply(specs, current, all_ids=ids, prune=prune,
                          allowed_call_prefixes=self.allowed())

    async def diff_apply(self, args: dict[str, Any]) -> Any:
        """What ``apply`` with these specs would change, with the jobs' specs before and
        after (env values masked; a changed one shows as ``*** (changed)``)."""
        specs, prune = self._args(args)
        changes = await self._changes(specs, prune)
        before = self.raft.read(functools.partial(
            queries.job_specs, [ch.job for ch in changes if ch.action in ("update", "remove")]))
        out = []
        for ch in changes:
            if ch.action == "unchanged":
                continue
            out.append({"action": ch.action, "job": ch.job, "fields": list(ch.fields),
                        "version": ch.version, "before": _shown(before.get(ch.job), ()),
                        "after": _shown(ch.spec, ch.fields if ch.action == "update"
                                        else tuple(f"env.{k}" for k in (ch.spec.env if ch.spec
                                                                        else ())))})
        return {"changes": out,
                "unchanged": [ch.job for ch in changes if ch.action == "unchanged"],
                "expect": {ch.job: ch.version for ch in changes}}

    async def apply(self, args: dict[str, Any]) -> Any:
        """Commit one ``apply`` command (all of it or nothing)."""
        specs, prune = self._args(args)
        expect = args.get("expect")
        if expect is not None and (not isinstance(expect, dict) or not all(
                isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool)
                for k, v in expect.items())):
            raise InvalidArgument("expect", "must be a map of job id to version")
        changes = await self._changes(specs, prune)  # refuses bad specs before any commit
        new = sum(ch.action == "create" for ch in changes)
        gone = sum(ch.action == "remove" for ch in changes)
        count = self.raft.read(queries.job_count)
        max_jobs = self.limits.max_jobs
        if new and count + new - gone > max_jobs:
            raise LimitExceeded("max_jobs", f"the cluster holds {count} jobs")
        # The specs as given and validated here, {keep = true} values included: the state
        # machine resolves them against the jobs as they are when the command applies.
        cmd = ApplyJobs(specs=tuple(specs), prune=prune, max_jobs=max_jobs,
                        expect=expect, at=0)
        reply = await self.writes.submit(cmd, args.get("rid"))
        return {"results": reply["results"], "unchanged": reply["unchanged"]}


def _shown(spec: JobSpec | None, fields: tuple[str, ...]) -> dict[str, Any] | None:
    if spec is None:
        return None
    out = spec.redacted()
    out["env"] = {k: CHANGED_MASK if f"env.{k}" in fields else ENV_MASK for k in spec.env}
    return out


__all__ = ["CHANGED_MASK", "ApplyOps", "Features"]
