"""Tests for raftsched.core.leader.plan: placement, tags, limits, misses for want of a node,
pending-first, shedding, overload, idempotence and lookahead."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from raftsched.core import leader
from raftsched.core.codec import encode_state
from raftsched.core.effects import StopRun
from raftsched.core.leader import Capacity, LeaderContext, place
from raftsched.core.machine import ClusterState
from tests.support.stateutil import hist, ok

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
    """Capacities as the leader loop builds them (the same function); ``only``: the
    nodes the leader still reaches, the others lost to it."""
    return leader.capacities(st, () if only is None else set(st.nodes) - set(only))


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


def test_spreads_over_equal_followers_and_the_leader_takes_the_overflow() -> None:
    st = fresh(3, slots=4)
    for i in range(6):
        put(st, f"j{i}")
    cmd = plan(st, ctx(st, T0))
    assert cmd is not None
    ok(st, cmd)
    assert len(st.runs) == 6
    # n1 leads: the followers share the work while they have free slots.
    assert runs_by_node(st) == Counter({"n2": 3, "n3": 3})
    for i in range(6, 12):
        put(st, f"j{i}")
    ok(st, plan(st, ctx(st, T0)))
    assert runs_by_node(st) == Counter({"n2": 4, "n3": 4, "n1": 4})


def test_a_free_slot_on_the_leader_beats_a_queue_on_a_follower() -> None:
    st = fresh(2, slots=1, queue=3)
    for i in range(3):
        put(st, f"j{i}")
    ok(st, plan(st, ctx(st, T0)))
    # j0 takes n2's slot, j1 the leader's free slot (not n2's queue), j2 queues on n2.
    assert runs_by_node(st) == Counter({"n2": 2, "n1": 1})


def test_a_lone_leader_takes_every_run() -> None:
    st = fresh(1, slots=4)
    for i in range(3):
        put(st, f"j{i}")
    ok(st, plan(st, ctx(st, T0)))
    assert runs_by_node(st) == Counter({"n1": 3})


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
    hb(st, "g", tags=("gpu",))  # the one member with the tag, down meanwhile
    up = ("n1", "n2")
    put(st, "gpu", tags=["gpu"], schedule={"every": "1h"}, misfire={"grace": "30s"})
    # Within the grace nothing is recorded: the mark stays and it retries.
    for now in (T0, T0 + 5 * S, T0 + 30 * S):
        cmd = plan(st, ctx(st, now, live=caps(st, up)))
        assert cmd is None or not cmd["fires"]
    assert st.jobs["gpu"].hwm_ms < T0
    # Past the grace the fire time is recorded missed/no_node, never assigned.
    cmd = plan(st, ctx(st, T0 + 31 * S, live=caps(st, up)))
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
    reply = st.apply_map(cmd)
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
    from raftsched.core.codec import unpackb
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
    reply = st.apply_map(cmd)
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
    assert StopRun(r1.run_id, "n1", r1.fence) in st.take_effects()
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


def test_a_new_leader_waits_to_settle_before_it_skips_for_overlap() -> None:
    """After a failover the previous run's finish, held up by the election, lands in the
    new leader's first second: a fire past its time is not skipped before then."""
    from raftsched.core.leader import SETTLE_MS

    st, r1 = _first_run_started("o", "skip")
    fire = T0 + 10 * S
    elected = fire - 300
    assert plan(st, ctx(st, fire + 100, since=elected)) is None
    ok(st, {"op": "finish", "at": fire + 200, "node": "n1",
            "items": [[r1.run_id, r1.fence, "succeeded", 0, "", ""]]})
    cmd = plan(st, ctx(st, fire + 300, since=elected))
    assert ["run", "o", fire, "n1", False] in cmd["fires"]
    # Still running once the leader has settled: skipped, as before.
    st, r1 = _first_run_started("o", "skip")
    cmd = plan(st, ctx(st, elected + SETTLE_MS, since=elected))
    assert ["miss", "o", fire, fire, 1, "skipped", "overlap"] in cmd["fires"]


def plan(st: ClusterState, c: LeaderContext) -> dict[str, Any] | None:
    """The plan as the map it is replicated as (the tests read its items as lists)."""
    cmd = leader.plan(st, c)
    return None if cmd is None else cmd.to_wire()


