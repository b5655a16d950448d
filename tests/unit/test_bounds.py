"""Start and end bounds on a schedule (issue 32 item 6): ``start``/``end`` in the job
spec; no fire time before ``start`` or after ``end``; a job past its end is ``done``.

Validation names the field; the trigger's functions honour the bounds (a property test
against the unbounded schedule filtered to them), and so the miss detector and the
leader's plans do, also across failovers; bounds survive specs, commands and snapshots,
while a spec without them is written exactly as before they existed."""

from __future__ import annotations

import hashlib
import os
import shutil
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftsched.core import leader
from raftsched.core.cmdbase import BOUNDS_VERSION
from raftsched.core.codec import (
    BOUNDED_SNAPSHOT_VERSION,
    UNBOUNDED_SNAPSHOT_VERSION,
    decode_command,
    decode_state,
    encode_state,
    packb,
    state_version,
)
from raftsched.core.commands import PAST_AT_VERSION, PutJob, PutJobs
from raftsched.core.durations import format_timestamp, parse_timestamp
from raftsched.core.errors import InvalidSpec
from raftsched.core.leader import Capacity, LeaderContext
from raftsched.core.machine import ClusterState
from raftsched.core.misses import classify
from raftsched.core.model import JobSpec, MisfirePolicy, MisfireSpec
from raftsched.core.specrows import spec_to_row
from raftsched.core.trigger import (
    AtSchedule,
    CronSchedule,
    EverySchedule,
    Schedule,
    bounded,
    count_fires,
    fire_times,
    latest_fire_at_or_before,
    next_fire,
    schedule_from_spec,
)
from tests.fixtures.formats import fixture_dir, journal_blobs
from tests.support.budget import examples
from tests.support.stateutil import ok

pytestmark = pytest.mark.timeout(120)

S = 1000
T0 = 20_000 * 86_400 * S  # midnight UTC, a multiple of every interval used here
BASE = {"id": "b", "schedule": {"every": "10s"}, "command": ["true"]}


def ts(ms: int) -> str:
    return format_timestamp(ms)


def refused(spec: dict[str, Any]) -> InvalidSpec:
    with pytest.raises(InvalidSpec) as info:
        JobSpec.from_spec(spec, allowed_call_prefixes=())
    return info.value


# ------------------------------------------------------------------ the spec

def test_bounds_round_trip_and_a_spec_without_them_is_written_as_before() -> None:
    spec = JobSpec.from_spec(dict(BASE, start="2026-01-01T01:00:00+01:00",
                                  end="2026-02-01T00:00:00.250Z"))
    assert spec.schedule.start_ms == parse_timestamp("2026-01-01T00:00:00Z", "t")
    out = spec.to_spec()
    assert out["start"] == "2026-01-01T00:00:00Z" and out["end"] == "2026-02-01T00:00:00.250Z"
    # Read in the order the spec is (schedule, then its bounds).
    assert list(out)[:4] == ["id", "schedule", "start", "end"]
    assert JobSpec.from_spec(out) == spec
    plain = JobSpec.from_spec(BASE).to_spec()
    assert "start" not in plain and "end" not in plain
    only_end = JobSpec.from_spec(dict(BASE, end="2026-02-01T00:00:00Z"))
    assert only_end.schedule.start_ms is None and "start" not in only_end.to_spec()


def test_job_export_writes_the_bounds_after_the_schedule_and_reads_back_equal() -> None:
    import tomllib

    from raftsched.faces.cli_apply import exported, toml_job

    spec = JobSpec.from_spec(dict(BASE, start="2026-01-01T00:00:00Z",
                                  end="2026-02-01T00:00:00Z"))
    text = toml_job(exported(spec.to_spec()))
    assert text.splitlines()[1:4] == ['schedule = { every = "10s" }',
                                      'start = "2026-01-01T00:00:00Z"',
                                      'end = "2026-02-01T00:00:00Z"'], text
    assert JobSpec.from_spec(tomllib.loads(text)) == spec


