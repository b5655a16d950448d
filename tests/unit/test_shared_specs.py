"""Snapshot version 4: a large job table writes each distinct spec row once.

The threshold (``SHARED_SPECS_MIN_JOBS``) is lowered to 0 here, so that the states of
the snapshot tests in ``test_codec`` are written as version 4 and must come back the
same: byte-identical re-encoding, equal specs, the same behaviour after a restore, and
refusal of a broken blob.
"""

from __future__ import annotations

import os
from dataclasses import fields, replace
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftsched.core import codec
from raftsched.core.cmdbase import DEPS_VERSION, FEATURES, SHARED_SPECS_FEATURE
from raftsched.core.codec import (
    DEPS_SNAPSHOT_VERSION,
    SNAPSHOT_VERSION,
    UNBOUNDED_SNAPSHOT_VERSION,
    decode_state,
    encode_state,
    packb,
    state_version,
)
from raftsched.core.errors import ProtocolError
from raftsched.core.machine import ClusterState
from raftsched.core.model import JobSpec
from raftsched.core.records import JobRecord, LazyJobRecord, stored_spec
from raftsched.core.specclone import same_but_id, with_id
from raftsched.core.specrows import SHARED_SPECS_MIN_JOBS
from tests.support.budget import examples
from tests.unit.test_codec import SPECS, T0, _log, _replay
from tests.unit.test_codec import test_equal_parts_of_jobs_are_one_object as _equal_parts
from tests.unit.test_codec import test_restored_state_behaves_like_the_original as _behaves
from tests.unit.test_codec import test_snapshot_round_trip_is_identical as _round_trip
from tests.unit.test_codec import test_truncated_or_padded_snapshot_is_refused as _truncated

pytestmark = pytest.mark.timeout(60)

S = 1000


@pytest.fixture
def any_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """A state of any size is large enough for the shared spec table."""
    monkeypatch.setattr(codec, "SHARED_SPECS_MIN_JOBS", 0)


