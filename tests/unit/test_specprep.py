"""Issue 13 item 1: a put's (and an apply's) specs are read before the state lock is taken.

``from_wire`` (run by the replica outside the lock, alike on every replica) prepares
each spec; the apply only checks it against the state and stores it. These tests pin
that the apply reads no spec and finds no fire time under the lock, and that a put
prepared this way leaves the very state (bytes) and reply a put prepared in the apply
leaves, whatever the batch holds: copies of one template, near-copies that differ in a
value's type, bad ids, invalid specs, existing jobs, a late ``at``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from raftsched.core import jobs, model, specprep, trigger
from raftsched.core.commands import from_wire
from raftsched.core.machine import ClusterState
from tests.support.budget import examples
from tests.support.stateutil import ok, state_bytes

S = 1000
T0 = 20_000 * 86_400 * S



def _base() -> ClusterState:
    st = ClusterState()
    ok(st, {"op": "put_job", "at": T0 - 60 * S,
            "spec": {"id": "old", "schedule": {"cron": "*/5 * * * *"}, "command": ["true"],
                     "env": {"A": "secret"}}})
    st.take_effects()
    return st


def _template(i: int) -> dict[str, Any]:
    zones = ("UTC", "Europe/Berlin", "Asia/Kathmandu")
    crons = ("* * * * *", "*/10 * * * * *", "30 2 * * *")
    return {"id": f"j{i:04d}", "schedule": {"cron": crons[i % 3], "tz": zones[i % 5 % 3]},
            "call": "bench.noop:stamp", "misfire": {"policy": "skip", "grace": "60s"}}


def test_the_apply_of_a_decoded_bulk_put_reads_no_spec_and_finds_no_fire_time(
        monkeypatch: pytest.MonkeyPatch) -> None:
    st = _base()
    wire = {"op": "put_jobs", "at": T0, "atomic": True,
            "specs": [_template(i) for i in range(1000)]}
    parsed = from_wire(wire)  # what the replica does before it takes the lock

    def forbidden(*_a: Any, **_k: Any) -> Any:
        raise AssertionError("called under the state lock")
    monkeypatch.setattr(model.JobSpec, "from_spec", classmethod(forbidden))
    for module in (jobs, specprep, trigger):
        if hasattr(module, "next_fire"):
            monkeypatch.setattr(module, "next_fire", forbidden)
    reply = st.apply(parsed, 1)
    assert reply["ok"] and len(reply["results"]) == 1000, reply
    assert st.jobs["j0001"].next_ms is not None
    assert st.jobs["j0001"].spec.schedule is st.jobs["j0004"].spec.schedule  # shared


def test_the_apply_of_a_prepared_job_file_diffs_and_reads_nothing_under_the_lock(
        monkeypatch: pytest.MonkeyPatch) -> None:
    st = _base()
    specs = [_template(i) for i in range(1000)]
    ok(st, {"op": "put_jobs", "at": T0, "specs": specs})
    wire = {"op": "apply", "at": T0 + S,
            "specs": [dict(sp, timeout="10m") for sp in specs[:600]]
            + [dict(sp, schedule={"every": "1m"}) for sp in specs[600:]]}
    parsed = from_wire(wire)
    st.prepare(parsed)

    def forbidden(*_a: Any, **_k: Any) -> Any:
        raise AssertionError("called under the state lock")
    monkeypatch.setattr(model.JobSpec, "from_spec", classmethod(forbidden))
    monkeypatch.setattr(model.JobSpec, "to_spec", forbidden)
    for module in (jobs, specprep, trigger):
        if hasattr(module, "next_fire"):
            monkeypatch.setattr(module, "next_fire", forbidden)
    reply = st.apply(parsed, 1)
    assert reply["ok"] and len(reply["results"]) == 1000, reply
    assert st.jobs["j0700"].next_ms == T0 + 60 * S  # the first whole minute after `at`
    assert st.jobs["j0001"].spec.timeout_ms == 600_000


def test_a_job_file_refused_while_prepared_is_not_worked_out_again_under_the_lock(
        monkeypatch: pytest.MonkeyPatch) -> None:
    st = _base()
    specs = [_template(i) for i in range(999)] + [dict(_template(0), id="z", timeout="1y")]
    wire = {"op": "apply", "at": T0, "rid": "r1", "specs": specs}
    parsed = from_wire(wire)
    st.prepare(parsed)
    monkeypatch.setattr("raftsched.core.apply.plan_apply", lambda *a, **k: 1 / 0)
    reply = st.apply(parsed, 1)
    assert reply["error"]["code"] == "invalid_spec"
    assert reply["error"]["message"].startswith("specs[999].timeout: "), reply


def test_work_prepared_for_one_command_is_not_used_for_another() -> None:
    st = _base()
    first = from_wire({"op": "apply", "at": T0, "specs": [_template(1)]})
    st.prepare(first)
    ok(st, {"op": "put_job", "at": T0, "spec": dict(_template(1), timeout="5m")})
    # `first` was prepared before that put: its apply must see the put (an update of
    # version 1, not a create), as it would without preparation.
    reply = st.apply(first, 1)
    assert reply["results"] == [["update", "j0001", 2]], reply


_VALUES = hs.sampled_from([60, 60.0, True, "60s", "1m", None, [], {}, "x", -1])


@hs.composite
def _batches(draw: Any) -> list[Any]:
    base = [_template(i) for i in range(3)] + [
        {"id": "old", "schedule": {"every": "1m"}, "command": ["true"]},
        {"id": "at1", "schedule": {"at": T0 - 20 * S}, "command": ["true"]},
        {"id": "at2", "schedule": {"at": T0 + 20 * S}, "command": ["true"]},
        {"id": "e", "schedule": {"every": "1m"}, "command": ["true"],
         "env": {"A": {"keep": True}, "B": "x"}},
        # Valid for every id but "a": one copy of it may be the template of another.
        {"id": "d", "after": ["a"], "command": ["true"]},
    ]
    out: list[Any] = []
    for _ in range(draw(hs.integers(1, 12))):
        spec = dict(draw(hs.sampled_from(base)))
        spec["id"] = draw(hs.sampled_from(["a", "b", "c", "old", "at1", "bad id", 7, "c"]))
        if draw(hs.booleans()):
            # Field names with ": " in them: an error quotes them before its own ": ".
            spec[draw(hs.sampled_from(["timeout", "jitter", "paused", "tags", "overlap",
                                       "retries", "cron", "a: b", "x:"]))] = draw(_VALUES)
        if draw(hs.integers(0, 5)) == 0 and "schedule" in spec:
            spec["schedule"] = dict(spec["schedule"], **{"k: v": 1})
        if draw(hs.integers(0, 9)) == 0:
            spec = draw(hs.sampled_from([None, [], "spec", {"id": "x"}]))
        out.append(spec)
    return out


@settings(max_examples=examples(400), deadline=None)
@given(specs=_batches(), atomic=hs.booleans(), op=hs.sampled_from(["put_job", "put_jobs",
                                                                    "apply"]))
def test_a_put_prepared_outside_the_lock_leaves_the_same_state_and_reply(
        specs: list[Any], atomic: bool, op: str) -> None:
    wire: dict[str, Any] = (
        {"op": op, "at": T0, "spec": specs[0]} if op == "put_job"
        else {"op": op, "at": T0, "atomic": atomic, "specs": specs} if op == "put_jobs"
        else {"op": op, "at": T0, "prune": atomic, "specs": specs})
    outside, inside = _base(), _base()
    parsed = from_wire(wire)
    assert parsed.checked  # type: ignore[union-attr]
    outside.prepare(parsed)  # as the replica does, before it takes the lock
    r1 = outside.apply(parsed, 1)
    r2 = inside.apply(replace(parsed, checked=()), 1)  # type: ignore[type-var]
    assert r1 == r2
    assert state_bytes(outside) == state_bytes(inside)
    assert outside.take_effects() == inside.take_effects()


def test_copies_of_a_template_that_differ_in_a_value_s_type_are_each_read() -> None:
    base = _template(0)
    # Each valid one first: it is the template the next would be taken for.
    specs = [base, dict(base, id="b", timeout=60), dict(base, id="c", timeout=60.0),
             dict(base, id="e", paused=True), dict(base, id="d", paused=1)]
    checked = specprep.check_specs(specs, T0)
    assert [type(c).__name__ for c in checked] == [
        "CheckedSpec", "CheckedSpec", "InvalidSpec", "CheckedSpec", "InvalidSpec"]
    assert checked[1].spec.timeout_ms == 60_000  # type: ignore[union-attr]
    assert checked[3].spec.paused is True  # type: ignore[union-attr]


def test_a_template_is_not_taken_for_a_copy_that_would_run_after_itself() -> None:
    dep = {"id": "b", "after": ["a"], "command": ["true"]}
    # In one batch, and in a later command (the templates outlive a command: a client
    # putting one job at a time, a restart replaying such puts).
    batch = specprep.check_specs([dep, dict(dep, id="a")], T0)
    later = specprep.check_specs([dict(dep, id="a")], T0)
    for found in (batch[1], later[0]):
        assert isinstance(found, specprep.InvalidSpec), found
        assert str(found) == "after[0]: a job cannot run after itself"
    assert isinstance(batch[0], specprep.CheckedSpec)


def test_a_spec_read_through_an_earlier_command_s_template_is_the_one_read_in_full() -> None:
    first = specprep.check_specs([_template(7)], T0)[0]
    again = specprep.check_specs([dict(_template(7), id="other")], T0)[0]
    full = specprep.prepare(dict(_template(7), id="other"), T0)
    assert isinstance(first, specprep.CheckedSpec) and isinstance(again, specprep.CheckedSpec)
    assert again.spec == full.spec and again.next_ms == full.next_ms
    assert again.spec.id == "other" and again.spec.call is first.spec.call


def test_a_template_key_tells_types_apart_and_refuses_what_it_cannot_tell() -> None:
    key = specprep._template_key
    assert key({"id": "a", "t": 1}) == key({"id": "b", "t": 1})
    assert len({key({"id": "a", "t": v}) for v in (1, 1.0, True, "1", None, [1])}) == 6
    # A tuple (never from the wire; a list there) and a str subclass: read in full.
    assert key({"id": "a", "tags": ("x",)}) is None
    assert key({"id": "a", "call": type("S", (str,), {})("m:f")}) is None
    assert key({"id": "a", "n": 2 ** 70}) is None and key(["id"]) is None
