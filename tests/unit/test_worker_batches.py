"""Issue 13: a node's start and finish commands are bounded (each is applied under the
Raft lock on every node). The real WorkerPool runs here on a fake replica that answers
at once: a burst of starts becomes commands of at most MAX_START_BATCH runs, a burst of
finishes commands of at most MAX_FINISH_BATCH items, at most FINISH_PIPELINE in flight
in a sliding window (a slow commit does not hold back the ones after it); every item is
sent once."""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import Any

import pytest

from raftsched.core.commands import Finish, FinishItem, Start
from raftsched.core.machine import ClusterState
from raftsched.node.observe.clock import FakeClock, now_ms
from raftsched.node.worker import worker
from raftsched.node.worker.localrun import Phase
from raftsched.node.worker.worker import WorkerPool
from tests.support.stateutil import ok

pytestmark = pytest.mark.timeout(60)


class FakeRaft:
    def __init__(self, st: ClusterState | None = None, *, hold_first: bool = False) -> None:
        self.st = st
        self.sent: list[Any] = []
        self.flying = 0
        self.most_flying = 0
        #: hold_first: the first command is answered only by ``release()``.
        self.hold_first = hold_first
        self.held: Any = None

    def submit(self, cmd: Any) -> concurrent.futures.Future[Any]:
        self.sent.append(cmd)
        self.flying += 1
        self.most_flying = max(self.most_flying, self.flying)
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        loop = asyncio.get_running_loop()

        def answer() -> None:
            self.flying -= 1
            # Starts refused (the runs are then forgotten here: nothing is executed).
            fut.set_result({"ok": True, "results": [[isinstance(cmd, Finish), i.fence]
                                                    for i in cmd.items]})
        if self.hold_first and len(self.sent) == 1:
            self.held = answer
        else:
            loop.call_later(0.001, answer)
        return fut

    def release(self) -> None:
        self.held()

    def ready(self) -> bool:
        return True

    def read(self, fn: Any) -> Any:
        return fn(self.st)


def _finish_burst(raft: FakeRaft, n: int) -> WorkerPool:
    """A pool on ``raft`` with ``n`` finishes queued and the flush woken."""
    pool = WorkerPool(node_id="n1", raft=raft, slots=n,  # type: ignore[arg-type]
                      output_tail_bytes=100, allowed_call_prefixes=None, base_env={})
    pool.commits.finish_q = [FinishItem(f"j{i}@1000", i + 1, "succeeded", 0, "", "")
                             for i in range(n)]
    pool.commits.finish_wake.set()
    return pool


def test_a_burst_of_finishes_is_sent_in_bounded_commands() -> None:
    raft = FakeRaft()
    n = (worker.FINISH_PIPELINE + 5) * worker.MAX_FINISH_BATCH + 17

    async def main() -> None:
        pool = _finish_burst(raft, n)
        task = asyncio.create_task(pool.commits.flush_finishes())
        for _ in range(500):
            await asyncio.sleep(0.005)
            if not pool.commits.finish_q and sum(len(c.items) for c in raft.sent) == n \
                    and raft.flying == 0:
                break
        task.cancel()

    asyncio.run(main())
    sizes = [len(c.items) for c in raft.sent]
    assert max(sizes) == worker.MAX_FINISH_BATCH and sum(sizes) == n
    assert sorted(i.run_id for c in raft.sent for i in c.items) == \
        sorted(f"j{i}@1000" for i in range(n))
    assert raft.most_flying == worker.FINISH_PIPELINE


def test_a_slow_finish_commit_does_not_hold_back_the_ones_after_it() -> None:
    """A window in lockstep waited for its slowest commit before sending more: after a
    5,000-run second a follower's finishes were submitted ~350 ms late, and the next fire
    of an overlap = skip job found its run unfinished (bench/results, 2026-12-05)."""
    raft = FakeRaft(hold_first=True)
    chunks = worker.FINISH_PIPELINE + 8
    n = chunks * worker.MAX_FINISH_BATCH
    sent_while_held: list[int] = []
    flushed = []

    async def main() -> None:
        pool = _finish_burst(raft, n)
        pool.commits.freed = lambda: flushed.append(len(raft.sent))
        task = asyncio.create_task(pool.commits.flush_finishes())
        # Well inside COMMIT_TIMEOUT_S: the held command is not resent meanwhile.
        for _ in range(400):
            await asyncio.sleep(0.005)
            if len(raft.sent) == chunks and raft.flying == 1:
                break
        sent_while_held.append(len(raft.sent))
        raft.release()
        for _ in range(400):
            await asyncio.sleep(0.005)
            if flushed:
                break
        task.cancel()

    asyncio.run(main())
    # Every command after the slow first one was sent and answered while it was held,
    # and the flush ended once the held one was answered, with nothing sent twice.
    assert sent_while_held == [chunks]
    assert flushed == [chunks]
    assert sorted(i.run_id for c in raft.sent for i in c.items) == \
        sorted(f"j{i}@1000" for i in range(n))
    assert raft.flying == 0 and raft.most_flying == worker.FINISH_PIPELINE