@pytest.mark.parametrize(("extra", "field", "words"), [
    ({"start": "tomorrow"}, "start", "RFC 3339"),
    ({"end": "2026-01-01T00:00:00"}, "end", "explicit UTC offset"),
    ({"start": None}, "start", "leave the key out"),
    ({"end": 1767225600000}, "end", "not int"),
    ({"start": "2026-01-02T00:00:00Z", "end": "2026-01-01T00:00:00Z"}, "end",
     "must be after start (2026-01-02T00:00:00Z)"),
    ({"start": "2026-01-01T00:00:00Z", "end": "2026-01-01T00:00:00Z"}, "end", "after start"),
    ({"schedule": {"at": "2026-01-01T00:00:00Z"}, "start": "2026-01-01T00:00:01Z"}, "start",
     "is after schedule.at"),
    ({"schedule": {"at": "2026-01-01T00:00:00Z"}, "end": "2025-12-31T23:59:59Z"}, "end",
     "is before schedule.at"),
    ({"ends": "2026-01-01T00:00:00Z"}, "ends", "did you mean 'end'"),
    ({"start": "0000-01-01T00:00:00Z"}, "start", ""),
])
def test_a_bad_bound_is_refused_naming_its_field(extra: dict[str, Any], field: str,
                                                 words: str) -> None:
    exc = refused(dict(BASE, **extra))
    assert exc.field == field and words in exc.message, exc.message


def test_bounds_are_inclusive_and_an_at_on_them_is_accepted() -> None:
    at, later = "2026-01-01T00:00:00Z", "2026-01-01T00:00:01Z"
    for bounds in ({"start": at, "end": later}, {"start": "2025-01-01T00:00:00Z", "end": at}):
        spec = JobSpec.from_spec(dict(BASE, schedule={"at": at}, **bounds))
        assert next_fire(spec.schedule, 0) == parse_timestamp(at, "t")


# ------------------------------------------------------------------ the trigger

_CRONS = ("* * * * *", "*/7 * * * * *", "0 3 * * *", "30 2 * * *", "0 0 1 * *")


@st.composite
def schedules(draw: Any) -> Schedule:
    kind = draw(st.sampled_from(["every", "at", "cron"]))
    if kind == "every":
        every = draw(st.sampled_from([1, 7, 60, 3600, 86_400])) * S
        return EverySchedule(every_ms=every, offset_ms=draw(st.integers(0, every - 1)))
    if kind == "at":
        return AtSchedule(at_ms=T0 + draw(st.integers(-3 * 86_400, 3 * 86_400)) * S)
    return schedule_from_spec({"cron": draw(st.sampled_from(_CRONS)),
                               "tz": draw(st.sampled_from(["UTC", "Europe/Berlin"]))})


#: Instants around T0 (seconds, a few days either way).
_near = st.integers(-3 * 86_400, 3 * 86_400).map(lambda s: T0 + s * S)


@settings(max_examples=examples(150), deadline=None)
@given(sched=schedules(), start=st.one_of(st.none(), _near), span=st.integers(1, 2 * 86_400),
       no_end=st.booleans(), after=_near, width=st.integers(0, 86_400))
def test_bounded_fire_times_are_the_unbounded_ones_within_the_bounds(
        sched: Schedule, start: int | None, span: int, no_end: bool, after: int,
        width: int) -> None:
    end = None if no_end else (start if start is not None else T0) + span * S
    b = bounded(sched, start, end)

    def inside(t: int) -> bool:
        return (start is None or t >= start) and (end is None or t <= end)

    until = after + width * S
    unbounded = fire_times(sched, after, until, 2000)
    want = [t for t in unbounded if inside(t)]
    if len(unbounded) < 2000:  # the whole range was listed
        assert fire_times(b, after, until, 2000) == want
        assert count_fires(b, after, until) == len(want)
        assert latest_fire_at_or_before(b, after, until) == (want[-1] if want else None)
    first = next_fire(b, after)
    assert first is None or inside(first)
    # The first unbounded fire time after `after` that the bounds let through.
    t = next_fire(sched, after if start is None else max(after, start - 1))
    assert first == (t if t is not None and inside(t) else None)


@settings(max_examples=examples(100), deadline=None)
@given(sched=schedules(), start=_near, span=st.integers(1, 86_400), hwm=_near,
       now=_near, policy=st.sampled_from(list(MisfirePolicy)), grace=st.integers(0, 3600))
def test_the_miss_detector_never_runs_or_misses_outside_the_bounds(
        sched: Schedule, start: int, span: int, hwm: int, now: int, policy: MisfirePolicy,
        grace: int) -> None:
    end = start + span * S
    b = bounded(sched, start, end)
    res = classify(schedule=b, hwm_ms=min(hwm, now), now_ms=now, lookahead_ms=500,
                   misfire=MisfireSpec(policy=policy, grace_ms=grace * S, max_catchup=3),
                   reason="no_leader")
    for t in res.run:
        assert start <= t <= end
    for m in res.missed:
        assert start <= m.first_ms <= m.last_ms <= end
        assert m.count == count_fires(b, m.first_ms - 1, m.last_ms)