def test_week_outage_of_cron_jobs_plans_from_a_copy_with_exact_ranges() -> None:
    """Issue 13: after a week down, each per-minute cron job gets one catch-up run and one
    exact missed range; the plan is computed from a copy taken under the lock, so the
    state may change meanwhile (the copy alone decides), and counting is per day."""
    from raftsched.core.leader import plan_from, plan_input
    from raftsched.core.trigger import count_fires

    week = 7 * 86_400 * S
    st = fresh(slots=400)
    for j in range(20):
        put(st, f"c{j}", schedule={"cron": "* * * * *", "tz": "Europe/Berlin"},
            misfire={"policy": "once", "grace": "60s"})
    now = T0 + week + 30 * S
    c = ctx(st, now, since=now - S, boot=now - 2 * S)
    inp = plan_input(st, now + c.lookahead_ms)
    before = encode_state(st)
    ok(st, {"op": "delete_job", "job": "c0", "at": now})  # after the copy: it does not see
    typed = plan_from(inp, c)
    assert typed is not None and encode_state(st) != before
    cmd = typed.to_wire()
    runs = [f for f in cmd["fires"] if f[0] == "run"]
    misses = [f for f in cmd["fires"] if f[0] == "miss"]
    assert sorted(f[1] for f in runs) == sorted(f"c{j}" for j in range(20))
    assert len(misses) == 20
    sched = inp.due[0].spec.schedule
    for m in misses:
        _, job, first, last, count, outcome, reason = m
        assert (outcome, reason) == ("missed", "coalesced")
        assert count == count_fires(sched, first - 1, last) > 10_000 - 100
    assert {f[2] for f in runs} == {now - now % 60_000}  # the newest fire time, not late


def test_a_catch_up_is_spread_over_plans_and_on_time_jobs_are_not_held_back() -> None:
    """Issue 13: a catch-up of many jobs is planned MAX_CATCHUP_JOBS_PER_PLAN jobs at a
    time (each plan's apply stays short under the Raft lock); jobs due on time that the
    same bounded read copied are planned in the first plan whatever the catch-up; every
    job ends with one range."""
    from raftsched.core.leader import MAX_CATCHUP_JOBS_PER_PLAN as CAP
    from raftsched.core.leader import MAX_JOBS_PER_PLAN

    n = CAP + 7
    assert n + 3 <= MAX_JOBS_PER_PLAN  # all read by the first plan (the read is bounded)
    st = fresh(slots=2 * n)
    for j in range(n):
        put(st, f"c{j:04d}", schedule={"cron": "* * * * *", "tz": "Europe/Berlin"},
            misfire={"policy": "once", "grace": "60s"})
    now = T0 + 7 * 86_400 * S + 30 * S
    for j in range(3):  # created just now: due on time, not late
        put(st, f"t{j}", at=now - S)
    plans = []
    while (cmd := plan(st, ctx(st, now, lookahead=10 * S, since=now - S))) is not None \
            and len(plans) < 10:
        plans.append(cmd)
        ok(st, cmd)
    caught = [{f[1] for f in p["fires"] if f[0] == "miss"} for p in plans]
    assert [len(c) for c in caught if c] == [CAP, 7]
    assert {f[1] for f in plans[0]["fires"] if f[0] == "run"} >= {"t0", "t1", "t2"}
    ranges = [f for p in plans for f in p["fires"] if f[0] == "miss"]
    assert sorted(f[1] for f in ranges) == sorted(f"c{j:04d}" for j in range(n))
    assert {f[1] for p in plans for f in p["fires"] if f[0] == "run"} >= \
        {f"c{j:04d}" for j in range(n)}

# ------------------------------------------------------------ a one-shot already past

def _at_job(st: ClusterState, job: str, at_ms: int, put_at: int, **spec: Any) -> dict[str, Any]:
    from raftsched.core.durations import format_timestamp
    body: dict[str, Any] = {"id": job, "schedule": {"at": format_timestamp(at_ms)},
                            "command": ["true"]}
    body.update(spec)
    return st.apply_map({"op": "put_job", "at": put_at, "spec": body, "v": 3})


