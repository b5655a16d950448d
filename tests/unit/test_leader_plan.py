"""Tests for raftsched.leader.plan: placement, tags, limits, misses for want of a node,
pending-first, shedding, overload, idempotence and lookahead."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from raftsched.codec import encode_state
from raftsched.leader import Capacity, LeaderContext, place, plan
from raftsched.state import ClusterState
from tests.unit.stateutil import hist, ok

pytestmark = pytest.mark.timeout(60)

S = 1000
T0 = 20_000 * 86_400 * S  # a round epoch ms (midnight UTC), multiple of every schedule here


def put(st: ClusterState, job: str, at: int = T0 - 5 * S, **spec: Any) -> None:
    body: dict[str, Any] = {"id": job, "schedule": {"every": "10s"}, "command": ["true"]}
    body.update(spec)
    ok(st, {"op": "put_job", "at": at, "spec": body})


def hb(st: ClusterState, node: str, *, slots: int = 2, queue: int = 0,
       tags: tuple[str, ...] = (), at: int = T0 - 5 * S, boot: int = 1) -> None:
    ok(st, {"op": "heartbeat", "at": at, "node": node, "boot": boot, "slots": slots,
            "queue": queue, "tags": list(tags), "api": ""})


def caps(st: ClusterState, only: tuple[str, ...] | None = None) -> tuple[Capacity, ...]:
    """Capacities as the leader loop builds them."""
    return tuple(
        Capacity(node_id=n, tags=frozenset(r.tags), slots=r.slots, limit=r.slots + r.queue,
                 load=len(st.by_node.get(n, ())))
        for n, r in sorted(st.nodes.items()) if r.alive and (only is None or n in only))


def ctx(st: ClusterState, now: int, *, lookahead: int = 0, live: Any = None,
        term: int = 1, since: int = 0, boot: int = 0) -> LeaderContext:
    return LeaderContext(node_id="n1", term=term, now_ms=now, lookahead_ms=lookahead,
                         since_ms=since, boot_ms=boot,
                         live=caps(st) if live is None else live)


def runs_by_node(st: ClusterState) -> Counter[str]:
    return Counter(r.node for r in st.runs.values() if r.node is not None)


def fresh(nodes: int = 3, **hbkw: Any) -> ClusterState:
    st = ClusterState()
    ok(st, {"op": "leader", "at": T0 - 10 * S, "node": "n1", "term": 1})
    for i in range(1, nodes + 1):
        hb(st, f"n{i}", **hbkw)
    return st


# --------------------------------------------------------------------- placement

def test_place_prefers_least_loaded_and_rotates() -> None:
    live = [Capacity(node_id=n, tags=frozenset(), slots=2, limit=2) for n in "abc"]
    assert place(live, (), 0).node_id == "a"
    assert place(live, (), 1).node_id == "b"
    assert place(live, (), 5).node_id == "c"
    live[0].load = 1
    assert place(live, (), 0).node_id == "b"
    for c in live:
        c.load = 2
    assert place(live, (), 0) is None


def test_spreads_over_equal_nodes() -> None:
    st = fresh(3, slots=4)
    for i in range(9):
        put(st, f"j{i}")
    cmd = plan(st, ctx(st, T0))
    assert cmd is not None
    ok(st, cmd)
    assert len(st.runs) == 9
    assert runs_by_node(st) == Counter({"n1": 3, "n2": 3, "n3": 3})


def test_respects_tags() -> None:
    st = fresh(0)
    hb(st, "plain", slots=8)
    hb(st, "gpu1", slots=8, tags=("gpu", "ssd"))
    hb(st, "gpu2", slots=8, tags=("gpu",))
    put(st, "train", tags=["gpu", "ssd"])
    put(st, "any")
    for i in range(4):
        put(st, f"g{i}", tags=["gpu"])
    ok(st, plan(st, ctx(st, T0)))
    assert st.runs[f"train@{T0}"].node == "gpu1"
    for i in range(4):
        assert st.runs[f"g{i}@{T0}"].node in ("gpu1", "gpu2")
    assert st.runs[f"any@{T0}"].state == "assigned"


def test_respects_limit_slots_plus_queue() -> None:
    st = fresh(0)
    hb(st, "n1", slots=1, queue=1)
    for i in range(5):
        put(st, f"j{i}", schedule={"every": "10s"})
    ok(st, plan(st, ctx(st, T0)))
    assert len(st.by_node["n1"]) == 2
    assigned = [r for r in st.runs.values() if r.state == "assigned"]
    assert len(assigned) == 2
    # The other three jobs keep their mark: nothing recorded for them yet.
    blocked = [j for j, rec in st.jobs.items() if rec.hwm_ms < T0]
    assert len(blocked) == 3
    # Existing load counts against the limit too.
    cmd = plan(st, ctx(st, T0 + 100))
    assert cmd is None or not any(f[0] == "run" for f in cmd["fires"])


def test_no_node_with_tags_records_missed_after_grace() -> None:
    st = fresh(2)
    put(st, "gpu", tags=["gpu"], schedule={"every": "1h"}, misfire={"grace": "30s"})
    # Within the grace nothing is recorded: the mark stays and it retries.
    for now in (T0, T0 + 5 * S, T0 + 30 * S):
        cmd = plan(st, ctx(st, now))
        assert cmd is None or not cmd["fires"]
    assert st.jobs["gpu"].hwm_ms < T0
    # Past the grace the fire time is recorded missed/no_node, never assigned.
    cmd = plan(st, ctx(st, T0 + 31 * S))
    assert cmd["fires"] == [["miss", "gpu", T0, T0, 1, "missed", "no_node"]]
    ok(st, cmd)
    assert not st.runs
    records = hist(st, "gpu")
    assert [(h.state, h.reason, h.scheduled_ms) for h in records] == [("missed", "no_node", T0)]
    assert st.jobs["gpu"].hwm_ms == T0
    assert st.jobs["gpu"].next_ms == T0 + 3600 * S
    # A node with the tag appears: the next fire runs there.
    hb(st, "g", tags=("gpu",), at=T0 + 60 * S)
    ok(st, plan(st, ctx(st, T0 + 3600 * S)))
    assert st.runs[f"gpu@{T0 + 3600 * S}"].node == "g"


def test_no_live_node_at_all_records_no_node() -> None:
    st = fresh(0)
    put(st, "j", schedule={"every": "1h"}, misfire={"grace": "10s"})
    assert plan(st, ctx(st, T0 + 10 * S, live=())) is None
    ok(st, plan(st, ctx(st, T0 + 11 * S, live=())))
    records = hist(st, "j")
    assert [(h.state, h.reason) for h in records] == [("missed", "no_node")]
    assert records[0].scheduled_ms == T0


# --------------------------------------------------------------------- pending runs

def test_pending_runs_are_placed_before_due_jobs() -> None:
    st = fresh(0)
    hb(st, "a", slots=1)
    hb(st, "b", slots=1)
    put(st, "old", at=T0 - 20 * S)
    ok(st, plan(st, ctx(st, T0 - 10 * S)))
    old_run = f"old@{T0 - 10 * S}"
    first_node = st.runs[old_run].node
    fence = st.runs[old_run].fence
    ok(st, {"op": "release", "at": T0 - 5 * S, "node": first_node, "scope": "all",
            "reason": "gone"})
    assert st.runs[old_run].state == "pending"
    # Now one slot is left (the other node is lost) and a new job is due: the released
    # run goes first.
    put(st, "new")
    cmd = plan(st, ctx(st, T0))
    assert cmd["place"] and cmd["place"][0][0] == old_run
    ok(st, cmd)
    run = st.runs[old_run]
    assert run.state == "assigned" and run.fence > fence and run.node != first_node
    assert f"new@{T0}" not in st.runs or st.runs[f"new@{T0}"].state == "pending"


def test_pending_past_grace_without_capacity_is_shed() -> None:
    st = fresh(0)
    hb(st, "a", slots=1)
    put(st, "j", misfire={"grace": "30s"}, schedule={"every": "1h"})
    ok(st, {"op": "trigger", "at": T0, "job": "j"})
    (run_id,) = st.runs
    full = (Capacity(node_id="a", tags=frozenset(), slots=1, limit=1, load=1),)
    # Within the grace: nothing to do for it (no node, not yet shed).
    cmd = plan(st, ctx(st, T0 + 10 * S, live=full))
    assert cmd is None or not cmd["drop"]
    cmd = plan(st, ctx(st, T0 + 31 * S, live=full))
    assert cmd["drop"] == [[run_id, "shed", "overload"]]
    ok(st, cmd)
    assert run_id not in st.runs
    assert hist(st, "j")[-1].state == "shed"
    assert hist(st, "j")[-1].reason == "overload"


def test_pending_retry_waits_for_not_before() -> None:
    st = fresh(1, slots=2)
    put(st, "j", retries={"max": 1, "backoff": "30s"}, schedule={"every": "1h"})
    ok(st, {"op": "trigger", "at": T0, "job": "j"})
    ok(st, plan(st, ctx(st, T0)))
    (run_id,) = st.runs
    run = st.runs[run_id]
    ok(st, {"op": "start", "at": T0 + 1, "node": run.node, "items": [[run_id, run.fence]]})
    ok(st, {"op": "finish", "at": T0 + 2 * S, "node": run.node,
            "items": [[run_id, run.fence, "failed", 1, "", "exit 1"]]})
    assert st.runs[run_id].state == "pending"
    assert st.runs[run_id].not_before_ms == T0 + 32 * S
    cmd = plan(st, ctx(st, T0 + 10 * S))
    assert cmd is None or not cmd["place"]
    cmd = plan(st, ctx(st, T0 + 31 * S, lookahead=1 * S))
    assert cmd["place"] == [[run_id, "n1"]]


# --------------------------------------------------------------------- overload

def test_overload_keeps_marks_and_retries_next_plan() -> None:
    st = fresh(0)
    hb(st, "a", slots=3)
    for i in range(10):
        put(st, f"j{i}", schedule={"every": "1h"}, at=T0 - 5 * S)
    marks = {j: r.hwm_ms for j, r in st.jobs.items()}
    cmd = plan(st, ctx(st, T0))
    runs = [f for f in cmd["fires"] if f[0] == "run"]
    assert len(runs) == 3
    assert all(f[3] == "a" for f in runs)
    ok(st, cmd)
    assigned = {r.job_id for r in st.runs.values() if r.state == "assigned"}
    assert len(assigned) == 3
    for j, rec in st.jobs.items():
        if j in assigned:
            assert rec.hwm_ms == T0
        else:
            assert rec.hwm_ms == marks[j], j  # not advanced
            assert rec.next_ms == T0           # still due
    # Finish the three; the next plan takes the next three.
    for r in list(st.runs.values()):
        ok(st, {"op": "start", "at": T0 + 1, "node": "a", "items": [[r.run_id, r.fence]]})
        ok(st, {"op": "finish", "at": T0 + 2, "node": "a",
                "items": [[r.run_id, r.fence, "succeeded", 0, "", ""]]})
    cmd = plan(st, ctx(st, T0 + 5 * S))
    ok(st, cmd)
    second = {r.job_id for r in st.runs.values() if r.state == "assigned"}
    assert len(second) == 3 and not second & assigned


def test_overload_past_grace_recorded_shed() -> None:
    st = fresh(0)
    hb(st, "a", slots=1)
    put(st, "busy", schedule={"every": "1h"})
    put(st, "other", schedule={"every": "1h"}, misfire={"grace": "10s", "policy": "skip"})
    full = (Capacity(node_id="a", tags=frozenset(), slots=1, limit=1, load=1),)
    ok(st, plan(st, ctx(st, T0 + 20 * S, live=full, since=T0 - 60 * S)))
    records = hist(st, "other")
    assert [(h.state, h.reason) for h in records] == [("shed", "overload")]


# --------------------------------------------------------------------- idempotence

def test_plan_applied_twice_adds_nothing() -> None:
    st = fresh(3)
    for i in range(5):
        put(st, f"j{i}", overlap="allow")
    cmd = plan(st, ctx(st, T0, lookahead=25 * S))
    ok(st, cmd)
    snap = encode_state(st)
    fence = st.fence
    runs = dict(st.runs)
    reply = st.apply(cmd)
    assert reply["ok"]
    total = len(cmd["fires"]) + len(cmd["place"]) + len(cmd["drop"])
    assert len([r for r in reply["rejected"] if r[0] != "next"]) == total
    assert st.fence == fence
    assert st.runs == runs
    # Only the counter and the leader's last_ms may move; nothing else.
    assert _strip(snap) == _strip(encode_state(st))
    # And a fresh plan right after has nothing new to fire.
    again = plan(st, ctx(st, T0, lookahead=25 * S))
    assert again is None or not any(f[0] == "run" for f in again["fires"])


def _strip(blob: bytes) -> Any:
    from raftsched.codec import unpackb
    d = unpackb(blob)
    d["applied"] = 0
    return d


def test_plan_never_mutates_state() -> None:
    st = fresh(2)
    for i in range(4):
        put(st, f"j{i}", overlap=["skip", "allow", "queue", "replace"][i])
    before = encode_state(st)
    for now in (T0, T0 + 60 * S, T0 + 3600 * S):
        plan(st, ctx(st, now, lookahead=S))
    assert encode_state(st) == before


# --------------------------------------------------------------------- lookahead

def test_lookahead_window() -> None:
    st = fresh(1)
    put(st, "j", schedule={"every": "10s"}, overlap="allow")
    now = T0 + 10 * S - 50  # next fire T0 + 10 s is 50 ms ahead
    ok(st, plan(st, ctx(st, T0)))  # the T0 fire
    cmd = plan(st, ctx(st, now, lookahead=100))
    assert cmd is not None
    assert ["run", "j", T0 + 10 * S, "n1", False] in cmd["fires"]
    now = T0 + 20 * S - 150  # next fire 150 ms ahead: outside the lookahead
    ok(st, cmd)
    for r in list(st.runs.values()):
        ok(st, {"op": "start", "at": now, "node": "n1", "items": [[r.run_id, r.fence]]})
        ok(st, {"op": "finish", "at": now, "node": "n1",
                "items": [[r.run_id, r.fence, "succeeded", 0, "", ""]]})
    cmd = plan(st, ctx(st, now, lookahead=100))
    assert cmd is None or not any(f[0] == "run" for f in cmd["fires"])


def test_stale_term_plan_refused() -> None:
    st = fresh(1)
    put(st, "j")
    ok(st, {"op": "leader", "at": T0, "node": "n2", "term": 5})
    cmd = plan(st, ctx(st, T0, term=4))
    before = _strip(encode_state(st))
    reply = st.apply(cmd)
    assert not reply["ok"] and reply["error"]["code"] == "conflict"
    assert _strip(encode_state(st)) == before


def _first_run_started(job: str, overlap: str) -> tuple[ClusterState, Any]:
    """One node; the job's first run (fire T0) planned and started."""
    st = fresh(1, slots=4)
    put(st, job, overlap=overlap)
    ok(st, plan(st, ctx(st, T0)))
    r1 = st.runs[f"{job}@{T0}"]
    ok(st, {"op": "start", "at": T0 + 1, "node": "n1", "items": [[r1.run_id, r1.fence]]})
    return st, r1