# ------------------------------------------------------------------ the state machine

def fresh(nodes: int = 3) -> ClusterState:
    # History far above the fire times a test makes: the default 100 per job drops the
    # oldest records, which would then look like fire times without an outcome.
    state = ClusterState(history_limit=10_000)
    ok(state, {"op": "leader", "at": T0 - 60 * S, "node": "n1", "term": 1})
    for i in range(1, nodes + 1):
        ok(state, {"op": "heartbeat", "at": T0 - 60 * S, "node": f"n{i}", "boot": 1,
                   "slots": 50, "queue": 0, "tags": [], "api": ""})
    return state


def put(state: ClusterState, at: int, v: int = BOUNDS_VERSION, **spec: Any) -> dict[str, Any]:
    return state.apply_map({"op": "put_job", "at": at, "v": v, "spec": dict(BASE, **spec)})


def ctx(state: ClusterState, node: str, term: int, now: int, since: int) -> LeaderContext:
    live = tuple(Capacity(node_id=n, tags=frozenset(), slots=r.slots, limit=r.slots,
                          load=len(state.by_node.get(n, ())))
                 for n, r in sorted(state.nodes.items()) if r.alive)
    return LeaderContext(node_id=node, term=term, now_ms=now, lookahead_ms=250,
                         since_ms=since, boot_ms=0, live=live)


def finish_all(state: ClusterState, at: int) -> None:
    """Every assigned run starts and succeeds on its node."""
    for run in list(state.runs.values()):
        if run.state == "assigned":
            ok(state, {"op": "start", "at": at, "node": run.node,
                       "items": [[run.run_id, run.fence]]})
            ok(state, {"op": "finish", "at": at, "node": run.node,
                       "items": [[run.run_id, run.fence, "succeeded", 0, "", ""]]})


def outcomes(state: ClusterState, job: str) -> dict[int, int]:
    """fire time -> how many records it has (runs, and missed ranges expanded)."""
    out: dict[int, int] = {}
    sched = state.jobs[job].spec.schedule
    for run in [*state.history.get(job, ()), *(state.runs[r] for r in state.jobs[job].active)]:
        times = [run.scheduled_ms] if run.until_ms is None else \
            [run.scheduled_ms, *fire_times(sched, run.scheduled_ms, run.until_ms, 10_000)]
        for t in times:
            out[t] = out.get(t, 0) + 1
    return out


@settings(max_examples=examples(40), deadline=None)
@given(start_s=st.integers(-30, 60), span_s=st.integers(1, 120),
       ticks=st.lists(st.integers(1, 25), min_size=5, max_size=40),
       failovers=st.sets(st.integers(0, 39), max_size=4))
def test_plans_across_failovers_run_each_fire_time_once_and_none_outside_the_bounds(
        start_s: int, span_s: int, ticks: list[int], failovers: set[int]) -> None:
    """Leaders plan at irregular times (gaps: an election, a slow leader) and change
    term; every fire time in the bounds gets exactly one record, none outside them, and
    once the end has passed the job is done."""
    state = fresh()
    start, end = T0 + start_s * S, T0 + (start_s + span_s) * S
    put_at = T0 - 5 * S
    assert put(state, put_at, schedule={"every": "1s"}, start=ts(start), end=ts(end),
               overlap="allow",
               misfire={"policy": "all", "grace": "5s", "max_catchup": 1000})["ok"]
    now, term, node, since = T0 - 5 * S, 1, "n1", T0 - 60 * S
    for i, step in enumerate(ticks):
        now += step * 300
        if i in failovers:
            term += 1
            node = f"n{term % 3 + 1}"
            since = now
            ok(state, {"op": "leader", "at": now, "node": node, "term": term})
        for _ in range(20):  # a catch-up may take several plans
            cmd = leader.plan(state, ctx(state, node, term, now, since))
            if cmd is None:
                break
            state.apply_map(cmd)
        finish_all(state, now)
    seen = outcomes(state, "b")
    assert all(start <= t <= end for t in seen), sorted(seen)
    assert all(n == 1 for n in seen.values()), seen
    # Every fire time in the bounds up to now has its record (a catch-up runs them
    # all); those up to the lookahead may have one already.
    in_bounds = range(max(start, put_at + S), end + 1, S)
    assert {t for t in in_bounds if t <= now} <= set(seen) <= {t for t in in_bounds
                                                              if t <= now + 250}
    if now > end:
        job = state.job_view("b")
        assert job["next_ms"] is None and job["done"] is True


