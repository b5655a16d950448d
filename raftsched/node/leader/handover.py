"""Leadership hand-over: an operator's transfer, a draining leader's, and the one a
stopping node makes.

A base of :class:`~raftsched.node.leader.leaderloop.LeaderLoop` (its state is the
loop's). pysyncobj's TimeoutNow is refused while the target lags, and the target's
election fails when a newer entry reached us meanwhile: both are retried.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from raftsched.core import members
from raftsched.node.observe import events

if TYPE_CHECKING:
    from raftsched.core.machine import ClusterState
    from raftsched.node.config.addressbook import AddressBook
    from raftsched.node.observe.clock import Clock
    from raftsched.node.replica.raft import RaftNode

#: An operator's transfer that did not move within its 2 s is tried this many times.
ASKED_TRANSFER_TRIES = 3


class Handover:
    """The hand-over half of :class:`~raftsched.node.leader.leaderloop.LeaderLoop`."""

    # The loop's state these methods read and move (set by LeaderLoop).
    clock: Clock
    raft: RaftNode
    node_id: str
    raft_to_id: AddressBook
    term: int | None
    _wake: asyncio.Event
    _transfer_to: tuple[str | None, int] | None
    _asked_tries: int
    _last_transfer: float

    def request_transfer(self, to: str | None, term: int) -> None:
        """An operator asked the leader of ``term`` to hand leadership to node ``to`` (or
        anywhere). Kept even before this loop is active: the request can apply right
        after our leadership record, before the loop has seen that record commit (on a
        loaded machine a request dropped there was never carried out, yet answered)."""
        self._transfer_to = (to, term)
        self._wake.set()

    async def transfer(self, to: str | None = None, wait_s: float = 2.0) -> bool:
        """Hand leadership to node ``to`` (or the most caught-up peer) and wait until
        another node leads (``to`` if given); True if it did within ``wait_s``.

        pysyncobj's TimeoutNow is refused while the target lags, and the target's
        election fails when a newer entry reached us meanwhile (we may then win again):
        both are retried until the deadline."""
        raft = self.raft
        if not any(n != self.node_id for n in self.raft_to_id.values()):
            return False  # alone: no one to hand over to (and no hold on our commands)
        target = self.raft_to_id.raft_of(to) \
            if to is not None else None
        t0 = self.clock.monotonic()
        deadline = t0 + wait_s
        moved = False
        while self.clock.monotonic() < deadline:
            if raft.leader_term() is not None:
                try:
                    sent = await asyncio.wait_for(asyncio.wrap_future(
                        raft.transfer_leadership(target)), 1.0)
                except Exception:  # noqa: BLE001 - a timeout or a bug: retried below
                    sent = False
                step = self.clock.monotonic() + (0.3 if sent else 0.02)
                while (self.clock.monotonic() < min(step, deadline)
                       and raft.leader_term() is not None):
                    await asyncio.sleep(0.005)
                continue
            leader = raft.leader_addr()
            if leader is not None and leader != raft.self_addr and target in (None, leader):
                moved = True
                break
            await asyncio.sleep(0.005)
        events.emit("leader.transferred" if moved else "leader.transfer_failed",
                    node=self.node_id, to=self.raft_to_id.get(raft.leader_addr() or ""),
                    term=self.term, seconds=round(self.clock.monotonic() - t0, 3),
                    level=logging.INFO if moved else logging.WARNING)
        return moved

    async def _hand_over_if_draining(self) -> None:
        """A draining leader, or one asked to, hands leadership away (once a second at
        most when it does not move)."""
        asked, self._transfer_to = self._transfer_to, None
        if asked is not None and asked[1] != self.term:
            asked = None  # asked of another term's leader (ours or another node's)
        me = self.node_id

        def must_hand_over(st: ClusterState) -> bool:
            # Only to a node that takes work: with every node draining (`local` stopping
            # the whole cluster) leadership would go round, an election a second, while
            # the finishes the drain waits for need a leader.
            return (me in st.nodes and st.nodes[me].draining
                    and any(n != me and rec.alive and not rec.draining
                            and not members.is_removed(st, n)
                            for n, rec in st.nodes.items()))

        draining = self.raft.read(must_hand_over)
        if asked is None and not draining:
            return
        if asked is None and self.clock.monotonic() - self._last_transfer < 1.0:
            return
        self._last_transfer = self.clock.monotonic()
        moved = await self.transfer(asked[0] if asked is not None else None)
        if asked is not None and not moved and self._transfer_to is None:
            # The operator was answered: try again (a lagging target refuses TimeoutNow),
            # a bounded number of times so a target that cannot lead is given up on.
            self._asked_tries += 1
            if self._asked_tries < ASKED_TRANSFER_TRIES:
                self._transfer_to = asked
                return
        self._asked_tries = 0
