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
from hypothesis import given
from hypothesis import strategies as st

from raftsched.core import lease
from raftsched.node.config.config import Timing
from raftsched.node.leader import contact
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
        #: When (the fake clock) this node's Raft thread last knew a leader in contact
        #: with a quorum (None: no leader known); the clock's start by default.
        self.contact_at: float | None = clock.monotonic()
        #: Whether the state counts this incarnation alive.
        self.listed = True

    def quorum_contact_age(self) -> float | None:
        return None if self.contact_at is None else self.clock.monotonic() - self.contact_at

    def read(self, fn: Any) -> Any:
        return fn(SimpleNamespace(nodes={"n1": SimpleNamespace(boot_ms=1, alive=self.listed)}))

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
         guard: Any = None, contact: bool = False,
         ) -> tuple[Raft, Worker, Liveness, list[tuple[str, dict[str, Any]]]]:
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
                   idle_ok=lambda: idle_ok, contact_ok=lambda: contact)

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


# Once every member lists ``contact`` (leader/contact.py): an idle node's Raft contact
# is its liveness, its heartbeat entries a refresh ten node timeouts apart.

CONTACT_S = lease.contact_heartbeat_ms(TIMING.node_timeout_ms) / 1000


def _in_contact(clock: FakeClock, raft: Raft) -> None:
    """Its leader's appends keep coming (each loop turn sees one 0.1 s old)."""
    raft.contact_at = clock.monotonic() - 0.1


def test_an_idle_node_in_contact_heartbeats_only_to_refresh_and_never_fences() -> None:
    assert CONTACT_S == 30.0

    def script(clock: FakeClock, raft: Raft, worker: Worker, liv: Liveness) -> bool:
        _in_contact(clock, raft)
        return clock.monotonic() - raft.sent[0] > 2.5 * CONTACT_S

    raft, worker, liv, said = _run(script, contact=True)
    gaps = _gaps(raft.sent)
    # The first (its record: the node just started), then only refreshes (at the
    # loop's first turn past each: it turns every idle period).
    assert len(gaps) == 2 and all(CONTACT_S <= g <= CONTACT_S + 1.0 for g in gaps), gaps
    assert not said and not worker.fences and not liv.fenced


def test_an_idle_node_out_of_contact_says_its_quorum_is_lost_and_back() -> None:
    idle_fence = lease.fence_after_ms(TIMING.node_timeout_ms, 1000, TIMING.heartbeat_ms) / 1000
    marks: dict[str, float] = {}

    def script(clock: FakeClock, raft: Raft, worker: Worker, liv: Liveness) -> bool:
        now = clock.monotonic()
        if now - raft.sent[0] < 5:
            _in_contact(clock, raft)
        elif "cut" not in marks:
            marks["cut"] = raft.contact_at or 0.0  # no append from here on
        if liv.fenced and "fenced" not in marks:
            marks["fenced"] = now
        if "fenced" in marks and now - marks["fenced"] > 1.0:
            _in_contact(clock, raft)  # a leader's appends again
        return not liv.fenced and "fenced" in marks

    raft, worker, liv, said = _run(script, contact=True)
    waited = marks["fenced"] - marks["cut"]
    assert idle_fence < waited <= idle_fence + 2 * lease.FENCE_TICK_MS / 1000, waited
    assert [name for name, _ in said] == ["quorum.lost", "quorum.back"], said
    # Back only by a committed heartbeat (an append read as a node wakes may be a
    # deposed leader's): the first, and those since the loss.
    assert len(raft.sent) >= 2 and raft.sent[1] >= marks["fenced"], _gaps(raft.sent)


def test_an_idle_node_the_cluster_counts_lost_heartbeats_at_once() -> None:
    marks: dict[str, float] = {}

    def script(clock: FakeClock, raft: Raft, worker: Worker, liv: Liveness) -> bool:
        _in_contact(clock, raft)
        if clock.monotonic() - raft.sent[0] > 5 and "lost" not in marks:
            raft.listed = False  # a leader counted it lost (it was frozen, say)
            marks["lost"] = clock.monotonic()
        return len(raft.sent) >= 2

    raft, *_ = _run(script, contact=True)
    # At the loop's next turn (the idle period), not at the next refresh.
    assert raft.sent[1] - marks["lost"] <= 1.0 + 1e-9, _gaps(raft.sent)


