"""Consistent reads: a read is served only once this replica has applied everything
the cluster had committed when the read arrived.

A node's state right after a restart is a half-replayed past (its journal is applied
as the leader's commit index becomes known), and a follower may lag the leader. So a
read first commits a *barrier* (the state machine's no-op ``read`` command) through
the Raft log and waits until this node has applied it: every entry committed before
the read arrived precedes the barrier in the log, so it is applied too (a read index
taken through the log). Reads arriving in the same loop iteration share one barrier.
A barrier that does not land within the wait ends the read with ``not_ready`` (an
error, never a partial answer); ``stale=True`` skips all this and says so.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from raftsched.core.commands import Read
from raftsched.core.errors import NotReady, RaftschedError
from raftsched.node.observe.clock import now_ms

if TYPE_CHECKING:
    from raftsched.node.replica.port import ReplicaPort

#: How long a consistent read waits for this node to catch up before ``not_ready``.
READ_WAIT_S = 3.0
#: Pause before a barrier that failed (no leader yet) is tried again.
_RETRY_S = 0.05


class ReadBarrier:
    """Barriers for the reads of one node; every method runs on the node's loop."""

    def __init__(self, raft: ReplicaPort, node_id: str) -> None:
        self.raft = raft
        self.node_id = node_id
        #: The barrier not yet submitted, shared by the reads arriving before it is.
        self._next: asyncio.Future[None] | None = None
        self.barriers = 0

    async def wait(self, timeout: float = READ_WAIT_S) -> None:
        """Return once this node has applied every entry committed before the call;
        :class:`NotReady` if that takes longer than ``timeout``."""
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                await asyncio.wait_for(asyncio.shield(self._join()), left)
                return
            except TimeoutError:
                break
            except RaftschedError as exc:  # not committed (no leader yet): try again
                last = exc
            await asyncio.sleep(min(_RETRY_S, max(deadline - time.monotonic(), 0)))
        why = f" ({last.message})" if isinstance(last, RaftschedError) else ""
        raise NotReady(f"node {self.node_id} has not caught up with the cluster's commits "
                       f"within {timeout:g}s{why}; retry, ask another node, or read with "
                       "--stale / stale=True")

    def _join(self) -> asyncio.Future[None]:
        fut = self._next
        if fut is None:
            loop = asyncio.get_running_loop()
            fut = self._next = loop.create_future()
            loop.call_soon(self._submit, fut)
        return fut

    def _submit(self, fut: asyncio.Future[None]) -> None:
        if self._next is fut:
            self._next = None  # reads arriving from now on need a later barrier
        loop = asyncio.get_running_loop()
        self.barriers += 1
        try:
            done = self.raft.submit(Read(at=now_ms(), node=self.node_id))
        except RaftschedError as exc:  # overloaded, not leader-less: the readers retry
            _settle(fut, exc)
            return

        def landed(f: Any) -> None:  # in the Raft thread
            try:
                loop.call_soon_threadsafe(_settle, fut, f.exception())
            except RuntimeError:  # the loop has closed: nobody is waiting any more
                pass

        done.add_done_callback(landed)


def _settle(fut: asyncio.Future[None], exc: BaseException | None) -> None:
    if fut.done():
        return
    if exc is None:
        fut.set_result(None)
    else:
        fut.set_exception(exc)
        fut.exception()  # retrieved: a barrier nobody awaits any more is not an error


__all__ = ["READ_WAIT_S", "ReadBarrier"]
