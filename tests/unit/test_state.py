"""Example-based tests of raftsched.core.machine.ClusterState.apply (and raftsched.core.claims)."""

from __future__ import annotations

from typing import Any

import pytest

from raftsched.core.codec import encode_state
from raftsched.core.effects import JobRemoved, JobResumed, NodeLost, RunAssigned, StopRun
from raftsched.core.errors import UnknownJob
from raftsched.core.machine import ClusterState
from tests.support.stateutil import (
    T0,
    S,
    base,
    check_indexes,
    err,
    finish,
    hb,
    hist,
    ok,
    place,
    put,
    run_fire,
    spec,
    start,
    two_runs,
)

pytestmark = pytest.mark.timeout(60)

# --------------------------------------------------------------------- jobs

def test_put_get_update() -> None:
    st = base()
    reply = put(st, "j", at=T0 - 5 * S, env={"TOKEN": "s3cret"})
    assert reply == {"ok": True, "job": "j", "version": 1, "created": True}
    view = st.job_view("j")
    assert view["version"] == 1 and view["hwm_ms"] == T0 - 5 * S
    assert view["next_ms"] == T0
    assert view["spec"]["env"] == {"TOKEN": "***"}
    assert "s3cret" not in repr(view)
    assert st.jobs["j"].to_dict(redact=False)["spec"]["env"] == {"TOKEN": "s3cret"}
    # Same schedule: version up, mark unchanged.
    reply = put(st, "j", at=T0 + 3 * S, command=["false"])
    assert reply == {"ok": True, "job": "j", "version": 2, "created": False}
    assert st.jobs["j"].hwm_ms == T0 - 5 * S
    assert st.jobs["j"].spec.command == ("false",)
    assert st.jobs["j"].created_ms == T0 - 5 * S and st.jobs["j"].updated_ms == T0 + 3 * S
    # New schedule: its past never fires, accounting starts at the put.
    put(st, "j", at=T0 + 7 * S, schedule={"every": "1s"})
    assert st.jobs["j"].hwm_ms == T0 + 7 * S
    assert st.jobs["j"].next_ms == T0 + 8 * S
    assert st.jobs["j"].version == 3
    with pytest.raises(UnknownJob):
        st.job_view("nope")


def test_put_schedule_change_never_lowers_mark() -> None:
    st = base()
    put(st, "j", at=T0 - 5 * S)
    run_fire(st, "j", T0 + 10 * S, at=T0)  # lookahead: mark ahead of the clock
    put(st, "j", at=T0 + 1 * S, schedule={"every": "1s"})
    assert st.jobs["j"].hwm_ms == T0 + 10 * S
    assert st.jobs["j"].next_ms == T0 + 11 * S


def test_put_invalid_spec_rejected() -> None:
    st = base()
    put(st, "j")
    reply = err(st, {"op": "put_job", "at": T0, "spec": spec("j", timeout="0s")},
                "invalid_spec")
    assert "timeout" in reply["error"]["message"]


def test_max_jobs_limit() -> None:
    st = base()
    put(st, "a")
    ok(st, {"op": "put_job", "at": T0, "spec": spec("b"), "max_jobs": 2})
    err(st, {"op": "put_job", "at": T0, "spec": spec("c"), "max_jobs": 2}, "limit_exceeded")
    # Updating an existing job is not limited.
    ok(st, {"op": "put_job", "at": T0, "spec": spec("b", command=["x"]), "max_jobs": 2})
    ok(st, {"op": "put_job", "at": T0, "spec": spec("c"), "max_jobs": 3})
    assert sorted(st.jobs) == ["a", "b", "c"]


def test_delete_cancels_active_runs() -> None:
    st = base()
    put(st, "j", overlap="allow")
    run_fire(st, "j", T0)
    run_fire(st, "j", T0 + 10 * S, node="n2")
    r1, r2 = st.runs[f"j@{T0}"], st.runs[f"j@{T0 + 10 * S}"]
    start(st, "n1", r1.run_id, r1.fence, T0 + 1)
    finish_hist = len(hist(st, "j"))
    st.take_effects()
    ok(st, {"op": "delete_job", "at": T0 + 20 * S, "job": "j"})
    assert "j" not in st.jobs and "j" not in st.history
    assert not st.runs and not st.pending
    assert not any(st.by_node.values())
    effects = st.take_effects()
    assert StopRun(r1.run_id, "n1", r1.fence) in effects  # the started one must be stopped
    assert not any(isinstance(e, StopRun) and e.run_id == r2.run_id for e in effects)
    assert JobRemoved("j") in effects
    assert st.totals["cancelled"] == 2
    assert finish_hist == 0
    err(st, {"op": "delete_job", "at": T0, "job": "j"}, "unknown_job")
    # The node's late reports are refused.
    assert finish(st, "n1", r1.run_id, r1.fence, T0 + 21 * S) == [(False, None)]


# --------------------------------------------------------------------- pause / resume

def test_pause_cancels_not_started_and_blocks_new_runs() -> None:
    st = base()
    put(st, "j", overlap="allow")
    run_fire(st, "j", T0)                             # assigned, then started
    run_fire(st, "j", T0 + 10 * S)                    # assigned
    run_fire(st, "j", T0 + 20 * S, node=None)         # pending
    started = st.runs[f"j@{T0}"]
    start(st, "n1", started.run_id, started.fence, T0 + 1)
    ok(st, {"op": "pause", "at": T0 + 25 * S, "job": "j"})
    assert list(st.runs) == [started.run_id]
    assert st.jobs["j"].spec.paused and st.jobs["j"].version == 2
    records = hist(st, "j")
    assert [(h.state, h.reason) for h in records] == [("cancelled", "paused")] * 2
    check_indexes(st)
    # Idempotent.
    ok(st, {"op": "pause", "at": T0 + 26 * S, "job": "j"})
    assert st.jobs["j"].version == 2
    # Blocked: a scheduled run, a plain trigger.
    reply = run_fire(st, "j", T0 + 30 * S)
    assert reply["rejected"] == [["run", "j", T0 + 30 * S]]
    err(st, {"op": "trigger", "at": T0 + 30 * S, "job": "j"}, "conflict")
    # A forced trigger runs anyway.
    reply = ok(st, {"op": "trigger", "at": T0 + 31 * S, "job": "j", "force": True})
    assert st.runs[reply["run_id"]].manual
    # The started run still finishes normally.
    assert finish(st, "n1", started.run_id, started.fence, T0 + 32 * S) == [
        (True, started.fence)]


def test_resume_without_catch_up_records_paused_range() -> None:
    st = base()
    put(st, "j", at=T0 - 5 * S)
    ok(st, {"op": "pause", "at": T0 - 4 * S, "job": "j"})
    at = T0 + 35 * S  # fire times T0 .. T0+30s passed while paused: 4 of them
    st.take_effects()
    reply = ok(st, {"op": "resume", "at": at, "job": "j", "catch_up": False, "missed": 4})
    assert reply["version"] == 3
    rec = st.jobs["j"]
    assert not rec.spec.paused
    assert rec.hwm_ms == at and rec.next_ms == T0 + 40 * S
    (miss,) = hist(st, "j")
    assert (miss.state, miss.reason, miss.count) == ("missed", "paused", 4)
    assert miss.scheduled_ms == T0
    assert miss.until_ms == T0 + 30 * S  # the last missed fire time, not the resume time
    assert rec.last[1:3] == ("missed", "paused")
    assert st.totals["missed"] == 4
    assert JobResumed("j", False) in st.take_effects()
    # Resuming an unpaused job changes nothing but is fine.
    assert ok(st, {"op": "resume", "at": at + 1, "job": "j"})["version"] == 3


