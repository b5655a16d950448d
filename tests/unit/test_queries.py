"""The named reads the node's parts make of the state (raftsched/core/queries.py): each
answers from the state it is given and hands out copies, never a live record."""

from __future__ import annotations

from functools import partial

from raftsched.core import queries
from raftsched.core.records import MemberRecord
from tests.support.stateutil import T0, S, base, finish, hb, ok, put, run_fire, start


def test_job_queries_answer_from_the_state():
    st = base()
    put(st, "a")
    put(st, "b", schedule={"every": "1m"})
    assert sorted(queries.job_ids(st)) == ["a", "b"] and queries.job_count(st) == 2
    assert queries.job_count_and("a", st) == queries.JobCount(exists=True, jobs=2)
    assert queries.job_count_and("zz", st).exists is False
    assert queries.job_spec("zz", st) is None
    assert queries.job_spec("b", st) is st.jobs["b"].spec  # specs are frozen: shared
    found = queries.spec_version("a", st)
    assert found is not None and found.version == st.jobs["a"].version
    assert set(queries.spec_versions(["a", "zz"], st)) == {"a"}
    assert set(queries.job_specs({"a", "b", "zz"}, st)) == {"a", "b"}
    assert queries.paused_mark("a", st) is None  # not paused
    ok(st, {"op": "pause", "at": T0, "job": "a"})
    mark = queries.paused_mark("a", st)
    assert mark is not None and mark.hwm_ms == st.jobs["a"].hwm_ms


def test_done_jobs_are_the_ones_with_nothing_left_to_run():
    st = base()
    put(st, "once", schedule={"at": "2024-10-04T00:00:00Z"})
    put(st, "often", schedule={"every": "1m"})
    run_fire(st, "once", T0, node="n1", at=T0)
    ok(st, {"op": "plan", "at": T0, "term": 1, "next": [["once", None]]})  # no fire after
    run_id = f"once@{T0}"
    start(st, "n1", run_id, st.runs[run_id].fence, T0)
    assert queries.done_jobs(T0 + 60 * S, st) == []  # its run is active
    finish(st, "n1", run_id, st.runs[run_id].fence, T0 + S)
    done = queries.done_jobs(T0 + 60 * S, st)
    assert done == [queries.JobVersion("once", st.jobs["once"].version)]
    assert queries.done_jobs(T0 - S, st) == []  # not quiet long enough


def test_node_and_member_queries():
    st = base(("n1", "n2"))
    hb(st, "n3", at=T0 - 60 * S)
    assert set(queries.alive_nodes(st)) >= {"n1", "n2"}
    assert queries.node_beat("nope", st) == (0, False)
    assert queries.node_api("nope", st) is None
    assert queries.node_hold("n1", st) == queries.NodeHold(held=0, alive=True)
    assert queries.seeded(st) is False and queries.members(st) == []
    st.members["n1"] = MemberRecord(node_id="n1", raft="h:1", api="h:2", status="active",
                                    since_ms=T0)
    st.members["n2"] = MemberRecord(node_id="n2", raft="h:3", api="h:4", status="removed",
                                    since_ms=T0)
    copies = queries.members(st)
    assert [m.node_id for m in copies] == ["n1", "n2"]
    copies[0].status = "removed"  # a copy: the state's record is untouched
    assert st.members["n1"].status == "active"
    assert queries.active_member_count(st) == 1
    assert queries.active_member_apis(st) == ["h:2"]
    assert queries.removed_members(st) == ["n2"]
    assert queries.member_ids_by_raft(st) == {"h:1": "n1", "h:3": "n2"}
    state = queries.member_state("n1", st)
    assert state.record is not None and state.record is not st.members["n1"]
    assert (state.active_members, state.alive) == (1, True)
    assert queries.member_state("n9", st).record is None
    assert [r["node_id"] for r in queries.member_rows(st)] == ["n1", "n2"]


def test_the_status_view_is_the_state_in_one_read():
    st = base()
    put(st, "a", schedule={"every": "1m"})
    run_fire(st, "a", T0, node="n1", at=T0)
    view = queries.status_view(st)
    assert view.jobs == 1 and view.active == len(st.runs) == 1
    assert view.leader == st.leader.to_row() and view.applied == st.applied
    n1 = next(n for n in view.nodes if n["node_id"] == "n1")
    assert n1["inflight"] == 1 and n1["removed"] is False
    view.leader["term"] = 99  # a copy
    assert st.leader.term != 99
    assert partial(queries.job_view, "a")(st)["spec"]["id"] == "a"
