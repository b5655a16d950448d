"""How the worker pool begins a run the cluster accepted: at its instant (one loop timer
per instant), in a free slot (else it waits, started, for one; past its grace it is
shed), and only under a fresh lease (:mod:`~raftsched.node.worker.gate`); its outcome
goes to the finish queue.

A base of :class:`~raftsched.node.worker.worker.WorkerPool` (its state is the pool's,
set in the pool's ``__init__``): the pool decides what to start and commits the
starts; these methods launch the accepted ones.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from raftsched.core.model import RunState
from raftsched.node.observe import events
from raftsched.node.worker.executor import Execution
from raftsched.node.worker.localrun import LocalRun, Phase
from raftsched.node.worker.runtypes import ExecutionResult, RunContext
from raftsched.node.worker.workercommits import QUIET_GROUP

if TYPE_CHECKING:
    from raftsched.core.model import JobSpec
    from raftsched.node.observe.clock import Clock
    from raftsched.node.worker.gate import SpawnGate
    from raftsched.node.worker.guard import Guard
    from raftsched.node.worker.runlog import RunLogs
    from raftsched.node.worker.slots import Slots
    from raftsched.node.worker.workercommits import WorkerCommits

log = logging.getLogger("raftsched.worker")

#: How often a run held for want of a fresh lease looks again.
LEASE_RECHECK_S = 0.02
#: A start timer that finds its instant further ahead than the pre-start window plus
#: this saw the wall clock stepped back (slewing moves it by under 1 ms a second).
STEPPED_BACK_MS = 1000


class RunLauncher:
    """The launching half of :class:`~raftsched.node.worker.worker.WorkerPool`."""

    # The pool's state these methods read and move (set by WorkerPool).
    clock: Clock
    node_id: str
    tail_bytes: int
    allowed: tuple[str, ...] | None
    kill_grace_s: float
    guard: Guard | None
    logs: RunLogs | None
    gate: SpawnGate
    base_env: dict[str, str]
    on_started: Any
    prestart_ms: int
    slot: Slots
    _pump_soon: bool
    local: dict[str, LocalRun]
    commits: WorkerCommits
    counters: Any
    _tasks: set[asyncio.Future[Any]]
    _at: dict[int, list[LocalRun]]

    def _forget(self, loc: LocalRun) -> None:
        """Drop ``loc``, not a newer claim of its run (handed back here while its start
        was in flight): dropping that left the run started with no process, forever."""
        if self.local.get(loc.run_id) is loc:
            del self.local[loc.run_id]

    def _launch(self, loc: LocalRun, spec: JobSpec | None) -> None:
        if spec is None:
            self._forget(loc)
            return
        loc.phase = Phase.STARTED
        ctx = RunContext(job_id=loc.job_id, run_id=loc.run_id, scheduled_ms=loc.scheduled_ms,
                         fence=loc.fence, attempt=loc.attempt, node_id=self.node_id)
        loc.execution = Execution(spec=spec, ctx=ctx, base_env=self.base_env,
                                  tail_bytes=self.tail_bytes, allowed=self.allowed,
                                  kill_grace_s=self.kill_grace_s, guard=self.guard,
                                  logs=self.logs)
        # One timer per start instant, not one sleeping task per run: a thousand runs
        # due at the same second then cost one wake-up.
        group = self._at.get(loc.start_at_ms)
        if group is None:
            group = self._at[loc.start_at_ms] = []
            loop = asyncio.get_running_loop()
            loop.call_at(loop.time() + max(0, loc.start_at_ms - self.clock.now_ms()) / 1000,
                         self._fire, loc.start_at_ms)
        group.append(loc)

    def _fire(self, at_ms: int) -> None:
        ahead_ms = at_ms - self.clock.now_ms()
        if 0 < ahead_ms <= self.prestart_ms + STEPPED_BACK_MS:
            # Never before the scheduled instant (the loop's clock is not the wall clock).
            asyncio.get_running_loop().call_later(ahead_ms / 1000, self._fire, at_ms)
            return
        if ahead_ms > 0:
            # The monotonic timer waited the whole delay, at most the pre-start window:
            # the wall clock was stepped back meanwhile. Waiting for it would leave these
            # committed starts without a process (and skip their jobs' next fires).
            log.warning("the wall clock went back %.1fs while runs waited for their "
                        "instant: starting them now", ahead_ms / 1000)
        group = self._at.pop(at_ms, ())
        if len(group) >= QUIET_GROUP:
            # max: a late group (catch-up, a slow loop) must not end a newer one's quiet.
            self.commits.quiet_at = max(self.commits.quiet_at, at_ms)
        # Which of them are still ours to spawn, in one hold of the state lock for the
        # whole instant (gate.py), not one per run.
        held = self._held_started(group)
        for loc in group:
            self._begin_or_fail(loc, held)

    def _begin_or_fail(self, loc: LocalRun, held: frozenset[str] | None, *,
                       known: bool = True, queued: bool = False) -> None:
        """:meth:`_begin`; one run's failure to begin is that run's (recorded failed,
        its slot given back), not its group's, and never leaves it started with no
        process."""
        try:
            self._begin(loc, held, known=known, queued=queued)
        except Exception as exc:  # noqa: BLE001
            log.exception("run %s could not begin", loc.run_id)
            self.slot.give_back(loc)
            if self.local.get(loc.run_id) is loc and loc.phase != Phase.FINISHING:
                loc.phase = Phase.FINISHING
                self.commits.finish(loc, ExecutionResult(
                    outcome=RunState.failed, exit_code=None, tail="",
                    reason=f"could not begin: {type(exc).__name__}"[:200]))

    def _pump_later(self) -> None:
        """Pump once after the current callbacks: the runs ending in the same pass free
        their slots first, and the next runs begin in one batch."""
        if not self._pump_soon:
            self._pump_soon = True
            asyncio.get_running_loop().call_soon(self._pump)

    def _pump(self) -> None:
        """Begin the started runs waiting for a slot, oldest first, as slots free up:
        no commit between a slot freeing and the next run's process (its start was
        committed ahead). One read of the state per batch (gate.py)."""
        self._pump_soon = False
        while self.slot.waiting and self.slot.free > 0:
            batch = self.slot.next_batch(self.local)
            held = self._held_started(batch)
            for loc in batch:
                self._begin_or_fail(loc, held, queued=True)

    def _shed_queued(self, now: int) -> None:
        """Shed the started runs that waited for a slot past their grace (overload:
        the slots are held by longer runs); forget those taken away meanwhile."""
        for loc in self.slot.expire(now, self.local):
            loc.phase = Phase.FINISHING
            self.counters.shed += 1
            self.commits.finish(loc, ExecutionResult(
                outcome=RunState.shed, exit_code=None, tail="", reason="overload"))

    def _held_started(self, group: list[LocalRun] | tuple[()]) -> frozenset[str] | None:
        """:meth:`SpawnGate.held` (a method of the pool: tests stand in for it)."""
        return self.gate.held(group)

    def _await_lease(self, loc: LocalRun) -> None:
        """Re-check a run held for want of a fresh lease, until its grace is over."""
        if self.local.get(loc.run_id) is not loc or loc.phase != Phase.STARTED:
            return
        if self.clock.now_ms() - loc.start_at_ms > loc.grace_ms:
            loc.phase = Phase.FINISHING
            self.commits.finish(loc, ExecutionResult(
                outcome=RunState.lost, exit_code=None, tail="",
                reason="no lease: this node could not reach the cluster at its instant"))
            return
        self._begin_or_fail(loc, None, known=False)

    def _begin(self, loc: LocalRun, held: frozenset[str] | None = None, *,
               known: bool = False, queued: bool = False) -> None:
        """Spawn ``loc`` if it may; ``known``: ``held`` is :meth:`_held_started` of its
        instant, read for the whole group (else it is read for this run alone)."""
        assert loc.execution is not None
        if self.local.get(loc.run_id) is not loc:
            return  # cancelled by the cluster while waiting: it never ran
        if loc.execution.stopped:
            loc.phase = Phase.FINISHING
            self.commits.finish(loc, ExecutionResult(outcome=RunState.lost, exit_code=None, tail="",
                                              reason=loc.execution.stop_reason))
            return
        if self.slot.free <= 0 or (self.slot.waiting and not queued):
            # Started ahead beyond the free slots (a big instant): it begins as soon as
            # a run ends (_pump), its grace counted from its instant (_shed_queued);
            # behind the runs already waiting, not before them.
            self.slot.wait(loc)
            if self.slot.free > 0:
                self._pump_later()
            return
        if not known:
            may = self.gate.may(loc)
        else:
            may = None if held is None else loc.run_id in held
        if may is None:
            asyncio.get_running_loop().call_later(LEASE_RECHECK_S, self._await_lease, loc)
            return
        if not may:
            # Released and handed on (new fence) while this node was away: its new
            # holder runs it; this node never does, and reports nothing.
            self._forget(loc)
            self.counters.rejected += 1
            events.emit("run.start_rejected", node=self.node_id, run_id=loc.run_id,
                        fence=loc.fence, reason="moved on before its instant",
                        level=logging.WARNING)
            return
        lag_ms = self.clock.now_ms() - loc.scheduled_ms
        loc.phase = Phase.RUNNING
        self.slot.take(loc)
        self.counters.started += 1
        if self.on_started is not None:
            self.on_started(lag_ms / 1000)
        events.emit("run.started", node=self.node_id, run_id=loc.run_id, fence=loc.fence,
                    attempt=loc.attempt, lag_ms=lag_ms)
        runner = loc.execution.start(lambda result: self._ended(loc, result))
        if runner is not None:
            self._tasks.add(runner)
            runner.add_done_callback(self._tasks.discard)

    def _ended(self, loc: LocalRun, result: ExecutionResult) -> None:
        self.slot.give_back(loc)
        if self.slot.waiting:
            self._pump_later()
        if self.local.get(loc.run_id) is not loc:
            return  # cancelled by the cluster meanwhile: its finish would be refused
        loc.phase = Phase.FINISHING
        self.commits.finish(loc, result)