def test_a_run_assigned_to_an_idle_node_in_contact_brings_its_heartbeat_at_once() -> None:
    marks: dict[str, float] = {}

    def script(clock: FakeClock, raft: Raft, worker: Worker, liv: Liveness) -> Any:
        _in_contact(clock, raft)
        if clock.monotonic() - raft.sent[0] > 10 and "nudged" not in marks:
            marks["nudged"] = clock.monotonic()
            marks["lease_then"] = liv.spawn_lease()
            worker.local["r1"] = object()
            liv.nudge()
            return WOKEN
        return len(raft.sent) >= 4

    raft, worker, liv, _ = _run(script, contact=True)
    assert raft.sent[1] == marks["nudged"], _gaps(raft.sent)
    # Busy from then on: its lease (for the spawn) counts from real heartbeats only.
    assert _gaps(raft.sent)[1:] == [TIMING.heartbeat_ms / 1000] * 2
    assert liv.lease_base == raft.sent[-1]
    # Contact read as its quorum since the last acknowledgement: nothing may spawn on
    # that lease (the leader reads no contact once the node holds the run), only on
    # the next acknowledged heartbeat's.
    assert marks["lease_then"] == float("-inf")
    assert liv.spawn_lease() == raft.sent[-1]


@given(st.lists(st.floats(min_value=0, max_value=60), max_size=6), st.integers(1, 7))
def test_a_leaders_quorum_contact_is_as_old_as_the_answer_that_completes_its_majority(
        ages: list[float], voters: int) -> None:
    got = lease.majority_contact_age(ages, voters)
    needed = voters // 2
    if needed == 0:
        assert got == 0.0  # a lone node is its own quorum
    elif len(ages) < needed:
        assert got is None
    else:
        assert got is not None
        # A majority (the leader and those it heard from) within it; not one fewer.
        assert sum(1 for a in ages if a <= got) >= needed
        assert sum(1 for a in ages if a < got) < needed


def test_a_node_counted_lost_is_not_in_contact_whatever_its_raft_thread_hears() -> None:
    """A one-way link: it hears its leader's appends, its answers do not get through,
    and the leader counted it lost. It says its quorum is lost (its heartbeats do not
    commit), and retries them no faster than an unanswered one is given up on."""
    marks: dict[str, float] = {}

    def script(clock: FakeClock, raft: Raft, worker: Worker, liv: Liveness) -> bool:
        _in_contact(clock, raft)
        if clock.monotonic() - raft.sent[0] > 5 and "cut" not in marks:
            raft.listed, raft.hold = False, True
            marks["cut"] = clock.monotonic()
        return "cut" in marks and clock.monotonic() - marks["cut"] > 10

    raft, worker, liv, said = _run(script, contact=True)
    assert [name for name, _ in said] == ["quorum.lost"], said
    assert liv.fenced
    retried = [t for t in raft.sent if t >= marks["cut"]]
    assert 5 <= len(retried) <= 12, _gaps(raft.sent)


def test_contact_is_read_only_where_the_timing_leaves_room_for_it() -> None:
    assert contact.timing_fits(Timing())  # the defaults: answers 0.3-0.4 s apart, timeout 3 s
    assert contact.timing_fits(Timing(node_timeout_ms=2000, heartbeat_ms=250))  # the tests'
    slow = Timing(node_timeout_ms=3000, heartbeat_ms=500, election_timeout_min_ms=6000,
                  election_timeout_max_ms=12000, append_period_ms=1500,
                  connection_timeout_ms=12000, leader_fallback_ms=20000)
    assert not contact.timing_fits(slow)  # answers up to 7 s apart: idle nodes heartbeat
