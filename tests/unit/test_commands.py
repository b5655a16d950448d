"""The typed command vocabulary writes exactly the bytes the dict forms always had.

Each ``legacy_*`` function below is the dict the node built before the typed classes
existed, copied from that code (key order included: it is part of the bytes); the typed
command, built the way the node builds it now, must encode to the same bytes, decode
back to itself, and apply like the map it replaced."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftsched.core import commands as c
from raftsched.core.codec import decode_command, encode_command
from raftsched.core.errors import InvalidArgument
from raftsched.core.packing import packb
from tests.support.budget import examples

pytestmark = pytest.mark.timeout(120)

AT = st.integers(0, c.MAX_AT_MS - 1)
ID = st.text(min_size=1, max_size=12)
RID = st.text(min_size=1, max_size=64)
INT = st.integers(0, 2**53)
TERM = st.integers(0, 1000)
SPEC = st.fixed_dictionaries({"id": ID, "schedule": st.fixed_dictionaries({"every": st.just(
    "1s")}), "command": st.lists(ID, min_size=1, max_size=3)})


def old_bytes(legacy: dict[str, Any]) -> bytes:
    """What ``codec.encode_command`` wrote for a dict before the typed classes."""
    return packb(dict(legacy, v=2))


def check(typed: c.Command, legacy: dict[str, Any]) -> None:
    assert typed.encode() == old_bytes(legacy) == encode_command(typed)
    assert encode_command(legacy) == typed.encode()
    assert c.decode(typed.encode()) == typed
    assert c.from_wire(dict(legacy, v=2)) == typed


def client(typed: c.ClientCommand, rid: str, at: int) -> c.ClientCommand:
    """As ``ClientWrites.submit`` stamps it: the request id, then the time."""
    return replace(replace(typed, rid=rid), at=at)


def legacy_client(cmd: dict[str, Any], rid: str, at: int) -> dict[str, Any]:
    cmd["rid"] = rid
    cmd["at"] = at
    return cmd


@settings(max_examples=examples(60), deadline=None)
@given(spec=SPEC, max_jobs=INT, rid=RID, at=AT)
def test_put_job(spec: dict[str, Any], max_jobs: int, rid: str, at: int) -> None:
    check(client(c.PutJob(spec=spec, max_jobs=max_jobs, at=0), rid, at),
          legacy_client({"op": "put_job", "spec": spec, "max_jobs": max_jobs}, rid, at))


@settings(max_examples=examples(60), deadline=None)
@given(specs=st.lists(SPEC, min_size=1, max_size=4), max_jobs=INT, atomic=st.booleans(),
       rid=RID, at=AT)
def test_put_jobs(specs: list[dict[str, Any]], max_jobs: int, atomic: bool, rid: str,
                  at: int) -> None:
    legacy: dict[str, Any] = {"op": "put_jobs", "specs": specs, "max_jobs": max_jobs}
    if atomic:
        legacy["atomic"] = True
    check(client(c.PutJobs(specs=tuple(specs), max_jobs=max_jobs, atomic=atomic, at=0), rid,
                 at), legacy_client(legacy, rid, at))


@settings(max_examples=examples(60), deadline=None)
@given(job=ID, rid=RID, at=AT, flag=st.booleans(), missed=INT, node=ID,
       to=st.none() | ID)
def test_client_commands(job: str, rid: str, at: int, flag: bool, missed: int, node: str,
                         to: str | None) -> None:
    pairs: list[tuple[c.ClientCommand, dict[str, Any]]] = [
        (c.DeleteJob(job=job, at=0), {"op": "delete_job", "job": job}),
        (c.Pause(job=job, at=0), {"op": "pause", "job": job}),
        (c.Resume(job=job, catch_up=flag, missed=missed, at=0),
         {"op": "resume", "job": job, "catch_up": flag, "missed": missed}),
        (c.Trigger(job=job, force=flag, at=0), {"op": "trigger", "job": job, "force": flag}),
        (c.Drain(node=node, draining=flag, at=0),
         {"op": "drain", "node": node, "draining": flag}),
        (c.Transfer(to=to, at=0), {"op": "transfer", "to": to}),
    ]
    for typed, legacy in pairs:
        check(client(typed, rid, at), legacy_client(legacy, rid, at))


@settings(max_examples=examples(60), deadline=None)
@given(node=ID, at=AT, boot=INT, slots=INT, queue=INT, tags=st.lists(ID, max_size=3),
       api=st.text(max_size=20), pid=st.integers(1, 2**22))
def test_heartbeat(node: str, at: int, boot: int, slots: int, queue: int, tags: list[str],
                   api: str, pid: int) -> None:
    check(c.Heartbeat(node=node, at=at, boot=boot, slots=slots, queue=queue, tags=tuple(tags),
                      api=api, pid=pid),
          {"op": "heartbeat", "node": node, "at": at, "boot": boot, "slots": slots,
           "queue": queue, "tags": list(tags), "api": api, "pid": pid})


@settings(max_examples=examples(60), deadline=None)
@given(node=ID, term=TERM, at=AT, skew=st.dictionaries(ID, st.integers(-10**6, 10**6)),
       scope=st.sampled_from(["all", "assigned"]), reason=st.text(max_size=20))
def test_leader_commands(node: str, term: int, at: int, skew: dict[str, int], scope: str,
                         reason: str) -> None:
    check(c.LeaderRecord(node=node, term=term, at=at, skew=skew),
          {"op": "leader", "node": node, "term": term, "at": at, "skew": skew})
    legacy: dict[str, Any] = {"op": "release", "node": node, "scope": scope,
                              "reason": reason, "term": term, "leader": node}
    legacy["at"] = at
    check(replace(c.Release(node=node, scope=scope, reason=reason, term=term, leader=node,
                            at=0), at=at), legacy)
    check(c.Read(at=at, node=node), {"op": "read", "at": at, "node": node})


RUN = st.tuples(st.just("run"), ID, INT, st.none() | ID, st.booleans())
MISS = st.tuples(st.just("miss"), ID, INT, INT, st.integers(1, 10**5),
                 st.sampled_from(sorted(c.MISS_OUTCOMES)), st.text(max_size=10)).filter(
    lambda m: m[2] <= m[3])


@settings(max_examples=examples(80), deadline=None)
@given(at=AT, term=TERM, node=ID, fires=st.lists(RUN | MISS, max_size=6),
       place=st.lists(st.tuples(ID, ID), max_size=3),
       drop=st.lists(st.tuples(ID, st.sampled_from(sorted(c.DROP_OUTCOMES)),
                               st.text(max_size=8)), max_size=3),
       nxt=st.lists(st.tuples(ID, st.none() | INT), max_size=3),
       versions=st.dictionaries(ID, st.integers(1, 100), max_size=3))
def test_plan(at: int, term: int, node: str, fires: list[tuple[Any, ...]],
              place: list[tuple[str, str]], drop: list[tuple[str, str, str]],
              nxt: list[tuple[str, int | None]], versions: dict[str, int]) -> None:
    typed_fires = tuple(c.RunFire(*f[1:]) if f[0] == "run" else c.MissFire(*f[1:])
                        for f in fires)
    typed = c.Plan(at=at, term=term, leader=node, fires=typed_fires,
                   place=tuple(c.Place(*p) for p in place),
                   drop=tuple(c.Drop(*d) for d in drop), next=tuple(c.Next(*n) for n in nxt),
                   versions=versions)
    legacy = {"op": "plan", "at": at, "term": term, "leader": node,
              "fires": [list(f) for f in fires], "place": [list(p) for p in place],
              "drop": [list(d) for d in drop], "next": [list(n) for n in nxt],
              "versions": versions}
    check(typed, legacy)


@settings(max_examples=examples(60), deadline=None)
@given(node=ID, at=AT, starts=st.lists(st.tuples(ID, INT), min_size=1, max_size=4),
       finishes=st.lists(st.tuples(ID, INT, st.sampled_from(sorted(c.FINISH_OUTCOMES)),
                                   st.none() | st.integers(-255, 255), st.text(max_size=20),
                                   st.text(max_size=10)), min_size=1, max_size=4))
def test_start_finish(node: str, at: int, starts: list[tuple[str, int]],
                      finishes: list[tuple[Any, ...]]) -> None:
    # As the worker built them: the items, then ``at`` stamped at each try.
    legacy: dict[str, Any] = {"op": "start", "node": node, "items": [list(s) for s in starts]}
    legacy["at"] = at
    check(replace(c.Start(node=node, items=tuple(c.StartItem(*s) for s in starts), at=0),
                  at=at), legacy)
    legacy = {"op": "finish", "node": node, "items": [list(f) for f in finishes]}
    legacy["at"] = at
    check(replace(c.Finish(node=node, items=tuple(c.FinishItem(*f) for f in finishes), at=0),
                  at=at), legacy)


def test_every_op_has_a_class_and_a_handler() -> None:
    from raftsched.core.machine import _HANDLERS

    assert set(c.COMMANDS) == set(_HANDLERS)


def test_unreadable_items_are_kept_in_place_and_refused_alone() -> None:
    cmd = c.from_wire({"op": "plan", "at": 5, "term": 1, "leader": "n1", "v": 2,
                       "fires": [["run", "j", "x", None, False], ["miss", "j", 9, 3, 1,
                                                                   "missed", ""]],
                       "place": [[1, "n1"]], "drop": [["r", "gone", ""]], "next": [["j", "x"]]})
    assert isinstance(cmd, c.Plan)
    assert [f.entry for f in cmd.fires if isinstance(f, c.Refused)] == [
        ["run", "j", "x"], ["miss", "j", 9]]
    assert isinstance(cmd.place[0], c.Refused) and isinstance(cmd.drop[0], c.Refused)
    assert cmd.next[0] == c.Refused(["next", "j"], ["j", "x"])
    start = c.from_wire({"op": "start", "at": 5, "node": "n1", "items": [[3, "f"], ["r", 2]]})
    assert isinstance(start, c.Start)
    assert start.items == (c.BadClaim(3, "f", [3, "f"]), c.StartItem("r", 2))


def test_old_journal_commands_decode_as_they_were_written() -> None:
    """v1 commands (before leader-only commands carried a term) still decode."""
    blob = packb({"op": "release", "at": 7, "node": "n2", "scope": "all", "reason": "x",
                  "v": 1})
    cmd = c.decode(blob)
    assert isinstance(cmd, c.Release) and cmd.term is None and cmd.v == 1
    assert decode_command(blob) is not None


@pytest.mark.parametrize("bad, field", [
    ({"op": "heartbeat", "at": 1, "node": "", "boot": 1, "slots": 1, "queue": 0}, "node"),
    ({"op": "resume", "at": 1, "job": "j", "missed": -1}, "missed"),
    ({"op": "trigger", "at": 1, "job": "j", "force": "yes"}, "force"),
    ({"op": "put_jobs", "at": 1, "specs": []}, "specs"),
    ({"op": "start", "at": 1, "node": "n1", "items": [[1]]}, "items"),
    ({"op": "pause", "at": -1, "job": "j"}, "at"),
    ({"op": "nope", "at": 1}, "op"),
])
def test_bad_fields_are_named(bad: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        c.from_wire(bad)
    assert err.value.field == field


def test_a_decoded_plan_with_unreadable_items_encodes_back_to_its_bytes() -> None:
    raw = {"op": "plan", "at": 5, "term": 1, "leader": "n1",
           "fires": [["run", "j", 7, None, False], ["run", "j", "x", None, False]],
           "place": [["r1", "n1"], [1, "n1"]], "drop": [[2, "shed", ""], ["r", "shed", "x"]],
           "next": [["j", None], ["j", "x"]], "versions": {"j": 1}, "v": 2}
    cmd = c.from_wire(raw)
    assert cmd.encode() == packb(raw)
    assert dict(cmd.to_wire(), v=2) == raw