def test_resume_with_catch_up_keeps_mark() -> None:
    st = base()
    put(st, "j", at=T0 - 5 * S)
    ok(st, {"op": "pause", "at": T0 - 4 * S, "job": "j"})
    ok(st, {"op": "resume", "at": T0 + 35 * S, "job": "j", "catch_up": True, "missed": 4})
    rec = st.jobs["j"]
    assert rec.hwm_ms == T0 - 5 * S and rec.next_ms == T0
    assert not hist(st, "j")
    # The leader now sees the fire times as due (its misfire policy decides).
    assert [r.spec.id for r in st.due_jobs(T0 + 35 * S, 10)] == ["j"]


def test_resume_rejects_bad_arguments() -> None:
    st = base()
    put(st, "j")
    ok(st, {"op": "pause", "at": T0, "job": "j"})
    err(st, {"op": "resume", "at": T0, "job": "j", "catch_up": "yes"}, "invalid_argument")
    err(st, {"op": "resume", "at": T0, "job": "j", "missed": -1}, "invalid_argument")
    err(st, {"op": "resume", "at": T0, "job": "j", "missed": True}, "invalid_argument")
    assert st.jobs["j"].spec.paused


def test_no_retry_while_paused() -> None:
    """A run that fails (or loses its node) while its job is paused is not retried:
    a paused job starts nothing new (regression: the retry was placed and ran)."""
    st = base()
    put(st, "j", retries={"max": 3, "backoff": "1s"}, overlap="allow")
    run_fire(st, "j", T0)
    run_fire(st, "j", T0 + 10 * S, node="n2")
    a, b = st.runs[f"j@{T0}"], st.runs[f"j@{T0 + 10 * S}"]
    start(st, "n1", a.run_id, a.fence, T0 + 1)
    start(st, "n2", b.run_id, b.fence, T0 + 10 * S + 1)
    ok(st, {"op": "pause", "at": T0 + 11 * S, "job": "j"})
    finish(st, "n1", a.run_id, a.fence, T0 + 12 * S, outcome="failed", code=1)
    ok(st, {"op": "release", "at": T0 + 13 * S, "node": "n2", "scope": "all"})
    assert not st.runs and not st.pending
    assert [h.state for h in hist(st, "j")] == ["failed", "lost"]


# --------------------------------------------------------------------- trigger

def _busy(st: ClusterState, overlap: str) -> str:
    put(st, "j", overlap=overlap, schedule={"every": "1h"})
    run_fire(st, "j", T0)
    run = st.runs[f"j@{T0}"]
    start(st, "n1", run.run_id, run.fence, T0 + 1)
    return run.run_id


def test_trigger_idle_job() -> None:
    st = base()
    put(st, "j", schedule={"every": "1h"})
    reply = ok(st, {"op": "trigger", "at": T0 + 123, "job": "j"})
    assert reply == {"ok": True, "run_id": f"j@{T0 + 123}", "state": "pending"}
    run = st.runs[reply["run_id"]]
    assert run.manual and run.attempt == 1 and run.fence == 0
    assert st.jobs["j"].hwm_ms == T0 - 5 * S  # a manual run is not a fire time
    check_indexes(st)


def test_trigger_overlap_skip() -> None:
    st = base()
    _busy(st, "skip")
    err(st, {"op": "trigger", "at": T0 + 5 * S, "job": "j"}, "conflict")
    reply = ok(st, {"op": "trigger", "at": T0 + 5 * S, "job": "j", "force": True})
    assert reply["state"] == "pending" and len(st.runs) == 2


def test_trigger_overlap_allow() -> None:
    st = base()
    _busy(st, "allow")
    reply = ok(st, {"op": "trigger", "at": T0 + 5 * S, "job": "j"})
    assert reply["state"] == "pending" and len(st.runs) == 2


def test_trigger_overlap_queue() -> None:
    st = base()
    first = _busy(st, "queue")
    reply = ok(st, {"op": "trigger", "at": T0 + 5 * S, "job": "j"})
    assert reply["state"] == "queued"
    queued = reply["run_id"]
    assert queued not in st.pending
    err(st, {"op": "trigger", "at": T0 + 6 * S, "job": "j"}, "conflict")
    # The previous run ends: the queued one becomes pending.
    run = st.runs[first]
    finish(st, "n1", first, run.fence, T0 + 7 * S)
    assert st.runs[queued].state == "pending" and queued in st.pending
    check_indexes(st)


def test_trigger_overlap_replace() -> None:
    st = base()
    first = _busy(st, "replace")
    st.take_effects()
    reply = ok(st, {"op": "trigger", "at": T0 + 5 * S, "job": "j"})
    assert first not in st.runs
    assert hist(st, "j")[-1].state == "cancelled"
    fence = hist(st, "j")[-1].fence
    assert StopRun(first, "n1", fence) in st.take_effects()
    assert list(st.runs) == [reply["run_id"]]


def test_trigger_unique_ids_and_never_a_future_fire_time() -> None:
    """A manual run never takes the id of a fire time the plan will create
    (regression: the plan overwrote the manual run and indexed it twice)."""
    st = base()
    put(st, "j", overlap="allow", schedule={"every": "10s"}, at=T0 - 5 * S)
    reply = ok(st, {"op": "trigger", "at": T0, "job": "j"})
    manual = reply["run_id"]
    assert manual != f"j@{T0}"
    again = ok(st, {"op": "trigger", "at": T0, "job": "j"})["run_id"]
    assert again not in (manual, f"j@{T0}")
    run_fire(st, "j", T0, node=None)
    assert st.runs[f"j@{T0}"].manual is False
    assert st.runs[manual].manual is True
    check_indexes(st)
    # Ids of finished runs are not reused either.
    run = st.runs[manual]
    place(st, manual, "n1", T0 + 1)
    start(st, "n1", manual, st.runs[manual].fence, T0 + 2)
    finish(st, "n1", manual, run.fence, T0 + 3)
    third = ok(st, {"op": "trigger", "at": T0, "job": "j"})["run_id"]
    assert third not in {manual, again, f"j@{T0}"}
    assert third not in {h.run_id for h in hist(st, "j")}


def test_plan_never_overwrites_a_live_run_with_the_same_id() -> None:
    """A manual run whose id became a fire time of a new schedule (stamped ahead of the
    put, another node's clock) is not overwritten by the plan (regression: the plan
    replaced the run record and listed the id twice in the job's active runs)."""
    st = base()
    put(st, "j", at=T0, overlap="allow", schedule={"every": "2s"})
    manual = ok(st, {"op": "trigger", "at": T0 + 1000, "job": "j"})["run_id"]
    assert manual == f"j@{T0 + 1000}"   # not a fire time of the 2 s schedule
    put(st, "j", at=T0 + 500, overlap="allow", schedule={"every": "1s"})
    reply = run_fire(st, "j", T0 + 1000)
    assert reply["rejected"] == [["run", "j", T0 + 1000]]
    assert st.runs[manual].manual and st.jobs["j"].active == [manual]
    check_indexes(st)


