"""This node's liveness: heartbeats, the lease they earn, the guard's deadline and the
self-fence.

A node tells the cluster it lives by committing a ``heartbeat`` command every
``timing.heartbeat``. The send time of the newest heartbeat the cluster acknowledged is
the node's *lease*: the worker spawns a run only within the lease (see gate.py). A
node that reaches no quorum for the lease stops its runs itself, and the guard process
kills them if the node itself freezes (see guard.py); the leader releases them no
sooner (core/lease.py has the arithmetic for both sides).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from raftsched.core import lease, queries
from raftsched.core.commands import Heartbeat
from raftsched.core.errors import RaftschedError
from raftsched.node.observe import events
from raftsched.node.observe.clock import SYSTEM_CLOCK, Clock

if TYPE_CHECKING:
    from raftsched.node.config.config import NodeConfig, Timing
    from raftsched.node.replica.port import ReplicaPort
    from raftsched.node.worker.guard import Guard
    from raftsched.node.worker.worker import WorkerPool

log = logging.getLogger("raftsched.node")


class Liveness:
    """See the module docstring. Every method runs on the node's event loop."""

    def __init__(self, *, raft: ReplicaPort, worker: WorkerPool, guard: Guard | None,
                 me: NodeConfig, timing: Timing, boot_ms: int, features: tuple[str, ...],
                 on_event: Callable[[str, dict[str, Any]], None] | None = None,
                 clock: Clock = SYSTEM_CLOCK,
                 idle_ok: Callable[[], bool] = lambda: True,
                 contact_ok: Callable[[], bool] = lambda: False) -> None:
        #: Where it reads time (the worker's clock: the lease is read there).
        self.clock = clock
        self.raft = raft
        self.worker = worker
        self.guard = guard
        self.me = me
        self.timing = timing
        self.boot_ms = boot_ms
        #: The commands this release knows, as every heartbeat announces them.
        self.features = features
        #: Send time (monotonic) of the newest acknowledged heartbeat, for the guard.
        self.last_ack_send = self.clock.monotonic()
        #: Send time (monotonic) of the newest heartbeat the cluster acknowledged: the
        #: node's lease. Nothing before the first acknowledgement.
        self.lease_base = float("-inf")
        #: How long the newest acknowledged heartbeat took to commit (seconds).
        self.ack_latency = 0.0
        #: Whether this node stopped its runs for want of a quorum (until the next ack).
        self.fenced = False
        #: ``on_event(name, fields)`` for quorum.lost/quorum.back (the node's live feed).
        self.on_event = on_event
        #: When (monotonic) the last acknowledged heartbeat before a quorum loss was
        #: sent, while the loss lasts; None with the quorum (or before it is first had).
        self.lost_since: float | None = None
        #: Whether this node held a run at its last heartbeat's send or since: its
        #: next heartbeat then comes at the busy period, not the idle one (see run).
        self._busy = True
        #: The guard's deadline as last sent (sent again only when it moves).
        self._guard_at: float | None = None
        #: The loop's sleep, while it sleeps: a nudge ends it.
        self._nap: asyncio.Future[None] | None = None
        #: Whether every member's leader loop reads idle heartbeats as such (a rolling
        #: upgrade: an older leader counts a 1 s heartbeat 0.5 s late and slows the
        #: cluster's planning); read at each send.
        self.idle_ok = idle_ok
        #: Whether every member's leader reads an idle node's Raft contact as its
        #: liveness (leader/contact.py): an idle node then heartbeats only as a refresh
        #: and reads its quorum from its Raft thread; read at each turn while idle.
        self.contact_ok = contact_ok

    def _acked(self, sent_at: float, fut: asyncio.Future[Any]) -> None:
        """A heartbeat sent at ``sent_at`` committed: the lease and the guard's deadline
        move on at once (not at the heartbeat loop's next turn: a run may be about to
        start on the strength of it)."""
        if fut.cancelled() or fut.exception() is not None:
            # Not committed (a leader change, a refusal): the next one comes at the
            # busy period, so an idle node survives a lost heartbeat as a busy one does.
            self.nudge()
            return
        if sent_at <= self.lease_base:
            return
        self.lease_base = self.last_ack_send = sent_at
        #: How long the cluster took to answer it (a busy cluster renews more often).
        self.ack_latency = self.clock.monotonic() - sent_at
        self.fenced = False
        self._push_guard()
        if self.lost_since is not None:
            self._say("quorum.back", logging.INFO, without_ms=int(
                (self.clock.monotonic() - self.lost_since) * 1000))
            self.lost_since = None

    def _say(self, event: str, level: int, **fields: Any) -> None:
        """An event line, and the same in the node's live feed: a quorum loss commits
        nothing, so no replicated effect can tell a watcher of it."""
        events.emit(event, node=self.me.id, level=level, **fields)
        if self.on_event is not None:
            self.on_event(event, fields)

    def _push_guard(self) -> None:
        if self.guard is not None:
            # When our own self-fence would have killed a SIGTERM-proof run: from the
            # last acknowledged heartbeat, the lease, up to 0.1 s until the loop sees
            # it, then its SIGKILL grace. The leader releases no sooner (core/lease.py).
            after_ms = lease.guard_after_ms(self.timing.node_timeout_ms)
            at = self.last_ack_send + after_ms / 1000
            if at != self._guard_at:  # an unchanged deadline is one wakeup of two processes
                self._guard_at = at
                self.guard.deadline(at)

    def nudge(self) -> None:
        """A run was assigned to this node, which held none, or it began draining:
        heartbeat at the busy period from now on, and at once if the last one is that
        old (the run may spawn only within the lease; a drain's heartbeat offers no
        slots). Called on the event loop."""
        self._busy = True
        nap = self._nap
        if nap is not None and not nap.done():
            nap.set_result(None)

    async def _sleep(self, seconds: float) -> None:
        """Sleep ``seconds``, or less if :meth:`nudge` comes first."""
        loop = asyncio.get_running_loop()
        nap = self._nap = loop.create_future()
        timer = loop.call_later(seconds, _wake, nap)
        try:
            await nap
        finally:
            timer.cancel()
            self._nap = None

    def _heard(self, now: float) -> None:
        """Idle, in contact mode: the quorum this node's Raft thread last knew of (its
        leader's append, or a majority's answers while it leads) counts as an
        acknowledgement for the self-fence and the guard, not for the lease (nothing
        spawns on it: a run assigned here makes the node busy and its next heartbeat's
        acknowledgement is what a spawn waits for)."""
        age = self.raft.quorum_contact_age()
        if age is None:
            return
        seen = now - age
        if seen <= self.last_ack_send:
            return
        self.last_ack_send = seen
        self.fenced = False
        if self.lost_since is not None:
            self._say("quorum.back", logging.INFO, without_ms=int(
                (now - self.lost_since) * 1000))
            self.lost_since = None

    def spawn_lease(self) -> float:
        """The lease a spawn may count on (see gate.py): the newest acknowledged
        heartbeat's send, unless Raft contact was read as this node's quorum since (it
        was idle then, and its self-fence and guard count from that contact, which the
        leader stops reading once the node holds a run): then none until the next
        heartbeat is acknowledged, which brings both back to its send."""
        return self.lease_base if self.lease_base >= self.last_ack_send else float("-inf")

    def _listed(self) -> bool:
        """The cluster counts this incarnation alive (a leader may have counted it lost
        while it was frozen or cut off: only a heartbeat brings it back)."""
        rec = self.raft.read(functools.partial(queries.node_incarnation, self.me.id))
        return rec == (self.boot_ms, True)

    def _heartbeat(self) -> Heartbeat:
        draining = self.worker.draining
        return Heartbeat(
            node=self.me.id, at=self.clock.now_ms(), boot=self.boot_ms,
            # Draining: no room, so the leader places nothing new here.
            slots=0 if draining else self.me.workers, queue=0 if draining else self.me.queue,
            tags=tuple(self.me.tags), api=self.me.api, pid=os.getpid(),
            features=self.features)

    async def run(self) -> None:
        """Tell the cluster this node lives; stop our runs if we cannot reach a quorum for
        half the node timeout (the leader releases them after the full timeout)."""
        t = self.timing
        busy_period = t.heartbeat_ms / 1000
        idle_ms = lease.idle_heartbeat_ms(t.node_timeout_ms, t.heartbeat_ms)
        # pysyncobj may never call back a command forwarded to a leader that died: a
        # heartbeat unanswered this long is abandoned and a new one sent (a stuck one
        # once left the lease stale for good while starts committed fine).
        give_up = max(2 * busy_period, 0.5)
        contact_s = lease.contact_heartbeat_ms(t.node_timeout_ms) / 1000
        pending: asyncio.Future[Any] | None = None
        sent_at = 0.0
        tick = lease.FENCE_TICK_MS / 1000
        while True:
            now = self.clock.monotonic()
            # Busy: a run held here at the last send or since (nudge), or now. An idle
            # node heartbeats at the idle period; its lease may lapse (it has nothing to
            # spawn), its quorum counts as lost only as much later (lease.fence_after_ms).
            busy = self._busy or bool(self.worker.local) or self.worker.draining
            period_ms = t.heartbeat_ms if busy else idle_ms
            period = period_ms / 1000
            # Idle, once every member reads Raft contact (leader/contact.py): the loop
            # still turns every idle period, but a heartbeat is only a refresh.
            contact = not busy and self.idle_ok() and self.contact_ok()
            # A node the cluster counts lost is not in contact whatever its Raft thread
            # hears (its answers may not get through), nor is one that counted its
            # quorum lost (an append read as it wakes from a pause may be a deposed
            # leader's, queued in its socket): only a committed heartbeat brings either
            # back.
            trusted = not contact or (not self.fenced and self._listed())
            if contact and trusted:
                self._heard(now)
            fence_after = lease.fence_after_ms(t.node_timeout_ms, period_ms,
                                               t.heartbeat_ms) / 1000
            # One heartbeat per period while the cluster answers quickly (a new one as
            # soon as the last was answered sent ~26 a second over three nodes: most of an
            # idle cluster's CPU); back to back while answers are slow, so a busy
            # cluster's lease stays as fresh as its commits allow; and a new one at once
            # when the last went unanswered too long.
            slow = busy and self.ack_latency > period / 4
            if contact:
                due = now - sent_at >= contact_s or not trusted
            else:
                due = now - sent_at >= period or slow
            unanswered = pending is not None and not pending.done()
            if (not unanswered and due) or (unanswered and now - sent_at > give_up):
                sent_at = now
                self._busy = bool(self.worker.local) or not self.idle_ok()
                try:
                    fut = self.raft.submit(self._heartbeat())
                    pending = asyncio.wrap_future(fut)
                    pending.add_done_callback(functools.partial(self._acked, sent_at))
                except RaftschedError:
                    pending = None
            self._push_guard()
            if now - self.last_ack_send > fence_after and not self.fenced:
                self.fenced = True
                if self.lease_base > float("-inf"):  # had one: lost it (not a boot)
                    self.lost_since = self.last_ack_send
                    self._say("quorum.lost", logging.WARNING, without_ms=int(
                        (now - self.last_ack_send) * 1000), reason="no heartbeat of this "
                        "node committed" + (", no leader heard" if contact else "")
                        + ": it starts nothing, and stops its runs")
                self.worker.self_fence("no quorum for %.1fs" % (now - self.last_ack_send))
            # Overdue (a heartbeat unanswered for a tick, or none acknowledged for a period
            # and a tick): look every tick, so the self-fence comes within
            # lease.FENCE_TICK_MS of its time. Otherwise sleep until the next is due.
            overdue = (pending is not None and not pending.done() and now - sent_at > tick) \
                or now - self.last_ack_send > period + tick
            until_next = tick if slow else period if contact else sent_at + period - now
            await self._sleep(max(min(until_next, tick) if overdue else until_next, 0.01))


def _wake(nap: asyncio.Future[None]) -> None:
    if not nap.done():
        nap.set_result(None)


__all__ = ["Liveness"]
