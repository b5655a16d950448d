"""The worker looks at the claims the applies' effects name (raftsched/node/worker/
claimsync.py), and finds exactly what a look at every claim finds.

The property test drives one state through random claim changes (runs made, assigned
here or elsewhere, released, cancelled, started, finished, a restore) and two pools of
node n1 beside it: one looks at every claim each step (as before), the other at the
runs its effects named. After every change both must know the same runs, with the
same fences, and forget the same ones."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st_

from raftsched.core import claims, runs
from raftsched.core.commands import Start, StartItem
from raftsched.core.effects import (
    ClaimsReleased,
    Restored,
    RunAssigned,
    RunEnded,
    RunStarted,
)
from raftsched.core.items import ReleaseScope
from raftsched.core.machine import ClusterState
from raftsched.core.model import RunState
from raftsched.node.worker import claimsync
from raftsched.node.worker.claimsync import ClaimSync
from raftsched.node.worker.localrun import Phase
from raftsched.node.worker.worker import WorkerPool
from tests.support.stateutil import ok

pytestmark = pytest.mark.timeout(120)

S = 1000
T0 = 20_000 * 86_400 * S
JOBS = ("a", "b", "c")


# ------------------------------------------------------------ ClaimSync alone

def test_without_the_node_feeding_it_every_look_is_a_full_one() -> None:
    sync = ClaimSync("n1")
    sync.note(RunAssigned("a@1", "n1", 1), {})
    assert [sync.take(t) for t in (0.0, 0.1, 0.2)] == [None, None, None]


def test_it_names_what_concerns_this_node_and_no_more() -> None:
    sync = ClaimSync("n1", incremental=True)
    assert sync.take(0.0) is None  # its first look is a full one
    held = {"h@1": None, "k@1": None, "f@1": None}
    sync.note(RunAssigned("a@1", "n1", 5), held)  # assigned here
    sync.note(RunAssigned("b@1", "n2", 6), held)  # elsewhere: not ours
    sync.note(RunAssigned("h@1", "n2", 7), held)  # one we hold, now elsewhere
    sync.note(RunEnded("c@1", "succeeded", "n2", ""), held)  # not held here
    sync.note(RunEnded("k@1", "cancelled", "n1", ""), held)
    sync.note(ClaimsReleased("n1", ["d@1", "e@1"], "lost"), held)
    sync.note(ClaimsReleased("n2", ["f@1", "g@1"], "lost"), held)
    sync.note(RunStarted("s@1", "n1", 8), held)  # not held here (another node's)
    sync.note(RunStarted("w@1", "n1", 9), {**held, "w@1": None})  # one it waits on
    assert sync.take(0.1) == {"a@1", "h@1", "k@1", "d@1", "e@1", "f@1", "w@1"}
    assert sync.take(0.2) == set()
    assert (sync.full_looks, sync.partial_looks) == (1, 2)


def test_a_restore_an_overflow_and_the_clock_each_bring_a_full_look() -> None:
    sync = ClaimSync("n1", incremental=True)
    assert sync.take(0.0) is None
    sync.note(Restored(), {})
    assert sync.take(0.1) is None
    for i in range(claimsync.MAX_TOUCHED + 1):
        sync.note(RunAssigned(f"a@{i}", "n1", i), {})
    assert sync.take(0.2) is None
    assert sync.take(0.3) == set()
    assert sync.take(0.15 + claimsync.FULL_SCAN_S) == set()
    assert sync.take(0.2 + claimsync.FULL_SCAN_S) is None  # the safety net


def test_a_failed_read_loses_nothing_it_was_to_look_at() -> None:
    pool = _pool(incremental=True)
    state = _state()
    pool.raft = _Raft(state)  # type: ignore[assignment]
    pool._step()  # the first, full look
    rec = state.jobs["a"]
    run = runs.new_run(state, rec, T0 + S, T0)
    runs.assign(state, run, "n1", T0)
    _feed(pool, state)

    def boom(fn: Any) -> Any:
        raise RuntimeError("the replica went away")

    pool.raft.read = boom  # type: ignore[method-assign]
    with pytest.raises(RuntimeError):
        pool._step()
    assert pool.claims.take(0.5) is None  # the next look covers everything


# ------------------------------------------------------------ the two pools agree

class _Raft:
    def __init__(self, st: ClusterState) -> None:
        self.st = st

    def ready(self) -> bool:
        return True

    def read(self, fn: Any) -> Any:
        return fn(self.st)


def _pool(*, incremental: bool) -> WorkerPool:
    pool = WorkerPool(node_id="n1", raft=None, slots=2,  # type: ignore[arg-type]
                      output_tail_bytes=100, allowed_call_prefixes=None, base_env={})
    pool.claims.incremental = incremental
    return pool


def _state() -> ClusterState:
    state = ClusterState()
    ok(state, {"op": "leader", "at": T0, "node": "n1", "term": 1})
    for job in JOBS:
        ok(state, {"op": "put_job", "at": T0, "spec": {
            "id": job, "schedule": {"every": "1h"}, "command": ["true"],
            "overlap": "allow"}})
    state.take_effects()
    return state


def _feed(pool: WorkerPool, state: ClusterState) -> bool:
    """Hand the applies' effects to ``pool`` as the node does; whether one was a
    restore (its next look is a full one)."""
    restored = False
    for eff in state.take_effects():
        if type(eff) in claimsync.CLAIM_NEWS:
            pool.claims.note(eff, pool.local)
            restored = restored or isinstance(eff, Restored)
    return restored


def _look(pool: WorkerPool, state: ClusterState, mono: float) -> tuple[set[Any], set[str]]:
    """The step's look (worker._step), without starting anything."""
    pool._looking = pool.claims.take(mono)
    try:
        mine, moved = pool._sync_claims(state)
    finally:
        pool._looking = None
    for loc in mine:
        pool.local[loc.run_id] = loc
    return {(loc.run_id, loc.fence) for loc in mine}, {loc.run_id for loc in moved}