def test_trigger_bad_args() -> None:
    st = base()
    put(st, "j")
    err(st, {"op": "trigger", "at": T0, "job": "j", "force": 1}, "invalid_argument")
    err(st, {"op": "trigger", "at": T0, "job": "nope"}, "unknown_job")
    err(st, {"op": "trigger", "at": T0, "job": 5}, "invalid_argument")


# --------------------------------------------------------------------- dedupe

def test_dedupe_by_rid_returns_first_reply() -> None:
    st = base()
    first = ok(st, {"op": "put_job", "at": T0, "spec": spec("j"), "rid": "r-1"})
    snap = encode_state(st)
    second = st.apply_map({"op": "put_job", "at": T0 + 1, "spec": spec("j", command=["x"]),
                       "rid": "r-1"})
    assert second == dict(first, duplicate=True)
    assert st.jobs["j"].version == 1 and st.jobs["j"].spec.command == ("true",)
    st.applied -= 1
    assert encode_state(st) == snap
    st.applied += 1
    t1 = ok(st, {"op": "trigger", "at": T0 + 2, "job": "j", "rid": "t"})
    t2 = ok(st, {"op": "trigger", "at": T0 + 3, "job": "j", "rid": "t"})
    assert t2["run_id"] == t1["run_id"] and t2["duplicate"] is True
    assert len(st.runs) == 1


def test_a_refused_command_is_remembered_so_a_late_copy_changes_nothing() -> None:
    # The nemesis case: a delete of an absent job is refused (the client hears
    # unknown_job: absent) and a put follows; a copy of the delete still in flight
    # (a node's retry, a forward over a lossy link) commits after the put. It must
    # get the first answer, not delete the job the client has put since.
    st = base()
    first = err(st, {"op": "delete_job", "at": T0, "job": "j", "rid": "d"}, "unknown_job")
    put(st, "j")
    late = st.apply_map({"op": "delete_job", "at": T0 + 1, "job": "j", "rid": "d"})
    assert late == dict(first, duplicate=True)
    assert "j" in st.jobs
    err(st, {"op": "trigger", "at": T0, "job": "nope", "rid": "r"}, "unknown_job")
    put(st, "nope")
    assert st.apply_map({"op": "trigger", "at": T0, "job": "nope", "rid": "r"})["duplicate"]
    assert len(st.runs) == 0


def test_a_v1_refusal_is_not_remembered_as_v1_applied_it() -> None:
    # Replicas replaying an old journal must agree with the release that wrote it.
    st = base()
    err(st, {"op": "trigger", "at": T0, "job": "j", "rid": "r", "v": 1}, "unknown_job")
    put(st, "j")
    reply = ok(st, {"op": "trigger", "at": T0, "job": "j", "rid": "r", "v": 1})
    assert "duplicate" not in reply


# --------------------------------------------------------------------- plan

def test_plan_assigns_with_increasing_fences_and_advances_mark() -> None:
    st = base()
    put(st, "a")
    put(st, "b")
    st.take_effects()
    reply = ok(st, {"op": "plan", "at": T0, "term": 1, "leader": "n1",
                    "fires": [["run", "a", T0, "n1", False], ["run", "b", T0, "n2", False],
                              ["run", "a", T0 + 10 * S, "n2", False]],
                    "next": [["a", T0 + 20 * S], ["b", T0 + 10 * S]]})
    assert reply == {"ok": True, "rejected": [], "fence": 3}
    fences = [e.fence for e in st.take_effects() if isinstance(e, RunAssigned)]
    assert fences == [1, 2, 3]
    assert st.jobs["a"].hwm_ms == T0 + 10 * S and st.jobs["b"].hwm_ms == T0
    assert st.jobs["a"].next_ms == T0 + 20 * S
    assert st.runs[f"a@{T0}"].node == "n1"
    assert st.by_node["n2"] == {f"b@{T0}", f"a@{T0 + 10 * S}"}
    check_indexes(st)


def test_second_plan_for_same_fire_time_rejected() -> None:
    st = base()
    put(st, "a", overlap="allow")
    run_fire(st, "a", T0)
    fence = st.fence
    snap = encode_state(st)
    reply = run_fire(st, "a", T0, node="n2")
    assert reply["rejected"] == [["run", "a", T0]]
    earlier = run_fire(st, "a", T0 - 10 * S, node="n2")
    assert earlier["rejected"] == [["run", "a", T0 - 10 * S]]
    miss = ok(st, {"op": "plan", "at": T0, "term": 1, "leader": "n1",
                   "fires": [["miss", "a", T0, T0, 1, "missed", "no_leader"]]})
    assert miss["rejected"] == [["miss", "a", T0]]
    assert st.fence == fence
    st.applied -= 3
    assert encode_state(st) == snap


def test_plan_from_older_term_refused_entirely() -> None:
    st = base()
    put(st, "a")
    ok(st, {"op": "leader", "at": T0, "node": "n2", "term": 3})
    err(st, {"op": "plan", "at": T0, "term": 2, "leader": "n1",
             "fires": [["run", "a", T0, "n1", False]], "next": [["a", T0 + 10 * S]]},
        "conflict")
    # Only the recorded leader plans: a newer term's leader records itself first.
    err(st, {"op": "plan", "at": T0, "term": 4, "leader": "n1",
             "fires": [["run", "a", T0, "n1", False]]}, "conflict")
    err(st, {"op": "plan", "at": T0, "term": 3, "leader": "n1",
             "fires": [["run", "a", T0, "n1", False]]}, "conflict")
    assert run_fire(st, "a", T0, term=3)["rejected"] == []
    err(st, {"op": "leader", "at": T0, "node": "n1", "term": 2}, "conflict")


def test_leader_only_commands_need_the_log_entrys_term() -> None:
    """A deposed leader's release, plan or leadership record — proposed in its old term
    and appended by the new leader in a newer one — changes nothing (issue 14, #1)."""
    st = base()
    put(st, "a")
    run_fire(st, "a", T0 + 2 * S, node="n2")
    snap = encode_state(st)
    stale = [
        {"op": "release", "at": T0, "node": "n2", "scope": "all", "reason": "silent",
         "term": 1, "leader": "n1"},
        {"op": "plan", "at": T0, "term": 1, "leader": "n1", "place": []},
        {"op": "leader", "at": T0, "node": "n1", "term": 1},
    ]
    for cmd in stale:
        reply = st.apply_map(dict(cmd), 2)
        assert reply["error"]["code"] == "conflict", (cmd, reply)
        assert "no longer leads" in reply["error"]["message"]
    st.applied -= len(stale)
    assert encode_state(st) == snap
    # The same commands in the term they were proposed in are the leader's own.
    assert st.apply_map(dict(stale[0]), 1)["ok"]
    assert st.runs[f"a@{T0 + 2 * S}"].state == "pending"