def test_queue_overlap_plan() -> None:
    st, r1 = _first_run_started("q", "queue")
    cmd = plan(st, ctx(st, T0 + 10 * S))
    assert ["run", "q", T0 + 10 * S, None, True] in cmd["fires"]
    ok(st, cmd)
    assert st.runs[f"q@{T0 + 10 * S}"].state == "queued"
    cmd = plan(st, ctx(st, T0 + 20 * S))
    assert ["miss", "q", T0 + 20 * S, T0 + 20 * S, 1, "skipped", "overlap"] in cmd["fires"]


def test_queued_plan_applied_after_previous_ended_is_not_stuck() -> None:
    """A plan queues a fire behind a run that ends before the plan commits: the queued
    run must still become runnable (regression: it stayed queued forever and every
    later fire was skipped)."""
    st, r1 = _first_run_started("q", "queue")
    cmd = plan(st, ctx(st, T0 + 10 * S))   # built while r1 runs: queues the next fire
    ok(st, {"op": "finish", "at": T0 + 10 * S, "node": "n1",
            "items": [[r1.run_id, r1.fence, "succeeded", 0, "", ""]]})
    ok(st, cmd)                            # committed after r1 ended
    queued = st.runs[f"q@{T0 + 10 * S}"]
    assert queued.state == "pending"
    assert queued.run_id in st.pending
    cmd = plan(st, ctx(st, T0 + 10 * S + 10))
    assert cmd["place"] == [[queued.run_id, "n1"]]


