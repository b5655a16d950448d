"""Issue 31 item 3: an idle node heartbeats at the idle period (a third of the node
timeout), a node holding a run at the busy one, and a run assigned to an idle node
speeds its heartbeats up at once. The node's real :class:`Liveness` loop runs on a
fake clock (its sleeps advance the clock), against a replica that commits each
heartbeat when the test says so. An idle node's lease may lapse; its quorum counts as
lost only as much later as its longer period (core.lease.fence_after_ms)."""

from __future__ import annotations

import asyncio
import concurrent.futures
from types import SimpleNamespace
from typing import Any

import pytest

from raftsched.core import lease
from raftsched.node.config.config import Timing
from raftsched.node.observe.clock import FakeClock
from raftsched.node.worker.liveness import Liveness

pytestmark = pytest.mark.timeout(60)

TIMING = Timing()  # the defaults: node timeout 3 s, heartbeat 0.5 s
WOKEN = "woken"


class Raft:
    """Records each heartbeat's send time; commits it at once unless ``hold``; fails
    the heartbeats whose numbers (0-based) are in ``fail``."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.sent: list[float] = []
        self.hold = False
        self.held: list[concurrent.futures.Future[Any]] = []
        self.fail: set[int] = set()

    def submit(self, _cmd: Any) -> concurrent.futures.Future[Any]:
        self.sent.append(self.clock.monotonic())
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        if len(self.sent) - 1 in self.fail:
            fut.set_exception(RuntimeError("leader changed"))
        elif self.hold:
            self.held.append(fut)
        else:
            fut.set_result({"ok": True})
        return fut


class Worker:
    def __init__(self) -> None:
        self.local: dict[str, Any] = {}
        self.draining = False
        self.fences: list[str] = []

    def self_fence(self, reason: str) -> None:
        self.fences.append(reason)


def _run(script: Any, *, fail: set[int] | None = None, idle_ok: bool = True,
         guard: Any = None) -> tuple[Raft, Worker, Liveness, list[tuple[str, dict[str, Any]]]]:
    """Run the liveness loop until ``script(clock, raft, worker, liveness)`` (called at
    each of the loop's sleeps, with the clock at the sleep's start) returns True; if it
    returns ``WOKEN``, that sleep ends at once (a nudge came during it)."""
    clock = FakeClock(wall_ms=1_700_000_000_000)
    raft, worker, said = Raft(clock), Worker(), []
    raft.fail = fail or set()
    me: Any = SimpleNamespace(id="n1", workers=4, queue=4, tags=(), api="")
    liv = Liveness(raft=raft, worker=worker, guard=guard, me=me,  # type: ignore[arg-type]
                   timing=TIMING, boot_ms=1, features=(), clock=clock,
                   on_event=lambda name, fields: said.append((name, fields)),
                   idle_ok=lambda: idle_ok)

    async def main() -> None:
        done = asyncio.get_running_loop().create_future()

        nudges = [0]
        nudge = liv.nudge

        def counted() -> None:
            nudges[0] += 1
            nudge()

        liv.nudge = counted  # type: ignore[method-assign]

        async def sleep(seconds: float) -> None:
            before = nudges[0]
            for _ in range(3):
                await asyncio.sleep(0)  # the acknowledgements' callbacks run
            if nudges[0] != before:
                return  # a nudge as the sleep began: it ends at once
            said = script(clock, raft, worker, liv)
            if said is True:
                done.set_result(None)
                await asyncio.Future()  # parked until cancelled
            if said is not WOKEN:
                clock.advance(seconds)

        liv._sleep = sleep  # type: ignore[method-assign]
        task = asyncio.ensure_future(liv.run())
        await asyncio.wait_for(done, 30)
        task.cancel()

    asyncio.run(main())
    return raft, worker, liv, said


def _gaps(times: list[float]) -> list[float]:
    return [round(b - a, 3) for a, b in zip(times, times[1:], strict=False)]


def test_an_idle_node_heartbeats_at_the_idle_period_and_a_busy_one_at_the_busy_period(
        ) -> None:
    idle_s = lease.idle_heartbeat_ms(TIMING.node_timeout_ms, TIMING.heartbeat_ms) / 1000
    assert idle_s == 1.0

    def script(clock: FakeClock, raft: Raft, worker: Worker, liv: Liveness) -> bool:
        if len(raft.sent) == 6 and not worker.local:
            worker.local["r1"] = object()  # a run held here from now on
        return len(raft.sent) >= 12

    raft, worker, _, said = _run(script)
    gaps = _gaps(raft.sent)
    # The first heartbeat counts as busy (a node just started may be handed runs).
    assert gaps[1:5] == [idle_s] * 4, gaps
    assert set(gaps[6:]) == {TIMING.heartbeat_ms / 1000}, gaps
    assert not said and not worker.fences


def test_a_run_assigned_to_an_idle_node_brings_its_next_heartbeat_forward() -> None:
    marks: dict[str, float] = {}

    def script(clock: FakeClock, raft: Raft, worker: Worker, liv: Liveness) -> Any:
        if len(raft.sent) == 4 and "nudged" not in marks:
            clock.advance(0.6)  # 0.6 s into the idle sleep: past the busy period
            marks["nudged"] = clock.monotonic()
            worker.local["r1"] = object()
            liv.nudge()
            return WOKEN
        return len(raft.sent) >= 5

    raft, *_ = _run(script)
    # Sent as the nudge woke the loop, not a whole idle period after the last one.
    assert raft.sent[4] == marks["nudged"], _gaps(raft.sent)


def test_an_idle_node_counts_its_quorum_lost_only_past_its_longer_period() -> None:
    busy_fence = lease.fence_after_ms(TIMING.node_timeout_ms, TIMING.heartbeat_ms,
                                      TIMING.heartbeat_ms) / 1000
    idle_fence = lease.fence_after_ms(TIMING.node_timeout_ms, 1000, TIMING.heartbeat_ms) / 1000
    assert (busy_fence, idle_fence) == (1.5, 2.0)
    seen: dict[str, float] = {}

    def script(clock: FakeClock, raft: Raft, worker: Worker, liv: Liveness) -> bool:
        if len(raft.sent) == 3 and not raft.hold:
            raft.hold = True  # nothing commits from now on
            seen["last_ack"] = liv.last_ack_send
        if "last_ack" in seen and liv.fenced and "fenced" not in seen:
            seen["fenced"] = clock.monotonic()
        return "fenced" in seen

    raft, worker, liv, said = _run(script)
    waited = seen["fenced"] - seen["last_ack"]
    # Never before its own (idle) bound, and within a fence tick of it.
    assert idle_fence < waited <= idle_fence + 2 * lease.FENCE_TICK_MS / 1000, waited
    assert [name for name, _ in said] == ["quorum.lost"]
    assert len(worker.fences) == 1


def test_a_nudge_ends_the_loops_sleep() -> None:
    clock = FakeClock(wall_ms=1_700_000_000_000)
    me: Any = SimpleNamespace(id="n1", workers=4, queue=4, tags=(), api="")
    liv = Liveness(raft=Raft(clock), worker=Worker(), guard=None, me=me,  # type: ignore[arg-type]
                   timing=TIMING, boot_ms=1, features=(), clock=clock)

    async def main() -> None:
        liv._busy = False
        # Once the sleep has begun (the loop only ever awaits there, so a nudge can
        # only come while it sleeps).
        asyncio.get_running_loop().call_later(0.05, liv.nudge)
        await asyncio.wait_for(liv._sleep(60.0), 10.0)  # raises if the nudge did not end it
        assert liv._busy and liv._nap is None

    asyncio.run(main())


def test_an_idle_node_that_loses_a_heartbeat_retries_at_the_busy_period_and_stays() -> None:
    # The third heartbeat fails (a leader change): the next comes 0.5 s later, not 1 s,
    # and is acknowledged well before the idle fence (2 s after the last one that was).
    raft, worker, _, said = _run(lambda clock, raft, worker, liv: len(raft.sent) >= 8,
                                 fail={2})
    gaps = _gaps(raft.sent)
    assert gaps[2] == TIMING.heartbeat_ms / 1000, gaps
    assert gaps[3:] == [1.0] * len(gaps[3:]), gaps  # idle again once one is acknowledged
    assert not said and not worker.fences


def test_until_every_member_reads_idle_heartbeats_an_idle_node_keeps_the_busy_period() -> None:
    raft, *_ = _run(lambda clock, raft, worker, liv: len(raft.sent) >= 6, idle_ok=False)
    assert set(_gaps(raft.sent)) == {TIMING.heartbeat_ms / 1000}


def test_the_guard_hears_of_its_deadline_only_when_it_moves() -> None:
    deadlines: list[float] = []
    guard = SimpleNamespace(deadline=deadlines.append)
    raft, *_ = _run(lambda clock, raft, worker, liv: len(raft.sent) >= 4, guard=guard)
    # One per acknowledged heartbeat (and the first, at start), not one per loop turn.
    assert len(deadlines) == len(set(deadlines)) <= len(raft.sent) + 1