def test_release_from_a_node_that_is_not_the_recorded_leader_is_refused() -> None:
    st = base()
    put(st, "a")
    run_fire(st, "a", T0 + 2 * S, node="n2")
    snap = encode_state(st)
    err(st, {"op": "release", "at": T0, "node": "n2", "scope": "all", "term": 1,
             "leader": "n3"}, "conflict")
    err(st, {"op": "release", "at": T0, "node": "n2", "scope": "all", "term": 0,
             "leader": "n1"}, "conflict")
    err(st, {"op": "release", "at": T0, "node": "n2", "scope": "all"}, "invalid_argument")
    st.applied -= 3
    assert encode_state(st) == snap


def test_one_leadership_record_per_term() -> None:
    st = base()
    err(st, {"op": "leader", "at": T0, "node": "n2", "term": 1}, "conflict")
    assert st.leader.node == "n1" and st.leader.changes == 1
    ok(st, {"op": "leader", "at": T0 + 1, "node": "n1", "term": 1})  # a re-commit is fine
    ok(st, {"op": "leader", "at": T0 + 2, "node": "n2", "term": 2})


def test_version_1_release_without_a_term_keeps_its_meaning() -> None:
    """A journal written before leader-only commands carried terms replays as it was."""
    st = base()
    put(st, "a")
    run_fire(st, "a", T0 + 2 * S, node="n2")
    assert st.apply_map({"op": "release", "at": T0, "node": "n2", "scope": "all", "v": 1}, 5)["ok"]
    assert st.runs[f"a@{T0 + 2 * S}"].state == "pending"


def test_plan_run_to_unknown_or_lost_node_stays_pending() -> None:
    st = base()
    put(st, "a", overlap="allow")
    run_fire(st, "a", T0, node="ghost")
    assert st.runs[f"a@{T0}"].state == "pending"
    ok(st, {"op": "release", "at": T0, "node": "n2", "scope": "all"})
    run_fire(st, "a", T0 + 10 * S, node="n2")
    assert st.runs[f"a@{T0 + 10 * S}"].state == "pending"
    assert place(st, f"a@{T0}", "n2", T0)["rejected"] == [["place", f"a@{T0}"]]
    hb(st, "n2", at=T0 + 1)
    assert place(st, f"a@{T0}", "n2", T0)["rejected"] == []
    check_indexes(st)


def test_miss_ranges_fold() -> None:
    st = base()
    put(st, "j")

    def miss(first: int, last: int, count: int, outcome: str = "missed",
             reason: str = "no_leader") -> None:
        ok(st, {"op": "plan", "at": last, "term": 1, "leader": "n1",
                "fires": [["miss", "j", first, last, count, outcome, reason]]})

    miss(T0, T0 + 20 * S, 3)
    miss(T0 + 30 * S, T0 + 30 * S, 1)
    miss(T0 + 40 * S, T0 + 50 * S, 2)
    (rec,) = hist(st, "j")
    assert (rec.scheduled_ms, rec.until_ms, rec.count) == (T0, T0 + 50 * S, 6)
    miss(T0 + 60 * S, T0 + 60 * S, 1, reason="cluster_down")   # other reason: new record
    miss(T0 + 70 * S, T0 + 70 * S, 1, outcome="skipped", reason="cluster_down")
    miss(T0 + 80 * S, T0 + 90 * S, 2, outcome="skipped", reason="cluster_down")
    assert [(h.state, h.reason, h.count) for h in hist(st, "j")] == [
        ("missed", "no_leader", 6), ("missed", "cluster_down", 1),
        ("skipped", "cluster_down", 3)]
    assert st.totals == {"missed": 7, "skipped": 3}
    # A real run in between breaks the fold.
    run_fire(st, "j", T0 + 100 * S)
    r = st.runs[f"j@{T0 + 100 * S}"]
    start(st, "n1", r.run_id, r.fence, T0 + 100 * S)
    finish(st, "n1", r.run_id, r.fence, T0 + 101 * S)
    miss(T0 + 110 * S, T0 + 110 * S, 1, outcome="skipped", reason="cluster_down")
    assert [h.state for h in hist(st, "j")] == ["missed", "missed", "skipped", "succeeded",
                                                  "skipped"]
    assert st.jobs["j"].hwm_ms == T0 + 110 * S


# --------------------------------------------------------------------- start / finish

def test_start_needs_current_fence_node_and_state() -> None:
    st = base()
    put(st, "j")
    run_fire(st, "j", T0)
    run = st.runs[f"j@{T0}"]
    fence = run.fence
    snap = encode_state(st)
    results = ok(st, {"op": "start", "at": T0 + 1, "node": "n1",
                      "items": [[run.run_id, fence + 1], [run.run_id, fence - 1],
                                ["j@1", fence], [5, fence]]})["results"]
    assert results == [(False, fence), (False, fence), (False, None), (False, None)]
    assert start(st, "n2", run.run_id, fence, T0 + 1) == [(False, fence)]   # wrong node
    st.applied -= 2
    assert encode_state(st) == snap
    st.applied += 2
    assert start(st, "n1", run.run_id, fence, T0 + 2) == [(True, fence)]
    assert run.state == "started" and run.started_ms == T0 + 2
    assert start(st, "n1", run.run_id, fence, T0 + 3) == [(False, fence)]   # not assigned


def test_stale_start_after_release_and_replace_rejected() -> None:
    st = base()
    put(st, "j")
    run_fire(st, "j", T0)
    run_id = f"j@{T0}"
    old = st.runs[run_id].fence
    reply = ok(st, {"op": "release", "at": T0 + 1, "node": "n1", "scope": "assigned",
                    "reason": "disconnected"})
    assert reply["released"] == [run_id]
    assert st.runs[run_id].state == "pending" and st.nodes["n1"].alive
    place(st, run_id, "n2", T0 + 2)
    new = st.runs[run_id].fence
    assert new > old
    snap = encode_state(st)
    assert start(st, "n1", run_id, old, T0 + 3) == [(False, new)]
    assert start(st, "n2", run_id, old, T0 + 3) == [(False, new)]
    assert finish(st, "n1", run_id, old, T0 + 3) == [(False, new)]
    st.applied -= 3
    assert encode_state(st) == snap
    st.applied += 3
    assert start(st, "n2", run_id, new, T0 + 4) == [(True, new)]


def test_finish_with_retries() -> None:
    st = base()
    put(st, "j", retries={"max": 2, "backoff": "10s", "backoff_max": "15s"})
    run_fire(st, "j", T0)
    run_id = f"j@{T0}"
    expected_nb = [T0 + 5 * S + 10 * S, T0 + 5 * S + 15 * S]
    for attempt in (1, 2):
        run = st.runs[run_id]
        assert run.attempt == attempt
        start(st, run.node, run_id, run.fence, T0 + 1)
        outcome = "failed" if attempt == 1 else "timed_out"
        assert finish(st, run.node, run_id, run.fence, T0 + 5 * S, outcome=outcome,
                      code=3, tail="boom", reason="exit 3") == [(True, run.fence)]
        run = st.runs[run_id]
        assert run.state == "pending" and run.attempt == attempt + 1
        assert run.node is None and run.not_before_ms == expected_nb[attempt - 1]
        assert run_id in st.pending
        assert hist(st, "j")[-1].state == outcome
        assert hist(st, "j")[-1].attempt == attempt
        check_indexes(st)
        place(st, run_id, "n2", T0 + 20 * S)
    run = st.runs[run_id]
    start(st, "n2", run_id, run.fence, T0 + 21 * S)
    finish(st, "n2", run_id, run.fence, T0 + 22 * S, outcome="failed", code=1)
    assert run_id not in st.runs           # no retry left
    assert [h.state for h in hist(st, "j")] == ["failed", "timed_out", "failed"]
    assert st.totals == {"failed": 2, "timed_out": 1}
    assert st.jobs["j"].last[:2] == (run_id, "failed")