def test_replace_overlap_cancels_previous() -> None:
    st = fresh(1, slots=4)
    put(st, "r", overlap="replace")
    ok(st, plan(st, ctx(st, T0)))
    r1 = st.runs[f"r@{T0}"]
    ok(st, {"op": "start", "at": T0 + 1, "node": "n1", "items": [[r1.run_id, r1.fence]]})
    st.take_effects()
    cmd = plan(st, ctx(st, T0 + 10 * S))
    assert cmd["drop"] == [[r1.run_id, "cancelled", "replaced"]]
    ok(st, cmd)
    assert r1.run_id not in st.runs
    assert hist(st, "r")[-1].state == "cancelled"
    assert ("cancel", r1.run_id, "n1") in st.take_effects()
    assert st.runs[f"r@{T0 + 10 * S}"].state == "assigned"


def test_paused_job_not_planned() -> None:
    st = fresh(1)
    put(st, "p")
    ok(st, {"op": "pause", "at": T0 - S, "job": "p"})
    assert plan(st, ctx(st, T0)) is None


def test_an_overlapping_fire_is_decided_at_its_fire_time_not_ahead_of_it() -> None:
    """A new leader plans the next fire ahead while the previous run's finish is still
    in flight (it waited out the election): the fire is neither skipped nor placed
    until its time; if the run has ended by then the fire runs, else it is skipped."""
    st, r1 = _first_run_started("o", "skip")
    ahead = T0 + 10 * S - 250
    assert plan(st, ctx(st, ahead, lookahead=250)) is None
    assert st.jobs["o"].hwm_ms == T0
    ok(st, {"op": "finish", "at": ahead + 10, "node": "n1",
            "items": [[r1.run_id, r1.fence, "succeeded", 0, "", ""]]})
    cmd = plan(st, ctx(st, ahead + 20, lookahead=250))
    assert ["run", "o", T0 + 10 * S, "n1", False] in cmd["fires"]


def test_an_overlapping_fire_still_running_at_its_time_is_skipped() -> None:
    st, r1 = _first_run_started("o", "skip")
    assert plan(st, ctx(st, T0 + 10 * S - 1, lookahead=250)) is None
    cmd = plan(st, ctx(st, T0 + 10 * S, lookahead=250))
    assert ["miss", "o", T0 + 10 * S, T0 + 10 * S, 1, "skipped", "overlap"] in cmd["fires"]
