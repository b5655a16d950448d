"""Issue 13: the leader's plans are bounded and several are in flight at once.

The real :class:`~raftsched.node.leader.leaderloop.LeaderLoop` runs here against a fake replica
(a :class:`ClusterState` read in-process, submissions the test commits, fails or lets
time out in Raft order) and a fake clock: no process, no sleep. A minute's first second
of many jobs becomes many small plans; no plan reads or assigns more than the bounds; no
job or pending run is in two plans in flight; every fire time ends up accounted for
exactly once, also when plans fail to commit or time out and commit later.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections import Counter
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hst

from raftsched.core import leader as core_leader
from raftsched.core import planinput
from raftsched.core.commands import Place, Plan, RunFire
from raftsched.core.errors import NotReady
from raftsched.core.machine import ClusterState
from raftsched.core.trigger import fire_times, next_fire
from raftsched.node.config.addressbook import AddressBook
from raftsched.node.leader import leaderloop
from raftsched.node.leader.leaderloop import LeaderLoop
from raftsched.node.observe.clock import FakeClock
from tests.support.budget import examples
from tests.support.stateutil import ok

pytestmark = pytest.mark.timeout(120)

S = 1000
T0 = 20_000 * 86_400 * S  # a round epoch ms (midnight UTC)
LOOKAHEAD = 250



def _bound_plans(monkeypatch: pytest.MonkeyPatch, cap: int) -> None:
    """Plans of at most ``cap`` jobs and runs: the copy (planinput) reads that many,
    the planner (leader) makes that many."""
    for mod in (core_leader, planinput):
        monkeypatch.setattr(mod, "MAX_JOBS_PER_PLAN", cap)
        monkeypatch.setattr(mod, "MAX_RUNS_PER_PLAN", cap)


class FakeRaft:
    """The replica port over one in-process state; submissions wait in Raft order until
    the test commits them (``commit``), refuses them (``fail``: never appended) or lets
    their caller time out while they stay in the log (``time_out``)."""

    def __init__(self, st: ClusterState) -> None:
        self.st = st
        self.queue: list[list[Any]] = []  # [cmd, future, caller still waiting]
        self.plans: list[Plan] = []
        self.replies: list[dict[str, Any]] = []
        self.overlaps: list[str] = []
        #: The most runs any node held beyond its slots after a commit.
        self.over = 0

    def read(self, fn: Any) -> Any:
        return fn(self.st)

    #: Commands waiting in the Raft queue and the slowest follower's lag: admission
    #: control's signals (none here).
    pending = 0

    def follower_lag(self) -> int:
        return 0

    def take_tick_gap(self) -> float:
        return 0.0

    def connected_peers(self) -> dict[str, bool]:
        return {}

    def contact_ages(self) -> dict[str, float]:
        return {}

    def submit(self, cmd: Any) -> concurrent.futures.Future[Any]:
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        if isinstance(cmd, Plan):
            waiting = [c for c, _, w in self.queue if w and isinstance(c, Plan)]
            jobs, runs = _touches(cmd)
            for other in waiting:
                o_jobs, o_runs = _touches(other)
                if jobs & o_jobs or runs & o_runs:
                    self.overlaps.append(f"{sorted(jobs & o_jobs)} {sorted(runs & o_runs)}")
            self.plans.append(cmd)
        self.queue.append([cmd, fut, True])
        return fut

    def commit(self) -> None:
        cmd, fut, waiting = self.queue.pop(0)
        reply = self.st.apply_map(cmd, 1)
        self.st.take_effects()
        for node, rec in self.st.nodes.items():
            self.over = max(self.over, len(self.st.by_node.get(node, ())) - rec.slots)
        if isinstance(cmd, Plan):
            self.replies.append(reply)
        if waiting:
            fut.set_result(reply)

    def fail(self) -> None:
        _, fut, waiting = self.queue.pop(0)
        if waiting:
            fut.set_exception(NotReady("not committed: LEADER_CHANGED"))

    def time_out(self) -> None:
        for entry in self.queue:
            if entry[2]:
                entry[2] = False
                entry[1].set_exception(TimeoutError())
                return


def _touches(cmd: Plan) -> tuple[set[str], set[str]]:
    jobs = {f.job for f in cmd.fires} | {n.job for n in cmd.next} | set(cmd.versions)
    runs = {p.run_id for p in cmd.place} | {d.run_id for d in cmd.drop}
    return jobs, runs


def _runs_in(cmd: Plan) -> int:
    return sum(1 for f in cmd.fires if isinstance(f, RunFire)) + \
        sum(1 for p in cmd.place if isinstance(p, Place))


class Harness:
    def __init__(self, st: ClusterState) -> None:
        self.clock = FakeClock(wall_ms=T0)
        self.st = st
        self.raft = FakeRaft(st)
        cfg: Any = SimpleNamespace(timing=SimpleNamespace(lookahead_ms=LOOKAHEAD))
        self.loop = LeaderLoop(
            node_id="n1", raft=self.raft, raft_to_id=AddressBook(), metrics=None,  # type: ignore[arg-type]
            boot_ms=T0 - 60 * S, missing_feature=lambda _feature: [], cfg=cfg,
            clock=self.clock)
        self.loop.active, self.loop.term = True, 1
        self.loop.since_ms = T0 - 60 * S

    async def plan(self) -> bool:
        """One ``_plan_once``; while it waits for the oldest plan, commit in Raft order."""
        task = asyncio.ensure_future(self.loop._plan_once())
        while True:
            for _ in range(6):
                await asyncio.sleep(0)
            if task.done():
                return task.result()
            assert self.raft.queue, "the leader waits for a plan nobody holds"
            self.raft.commit()

    async def settle(self) -> None:
        for _ in range(6):
            await asyncio.sleep(0)

    def run_all(self) -> None:
        """Every node starts and finishes the runs assigned to it."""
        at = self.clock.now_ms()
        for node in sorted(self.st.nodes):
            mine = [r for r in self.st.runs.values() if r.node == node and r.state == "assigned"]
            if not mine:
                continue
            ok(self.st, {"op": "start", "at": at, "node": node,
                         "items": [[r.run_id, r.fence] for r in mine]})
            ok(self.st, {"op": "finish", "at": at, "node": node,
                         "items": [[r.run_id, r.fence, "succeeded", 0, "", ""] for r in mine]})
        self.st.take_effects()

    async def drain(self) -> None:
        """Plan (several in flight, as the loop does) until nothing is due at this
        instant, committing whenever the leader waits, and end the runs."""
        for _ in range(1000):
            if await self.plan():
                continue
            if self.raft.queue:
                while self.raft.queue:
                    self.raft.commit()
                await self.settle()
                continue
            self.run_all()
            if not await self.plan() and not self.raft.queue:
                return
        raise AssertionError("the leader never ran out of work")


def cluster(jobs: list[tuple[str, dict[str, Any]]], slots: int) -> ClusterState:
    st = ClusterState(history_limit=100_000)
    ok(st, {"op": "leader", "at": T0 - 60 * S, "node": "n1", "term": 1})
    for n in ("n1", "n2", "n3"):
        ok(st, {"op": "heartbeat", "at": T0 - 60 * S, "node": n, "boot": 1, "slots": slots,
                "queue": 0, "tags": [], "api": ""})
    for k in range(0, len(jobs), 25):
        ok(st, {"op": "put_jobs", "at": T0 - 30 * S, "specs": [
            {"id": j, "command": ["true"], "schedule": sched, "overlap": "allow"}
            for j, sched in jobs[k:k + 25]]})
    st.take_effects()
    return st


def accounted(st: ClusterState, job: str) -> Counter[int]:
    """Fire times of ``job`` with a run (active or ended) or a missed/skipped record."""
    out: Counter[int] = Counter()
    sched = st.jobs[job].spec.schedule
    for rec in list(st.history.get(job, ())) + [r for r in st.runs.values()
                                                 if r.job_id == job]:
        t: int | None = rec.scheduled_ms
        while t is not None and t <= (rec.until_ms or rec.scheduled_ms):
            out[t] += 1
            t = next_fire(sched, t)
    return out


def check_all_accounted(st: ClusterState, until_ms: int) -> None:
    for job, rec in st.jobs.items():
        got = accounted(st, job)
        want = fire_times(rec.spec.schedule, T0 - 30 * S, until_ms, 100_000)
        assert [t for t, n in got.items() if n > 1] == [], job
        assert set(want) <= set(got), (job, sorted(set(want) - set(got))[:5])
        assert all(t <= until_ms + LOOKAHEAD for t in got), job


def test_a_minute_of_thousands_of_jobs_is_many_bounded_plans_several_in_flight(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """W5's shape: 1,500 jobs fall due at one instant. Each plan reads and assigns at
    most the bounds, MAX_PLANS_IN_FLIGHT go out at once without sharing a job, none is refused,
    and every job is planned once."""
    jobs = [(f"j{i:04d}", {"cron": "* * * * *", "tz": "UTC"}) for i in range(1500)]
    h = Harness(cluster(jobs, slots=1024))
    h.clock.step_wall(T0 - LOOKAHEAD - h.clock.now_ms())  # the first fire is T0

    async def main() -> None:
        # Several plans go out before the first is answered.
        for _ in range(leaderloop.MAX_PLANS_IN_FLIGHT):
            assert await h.plan()
        assert len(h.raft.queue) == leaderloop.MAX_PLANS_IN_FLIGHT
        assert not any(fut.done() for _, fut, _ in h.raft.queue)
        await h.drain()

    asyncio.run(main())
    raft = h.raft
    assert raft.overlaps == []
    assert max(_runs_in(p) for p in raft.plans) <= core_leader.MAX_RUNS_PER_PLAN
    assert max(len(p.versions) for p in raft.plans) <= core_leader.MAX_JOBS_PER_PLAN
    assert len(raft.plans) == -(-1500 // core_leader.MAX_JOBS_PER_PLAN)
    assert [r["rejected"] for r in raft.replies if r["rejected"]] == []
    planned = Counter(f.job for p in raft.plans for f in p.fires if isinstance(f, RunFire))
    assert planned == Counter({j: 1 for j, _ in jobs})
    check_all_accounted(h.st, h.clock.now_ms())


def test_a_failed_plan_stays_left_out_until_a_later_command_commits(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A plan whose commit failed may still commit (a timeout) or not (a lost
    leadership): its jobs are planned again only once a command submitted after it has
    committed (Raft applies in order, so by then its fate is known), and nothing is
    planned twice either way."""
    _bound_plans(monkeypatch, 10)
    jobs = [(f"j{i:02d}", {"every": "10s"}) for i in range(40)]
    h = Harness(cluster(jobs, slots=100))
    h.clock.step_wall(T0 + 10 * S - LOOKAHEAD - h.clock.now_ms())

    async def main() -> None:
        assert await h.plan() and await h.plan()
        first, second = (set(p.versions) for p in h.raft.plans)
        h.raft.fail()  # the first plan is gone
        h.raft.time_out()  # the second's caller gives up; it stays in the log
        await h.settle()
        assert await h.plan()
        assert not set(h.raft.plans[2].versions) & (first | second)
        h.raft.commit()  # the second commits after all
        h.raft.commit()  # and the third: both are settled now
        await h.settle()
        assert await h.plan()
        assert first <= set(h.raft.plans[3].versions)  # the lost plan's jobs, oldest
        assert not second & set(h.raft.plans[3].versions)
        await h.drain()

    asyncio.run(main())
    assert h.raft.overlaps == []
    assert [r["rejected"] for r in h.raft.replies if r["rejected"]] == []
    check_all_accounted(h.st, h.clock.now_ms())


