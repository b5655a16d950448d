"""Tests for raftsched.core.codec: commands, frames, spec rows and state snapshots."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftsched.core.codec import (
    COMMAND_VERSION,
    COMMAND_VERSIONS,
    SNAPSHOT_VERSION,
    UNBOUNDED_SNAPSHOT_VERSION,
    decode_command,
    decode_state,
    encode_command,
    encode_state,
    packb,
    unpackb,
)
from raftsched.core.errors import FrameTooLarge, ProtocolError
from raftsched.core.machine import ClusterState
from raftsched.core.model import JobSpec, RunState
from raftsched.core.records import MAX_TRANSITIONS, RunRecord
from raftsched.core.specrows import spec_from_row, spec_to_row
from raftsched.wire.framing import encode_frame, frame_length
from tests.support.budget import examples

#: A command version no release of this code reads.
NEWER_COMMAND_VERSION = max(COMMAND_VERSIONS) + 1

pytestmark = pytest.mark.timeout(60)

S = 1000
T0 = 20_000 * 86_400 * S


# --------------------------------------------------------------------- commands

COMMANDS: list[dict[str, Any]] = [
    {"op": "put_job", "at": T0, "rid": "r1",
     "spec": {"id": "j", "schedule": {"every": "10s"}, "command": ["echo", "héllo"]}},
    {"op": "plan", "at": T0, "term": 3, "leader": "n1",
     "fires": [["run", "j", T0, "n1", False], ["miss", "j", 1, 2, 2, "missed", "no_leader"]],
     "place": [], "drop": [], "next": [["j", None]]},
    {"op": "finish", "at": 2**63, "node": "n1", "items": [["j@1", 7, "failed", -3, "t", ""]]},
    {"op": "heartbeat", "at": 0, "node": "n", "boot": 1, "slots": 2, "queue": 0, "tags": [],
     "api": "127.0.0.1:1", "blob": b"\x00\xff"},
]


@pytest.mark.parametrize("cmd", COMMANDS)
def test_command_round_trip(cmd: dict[str, Any]) -> None:
    blob = encode_command(cmd)
    assert isinstance(blob, bytes)
    out = decode_command(blob)
    assert out == dict(cmd, v=COMMAND_VERSION)
    assert "v" not in cmd  # the caller's dict is not changed
    assert decode_command(bytearray(blob)) == out


@pytest.mark.parametrize("blob", [
    None, "text", 5, [b"x"], {"op": "x"}, memoryview(b"\x80"),
    b"", b"\xc1", b"\x92\x01", b"\x81\xa1v", b"\xdd\xff\xff\xff\xff",
    packb([1, 2, 3]), packb("op"), packb(None),
    packb({"op": "put_job", "at": 1}),                       # no version
    packb({"op": "put_job", "at": 1, "v": NEWER_COMMAND_VERSION}),
    packb({"op": "put_job", "at": 1, "v": 0}),
    packb({"op": "put_job", "at": 1, "v": "1"}),
    packb({"op": "put_job", "at": 1, "v": None}),
    packb({1: "int key", "v": 1}),                           # non-str map key
    packb({"v": 1}) + b"trailing",
])
def test_decode_command_rejects(blob: Any) -> None:
    assert decode_command(blob) is None


@settings(max_examples=examples(200), deadline=None)
@given(st.binary(max_size=64))
def test_decode_command_never_raises(blob: bytes) -> None:
    out = decode_command(blob)
    assert out is None or (isinstance(out, dict) and out.get("v") == COMMAND_VERSION)


_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.text(max_size=8)
    | st.binary(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner,
                                                               max_size=4),
    max_leaves=12)


@settings(max_examples=examples(100), deadline=None)
@given(st.dictionaries(st.text(max_size=6).filter(lambda k: k != "v"), _values, max_size=6))
def test_command_round_trip_property(cmd: dict[str, Any]) -> None:
    assert decode_command(encode_command(cmd)) == dict(cmd, v=COMMAND_VERSION)


def test_unpackb_errors_are_protocol_errors() -> None:
    with pytest.raises(ProtocolError):
        unpackb(b"\xc1")
    with pytest.raises(ProtocolError):
        unpackb(packb([1] * 10), max_len=5)
    assert unpackb(packb({"a": [1, b"x"]})) == {"a": [1, b"x"]}


def test_frames() -> None:
    frame = encode_frame({"op": "ping"})
    size = frame_length(frame[:4], 1 << 20)
    assert size == len(frame) - 4
    assert unpackb(frame[4:]) == {"op": "ping"}
    with pytest.raises(FrameTooLarge):
        frame_length((1 << 20).to_bytes(4, "big"), 1000)


# --------------------------------------------------------------------- spec rows

SPECS = [
    {"id": "a", "schedule": {"every": "10s"}, "command": ["true"]},
    {"id": "b", "schedule": {"every": "1h", "offset": "5m"}, "call": "pkg.mod:fn",
     "timeout": "2m", "overlap": "queue", "on_node_lost": "fail", "jitter": "3s",
     "paused": True, "tags": ["z", "a"], "env": {"K": "v", "A": "1"},
     "misfire": {"policy": "all", "grace": "0s", "max_catchup": 1000},
     "retries": {"max": 100, "backoff": "0s", "backoff_max": "7d"}},
    {"id": "c", "schedule": {"cron": "30 2 * * *", "tz": "Europe/Berlin"},
     "command": ["x", "--flag", ""]},
    {"id": "d", "schedule": {"at": "2026-12-01T00:00:00.5Z"}, "command": ["x"]},
]


@pytest.mark.parametrize("raw", SPECS, ids=lambda r: r["id"])
def test_spec_row_round_trip(raw: dict[str, Any]) -> None:
    spec = JobSpec.from_spec(raw)
    row = spec_to_row(spec)
    back = spec_from_row(unpackb(packb(row)))
    assert back == spec
    assert back.to_spec() == spec.to_spec()
    assert spec_to_row(back) == row


def test_spec_rows_share_equal_parts() -> None:
    from raftsched.core.specrows import Interner as _Interner
    intern = _Interner()
    a = spec_from_row(spec_to_row(JobSpec.from_spec(SPECS[0])), intern)
    b = spec_from_row(spec_to_row(JobSpec.from_spec(dict(SPECS[0], id="a2"))), intern)
    assert a.schedule is b.schedule and a.misfire is b.misfire


# --------------------------------------------------------------------- snapshots

def _log() -> list[dict[str, Any]]:
    """A log that leaves something in every part of the state."""
    log: list[dict[str, Any]] = [
        {"op": "leader", "at": T0 - 10 * S, "node": "n1", "term": 1, "skew": {"n2": 4}},
        {"op": "heartbeat", "at": T0 - 9 * S, "node": "n2", "boot": 1, "slots": 2,
         "queue": 1, "tags": ["gpu"], "api": "h:1"},
        {"op": "heartbeat", "at": T0 - 9 * S, "node": "n1", "boot": 1, "slots": 2,
         "queue": 0, "tags": [], "api": "h:2"},
    ]
    for raw in SPECS:
        log.append({"op": "put_job", "at": T0 - 5 * S, "spec": raw, "rid": f"put-{raw['id']}"})
    log += [
        {"op": "plan", "at": T0, "term": 1, "leader": "n1",
         "fires": [["run", "a", T0, "n1", False], ["run", "c", T0, "n2", False],
                   ["miss", "c", T0 + 1, T0 + 5, 2, "missed", "no_leader"]],
         "next": [["a", T0 + 10 * S]]},
        {"op": "start", "at": T0 + 1, "node": "n1", "items": [[f"a@{T0}", 1]]},
        {"op": "finish", "at": T0 + 2, "node": "n1",
         "items": [[f"a@{T0}", 1, "succeeded", 0, "tail", ""]]},
        {"op": "trigger", "at": T0 + 3, "job": "a", "rid": "t-1"},
        {"op": "trigger", "at": T0 + 3, "job": "b", "force": True},
        {"op": "release", "at": T0 + 4, "node": "n2", "scope": "all", "reason": "gone"},
        {"op": "trigger", "at": T0 + 5, "job": "zzz"},            # rejected
        {"op": "pause", "at": T0 + 6, "job": "c"},
    ]
    return log


def _replay(log: list[dict[str, Any]], **kw: Any) -> ClusterState:
    st = ClusterState(**kw)
    for cmd in log:
        st.apply_map(decode_command(encode_command(cmd)))
    return st


def test_snapshot_round_trip_is_identical() -> None:
    st = _replay(_log())
    blob = encode_state(st)
    back = decode_state(blob)
    assert encode_state(back) == blob
    assert back.fence == st.fence and back.applied == st.applied
    assert set(back.runs) == set(st.runs)
    assert back.by_node == {n: s for n, s in st.by_node.items() if s}
    assert set(back.pending) == set(st.pending)
    assert back.next_due_ms() == st.next_due_ms()
    for job in st.jobs:
        assert back.jobs[job].spec == st.jobs[job].spec
        assert back.run_views(job, 100) == st.run_views(job, 100)
    assert back.dedupe == st.dedupe


def test_restored_state_behaves_like_the_original() -> None:
    log = _log()
    st = _replay(log)
    back = decode_state(encode_state(st))
    more = [
        {"op": "put_job", "at": T0 + 10, "spec": SPECS[0], "rid": "put-a"},  # duplicate
        {"op": "heartbeat", "at": T0 + 11, "node": "n2", "boot": 2, "slots": 2, "queue": 0,
         "tags": [], "api": ""},
        {"op": "plan", "at": T0 + 12, "term": 1, "leader": "n1",
         "place": [[r, "n2"] for r in sorted(st.pending)],
         "fires": [["run", "a", T0 + 10 * S, None, False]]},
        {"op": "delete_job", "at": T0 + 13, "job": "b"},
        {"op": "resume", "at": T0 + 14, "job": "c", "missed": 0},
    ]
    for cmd in more:
        assert st.apply_map(cmd) == back.apply_map(cmd)
    assert encode_state(st) == encode_state(back)


def test_two_replicas_applying_the_same_log_are_identical() -> None:
    log = _log()
    assert encode_state(_replay(log)) == encode_state(_replay(log))


def test_insertion_order_does_not_matter() -> None:
    """Jobs and nodes put in different orders (same times) give the same bytes."""
    def build(order: list[str]) -> bytes:
        st = ClusterState()
        for n in order:
            st.apply_map({"op": "heartbeat", "at": T0, "node": f"n-{n}", "boot": 1, "slots": 1,
                      "queue": 0})
        for j in order:
            st.apply_map({"op": "put_job", "at": T0, "spec": dict(SPECS[0], id=j)})
        return encode_state(st)

    assert build(["a", "b", "c"]) == build(["c", "a", "b"]) == build(["b", "c", "a"])


def test_restore_then_encode_is_identical_for_reordered_states() -> None:
    st1, st2 = ClusterState(), ClusterState()
    for j in ("x", "y"):
        st1.apply_map({"op": "put_job", "at": T0, "spec": dict(SPECS[0], id=j)})
    for j in ("y", "x"):
        st2.apply_map({"op": "put_job", "at": T0, "spec": dict(SPECS[0], id=j)})
    b1, b2 = encode_state(st1), encode_state(st2)
    assert b1 == b2
    assert encode_state(decode_state(b1)) == b1


def test_snapshot_is_versioned() -> None:
    blob = encode_state(_replay(_log()))
    d = msgpack.unpackb(blob, raw=False)
    # No job has bounds: written in the version before them (byte for byte as then).
    assert d["v"] == UNBOUNDED_SNAPSHOT_VERSION
    for bad_v in (SNAPSHOT_VERSION + 1, 0, "1", None):
        bad = dict(d, v=bad_v)
        with pytest.raises(ProtocolError):
            decode_state(packb(bad))
    no_v = {k: v for k, v in d.items() if k != "v"}
    with pytest.raises(ProtocolError):
        decode_state(packb(no_v))
    for garbage in (b"", b"\xc1", packb([1, 2]), packb("state")):
        with pytest.raises(ProtocolError):
            decode_state(garbage)


def test_snapshot_keeps_history_limit() -> None:
    st = _replay(_log(), history_limit=3)
    back = decode_state(encode_state(st))
    assert back.history_limit == 3
    assert all(h.maxlen == 3 for h in back.history.values())


# --------------------------------------------------------------------- memory at scale

def _twins(st: ClusterState) -> tuple[Any, Any]:
    return st.jobs["b"], st.jobs["b2"]


def _put_twins() -> ClusterState:
    """Two jobs equal but for their ids, put by one bulk command, as clients do."""
    st = ClusterState()
    specs = [JobSpec.from_spec(dict(SPECS[1], id=i)).to_spec() for i in ("b", "b2")]
    cmd = {"op": "put_jobs", "at": T0, "rid": "bulk", "specs": specs}
    assert st.apply_map(decode_command(encode_command(cmd)))["ok"]
    return st


@pytest.mark.parametrize("restored", [False, True], ids=["applied", "restored"])
def test_equal_parts_of_jobs_are_one_object(restored: bool) -> None:
    """A million jobs made from one template must not hold a million copies of its
    strings, sub-records and times (W4: bytes per job after a put and a restart)."""
    st = _put_twins()
    if restored:
        st = decode_state(encode_state(st))
    a, b = _twins(st)
    for name in ("schedule", "call", "timeout_ms", "misfire", "retries", "tags", "env"):
        assert getattr(a.spec, name) is getattr(b.spec, name), name
    assert a.created_ms is b.created_ms and a.hwm_ms is b.hwm_ms
    assert a.active == () and b.active == ()


def test_active_runs_go_back_to_the_shared_empty_tuple() -> None:
    st = ClusterState()
    st.apply_map({"op": "put_job", "at": T0, "spec": SPECS[0]})
    run_id = st.apply_map({"op": "trigger", "at": T0 + 1, "job": "a"})["run_id"]
    assert st.jobs["a"].active == [run_id]
    st.apply_map({"op": "pause", "at": T0 + 2, "job": "a"})  # cancels the pending run
    assert st.jobs["a"].active == () and run_id not in st.runs
    assert decode_state(encode_state(st)).jobs["a"].active == ()


_opt_int = st.none() | st.integers(0, 2**53)
_transition = st.tuples(st.integers(0, 2**53), st.sampled_from([s.value for s in RunState]),
                        st.none() | st.text(max_size=4), st.integers(0, 2**40),
                        st.text(max_size=8))


@settings(max_examples=examples(200), deadline=None)
@given(st.builds(
    RunRecord, run_id=st.text(max_size=12), job_id=st.text(max_size=8),
    scheduled_ms=st.integers(0, 2**53), created_ms=st.integers(0, 2**53),
    state=st.sampled_from([s.value for s in RunState]), attempt=st.integers(1, 100),
    fence=st.integers(0, 2**40), node=st.none() | st.text(max_size=4),
    reason=st.text(max_size=8), assigned_ms=_opt_int, started_ms=_opt_int,
    finished_ms=_opt_int, exit_code=st.none() | st.integers(-255, 255),
    tail=st.text(max_size=16), not_before_ms=st.integers(0, 2**53), manual=st.booleans(),
    until_ms=_opt_int, count=st.integers(1, 1000),
    transitions=st.lists(_transition, max_size=MAX_TRANSITIONS)))
def test_a_runs_snapshot_row_is_the_bytes_of_its_fields_as_lists(run: RunRecord) -> None:
    """The row is a tuple built in one C call (a writer encodes every kept run); what it
    writes must stay the bytes of the field-by-field list older releases wrote, and read
    back to the same record."""
    fields = [getattr(run, name) for name in RunRecord._FIELDS[:-1]]
    as_lists = fields + [[list(t) for t in run.transitions]]
    assert packb(run.to_row()) == packb(as_lists)
    back = RunRecord.from_row(unpackb(packb(run.to_row())))
    assert back.to_dict() == run.to_dict()


def test_truncated_or_padded_snapshot_is_refused() -> None:
    blob = encode_state(_replay(_log()))
    for bad in (blob[:len(blob) // 2], blob[:-1], blob + packb(0)):
        with pytest.raises(ProtocolError):
            decode_state(bad)


def test_a_map_keeps_the_version_it_names_and_one_without_is_current() -> None:
    """A map naming ``v`` is encoded as that version (a v6 resume replayed as v2 means
    something else); one naming none is this release's."""
    from raftsched.core.cmdbase import HELD_IDS_VERSION

    cmd = {"op": "resume", "at": 1, "job": "j1", "v": HELD_IDS_VERSION}
    assert decode_command(encode_command(cmd))["v"] == HELD_IDS_VERSION  # type: ignore[index]
    bare = {"op": "resume", "at": 1, "job": "j1"}
    assert decode_command(encode_command(bare))["v"] == COMMAND_VERSION  # type: ignore[index]