def test_a_burst_of_starts_is_sent_in_bounded_commands() -> None:
    n = 2 * worker.MAX_START_BATCH + 9
    at = now_ms()
    st = ClusterState()
    ok(st, {"op": "leader", "at": at, "node": "n1", "term": 1})
    ok(st, {"op": "heartbeat", "at": at, "node": "n1", "boot": 1, "slots": n, "queue": 0,
            "tags": [], "api": ""})
    ok(st, {"op": "put_jobs", "at": at - 60_000, "specs": [
        {"id": f"j{i}", "schedule": {"every": "1h"}, "command": ["true"]} for i in range(n)]})
    fire = st.jobs["j0"].next_ms
    ok(st, {"op": "plan", "at": at, "fires": [["run", f"j{i}", fire, "n1", False]
                                              for i in range(n)]})
    raft = FakeRaft(st)

    async def main() -> None:
        pool = WorkerPool(node_id="n1", raft=raft, slots=n,  # type: ignore[arg-type]
                          output_tail_bytes=100, allowed_call_prefixes=None, base_env={},
                          prestart_ms=10 ** 10)  # every run is startable now
        pool._step()
        for _ in range(500):
            await asyncio.sleep(0.005)
            if sum(len(c.items) for c in raft.sent) == n and raft.flying == 0:
                break

    asyncio.run(main())
    assert all(isinstance(c, Start) for c in raft.sent)
    sizes = [len(c.items) for c in raft.sent]
    assert max(sizes) == worker.MAX_START_BATCH and sum(sizes) == n
    assert sorted(i.run_id for c in raft.sent for i in c.items) == \
        sorted(f"j{i}@{fire}" for i in range(n))


class ApplyingRaft(FakeRaft):
    """Applies each start to the state, as its commit would."""

    def submit(self, cmd: Any) -> concurrent.futures.Future[Any]:
        self.sent.append(cmd)
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        fut.set_result(self.st.apply_map(cmd))
        self.st.take_effects()
        return fut


def _one_run_assigned_to_n1() -> tuple[int, ClusterState, str, ApplyingRaft]:
    """A state whose leader n1 assigned itself the next fire of an hourly job: (now,
    the state, the run id, a replica applying to it)."""
    at = now_ms()
    st = ClusterState()
    ok(st, {"op": "leader", "at": at, "node": "n1", "term": 1})
    ok(st, {"op": "heartbeat", "at": at, "node": "n1", "boot": 1, "slots": 4, "queue": 0,
            "tags": [], "api": ""})
    ok(st, {"op": "put_job", "at": at - 60_000,
            "spec": {"id": "j", "schedule": {"every": "1h"}, "command": ["true"]}})
    fire = st.jobs["j"].next_ms
    ok(st, {"op": "plan", "at": at, "fires": [["run", "j", fire, "n1", False]]})
    run_id = f"j@{fire}"
    raft = ApplyingRaft(st)
    return at, st, run_id, raft


def test_a_refused_start_never_drops_the_newer_claim_of_its_run() -> None:
    # Seen in the membership test on a loaded machine: a start of fence 440 was in
    # flight when the run came back to this node as fence 508. Its refusal dropped the
    # 508 claim (popped by run id), the 508 start then committed with no local record,
    # and the run stayed started in the state, with no process, forever: a lost fire
    # and a drain that never ended.
    at, st, run_id, raft = _one_run_assigned_to_n1()

    async def main() -> None:
        pool = WorkerPool(node_id="n1", raft=raft, slots=4,  # type: ignore[arg-type]
                          output_tail_bytes=100, allowed_call_prefixes=None, base_env={})
        [old] = raft.read(pool._sync_claims)[0]
        pool.local[run_id] = old
        old.phase = Phase.STARTING
        # Meanwhile the run is released and handed back to this node (a new fence).
        ok(st, {"op": "release", "at": at, "node": "n1", "scope": "assigned"})
        ok(st, {"op": "plan", "at": at, "place": [[run_id, "n1"]]})
        [new] = raft.read(pool._sync_claims)[0]
        assert new.fence > old.fence
        pool.local[run_id] = new
        await pool._start_batch([old])  # refused: a stale fence
        assert pool.local.get(run_id) is new, "the newer claim was dropped"
        new.phase = Phase.STARTING
        await pool._start_batch([new])
        # Started in the cluster, waiting here for its instant (an hour ahead).
        assert pool.local.get(run_id) is new and new.phase == Phase.STARTED

    asyncio.run(main())
    assert st.runs[run_id].state == "started"


