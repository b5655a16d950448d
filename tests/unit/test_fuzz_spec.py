"""Property fuzzing of the two pure boundaries untrusted input reaches:

* ``JobSpec.from_spec`` on arbitrary JSON/msgpack-like values and on valid specs with
  one field (top-level or nested) replaced, dropped or added: it raises nothing but
  ``InvalidSpec`` (bounded message, never an env value), and what it accepts round-trips
  through ``to_spec``/``from_spec`` (and msgpack) unchanged, with env masked by
  ``redacted()``.
* ``ClusterState.apply`` on arbitrary commands and on mutated valid commands of every
  op, against a state holding jobs, nodes and runs in every active state: it never
  raises, always returns ``{"ok": bool, ...}``, a rejected command leaves the encoded
  state unchanged, and a command that could have come from the log (msgpack-encodable)
  leaves a state that still snapshots and restores to the same bytes.
"""

from __future__ import annotations

import copy
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raftsched.core.codec import decode_state, encode_state
from raftsched.core.errors import InvalidSpec
from raftsched.core.machine import ClusterState
from raftsched.core.model import JobSpec
from tests.support.budget import examples
from tests.support.stateutil import forget_refusal, state_bytes

pytestmark = pytest.mark.timeout(120)

FUZZ = settings(max_examples=examples(300), deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

MARK = "ENVSECRET"  # every generated env value carries it; no error message may

# ---------------------------------------------------------------- values

_SPEC_WORDS = ["id", "schedule", "command", "call", "timeout", "overlap", "misfire", "retries",
               "on_node_lost", "tags", "jitter", "paused", "env", "cron", "tz", "every",
               "offset", "at", "policy", "grace", "max_catchup", "max", "backoff",
               "backoff_max", "1s", "0", "* * * * *", "UTC", "Europe/Berlin", "skip", "all",
               "once", "queue", "allow", "replace", "retry", "fail", "true",
               "2026-01-01T00:00:00Z", "pkg.mod:fn", "RAFTSCHED_X", "\x00", "x" * 300]
_leaves = (st.none() | st.booleans() | st.integers()
           | st.integers(min_value=-(2**200), max_value=2**200)
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=30)
           | st.sampled_from(_SPEC_WORDS))
_keys = st.text(max_size=12) | st.sampled_from(_SPEC_WORDS)
#: JSON-like: None, bools, ints (huge too), floats, text, lists, maps with text keys.
json_like = st.recursive(_leaves, lambda c: st.lists(c, max_size=5)
                         | st.dictionaries(_keys, c, max_size=5), max_leaves=25)
#: What msgpack can also carry: bytes (values and keys) and tuples.
msgpack_like = st.recursive(_leaves | st.binary(max_size=16),
                            lambda c: st.lists(c, max_size=4) | st.tuples(c, c)
                            | st.dictionaries(_keys | st.binary(max_size=4), c, max_size=4),
                            max_leaves=20)
any_value = json_like | msgpack_like

# ---------------------------------------------------------------- valid specs

_durations = st.sampled_from(["0s", "1s", "250ms", "1m30s", "1.5s", "2h", "1d", 5, 0, 3600])
_schedules = st.one_of(
    st.fixed_dictionaries({"every": st.sampled_from(["1s", "5s", "1m", "1h", "1d", 60])},
                          optional={"offset": st.sampled_from(["0s", "500ms", "1s"])}),
    st.fixed_dictionaries(
        {"cron": st.sampled_from(["* * * * *", "*/5 * * * *", "0 2 * * *", "30 2 * * 1-5",
                                  "0 0 1 1 *", "*/3 * * * * *", "@hourly", "@daily",
                                  "0 9-17/2 * * mon-fri", "15,45 * * * *", "0 0 L * *",
                                  "0 0 ? * *", "0 23-2 * * *"])},
        optional={"tz": st.sampled_from(["UTC", "Europe/Berlin", "America/New_York",
                                         "Australia/Lord_Howe", "Asia/Kathmandu"])}),
    st.fixed_dictionaries({"at": st.sampled_from(["2026-12-01T00:00:00Z",
                                                  "2030-06-30T23:59:59.123+02:00",
                                                  "1970-01-01T00:00:00Z",
                                                  "9999-12-27T00:00:00z"])}))
_ids = st.from_regex(r"[A-Za-z0-9_.-]{1,20}", fullmatch=True)
#: Text msgpack can carry (no lone surrogates) and argv/env can hold (no NUL).
_text = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=20)
_argv = st.lists(_text, min_size=1, max_size=4).filter(lambda a: a[0] != "")
_env = st.dictionaries(st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,10}", fullmatch=True).filter(
    lambda n: not n.startswith("RAFTSCHED_")), _text.map(lambda v: MARK + v), max_size=4)
