"""The leader's loop: the thin, clocked shell around the pure :func:`leader.plan`.

Only a node that Raft made leader plans, and only after it committed a ``leader``
record for its term (so plans of an older term are refused by the state). It
watches liveness: a dropped Raft connection releases the node's assigned-but-not-
started runs at once (safe: a start needs the current fence); a disconnected node is
declared lost once its lease has provably ended (:mod:`raftsched.core.lease`, ~2/3 of
the node timeout after its newest heartbeat), any other node after the node timeout
of silence; its started runs then follow ``on_node_lost``.
The loop sleeps until the next due time (minus the lookahead) or until an applied
command wakes it; it never polls the job table.

Plans are bounded (``core/leader.py``), so a busy second is many plans: up to
``MAX_PLANS_IN_FLIGHT`` are committed at once, kept in a :class:`~raftsched.node.leader.plans.
PlanBook` so that nothing is planned twice (see :mod:`raftsched.node.leader.plans`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

from raftsched.core import lease, members, queries, ticks
from raftsched.core.cmdbase import LEASE_FEATURE
from raftsched.core.commands import (
    PAST_AT_VERSION,
    Command,
    DeleteJob,
    LeaderRecord,
    Member,
    Plan,
    Read,
    Release,
    ReleaseScope,
    RunFire,
)
from raftsched.core.errors import NotReady, RaftschedError
from raftsched.core.leader import (
    MAX_RUNS_PER_PLAN,
    Capacity,
    LeaderContext,
    PlanInput,
    capacities,
    plan_from,
    plan_input,
)
from raftsched.core.machine import ClusterState
from raftsched.node.config.addressbook import AddressBook
from raftsched.node.leader.admission import Admission, AdmissionStatistics
from raftsched.node.leader.contact import ContactWatch
from raftsched.node.leader.early import EarlyPlanning
from raftsched.node.leader.plans import MAX_PLANS_IN_FLIGHT, PlanBook
from raftsched.node.observe import events
from raftsched.node.observe.clock import SYSTEM_CLOCK, Clock

if TYPE_CHECKING:
    from raftsched.node.config.config import ClusterConfig
    from raftsched.node.replica.raft import RaftNode

log = logging.getLogger("raftsched.leader")


class LeaderMetrics(Protocol):
    """The figures the leader loop counts (the node's ``Metrics``)."""

    def commit_latency(self, seconds: float) -> None: ...

    def claims_released(self, n: int) -> None: ...


def seed_command(cfg: ClusterConfig, at: int) -> Member:
    """The command the first leader commits when the state has no members yet (the
    members of the config file ``cfg``)."""
    return Member(action="seed", at=at, members=tuple(
        {"node": n.id, "raft": n.raft, "api": n.api} for n in cfg.nodes))



#: A Raft connection down this long releases the node's not-yet-started claims.
DISCONNECT_GRACE_S = 0.05
#: Liveness is checked at least this often while leading and a run is active (a
#: claim a lost node holds is released within this of its verdict).
HOUSEKEEPING_S = 0.05
#: ... and this often while no run is active: there is no claim to release, and
#: whatever gives the loop work (a put, a trigger, a node back, a fire time, a
#: transfer asked) wakes it or is slept up to. At HOUSEKEEPING_S an idle leader's loop
#: woke 20 times a second for nothing (issue 31: an idle cluster costs ~nothing); at
#: 1 s, on the grid of the node's other idle timers (core/ticks.py), it wakes with them.
QUIET_HOUSEKEEPING_S = 1.0
#: A follower's loop sleeps this long between looks: the node's role change wakes it
#: (Node passes it to RaftNode's ``on_state_changed``), so this only bounds a missed
#: wake. At HOUSEKEEPING_S an idle follower woke 20 times a second for nothing.
FOLLOWER_S = 1.0
#: A due job the last plan could not place is looked at again after this long (or
#: when an applied command wakes the loop), not in a busy loop.
STALL_S = 0.02
#: The leader re-commits its record (with observed clock skews) this often.
LEADER_RECORD_S = 5.0
COMMIT_TIMEOUT_S = 3.0
#: A sleep of PAUSE_TICK_S that takes PAUSE_S longer means this process was paused.
PAUSE_TICK_S = 0.2
PAUSE_S = 0.3
#: Finished one-shot jobs past their retention: how often to look, how many per look.
DONE_SCAN_S = 5.0
DONE_BATCH = 50
#: An operator's transfer that did not move within its 2 s is tried this many times.
ASKED_TRANSFER_TRIES = 3


class LeaderLoop:
    """See the module docstring. Runs on the node's event loop.

    :param raft: the replica: read for plans and liveness, and the leader's commands
        submitted through it.
    :param node_id: this node's id (the leader named in its commands).
    :param cfg: this node's cluster config (timing, retention, the seed membership).
    :param raft_to_id: Raft address -> node id: the node's one map, which it updates
        in place as members are added.
    :param boot_ms: when this node started (plans do not count misses before it).
    :param metrics: the node's metrics (commit latency, released claims), or None.
    :param missing_feature: the members whose heartbeats do not announce a feature
        (``applyops.Features.missing``): a lease release waits until all do.
    :param clock: where the loop reads the time (a test passes a
        :class:`~raftsched.node.observe.clock.FakeClock` and steps it).
    :param contact_fits: the timing leaves room to read idle followers' liveness
        from their Raft answers (contact.py).
    """

    def __init__(self, *, raft: RaftNode, node_id: str, cfg: ClusterConfig,
                 raft_to_id: AddressBook, boot_ms: int, metrics: LeaderMetrics | None,
                 missing_feature: Callable[[str], list[str]],
                 clock: Clock = SYSTEM_CLOCK, contact_fits: bool = True) -> None:
        self.clock = clock
        self.raft = raft
        self.node_id = node_id
        self.cfg = cfg
        self.raft_to_id = raft_to_id
        self.boot_ms = boot_ms
        self.metrics = metrics
        self.missing_feature = missing_feature
        self.active = False
        #: Called as this node's leadership of a term is established (the notifier).
        self.on_lead: Callable[[], None] | None = None
        self.term: int | None = None
        self.since_ms = 0
        self.since_mono = 0.0
        self.last_seen: dict[str, float] = {}
        #: The ``at`` of each node's newest heartbeat this loop has seen (the one its
        #: ``last_seen`` time counts from): a lease release names it.
        self.last_hb: dict[str, int] = {}
        #: The period each node's next heartbeat should come in (idle or busy, from
        #: the runs it held as its last one applied); none yet: no lateness measured.
        self._next_beat_s: dict[str, float] = {}
        self.disc_since: dict[str, float] = {}
        self.released_assigned: set[str] = set()
        self.lost: set[str] = set()
        self.skew: dict[str, int] = {}
        #: The skews of this term's newest leader record.
        self._recorded_skew: dict[str, int] = {}
        self.last_record = 0.0
        self.last_tick = self.clock.monotonic()
        self.paused_until = 0.0
        #: Seconds this process did not run (the pause watcher's gaps) that the next
        #: liveness check has not yet taken out of the peers' silence.
        self._pause_credit = 0.0
        self._transfer_to: tuple[str | None, int] | None = None
        self._asked_tries = 0
        self._last_transfer = 0.0
        self.plans = 0
        self.plan_seconds = 0.0
        #: The coming instants' sizes, and the big one planned early (early.py).
        self.early = EarlyPlanning(cfg.timing.lookahead_ms)
        self._wake = asyncio.Event()
        self._stopping = False
        self._next_done_scan = 0.0
        #: No run active and no peer cut off as the loop last went to sleep.
        self.quiet = False
        #: ... and no job falls due for a grid step past the quiet look: its sleep is a
        #: bound only, stretched onto the node's shared grid (core/ticks.py).
        self.look_is_bound = False
        #: This term's plans in flight, and those whose commit failed (plans.py).
        self.book = PlanBook()
        #: The runs per second this term's plans may create (admission.py).
        self.admission = Admission(self.clock.monotonic())
        #: When idle followers' Raft threads last answered us (contact.py).
        self.contact = ContactWatch(raft=raft, raft_to_id=raft_to_id,
                                    missing_feature=missing_feature, fits=contact_fits)

    def wake(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        self._stopping = True
        self._wake.set()

    def saw_heartbeat(self, node_id: str, at_ms: int) -> None:
        mono = self.clock.monotonic()
        prev = self.last_seen.get(node_id)
        expected = self._next_beat_s.get(node_id)
        if prev is not None and expected is not None and self.active:
            # Heartbeats landing later than their period: a self-fence is near.
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

    async def _sleep(self, seconds: float, *, coalesce: bool = False) -> None:
        """Until woken, or ``seconds``; ``coalesce``: a bound only, so it ends on the
        loop's shared grid with the node's other idle timers (core/ticks.py)."""
        self._wake.clear()
        if coalesce:
            seconds = ticks.coalesced(self.clock.monotonic(), seconds)
        try:
            await asyncio.wait_for(self._wake.wait(), timeout=max(seconds, 0.0))
        except TimeoutError:
            pass

    async def _commit(self, cmd: Command) -> dict[str, Any] | None:
        t0 = time.perf_counter()
        try:
            fut = asyncio.wrap_future(self.raft.submit(cmd))
            reply = await asyncio.wait_for(fut, COMMIT_TIMEOUT_S)
        except (NotReady, TimeoutError, RaftschedError) as exc:
            log.debug("%s not committed: %s", cmd.OP, exc)
            return None
        if self.metrics is not None:
            self.metrics.commit_latency(time.perf_counter() - t0)
        return reply

    async def run(self) -> None:
        watcher = asyncio.create_task(self._watch_pauses(), name="pause-watch")
        try:
            await self._run()
        finally:
            watcher.cancel()

    async def _run(self) -> None:
        while not self._stopping:
            raft = self.raft
            # The term this node became leader in, read as one value (set in the Raft
            # thread at the transition): every leader-only command carries it, and the
            # state machine refuses it unless its log entry is of that term — so a
            # deposed leader's stale view never takes effect, even forwarded.
            term = raft.leader_term()
            if term is None or not raft.ready():
                if self.active:
                    events.emit("leader.stepped_down", node=self.node_id, term=self.term)
                self.active = False
                self.book.forget()
                await self._sleep(FOLLOWER_S if term is None else HOUSEKEEPING_S,
                                  coalesce=term is None)
                continue
            if not self.active or term != self.term:
                if not await self._establish(term):
                    await self._sleep(HOUSEKEEPING_S)
                    continue
                if self.on_lead is not None:
                    self.on_lead()
            try:
                await self._hand_over_if_draining()
                await self._liveness()
                await self._remove_done()
                if await self._plan_once():
                    self.quiet = False  # runs are being planned: the pause watcher's short tick
                    continue
            except Exception:  # noqa: BLE001 - the loop must survive a bug in one tick
                log.exception("leader tick failed")
            delay = self._idle_delay()
            # Quiet, with nothing due soon: housekeeping only, on the shared grid.
            await self._sleep(delay, coalesce=self.look_is_bound)

    async def _remove_done(self) -> None:
        """``[limits] done_retention``: remove one-shot jobs whose run ended that long
        ago (a few per scan, a scan every few seconds; each delete names the version
        seen done, so a job put again meanwhile stays)."""
        keep = self.cfg.limits.done_retention_ms
        mono = self.clock.monotonic()
        if not keep or mono < self._next_done_scan:
            return
        self._next_done_scan = mono + DONE_SCAN_S
        cutoff = self.clock.now_ms() - keep
        old = self.raft.read(partial(queries.done_jobs, cutoff))
        for job, version in old[:DONE_BATCH]:
            reply = await self._commit(DeleteJob(job=job, if_done=version, at=self.clock.now_ms(),
                                                 v=PAST_AT_VERSION))
            if reply is not None and reply.get("ok"):
                events.emit("job.expired", node=self.node_id, job_id=job, version=version,
                            retention_ms=keep)

    async def _establish(self, term: int) -> bool:
        """Commit our leadership record; plans of older terms are refused from then on."""
        since = self.clock.now_ms()
        reply = await self._commit(LeaderRecord(node=self.node_id, term=term, at=since,
                                                skew={}))
        if not reply or not reply.get("ok"):
            return False
        self.active, self.term = True, term
        # Our record committed after whatever an earlier term of ours left in the log.
        self.book.forget()
        seeded = self.raft.read(queries.seeded)
        if not seeded:
            # A new cluster (or one upgraded from a release without it): its membership
            # starts as the config file's (members compare their files at boot).
            await self._commit(seed_command(self.cfg, self.clock.now_ms()))
        self.since_ms, self.since_mono = since, self.clock.monotonic()
        self.early = EarlyPlanning(self.cfg.timing.lookahead_ms)
        self.admission = Admission(self.since_mono)
        self.last_tick = self.since_mono
        self.last_record = self.since_mono
        self._recorded_skew = {}
        # Every node gets a full node timeout from our start before we call it lost.
        # Every heartbeat committed before our record was applied before this read,
        # so it was sent before since_mono: the lease counts from since_mono at worst.
        self.last_seen = {}
        self._next_beat_s = {}
        self.last_hb = self.raft.read(
            lambda st: {n: rec.last_hb_ms for n, rec in st.nodes.items()})
        self.disc_since.clear()
        self.released_assigned.clear()
        # Peers already disconnected (typically the old leader, killed) lose their
        # not-yet-started claims before our first plan, not one grace period after it:
        # otherwise their jobs' next fires would see them active and be skipped.
        for addr, up in self.raft.connected_peers().items():
            node_id = self.raft_to_id.get(addr)
            if not up and node_id is not None:
                self.disc_since[node_id] = self.since_mono - DISCONNECT_GRACE_S
        log.info("leading in term %d", term)
        return True

    def _idle_delay(self) -> float:
        """After a plan that made no progress: until the next job falls due, but at
        least STALL_S when one is due already and could not be planned (no room, or an
        overlap decided at its fire time): an applied command wakes us sooner. Longer
        (QUIET_HOUSEKEEPING_S) while no run is active and no peer not yet lost is cut off."""
        now, mono, early = self.clock.now_ms(), self.clock.monotonic(), self.early
        nxt, active, instants = self.raft.read(partial(
            queries.loop_view, count_by_ms=early.count_by(mono, now), cap=early.cap))
        early.counted(instants, mono)
        cut_off = any(n not in self.lost for n in self.disc_since)
        self.quiet = not (active or cut_off)
        delay = QUIET_HOUSEKEEPING_S if self.quiet else HOUSEKEEPING_S
        # Only a quiet look with no plan falling due within a grid step after it is a
        # bound the shared grid may stretch (core/ticks.py): never a plan's lead time.
        self.look_is_bound = self.quiet
        if nxt is not None:
            began, wait_ms = early.begin(now)
            if began:
                self.look_is_bound = False
                return 0.0  # a big instant: its planning begins now (early.py)
            # (A job of an instant planned early left due was held back for want of room
            # or for its overlap: an applied command, or the lookahead, brings it.)
            lead = nxt - self.cfg.timing.lookahead_ms - now
            if wait_ms is not None:
                lead = min(lead, wait_ms)
            self.look_is_bound = self.quiet and \
                lead >= (QUIET_HOUSEKEEPING_S + ticks.GRID_S) * 1000
            delay = min(delay, max(lead / 1000, STALL_S))
            # Held back by admission control: until the next run may be granted.
            delay = max(delay, min(self.admission.wait_s(self.clock.monotonic()),
                                   HOUSEKEEPING_S))
        return delay

    def admission_statistics(self) -> AdmissionStatistics | None:
        """This term's admission control, or None when not leading."""
        return self.admission.statistics() if self.active else None

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

    def _capacities(self, st: ClusterState, connected: dict[str, bool]) -> tuple[Capacity, ...]:
        """The nodes that may take work (call under the state lock: via read()): not
        lost, and not another node whose Raft connection to this leader is down."""
        addr_of: dict[str, str] = {}
        for addr, node_id in self.raft_to_id.items():
            addr_of.setdefault(node_id, addr)
        cut_off = {node_id for node_id, addr in addr_of.items()
                   if node_id != self.node_id and not connected.get(addr, True)}
        return capacities(st, self.lost | cut_off)

    async def _plan_once(self) -> bool:
        """Submit one bounded plan without waiting for it (up to MAX_PLANS_IN_FLIGHT);
        when none can be made or enough are in flight, wait for the oldest. True when
        the caller should plan again at once (progress, or more may be due)."""
        book = self.book
        book.reap()
        mono = self.clock.monotonic()
        adm = self.admission
        adm.observe(follower_lag=self.raft.follower_lag(), queue=self.raft.pending,
                    commit_s=mono - book.inflight[0].submitted if book.inflight else None,
                    tick_gap_s=self.raft.take_tick_gap())
        if len(book.inflight) >= MAX_PLANS_IN_FLIGHT:
            return await self._await_oldest()
        budget = adm.grant(MAX_RUNS_PER_PLAN, mono)
        if budget <= 0:
            # Over the rate the cluster absorbs: the due jobs wait (their late fire
            # times are recorded by their misfire policy when they are reached).
            return await self._await_oldest() if book.inflight else False
        t0 = time.perf_counter()
        connected = self.raft.connected_peers()
        skip_jobs, skip_runs, extra = book.held()

        def copy(st: ClusterState) -> tuple[LeaderContext, PlanInput]:
            # Copy out a bounded slice; the miss detector's work runs outside the lock.
            live = self._capacities(st, connected)
            for cap in live:
                cap.load += extra.get(cap.node_id, 0)
            now = self.clock.now_ms()
            # Up to a big instant whose planning began early (early.py), if any.
            horizon = self.early.horizon(now)
            ctx = LeaderContext(node_id=self.node_id, term=self.term or 0, now_ms=now,
                                lookahead_ms=horizon - now,
                                usual_lookahead_ms=self.cfg.timing.lookahead_ms,
                                since_ms=self.since_ms, boot_ms=self.boot_ms, live=live,
                                budget=budget)
            return ctx, plan_input(st, ctx.now_ms + ctx.lookahead_ms, skip_jobs=skip_jobs,
                                   skip_runs=skip_runs)

        ctx, inp = self.raft.read(copy)
        cmd = plan_from(inp, ctx)
        self.plan_seconds += time.perf_counter() - t0
        adm.refund(budget - _runs_in(cmd))
        if cmd is None:
            if book.inflight:
                return await self._await_oldest()
            return await self._barrier() if book.doubtful else False
        self.plans += 1
        task = asyncio.get_running_loop().create_task(self._commit_plan(cmd))
        task.add_done_callback(lambda _t: self._wake.set())
        book.add(cmd, task, submitted=mono)
        return True

    async def _commit_plan(self, cmd: Plan) -> dict[str, Any] | None:
        """A plan's commit, run as a task: any failure is a plan not committed."""
        t0 = self.clock.monotonic()
        try:
            return await self._commit(cmd)
        except Exception:  # noqa: BLE001 - a bug in one commit must not stop the loop
            log.exception("plan commit failed")
            return None
        finally:
            self.admission.observe(commit_s=self.clock.monotonic() - t0)

    async def _await_oldest(self) -> bool:
        """Wait for the oldest plan in flight; True if it made progress. A plan whose
        every item was refused made none: the caller waits instead of spinning."""
        oldest = self.book.inflight[0]
        await asyncio.wait([oldest.task])
        self.book.reap()
        reply = oldest.task.result()
        if reply is None or not reply.get("ok"):
            return False
        return len(reply.get("rejected", [])) < oldest.size

    async def _barrier(self) -> bool:
        """Nothing follows a failed plan: commit a read barrier, after which it has
        applied or never will, and its jobs may be planned again. True if it did."""
        seq = self.book.next_seq()
        reply = await self._commit(Read(at=self.clock.now_ms(), node=self.node_id))
        if reply is None:
            return False
        self.book.committed(seq)
        return True


def _runs_in(cmd: Plan | None) -> int:
    """Runs a plan creates or places (what admission control counts)."""
    if cmd is None:
        return 0
    return len(cmd.place) + sum(1 for f in cmd.fires if isinstance(f, RunFire))


def _holds_assigned(node_id: str, st: ClusterState) -> bool:
    """Does ``node_id`` hold a run it has not started yet?"""
    return any(st.runs[r].state == "assigned" for r in st.by_node.get(node_id, ()))
