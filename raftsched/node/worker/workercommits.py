"""What a node's worker pool sends the cluster: ``start`` and ``finish`` commands,
bounded in size, committed with retries; and the finish queue, held in the quiet after
a big instant and flushed in pipelined batches.

A part the :class:`raftsched.node.worker.worker.WorkerPool` holds (the pool decides what
starts and when, and runs it); apart because how outcomes reach the log has its own
timing trade-offs (see QUIET_MS) that the start side never needs.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from raftsched.core.commands import Finish, FinishItem, Start
from raftsched.core.errors import NotReady
from raftsched.node.observe import events
from raftsched.node.observe.clock import SYSTEM_CLOCK, Clock
from raftsched.node.worker.executor import calls_waiting
from raftsched.node.worker.runtypes import ExecutionResult

if TYPE_CHECKING:
    from raftsched.node.replica.port import ReplicaPort
    from raftsched.node.worker.localrun import LocalRun

# The worker's logger: its messages are one component's, whichever module writes them.
log = logging.getLogger("raftsched.worker")

#: How long one start/finish commit may take before it is retried.
COMMIT_TIMEOUT_S = 5.0
#: The longest pause between retries: after an election the held-up starts and
#: finishes should land within a tick of the new leader, not half a second later.
RETRY_MAX_S = 0.1
#: After an instant at which at least QUIET_GROUP runs start here, finishes are held
#: while the node's call pool still has calls waiting for a thread (mostly that
#: instant's), and at least QUIET_MS after the instant, but never past QUIET_MAX_MS:
#: committing (and every node applying) the first finishes while the cluster is still
#: handing the instant's runs to threads is what made the slow tail of the scheduling
#: lag. The costs, which is why only big instants get it: a run's ``finished_ms``
#: (stamped when the finish is submitted) is up to the hold later than its real end,
#: and a node that crashes during the hold leaves runs that did execute unfinished, so
#: ``on_node_lost = retry`` runs them again (docs/architecture.md, the finish hold).
QUIET_GROUP = 100
QUIET_MS = 30
QUIET_MAX_MS = 250
QUIET_POLL_S = 0.005
#: Items per start / finish command, each applied under the Raft lock on every node
#: (no hold over 20 ms: docs/architecture.md, bounded plans). A start costs ~4 us to
#: apply, a finish ~10-25 us (its history, notifications and queued run).
MAX_START_BATCH = 128
MAX_FINISH_BATCH = 64
#: Finish commands of one flush in flight at once (a sliding window: one commits, the
#: next is submitted). A commit takes a round trip to the leader and back, tens of ms
#: under load: at 4 in lockstep a follower's ~1,700 finishes of a 5,000-run second were
#: submitted 500-950 ms after the instant (up to 1.3 s while a node wrote its
#: snapshot), so the next fire of an ``overlap = skip`` job found its run not yet
#: finished and was skipped. At 32 the median second's last finish came 243 ms after
#: its instant, the worst 753 ms (bench/results/2026-12-05-finish-window.md).
#: Each command is still its own log entry, applied under the Raft lock on its own.
#: The cost: those entries now reach the log sooner, beside the next instant's starts;
#: W1's lag p99 at 5,000 jobs was 181 ms vs 145 in one invocation
#: (bench/results/2026-12-05-w1-finishwin-vs-1a132cd.md).
FINISH_PIPELINE = 32


class WorkerCommits:
    """The commit half of the worker pool; see the module docstring.

    :param node_id: this node.
    :param raft: the replica the commands go to.
    :param local: the pool's claimed runs (shared: a committed finish forgets its run).
    :param freed: called when committed finishes freed slots (wakes the pool).
    """

    def __init__(self, *, node_id: str, raft: ReplicaPort, local: dict[str, LocalRun],
                 freed: Callable[[], None], clock: Clock = SYSTEM_CLOCK) -> None:
        self.clock = clock
        self.node_id = node_id
        self.raft = raft
        self.local = local
        self.freed = freed
        #: Finishes not yet committed, oldest first.
        self.finish_q: list[FinishItem] = []
        self.finish_wake = asyncio.Event()
        #: Set when the pool stops: a commit that fails then is given up, not retried.
        self.stopping = False
        #: The last instant (epoch ms) that started QUIET_GROUP runs or more here.
        self.quiet_at = 0

    async def commit(self, cmd: Start | Finish, at_floor: int = 0) -> dict[str, Any]:
        """Submit until committed; retries keep the same items (start/finish are
        idempotent through fences). ``at`` is stamped at least ``at_floor``."""
        delay = 0.02
        while True:
            cmd = replace(cmd, at=max(self.clock.now_ms(), at_floor))
            try:
                fut = self.raft.submit(cmd)
                return await asyncio.wait_for(asyncio.wrap_future(fut), COMMIT_TIMEOUT_S)
            except (NotReady, TimeoutError) as exc:
                if self.stopping:
                    raise
                log.debug("%s not committed (%s); retrying", cmd.OP, exc)
            except Exception as exc:  # noqa: BLE001 - e.g. Overloaded: back off and retry
                log.debug("%s failed (%s); retrying", cmd.OP, exc)
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_MAX_S)

    def finish(self, loc: LocalRun, result: ExecutionResult) -> None:
        """Queue ``loc``'s outcome for the next finish batch."""
        self.finish_q.append(FinishItem(loc.run_id, loc.fence, result.outcome,
                                        result.exit_code, result.tail, result.reason))
        events.emit("run.finished", node=self.node_id, run_id=loc.run_id,
                    outcome=result.outcome, fence=loc.fence, attempt=loc.attempt,
                    exit_code=result.exit_code, reason=result.reason)
        self.finish_wake.set()

    async def _quiet(self) -> None:
        """Hold finishes in the quiet after a big instant (see QUIET_MS). Bounded by
        QUIET_MAX_MS from the instant, whichever way the wall clock steps meanwhile."""
        since = self.clock.now_ms() - self.quiet_at
        if not 0 <= since < QUIET_MAX_MS:
            return
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        give_up = t0 + (QUIET_MAX_MS - since) / 1000
        while calls_waiting() and loop.time() < give_up:
            await asyncio.sleep(QUIET_POLL_S)
        hold = min(QUIET_MS - since - (loop.time() - t0) * 1000,
                   (give_up - loop.time()) * 1000)
        if hold > 0:
            await asyncio.sleep(hold / 1000)

    async def _commit_in(self, window: asyncio.Semaphore,
                         items: tuple[FinishItem, ...]) -> None:
        async with window:
            await self.commit(Finish(node=self.node_id, items=items, at=0))

    async def flush_finishes(self) -> None:
        """Commit queued finishes in pipelined batches until the pool stops."""
        while True:
            await self.finish_wake.wait()
            self.finish_wake.clear()
            if not self.finish_q:
                continue
            await self._quiet()
            batch, self.finish_q = self.finish_q, []
            chunks = [tuple(batch[k:k + MAX_FINISH_BATCH])
                      for k in range(0, len(batch), MAX_FINISH_BATCH)]
            # Refused items (stale fence) are logged by the node from the effect.
            window = asyncio.Semaphore(FINISH_PIPELINE)
            done = await asyncio.gather(*(self._commit_in(window, c) for c in chunks),
                                        return_exceptions=True)
            if any(isinstance(d, BaseException) for d in done):
                return  # stopping
            for item in batch:
                # Only this attempt's claim: a retry handed back to this node (a newer
                # fence) may already stand under the same run id.
                held = self.local.get(item.run_id)
                if held is not None and held.fence == item.fence:
                    del self.local[item.run_id]
            self.freed()