class _Execution:
    """Stands in for a running process: records the stops asked of it."""

    def __init__(self) -> None:
        self.stops: list[str | None] = []

    def stop(self, grace_s: float, reason: str | None = None) -> None:
        self.stops.append(reason)


def test_an_older_attempts_cancel_spares_the_newer_and_a_replaced_attempt_is_stopped() -> None:
    # A run id comes back with a new fence while its first attempt still runs here and
    # that attempt's cancel is still queued (a one-shot job removed and put again
    # inside its grace; effects reach the worker after it reads the state). The cancel
    # popped the newer claim by run id, and the first attempt's process was left with
    # no record owning it: it ran on beside the newer attempt, never stopped.
    at, st, run_id, raft = _one_run_assigned_to_n1()

    async def main() -> None:
        pool = WorkerPool(node_id="n1", raft=raft, slots=4,  # type: ignore[arg-type]
                          output_tail_bytes=100, allowed_call_prefixes=None, base_env={})
        [old] = raft.read(pool._sync_claims)[0]
        old.phase, old.execution = Phase.RUNNING, _Execution()
        pool.local[run_id] = old
        ok(st, {"op": "release", "at": at, "node": "n1", "scope": "assigned"})
        ok(st, {"op": "plan", "at": at, "place": [[run_id, "n1"]]})
        pool._step()
        new = pool.local[run_id]
        assert new is not old and new.fence > old.fence
        assert old.execution.stops == ["a newer attempt of the run began"]
        pool.cancel(run_id, old.fence)
        assert pool.local.get(run_id) is new, "the older attempt's cancel dropped the newer"
        pool.cancel(run_id, new.fence)
        assert run_id not in pool.local

    asyncio.run(main())


def test_a_wall_clock_stepped_back_does_not_hold_a_committed_start_for_the_step(
        monkeypatch) -> None:
    # The start timer is monotonic and waits at most the pre-start window; when it
    # fires and the wall clock says the instant is an hour ahead, the clock was stepped
    # back: the run begins now, not in an hour with its start committed meanwhile.
    begun: list[str] = []

    async def main() -> None:
        at = 1_000_000_000
        clock = FakeClock(at - 150)  # the pool reads time from the clock it is given
        pool = WorkerPool(node_id="n1", raft=FakeRaft(), slots=4,  # type: ignore[arg-type]
                          output_tail_bytes=100, allowed_call_prefixes=None, base_env={},
                          prestart_ms=200, clock=clock)
        monkeypatch.setattr(pool, "_held_started", lambda group: frozenset())
        monkeypatch.setattr(pool, "_begin", lambda loc, *_, **__: begun.append(loc))
        for label, now in (("slightly early", at - 150), ("stepped back", at - 3_600_000)):
            pool._at[at] = [label]  # type: ignore[list-item]
            clock.step_wall(now - clock.now_ms())
            pool._fire(at)
        assert begun == ["stepped back"]
        assert pool._at == {}

    asyncio.run(main())


def test_a_run_assigned_to_a_pool_holding_none_nudges_the_liveness_once() -> None:
    # Issue 31 item 3: an idle node heartbeats at the idle period; the run assigned to
    # it must speed its heartbeats up before it may spawn (liveness.Liveness.nudge).
    _, _, run_id, raft = _one_run_assigned_to_n1()
    nudges: list[int] = []

    async def main() -> None:
        pool = WorkerPool(node_id="n1", raft=raft, slots=4,  # type: ignore[arg-type]
                          output_tail_bytes=100, allowed_call_prefixes=None, base_env={})
        pool.on_busy = lambda: nudges.append(len(pool.local))
        pool._step()
        assert run_id in pool.local
        pool._step()  # still held: no second nudge

    asyncio.run(main())
    assert nudges == [0]  # once, before the pool took the run in
