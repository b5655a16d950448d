"""Issue 31: an instant of many fire times is planned, and its starts committed, ahead
in proportion to its size; a small instant as before (the lookahead).

The leader part runs the real LeaderLoop on an in-process state and a fake clock (the
harness of test_leader_pipeline); the worker part the real WorkerPool on a replica that
applies each start to the state. No process, no sleep.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as hst

from raftsched.core import leader as core_leader
from raftsched.core.commands import RunFire, Start
from raftsched.core.leader import lead_ms, max_lead_ms
from raftsched.core.machine import ClusterState
from raftsched.core.trigger import jitter_ms
from raftsched.node.leader.early import EarlyPlanning
from raftsched.node.observe.clock import FakeClock
from raftsched.node.worker.worker import WorkerPool
from tests.support.stateutil import ok
from tests.unit.test_leader_pipeline import LOOKAHEAD, T0, Harness, cluster
from tests.unit.test_worker_batches import ApplyingRaft

pytestmark = pytest.mark.timeout(120)

S = 1000


@given(look=hst.integers(0, 60_000), runs=hst.integers(0, 10 ** 7),
       more=hst.integers(0, 10 ** 6))
def test_the_lead_grows_with_the_instant_from_the_lookahead_to_its_cap(
        look: int, runs: int, more: int) -> None:
    lead = lead_ms(look, runs)
    assert look <= lead <= max_lead_ms(look) == look * core_leader.MAX_EARLY_LOOKAHEADS
    assert lead_ms(look, runs + more) >= lead  # a bigger instant never starts later
    if runs <= look * core_leader.EARLY_RUNS_PER_MS:
        assert lead == look  # a small instant: as before
    elif runs // core_leader.EARLY_RUNS_PER_MS <= max_lead_ms(look):
        assert lead == runs // core_leader.EARLY_RUNS_PER_MS


@given(data=hst.data())
def test_the_due_counts_are_the_unplanned_unpaused_jobs_due_by_then(data: Any) -> None:
    """The heap walk counts what a scan of every job counts, fire time by fire time,
    with stale entries (jobs put again with another schedule), copies of valid ones
    (put again with the same schedule), paused jobs and jobs parked by plans in flight."""
    n = data.draw(hst.integers(1, 60))
    st = ClusterState()
    periods = data.draw(hst.lists(hst.sampled_from([1, 2, 5, 10, 60]), min_size=n,
                                  max_size=n))
    ok(st, {"op": "put_jobs", "at": T0, "specs": [
        {"id": f"j{i}", "schedule": {"every": f"{p}s"}, "command": ["true"]}
        for i, p in enumerate(periods)]})
    for i in data.draw(hst.sets(hst.integers(0, n - 1), max_size=n)):
        # A re-put moves the job's next fire time: its old heap entry goes stale.
        ok(st, {"op": "put_job", "at": T0 + S, "spec": {
            "id": f"j{i}", "schedule": {"every": "30s"}, "command": ["true"]}})
    for i in data.draw(hst.sets(hst.integers(0, n - 1), max_size=n)):
        # One with the same schedule (a new command) pushes a second valid entry.
        ok(st, {"op": "put_job", "at": T0 + S, "spec": {
            "id": f"j{i}", "schedule": st.jobs[f"j{i}"].spec.schedule.to_spec(),
            "command": ["false"]}})
    for i in data.draw(hst.sets(hst.integers(0, n - 1), max_size=3)):
        ok(st, {"op": "pause", "at": T0 + S, "job": f"j{i}"})
    until = T0 + data.draw(hst.integers(0, 40)) * S
    # A plan's read parks the entries of the jobs it reads (and of those it skips):
    # they are in flight, not left to plan.
    read = data.draw(hst.integers(0, 5))
    skip = data.draw(hst.sets(hst.sampled_from(sorted(st.jobs)), max_size=5))
    st.due_jobs(until, read, skip=skip)
    want: dict[int, int] = {}
    for j, r in st.jobs.items():
        if r.next_ms is not None and r.next_ms <= until and not r.spec.paused \
                and j not in st.due_parked:
            want[r.next_ms] = want.get(r.next_ms, 0) + 1
    assert st.due_counts(until, 10 ** 6) == want
    # A small cap: never more than it (stale entries may end the walk sooner).
    small = st.due_counts(until, 3)
    assert sum(small.values()) <= min(sum(want.values()), 3)
    assert all(n <= want[at] for at, n in small.items())


def _planned_at(h: Harness) -> dict[int, int]:
    """Fire time -> how many of its runs the plans so far created."""
    out: dict[int, int] = {}
    for p in h.raft.plans:
        for f in p.fires:
            if isinstance(f, RunFire):
                out[f.scheduled_ms] = out.get(f.scheduled_ms, 0) + 1
    return out


def test_a_big_instant_is_planned_early_in_proportion_to_its_size_a_small_one_as_before(
        ) -> None:
    big, small = 2_000, 100  # 2,000 runs: 500 ms ahead; 100 runs: the lookahead
    jobs = [(f"b{i:04d}", {"cron": "* * * * *", "tz": "UTC"}) for i in range(big)]
    jobs += [(f"s{i:03d}", {"cron": "30 * * * * *", "tz": "UTC"}) for i in range(small)]
    h = Harness(cluster(jobs, slots=10_000))
    loop = h.loop
    big_lead = big // core_leader.EARLY_RUNS_PER_MS
    assert LOOKAHEAD < big_lead < max_lead_ms(LOOKAHEAD)
    h.clock.step_wall(T0 - 2 * S - h.clock.now_ms())

    async def main() -> None:
        # Before the big instant's lead: nothing to plan; the leader sleeps until the
        # lead (100 ms on), not until the lookahead (350 ms on).
        assert not await h.plan()
        h.clock.step_wall(2 * S - big_lead - 100)
        assert not await h.plan()
        assert loop._idle_delay() == pytest.approx(0.1) and loop.early.early_ms == 0
        h.clock.step_wall(100)
        # Its lead reached: planning begins now, and the plans reach the instant.
        assert loop._idle_delay() == 0.0 and loop.early.early_ms == T0
        await h.drain()
        assert _planned_at(h) == {T0: big}
        # The small instant 30 s on: planned at its lookahead, as before.
        at = T0 + 30 * S
        h.clock.advance((at - 2 * S - h.clock.now_ms()) / 1000)
        assert not await h.plan()
        h.clock.advance((2 * S - LOOKAHEAD - 100) / 1000)
        assert not await h.plan()
        assert loop._idle_delay() == pytest.approx(0.1) and loop.early.early_ms == T0
        h.clock.advance(0.099)
        assert not await h.plan()
        h.clock.advance(0.001)
        await h.drain()
        assert _planned_at(h) == {T0: big, at: small}

    asyncio.run(main())
    # Assigned when their lead began, 500 ms ahead: not later, not sooner.
    assigned = {r.assigned_ms for rs in h.st.history.values() for r in rs
                if r.scheduled_ms == T0}
    assert assigned == {T0 - big_lead}


def test_a_big_instant_begins_at_its_lead_though_a_smaller_fire_time_comes_first() -> None:
    """A job firing 200 ms before the big instant is the next fire time when the big
    one's lead (500 ms) comes: the big instant's planning begins all the same (the
    coming instants are counted, not only the next)."""
    big = 2_000
    jobs = [(f"b{i:04d}", {"cron": "* * * * *", "tz": "UTC"}) for i in range(big)]
    jobs += [("tick", {"every": "1s", "offset": "800ms"})]  # ..., T0 - 200, T0 + 800
    h = Harness(cluster(jobs, slots=10_000))
    h.clock.step_wall(T0 - 700 - h.clock.now_ms())

    async def main() -> None:
        await h.drain()  # the tick of T0 - 1,200 (late, within its grace)
        h.clock.advance(0.2)  # T0 - 500: the big instant's lead
        assert h.st.next_due_ms() == T0 - 200
        assert h.loop._idle_delay() == 0.0 and h.loop.early.early_ms == T0
        await h.drain()
        h.clock.advance(0.1)  # (admission grants ~2,000 at once: the rest now)
        await h.drain()

    asyncio.run(main())
    assert _planned_at(h) == {T0 - 1_200: 1, T0 - 200: 1, T0: big}


def test_an_early_plan_never_decides_an_overlap_against_a_run_not_yet_started() -> None:
    """``overlap = replace``, every second, beside a big instant planned 500 ms early:
    its fire at the instant waits for the usual lookahead (its previous run, of a
    second before, has not even started when the early planning begins), and nothing
    of it is cancelled before it ran."""
    big = 2_000
    jobs = [(f"b{i:04d}", {"cron": "* * * * *", "tz": "UTC"}) for i in range(big)]
    h = Harness(cluster(jobs, slots=10_000))
    ok(h.st, {"op": "put_job", "at": T0 - 1_100, "spec": {
        "id": "r", "schedule": {"every": "1s"}, "command": ["true"], "overlap": "replace"}})
    h.st.take_effects()
    h.clock.step_wall(T0 - 1_000 - LOOKAHEAD - h.clock.now_ms())

    def r_fires() -> list[int]:
        return sorted(f.scheduled_ms for p in h.raft.plans for f in p.fires
                      if isinstance(f, RunFire) and f.job == "r")

    async def plan_all() -> None:
        """Plan and commit until nothing more is planned; nothing runs meanwhile."""
        for _ in range(1000):
            if await h.plan():
                continue
            if not h.raft.queue:
                return
            while h.raft.queue:
                h.raft.commit()
            await h.settle()

    async def main() -> None:
        await plan_all()  # r's fire of T0 - 1 s, at its lookahead (not run yet)
        assert r_fires() == [T0 - S]
        h.clock.advance((1_000 + LOOKAHEAD - 500) / 1000)  # T0 - 500: the big one's lead
        assert h.loop._idle_delay() == 0.0 and h.loop.early.early_ms == T0
        await plan_all()
        h.clock.advance(0.05)  # (admission grants ~2,000 at once: the rest now)
        await plan_all()
        assert _planned_at(h)[T0] == big  # every other job of the instant, early
        assert r_fires() == [T0 - S]  # held: its run of T0 - 1 s is only assigned
        assert h.st.runs[f"r@{T0 - S}"].state == "assigned"
        h.run_all()
        h.clock.advance((500 - LOOKAHEAD) / 1000)
        await h.drain()
        assert r_fires() == [T0 - S, T0]

    asyncio.run(main())
    dropped = [d for p in h.raft.plans for d in p.drop if d.run_id.startswith("r@")]
    assert dropped == []
    assert _planned_at(h)[T0] == big + 1


def test_an_early_horizon_never_reaches_past_the_longest_lead() -> None:
    early = EarlyPlanning(LOOKAHEAD)
    early.counted({T0: 10_000}, mono=1.0)
    assert early.begin(T0 - max_lead_ms(LOOKAHEAD) - 1) == (False, 1)
    assert early.begin(T0 - max_lead_ms(LOOKAHEAD)) == (True, None)
    assert early.horizon(T0 - 1_000) == T0
    # The wall clock stepped back 10 s: the plans reach no further than the longest lead.
    assert early.horizon(T0 - 10_000) == T0 - 10_000 + max_lead_ms(LOOKAHEAD)
    # A small instant needs no early start; a lookahead of 0 counts nothing.
    small = EarlyPlanning(LOOKAHEAD)
    small.counted({T0: 4 * LOOKAHEAD}, mono=1.0)
    assert small.begin(T0 - LOOKAHEAD - 1) == (False, None)
    assert EarlyPlanning(0).count_by(5.0, T0) is None


def _assigned_ahead(plan: list[tuple[int, int]], jitter: str = "0s"
                    ) -> tuple[ClusterState, list[int]]:
    """A state where leader n1 assigned itself run i of hourly job j<i> (its instant
    ``plan[i][0]`` seconds after the hour) ``plan[i][1]`` ms before that instant:
    (state, each run's fire time)."""
    st = ClusterState()
    ok(st, {"op": "leader", "at": T0, "node": "n1", "term": 1})
    ok(st, {"op": "heartbeat", "at": T0, "node": "n1", "boot": 1, "slots": 10, "queue": 0,
            "tags": [], "api": ""})
    ok(st, {"op": "put_jobs", "at": T0 - 1, "specs": [
        {"id": f"j{i}", "schedule": {"every": "1h", "offset": f"{sec}s"}, "command": ["true"],
         "jitter": jitter} for i, (sec, _) in enumerate(plan)]})
    fires = [st.jobs[f"j{i}"].next_ms for i in range(len(plan))]
    for i, (_, ahead) in enumerate(plan):
        ok(st, {"op": "plan", "at": fires[i] - ahead,
                "fires": [["run", f"j{i}", fires[i], "n1", False]]})
    return st, fires


def test_a_worker_commits_the_starts_of_an_instant_planned_early_as_early_in_proportion(
        ) -> None:
    """4/5 of how far ahead the instant's first run was assigned here: at 1,000 ms both
    runs of instant A start from 800 ms ahead (the one assigned only 250 ms ahead too);
    instant B, assigned at the lookahead, from 200 ms as before; instant C, assigned 5 s
    ahead, from 4/5 of the longest lead, no sooner."""
    st, fires = _assigned_ahead([(10, 1_000), (10, 250), (20, 250), (30, 5_000)])
    raft = ApplyingRaft(st)
    clock = FakeClock(fires[0] - 2_000)
    cap = max_lead_ms(LOOKAHEAD) * 4 // 5
    checks: list[tuple[str, bool]] = []

    async def main() -> None:
        pool = WorkerPool(node_id="n1", raft=raft, slots=10,  # type: ignore[arg-type]
                          output_tail_bytes=100, allowed_call_prefixes=None, base_env={},
                          prestart_ms=LOOKAHEAD * 4 // 5, max_prestart_ms=cap, clock=clock)
        pool._launch = lambda loc, spec: None  # type: ignore[method-assign]

        async def started_at(fire: int, ahead: int) -> set[str]:
            clock.step_wall(fire - ahead - clock.now_ms())
            sent = len(raft.sent)
            pool._step()
            for _ in range(10):
                await asyncio.sleep(0)
            return {i.run_id for c in raft.sent[sent:] if isinstance(c, Start)
                    for i in c.items}

        a, b, c = fires[0], fires[2], fires[3]
        ra = {f"j0@{a}", f"j1@{a}"}
        checks.append(("A not at 801", await started_at(a, 801) == set()))
        checks.append(("A both at 800", await started_at(a, 800) == ra))
        checks.append(("B not at 201", await started_at(b, 201) == set()))
        checks.append(("B at 200", await started_at(b, 200) == {f"j2@{b}"}))
        checks.append(("C not at cap+1", await started_at(c, cap + 1) == set()))
        checks.append(("C at cap", await started_at(c, cap) == {f"j3@{c}"}))

    asyncio.run(main())
    assert [name for name, good in checks if not good] == []


def test_a_jittered_run_of_a_small_instant_is_started_as_before() -> None:
    """Its window is its instant's (200 ms, assigned at the lookahead), counted back from
    its jittered start: the jitter does not widen it."""
    st, (fire,) = _assigned_ahead([(10, LOOKAHEAD)], jitter="5s")
    start = fire + jitter_ms("j0", fire, 5_000)
    assert start > fire + LOOKAHEAD  # this job's jitter (deterministic) is long enough
    raft = ApplyingRaft(st)
    clock = FakeClock(fire - 2_000)
    seen: list[set[str]] = []

    async def main() -> None:
        pool = WorkerPool(node_id="n1", raft=raft, slots=10,  # type: ignore[arg-type]
                          output_tail_bytes=100, allowed_call_prefixes=None, base_env={},
                          prestart_ms=LOOKAHEAD * 4 // 5,
                          max_prestart_ms=max_lead_ms(LOOKAHEAD) * 4 // 5, clock=clock)
        pool._launch = lambda loc, spec: None  # type: ignore[method-assign]
        for ahead in (201, 200):
            clock.step_wall(start - ahead - clock.now_ms())
            sent = len(raft.sent)
            pool._step()
            for _ in range(10):
                await asyncio.sleep(0)
            seen.append({i.run_id for c in raft.sent[sent:] if isinstance(c, Start)
                         for i in c.items})

    asyncio.run(main())
    assert seen == [set(), {f"j0@{fire}"}]