def test_finish_stale_or_malformed_rejected() -> None:
    st = base()
    put(st, "j")
    run_fire(st, "j", T0)
    run = st.runs[f"j@{T0}"]
    # Assigned: only shed/cancelled/missed may be reported before a start.
    assert finish(st, "n1", run.run_id, run.fence, T0 + 1) == [(False, run.fence)]
    start(st, "n1", run.run_id, run.fence, T0 + 1)
    snap = encode_state(st)
    bad = [
        [run.run_id, run.fence - 1, "succeeded", 0, "", ""],
        [run.run_id, run.fence + 1, "succeeded", 0, "", ""],
        [run.run_id, run.fence, "exploded", 0, "", ""],
        [run.run_id, run.fence, "missed", 0, "", ""],
        [run.run_id, run.fence, ["succeeded"], 0, "", ""],
        [run.run_id, run.fence, "succeeded", "0", "", ""],
        [run.run_id, run.fence, "succeeded", True, "", ""],
        [run.run_id, run.fence, "succeeded", 0, b"tail", ""],
        [run.run_id, run.fence, "succeeded", 0, "", None],
        ["j@1", run.fence, "succeeded", 0, "", ""],
    ]
    results = ok(st, {"op": "finish", "at": T0 + 2, "node": "n1", "items": bad})["results"]
    assert all(r[0] is False for r in results)
    assert finish(st, "n2", run.run_id, run.fence, T0 + 2) == [(False, run.fence)]
    st.applied -= 2
    assert encode_state(st) == snap
    st.applied += 2
    assert finish(st, "n1", run.run_id, run.fence, T0 + 3, tail="x" * 70_000) == [
        (True, run.fence)]
    assert len(hist(st, "j")[-1].tail) == 65536
    # Reporting twice: the second is stale.
    assert finish(st, "n1", run.run_id, run.fence, T0 + 4) == [(False, None)]


def test_finish_shed_while_assigned() -> None:
    st = base()
    put(st, "j")
    run_fire(st, "j", T0)
    run = st.runs[f"j@{T0}"]
    assert finish(st, "n1", run.run_id, run.fence, T0 + 1, outcome="shed", code=None,
                  reason="queue full") == [(True, run.fence)]
    assert hist(st, "j")[-1].state == "shed"
    check_indexes(st)


# --------------------------------------------------------------------- release / nodes

def test_release_scope_assigned() -> None:
    st = base()
    a, b = two_runs(st)
    reply = ok(st, {"op": "release", "at": T0 + 20 * S, "node": "n1", "scope": "assigned",
                    "reason": "disconnected"})
    assert reply["released"] == [b]
    assert st.runs[a].state == "started" and st.runs[b].state == "pending"
    assert st.nodes["n1"].alive
    check_indexes(st)


def test_release_scope_all_retry() -> None:
    st = base()
    a, b = two_runs(st, "retry")
    fence_a = st.runs[a].fence
    st.take_effects()
    reply = ok(st, {"op": "release", "at": T0 + 20 * S, "node": "n1", "scope": "all",
                    "reason": "silent"})
    assert sorted(reply["released"]) == sorted([a, b])
    assert st.runs[a].state == "pending" and st.runs[a].attempt == 2
    assert st.runs[a].not_before_ms == T0 + 20 * S
    assert hist(st, "j")[-1].state == "lost"
    assert st.runs[b].state == "pending" and st.runs[b].attempt == 1
    assert not st.nodes["n1"].alive and st.nodes["n1"].lost_ms == T0 + 20 * S
    assert NodeLost("n1", "silent") in st.take_effects()
    # The lost node's reports are stale now.
    assert finish(st, "n1", a, fence_a, T0 + 21 * S) == [(False, fence_a)]
    # It cannot get new work until it heartbeats again.
    assert place(st, b, "n1", T0 + 22 * S)["rejected"] == [["place", b]]
    hb(st, "n1", at=T0 + 23 * S)
    assert st.nodes["n1"].alive
    assert place(st, b, "n1", T0 + 24 * S)["rejected"] == []
    check_indexes(st)


def test_release_scope_all_fail() -> None:
    st = base()
    a, b = two_runs(st, "fail")
    ok(st, {"op": "release", "at": T0 + 20 * S, "node": "n1", "scope": "all"})
    assert a not in st.runs
    assert hist(st, "j")[-1].state == "lost"
    assert st.runs[b].state == "pending"
    assert st.totals == {"lost": 1}


def test_release_rejects_bad_arguments() -> None:
    st = base()
    err(st, {"op": "release", "at": T0, "node": "ghost", "scope": "all"}, "invalid_argument")
    err(st, {"op": "release", "at": T0, "node": "n1", "scope": "started"}, "invalid_argument")
    err(st, {"op": "release", "at": T0, "node": "n1", "scope": "all", "reason": 5},
        "invalid_argument")


def test_heartbeat_new_boot_releases_started_runs() -> None:
    st = base()
    a, b = two_runs(st, "retry")
    hb(st, "n1", at=T0 + 20 * S, boot=1)   # same boot: nothing happens
    assert st.runs[a].state == "started"
    hb(st, "n1", at=T0 + 21 * S, boot=2, slots=8, tags=["x"])
    assert st.runs[a].state == "pending" and st.runs[a].attempt == 2
    assert st.runs[b].state == "assigned"  # not started: the new process may still start it
    node = st.nodes["n1"]
    assert (node.boot_ms, node.slots, node.tags, node.last_hb_ms) == (2, 8, ("x",),
                                                                      T0 + 21 * S)
    check_indexes(st)


def test_leader_records_term_and_skew() -> None:
    st = base()
    st.take_effects()
    ok(st, {"op": "leader", "at": T0, "node": "n2", "term": 2,
            "skew": {"n1": -15, "ghost": 3, "n2": True}})
    assert st.leader.node == "n2" and st.leader.term == 2
    assert st.leader.since_ms == T0 and st.leader.changes == 2
    assert st.nodes["n1"].skew_ms == -15 and st.nodes["n2"].skew_ms is None
    ok(st, {"op": "leader", "at": T0 + 5, "node": "n2", "term": 2})
    assert st.leader.since_ms == T0  # same leader and term: not a change
    assert st.leader.changes == 2


# --------------------------------------------------------------------- history / queue

def test_history_is_bounded() -> None:
    st = ClusterState(history_limit=5)
    ok(st, {"op": "leader", "at": T0, "node": "n1", "term": 1})
    hb(st, "n1")
    put(st, "j", schedule={"every": "1s"})
    for i in range(12):
        t = T0 + i * S
        run_fire(st, "j", t)
        r = st.runs[f"j@{t}"]
        start(st, "n1", r.run_id, r.fence, t)
        finish(st, "n1", r.run_id, r.fence, t + 1, tail=f"out {i}")
    records = hist(st, "j")
    assert len(records) == 5
    assert [h.scheduled_ms for h in records] == [T0 + i * S for i in range(7, 12)]
    assert st.totals["succeeded"] == 12
    assert len(st.run_views("j", 100)) == 5