def test_a_put_whose_end_has_passed_is_accepted_and_done_at_once() -> None:
    """No fire time is lost: a new job's accounting starts at the put, so a past end
    leaves it none (a past `at` beyond its grace is refused: that fire time would never
    get an outcome)."""
    state = fresh()
    assert put(state, T0, start=ts(T0 - 3600 * S), end=ts(T0 - 60 * S))["ok"]
    job = state.job_view("b")
    assert job["done"] is True and job["next_ms"] is None
    assert leader.plan(state, ctx(state, "n1", 1, T0 + 20 * S, T0 - 60 * S)) is None
    # Putting it again with a later end brings it back, from now on.
    assert put(state, T0 + 1, end=ts(T0 + 30 * S))["ok"]
    assert state.job_view("b")["next_ms"] == T0 + 10 * S


def test_a_start_in_the_future_holds_fire_until_then() -> None:
    state = fresh()
    assert put(state, T0, start=ts(T0 + 95 * S))["ok"]
    assert state.jobs["b"].next_ms == T0 + 100 * S
    assert leader.plan(state, ctx(state, "n1", 1, T0 + 50 * S, T0 - 60 * S)) is None


def test_changing_only_the_bounds_of_a_past_at_does_not_run_it_again() -> None:
    state = fresh()
    at = T0 + 5 * S
    assert put(state, T0, schedule={"at": ts(at)})["ok"]
    state.apply_map(leader.plan(state, ctx(state, "n1", 1, at, T0 - 60 * S)))
    finish_all(state, at + 1)
    assert state.job_view("b")["done"]
    # Long past its grace: a new `at` would be refused; the same one with an end is not.
    assert put(state, at + 3600 * S, schedule={"at": ts(at)}, end=ts(at + 7200 * S))["ok"]
    job = state.job_view("b")
    assert job["done"] and job["spec"]["end"] == ts(at + 7200 * S)


def test_a_trigger_and_a_resume_respect_the_bounds() -> None:
    state = fresh()
    assert put(state, T0, end=ts(T0 + 25 * S))["ok"]
    ok(state, {"op": "pause", "at": T0 + 1, "job": "b"})
    ok(state, {"op": "resume", "at": T0 + 60 * S, "job": "b", "catch_up": False,
               "missed": 2})
    job = state.job_view("b")
    assert job["done"] and job["next_ms"] is None
    [miss] = state.history["b"]
    assert (miss.scheduled_ms, miss.until_ms, miss.count) == (T0 + 10 * S, T0 + 20 * S, 2)
    # A manual run is no fire time: it may still be asked for.
    assert ok(state, {"op": "trigger", "at": T0 + 61 * S, "job": "b"})["run_id"] == \
        f"b@{T0 + 61 * S}"


# ------------------------------------------------------------------ commands and versions

def test_a_put_carrying_bounds_is_written_as_version_4_and_one_without_as_before() -> None:
    bounded_spec = dict(BASE, end=ts(T0 + 60 * S))
    assert PutJob(spec=bounded_spec, at=T0).written().v == BOUNDS_VERSION
    assert PutJobs(specs=(BASE, bounded_spec), at=T0).written().v == BOUNDS_VERSION
    plain = PutJob(spec=BASE, at=T0)
    assert plain.written() is plain and plain.v == 2
    # A past `at` and bounds: the newest version carries both meanings.
    past = dict(BASE, schedule={"at": ts(T0 - S)}, end=ts(T0 + S))
    assert PutJob(spec=past, at=T0).written().v == BOUNDS_VERSION > PAST_AT_VERSION
    blob = PutJob(spec=bounded_spec, at=T0).written().encode()
    assert decode_command(blob) is not None and msgpack.unpackb(blob)["v"] == 4