def test_an_at_inside_its_grace_in_the_past_runs_late_and_the_job_is_then_done() -> None:
    """Issue 12 item 7: `at` 20 s ago (grace 60 s) used to be accepted and never run."""
    st = fresh(1)
    assert _at_job(st, "once", T0 - 20 * S, T0)["ok"]
    assert st.jobs["once"].next_ms == T0 - 20 * S
    ok(st, plan(st, ctx(st, T0 + S)))
    runs = [r for r in st.runs.values() if r.job_id == "once"]
    assert [(r.scheduled_ms, r.node) for r in runs] == [(T0 - 20 * S, "n1")]
    assert st.jobs["once"].to_dict()["done"] is False
    run = runs[0]
    ok(st, {"op": "start", "at": T0 + 2 * S, "node": "n1", "items": [[run.run_id, run.fence]]})
    ok(st, {"op": "finish", "at": T0 + 3 * S, "node": "n1",
            "items": [[run.run_id, run.fence, "succeeded", 0, "", ""]]})
    view = st.jobs["once"].to_dict()
    assert view["done"] is True and view["next_ms"] is None
    assert [r.state for r in hist(st, "once")] == ["succeeded"]


def test_an_at_beyond_its_grace_is_refused_naming_the_field_and_changes_nothing() -> None:
    st = fresh(1)
    before = encode_state(st)
    reply = _at_job(st, "old", T0 - 120 * S, T0)
    assert reply["ok"] is False
    assert reply["error"]["code"] == "invalid_spec"
    assert reply["error"]["message"].startswith("schedule.at: is 2m in the past, beyond "
                                                "misfire.grace (1m)"), reply
    st.applied -= 1
    assert encode_state(st) == before
    # A longer grace admits it; an atomic file with one such job is refused whole.
    assert _at_job(st, "old", T0 - 120 * S, T0, misfire={"grace": "5m"})["ok"]
    reply = st.apply_map({"op": "put_jobs", "at": T0, "v": 3, "atomic": True, "specs": [
        {"id": "fine", "schedule": {"every": "1s"}, "command": ["true"]},
        {"id": "stale", "schedule": {"at": "2020-01-01T00:00:00Z"}, "command": ["true"]}]})
    assert reply["ok"] is False and reply["error"]["message"].startswith("specs[1].schedule.at")
    assert "fine" not in st.jobs


def test_version_2_puts_of_a_past_at_keep_their_meaning_on_replay() -> None:
    st = fresh(1)
    assert st.apply_map({"op": "put_job", "at": T0, "v": 2, "spec": {
        "id": "old", "schedule": {"at": "2020-01-01T00:00:00Z"}, "command": ["true"]}})["ok"]
    assert st.jobs["old"].next_ms is None


def test_an_unchanged_past_at_can_still_be_updated() -> None:
    """An export -> apply round trip (or a changed command) of a finished one-shot job."""
    st = fresh(1)
    assert _at_job(st, "once", T0 - 20 * S, T0)["ok"]
    assert _at_job(st, "once", T0 - 20 * S, T0 + 3600 * S, command=["false"])["ok"]


def test_retention_deletes_only_the_finished_version_the_leader_saw() -> None:
    st = fresh(1)
    assert _at_job(st, "once", T0 - 20 * S, T0)["ok"]
    # Not done yet (its fire time is still to run): refused, nothing changes.
    before = encode_state(st)
    reply = st.apply_map({"op": "delete_job", "at": T0, "job": "once", "if_done": 1})
    assert reply["ok"] is False and reply["error"]["code"] == "conflict"
    st.applied -= 1
    assert encode_state(st) == before
    # Put again in the future: a new version, so the old version's delete is refused.
    assert _at_job(st, "once", T0 + 60 * S, T0)["ok"]
    assert st.apply_map({"op": "delete_job", "at": T0, "job": "once", "if_done": 1})["ok"] is False
    assert "once" in st.jobs