def test_queue_overlap_dequeues_when_previous_ends() -> None:
    st = base()
    put(st, "q", overlap="queue")
    run_fire(st, "q", T0)
    first = st.runs[f"q@{T0}"]
    start(st, "n1", first.run_id, first.fence, T0 + 1)
    run_fire(st, "q", T0 + 10 * S, node=None, queued=True)
    queued = st.runs[f"q@{T0 + 10 * S}"]
    assert queued.state == "queued" and queued.run_id not in st.pending
    finish(st, "n1", first.run_id, first.fence, T0 + 12 * S)
    assert queued.state == "pending" and queued.run_id in st.pending
    check_indexes(st)


def test_queued_plan_after_previous_ended_is_runnable() -> None:
    st = base()
    put(st, "q", overlap="queue")
    run_fire(st, "q", T0 + 10 * S, node=None, queued=True)  # nothing active any more
    assert st.runs[f"q@{T0 + 10 * S}"].state == "pending"
    check_indexes(st)


# --------------------------------------------------------------------- garbage

RUN_ID = f"a@{T0}"


def garbage_state() -> ClusterState:
    """A state with something in every index: pending, queued, assigned, started."""
    st = base()
    put(st, "a", overlap="queue", retries={"max": 1})
    put(st, "b", overlap="allow")
    put(st, "p")
    ok(st, {"op": "pause", "at": T0 - 4 * S, "job": "p"})
    run_fire(st, "a", T0)
    start(st, "n1", RUN_ID, st.runs[RUN_ID].fence, T0 + 1)
    run_fire(st, "a", T0 + 10 * S, node=None, queued=True)
    run_fire(st, "b", T0, node="n2")
    run_fire(st, "b", T0 + 10 * S, node=None)
    ok(st, {"op": "plan", "at": T0, "term": 1, "leader": "n1",
            "fires": [["miss", "b", T0 + 20 * S, T0 + 20 * S, 1, "missed", "no_leader"]]})
    ok(st, {"op": "trigger", "at": T0 + 1, "job": "b", "rid": "rid-1"})
    ok(st, {"op": "leader", "at": T0 + 2 * S, "node": "n1", "term": 2})
    check_indexes(st)
    return st


J = spec("z")
GARBAGE: list[tuple[str, Any]] = [
    ("none", None), ("int", 1), ("str", "put_job"), ("list", ["op", "put_job"]),
    ("bytes", b"\x81\xa2op"), ("float", 3.5), ("bool", True), ("empty", {}),
    ("op-none", {"op": None, "at": T0}), ("op-unknown", {"op": "explode", "at": T0}),
    ("op-int", {"op": 5, "at": T0}), ("op-list", {"op": ["put_job"], "at": T0}),
    ("op-dunder", {"op": "__init__", "at": T0}),
    ("at-missing", {"op": "put_job", "spec": J}),
    ("at-negative", {"op": "put_job", "at": -1, "spec": J}),
    ("at-str", {"op": "put_job", "at": str(T0), "spec": J}),
    ("at-float", {"op": "put_job", "at": 1.5, "spec": J}),
    ("at-bool", {"op": "put_job", "at": True, "spec": J}),
    ("at-list", {"op": "put_job", "at": [T0], "spec": J}),
    ("rid-int", {"op": "put_job", "at": T0, "spec": J, "rid": 5}),
    ("rid-long", {"op": "put_job", "at": T0, "spec": J, "rid": "r" * 65}),
    ("rid-list", {"op": "put_job", "at": T0, "spec": J, "rid": ["rid-1"]}),
    ("put-no-spec", {"op": "put_job", "at": T0}),
    ("put-spec-list", {"op": "put_job", "at": T0, "spec": [J]}),
    ("put-spec-empty", {"op": "put_job", "at": T0, "spec": {}}),
    ("put-spec-bad", {"op": "put_job", "at": T0, "spec": spec("z", overlap=[1])}),
    ("put-spec-bad-existing", {"op": "put_job", "at": T0, "spec": spec("a", jitter="9h")}),
    ("put-max-jobs", {"op": "put_job", "at": T0, "spec": J, "max_jobs": 3}),
    ("delete-no-job", {"op": "delete_job", "at": T0}),
    ("delete-int", {"op": "delete_job", "at": T0, "job": 5}),
    ("delete-unknown", {"op": "delete_job", "at": T0, "job": "zz"}),
    ("delete-list", {"op": "delete_job", "at": T0, "job": ["a"]}),
    ("pause-unknown", {"op": "pause", "at": T0, "job": "zz"}),
    ("pause-dict", {"op": "pause", "at": T0, "job": {"a": 1}}),
    ("resume-unknown", {"op": "resume", "at": T0, "job": "zz"}),
    ("resume-catch-up-str", {"op": "resume", "at": T0, "job": "p", "catch_up": "no"}),
    ("resume-missed-neg", {"op": "resume", "at": T0, "job": "p", "missed": -3}),
    ("resume-missed-str", {"op": "resume", "at": T0, "job": "p", "missed": "3"}),
    ("resume-missed-float", {"op": "resume", "at": T0, "job": "p", "missed": 3.0}),
    ("trigger-unknown", {"op": "trigger", "at": T0, "job": "zz"}),
    ("trigger-force-int", {"op": "trigger", "at": T0, "job": "b", "force": 1}),
    ("trigger-paused", {"op": "trigger", "at": T0, "job": "p"}),
    ("trigger-queue-full", {"op": "trigger", "at": T0, "job": "a"}),
    ("hb-no-node", {"op": "heartbeat", "at": T0, "boot": 1, "slots": 1, "queue": 0}),
    ("hb-node-empty", {"op": "heartbeat", "at": T0, "node": "", "boot": 1, "slots": 1,
                       "queue": 0}),
    ("hb-node-int", {"op": "heartbeat", "at": T0, "node": 5, "boot": 1, "slots": 1,
                     "queue": 0}),
    ("hb-node-long", {"op": "heartbeat", "at": T0, "node": "n" * 257, "boot": 1, "slots": 1,
                      "queue": 0}),
    ("hb-boot-neg", {"op": "heartbeat", "at": T0, "node": "n1", "boot": -1, "slots": 1,
                     "queue": 0}),
    ("hb-boot-changed-but-bad-slots", {"op": "heartbeat", "at": T0, "node": "n1", "boot": 9,
                                       "slots": "4", "queue": 0}),
    ("hb-slots-bool", {"op": "heartbeat", "at": T0, "node": "n1", "boot": 1, "slots": True,
                       "queue": 0}),
    ("hb-queue-float", {"op": "heartbeat", "at": T0, "node": "n1", "boot": 1, "slots": 1,
                        "queue": 0.5}),
    ("hb-tags-str", {"op": "heartbeat", "at": T0, "node": "n1", "boot": 9, "slots": 1,
                     "queue": 0, "tags": "gpu"}),
    ("hb-tags-int", {"op": "heartbeat", "at": T0, "node": "n1", "boot": 9, "slots": 1,
                     "queue": 0, "tags": [1]}),
    ("hb-api-int", {"op": "heartbeat", "at": T0, "node": "n1", "boot": 9, "slots": 1,
                    "queue": 0, "api": 80}),
    ("leader-no-node", {"op": "leader", "at": T0, "term": 5}),
    ("leader-term-neg", {"op": "leader", "at": T0, "node": "n1", "term": -1}),
    ("leader-term-str", {"op": "leader", "at": T0, "node": "n1", "term": "5"}),
    ("leader-term-old", {"op": "leader", "at": T0, "node": "n2", "term": 1}),
    ("leader-skew-list", {"op": "leader", "at": T0, "node": "n2", "term": 9, "skew": [1]}),
    ("plan-no-term", {"op": "plan", "at": T0, "fires": [["run", "b", T0 + 30 * S, "n1",
                                                          False]]}),
    ("plan-term-str", {"op": "plan", "at": T0, "term": "2"}),
    ("plan-term-bool", {"op": "plan", "at": T0, "term": True}),
    ("plan-term-old", {"op": "plan", "at": T0, "term": 1, "fires": [
        ["run", "b", T0 + 30 * S, "n1", False]], "place": [[f"b@{T0 + 10 * S}", "n1"]]}),
    ("plan-fires-str", {"op": "plan", "at": T0, "term": 2, "leader": "n1", "fires": "run"}),
    ("plan-fires-short", {"op": "plan", "at": T0, "term": 2, "leader": "n1",
                          "fires": [["run", "b"]]}),
    ("plan-fires-six", {"op": "plan", "at": T0, "term": 2, "leader": "n1",
                        "fires": [["run", "b", T0 + 30 * S, "n1", False, 1]]}),
    ("plan-fires-item-int", {"op": "plan", "at": T0, "term": 2, "leader": "n1", "fires": [1]}),
    ("plan-fires-dict", {"op": "plan", "at": T0, "term": 2, "leader": "n1", "fires": {"a": 1}}),
    ("plan-good-fire-bad-place", {"op": "plan", "at": T0, "term": 2, "leader": "n1",
                                  "fires": [["run", "b", T0 + 30 * S, "n1", False]],
                                  "place": [["x"]]}),
    ("plan-good-fire-bad-drop", {"op": "plan", "at": T0, "term": 2, "leader": "n1",
                                 "fires": [["run", "b", T0 + 30 * S, "n1", False]],
                                 "drop": [[RUN_ID, "shed"]]}),
    ("plan-good-fire-bad-next", {"op": "plan", "at": T0, "term": 2, "leader": "n1",
                                 "fires": [["run", "b", T0 + 30 * S, "n1", False]],
                                 "next": "b"}),
    ("plan-place-str", {"op": "plan", "at": T0, "term": 2, "leader": "n1", "place": "x"}),
    ("plan-next-item-int", {"op": "plan", "at": T0, "term": 2, "leader": "n1", "next": [5]}),
    ("start-no-node", {"op": "start", "at": T0, "items": [[RUN_ID, 1]]}),
    ("start-node-int", {"op": "start", "at": T0, "node": 1, "items": [[RUN_ID, 1]]}),
    ("start-items-str", {"op": "start", "at": T0, "node": "n1", "items": "x"}),
    ("start-items-wide", {"op": "start", "at": T0, "node": "n1", "items": [[RUN_ID, 1, 2]]}),
    ("start-items-mixed", {"op": "start", "at": T0, "node": "n2",
                           "items": [[f"b@{T0}", 3], [RUN_ID]]}),
    ("finish-node-none", {"op": "finish", "at": T0, "node": None, "items": []}),
    ("finish-items-narrow", {"op": "finish", "at": T0, "node": "n1",
                             "items": [[RUN_ID, 1, "succeeded", 0, ""]]}),
    ("finish-items-mixed", {"op": "finish", "at": T0, "node": "n1",
                            "items": [[RUN_ID, 1, "succeeded", 0, "", ""], "x"]}),
    ("release-no-node", {"op": "release", "at": T0, "scope": "all"}),
    ("release-unknown", {"op": "release", "at": T0, "node": "zz", "scope": "all"}),
    ("release-scope", {"op": "release", "at": T0, "node": "n1", "scope": "everything"}),
    ("release-scope-none", {"op": "release", "at": T0, "node": "n1", "scope": None}),
    ("release-reason-int", {"op": "release", "at": T0, "node": "n1", "scope": "all",
                            "reason": 7}),
]