def _known(pool: WorkerPool) -> dict[str, tuple[int, Phase]]:
    return {r: (loc.fence, loc.phase) for r, loc in pool.local.items()}


OPS = st_.sampled_from(["new", "assign_me", "assign_other", "release_me", "release_other",
                        "cancel", "start", "start_stale", "finish", "restore"])


@settings(max_examples=150, deadline=None)
@given(steps=st_.lists(st_.tuples(OPS, st_.integers(0, 10_000)), min_size=1,
                       max_size=60))
def test_looking_at_the_named_runs_finds_what_looking_at_all_finds(
        steps: list[tuple[str, int]]) -> None:
    state = _state()
    full, inc = _pool(incremental=False), _pool(incremental=True)
    at = T0
    sched = T0
    mono = 0.0
    late = False  # a step looked before the effects of its change arrived
    restores = 0
    assert _look(full, state, mono) == _look(inc, state, mono)
    for op, pick in steps:
        at += 10
        active = sorted(state.table.runs.values(), key=lambda r: r.run_id)

        def one(*states: str, node: str | None = None, pick: int = pick,
                active: list[Any] = active) -> Any:
            found = [r for r in active if r.state in states
                     and (node is None or r.node == node)]
            return found[pick % len(found)] if found else None

        if op == "new":
            sched += S
            runs.new_run(state, state.jobs[JOBS[pick % len(JOBS)]], sched, at)
        elif op in ("assign_me", "assign_other"):
            run = one("pending")
            if run is not None:
                runs.assign(state, run, "n1" if op == "assign_me" else "n2", at)
        elif op in ("release_me", "release_other"):
            node = "n1" if op == "release_me" else "n2"
            claims.release_node(state, node, at, ReleaseScope.assigned, "lost")
        elif op == "cancel":
            run = one("pending", "assigned", "started")
            if run is not None:
                runs.end_run(state, run, at, RunState.cancelled, "cancelled")
        elif op in ("start", "start_stale"):
            # This node starts a run it waits on (its own start commit); or an earlier
            # process of this node's start of it commits now (the worker forgets it).
            waiting = sorted(
                r for r, loc in full.local.items()
                if loc.phase is Phase.WAITING and (other := inc.local.get(r)) is not None
                and other.phase is Phase.WAITING and other.fence == loc.fence
                and (cur := state.table.runs.get(r)) is not None
                and cur.state == "assigned" and cur.node == "n1" and cur.fence == loc.fence)
            if waiting:
                run_id = waiting[pick % len(waiting)]
                fence = full.local[run_id].fence
                reply = state.apply(Start(node="n1", items=(StartItem(run_id, fence),),
                                          at=at))
                assert reply["results"][0][0], reply  # accepted
                if op == "start":
                    for pool in (full, inc):
                        pool.local[run_id].phase = Phase.STARTED
        elif op == "finish":
            run = one("started", node="n1")
            if run is not None:
                runs.end_run(state, run, at, RunState.succeeded, "exit 0")
                for pool in (full, inc):
                    pool.local.pop(run.run_id, None)
        elif op == "restore":
            state.effects.append(Restored())
        mono += 0.01  # well inside FULL_SCAN_S: the named runs alone, but after a restore
        if pick % 4 == 0:
            # The step reads before this apply's effects reach the node (they stay
            # queued, maybe past more changes): what it misses, a later step finds.
            late = True
            _look(full, state, mono)
            _look(inc, state, mono)
            continue
        restores += _feed(inc, state)
        seen_full, seen_inc = _look(full, state, mono), _look(inc, state, mono)
        if not late:
            assert seen_inc == seen_full, (op, seen_inc, seen_full)
        assert _known(inc) == _known(full), op
        late = False
    # A full look first and after each restore; every other one looked at the named runs.
    assert inc.claims.full_looks == 1 + restores
    assert full.claims.partial_looks == 0


# ------------------------------------------------------------ the step's one pass

def test_a_step_wakes_for_a_far_run_no_later_than_its_longest_window() -> None:
    """A waiting run beyond the longest pre-start window is not sorted or weighed, only
    looked at again in time: at its start less that window, it is weighed exactly."""
    from raftsched.node.observe.clock import FakeClock

    state = _state()
    clock = FakeClock(T0)
    pool = WorkerPool(node_id="n1", raft=_Raft(state), slots=2,  # type: ignore[arg-type]
                      output_tail_bytes=100, allowed_call_prefixes=None, base_env={},
                      prestart_ms=200, max_prestart_ms=1000, clock=clock)
    pool.claims.incremental = True
    run = runs.new_run(state, state.jobs["a"], T0 + 10 * S, T0)
    runs.assign(state, run, "n1", T0)  # assigned 10 s ahead: a window of up to 1 s
    _feed(pool, state)
    delay = pool._step()
    assert pool.local[run.run_id].phase is Phase.WAITING
    assert delay == pytest.approx(0.5)  # the safety net comes first
    clock.advance(8.6)
    _feed(pool, state)
    delay = pool._step()  # 1.4 s before it: beyond 1 s, due back at 0.4 s
    assert delay == pytest.approx(0.4)
    assert pool.local[run.run_id].phase is Phase.WAITING
    clock.advance(0.4)

    async def last_step() -> None:
        pool._step()  # 1 s before it: its window (4/5 of 10 s ahead, at most 1 s)
        assert pool.local[run.run_id].phase is Phase.STARTING
        for task in list(pool._tasks):  # its start's commit (no replica here)
            task.cancel()

    asyncio.run(last_step())
