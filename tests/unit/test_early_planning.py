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
def test_the_due_count_is_the_unplanned_unpaused_jobs_due_by_then(data: Any) -> None:
    """The heap walk counts what a scan of every job counts, with stale entries (jobs
    put again with a later schedule), paused jobs and jobs parked by plans in flight."""
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
    for i in data.draw(hst.sets(hst.integers(0, n - 1), max_size=3)):
        ok(st, {"op": "pause", "at": T0 + S, "job": f"j{i}"})
    until = T0 + data.draw(hst.integers(0, 40)) * S
    # A plan's read parks the entries of the jobs it reads (and of those it skips):
    # they are in flight, not left to plan.
    read = data.draw(hst.integers(0, 5))
    skip = data.draw(hst.sets(hst.sampled_from(sorted(st.jobs)), max_size=5))
    st.due_jobs(until, read, skip=skip)
    want = sum(1 for j, r in st.jobs.items()
               if r.next_ms is not None and r.next_ms <= until and not r.spec.paused
               and j not in st.due_parked)
    assert st.due_count(until, 10 ** 6) == want
    # A small cap: never more than it (stale entries may end the walk sooner).
    assert st.due_count(until, 3) <= min(want, 3)


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
        assert loop._idle_delay() == pytest.approx(0.1) and loop.early_ms == 0
        h.clock.step_wall(100)
        # Its lead reached: planning begins now, and the plans reach the instant.
        assert loop._idle_delay() == 0.0 and loop.early_ms == T0
        await h.drain()
        assert _planned_at(h) == {T0: big}
        # The small instant 30 s on: planned at its lookahead, as before.
        at = T0 + 30 * S
        h.clock.advance((at - 2 * S - h.clock.now_ms()) / 1000)
        assert not await h.plan()
        h.clock.advance((2 * S - LOOKAHEAD - 100) / 1000)
        assert not await h.plan()
        assert loop._idle_delay() == pytest.approx(0.1) and loop.early_ms == T0
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


def _assigned_ahead(plan: list[tuple[int, int]]) -> tuple[ClusterState, list[int]]:
    """A state where leader n1 assigned itself run i of hourly job j<i> (its instant
    ``plan[i][0]`` seconds after the hour) ``plan[i][1]`` ms before that instant:
    (state, each run's fire time)."""
    st = ClusterState()
    ok(st, {"op": "leader", "at": T0, "node": "n1", "term": 1})
    ok(st, {"op": "heartbeat", "at": T0, "node": "n1", "boot": 1, "slots": 10, "queue": 0,
            "tags": [], "api": ""})
    ok(st, {"op": "put_jobs", "at": T0 - 1, "specs": [
        {"id": f"j{i}", "schedule": {"every": "1h", "offset": f"{sec}s"}, "command": ["true"]}
        for i, (sec, _) in enumerate(plan)]})
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


def test_a_start_committed_a_long_lead_early_waits_for_its_instant(monkeypatch) -> None:
    """The start timer of a run started 1.5 s ahead is not mistaken for a wall clock
    stepped back (which begins the run at once): it waits for the instant."""
    begun: list[str] = []

    async def main() -> None:
        at = 1_000_000_000
        clock = FakeClock(at - 1_500)
        pool = WorkerPool(node_id="n1", raft=ApplyingRaft(ClusterState()), slots=4,  # type: ignore[arg-type]
                          output_tail_bytes=100, allowed_call_prefixes=None, base_env={},
                          prestart_ms=200, max_prestart_ms=1_600, clock=clock)
        monkeypatch.setattr(pool, "_held_started", lambda group: frozenset())
        monkeypatch.setattr(pool, "_begin", lambda loc, *_, **__: begun.append(loc))
        pool._at[at] = ["early"]  # type: ignore[list-item]
        pool._fire(at)
        assert begun == [] and at in pool._at  # held for its instant
        clock.step_wall(1_500)
        pool._fire(at)
        assert begun == ["early"]

    asyncio.run(main())