@pytest.mark.parametrize("cmd", [pytest.param(c, id=i) for i, c in GARBAGE])
def test_garbage_rejected_whole_and_changes_nothing(cmd: Any) -> None:
    st = garbage_state()
    err(st, cmd)
    check_indexes(st)


def _batch_garbage() -> list[tuple[str, dict[str, Any]]]:
    hw = T0 + 20 * S  # b's mark
    fence_a = 1
    items = {
        "fires": [
            ["run", "zz", hw + 10 * S, None, False], ["run", "b", str(hw + 10 * S), None, False],
            ["run", "b", hw, "n1", False], ["run", "b", hw - 1, None, False],
            ["run", "b", hw + 10 * S, 5, False], ["run", "b", hw + 10 * S, None, "no"],
            ["run", "b", True, None, False], ["run", "p", hw + 10 * S, None, False],
            ["run", ["b"], hw + 10 * S, None, False], ["run", {"b": 1}, hw, None, False],
            ["miss", "b", hw + 10 * S, hw + 9 * S, 1, "missed", "r"],
            ["miss", "b", hw + 10 * S, hw + 10 * S, 0, "missed", "r"],
            ["miss", "b", hw + 10 * S, hw + 10 * S, 1, "succeeded", "r"],
            ["miss", "b", hw + 10 * S, hw + 10 * S, 1, ["missed"], "r"],
            ["miss", "b", hw + 10 * S, hw + 10 * S, 1, {"x": 1}, "r"],
            ["miss", "b", hw + 10 * S, hw + 10 * S, 1, "missed", 5],
            ["miss", "b", hw, hw, 1, "missed", "r"],
            ["miss", "b", "1", hw + 10 * S, 1, "missed", "r"],
            ["miss", "zz", hw + 10 * S, hw + 10 * S, 1, "missed", "r"],
            ["bogus", "b", 1, 2, 3], [["run"], "b", 1, 2, 3],
            ["run", "b", hw + 10 * S, None, False, 1, 2],
            ["miss", "b", hw + 10 * S, hw + 10 * S, 1],
        ],
        "place": [["zz", "n1"], [RUN_ID, "n2"], [f"b@{T0 + 10 * S}", "ghost"],
                  [f"b@{T0 + 10 * S}", 5], [["x"], "n1"], [f"a@{T0 + 10 * S}", "n1"]],
        "drop": [["zz", "shed", "r"], [RUN_ID, "succeeded", "r"], [RUN_ID, ["shed"], "r"],
                 [RUN_ID, "shed", 5], [[RUN_ID], "shed", "r"], [RUN_ID, {"a": 1}, "r"]],
        "next": [["zz", T0], ["b", hw], ["b", str(T0 * 2)], ["b", True], ["b", 1.5e15],
                 [5, T0]],
    }
    out: list[tuple[str, dict[str, Any]]] = []
    for key, rows in items.items():
        for i, row in enumerate(rows):
            out.append((f"plan-{key}-{i}", {"op": "plan", "at": T0, "term": 2, "leader": "n1",
                                            key: [row]}))
    out.append(("plan-all-together", {"op": "plan", "at": T0, "term": 2, "leader": "n1", **items}))
    start_items = [[RUN_ID, fence_a], [f"b@{T0}", 99], [f"b@{T0 + 10 * S}", 0],
                   ["zz@1", 1], [["x"], 1], [{"a": 1}, 1], [f"b@{T0}", "3"]]
    for i, row in enumerate(start_items):
        out.append((f"start-{i}", {"op": "start", "at": T0, "node": "n2", "items": [row]}))
    finish_items = [
        [RUN_ID, fence_a + 1, "succeeded", 0, "", ""], [RUN_ID, fence_a, "bogus", 0, "", ""],
        [RUN_ID, fence_a, ["failed"], 0, "", ""], [RUN_ID, fence_a, {"x": 1}, 0, "", ""],
        [RUN_ID, fence_a, "succeeded", "0", "", ""], [RUN_ID, fence_a, "succeeded", 0, 1, ""],
        [RUN_ID, fence_a, "succeeded", 0, "", []], [f"a@{T0 + 10 * S}", 0, "cancelled", 0,
                                                     "", ""],
        [[RUN_ID], fence_a, "succeeded", 0, "", ""],
    ]
    for i, row in enumerate(finish_items):
        out.append((f"finish-{i}", {"op": "finish", "at": T0, "node": "n1", "items": [row]}))
    out.append(("finish-wrong-node", {"op": "finish", "at": T0, "node": "n2",
                                      "items": [[RUN_ID, fence_a, "succeeded", 0, "", ""]]}))
    out.append(("finish-all", {"op": "finish", "at": T0, "node": "n1",
                               "items": finish_items}))
    return out


