"""The leader's loop: the thin, clocked shell around the pure :func:`leader.plan`.

Only a node that Raft made leader plans, and only after it committed a ``leader``
record for its term (so plans of an older term are refused by the state). Each tick
it hands leadership over if asked or draining (:mod:`~raftsched.node.leader.handover`),
watches its peers' liveness and releases a lost node's claims
(:mod:`~raftsched.node.leader.peers`), and plans. The loop sleeps until the next
due time (minus the lookahead) or until an applied command wakes it; it never polls
the job table.

Plans are bounded (``core/leader.py``), so a busy second is many plans: up to
``MAX_PLANS_IN_FLIGHT`` are committed at once, kept in a :class:`~raftsched.node.leader.plans.
PlanBook` so that nothing is planned twice (see :mod:`raftsched.node.leader.plans`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from raftsched.core import queries, ticks
from raftsched.core.commands import (
    PAST_AT_VERSION,
    Command,
    DeleteJob,
    LeaderRecord,
    Member,
    Plan,
    Read,
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
from raftsched.node.leader.handover import Handover
from raftsched.node.leader.peers import (
    DISCONNECT_GRACE_S,
    FOLLOWER_S,
    LeaderMetrics,
    PeerLiveness,
)
from raftsched.node.leader.plans import MAX_PLANS_IN_FLIGHT, PlanBook
from raftsched.node.observe import events
from raftsched.node.observe.clock import SYSTEM_CLOCK, Clock

if TYPE_CHECKING:
    from raftsched.node.config.config import ClusterConfig
    from raftsched.node.replica.raft import RaftNode

log = logging.getLogger("raftsched.leader")


def seed_command(cfg: ClusterConfig, at: int) -> Member:
    """The command the first leader commits when the state has no members yet (the
    members of the config file ``cfg``)."""
    return Member(action="seed", at=at, members=tuple(
        {"node": n.id, "raft": n.raft, "api": n.api} for n in cfg.nodes))



#: Liveness is checked at least this often while leading and a run is active (a
#: claim a lost node holds is released within this of its verdict).
HOUSEKEEPING_S = 0.05
#: ... and this often while no run is active: there is no claim to release, and
#: whatever gives the loop work (a put, a trigger, a node back, a fire time, a
#: transfer asked) wakes it or is slept up to. At HOUSEKEEPING_S an idle leader's loop
#: woke 20 times a second for nothing (issue 31: an idle cluster costs ~nothing); at
#: 1 s, on the grid of the node's other idle timers (core/ticks.py), it wakes with them.
QUIET_HOUSEKEEPING_S = 1.0
#: A due job the last plan could not place is looked at again after this long (or
#: when an applied command wakes the loop), not in a busy loop.
STALL_S = 0.02
COMMIT_TIMEOUT_S = 3.0
#: Finished one-shot jobs past their retention: how often to look, how many per look.
DONE_SCAN_S = 5.0
DONE_BATCH = 50


class LeaderLoop(PeerLiveness, Handover):
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