_tags = st.lists(st.from_regex(r"[A-Za-z0-9_.:-]{1,10}", fullmatch=True), max_size=4)


@st.composite
def valid_specs(draw: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"id": draw(_ids), "schedule": draw(_schedules)}
    if draw(st.booleans()):
        spec["command"] = draw(_argv)
    else:
        spec["call"] = draw(st.sampled_from(["pkg.mod:fn", "pkg:run", "pkg.a.b:c_d"]))
    optional = {
        "timeout": st.sampled_from(["1s", "30s", "1h", "7d", 1, 60]),
        "overlap": st.sampled_from(["skip", "allow", "queue", "replace"]),
        "misfire": st.fixed_dictionaries({}, optional={
            "policy": st.sampled_from(["skip", "once", "all"]), "grace": _durations,
            "max_catchup": st.integers(1, 1000)}),
        "retries": st.fixed_dictionaries({}, optional={
            "max": st.integers(0, 100), "backoff": _durations, "backoff_max": _durations}),
        "on_node_lost": st.sampled_from(["retry", "fail"]),
        "tags": _tags, "jitter": st.sampled_from(["0s", "1s", "1h", 0, 10]),
        "paused": st.booleans(), "env": _env,
    }
    for key, strat in optional.items():
        if draw(st.booleans()):
            spec[key] = draw(strat)
    return spec


#: (path to a field, top-level or one level down) of a full valid spec.
_PATHS = [(k,) for k in ("id", "schedule", "command", "call", "timeout", "overlap", "misfire",
                         "retries", "on_node_lost", "tags", "jitter", "paused", "env")] + [
    ("schedule", "every"), ("schedule", "offset"), ("schedule", "cron"), ("schedule", "tz"),
    ("schedule", "at"), ("misfire", "policy"), ("misfire", "grace"),
    ("misfire", "max_catchup"), ("retries", "max"), ("retries", "backoff"),
    ("retries", "backoff_max"), ("env", "NAME"), ("command", 0), ("tags", 0), ("extra",)]


@st.composite
def mutated_specs(draw: Any) -> dict[str, Any]:
    spec = copy.deepcopy(draw(valid_specs()))
    spec.setdefault("misfire", {"policy": "all"})
    spec.setdefault("retries", {"max": 1})
    spec.setdefault("env", {"NAME": MARK + "v"})
    path = draw(st.sampled_from(_PATHS))
    parent: Any = spec
    for step in path[:-1]:
        child = parent.get(step)
        if not isinstance(child, (dict, list)):
            child = {} if step != "command" else ["x"]
            parent[step] = child
        parent = child
    last = path[-1]
    action = draw(st.sampled_from(["replace", "replace", "replace", "drop"]))
    if isinstance(parent, list):
        if parent:
            parent[0] = draw(any_value)
    elif action == "drop":
        parent.pop(last, None)
    else:
        parent[last] = draw(any_value)
    return spec


def _check_from_spec(spec: Any, prefixes: tuple[str, ...] | None = None) -> JobSpec | None:
    try:
        job = JobSpec.from_spec(spec, allowed_call_prefixes=prefixes)
    except InvalidSpec as exc:
        assert isinstance(exc.field, str)  # "" when the unknown key itself is ""
        assert len(exc.message) <= 600, f"unbounded error message ({len(exc.message)} chars)"
        assert MARK not in exc.message, f"an env value in an error: {exc.message!r}"
        return None
    spec_out = job.to_spec()
    again = JobSpec.from_spec(spec_out, allowed_call_prefixes=prefixes)
    assert again == job, (spec, spec_out)
    assert again.to_spec() == spec_out
    wire = msgpack.unpackb(msgpack.packb(spec_out, use_bin_type=True), raw=False)
    assert JobSpec.from_spec(wire, allowed_call_prefixes=None) == job
    assert set(job.redacted()["env"]) == set(job.env)
    assert all(v == "***" for v in job.redacted()["env"].values())
    return job


@FUZZ
@given(value=any_value)
def test_from_spec_on_arbitrary_values_raises_only_invalid_spec(value: Any) -> None:
    _check_from_spec(value)
    if isinstance(value, dict):
        _check_from_spec(dict(value, id="x", schedule={"every": "1s"}))


@FUZZ
@given(spec=mutated_specs(), prefixes=st.sampled_from([None, (), ("pkg",)]))
def test_from_spec_on_mutated_valid_specs_raises_only_invalid_spec(
        spec: dict[str, Any], prefixes: tuple[str, ...] | None) -> None:
    _check_from_spec(spec, prefixes)


@FUZZ
@given(spec=valid_specs())
def test_valid_specs_are_accepted_and_round_trip(spec: dict[str, Any]) -> None:
    try:
        JobSpec.from_spec(spec, allowed_call_prefixes=("pkg",))
    except InvalidSpec as exc:
        # The one combination the generator does not rule out: offset >= every.
        assert exc.field == "schedule.offset", exc
        return
    assert _check_from_spec(spec, ("pkg",)) is not None