def test_a_failed_plan_with_nothing_after_it_is_settled_by_a_read_barrier(
        monkeypatch: pytest.MonkeyPatch) -> None:
    jobs = [(f"j{i}", {"every": "10s"}) for i in range(5)]
    h = Harness(cluster(jobs, slots=100))
    h.clock.step_wall(T0 + 10 * S - LOOKAHEAD - h.clock.now_ms())

    async def main() -> None:
        assert await h.plan()
        h.raft.time_out()
        await h.settle()
        assert await h.plan()  # nothing else to plan: a barrier, committed by h.plan
        assert [type(c).__name__ for c, _, _ in h.raft.queue] == []
        assert h.loop.book.doubtful == []
        # The timed-out plan committed before the barrier: its jobs are not due again.
        assert not await h.plan()
        assert len(h.raft.plans) == 1

    asyncio.run(main())
    check_all_accounted(h.st, h.clock.now_ms())


ACTIONS = hst.lists(hst.one_of(
    hst.just(("plan", 0)), hst.just(("commit", 0)), hst.just(("fail", 0)),
    hst.just(("time_out", 0)), hst.just(("run", 0)),
    hst.tuples(hst.just("tick"), hst.integers(1, 3000))), min_size=1, max_size=60)


@settings(max_examples=examples(100), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(n_jobs=hst.integers(1, 40), slots=hst.integers(1, 8), cap=hst.integers(1, 6),
       flying=hst.integers(1, 4), everies=hst.lists(hst.sampled_from(["1s", "2s", "5s"]),
                                                    min_size=1, max_size=3),
       actions=ACTIONS)
def test_pipelined_bounded_plans_never_plan_a_fire_twice_or_lose_one(
        monkeypatch: pytest.MonkeyPatch, n_jobs: int, slots: int, cap: int, flying: int,
        everies: list[str], actions: list[tuple[str, int]]) -> None:
    """Property: whatever the interleaving of plans, commits, lost plans, timed-out
    plans that commit later, runs ending and time passing (runs waiting for a slot,
    placed later, shed past their grace), every plan stays within the bounds, no job or
    pending run is in two plans in flight, no item of a plan is refused (none is planned
    from a copy that misses a plan which may still commit), no node gets more runs than
    its slots (the plans in flight count in its load), and in the end every fire time
    up to now has exactly one run or missed record."""
    _bound_plans(monkeypatch, cap)
    monkeypatch.setattr(leaderloop, "MAX_PLANS_IN_FLIGHT", flying)
    jobs = [(f"j{i:02d}", {"every": everies[i % len(everies)]}) for i in range(n_jobs)]
    h = Harness(cluster(jobs, slots=slots))

    async def main() -> None:
        for act, arg in actions:
            if act == "plan":
                await h.plan()
            elif act == "tick":
                h.clock.advance(arg / 1000)
            elif act == "run":
                h.run_all()
            elif h.raft.queue:
                getattr(h.raft, act)()
                await h.settle()
        await h.drain()

    asyncio.run(main())
    raft = h.raft
    assert raft.overlaps == []
    assert all(_runs_in(p) <= cap and len(p.versions) <= cap for p in raft.plans)
    # A plan the leader gave up on stays left out (and counted) until it is settled.
    assert [r["rejected"] for r in raft.replies if r["rejected"]] == []
    assert raft.over <= 0, "a node got more runs than slots: plans in flight uncounted"
    check_all_accounted(h.st, h.clock.now_ms())


def test_over_the_admitted_rate_jobs_are_reached_late_and_every_fire_time_is_accounted(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 26: 300 every-second jobs offered to a leader admitting 100 runs/s (growth
    off). It creates no more runs than the rate allows; the jobs it reaches late fold
    their older fire times into one ``coalesced`` record each; once it has caught up
    (rate lifted), every fire time has exactly one outcome."""
    from raftsched.node.leader import admission

    monkeypatch.setattr(admission, "SLOW_START", 1.0)
    monkeypatch.setattr(admission, "INCREASE", 0.0)
    jobs = [(f"j{i:03d}", {"every": "1s"}) for i in range(300)]
    h = Harness(cluster(jobs, slots=1000))
    h.clock.step_wall(T0 - LOOKAHEAD - h.clock.now_ms())
    h.loop.admission = admission.Admission(h.clock.monotonic(), start_rate=100.0)
    created: list[int] = []

    async def second() -> None:
        before = len(h.raft.plans)
        for _ in range(200):
            if not await h.plan():
                break
        while h.raft.queue:
            h.raft.commit()
        await h.settle()
        h.run_all()
        created.append(sum(_runs_in(p) for p in h.raft.plans[before:]))

    async def main() -> None:
        for _ in range(10):
            await second()
            h.clock.advance(1.0)
        h.loop.admission = admission.Admission(h.clock.monotonic(), start_rate=1e6)
        await h.drain()

    asyncio.run(main())
    # 100 runs/s, plus the first bucket of one second's worth.
    assert sum(created[:10]) <= 100 * 10 + 100, created
    assert all(n <= 200 for n in created[:10]), created
    st = h.st
    coalesced = [r for recs in st.history.values() for r in recs
                 if r.state == "missed" and r.reason == "coalesced"]
    assert coalesced, "late jobs fold their older fire times into one record"
    check_all_accounted(st, h.clock.now_ms())
