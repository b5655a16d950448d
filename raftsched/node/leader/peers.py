"""The leader's watch over its peers: heartbeats, its own pauses, and the release of a
lost node's claims.

A base of :class:`~raftsched.node.leader.leaderloop.LeaderLoop` (its state is the loop's,
set in the loop's ``__init__`` and at each term's start): a dropped Raft connection
releases the node's assigned-but-not-started runs at once (safe: a start needs the
current fence); a disconnected node is declared lost once its lease has provably ended
(:mod:`raftsched.core.lease`, ~2/3 of the node timeout after its newest heartbeat), any
other node after the node timeout of silence; its started runs then follow
``on_node_lost``. Time this process did not run is taken out of every peer's silence.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

from raftsched.core import lease, queries, ticks
from raftsched.core.cmdbase import LEASE_FEATURE
from raftsched.core.commands import LeaderRecord, Release, ReleaseScope

if TYPE_CHECKING:
    from collections.abc import Callable

    from raftsched.core.commands import Command
    from raftsched.core.machine import ClusterState
    from raftsched.node.config.addressbook import AddressBook
    from raftsched.node.config.config import ClusterConfig
    from raftsched.node.leader.admission import Admission
    from raftsched.node.leader.contact import ContactWatch
    from raftsched.node.observe.clock import Clock
    from raftsched.node.replica.raft import RaftNode

log = logging.getLogger("raftsched.leader")

#: A Raft connection down this long releases the node's not-yet-started claims.
DISCONNECT_GRACE_S = 0.05
#: A follower's loop sleeps this long between looks: the node's role change wakes it
#: (Node passes it to RaftNode's ``on_state_changed``), so this only bounds a missed
#: wake. At HOUSEKEEPING_S an idle follower woke 20 times a second for nothing.
FOLLOWER_S = 1.0
#: The leader re-commits its record (with observed clock skews) this often.
LEADER_RECORD_S = 5.0
#: A sleep of PAUSE_TICK_S that takes PAUSE_S longer means this process was paused.
PAUSE_TICK_S = 0.2
PAUSE_S = 0.3


class LeaderMetrics(Protocol):
    """What the leader loop counts (the node's metrics)."""

    def commit_latency(self, seconds: float) -> None: ...

    def claims_released(self, n: int) -> None: ...


class PeerLiveness:
    """The liveness half of :class:`~raftsched.node.leader.leaderloop.LeaderLoop`."""

    # The loop's state these methods read and move (set by LeaderLoop).
    clock: Clock
    raft: RaftNode
    node_id: str
    cfg: ClusterConfig
    raft_to_id: AddressBook
    metrics: LeaderMetrics | None
    missing_feature: Callable[[str], list[str]]
    active: bool
    quiet: bool
    term: int | None
    since_mono: float
    last_seen: dict[str, float]
    last_hb: dict[str, int]
    _next_beat_s: dict[str, float]
    disc_since: dict[str, float]
    released_assigned: set[str]
    lost: set[str]
    skew: dict[str, int]
    _recorded_skew: dict[str, int]
    last_record: float
    last_tick: float
    paused_until: float
    _pause_credit: float
    admission: Admission
    contact: ContactWatch
    _wake: asyncio.Event
    _stopping: bool

    if TYPE_CHECKING:
        async def _commit(self, cmd: Command) -> dict[str, Any] | None: ...

    def saw_heartbeat(self, node_id: str, at_ms: int) -> None:
        mono = self.clock.monotonic()
        prev = self.last_seen.get(node_id)
        expected = self._next_beat_s.get(node_id)
        if prev is not None and expected is not None and self.active \
                and not self.contact.enabled(mono):
            # Heartbeats landing later than their period: a self-fence is near. Not
            # once idle nodes live by their Raft contact: a node then stops heartbeating
            # the moment its worker holds nothing, which the state may not show yet, so
            # the leader cannot know the period it was in; read as late, its next
            # heartbeat throttled every big instant (W5's lag p99 0.07 -> 0.7 s,
            # bench/results/2026-12-06-w5-bisect.md). Admission still reads commits,
            # follower lag, the Raft queue and tick gaps.
            self.admission.observe(heartbeat_late_s=mono - prev - expected)
        self.last_seen[node_id] = mono
        self.last_hb[node_id] = at_ms
        self.lost.discard(node_id)
        # The sender's clock minus ours, give or take one commit (~1 ms on loopback).
        self.skew[node_id] = at_ms - self.clock.now_ms()
        if not self.active:
            return
        held, dead = self.raft.read(partial(queries.node_beat, node_id))
        # A node holding no run heartbeats at the idle period until a run is assigned
        # to it; then at once at the busy one (core.lease.idle_heartbeat_ms). Its claim
        # is committed before its next heartbeat, so the node knows it by then.
        # (Once idle nodes' contact counts, their heartbeats are rare refreshes.)
        timing = self.cfg.timing
        idle_ms = (lease.contact_heartbeat_ms(timing.node_timeout_ms)
                   if self.contact.enabled(mono) else
                   lease.idle_heartbeat_ms(timing.node_timeout_ms, timing.heartbeat_ms))
        self._next_beat_s[node_id] = (timing.heartbeat_ms if held else idle_ms) / 1000
        if dead:
            self._wake.set()

    async def _watch_pauses(self) -> None:
        """Notice when this process did not run (SIGSTOP, a frozen VM, a stalled loop)."""
        while not self._stopping:
            before = self.clock.monotonic()
            # Only a leader's timers take a pause out (a pause noted before its term
            # began is dropped: _paused), and only where a claim is held or a peer cut
            # off (a pause shorter than a tick may go unseen: a live node's silence then
            # looks that much longer): elsewhere it looks once a second, not five times.
            tick = PAUSE_TICK_S if self.active and not self.quiet else \
                ticks.coalesced(before, FOLLOWER_S)
            await asyncio.sleep(tick)
            gap = self.clock.monotonic() - before - tick
            if gap > PAUSE_S:
                self.note_pause(gap)

    def note_pause(self, gap_s: float) -> None:
        """This process did not run for ``gap_s`` seconds, until now (seen by the pause
        watcher): the next liveness check takes that time out of every peer's silence."""
        self.paused_until = self.clock.monotonic()
        self._pause_credit += gap_s
        log.warning("this node did not run for %.1fs", gap_s)

    def _paused(self, mono: float) -> None:
        """While we did not run, the other nodes' silence was our deafness, not evidence
        that they are gone: each silence (and disconnection, and our own term's start)
        is moved on by the time we did not run, never past now. Only that time: the
        silence before it still counts. (Restarting every timer from the end of the
        pause would let a loaded leader whose loop stalls every few seconds postpone a
        dead node's release without end: docs/architecture.md.)"""
        if self.paused_until <= self.last_tick:
            # A pause before our timers' baseline (e.g. before this term began) is in
            # none of them: its credit must not move a later silence on.
            self._pause_credit = 0.0
            self.last_tick = mono
            return
        self.last_tick = mono
        credit, self._pause_credit = self._pause_credit, 0.0
        self.since_mono = min(mono, self.since_mono + credit)
        for node_id, seen in self.last_seen.items():
            self.last_seen[node_id] = min(mono, seen + credit)
        for node_id, since in self.disc_since.items():
            self.disc_since[node_id] = min(mono, since + credit)

    async def _liveness(self) -> None:
        mono = self.clock.monotonic()
        self._paused(mono)
        connected = self.raft.connected_peers()
        timeout_ms = self.cfg.timing.node_timeout_ms
        timeout = timeout_ms / 1000
        lease_wait = lease.release_after_ms(timeout_ms) / 1000
        releases: list[Release] = []
        alive = self.raft.read(queries.alive_nodes)
        # An idle follower answering our appends lives (contact.py): only ever later.
        for node_id, at in self.contact.seen(mono, (
                n for n in alive if n != self.node_id and n not in self.lost)).items():
            if at > self.last_seen.get(node_id, 0.0):
                self.last_seen[node_id] = at
        # (Each release is checked again when it applies: the view may be stale.)
        for node_id in alive:
            if node_id == self.node_id:
                continue
            addr = self.raft_to_id.raft_of(node_id)
            conn = connected.get(addr, True) if addr is not None else True
            if conn:
                self.disc_since.pop(node_id, None)
                self.released_assigned.discard(node_id)
            else:
                self.disc_since.setdefault(node_id, mono)
            last = max(self.last_seen.get(node_id, 0.0), self.since_mono)
            verdict = lease.release_verdict(
                silent_s=mono - last, connected=conn,
                disconnected_s=mono - self.disc_since.get(node_id, mono),
                disconnect_grace_s=DISCONNECT_GRACE_S,
                timeout_s=timeout, lease_wait_s=lease_wait, lost=node_id in self.lost,
                assigned_released=node_id in self.released_assigned,
                holds_assigned=functools.partial(self.raft.read,
                                                 functools.partial(_holds_assigned, node_id)),
                lease_known=functools.partial(self._lease_known, node_id))
            if verdict == "silent":
                self.lost.add(node_id)
                releases.append(Release(node=node_id, scope=ReleaseScope.all,
                                        reason=f"silent for {mono - last:.1f}s",
                                        term=self.term, leader=self.node_id, at=0))
            elif verdict == "lease":
                self.lost.add(node_id)
                releases.append(Release(node=node_id, scope=ReleaseScope.all,
                                        reason=f"disconnected, lease over ({mono - last:.1f}s)",
                                        term=self.term, leader=self.node_id, at=0,
                                        hb=self.last_hb[node_id]))
            elif verdict == "assigned":
                self.released_assigned.add(node_id)
                releases.append(Release(node=node_id, scope=ReleaseScope.assigned,
                                        reason="disconnected", term=self.term,
                                        leader=self.node_id, at=0))
        for cmd in releases:
            reply = await self._commit(replace(cmd, at=self.clock.now_ms()))
            if reply is None or not reply.get("ok"):
                # Not committed, or refused (a newer heartbeat, another term): look again.
                self.lost.discard(cmd.node)
                self.released_assigned.discard(cmd.node)
            elif self.metrics is not None and reply.get("ok"):
                self.metrics.claims_released(len(reply.get("released", [])))
        if mono - self.last_record > LEADER_RECORD_S and self.skew != self._recorded_skew:
            # Only what moved: an idle cluster's heartbeats are rare (contact.py), and an
            # unchanged record was an entry every node synced every 5 s for nothing.
            self.last_record = mono
            self._recorded_skew = dict(self.skew)
            await self._commit(LeaderRecord(node=self.node_id, term=self.term or 0,
                                            at=self.clock.now_ms(), skew=dict(self.skew)))

    def _lease_known(self, node_id: str) -> bool:
        """May ``node_id`` be released by its lease? Only when we know the heartbeat its
        lease counts from, and every member applies a lease release's condition (an
        older one would apply it unconditionally and its state could part)."""
        return (node_id in self.last_hb
                and not self.missing_feature(LEASE_FEATURE))


def _holds_assigned(node_id: str, st: ClusterState) -> bool:
    """Does ``node_id`` hold a run it has not started yet?"""
    return any(st.runs[r].state == "assigned" for r in st.by_node.get(node_id, ()))
