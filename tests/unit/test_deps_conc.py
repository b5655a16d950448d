"""Dependent jobs, concurrency limits and backfills in the state machine (issue 32 items
1, 2, 4): what each apply does, that refusals name the field, and that replicas agree
(a snapshot restored mid-way goes on exactly as the state that applied the log)."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from raftsched.core.codec import decode_state, encode_state
from raftsched.core.commands import Backfill, BackfillCancel, PutJob
from raftsched.core.machine import ClusterState
from raftsched.core.model import JobSpec
from tests.support.stateutil import hist, ok, state_bytes

pytestmark = pytest.mark.timeout(120)

S = 1000
T0 = 20_000 * 86_400 * S
V5 = 5


def base(nodes: tuple[str, ...] = ("n1", "n2")) -> ClusterState:
    st = ClusterState()
    ok(st, {"op": "leader", "at": T0 - 10 * S, "node": "n1", "term": 1})
    for n in nodes:
        ok(st, {"op": "heartbeat", "at": T0 - 5 * S, "node": n, "boot": 1, "slots": 8,
                "queue": 0, "tags": [], "api": f"{n}:1"})
    return st


def spec(job: str, **over: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"id": job, "schedule": {"every": "10s"}, "command": ["true"]}
    out.update(over)
    if "after" in out:
        out.pop("schedule", None)
    return out


def put(st: ClusterState, job: str, at: int = T0 - 5 * S, **over: Any) -> dict[str, Any]:
    return st.apply_map({"op": "put_job", "at": at, "v": V5, "spec": spec(job, **over)})


def fire(st: ClusterState, job: str, sched: int, node: str | None = "n1") -> None:
    ok(st, {"op": "plan", "at": sched, "fires": [["run", job, sched, node, False]]})


def run_through(st: ClusterState, run_id: str, outcome: str = "succeeded",
                at: int | None = None) -> None:
    """Place (if pending), start and finish ``run_id`` on its node."""
    run = st.runs[run_id]
    at = run.scheduled_ms + S if at is None else at
    if run.state == "pending":
        ok(st, {"op": "plan", "at": at, "place": [[run_id, "n2"]]})
    run = st.runs[run_id]
    ok(st, {"op": "start", "at": at, "node": run.node, "items": [[run_id, run.fence]]})
    ok(st, {"op": "finish", "at": at + S, "node": run.node,
            "items": [[run_id, run.fence, outcome, 0 if outcome == "succeeded" else 1, "",
                       ""]]})


def outcomes(st: ClusterState, job: str) -> list[tuple[str, str]]:
    return [(r.run_id, r.state) for r in hist(st, job)]


# ------------------------------------------------------------------ dependent jobs

def test_child_run_made_in_the_parents_finish() -> None:
    st = base()
    assert put(st, "extract")["ok"]
    assert put(st, "load", after=["extract"])["ok"]
    assert st.jobs["load"].next_ms is None and st.job_view("load")["done"] is False
    fire(st, "extract", T0)
    run_through(st, f"extract@{T0}")
    # Same apply: the child's run exists, for the parent's fire time, pending.
    child = st.runs[f"load@{T0}"]
    assert child.state == "pending" and child.scheduled_ms == T0
    assert child.transitions[-1][4] == "after extract"
    assert child.not_before_ms == T0 + 2 * S  # its grace counts from its making
    run_through(st, f"load@{T0}")
    assert outcomes(st, "load") == [(f"load@{T0}", "succeeded")]


def test_child_runs_on_the_matching_outcome_only() -> None:
    st = base()
    put(st, "p")
    put(st, "ok", after=["p"])
    put(st, "bad", after=["p"], on="failure")
    put(st, "any", after=["p"], on="always")
    fire(st, "p", T0)
    run_through(st, f"p@{T0}", "failed")
    assert set(st.runs) == {f"bad@{T0}", f"any@{T0}"}
    fire(st, "p", T0 + 10 * S)
    run_through(st, f"p@{T0 + 10 * S}")
    assert f"ok@{T0 + 10 * S}" in st.runs and f"bad@{T0 + 10 * S}" not in st.runs


def test_fan_in_waits_for_every_parent_of_the_same_fire_time() -> None:
    st = base()
    put(st, "a")
    put(st, "b")
    put(st, "c", after=["a", "b"])
    fire(st, "a", T0)
    fire(st, "b", T0)
    run_through(st, f"a@{T0}")
    assert f"c@{T0}" not in st.runs
    run_through(st, f"b@{T0}")
    assert f"c@{T0}" in st.runs
    # A failed parent: no child for that fire time.
    fire(st, "a", T0 + 10 * S)
    fire(st, "b", T0 + 10 * S)
    run_through(st, f"a@{T0 + 10 * S}", "failed")
    run_through(st, f"b@{T0 + 10 * S}")
    assert f"c@{T0 + 10 * S}" not in st.runs


def test_retried_parent_makes_its_child_once_at_its_final_outcome() -> None:
    st = base()
    put(st, "p", retries={"max": 1, "backoff": "0s"})
    put(st, "k", after=["p"])
    fire(st, "p", T0)
    run_through(st, f"p@{T0}", "failed")
    assert f"k@{T0}" not in st.runs  # retrying: no outcome yet
    run_through(st, f"p@{T0}", "succeeded", at=T0 + 5 * S)
    assert f"k@{T0}" in st.runs
    run_through(st, f"k@{T0}")
    # A second end of that fire time (a trigger reusing nothing) makes no second child.
    from raftsched.core import deps
    deps.on_run_end(st, st.jobs["p"], hist(st, "p")[-1], T0 + 9 * S)
    assert [r for r, _ in outcomes(st, "k")] == [f"k@{T0}"] and not st.runs


def test_chain_and_paused_child_recorded() -> None:
    st = base()
    put(st, "a")
    put(st, "b", after=["a"])
    put(st, "c", after=["b"])
    fire(st, "a", T0)
    run_through(st, f"a@{T0}")
    run_through(st, f"b@{T0}")
    run_through(st, f"c@{T0}")
    assert outcomes(st, "c") == [(f"c@{T0}", "succeeded")]
    ok(st, {"op": "pause", "at": T0 + 9 * S, "job": "b"})
    fire(st, "a", T0 + 10 * S)
    run_through(st, f"a@{T0 + 10 * S}")
    assert outcomes(st, "b")[-1] == (f"b@{T0 + 10 * S}", "missed")


def test_graph_refusals_name_the_field() -> None:
    st = base()
    put(st, "a")
    r = put(st, "x", after=["nope"])
    assert r["error"]["code"] == "invalid_spec" and r["error"]["message"].startswith("after[0]:")
    put(st, "b", after=["a"])
    r = put(st, "a", after=["b"])  # a -> b -> a
    assert r["error"]["message"].startswith("after: would make a cycle: a -> b -> a")
    r = st.apply_map({"op": "delete_job", "at": T0, "job": "a"})
    assert r["error"]["code"] == "conflict" and r["error"]["message"].startswith("after:")
    with pytest.raises(Exception, match="^after: .*not both"):
        JobSpec.from_spec({"id": "y", "after": ["a"], "schedule": {"every": "1s"},
                           "command": ["x"]})
    with pytest.raises(Exception, match=r"^after\[0\]: a job cannot run after itself"):
        JobSpec.from_spec({"id": "y", "after": ["y"], "command": ["x"]})
    with pytest.raises(Exception, match="^on: must be one of"):
        JobSpec.from_spec({"id": "y", "after": ["a"], "on": "ok", "command": ["x"]})
    with pytest.raises(Exception, match="^on: is only allowed with after"):
        JobSpec.from_spec({"id": "y", "schedule": {"every": "1s"}, "on": "success",
                           "command": ["x"]})
    # Removing the child first, then the parent, is fine.
    ok(st, {"op": "delete_job", "at": T0, "job": "b"})
    ok(st, {"op": "delete_job", "at": T0, "job": "a"})
    assert not st.dependents


def test_atomic_batch_may_name_a_parent_put_later_in_it() -> None:
    st = base()
    ok(st, {"op": "put_jobs", "at": T0, "v": V5, "atomic": True,
            "specs": [spec("k", after=["p"]), spec("p")]})
    assert st.dependents == {"p": {"k"}}
    r = st.apply_map({"op": "put_jobs", "at": T0, "v": V5, "atomic": True,
                  "specs": [spec("q", after=["r"]), spec("r", after=["q"])]})
    assert r["error"]["message"].startswith("specs[")


def test_old_command_versions_refuse_the_new_fields_as_unknown() -> None:
    st = base()
    put(st, "a")
    for v in (4, 2):
        r = st.apply_map({"op": "put_job", "at": T0, "v": v, "spec": spec("k", after=["a"])})
        assert r["error"]["message"].startswith("after: unknown field"), r
        r = st.apply_map({"op": "put_job", "at": T0, "v": v,
                      "spec": spec("k", concurrency={"key": "w", "max": 1})})
        assert r["error"]["message"].startswith("concurrency: unknown field"), r
    # A proposer writes version 5 exactly when a spec carries them.
    assert PutJob(spec=spec("k", after=["a"]), at=1).written().v == V5
    assert PutJob(spec=spec("k"), at=1).written().v == 2


# ------------------------------------------------------------------ concurrency

def test_concurrency_limit_queues_and_dequeues_oldest_first() -> None:
    st = base()
    for j in ("a", "b", "c"):
        put(st, j, concurrency={"key": "wh", "max": 2})
    for j in ("a", "b", "c"):
        fire(st, j, T0)
    assert [st.runs[f"{j}@{T0}"].state for j in "abc"] == ["assigned", "assigned", "queued"]
    assert st.runs[f"c@{T0}"].transitions[-1][4] == "queued: concurrency wh"
    # A place for a queued run is refused by the apply itself.
    r = ok(st, {"op": "plan", "at": T0, "place": [[f"c@{T0}", "n2"]]})
    assert r["rejected"] == [["place", f"c@{T0}"]]
    run_through(st, f"a@{T0}")
    assert st.runs[f"c@{T0}"].state == "pending"
    assert st.table.on_node("wh") == 1 and len(st.table.holding["wh"]) == 2
    run_through(st, f"c@{T0}", at=T0 + 5 * S)
    # Its wait shows in its lateness: it began 5 s after its fire time.
    assert hist(st, "c")[-1].started_ms == T0 + 5 * S


def test_concurrency_skip_policy_records_skipped() -> None:
    st = base()
    put(st, "a", concurrency={"key": "wh", "max": 1, "policy": "skip"})
    put(st, "b", concurrency={"key": "wh", "max": 1, "policy": "skip"})
    fire(st, "a", T0)
    fire(st, "b", T0)
    assert outcomes(st, "b") == [(f"b@{T0}", "skipped")]
    assert hist(st, "b")[0].reason == "concurrency"


def test_concurrency_validation_names_the_field() -> None:
    for bad, field in (({"max": 1}, "concurrency.key"), ({"key": "k"}, "concurrency.max"),
                       ({"key": "k", "max": 0}, "concurrency.max"),
                       ({"key": "k", "max": 1, "policy": "x"}, "concurrency.policy"),
                       ({"key": "k", "max": 1, "x": 1}, "concurrency.x"),
                       ("k", "concurrency")):
        with pytest.raises(Exception, match=f"^{field}: "):
            JobSpec.from_spec(spec("j", concurrency=bad))


def test_key_removed_releases_queued_runs_and_smallest_max_holds() -> None:
    st = base()
    put(st, "a", concurrency={"key": "wh", "max": 3})
    put(st, "b", concurrency={"key": "wh", "max": 1})
    assert st.table.limit("wh") == 1
    fire(st, "a", T0)
    fire(st, "b", T0)
    assert st.runs[f"b@{T0}"].state == "queued"
    put(st, "b")  # no key any more: its queued run goes on
    assert st.runs[f"b@{T0}"].state == "pending"
    assert st.table.limit("wh") == 3


# ------------------------------------------------------------------ backfill

def backfill(st: ClusterState, job: str, fires: list[int], at: int, **over: Any
             ) -> dict[str, Any]:
    cmd = Backfill(job=job, version=st.jobs[job].version, from_ms=fires[0], to_ms=fires[-1],
                   fires=tuple(fires), at=at, **over)
    return st.apply_map(cmd)


def test_backfill_runs_each_fire_time_once_throttled() -> None:
    st = base()
    put(st, "j", at=T0 + 60 * S)  # the job exists from T0+60s: earlier fire times never ran
    fires = [T0 + k * 10 * S for k in range(5)]
    r = backfill(st, "j", fires, T0 + 100 * S, max_active=2)
    assert r["ok"] and r["backfill"]["id"] == "bf-1"
    assert sorted(st.bf_runs) == [f"j@{T0}", f"j@{T0 + 10 * S}"]
    seen = []
    while st.bf_runs:
        run_id = sorted(st.bf_runs)[0]
        seen.append(run_id)
        run_through(st, run_id, at=T0 + 200 * S)
    assert seen == [f"j@{t}" for t in fires]
    bf = st.backfills["bf-1"]
    assert bf.status == "done" and bf.counts == {"created": 5, "succeeded": 5}


def test_backfill_skips_recorded_unless_rerun_which_is_a_new_attempt() -> None:
    st = base()
    put(st, "j", at=T0 - 5 * S)
    fire(st, "j", T0)
    run_through(st, f"j@{T0}", "failed")
    backfill(st, "j", [T0], T0 + 60 * S)
    assert st.backfills["bf-1"].counts == {"skipped": 1}
    backfill(st, "j", [T0], T0 + 61 * S, rerun=True)
    run = st.runs[f"j@{T0}"]
    assert run.attempt == 2
    run_through(st, f"j@{T0}", at=T0 + 70 * S)
    assert outcomes(st, "j") == [(f"j@{T0}", "failed"), (f"j@{T0}", "succeeded")]


def test_backfill_cancel_and_refusals() -> None:
    st = base()
    put(st, "j", at=T0 + 600 * S)
    fires = [T0 + k * 10 * S for k in range(10)]
    backfill(st, "j", fires, T0 + 700 * S, max_active=2)
    ok(st, BackfillCancel(backfill="bf-1", at=T0 + 701 * S))
    bf = st.backfills["bf-1"]
    assert bf.status == "cancelled" and not st.runs and not st.bf_runs
    assert bf.counts == {"created": 2, "cancelled": 2}
    r = backfill(st, "j", [T0 + 800 * S], T0 + 700 * S)
    assert r["error"]["message"].startswith("to:")
    put(st, "k", after=["j"])
    r = backfill(st, "k", [T0], T0 + 700 * S)
    assert r["error"]["message"].startswith("after:")
    cmd = Backfill(job="j", version=7, from_ms=T0, to_ms=T0, fires=(T0,), at=T0 + 700 * S)
    assert st.apply_map(cmd)["error"]["code"] == "conflict"  # not the job's version


def test_backfill_never_blocks_on_time_overlap_and_queue_waits() -> None:
    st = base()
    put(st, "j", at=T0 + 60 * S)
    fire(st, "j", T0 + 70 * S)  # an on-time run, active
    backfill(st, "j", [T0, T0 + 10 * S], T0 + 100 * S)  # overlap queue (default)
    assert not st.bf_runs  # waits for the on-time run
    run_through(st, f"j@{T0 + 70 * S}")
    assert list(st.bf_runs) == [f"j@{T0}"]
    from raftsched.core.leader import plan_input
    inp = plan_input(st, T0 + 200 * S)
    assert [p.backfill for p in inp.pending] == [True]


# ------------------------------------------------------------------ replicas agree

@settings(max_examples=60, deadline=None)
@given(hs.integers(0, 2**32))
def test_restored_snapshot_goes_on_like_the_original(seed: int) -> None:
    """Random finishes of a keyed, dependent, backfilled workload: a replica restored
    from a snapshot at any point and fed the same commands ends byte-identical."""
    rng = random.Random(seed)
    st = base()
    put(st, "a", concurrency={"key": "k", "max": 2})
    put(st, "b", concurrency={"key": "k", "max": 2})
    put(st, "c", after=["a", "b"], on=rng.choice(("success", "always")),
        concurrency={"key": "k", "max": 2})
    cmds: list[Any] = []
    at = T0
    for step in range(30):
        at += S
        job = rng.choice("ab")
        if rng.random() < 0.4:
            cmds.append({"op": "plan", "at": at, "term": 1, "leader": "n1",
                         "fires": [["run", job, at, rng.choice(("n1", None)), False]]})
        elif rng.random() < 0.2 and step > 3:
            t = [T0 - 10 * S * k for k in range(3, 0, -1)]
            cmds.append(Backfill(job=job, version=1, from_ms=t[0], to_ms=t[-1], fires=tuple(t),
                                 at=at, max_active=rng.choice((1, 2))))
        else:
            cmds.append(None)  # drive: place, start or finish something
    replica: ClusterState | None = None
    cut = rng.randrange(len(cmds))
    for i, cmd in enumerate(cmds):
        if i == cut:
            replica = decode_state(encode_state(st))
        if cmd is None:
            cmd = _drive(st, rng, T0 + (i + 1) * S)
            if cmd is None:
                continue
        st.apply_map(cmd)
        # The key's limit holds after every apply, whatever the commands asked.
        assert st.table.on_node("k") <= 2
        assert sum(r.state in ("assigned", "started") for r in st.runs.values()
                   if r.job_id in "abc") <= 2
        if replica is not None:
            replica.apply_map(cmd)
    assert replica is not None
    assert state_bytes(replica) == state_bytes(st)


def _drive(st: ClusterState, rng: random.Random, at: int) -> Any:
    runs = sorted(st.runs.values(), key=lambda r: r.run_id)
    if not runs:
        return None
    run = rng.choice(runs)
    if run.state in ("pending", "queued"):  # a place for a queued run is refused
        return {"op": "plan", "at": at, "term": 1, "leader": "n1",
                "place": [[run.run_id, "n2"]]}
    if run.state == "assigned":
        return {"op": "start", "at": at, "node": run.node, "items": [[run.run_id, run.fence]]}
    if run.state == "started":
        out = rng.choice(("succeeded", "failed"))
        return {"op": "finish", "at": at, "node": run.node,
                "items": [[run.run_id, run.fence, out, 0, "", ""]]}
    return None


def test_the_rolling_upgrade_gate_names_deps() -> None:
    from types import SimpleNamespace

    from raftsched.core.cmdbase import FEATURES
    from raftsched.core.errors import Conflict
    from raftsched.node.service.applyops import Features

    st = ClusterState()
    old = tuple(f for f in FEATURES if f != "deps")
    for nid, features in (("n1", FEATURES), ("n2", old)):
        ok(st, {"op": "heartbeat", "at": T0, "node": nid, "boot": 1, "slots": 1,
                "queue": 0, "features": list(features)})
    gate = Features(raft=SimpleNamespace(read=lambda fn: fn(st)),  # type: ignore[arg-type]
                    config_ids=("n1", "n2"))
    with pytest.raises(Conflict, match="^deps: node.*n2"):
        gate.check("put_job", {"spec": spec("k", after=["a"])})
    with pytest.raises(Conflict, match="^deps: node.*n2"):
        gate.check("put_jobs", {"specs": [spec("k", concurrency={"key": "w", "max": 1})]})
    with pytest.raises(Conflict, match="^deps: node.*n2"):
        gate.check("backfill", {"id": "j"})
    gate.check("put_job", {"spec": spec("k")})


# ------------------------------------------------------------------ the leader's plan

def _ctx(now: int, slots: int = 8) -> Any:
    from raftsched.core.leader import Capacity, LeaderContext
    return LeaderContext(node_id="n1", term=1, now_ms=now, lookahead_ms=500,
                         since_ms=T0 - 60 * S, boot_ms=T0 - 60 * S,
                         live=(Capacity(node_id="n2", tags=frozenset(), slots=slots,
                                        limit=slots),))


def test_the_plan_places_no_more_than_a_keys_max() -> None:
    from raftsched.core.leader import plan
    st = base()
    for j in "abc":
        put(st, j, concurrency={"key": "wh", "max": 2})
    cmd = plan(st, _ctx(T0))
    assert cmd is not None
    nodes = sorted((f.job, f.node) for f in cmd.fires)
    assert [n for _, n in nodes].count("n2") == 2 and [n for _, n in nodes].count(None) == 1
    ok(st, cmd)
    assert [st.runs[f"{j}@{T0}"].state for j in "abc"].count("queued") == 1


def test_backfill_runs_take_only_idle_slots_after_on_time_runs() -> None:
    from raftsched.core.leader import plan
    st = base()
    put(st, "j", at=T0 + 60 * S)
    put(st, "other", at=T0 + 60 * S)
    backfill(st, "j", [T0, T0 + 10 * S], T0 + 65 * S, max_active=2, overlap="allow")
    # One slot: an on-time run of the plan (the fire time at T0+70s) takes it first; the
    # backfill's runs wait for an idle slot.
    cmd = plan(st, _ctx(T0 + 70 * S, slots=1))
    assert cmd is not None and not cmd.place
    assert [f.node for f in cmd.fires] == ["n2"]
    cmd = plan(st, _ctx(T0 + 65 * S, slots=2))  # nothing on time due: idle slots
    assert cmd is not None and sorted(p.run_id for p in cmd.place) == [f"j@{T0}",
                                                                        f"j@{T0 + 10 * S}"]


def test_snapshot_versions_grow_only_when_the_new_state_is_there() -> None:
    from raftsched.core.codec import (
        DEPS_SNAPSHOT_VERSION,
        UNBOUNDED_SNAPSHOT_VERSION,
        state_version,
    )
    st = base()
    put(st, "a")
    assert state_version(encode_state(st)) == UNBOUNDED_SNAPSHOT_VERSION == 1
    put(st, "b", after=["a"], on="failure", concurrency={"key": "k", "max": 3})
    blob = encode_state(st)
    assert state_version(blob) == DEPS_SNAPSHOT_VERSION == 3
    back = decode_state(blob)
    assert back.jobs["b"].spec == st.jobs["b"].spec and back.dependents == {"a": {"b"}}
    assert back.table.job_keys == {"b": "k"} and encode_state(back) == blob
    ok(st, {"op": "delete_job", "at": T0, "job": "b"})
    assert state_version(encode_state(st)) == 1  # nothing of version 3 left
    put(st, "a", at=T0 + 60 * S)
    backfill(st, "a", [T0], T0 + 61 * S)
    blob = encode_state(st)
    assert state_version(blob) == 3 and "bf-1" in decode_state(blob).backfills
    assert encode_state(decode_state(blob)) == blob


def test_a_backfill_run_no_member_can_take_is_recorded_not_waited_for() -> None:
    from raftsched.core.leader import plan
    st = base()
    put(st, "g", at=T0 + 60 * S, tags=["gpu"])
    backfill(st, "g", [T0], T0 + 65 * S)
    # Every node's tags are known (their heartbeats) and none has gpu.
    cmd = plan(st, _ctx(T0 + 65 * S))
    assert cmd is not None and [d.outcome for d in cmd.drop] == ["missed"]
    assert cmd.drop[0].reason.startswith("unplaceable")
    ok(st, cmd)
    assert st.backfills["bf-1"].status == "done"
    assert st.backfills["bf-1"].counts == {"created": 1, "missed": 1}


def test_an_embedded_declaration_may_run_after_another() -> None:
    from raftsched.faces.declare import build_spec

    spec = build_spec(_load, id="load", after=["extract"], concurrency={"key": "w", "max": 1})
    assert "schedule" not in spec and JobSpec.from_spec(spec).after == ("extract",)
    with pytest.raises(Exception, match="^after: .*not both"):
        build_spec(_load, id="load", after=["extract"], every="1s")


def _load(ctx: Any) -> None:
    """A module-level function (a declaration names its import path)."""