def test_the_copy_under_the_lock_is_bounded_and_leaves_out_what_is_in_flight() -> None:
    """Issue 13: ``plan_input`` (run under the Raft lock) copies at most
    MAX_JOBS_PER_PLAN due jobs and MAX_RUNS_PER_PLAN pending runs, however many are due,
    and none of the jobs or runs of plans not yet committed."""
    from raftsched.core.leader import MAX_JOBS_PER_PLAN, MAX_RUNS_PER_PLAN, plan_input

    n = 3 * MAX_JOBS_PER_PLAN
    st = fresh(2, slots=n)
    for j in range(n):
        put(st, f"j{j:04d}")
    now = T0 + 10 * S
    # Every first run on n2, then n2 drops out: they all wait for a node again.
    while (cmd := plan(st, ctx(st, now, live=caps(st, ("n2",))))) is not None:
        ok(st, cmd)
    ok(st, {"op": "release", "at": now, "node": "n2", "scope": "assigned",
            "reason": "disconnected"})
    assert len(st.pending) == n > MAX_RUNS_PER_PLAN
    later = now + 10 * S
    inp = plan_input(st, later)
    assert len(inp.pending) == MAX_RUNS_PER_PLAN
    assert len(inp.due) == MAX_JOBS_PER_PLAN
    assert [d.spec.id for d in inp.due] == [f"j{j:04d}" for j in range(MAX_JOBS_PER_PLAN)]
    flying_jobs = {d.spec.id for d in inp.due}
    flying_runs = {p.run_id for p in inp.pending}
    nxt = plan_input(st, later, skip_jobs=flying_jobs, skip_runs=flying_runs)
    assert {d.spec.id for d in nxt.due} == {f"j{j:04d}" for j in
                                            range(MAX_JOBS_PER_PLAN, 2 * MAX_JOBS_PER_PLAN)}
    assert not flying_runs & {p.run_id for p in nxt.pending}
    assert len(nxt.pending) == MAX_RUNS_PER_PLAN
    # The index keeps every job (skipped ones too): all are read again once committed.
    assert len(plan_input(st, later).due) == MAX_JOBS_PER_PLAN
    assert len(st.due_jobs(later, 10 * n)) == n


@pytest.mark.parametrize("overlap", ["skip", "queue", "allow"])
def test_a_catch_up_run_is_the_previous_run_for_the_fires_after_it(overlap: str) -> None:
    """Issue 27 item 6: a cluster stalled past three fire times of a ``misfire = all``
    job plans the catch-up and the on-time fire in one plan. Under ``skip`` one of them
    runs and the others are recorded ``skipped (overlap)``; under ``queue`` one runs
    and one is queued behind it; only ``allow`` starts them all at once."""
    st = fresh(3, slots=4)
    put(st, "c", at=T0 - 35 * S, overlap=overlap,
        misfire={"policy": "all", "grace": "1s", "max_catchup": 10})
    cmd = plan(st, ctx(st, T0 + 100))
    assert cmd is not None
    fires = cmd["fires"]
    runs = [f for f in fires if f[0] == "run"]
    skipped = sum(f[4] for f in fires if f[0] == "miss" and f[5:] == ["skipped", "overlap"])
    if overlap == "allow":
        assert [f[2] for f in runs] == [T0 - 30 * S, T0 - 20 * S, T0 - 10 * S, T0]
        return
    started = [f for f in runs if not f[4]]
    queued = [f for f in runs if f[4]]
    assert [f[2] for f in started] == [T0 - 30 * S], fires
    assert len(queued) == (1 if overlap == "queue" else 0), fires
    assert len(started) + len(queued) + skipped == 4, fires


def test_a_followers_due_index_stays_bounded_and_right() -> None:
    """A follower applies every plan's next fire times and never reads its due index
    (only the leader's plans do): it must not grow by an entry per fire time, and the
    earliest due time it answers (status ``next_due_ms``) stays the true one."""
    from raftsched.core import state as core_state  # DUE_SLACK: the data's own bound

    st = fresh(3, slots=10_000)
    for i in range(10):
        put(st, f"f{i}", at=T0 - 5 * S, schedule={"every": "1s"}, overlap="allow")
    leader_view = fresh(3, slots=10_000)
    for i in range(10):
        put(leader_view, f"f{i}", at=T0 - 5 * S, schedule={"every": "1s"}, overlap="allow")
    for k in range(400):
        now = T0 + k * S
        cmd = leader.plan(leader_view, ctx(leader_view, now))
        assert cmd is not None
        ok(leader_view, cmd.to_wire())
        ok(st, cmd.to_wire())  # the follower only applies
        leader_view.take_effects()
        st.take_effects()
    assert len(st.due) <= 2 * len(st.jobs) + core_state.DUE_SLACK
    assert st.next_due_ms() == min(r.next_ms for r in st.jobs.values())