@pytest.mark.parametrize("v", [1, 2, 3])
def test_a_command_older_than_bounds_holding_them_is_refused_as_its_release_refused_it(
        v: int) -> None:
    """Such a command was refused by the release that wrote it (an unknown field): a
    replay refuses it too, or the state would part from the one it had."""
    state = fresh()
    reply = put(state, T0, v=v, start=ts(T0), end=ts(T0 + 60 * S))
    assert not reply["ok"] and reply["error"]["code"] == "invalid_spec"
    assert reply["error"]["message"].startswith("end: unknown field"), reply
    assert "b" not in state.jobs
    reply = state.apply_map({"op": "put_jobs", "at": T0, "v": v, "atomic": True,
                         "specs": [dict(BASE, start=ts(T0))]})
    assert not reply.get("ok") or not reply["results"][0]["ok"]
    reply = state.apply_map({"op": "apply", "at": T0, "v": v,
                         "specs": [dict(BASE, start=ts(T0))]})
    assert not reply["ok"] and "start: unknown field" in reply["error"]["message"]
    assert not state.jobs


# ------------------------------------------------------------------ snapshots

def _fixture_state(tmp_path: Any) -> ClusterState:
    journal = os.path.join(str(tmp_path), "raft.journal")
    shutil.copy(os.path.join(fixture_dir("format-v2"), "journal", "raft.journal"), journal)
    state = ClusterState()
    for blob in journal_blobs(journal):
        state.apply_map(decode_command(blob))
    return state


def test_jobs_without_bounds_snapshot_to_the_bytes_of_the_release_before(tmp_path: Any) -> None:
    """The jobs of the format fixture's journal, replayed, encode to the very bytes the
    release before bounds wrote (hash taken with that release, commit e8b0153), in a
    version-1 snapshot an older release still reads."""
    blob = encode_state(_fixture_state(tmp_path))
    d = msgpack.unpackb(blob, raw=False)
    assert d["v"] == UNBOUNDED_SNAPSHOT_VERSION == state_version(blob)
    assert hashlib.sha256(packb(d["jobs"])).hexdigest() == \
        "bbf6b5ffe0fc151d9cfa1605b9f759235c0400a782d3f81fce402a45678fef94"
    assert all(len(row[0]) == 13 for row in d["jobs"])


def test_bounds_survive_a_snapshot_written_as_version_2() -> None:
    state = fresh()
    assert put(state, T0, start=ts(T0 + 95 * S), end=ts(T0 + 300 * S))["ok"]
    assert put(state, T0, id="plain")["ok"]
    blob = encode_state(state)
    assert state_version(blob) == BOUNDED_SNAPSHOT_VERSION == 2
    back = decode_state(blob)
    assert back.jobs["b"].spec == state.jobs["b"].spec
    assert back.jobs["b"].spec.schedule.end_ms == T0 + 300 * S
    assert back.jobs["plain"].spec.schedule.end_ms is None
    assert encode_state(back) == blob
    assert len(spec_to_row(state.jobs["b"].spec)) == 14
    assert len(spec_to_row(state.jobs["plain"].spec)) == 13
    # The bounded job gone, the state is written as version 1 again.
    ok(state, {"op": "delete_job", "at": T0 + 1, "job": "b"})
    assert state_version(encode_state(state)) == UNBOUNDED_SNAPSHOT_VERSION


def test_equal_bounded_schedules_are_shared_on_restore() -> None:
    state = fresh()
    for job in ("a", "b"):
        assert put(state, T0, id=job, end=ts(T0 + 300 * S))["ok"]
    back = decode_state(encode_state(state))
    assert back.jobs["a"].spec.schedule is back.jobs["b"].spec.schedule
    assert isinstance(back.jobs["a"].spec.schedule, EverySchedule)
    assert not isinstance(back.jobs["a"].spec.schedule, CronSchedule)


def test_the_rolling_upgrade_gate_names_bounds() -> None:
    from types import SimpleNamespace

    from raftsched.core.cmdbase import FEATURES
    from raftsched.core.errors import Conflict
    from raftsched.node.service.applyops import Features

    state = ClusterState()
    old = tuple(f for f in FEATURES if f != "bounds")
    for nid, features in (("n1", FEATURES), ("n2", old)):
        ok(state, {"op": "heartbeat", "at": T0, "node": nid, "boot": 1, "slots": 1,
                   "queue": 0, "features": list(features)})
    gate = Features(raft=SimpleNamespace(read=lambda fn: fn(state)),  # type: ignore[arg-type]
                    config_ids=("n1", "n2"))
    with pytest.raises(Conflict, match="^bounds: node.*n2"):
        gate.check("put_job", {"spec": dict(BASE, end=ts(T0))})
    with pytest.raises(Conflict, match="^bounds: node"):
        gate.check("apply", {"specs": [dict(BASE, start=ts(T0))]})
    gate.check("put_job", {"spec": BASE})
