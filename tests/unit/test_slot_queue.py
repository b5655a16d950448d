"""Issue 31: the starts of an instant bigger than a node's slots are all committed ahead;
at the instant only the executions wait for slots, each begins as one frees, with no
commit between. Past its instant a start still needs a free slot; a run waiting for a
slot past its grace is shed; a run cancelled, released or self-fenced while it waits
never begins.

The real WorkerPool on a fake clock and a replica that applies each command to an
in-process state; executions are stand-ins the test ends. No process, no sleep.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from raftsched.core.commands import Finish, Start
from raftsched.core.machine import ClusterState
from raftsched.core.model import RunState
from raftsched.node.observe.clock import FakeClock
from raftsched.node.worker import launch as launch_mod
from raftsched.node.worker.localrun import Phase
from raftsched.node.worker.runtypes import ExecutionResult
from raftsched.node.worker.worker import WorkerPool
from tests.support.stateutil import ok
from tests.unit.test_leader_pipeline import T0
from tests.unit.test_worker_batches import ApplyingRaft

pytestmark = pytest.mark.timeout(60)

SLOTS, QUEUE = 2, 4
DONE = ExecutionResult(outcome=RunState.succeeded, exit_code=0, tail="", reason="")


class _Execution:
    """Stands in for a run's process: begins when the pool says, ends when the test says."""

    def __init__(self, *, ctx: Any, **_: Any) -> None:
        self.run_id = ctx.run_id
        self.stopped = False
        self.stop_reason = ""
        self.on_done: Any = None

    def start(self, on_done: Any) -> None:
        self.on_done = on_done
        _Execution.begun.append(self.run_id)

    def stop(self, grace_s: float, reason: str = "stopped by the node") -> None:
        self.stopped, self.stop_reason = True, reason
        if self.on_done is not None:
            self.end(ExecutionResult(outcome=RunState.lost, exit_code=None, tail="",
                                     reason=reason))

    def end(self, result: ExecutionResult) -> None:
        on_done, self.on_done = self.on_done, None
        if on_done is not None:
            on_done(result)

    begun: list[str] = []


@pytest.fixture(autouse=True)
def _executions(monkeypatch: pytest.MonkeyPatch) -> None:
    _Execution.begun = []
    monkeypatch.setattr(launch_mod, "Execution", _Execution)  # where runs begin


def _instant(n: int, ahead_ms: int, grace: str = "60s") -> tuple[ClusterState, int, list[str]]:
    """Leader n1 assigned itself ``n`` runs of one instant ``ahead_ms`` before it:
    (state, the instant, the run ids)."""
    st = ClusterState()
    ok(st, {"op": "leader", "at": T0, "node": "n1", "term": 1})
    ok(st, {"op": "heartbeat", "at": T0, "node": "n1", "boot": 1, "slots": SLOTS,
            "queue": QUEUE, "tags": [], "api": ""})
    ok(st, {"op": "put_jobs", "at": T0 - 1, "specs": [
        {"id": f"j{i}", "schedule": {"every": "1h"}, "call": "tests:noop",
         "misfire": {"policy": "skip", "grace": grace}} for i in range(n)]})
    fire = st.jobs["j0"].next_ms
    ok(st, {"op": "plan", "at": fire - ahead_ms,
            "fires": [["run", f"j{i}", fire, "n1", False] for i in range(n)]})
    return st, fire, [f"j{i}@{fire}" for i in range(n)]


def _pool(raft: ApplyingRaft, clock: FakeClock) -> WorkerPool:
    return WorkerPool(node_id="n1", raft=raft, slots=SLOTS,  # type: ignore[arg-type]
                      output_tail_bytes=100, allowed_call_prefixes=None, base_env={},
                      prestart_ms=200, max_prestart_ms=1_600, start_limit=SLOTS + QUEUE,
                      clock=clock)


def _started(raft: ApplyingRaft) -> list[str]:
    return [i.run_id for c in raft.sent if isinstance(c, Start) for i in c.items]


async def _settle() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


async def _step(pool: WorkerPool) -> None:
    """One pass of the pool's loop, and the commits it made answered."""
    pool._step()
    await _settle()


async def _commit_ahead_then_fire(pool: WorkerPool, clock: FakeClock, fire: int, *,
                                  seen: Any = None) -> None:
    """Let the pool commit what it may ahead (``seen()`` looks then), then reach the
    instant and fire its group."""
    await _step(pool)
    if seen is not None:
        seen()
    clock.step_wall(fire - clock.now_ms())
    pool._fire(fire)