@pytest.mark.parametrize("field,spec", [
    ("command[1]", {"command": ["echo", "a\ud800b"]}),
    ("env.TOKEN", {"command": ["true"], "env": {"TOKEN": MARK + "\udfff"}}),
])
def test_text_msgpack_cannot_carry_is_refused(field: str, spec: dict[str, Any]) -> None:
    """Found by the round-trip property: a lone surrogate (what a JSON "\\ud800" escape
    gives) was accepted, and the accepted spec then failed to encode for the log."""
    with pytest.raises(InvalidSpec) as info:
        JobSpec.from_spec(dict(spec, id="s", schedule={"every": "1s"}))
    assert info.value.field == field and MARK not in info.value.message


# ---------------------------------------------------------------- the state machine

S = 1000
T0 = 20_000 * 86_400 * S
AT = T0 + 10 * S


def _spec(job_id: str, **kw: Any) -> dict[str, Any]:
    return dict({"id": job_id, "schedule": {"every": "1s"}, "command": ["true"]}, **kw)


def _base_state() -> tuple[bytes, dict[str, Any]]:
    """A state with jobs, nodes and runs pending/assigned/started/queued, and the ids."""
    s = ClusterState(history_limit=5)

    def ok(cmd: dict[str, Any]) -> dict[str, Any]:
        reply = s.apply_map(cmd)
        assert reply["ok"], (cmd, reply)
        return reply

    for node in ("n1", "n2"):
        ok({"op": "heartbeat", "at": T0, "node": node, "boot": 1, "slots": 4, "queue": 16,
            "tags": ["t"], "api": "127.0.0.1:1"})
    ok({"op": "leader", "at": T0, "node": "n1", "term": 1})
    ok({"op": "put_job", "at": T0, "spec": _spec("j1", retries={"max": 2, "backoff": "1s"})})
    ok({"op": "put_job", "at": T0, "spec": _spec(
        "j2", schedule={"cron": "*/5 * * * * *", "tz": "Europe/Berlin"}, overlap="queue")})
    ok({"op": "put_job", "at": T0, "spec": _spec(
        "j3", schedule={"at": "2099-01-01T00:00:00Z"}, paused=True, env={"K": "v"})})
    ok({"op": "put_job", "at": T0, "spec": _spec("j4", on_node_lost="fail")})
    ok({"op": "plan", "at": T0 + S, "term": 1, "leader": "n1",
        "fires": [["run", "j1", T0 + S, "n1", False], ["run", "j2", T0 + 5 * S, "n2", False],
                  ["miss", "j1", T0 + 2 * S, T0 + 3 * S, 2, "missed", "no_leader"],
                  ["run", "j4", T0 + S, None, False]],
        "next": [["j1", T0 + 4 * S]]})
    r1 = f"j1@{T0 + S}"
    fence1 = s.runs[r1].fence
    ok({"op": "start", "at": T0 + S, "node": "n1", "items": [[r1, fence1]]})
    manual = ok({"op": "trigger", "at": T0 + 2 * S, "job": "j2", "force": False})["run_id"]
    trig = ok({"op": "trigger", "at": T0 + 2 * S, "job": "j1", "force": True})["run_id"]
    ids = {"started": r1, "fence1": fence1, "queued": manual, "pending": f"j4@{T0 + S}",
           "assigned": f"j2@{T0 + 5 * S}", "assigned_fence": s.runs[f"j2@{T0 + 5 * S}"].fence,
           "manual": trig}
    assert s.runs[manual].state == "queued" and s.runs[trig].state == "pending"
    s.take_effects()
    return encode_state(s), ids


_BASE, _IDS = _base_state()


