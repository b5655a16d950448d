"""The leader's loop: the thin, clocked shell around the pure :func:`leader.plan`.

Only a node that Raft made leader plans, and only after it committed a ``leader``
record for its term (so plans of an older term are refused by the state). It
watches liveness: a dropped Raft connection releases the node's assigned-but-not-
started runs at once (safe: a start needs the current fence); a node silent for the
node timeout is declared lost and its started runs follow ``on_node_lost``.
The loop sleeps until the next due time (minus the lookahead) or until an applied
command wakes it; it never polls the job table.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from raftsched import events
from raftsched.clock import now_ms
from raftsched.errors import NotReady, RaftschedError
from raftsched.leader import Capacity, LeaderContext, plan

if TYPE_CHECKING:
    from raftsched.node import Node

log = logging.getLogger("raftsched.leader")

#: A Raft connection down this long releases the node's not-yet-started claims.
DISCONNECT_GRACE_S = 0.05
#: Liveness is checked at least this often while leading.
HOUSEKEEPING_S = 0.05
#: A due job the last plan could not place is looked at again after this long (or
#: when an applied command wakes the loop), not in a busy loop.
STALL_S = 0.02
#: The leader re-commits its record (with observed clock skews) this often.
LEADER_RECORD_S = 5.0
COMMIT_TIMEOUT_S = 3.0




class LeaderLoop:
    """See the module docstring. Runs on the node's event loop."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.active = False
        self.term: int | None = None
        self.since_ms = 0
        self.since_mono = 0.0
        self.last_seen: dict[str, float] = {}
        self.disc_since: dict[str, float] = {}
        self.released_assigned: set[str] = set()
        self.lost: set[str] = set()
        self.skew: dict[str, int] = {}
        self.last_record = 0.0
        self.plans = 0
        self.plan_seconds = 0.0
        self._wake = asyncio.Event()
        self._stopping = False

    def wake(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        self._stopping = True
        self._wake.set()

    def saw_heartbeat(self, node_id: str, at_ms: int) -> None:
        self.last_seen[node_id] = time.monotonic()
        self.lost.discard(node_id)
        # The sender's clock minus ours, give or take one commit (~1 ms on loopback).
        self.skew[node_id] = at_ms - now_ms()
        if node_id not in self.node.raft.state.nodes or not self.active:
            return
        if not self.node.raft.state.nodes[node_id].alive:
            self._wake.set()

    async def _sleep(self, seconds: float) -> None:
        self._wake.clear()
        try:
            await asyncio.wait_for(self._wake.wait(), timeout=max(seconds, 0.0))
        except TimeoutError:
            pass

    async def _commit(self, cmd: dict[str, Any]) -> dict[str, Any] | None:
        t0 = time.perf_counter()
        try:
            fut = asyncio.wrap_future(self.node.raft.submit(cmd))
            reply = await asyncio.wait_for(fut, COMMIT_TIMEOUT_S)
        except (NotReady, TimeoutError, RaftschedError) as exc:
            log.debug("%s not committed: %s", cmd.get("op"), exc)
            return None
        if self.node.metrics is not None:
            self.node.metrics.commit_latency(time.perf_counter() - t0)
        return reply

    async def run(self) -> None:
        while not self._stopping:
            raft = self.node.raft
            if not raft.is_leader() or not raft.ready():
                if self.active:
                    events.emit("leader.stepped_down", node=self.node.node_id, term=self.term)
                self.active = False
                await self._sleep(HOUSEKEEPING_S)
                continue
            term = raft.term()
            if not self.active or term != self.term:
                if not await self._establish(term):
                    await self._sleep(HOUSEKEEPING_S)
                    continue
            try:
                await self._liveness()
                if await self._plan_once():
                    continue
            except Exception:  # noqa: BLE001 - the loop must survive a bug in one tick
                log.exception("leader tick failed")
            await self._sleep(self._idle_delay())

    async def _establish(self, term: int) -> bool:
        """Commit our leadership record; plans of older terms are refused from then on."""
        since = now_ms()
        reply = await self._commit({"op": "leader", "node": self.node.node_id, "term": term,
                                    "at": since, "skew": {}})
        if not reply or not reply.get("ok"):
            return False
        self.active, self.term = True, term
        self.since_ms, self.since_mono = since, time.monotonic()
        self.last_record = self.since_mono
        # Every node gets a full node timeout from our start before we call it lost.
        self.last_seen = {}
        self.disc_since.clear()
        self.released_assigned.clear()
        # Peers already disconnected (typically the old leader, killed) lose their
        # not-yet-started claims before our first plan, not one grace period after it:
        # otherwise their jobs' next fires would see them active and be skipped.
        for addr, up in self.node.raft.connected_peers().items():
            node_id = self.node.raft_to_id.get(addr)
            if not up and node_id is not None:
                self.disc_since[node_id] = self.since_mono - DISCONNECT_GRACE_S
        log.info("leading in term %d", term)
        return True

    def _idle_delay(self) -> float:
        """After a plan that made no progress: until the next job falls due, but at
        least STALL_S when one is due already and could not be planned (no room, or an
        overlap decided at its fire time): an applied command wakes us sooner."""
        with self.node.raft.lock:
            nxt = self.node.raft.state.next_due_ms()
        delay = HOUSEKEEPING_S
        if nxt is not None:
            lead = nxt - self.node.cfg.timing.lookahead_ms - now_ms()
            delay = min(delay, max(lead / 1000, STALL_S))
        return delay

    async def _liveness(self) -> None:
        node = self.node
        mono = time.monotonic()
        connected = node.raft.connected_peers()
        timeout = node.cfg.timing.node_timeout_ms / 1000
        releases: list[dict[str, Any]] = []
        with node.raft.lock:
            st = node.raft.state
            for node_id, rec in st.nodes.items():
                if node_id == node.node_id or not rec.alive:
                    continue
                addr = next((a for a, n in node.raft_to_id.items() if n == node_id), None)
                conn = connected.get(addr, True) if addr is not None else True
                if conn:
                    self.disc_since.pop(node_id, None)
                    self.released_assigned.discard(node_id)
                else:
                    self.disc_since.setdefault(node_id, mono)
                last = max(self.last_seen.get(node_id, 0.0), self.since_mono)
                if mono - last > timeout and node_id not in self.lost:
                    self.lost.add(node_id)
                    releases.append({"op": "release", "node": node_id, "scope": "all",
                                     "reason": f"silent for {mono - last:.1f}s"})
                elif (not conn and node_id not in self.released_assigned
                      and mono - self.disc_since[node_id] >= DISCONNECT_GRACE_S
                      and any(st.runs[r].state == "assigned"
                              for r in st.by_node.get(node_id, ()))):
                    self.released_assigned.add(node_id)
                    releases.append({"op": "release", "node": node_id, "scope": "assigned",
                                     "reason": "disconnected"})
        for cmd in releases:
            cmd["at"] = now_ms()
            reply = await self._commit(cmd)
            if reply is None:
                self.lost.discard(cmd["node"])
                self.released_assigned.discard(cmd["node"])
            elif node.metrics is not None and reply.get("ok"):
                node.metrics.claims_released(len(reply.get("released", [])))
        if mono - self.last_record > LEADER_RECORD_S:
            self.last_record = mono
            await self._commit({"op": "leader", "node": node.node_id, "term": self.term,
                                "at": now_ms(), "skew": dict(self.skew)})

    def _capacities(self) -> tuple[Capacity, ...]:
        st = self.node.raft.state
        connected = self.node.raft.connected_peers()
        out = []
        for node_id, rec in sorted(st.nodes.items()):
            if not rec.alive or node_id in self.lost:
                continue
            addr = next((a for a, n in self.node.raft_to_id.items() if n == node_id), None)
            if node_id != self.node.node_id and addr is not None and not connected.get(addr,
                                                                                      True):
                continue
            out.append(Capacity(node_id=node_id, tags=frozenset(rec.tags), slots=rec.slots,
                                limit=rec.slots + rec.queue,
                                load=len(st.by_node.get(node_id, ()))))
        return tuple(out)

    async def _plan_once(self) -> bool:
        node = self.node
        t0 = time.perf_counter()
        with node.raft.lock:
            ctx = LeaderContext(node_id=node.node_id, term=self.term or 0, now_ms=now_ms(),
                                lookahead_ms=node.cfg.timing.lookahead_ms,
                                since_ms=self.since_ms, boot_ms=node.boot_ms,
                                live=self._capacities())
            cmd = plan(node.raft.state, ctx)
        self.plan_seconds += time.perf_counter() - t0
        if cmd is None:
            return False
        self.plans += 1
        reply = await self._commit(cmd)
        if reply is None or not reply.get("ok"):
            return False
        # Progress made: plan again at once (more may be due). A plan whose every item
        # was refused made none, so wait instead of spinning.
        total = len(cmd["fires"]) + len(cmd["place"]) + len(cmd["drop"]) + len(cmd["next"])
        return len(reply.get("rejected", [])) < total