def _end(pool: WorkerPool, run_id: str) -> None:
    loc = pool.local[run_id]
    loc.execution.end(DONE)  # type: ignore[union-attr]


def test_a_big_instants_starts_are_committed_ahead_and_its_runs_take_slots_as_they_free(
        ) -> None:
    st, fire, ids = _instant(SLOTS + QUEUE, ahead_ms=1_000)
    raft = ApplyingRaft(st)
    clock = FakeClock(fire - 800)
    seen: dict[str, Any] = {}

    async def main() -> None:
        pool = _pool(raft, clock)
        # Every start committed before the instant, beyond the 2 slots.
        await _commit_ahead_then_fire(pool, clock, fire, seen=lambda: seen.update(
            ahead=sorted(_started(raft)), phases={pool.local[r].phase for r in ids}))
        seen["at instant"] = list(_Execution.begun)
        commits = len(raft.sent)
        for k in range(len(ids)):
            _end(pool, _Execution.begun[k])
            await _settle()
            pool._step()
        seen["commits between"] = [type(c).__name__ for c in raft.sent[commits:]
                                   if not isinstance(c, Finish)]
        seen["all"] = list(_Execution.begun)

    asyncio.run(main())
    assert seen["ahead"] == sorted(ids)
    assert seen["phases"] == {Phase.STARTED}
    assert len(seen["at instant"]) == SLOTS
    assert seen["commits between"] == []
    assert sorted(seen["all"]) == sorted(ids) and len(seen["all"]) == len(ids)
    assert all(st.runs[r].state == "started" for r in ids if r in st.runs)


def test_past_its_instant_a_start_still_needs_a_free_slot() -> None:
    """Assigned late (a catch-up, a node back from a pause): only as many starts as free
    slots are committed; the rest wait, assigned, and start as slots free."""
    st, fire, ids = _instant(SLOTS + QUEUE, ahead_ms=0)
    raft = ApplyingRaft(st)
    clock = FakeClock(fire + 10)
    seen: dict[str, Any] = {}

    async def main() -> None:
        pool = _pool(raft, clock)
        await _step(pool)
        seen["started"] = len(_started(raft))
        seen["waiting"] = sum(1 for loc in pool.local.values() if loc.phase == Phase.WAITING)

    asyncio.run(main())
    assert seen == {"started": SLOTS, "waiting": QUEUE}


def test_a_run_waiting_for_a_slot_past_its_grace_is_shed_as_overload() -> None:
    st, fire, ids = _instant(SLOTS + QUEUE, ahead_ms=1_000, grace="1s")
    raft = ApplyingRaft(st)
    clock = FakeClock(fire - 800)
    seen: dict[str, Any] = {}

    async def main() -> None:
        pool = _pool(raft, clock)
        await _commit_ahead_then_fire(pool, clock, fire)
        clock.step_wall(1_000)  # the slots stay held by the first two
        pool._step()
        seen["at grace"] = list(pool.commits.finish_q)
        clock.step_wall(1)
        pool._step()
        seen["past grace"] = [(i.run_id, i.outcome, i.reason) for i in pool.commits.finish_q]
        _end(pool, _Execution.begun[0])
        await _settle()
        seen["begun"] = list(_Execution.begun)

    asyncio.run(main())
    assert seen["at grace"] == []
    queued = sorted(set(ids) - set(seen["begun"]))
    assert len(queued) == QUEUE and len(seen["begun"]) == SLOTS
    assert sorted(seen["past grace"]) == [(r, RunState.shed, "overload") for r in queued]


def test_a_run_cancelled_released_or_self_fenced_while_it_waits_for_a_slot_never_begins(
        ) -> None:
    st, fire, ids = _instant(SLOTS + QUEUE, ahead_ms=1_000)
    raft = ApplyingRaft(st)
    clock = FakeClock(fire - 800)
    seen: dict[str, Any] = {}

    async def main() -> None:
        pool = _pool(raft, clock)
        await _commit_ahead_then_fire(pool, clock, fire)
        running = list(_Execution.begun)
        queued = [loc.run_id for loc in pool.slot._waiting]
        # The cluster cancels one waiting run; another is released from this node
        # (the state moves it on); then the node self-fences.
        pool.cancel(queued[0], pool.local[queued[0]].fence)
        st.runs[queued[1]].node = "n2"
        _end(pool, running[0])
        await _settle()
        seen["after one ended"] = list(_Execution.begun)
        pool.self_fence("test")
        await _settle()
        seen["after fence"] = list(_Execution.begun)
        seen["lost"] = sorted(i.run_id for i in pool.commits.finish_q
                              if i.outcome == RunState.lost)
        seen["queued"], seen["running"] = queued, running

    asyncio.run(main())
    queued = seen["queued"]
    # One slot freed: the next waiting run still held here begins, not the cancelled
    # or the moved one.
    assert seen["after one ended"][len(seen["after one ended"]) - 1] == queued[2]
    assert seen["after fence"] == seen["after one ended"]
    # Stopped: the two executing end lost, and so does the one still waiting; the
    # cancelled and the moved one report nothing.
    assert seen["lost"] == sorted([seen["running"][1], queued[2], queued[3]])