def _valid_commands() -> dict[str, dict[str, Any]]:
    i = _IDS
    return {
        "put_job": {"op": "put_job", "at": AT, "rid": "r-put", "max_jobs": 10,
                    "spec": _spec("j5", tags=["t"], env={"E": "x"})},
        "put_jobs": {"op": "put_jobs", "at": AT, "max_jobs": 10,
                     "specs": [_spec("j1", paused=True), _spec("j6")]},
        "delete_job": {"op": "delete_job", "at": AT, "job": "j2", "rid": "r-del"},
        "pause": {"op": "pause", "at": AT, "job": "j1"},
        "resume": {"op": "resume", "at": AT, "job": "j3", "catch_up": False, "missed": 3},
        "trigger": {"op": "trigger", "at": AT, "job": "j4", "force": True},
        "heartbeat": {"op": "heartbeat", "at": AT, "node": "n1", "boot": 2, "slots": 2,
                      "queue": 4, "tags": ["t", "u"], "api": "127.0.0.1:2"},
        "leader": {"op": "leader", "at": AT, "node": "n2", "term": 2, "skew": {"n1": 5}},
        "plan": {"op": "plan", "at": AT, "term": 1, "leader": "n1",
                 "fires": [["run", "j1", T0 + 5 * S, "n2", False],
                           ["miss", "j4", T0 + 2 * S, T0 + 4 * S, 3, "shed", "overload"]],
                 "place": [[i["pending"], "n1"], [i["manual"], "n2"]],
                 "drop": [[i["queued"], "cancelled", "fuzz"]],
                 "next": [["j1", T0 + 6 * S]]},
        "start": {"op": "start", "at": AT, "node": "n2",
                  "items": [[i["assigned"], i["assigned_fence"]]]},
        "finish": {"op": "finish", "at": AT, "node": "n1",
                   "items": [[i["started"], i["fence1"], "failed", 1, "tail", "exit 1"]]},
        "release": {"op": "release", "at": AT, "node": "n1", "scope": "all", "reason": "lost",
                    "term": 1, "leader": "n1"},
    }


_OPS = sorted(_valid_commands())



def _loggable(cmd: Any) -> bool:
    """Could this command have come out of the replicated log (msgpack-encodable)?"""
    try:
        msgpack.packb(cmd, use_bin_type=True)
    except Exception:  # noqa: BLE001 - huge ints, recursion: never in a real log entry
        return False
    return True


def _check_apply(cmd: Any) -> dict[str, Any]:
    s = decode_state(_BASE)
    before = state_bytes(s)
    reply = s.apply_map(cmd)
    assert isinstance(reply, dict) and isinstance(reply.get("ok"), bool), reply
    if not reply["ok"]:
        err = reply.get("error")
        assert isinstance(err, dict) and isinstance(err.get("code"), str), reply
        forget_refusal(s, cmd, reply)
        assert state_bytes(s) == before, f"a rejected command changed the state: {cmd!r:.300}"
    elif _loggable(cmd):
        blob = encode_state(s)
        assert encode_state(decode_state(blob)) == blob, "snapshot does not round-trip"
    return reply


@FUZZ
@given(cmd=any_value)
def test_apply_on_arbitrary_values_never_raises(cmd: Any) -> None:
    _check_apply(cmd)


@FUZZ
@given(cmd=st.dictionaries(st.sampled_from(["op", "at", "rid", "job", "node", "spec", "specs",
                                            "term", "fires", "place", "drop", "next", "items",
                                            "scope", "reason", "force", "catch_up", "missed",
                                            "boot", "slots", "queue", "tags", "api", "skew"]),
                           any_value, max_size=6),
       op=st.sampled_from(_OPS + ["nope", ""]), at=st.integers(-5, 2**64 - 1))
def test_apply_on_arbitrary_commands_with_real_ops_never_raises(
        cmd: dict[str, Any], op: str, at: int) -> None:
    _check_apply(dict(cmd, op=op, at=at))


@st.composite
def mutated_commands(draw: Any) -> dict[str, Any]:
    op = draw(st.sampled_from(_OPS))
    cmd = copy.deepcopy(_valid_commands()[op])
    # Walk down a random path (into the maps and lists of items), then change that spot.
    parent: Any = cmd
    key: Any = draw(st.sampled_from(sorted(cmd) + ["extra"]))
    while key in parent if isinstance(parent, dict) else key < len(parent):
        child = parent[key]
        if not isinstance(child, (dict, list)) or not child or not draw(st.booleans()):
            break
        parent = child
        key = draw(st.sampled_from(sorted(child))) if isinstance(child, dict) \
            else draw(st.integers(0, len(child) - 1))
    action = draw(st.sampled_from(["replace", "replace", "drop"]))
    if action == "drop" and isinstance(parent, dict):
        parent.pop(key, None)
    elif isinstance(parent, list) and action == "drop" and key < len(parent):
        del parent[key]
    elif isinstance(parent, list):
        if key < len(parent):
            parent[key] = draw(any_value)
    else:
        parent[key] = draw(any_value)
    return cmd


@FUZZ
@given(cmd=mutated_commands())
def test_apply_on_mutated_valid_commands_never_raises(cmd: dict[str, Any]) -> None:
    _check_apply(cmd)


@pytest.mark.parametrize("op", _OPS)
def test_every_valid_command_is_accepted(op: str) -> None:
    """The mutation base is meaningful: each unmutated command applies."""
    reply = _check_apply(copy.deepcopy(_valid_commands()[op]))
    assert reply["ok"], reply
    if op in ("start", "finish", "plan"):
        rejected = reply.get("rejected") or [r for r in reply.get("results", []) if not r[0]]
        assert not rejected, reply