@pytest.fixture
def shared(any_size: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every state is written with the shared spec table (its nodes' heartbeats, if
    any, need not list the feature)."""
    monkeypatch.setattr(codec, "_all_read_shared_specs", lambda st: True)


def _doc(blob: bytes) -> dict[str, Any]:
    return msgpack.unpackb(blob, raw=False)


# ------------------------------------------------------------ test_codec's checks, v4

@pytest.mark.usefixtures("shared")
def test_the_snapshot_checks_hold_for_the_shared_table() -> None:
    assert state_version(encode_state(_replay(_log()))) == SNAPSHOT_VERSION == 4
    _round_trip()
    _behaves()
    _truncated()
    _equal_parts(restored=True)


#: A version-4 snapshot written by the release that introduced it (the state of
#: ``test_codec._log``): later releases must read it (docs/operations.md).
FIXTURE = os.path.join(os.path.dirname(__file__), os.pardir, "fixtures", "snapshot-v4.msgpack")


@pytest.mark.usefixtures("shared")
def test_the_first_version_4_snapshot_still_reads() -> None:
    with open(FIXTURE, "rb") as f:
        blob = f.read()
    assert state_version(blob) == 4
    back, then = decode_state(blob), _replay(_log())
    assert {j: r.spec for j, r in back.jobs.items()} == {j: r.spec for j, r in then.jobs.items()}
    assert set(back.runs) == set(then.runs) and back.applied == then.applied
    assert encode_state(back) == blob


# ------------------------------------------------------------ what version 4 writes

@pytest.mark.usefixtures("shared")
def test_equal_specs_are_written_once_and_each_job_names_its_row() -> None:
    st = ClusterState()
    for i in range(5):
        st.apply_map({"op": "put_job", "at": T0, "spec": dict(SPECS[0], id=f"a{i}")})
    st.apply_map({"op": "put_job", "at": T0, "spec": SPECS[1]})
    d = _doc(encode_state(st))
    assert len(d["specs"]) == 2
    assert [row[:2] for row in d["jobs"]] == [["a0", 0], ["a1", 0], ["a2", 0], ["a3", 0],
                                              ["a4", 0], [SPECS[1]["id"], 1]]
    back = decode_state(encode_state(st))
    for job_id, rec in st.jobs.items():
        assert back.jobs[job_id].spec == rec.spec and back.jobs[job_id].spec.id == job_id


def test_a_small_state_keeps_the_bytes_older_releases_read() -> None:
    st = ClusterState()
    for i in range(3):
        st.apply_map({"op": "put_job", "at": T0, "spec": dict(SPECS[0], id=f"a{i}")})
    blob = encode_state(st)
    assert state_version(blob) == UNBOUNDED_SNAPSHOT_VERSION and "specs" not in _doc(blob)


def test_the_threshold_switches_to_the_shared_table() -> None:
    st = ClusterState()
    specs = [dict(SPECS[0], id=f"j{i:05d}") for i in range(SHARED_SPECS_MIN_JOBS)]
    for part in (specs[:-1], specs[-1:]):
        for i in range(0, len(part), 1000):  # put_jobs takes 1..1000 specs
            assert st.apply_map({"op": "put_jobs", "at": T0, "specs": part[i:i + 1000]})["ok"]
        if len(st.jobs) < SHARED_SPECS_MIN_JOBS:
            assert state_version(encode_state(st)) == UNBOUNDED_SNAPSHOT_VERSION
    blob = encode_state(st)
    assert state_version(blob) == SNAPSHOT_VERSION and len(_doc(blob)["specs"]) == 1
    back = decode_state(blob)
    assert len(back.jobs) == SHARED_SPECS_MIN_JOBS and encode_state(back) == blob


@pytest.mark.usefixtures("any_size")
def test_a_member_of_an_older_release_keeps_the_old_form() -> None:
    """A snapshot goes to any follower: while one member's release does not read
    version 4 (its heartbeats lack ``specs``), the state is written as before."""
    st = ClusterState()
    old = tuple(f for f in FEATURES if f != SHARED_SPECS_FEATURE)
    for nid, features in (("n1", FEATURES), ("n2", old)):
        st.apply_map({"op": "heartbeat", "at": T0, "node": nid, "boot": 1, "slots": 1,
                      "queue": 0, "features": list(features)})
    st.apply_map({"op": "put_job", "at": T0, "spec": SPECS[0]})
    assert state_version(encode_state(st)) == UNBOUNDED_SNAPSHOT_VERSION
    st.apply_map({"op": "heartbeat", "at": T0 + S, "node": "n2", "boot": 2, "slots": 1,
                  "queue": 0, "features": list(FEATURES)})  # n2 upgraded
    assert state_version(encode_state(st)) == SNAPSHOT_VERSION
    # A third node of an older release holds it back again.
    st.apply_map({"op": "heartbeat", "at": T0 + 2 * S, "node": "n3", "boot": 1,
                  "slots": 1, "queue": 0, "features": list(old)})
    assert state_version(encode_state(st)) == UNBOUNDED_SNAPSHOT_VERSION


@pytest.mark.usefixtures("any_size")
def test_with_a_membership_only_its_members_count_and_a_removed_one_no_longer() -> None:
    """Once the membership is replicated, the members not removed are the ones whose
    releases must read version 4: a removed node of an older release stops holding the
    form back; a member that has sent no heartbeat is not waited for."""
    st = ClusterState()
    old = tuple(f for f in FEATURES if f != SHARED_SPECS_FEATURE)
    seed = [{"node": f"n{i}", "raft": f"127.0.0.1:700{i}", "api": f"127.0.0.1:710{i}"}
            for i in (1, 2, 3)]
    assert st.apply_map({"op": "member", "action": "seed", "members": seed, "at": 1})["ok"]
    for nid, features in (("n1", FEATURES), ("n2", FEATURES), ("n3", old)):
        assert st.apply_map({"op": "heartbeat", "at": T0, "node": nid, "boot": 1,
                             "slots": 1, "queue": 0, "features": list(features)})["ok"]
    st.apply_map({"op": "put_job", "at": T0, "spec": SPECS[0]})
    assert state_version(encode_state(st)) == UNBOUNDED_SNAPSHOT_VERSION  # n3 is old
    assert st.apply_map({"op": "member", "action": "remove", "node": "n3",
                         "raft": "127.0.0.1:7003", "api": "127.0.0.1:7103",
                         "at": T0 + S})["ok"]
    assert state_version(encode_state(st)) == SNAPSHOT_VERSION
    assert st.apply_map({"op": "member", "action": "add", "node": "n4",
                         "raft": "127.0.0.1:7004", "api": "127.0.0.1:7104",
                         "at": T0 + 2 * S})["ok"]
    assert state_version(encode_state(st)) == SNAPSHOT_VERSION  # no heartbeat from n4 yet


# ------------------------------------------------------------ with_id

def test_with_id_copies_every_field_but_the_id() -> None:
    """A field added to JobSpec and missed by the copy would be an unset slot: reading
    it raises. Every field here has a value other than its default."""
    spec = JobSpec.from_spec({
        "id": "full", "schedule": {"cron": "*/5 * * * *", "tz": "Europe/Berlin"},
        "start": "2026-01-01T00:00:00Z", "end": "2030-01-01T00:00:00Z",
        "command": ["echo", "x"], "timeout": "5m", "overlap": "queue",
        "misfire": {"policy": "all", "grace": "30s", "max_catchup": 3},
        "retries": {"max": 2, "backoff": "1s", "backoff_max": "10s"},
        "on_node_lost": "fail", "tags": ["gpu"], "jitter": "2s", "paused": True,
        "env": {"A": "1"}, "notify": {"on": ["failed"], "url": "https://h/x"},
        "concurrency": {"key": "k", "max": 2}})
    copy = with_id(spec, "other")
    assert copy == replace(spec, id="other") and copy.id == "other"
    for f in fields(JobSpec):
        if f.name != "id":
            assert getattr(copy, f.name) is getattr(spec, f.name), f.name
    assert hash(copy) == hash(replace(spec, id="other"))
    assert same_but_id(copy, spec) and same_but_id(spec, copy)
    for f in fields(JobSpec):
        if f.name != "id":  # every field is compared: one other object in it differs
            assert not same_but_id(replace(spec, **{f.name: object()}), spec), f.name
    assert not same_but_id(replace(spec, env=dict(spec.env)), spec)  # equal, not same


# ------------------------------------------------------------ broken blobs

def _shared_blob() -> bytes:
    st = ClusterState()
    for i in range(3):
        st.apply_map({"op": "put_job", "at": T0, "spec": dict(SPECS[0], id=f"a{i}")})
    return encode_state(st)


@pytest.mark.usefixtures("shared")
@pytest.mark.parametrize("index", [1, -1, "0", None, 1.0], ids=repr)
def test_a_job_naming_no_spec_row_is_refused(index: Any) -> None:
    d = _doc(_shared_blob())
    d["jobs"][1][1] = index
    with pytest.raises(ProtocolError):
        decode_state(packb(d))


@pytest.mark.usefixtures("shared")
def test_a_row_takes_the_previous_rows_times_only_when_they_are_the_same_exact_ints() -> None:
    # JobTable.record reuses the previous row's time objects when equal (rows put by one
    # command repeat them); an equal bool or float must keep its own type, as share() does.
    d = _doc(_shared_blob())
    d["jobs"][1][3:7] = d["jobs"][0][3:7]
    d["jobs"][2][3:7] = [True, 1.0, d["jobs"][0][5], None]
    d["jobs"][0][3:5] = [1, 1]
    d["jobs"][1][3:5] = [1, 1]
    jobs = [r for _, r in sorted(decode_state(packb(d)).jobs.items())]
    times = [(r.created_ms, r.updated_ms, r.hwm_ms, r.next_ms) for r in jobs]
    assert all(a is b for a, b in zip(times[0], times[1], strict=True))
    assert [type(t) for t in times[2]] == [bool, float, int, type(None)]
    assert times[2][:2] == (True, 1.0) and times[2][2] is times[0][2]


@pytest.mark.parametrize("active", [None, [], ["j@1", "j@2"]], ids=repr)
def test_a_restored_job_record_is_the_one_init_makes(active: Any) -> None:
    # JobRecord.restored skips __init__ for speed: every slot must still be set, as
    # __init__ sets it (a slot added to one and not the other fails here).
    spec = JobSpec.from_spec(SPECS[0])
    args = dict(version=3, created_ms=1, updated_ms=2, hwm_ms=3, next_ms=None, active=active,
                last=("j@0", "succeeded", "", 4))
    made = JobRecord(spec, **args)
    restored = JobRecord.restored(spec, spec.id, *args.values())
    assert type(restored) is JobRecord
    for name in JobRecord.__slots__:
        assert getattr(restored, name) == getattr(made, name), name
        assert type(getattr(restored, name)) is type(getattr(made, name)), name
    if active:
        assert restored.active is not active  # its own list, as __init__ copies it


@pytest.mark.usefixtures("shared")
def test_version_4_without_its_spec_rows_is_refused() -> None:
    d = _doc(_shared_blob())
    del d["specs"]
    with pytest.raises(ProtocolError, match="without shared spec rows"):
        decode_state(packb(d))
    d = _doc(_shared_blob())
    d["specs"] = [["not", "a", "row"]]
    with pytest.raises(ProtocolError):
        decode_state(packb(d))


def test_an_older_version_ignores_a_specs_key() -> None:
    """Readers skip keys they do not know within a version: ``specs`` means something
    only in version 4, whose job rows are shaped for it."""
    st = _replay(_log())
    d = _doc(encode_state(st))
    assert d["v"] < SNAPSHOT_VERSION
    d["specs"] = [[1, 2, 3]]
    assert encode_state(decode_state(packb(d))) == encode_state(st)


# ------------------------------------------------------------ any table, both forms

_TEMPLATES = [
    {"schedule": {"every": "10s"}, "command": ["echo", "a"]},
    {"schedule": {"cron": "0 * * * *"}, "call": "bench.noop:noop", "tags": ["x"]},
    {"schedule": {"every": "1m"}, "command": ["true"], "start": "2026-01-01T00:00:00Z"},
    {"schedule": {"every": "1h"}, "call": "bench.noop:noop",
     "concurrency": {"key": "k", "max": 1}, "env": {"K": "v"}},
]


@settings(max_examples=examples(40), deadline=None)
@given(st.lists(st.tuples(st.integers(0, 60), st.sampled_from(range(len(_TEMPLATES))),
                          st.booleans()), max_size=25))
def test_both_forms_decode_to_the_same_state(jobs: list[tuple[int, int, bool]]) -> None:
    state = ClusterState()
    for num, tpl, paused in jobs:
        # At the version that knows ``start`` and ``concurrency`` (without "v", a
        # command is of version 1, which refuses them).
        reply = state.apply_map({"op": "put_job", "at": T0 + num * S, "v": DEPS_VERSION,
                                 "spec": dict(_TEMPLATES[tpl], id=f"j{num}", paused=paused)})
        assert reply["ok"], reply
    plain = encode_state(state)
    assert state_version(plain) in (UNBOUNDED_SNAPSHOT_VERSION, 2, DEPS_SNAPSHOT_VERSION)
    old = codec.SHARED_SPECS_MIN_JOBS
    codec.SHARED_SPECS_MIN_JOBS = 0
    try:
        shared = encode_state(state)
        back = decode_state(shared)
        assert encode_state(back) == shared
        # A job's spec is its last put's template, paused as its first put was (a put
        # keeps the paused flag: pause and resume change it).
        final = {num: tpl for num, tpl, _ in jobs}
        paused_first = {num: paused for num, _, paused in reversed(jobs)}
        rows = {(final[n], paused_first[n]) for n in final}
        if len(rows) < len(final):  # two jobs of one spec row
            assert any(type(r) is LazyJobRecord for r in back.jobs.values())
    finally:
        codec.SHARED_SPECS_MIN_JOBS = old
    assert state_version(shared) == SNAPSHOT_VERSION
    assert len(_doc(shared)["specs"]) <= len(jobs)
    # Restored from the shared table, the state writes the plain bytes again: it is
    # the same state, to the byte.
    assert encode_state(back) == plain
    assert {j: r.spec for j, r in back.jobs.items()} == \
        {j: r.spec for j, r in state.jobs.items()}
    assert back.due == decode_state(plain).due and back.dependents == state.dependents
    assert back.table.job_keys == state.table.job_keys


# ------------------------------------------------------------ a restored spec, made when read

def _put_state() -> ClusterState:
    """Jobs put from three templates, four each, in one bulk put per template."""
    state = ClusterState()
    state.apply_map({"op": "heartbeat", "at": T0, "node": "n1", "boot": 1, "slots": 4,
                     "queue": 0, "tags": ["x"], "api": ""})
    state.apply_map({"op": "leader", "at": T0, "node": "n1", "term": 1})
    for tpl in range(3):
        reply = state.apply_map({"op": "put_jobs", "at": T0 + S, "v": DEPS_VERSION,
                                 "specs": [dict(_TEMPLATES[tpl], id=f"t{tpl}-{i}")
                                           for i in range(4)]})
        assert all(r["ok"] for r in reply["results"]), reply
    # One finished run: a restore looks up what its kept record holds ahead.
    fire = T0 + 10 * S
    state.apply_map({"op": "plan", "at": fire, "term": 1, "leader": "n1",
                     "fires": [["run", "t0-2", fire, "n1", False]]})
    fence = state.runs[f"t0-2@{fire}"].fence
    state.apply_map({"op": "start", "at": fire + 1, "node": "n1",
                     "items": [[f"t0-2@{fire}", fence]]})
    state.apply_map({"op": "finish", "at": fire + 2, "node": "n1",
                     "items": [[f"t0-2@{fire}", fence, "succeeded", 0, "", ""]]})
    assert [r.state for r in state.history["t0-2"]] == ["succeeded"]
    return state


def _plain(state: ClusterState) -> ClusterState:
    """``state`` with every job's own spec made (no lazy record left)."""
    for rec in list(state.jobs.values()):
        assert rec.spec.id == rec.job_id
    assert not any(type(r) is LazyJobRecord for r in state.jobs.values())
    return state


def _lazy_pair() -> tuple[ClusterState, ClusterState]:
    """The state of :func:`_put_state` with every spec made, and that state restored
    from its shared table (the first job of each row has its spec; the others are
    lazy)."""
    state = _plain(_put_state())
    old = codec.SHARED_SPECS_MIN_JOBS
    codec.SHARED_SPECS_MIN_JOBS = 0
    try:
        return state, decode_state(encode_state(state))
    finally:
        codec.SHARED_SPECS_MIN_JOBS = old


#: Every command that reads or replaces a job's spec, for jobs of :func:`_put_state`.
_MORE: list[dict[str, Any]] = [
    {"op": "put_job", "at": T0 + 2 * S, "spec": dict(_TEMPLATES[0], id="t0-1")},
    {"op": "put_job", "at": T0 + 2 * S, "spec": dict(_TEMPLATES[1], id="t1-1", tags=["y"])},
    {"op": "put_job", "at": T0 + 2 * S, "v": DEPS_VERSION,
     "spec": dict(_TEMPLATES[3], id="t0-3", after=["t1-3"])},
    {"op": "pause", "at": T0 + 3 * S, "job": "t0-2"},
    {"op": "resume", "at": T0 + 4 * S, "job": "t0-2", "missed": 0},
    {"op": "pause", "at": T0 + 4 * S, "job": "t2-1"},
    {"op": "delete_job", "at": T0 + 5 * S, "job": "t2-2"},
    {"op": "plan", "at": T0 + 11 * S, "term": 1, "leader": "n1", "place": [],
     "fires": [["run", "t0-3", T0 + 10 * S, None, False], ["run", "t0-1", T0 + 10 * S,
                                                          None, False]]},
    {"op": "put_jobs", "at": T0 + 12 * S, "v": DEPS_VERSION, "specs": [
        dict(_TEMPLATES[2], id="t2-3", command=["false"])]},
    {"op": "put_jobs", "at": T0 + 13 * S, "v": DEPS_VERSION, "specs": [
        dict(_TEMPLATES[3], id=f"c-{i}") for i in range(3)]},
    {"op": "plan", "at": T0 + 3601 * S, "term": 1, "leader": "n1", "place": [],
     "fires": [["run", "c-1", T0 + 3600 * S, None, False],
               ["run", "t1-2", T0 + 3600 * S, "n1", False]]},
]


def _same_behaviour(lazy: ClusterState, plain: ClusterState) -> None:
    assert type(lazy.jobs["t1-2"]) is LazyJobRecord  # planned below, not read before
    for cmd in _MORE:
        assert lazy.apply_map(cmd) == plain.apply_map(cmd), cmd
    assert encode_state(lazy) == encode_state(plain)
    assert lazy.due == plain.due and lazy.table.job_keys == plain.table.job_keys
    assert {j: r.to_dict() for j, r in lazy.jobs.items()} == \
        {j: r.to_dict() for j, r in plain.jobs.items()}


@pytest.mark.usefixtures("shared")
def test_a_restore_its_indexes_and_its_snapshot_make_no_spec_per_job() -> None:
    state, back = _lazy_pair()
    lazy = sorted(j for j, r in back.jobs.items() if type(r) is LazyJobRecord)
    assert lazy == sorted(f"t{tpl}-{i}" for tpl in range(3) for i in range(1, 4))
    for job_id in lazy:  # the slot holds the first job's spec of the same row
        rec = back.jobs[job_id]
        assert rec.job_id == job_id and stored_spec(rec).id == job_id.split("-")[0] + "-0"
    # The derived indexes and a snapshot were made from the stored specs alone.
    assert back.due == decode_state(encode_state(state)).due
    assert back.dependents == state.dependents and back.table.job_keys == state.table.job_keys
    assert encode_state(back) == encode_state(state)
    assert sorted(j for j, r in back.jobs.items() if type(r) is LazyJobRecord) == lazy


@pytest.mark.usefixtures("shared")
def test_a_lazy_record_reads_as_the_job_it_is_and_is_plain_from_then() -> None:
    state, back = _lazy_pair()
    rec = back.jobs["t1-2"]
    spec = rec.spec
    assert type(rec) is JobRecord and rec.spec is spec and stored_spec(rec) is spec
    assert spec == state.jobs["t1-2"].spec and spec.id == "t1-2"
    assert same_but_id(spec, back.jobs["t1-0"].spec)
    assert back.jobs["t1-2"].to_dict() == state.jobs["t1-2"].to_dict()
    # Written before it was read: the new spec is kept, the record plain.
    other = back.jobs["t2-3"]
    other.spec = replace(state.jobs["t2-3"].spec, paused=True)
    assert type(other) is JobRecord and other.spec.paused and other.spec.id == "t2-3"


@pytest.mark.usefixtures("shared")
def test_a_restored_state_of_lazy_records_behaves_like_the_original() -> None:
    # On jobs not read since the restore: both states answer alike and end byte for
    # byte the same.
    state, back = _lazy_pair()
    _same_behaviour(back, state)


def test_a_put_copied_from_a_template_holds_the_template_and_behaves_the_same() -> None:
    lazy = _put_state()
    # A bulk put reads its first spec and copies it for the others (an earlier test's
    # template may stand for the first one too).
    # t0-2's run read its spec: that one is plain.
    held = {j for j, r in lazy.jobs.items() if type(r) is LazyJobRecord}
    assert held >= {f"t{tpl}-{i}" for tpl in range(3) for i in range(1, 4)} - {"t0-2"}
    assert "t0-2" not in held
    for job_id in held:
        rec = lazy.jobs[job_id]
        assert rec.job_id == job_id and stored_spec(rec).id != job_id
    _same_behaviour(lazy, _plain(_put_state()))
