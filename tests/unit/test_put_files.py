"""Issue 12 item 6: a job file is one change — ``put_jobs`` with ``atomic`` puts every
spec or none, and a refused one leaves the state byte-identical."""

from __future__ import annotations

from typing import Any

from raftsched.core.machine import ClusterState
from tests.support.stateutil import forget_refusal, ok, state_bytes

S = 1000
T0 = 20_000 * 86_400 * S


def _spec(job: str, **over: Any) -> dict[str, Any]:
    return dict({"id": job, "schedule": {"every": "1m"}, "command": ["true"]}, **over)



def _state() -> ClusterState:
    st = ClusterState()
    ok(st, {"op": "put_job", "at": T0, "spec": _spec("m1")})
    st.take_effects()
    return st


def test_atomic_put_with_one_invalid_spec_changes_nothing_and_names_it() -> None:
    st = _state()
    before = state_bytes(st)
    reply = st.apply_map({"op": "put_jobs", "at": T0 + S, "atomic": True, "rid": "file-1",
                      "specs": [_spec("m5"), _spec("m1", timeout="5m"),
                                _spec("m6", schedule={"cron": "61 * * * *"})]})
    assert not reply["ok"]
    assert reply["error"]["code"] == "invalid_spec"
    assert reply["error"]["message"].startswith("specs[2].schedule"), reply
    remembered = dict(st.dedupe)
    forget_refusal(st, {"rid": "file-1"}, reply)
    assert state_bytes(st) == before
    st.dedupe.update(remembered)
    assert st.take_effects() == []
    assert "m5" not in st.jobs and st.jobs["m1"].version == 1
    # The refusal is remembered under its request id (a late copy changes nothing); a
    # fixed file is a new request, with a new id.
    again = st.apply_map({"op": "put_jobs", "at": T0 + 2 * S, "atomic": True, "rid": "file-1",
                      "specs": [_spec("m5"), _spec("m1", timeout="5m")]})
    assert again == dict(reply, duplicate=True) and "m5" not in st.jobs
    reply = ok(st, {"op": "put_jobs", "at": T0 + 2 * S, "atomic": True, "rid": "file-2",
                    "specs": [_spec("m5"), _spec("m1", timeout="5m")]})
    assert [(r["job"], r["version"], r["created"]) for r in reply["results"]] == \
        [("m5", 1, True), ("m1", 2, False)]


def test_atomic_put_refuses_an_id_twice_and_going_over_max_jobs() -> None:
    st = _state()
    before = state_bytes(st)
    reply = st.apply_map({"op": "put_jobs", "at": T0, "atomic": True,
                      "specs": [_spec("a"), _spec("a")]})
    assert not reply["ok"] and reply["error"]["message"].startswith("specs[1].id"), reply
    reply = st.apply_map({"op": "put_jobs", "at": T0, "atomic": True, "max_jobs": 2,
                      "specs": [_spec("a"), _spec("b"), _spec("m1")]})
    assert not reply["ok"] and reply["error"]["code"] == "limit_exceeded", reply
    assert state_bytes(st) == before
    # Updating existing jobs needs no room.
    ok(st, {"op": "put_jobs", "at": T0, "atomic": True, "max_jobs": 1, "specs": [_spec("m1")]})


def test_non_atomic_bulk_put_still_refuses_only_the_bad_spec() -> None:
    st = _state()
    reply = ok(st, {"op": "put_jobs", "at": T0, "specs": [_spec("x"), _spec("y", overlap="no")]})
    assert [r["ok"] for r in reply["results"]] == [True, False]
    assert "x" in st.jobs and "y" not in st.jobs


def test_atomic_flag_must_be_a_boolean() -> None:
    st = _state()
    before = state_bytes(st)
    reply = st.apply_map({"op": "put_jobs", "at": T0, "atomic": "yes", "specs": [_spec("x")]})
    assert not reply["ok"] and reply["error"]["message"].startswith("atomic")
    assert state_bytes(st) == before
