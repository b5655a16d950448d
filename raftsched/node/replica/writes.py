"""Client writes: commit a client command through elections, exactly once.

A client command carries a request id (``rid``); the state machine answers a repeated id
with its first reply. So a write that timed out or met an election is simply submitted
again with the same id until it commits or the deadline passes: it is applied once
whatever the retries. A node cut off from the quorum says so at once instead.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from raftsched.core.commands import ClientCommand, Drain, Member, PutJob, Trigger
from raftsched.core.errors import Conflict, InvalidArgument, NotReady, from_wire
from raftsched.node.observe.clock import now_ms

if TYPE_CHECKING:
    from raftsched.node.replica.port import ReplicaPort

#: How long a client write may keep retrying through elections before it fails.
WRITE_DEADLINE_S = 10.0
#: A write that lost the quorum while retrying gives up after this long (not the whole
#: deadline): the quorum rarely comes back sooner, and the client should hear why.
WRITE_NO_QUORUM_S = 2.0
#: The keys of a client command's reply, by op (a duplicate must have them too).
_REPLY_KEYS = {"put_job": ("job", "version", "created"), "put_jobs": ("results",),
               "apply": ("results", "unchanged"),
               "drain": ("node", "draining"), "transfer": ("from", "to", "term"),
               "member": ("node", "status", "raft", "api"),
               "delete_job": ("job",), "pause": ("job", "version"),
               "resume": ("job", "version"), "trigger": ("run_id", "state"),
               "certify": ("released", "already"), "backfill": ("backfill",),
               "backfill_cancel": ("backfill",)}


def check_rid(rid: Any) -> str:
    """The caller's request id, or a new one when it gave none."""
    if rid is None:
        return uuid.uuid4().hex
    if not isinstance(rid, str) or not 0 < len(rid) <= 64:
        raise InvalidArgument("rid", "must be a string of 1..64 chars")
    return rid


class ClientWrites:
    """Quorum checks and client commits for one node; every method runs on its loop.

    :param raft: the replica commands are submitted to.
    :param quorum_problem: None while this node reaches a quorum, else why not.
    :param quorum_grace_s: how long a node without a quorum waits for one (peers
        connect within an election's time after a boot or a blip).
    """

    def __init__(self, *, raft: ReplicaPort, quorum_problem: Callable[[], str | None],
                 quorum_grace_s: float) -> None:
        self.raft = raft
        self.quorum_problem = quorum_problem
        self.quorum_grace_s = quorum_grace_s

    async def await_quorum(self) -> None:
        """Return once this node reaches a quorum; NotReady naming the problem when it has
        not for an election's time (peers connect within that after a boot or a blip)."""
        deadline = time.monotonic() + self.quorum_grace_s
        while (problem := self.quorum_problem()) is not None:
            if time.monotonic() >= deadline:
                raise NotReady(problem)
            await asyncio.sleep(0.05)

    async def submit(self, cmd: ClientCommand, rid: Any) -> dict[str, Any]:
        """Commit a client command, retrying through elections with the same request id
        (the state machine answers a repeated id with the first reply)."""
        cmd = replace(cmd, rid=check_rid(rid))
        await self.await_quorum()  # fail fast and say why, not after a 10 s timeout
        started = time.monotonic()
        deadline = started + WRITE_DEADLINE_S
        delay = 0.05
        while True:
            cmd = replace(cmd, at=now_ms()).written()
            try:
                fut = asyncio.wrap_future(self.raft.submit(cmd))
                reply = await asyncio.wait_for(fut, max(deadline - time.monotonic(), 0.1))
                break
            except (NotReady, TimeoutError) as exc:
                if (problem := self.quorum_problem()) is not None and \
                        time.monotonic() - started > WRITE_NO_QUORUM_S:
                    raise NotReady(problem, maybe_committed=True) from None
                if time.monotonic() + delay > deadline:
                    raise NotReady(f"no commit within {WRITE_DEADLINE_S:.0f}s: {exc}",
                                   maybe_committed=True) from None
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.5)
        if not reply.get("ok"):
            raise from_wire(reply.get("error"))
        if reply.get("duplicate") and not _same_request(cmd, reply):
            # The state machine answers a repeated rid with the first reply; a rid reused
            # for another op or job must not be misreported as this one's result.
            raise Conflict("rid", "this request id was already used by a different "
                                  "request; use a new rid for a new request")
        return reply


def _same_request(cmd: ClientCommand, reply: dict[str, Any]) -> bool:
    """Could ``reply`` (a deduplicated one) be the answer to ``cmd``?"""
    if set(reply) - {"ok", "duplicate"} != set(_REPLY_KEYS.get(cmd.OP, ())):
        return False
    if isinstance(cmd, PutJob):
        return bool(reply["job"] == cmd.spec["id"])
    if isinstance(cmd, Trigger):
        return isinstance(reply["run_id"], str) and reply["run_id"].startswith(cmd.job + "@")
    if isinstance(cmd, (Drain, Member)):
        return bool(reply["node"] == cmd.node)
    job = getattr(cmd, "job", None)
    return job is None or reply.get("job") == job


__all__ = ["WRITE_DEADLINE_S", "ClientWrites", "check_rid"]