def test_a_small_instant_is_started_within_the_slots_as_before() -> None:
    """Assigned at the lookahead (not planned early): no start beyond the slots, so
    a run its node could not begin stays assigned (the leader moves it if the node is
    lost) rather than started."""
    st, fire, ids = _instant(SLOTS + QUEUE, ahead_ms=250)
    raft = ApplyingRaft(st)
    clock = FakeClock(fire - 200)
    seen: dict[str, Any] = {}

    async def main() -> None:
        pool = _pool(raft, clock)
        await _step(pool)
        seen["started"] = len(_started(raft))

    asyncio.run(main())
    assert seen == {"started": SLOTS}


def test_a_run_due_now_is_not_kept_waiting_by_starts_committed_for_a_later_instant(
        ) -> None:
    """A big instant's starts are committed ahead (beyond the slots); a run due now
    (a trigger, a retry, a late assignment) still gets an idle slot at once."""
    st, fire, ids = _instant(SLOTS + QUEUE, ahead_ms=1_500)
    ok(st, {"op": "put_job", "at": fire - 5_000, "spec": {
        "id": "m", "schedule": {"every": "1h", "offset": "59m"}, "call": "tests:noop"}})
    raft = ApplyingRaft(st)
    clock = FakeClock(fire - 1_100)
    seen: dict[str, Any] = {}

    async def main() -> None:
        pool = _pool(raft, clock)
        await _step(pool)
        seen["ahead"] = len(_started(raft))
        due = fire - 1_000  # m's fire time, assigned only now (late)
        ok(st, {"op": "plan", "at": due + 5, "fires": [["run", "m", due, "n1", False]]})
        clock.step_wall(due + 10 - clock.now_ms())
        await _step(pool)
        seen["m started"] = f"m@{due}" in _started(raft)
        seen["busy"] = pool.statistics().busy

    asyncio.run(main())
    assert seen == {"ahead": SLOTS + QUEUE, "m started": True, "busy": 1}


def test_a_run_that_cannot_begin_after_waiting_for_the_lease_ends_failed_and_frees_its_slot(
        monkeypatch: pytest.MonkeyPatch) -> None:
    st, fire, ids = _instant(SLOTS, ahead_ms=1_000)
    raft = ApplyingRaft(st)
    clock = FakeClock(fire - 800)
    lease = {"at": -1_000.0}
    seen: dict[str, Any] = {}

    async def main() -> None:
        pool = WorkerPool(node_id="n1", raft=raft, slots=SLOTS,  # type: ignore[arg-type]
                          output_tail_bytes=100, allowed_call_prefixes=None, base_env={},
                          prestart_ms=200, max_prestart_ms=1_600, start_limit=SLOTS + QUEUE,
                          lease=lambda: lease["at"], lease_s=1.0, clock=clock)
        # No fresh lease at the instant: each run looks again in LEASE_RECHECK_S.
        await _commit_ahead_then_fire(pool, clock, fire)
        seen["held for the lease"] = [pool.local[r].phase for r in ids]

        def broken(self: Any, on_done: Any) -> None:
            raise RuntimeError("cannot begin")
        monkeypatch.setattr(_Execution, "start", broken)
        lease["at"] = clock.monotonic()  # fresh again
        for _ in range(200):
            await asyncio.sleep(0.01)
            if len(pool.commits.finish_q) == len(ids):
                break
        seen["outcomes"] = sorted((i.run_id, i.outcome) for i in pool.commits.finish_q)
        seen["free"] = pool.slot.free

    asyncio.run(main())
    assert seen["held for the lease"] == [Phase.STARTED] * SLOTS
    assert seen["outcomes"] == [(r, RunState.failed) for r in sorted(ids)]
    assert seen["free"] == SLOTS
