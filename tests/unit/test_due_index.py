"""The leader's due index (``ClusterState.due_jobs`` / ``next_due_ms``): whatever the
sequence of fire-time changes and of plans in flight (``skip``), it answers what a
scan of every job would — the oldest due jobs not skipped, and the earliest fire time —
though it parks skipped jobs' entries beside its heap instead of re-pushing them."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as hs

from raftsched.core.machine import ClusterState
from tests.support.stateutil import ok

T0 = 20_000 * 86_400 * 1000
JOBS = [f"j{i}" for i in range(8)]


def _state() -> ClusterState:
    st = ClusterState()
    for j in JOBS:
        ok(st, {"op": "put_job", "at": T0, "spec": {"id": j, "schedule": {"every": "10s"},
                                                    "command": ["true"]}})
    return st


def _scan(st: ClusterState, until: int, limit: int, skip: frozenset[str]) -> list[str]:
    due = sorted((r.next_ms, j) for j, r in st.jobs.items()
                 if r.next_ms is not None and r.next_ms <= until and j not in skip)
    return [j for _, j in due[:limit]]


_ops = hs.lists(hs.one_of(
    hs.tuples(hs.just("next"), hs.sampled_from(JOBS), hs.integers(0, 20)),
    hs.tuples(hs.just("due"), hs.integers(0, 20), hs.integers(1, 5),
              hs.frozensets(hs.sampled_from(JOBS))),
    hs.tuples(hs.just("delete"), hs.sampled_from(JOBS)),
), max_size=60)


@settings(max_examples=300, deadline=None)
@given(_ops)
def test_the_due_index_answers_what_a_scan_of_the_jobs_would(ops: list[tuple]) -> None:
    st = _state()
    for op in ops:
        if op[0] == "next":
            rec = st.jobs.get(op[1])
            if rec is not None:
                st.set_next(rec, T0 + op[2] * 1000)
        elif op[0] == "delete":
            if op[1] in st.jobs:
                ok(st, {"op": "delete_job", "at": T0, "job": op[1]})
        else:
            until, limit, skip = T0 + op[1] * 1000, op[2], op[3]
            got = [r.spec.id for r in st.due_jobs(until, limit, skip)]
            assert got == _scan(st, until, limit, skip)
        left = [r.next_ms for r in st.jobs.values() if r.next_ms is not None]
        assert st.next_due_ms() == (min(left) if left else None)
    # Nothing skipped any more: every job with a fire time is found again.
    every = [r.spec.id for r in st.due_jobs(T0 + 10**9, len(JOBS))]
    assert every == _scan(st, T0 + 10**9, len(JOBS), frozenset())


def test_a_job_held_by_a_plan_in_flight_is_parked_not_re_read() -> None:
    st = _state()
    heap_before = len(st.due)
    first = [r.spec.id for r in st.due_jobs(T0 + 10**6, 3)]
    # Read for a plan: parked at once (the plan's jobs are its ``skip`` from now on).
    assert set(st.due_parked) == set(first)
    assert len(st.due) == heap_before - 3
    second = [r.spec.id for r in st.due_jobs(T0 + 10**6, 3, frozenset(first))]
    assert not set(first) & set(second)
    # The three in flight stay parked: not popped and pushed again by the next plan.
    assert set(st.due_parked) == set(first) | set(second)
    assert len(st.due) == heap_before - 6
    # Both plans gave up: their jobs are due again, oldest first.
    assert [r.spec.id for r in st.due_jobs(T0 + 10**6, 6)] == first + second