@pytest.mark.parametrize("cmd", [pytest.param(c, id=i) for i, c in _batch_garbage()])
def test_garbage_batch_items_rejected_one_by_one(cmd: dict[str, Any]) -> None:
    st = garbage_state()
    assert st.runs[RUN_ID].fence == 1 and st.runs[RUN_ID].state == "started"
    before = encode_state(st)
    applied = st.applied
    reply = st.apply_map(cmd)
    assert reply["ok"] is True, reply
    rows = reply.get("rejected", reply.get("results"))
    if "results" in reply:
        assert all(r[0] is False for r in rows), rows
    else:
        n = sum(len(cmd.get(k, [])) for k in ("fires", "place", "drop", "next"))
        assert len(rows) == n, rows
    st.applied = applied
    assert encode_state(st) == before
    check_indexes(st)


def test_bad_item_after_good_one_keeps_the_good_one() -> None:
    """Each item of a batch stands alone; an unhashable outcome in a later item must
    not abort the batch half-way (regression: TypeError -> internal error with the
    earlier items already applied)."""
    st = garbage_state()
    reply = st.apply_map({"op": "plan", "at": T0, "term": 2, "leader": "n1", "fires": [
        ["run", "b", T0 + 30 * S, None, False],
        ["miss", "b", T0 + 40 * S, T0 + 40 * S, 1, ["x"], "r"]],
        "drop": [[f"b@{T0}", ["shed"], "r"]]})
    assert reply["ok"] is True
    assert reply["rejected"] == [["miss", "b", T0 + 40 * S], ["drop", f"b@{T0}"]]
    assert st.jobs["b"].hwm_ms == T0 + 30 * S
    fence = st.runs[RUN_ID].fence
    reply = st.apply_map({"op": "finish", "at": T0, "node": "n1", "items": [
        [RUN_ID, fence, ["failed"], 1, "", ""], [RUN_ID, fence, "succeeded", 0, "", ""]]})
    assert reply == {"ok": True, "results": [(False, fence), (True, fence)]}
    check_indexes(st)


def test_apply_never_raises_on_odd_values() -> None:
    st = garbage_state()
    odd: list[Any] = [None, True, -1, 2**63, "", "x" * 300, [], [[]], {}, {"a": [1]}, 1.5,
                      b"raw", [None] * 7]
    keys = ["op", "at", "rid", "spec", "job", "node", "term", "fires", "place", "drop", "next",
            "items", "scope", "reason", "boot", "slots", "queue", "tags", "api", "skew",
            "force", "catch_up", "missed", "max_jobs"]
    ops = ["put_job", "delete_job", "pause", "resume", "trigger", "heartbeat", "leader",
           "plan", "start", "finish", "release"]
    for op in ops:
        for key in keys:
            for value in odd:
                cmd = {"op": op, "at": T0 + 50 * S, "job": "b", "node": "n1", "term": 2,
                       "items": [], key: value}
                reply = st.apply_map(cmd)
                assert isinstance(reply, dict) and isinstance(reply.get("ok"), bool)
                assert reply.get("error", {}).get("code") != "internal", (cmd, reply)
    check_indexes(st)
    encode_state(st)  # still encodable


def test_plan_built_from_an_older_job_version_is_refused_for_that_job() -> None:
    from raftsched.core.leader import Capacity, LeaderContext, plan

    st = base()
    put(st, "j")
    put(st, "k")
    ctx = LeaderContext(node_id="n1", term=1, now_ms=T0, lookahead_ms=100, since_ms=T0 - S,
                        boot_ms=0, live=(Capacity(node_id="n1", tags=frozenset(), slots=4,
                                                  limit=8),))
    stale = plan(st, ctx)
    assert stale is not None and stale.versions == {"j": 1, "k": 1}
    # The job changes between planning and commit: its items must not apply.
    put(st, "j", at=T0 - 10, schedule={"every": "1h"})
    reply = ok(st, stale)
    assert ["run", "j", T0] in reply["rejected"] and ["next", "j"] in reply["rejected"]
    assert f"j@{T0}" not in st.runs and f"k@{T0}" in st.runs
    check_indexes(st)


def test_an_unreadable_entry_is_counted_refused_and_a_repeat_is_answered_as_before():
    """``apply`` takes typed commands only; a map is read first (``commands.read``): one
    that cannot be read is counted, refused with the field named, and changes nothing,
    unless it repeats a request id already answered, which gets that answer."""
    from raftsched.core.commands import Unreadable, read

    st = ClusterState()
    put = {"op": "put_job", "at": T0, "rid": "r1",
           "spec": {"id": "j", "schedule": {"every": "1m"}, "command": ["true"]}}
    first = st.apply(read(put))
    assert first["ok"]
    applied = st.applied
    before = encode_state(st)
    bad = read({"op": "pause", "at": T0 + 1, "rid": "r2", "job": 7})
    assert isinstance(bad, Unreadable) and bad.rid == "r2"
    assert st.apply(bad) == {"ok": False, "error": bad.error}
    assert bad.error["code"] == "invalid_argument" and "job" in bad.error["message"]
    again = read({"op": "pause", "at": T0 + 2, "rid": "r1", "job": 7})
    assert isinstance(again, Unreadable)
    assert st.apply(again) == dict(first, duplicate=True)
    assert st.applied == applied + 2
    st.applied = applied
    assert encode_state(st) == before  # nothing else changed
    assert read({"op": "nope", "at": T0, "rid": "r1"}).rid is None  # type: ignore[union-attr]
    assert read({"op": "pause", "at": -1, "rid": "r1"}).rid is None  # type: ignore[union-attr]
