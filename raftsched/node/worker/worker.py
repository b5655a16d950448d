"""The node-local worker pool: runs the runs the leader assigned to this node.

For each run assigned here it waits for the scheduled instant (plus jitter), commits
``start`` with the run's fence — batched with every other run starting now — and
executes only the starts the cluster accepted. Ahead of an instant planned early for
its size, a start is committed also beyond the free slots (up to the slots plus the
queue): such a run is started in the cluster and, at its instant, waits here for a
slot, so that its process begins as soon as one frees, with no commit between.
Outcomes are committed back in batched ``finish`` commands. A run waiting for a slot
past its grace is reported ``shed``; a run the cluster cancels is killed; when this
node's lease runs out (no heartbeat acknowledged for half the node timeout) it stops its
own runs, so a run the leader releases after the lease's end (:mod:`raftsched.core.lease`)
is never executing twice.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from raftsched.core import queries, ticks
from raftsched.core.commands import Start, StartItem
from raftsched.core.model import RunState
from raftsched.core.trigger import jitter_ms
from raftsched.node.observe import events
from raftsched.node.observe.clock import SYSTEM_CLOCK, Clock
from raftsched.node.worker.claimsync import ClaimSync
from raftsched.node.worker.gate import SpawnGate
from raftsched.node.worker.launch import LEASE_RECHECK_S, RunLauncher
from raftsched.node.worker.localrun import LocalRun, Phase
from raftsched.node.worker.runtypes import ExecutionResult
from raftsched.node.worker.slots import Slots
from raftsched.node.worker.workercommits import (
    COMMIT_TIMEOUT_S,
    FINISH_PIPELINE,
    MAX_FINISH_BATCH,
    MAX_START_BATCH,
    QUIET_GROUP,
    QUIET_MAX_MS,
    QUIET_MS,
    QUIET_POLL_S,
    RETRY_MAX_S,
    WorkerCommits,
)

if TYPE_CHECKING:
    from raftsched.core.machine import ClusterState
    from raftsched.node.replica.port import ReplicaPort
    from raftsched.node.worker.guard import Guard
    from raftsched.node.worker.runlog import RunLogs

log = logging.getLogger("raftsched.worker")

#: The safety-net poll of a worker holding no run (an applied claim wakes it).
IDLE_POLL_S = 1.0


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerStatistics:
    """A snapshot of the pool.

    :var slots: worker slots.
    :var busy: runs executing (or their start being committed).
    :var waiting: runs held here and waiting (for their instant or a slot).
    :var started: runs started since boot.
    :var rejected_starts: starts the cluster refused (stale fence).
    :var shed: runs this node shed for lack of a slot.
    :var self_fenced: times this node stopped its runs after losing the quorum.
    """

    slots: int
    busy: int
    waiting: int
    started: int
    rejected_starts: int
    shed: int
    self_fenced: int


@dataclass(slots=True)
class _Counters:
    started: int = 0
    rejected: int = 0
    shed: int = 0
    self_fenced: int = 0


class WorkerPool(RunLauncher):
    """See the module docstring. All methods run on the node's event loop."""

    def __init__(self, *, node_id: str, raft: ReplicaPort, slots: int, output_tail_bytes: int,
                 allowed_call_prefixes: tuple[str, ...] | None, kill_grace_s: float = 2.0,
                 base_env: dict[str, str], on_started: Any = None,
                 prestart_ms: int = 0, max_prestart_ms: int | None = None,
                 start_limit: int | None = None, fence_grace_s: float | None = None,
                 guard: Guard | None = None, lease: Callable[[], float] | None = None,
                 lease_s: float = float("inf"), logs: RunLogs | None = None,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        #: Where the pool reads time: the wall clock for instants, the monotonic one
        #: for the lease (the same clock as the liveness that renews it).
        self.clock = clock
        self.node_id = node_id
        self.raft = raft
        self.slots = slots
        self.tail_bytes = output_tail_bytes
        self.allowed = allowed_call_prefixes
        self.kill_grace_s = kill_grace_s
        # A self-fenced run must be dead before the leader releases it (node timeout),
        # whatever its SIGTERM handler does: its SIGKILL comes sooner than a stop's.
        self.fence_grace_s = min(kill_grace_s, fence_grace_s or kill_grace_s)
        self.guard = guard
        #: Where runs' full logs go on this node (None: nowhere).
        self.logs = logs
        #: Whether a committed start may spawn here now (the lease: gate.py).
        self.gate = SpawnGate(node_id=node_id, raft=raft, clock=clock, lease=lease,
                              lease_s=lease_s)
        self.base_env = base_env
        self.on_started = on_started
        # A run's start is committed up to this long before its instant, then the
        # worker waits for the instant: commit latency does not become scheduling lag.
        self.prestart_ms = prestart_ms
        # ... or, for a run the leader assigned further ahead (a big instant: it plans
        # those early, core.leader.lead_ms), up to 4/5 of how far ahead, at most this.
        self.max_prestart_ms = max(prestart_ms, max_prestart_ms or prestart_ms)
        #: How many runs may hold a start here at once, counting those committed ahead
        #: of their instant (the node's slots plus its queue: what the leader may place
        #: here). At or past its instant, a run's start needs a free slot.
        self.start_limit = max(slots, start_limit or slots)
        #: The runs executing, and the started runs past their instant waiting for a
        #: slot (slots.py; begun by _pump).
        self.slot = Slots(slots)
        self._pump_soon = False
        #: Fire time -> the earliest assignment of a run held here for it: how far
        #: ahead the leader began to plan that instant.
        self._first_assigned: dict[int, int] = {}
        self.local: dict[str, LocalRun] = {}
        #: Which claims the next step looks at (every one, unless the node feeds it the
        #: applies' effects: ``claims.incremental``).
        self.claims = ClaimSync(node_id)
        #: What the step's read looks at: the run ids named since the last, or None for
        #: every claim (set before each read; ``_sync_claims`` keeps its signature).
        self._looking: set[str] | None = None
        #: Called when a run is assigned to this pool while it holds none, and when it
        #: starts draining (the node's liveness: an idle node heartbeats less often).
        self.on_busy: Callable[[], None] | None = None
        #: Starts and finishes to the replica (its own part: the finish queue's timing).
        self.commits = WorkerCommits(node_id=node_id, raft=raft, local=self.local,
                                     freed=self.notify, clock=clock)
        self.counters = _Counters()
        self._wake = asyncio.Event()
        #: Set by drain(): nothing new starts here; running runs may finish.
        self.draining = False
        self._hurry = asyncio.Event()
        self._tasks: set[asyncio.Future[Any]] = set()
        #: Launched runs by their start instant (epoch ms), each group one loop timer.
        self._at: dict[int, list[LocalRun]] = {}

    # ------------------------------------------------------------ signals from the node

    def notify(self) -> None:
        """Something assigned to or cancelled on this node changed (event loop thread)."""
        self._wake.set()

    def cancel(self, run_id: str, fence: int) -> None:
        """The cluster ended attempt ``fence`` of a run of ours (replaced, job removed):
        stop it, report nothing. A newer attempt of the run id stays."""
        loc = self.local.get(run_id)
        if loc is None or loc.fence != fence:
            return
        del self.local[run_id]
        if loc.execution is not None:
            loc.execution.stop(self.kill_grace_s)
        events.emit("run.cancelled", node=self.node_id, run_id=run_id, outcome="cancelled",
                    fence=loc.fence)

    def self_fence(self, reason: str) -> None:
        """Stop every running run: this node may have been declared lost."""
        running = [loc for loc in self.local.values() if loc.execution is not None]
        if not running:
            return
        self.counters.self_fenced += 1
        for loc in running:
            loc.execution.stop(self.fence_grace_s, f"self-fenced: {reason}")  # type: ignore[union-attr]
        log.warning("stopped %d runs: %s", len(running), reason)
        events.emit("node.self_fenced", node=self.node_id, level=logging.WARNING,
                    runs=len(running), reason=reason)

    def statistics(self) -> WorkerStatistics:
        # Executing, or its start in flight at or past its instant: holding a slot (a
        # start committed ahead of a later instant does not).
        now = self.clock.now_ms()
        busy = self.slots - self.slot.free + sum(
            1 for loc in self.local.values()
            if loc.phase == Phase.STARTING and loc.start_at_ms <= now)
        return WorkerStatistics(slots=self.slots, busy=busy, waiting=len(self.local) - busy,
                                started=self.counters.started,
                                rejected_starts=self.counters.rejected, shed=self.counters.shed,
                                self_fenced=self.counters.self_fenced)

    # ------------------------------------------------------------ main loop

    async def run(self) -> None:
        flusher = asyncio.create_task(self.commits.flush_finishes())
        try:
            while not self.commits.stopping:
                delay = self._step()
                if not self.local:
                    # Nothing here at all: the safety net, on the loop's shared grid (a
                    # shorter wait, a replaying journal's, is left as it is).
                    delay = ticks.coalesced(self.clock.monotonic(), delay)
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), timeout=delay)
                except TimeoutError:
                    pass
        finally:
            flusher.cancel()

    def _busy(self) -> list[LocalRun]:
        return [loc for loc in self.local.values() if loc.phase in _BUSY]

    async def drain(self, timeout_s: float) -> None:
        """A stopping node's first step: start nothing new (the node's heartbeats say
        it has no slots, so the leader places nothing here), let the runs already
        started finish for up to ``timeout_s`` (each run is still bounded by its own
        timeout), stop what is still running after that (recorded ``lost (node
        stopping)``, so it follows ``on_node_lost``), and commit every outcome before
        returning (bounded). A run that finished is recorded as what it was: it never
        runs a second time. :meth:`hurry` cuts the wait short (a second SIGTERM)."""
        self.draining = True
        self._wake.set()
        if self.on_busy is not None:
            self.on_busy()  # the next heartbeat (no slots) goes out now, not in a second
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        running = [loc for loc in self._busy() if loc.phase != Phase.FINISHING]
        events.emit("node.draining", node=self.node_id, runs=len(running),
                    timeout_ms=int(timeout_s * 1000))
        while not self._hurry.is_set() and loop.time() < deadline and any(
                loc.phase in _HELD for loc in self._busy()):
            try:
                await asyncio.wait_for(self._hurry.wait(), min(0.02, deadline - loop.time()))
            except TimeoutError:
                pass
        # A started run not yet executing (waiting for its instant or a slot) is
        # stopped too: it begins as lost.
        left = [loc for loc in self.local.values()
                if loc.phase in (Phase.STARTED, Phase.RUNNING) and loc.execution is not None]
        for loc in left:
            loc.execution.stop(self.kill_grace_s, "node stopping")  # type: ignore[union-attr]
        # Their outcomes (lost, or what a killed process reported) and every finish
        # still queued are committed before the node leaves.
        flush_until = loop.time() + self.kill_grace_s + 3.0
        while loop.time() < flush_until and (self.commits.finish_q or self._busy()):
            await asyncio.sleep(0.02)
        events.emit("node.drained", node=self.node_id, stopped=len(left),
                    uncommitted=len(self._busy()),
                    level=logging.WARNING if left or self._busy() else logging.INFO)

    def hurry(self) -> None:
        """End a drain now (what runs is stopped and recorded lost)."""
        self._hurry.set()

    async def stop(self) -> None:
        """Stop every local run and wait for them (see ``Execution.stop``: a process
        group is killed, a callable's thread is abandoned). Finishes the flusher has not
        committed when :meth:`run` ends stay uncommitted; the leader releases those runs
        when the node restarts or after the node timeout."""
        self.commits.stopping = True
        self._wake.set()
        for loc in list(self.local.values()):
            if loc.execution is not None:
                loc.execution.stop(self.kill_grace_s, "node stopping")
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=self.kill_grace_s + 1)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _sync_claims(self, st: ClusterState) -> tuple[list[LocalRun], list[LocalRun]]:
        """Under the state lock (via ``raft.read``): this node's assigned runs not yet
        known here, as new ``LocalRun`` records; and the waiting runs whose claim moved
        on (released, cancelled, reassigned), forgotten here. Of the runs in
        ``_looking`` (claimsync.py), or of all: bounded by this node's runs."""
        ids = self._looking
        me = self.node_id
        mine = []
        if ids is None:
            candidates: Any = st.table.unordered_on(me)  # ordered by start time below
        else:
            runs = st.runs
            candidates = [run for run in map(runs.get, ids)
                          if run is not None and run.node == me]
        for run in candidates:
            if run.state != "assigned":
                continue
            known = self.local.get(run.run_id)
            if known is not None and known.fence == run.fence:
                continue
            rec = st.jobs.get(run.job_id)
            if rec is None:
                continue
            spec = rec.spec
            mine.append(LocalRun(
                run_id=run.run_id, fence=run.fence, job_id=run.job_id,
                scheduled_ms=run.scheduled_ms, attempt=run.attempt,
                start_at_ms=max(run.scheduled_ms + jitter_ms(
                    spec.id, run.scheduled_ms, spec.jitter_ms), run.not_before_ms),
                grace_ms=spec.misfire.grace_ms, due_ms=run.assigned_ms or 0))
        # Forget waiting runs whose claim moved on (released, cancelled, reassigned).
        moved = []
        local = self.local
        held = list(local.items()) if ids is None else [
            (run_id, local[run_id]) for run_id in ids if run_id in local]
        for run_id, loc in held:
            if loc.phase == Phase.WAITING:
                cur = st.runs.get(run_id)
                if cur is None or cur.node != me or cur.fence != loc.fence \
                        or cur.state != "assigned":
                    del local[run_id]
                    moved.append(loc)
        return mine, moved

    def _step(self) -> float:
        """Sync local runs with the state, start what is due; return seconds to sleep."""
        if not self.raft.ready():
            # Replaying the journal after a restart: claims seen now may be long gone.
            return 0.05
        now = self.clock.now_ms()
        self._looking = self.claims.take(self.clock.monotonic())
        try:
            mine, moved = self.raft.read(self._sync_claims)
        except BaseException:
            self.claims.look_at_all()  # what it would have looked at is not lost
            raise
        finally:
            self._looking = None
        if mine and not self.local and self.on_busy is not None:
            self.on_busy()  # its heartbeats speed up before the run may spawn
        for loc in moved:
            # Outside the lock: a claim this node waited on went elsewhere (typically
            # while it was paused or cut off); it never runs it here. Said once.
            self.counters.rejected += 1
            events.emit("run.start_rejected", node=self.node_id, run_id=loc.run_id,
                        fence=loc.fence, reason="moved on before its instant",
                        level=logging.WARNING)
        for loc in mine:
            old = self.local.get(loc.run_id)
            if old is not None and old.execution is not None:
                # A newer attempt here while the older still runs (its cancel queued).
                old.execution.stop(self.kill_grace_s, "a newer attempt of the run began")
            self.local[loc.run_id] = loc
            if loc.due_ms:
                first = self._first_assigned.get(loc.scheduled_ms, loc.due_ms)
                self._first_assigned[loc.scheduled_ms] = min(first, loc.due_ms)
        if self._first_assigned:
            for at in [at for at in self._first_assigned if at < now]:
                del self._first_assigned[at]
        if self.slot.waiting:
            self._shed_queued(now)
        if self.slot.waiting and self.slot.free > 0:
            self._pump_later()  # a missed pump (stale entries ahead of a free slot)
        # A slot is free again as soon as its run has ended; the finish commit that
        # follows does not hold it. held: the runs holding a start here; due: those of
        # them that need a slot now (executing, or at or past their instant).
        # One pass over what is held here. A waiting run beyond the longest pre-start
        # window is neither late nor startable: only when to look again depends on it,
        # and that is no later than the earliest of them minus the longest window
        # (sorting them all was a tenth of a follower's step in a storm).
        held = due = 0
        horizon = now + self.max_prestart_ms
        near: list[LocalRun] = []
        far: int | None = None
        for x in self.local.values():
            phase = x.phase
            if phase is _WAITING:
                if x.start_at_ms <= horizon:
                    near.append(x)
                elif far is None or x.start_at_ms < far:
                    far = x.start_at_ms
            elif phase in _HELD:
                held += 1
                if phase is _RUNNING or x.start_at_ms <= now:
                    due += 1
        ready: list[LocalRun] = []
        shed: list[LocalRun] = []
        # A safety net only (an applied claim wakes the loop): twice as long while
        # nothing is held here (issue 31: an idle node's wakeups).
        next_at: float = 0.5 if self.local else IDLE_POLL_S
        if far is not None:
            next_at = min(next_at, (far - self.max_prestart_ms - now) / 1000)
        late: list[LocalRun] = []
        near.sort(key=_start_at)
        for loc in near:
            if now - max(loc.start_at_ms, loc.due_ms) > loc.grace_ms:
                # Held past its grace (this node was down or frozen): too late to count
                # as this fire time's run.
                late.append(loc)
                continue
            window = self._prestart(loc)
            if loc.start_at_ms > now + window:
                next_at = min(next_at, (loc.start_at_ms - window - now) / 1000)
                continue
            if self.draining:
                continue  # a stopping node starts nothing new
            if loc.start_at_ms <= now:
                # Due now (a trigger, a retry, a catch-up, a late assignment): a slot
                # not needed now is free for it, whatever is started ahead of a later
                # instant (that waits for a slot at its instant, started).
                may = due < self.slots
            elif window > self.prestart_ms:
                # Of an instant planned early for its size: its start may be committed
                # beyond the free slots (up to start_limit); at the instant the run only
                # waits for a slot, not for a commit. (Started, it follows on_node_lost
                # if this node is lost before it begins: paid only where an instant
                # needs it.)
                may = held < self.start_limit
            else:
                may = held < self.slots  # a small instant: as before, within the slots
            if may:
                ready.append(loc)
                held += 1
                due += loc.start_at_ms <= now
            elif now - max(loc.scheduled_ms, loc.due_ms) > loc.grace_ms:
                shed.append(loc)
        for loc in late:
            loc.phase = Phase.FINISHING
            self.commits.finish(loc, ExecutionResult(
                outcome=RunState.missed, exit_code=None, tail="",
                reason="late: past its grace on this node"))
        for loc in shed:
            loc.phase = Phase.FINISHING
            self.counters.shed += 1
            self.commits.finish(loc, ExecutionResult(
                outcome=RunState.shed, exit_code=None, tail="", reason="overload"))
        if ready:
            for loc in ready:
                loc.phase = Phase.STARTING
            for k in range(0, len(ready), MAX_START_BATCH):
                self._spawn(self._start_batch(ready[k:k + MAX_START_BATCH]))
        return max(next_at, 0.0)

    def _prestart(self, loc: LocalRun) -> int:
        """How long before its instant ``loc``'s start may be committed: 4/5 of how far
        ahead the leader began to assign that instant's runs here, so that the starts
        of an instant planned early for its size are committed early too, also those
        its last plans assigned (a node's share of 5,000 runs takes hundreds of ms to
        commit); within [prestart_ms, max_prestart_ms]."""
        # Of the fire time, not of the start (a jittered run starts later: its window
        # is the instant's, as before, not widened by its jitter).
        first = self._first_assigned.get(loc.scheduled_ms, loc.due_ms)
        ahead = (loc.scheduled_ms - first) * 4 // 5 if first else 0
        return min(max(self.prestart_ms, ahead), self.max_prestart_ms)

    # ------------------------------------------------------------ start

    async def _start_batch(self, batch: list[LocalRun]) -> None:
        items = tuple(StartItem(loc.run_id, loc.fence) for loc in batch)
        try:
            # Claimed up to prestart_ms early, the start takes effect (and is recorded)
            # at the runs' instant: the commit's latency never shows as lag.
            reply = await self.commits.commit(Start(node=self.node_id, items=items, at=0),
                                       at_floor=min(loc.start_at_ms for loc in batch))
        except Exception:  # noqa: BLE001 - stopping
            return
        # A command refused whole (ok false) started none of them: each is a refusal.
        results = reply.get("results", []) if reply.get("ok") else [None] * len(batch)
        # Their specs in one hold of the state lock, not one per run.
        specs = self.raft.read(functools.partial(
            queries.job_specs, {loc.job_id for loc in batch}))
        for loc, res in zip(batch, results, strict=False):
            accepted = bool(res and res[0])
            if not accepted:
                # A retried start whose first try did commit is refused the second time.
                accepted = self.gate.started_here(loc)
            if not accepted or self.local.get(loc.run_id) is not loc:
                self._forget(loc)
                # The refusal itself is logged once, as run.start_rejected, by the node.
                self.counters.rejected += 1
                continue
            self._launch(loc, specs.get(loc.job_id))
        self._wake.set()

#: Phases holding a start here (against ``start_limit`` and the slots).
_HELD = frozenset({Phase.STARTING, Phase.STARTED, Phase.RUNNING})
_WAITING = Phase.WAITING
_RUNNING = Phase.RUNNING
_start_at = operator.attrgetter("start_at_ms")
#: Phases a drain waits for (their outcomes are committed before the node leaves).
_BUSY = _HELD | {Phase.FINISHING}


#: Kept importable from here (they moved to workercommits with the commits they bound).
__all__ = ["COMMIT_TIMEOUT_S", "FINISH_PIPELINE", "LEASE_RECHECK_S", "MAX_FINISH_BATCH",
           "MAX_START_BATCH", "QUIET_GROUP", "QUIET_MAX_MS", "QUIET_MS", "QUIET_POLL_S",
           "RETRY_MAX_S", "WorkerPool", "WorkerStatistics"]
