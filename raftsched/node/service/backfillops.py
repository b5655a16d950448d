"""The API's backfill operations: start one, cancel one, list them.

``backfill`` finds the fire times of the job's schedule in the range here, outside the
state lock, from the job version it read (the command names that version: a job changed
since is refused), and commits one ``backfill`` command; the state machine does the rest
(:mod:`raftsched.core.backfill`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from raftsched.core import backfill, queries
from raftsched.core.commands import Backfill, BackfillCancel
from raftsched.core.durations import parse_timestamp
from raftsched.core.errors import InvalidArgument, UnknownJob
from raftsched.core.trigger import fire_times
from raftsched.node.observe.clock import now_ms
from raftsched.node.service.jobops import job_id_arg

if TYPE_CHECKING:
    from raftsched.node.replica.port import ReplicaPort
    from raftsched.node.replica.reads import ReadBarrier
    from raftsched.node.replica.writes import ClientWrites

Op = Callable[[dict[str, Any]], Awaitable[Any]]


def time_arg(args: dict[str, Any], key: str) -> int:
    """``from``/``to``: RFC 3339 text or epoch ms; errors name the key."""
    value = args.get(key)
    if isinstance(value, str):
        return parse_timestamp(value, key)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise InvalidArgument(key, "must be an RFC 3339 time (2026-12-01T00:00:00Z) or epoch ms")


class BackfillOps:
    """``backfill``, ``backfill_cancel`` and ``backfills`` (see the module docstring)."""

    def __init__(self, *, raft: ReplicaPort, writes: ClientWrites, reads: ReadBarrier) -> None:
        self.raft = raft
        self.writes = writes
        self.reads = reads

    def ops(self) -> dict[str, Op]:
        return {"backfill": self.backfill, "backfill_cancel": self.cancel,
                "backfills": self.backfills}

    async def backfill(self, args: dict[str, Any]) -> Any:
        job_id = job_id_arg(args)
        lo, hi = time_arg(args, "from"), time_arg(args, "to")
        now = now_ms()
        if lo > hi:
            raise InvalidArgument("from", "must not be after to")
        if lo > now:
            raise InvalidArgument("from", "is in the future: a backfill runs past fire times")
        hi = min(hi, now)
        overlap = args.get("overlap", "queue")
        if overlap not in backfill.OVERLAPS:
            raise InvalidArgument("overlap", f"must be one of {' | '.join(backfill.OVERLAPS)}")
        most = args.get("max", 1)
        if isinstance(most, bool) or not isinstance(most, int) \
                or not 1 <= most <= backfill.MAX_ACTIVE:
            raise InvalidArgument("max", f"must be 1..{backfill.MAX_ACTIVE} (runs of the "
                                         "backfill at once)")
        rerun = args.get("rerun", False)
        if not isinstance(rerun, bool):
            raise InvalidArgument("rerun", "must be a boolean")
        await self.reads.wait()
        found = self.raft.read(partial(queries.spec_version, job_id))
        if found is None:
            raise UnknownJob(job_id)
        spec, version = found
        if spec.after:
            raise InvalidArgument("id", f"{job_id} runs after {', '.join(spec.after)} and has "
                                        "no schedule of its own: backfill its parents")
        fires = fire_times(spec.schedule, lo - 1, hi, backfill.MAX_FIRES + 1)
        if not fires:
            raise InvalidArgument("from", f"no fire time of {job_id}'s schedule lies in "
                                          "that range")
        if len(fires) > backfill.MAX_FIRES:
            raise InvalidArgument("to", f"the range holds more than {backfill.MAX_FIRES} fire "
                                        "times: split it into several backfills")
        reply = await self.writes.submit(Backfill(
            job=job_id, version=version, from_ms=lo, to_ms=hi, fires=tuple(fires),
            overlap=overlap, max_active=most, rerun=rerun, at=0), args.get("rid"))
        return reply["backfill"]

    async def cancel(self, args: dict[str, Any]) -> Any:
        bf = args.get("backfill")
        if not isinstance(bf, str) or not 0 < len(bf) <= 64:
            raise InvalidArgument("backfill", "must be a backfill id (bf-<n>)")
        reply = await self.writes.submit(BackfillCancel(backfill=bf, at=0), args.get("rid"))
        return reply["backfill"]

    async def backfills(self, args: dict[str, Any]) -> Any:
        await self.reads.wait()
        job = args.get("job")
        items = self.raft.read(backfill.views)
        return {"backfills": [b for b in items if job is None or b["job"] == job]}


__all__ = ["BackfillOps", "time_arg"]
