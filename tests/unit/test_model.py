"""Tests for raftsched.core.model: JobSpec validation (every field named in its error),
the to_spec/from_spec round trip, redaction and the retry backoff."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftsched.core.errors import InvalidSpec
from raftsched.core.model import (
    DEFAULT_BACKOFF_MAX_MS,
    DEFAULT_BACKOFF_MS,
    MAX_ARGV,
    MAX_ENV,
    MAX_ENV_VALUE,
    MAX_TAGS,
    JobSpec,
    MisfirePolicy,
    OnNodeLost,
    Overlap,
    RetrySpec,
    job_of_run,
    run_id_of,
)
from raftsched.core.trigger import ScheduleKind
from tests.support.budget import examples

pytestmark = pytest.mark.timeout(60)

SECRET = "hunter2-SECRET-value-9f8e7d"


def base(**over: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"id": "job-1", "schedule": {"every": "10s"}, "command": ["true"]}
    spec.update(over)
    return spec


def without(key: str) -> dict[str, Any]:
    spec = base()
    del spec[key]
    return spec


# --------------------------------------------------------------------- valid specs

def test_minimal_spec_defaults() -> None:
    spec = JobSpec.from_spec(base())
    assert spec.id == "job-1"
    assert spec.schedule.kind is ScheduleKind.every
    assert spec.schedule.every_ms == 10_000
    assert spec.command == ("true",)
    assert spec.call is None
    assert spec.timeout_ms == 3600 * 1000
    assert spec.overlap is Overlap.skip
    assert spec.misfire.policy is MisfirePolicy.once
    assert spec.misfire.grace_ms == 60_000
    assert spec.misfire.max_catchup == 10
    assert spec.retries == RetrySpec()
    assert spec.on_node_lost is OnNodeLost.retry
    assert spec.tags == ()
    assert spec.jitter_ms == 0
    assert spec.paused is False
    assert spec.env == {}


def test_full_spec_normalizes() -> None:
    spec = JobSpec.from_spec(base(
        schedule={"cron": "@daily", "tz": "Europe/Berlin"},
        timeout="1h30m", overlap="queue",
        misfire={"policy": "all", "grace": "5m", "max_catchup": 3},
        retries={"max": 2, "backoff": "1s", "backoff_max": "1m"},
        on_node_lost="fail", tags=["b", "a", "b"], jitter=5, paused=True,
        env={"B": "2", "A": "1"}))
    assert spec.schedule.cron == "0 0 * * *"
    assert spec.schedule.tz == "Europe/Berlin"
    assert spec.timeout_ms == 5_400_000
    assert spec.overlap is Overlap.queue
    assert (spec.misfire.policy, spec.misfire.grace_ms, spec.misfire.max_catchup) == (
        MisfirePolicy.all, 300_000, 3)
    assert spec.retries == RetrySpec(max=2, backoff_ms=1000, backoff_max_ms=60_000)
    assert spec.on_node_lost is OnNodeLost.fail
    assert spec.tags == ("a", "b")  # sorted, deduplicated
    assert spec.jitter_ms == 5000  # a bare int is seconds
    assert spec.paused is True
    assert list(spec.env) == ["A", "B"]


def test_call_spec_and_prefixes() -> None:
    spec = JobSpec.from_spec(base(command=None, call="myapp.jobs:run"))
    assert spec.call == "myapp.jobs:run" and spec.command is None
    ok = {"id": "c", "schedule": {"every": "1s"}, "call": "myapp.jobs:run"}
    assert JobSpec.from_spec(ok, allowed_call_prefixes=("myapp",)).call == "myapp.jobs:run"
    assert JobSpec.from_spec(ok, allowed_call_prefixes=("other", "myapp.jobs")).call
    top = dict(ok, call="myapp:run")
    assert JobSpec.from_spec(top, allowed_call_prefixes=("myapp",)).call == "myapp:run"
    # None skips the check (replay of an accepted spec).
    assert JobSpec.from_spec(dict(ok, call="anything.at.all:f"), allowed_call_prefixes=None)


@pytest.mark.parametrize("call,allowed", [
    ("myappx.jobs:run", ("myapp",)),       # a prefix of the name is not a package prefix
    ("other:run", ("myapp",)),
    ("my:run", ("myapp",)),
    ("myapp.jobs:run", ()),                # empty tuple forbids call
    ("myapp.jobs:run", ("myapp.jobs.sub",)),
])
def test_call_prefix_enforced(call: str, allowed: tuple[str, ...]) -> None:
    spec = {"id": "c", "schedule": {"every": "1s"}, "call": call}
    with pytest.raises(InvalidSpec) as ei:
        JobSpec.from_spec(spec, allowed_call_prefixes=allowed)
    assert ei.value.field == "call"


# --------------------------------------------------------------------- bad specs

BAD: list[tuple[str, Any, str]] = [
    # (case id, spec, expected field)
    ("not-a-map", ["id"], "spec"),
    ("none", None, "spec"),
    ("unknown-field", base(colour="red"), "colour"),
    ("missing-id", without("id"), "id"),
    ("id-empty", base(id=""), "id"),
    ("id-space", base(id="a b"), "id"),
    ("id-at", base(id="a@b"), "id"),
    ("id-too-long", base(id="x" * 129), "id"),
    ("id-int", base(id=5), "id"),
    ("id-newline", base(id="abc\n"), "id"),
    ("missing-schedule", without("schedule"), "schedule"),
    ("schedule-str", base(schedule="every 10s"), "schedule"),
    ("schedule-empty", base(schedule={}), "schedule"),
    ("schedule-two-kinds", base(schedule={"every": "1s", "cron": "* * * * *"}), "schedule"),
    ("schedule-unknown-key", base(schedule={"every": "1s", "colour": 1}), "schedule.colour"),
    ("schedule-tz-with-every", base(schedule={"every": "1s", "tz": "UTC"}), "schedule.tz"),
    ("schedule-cron-bad", base(schedule={"cron": "61 * * * *"}), "schedule.cron"),
    ("schedule-cron-fields", base(schedule={"cron": "* * *"}), "schedule.cron"),
    ("schedule-cron-int", base(schedule={"cron": 5}), "schedule.cron"),
    ("schedule-cron-random", base(schedule={"cron": "R * * * *"}), "schedule.cron"),
    ("schedule-cron-hash", base(schedule={"cron": "0 0 * * 1#2"}), "schedule.cron"),
    ("schedule-cron-never", base(schedule={"cron": "0 0 31 2 *"}), "schedule.cron"),
    ("schedule-tz-unknown", base(schedule={"cron": "* * * * *", "tz": "Mars/Base"}),
     "schedule.tz"),
    ("schedule-tz-localtime", base(schedule={"cron": "* * * * *", "tz": "localtime"}),
     "schedule.tz"),
    ("schedule-tz-int", base(schedule={"cron": "* * * * *", "tz": 1}), "schedule.tz"),
    ("schedule-every-zero", base(schedule={"every": "0s"}), "schedule.every"),
    ("schedule-every-sub-second", base(schedule={"every": "500ms"}), "schedule.every"),
    ("schedule-every-too-long", base(schedule={"every": "367d"}), "schedule.every"),
    ("schedule-every-bool", base(schedule={"every": True}), "schedule.every"),
    ("schedule-every-garbage", base(schedule={"every": "10 s"}), "schedule.every"),
    ("schedule-offset-ge-every", base(schedule={"every": "10s", "offset": "10s"}),
     "schedule.offset"),
    ("schedule-offset-negative", base(schedule={"every": "10s", "offset": -1}),
     "schedule.offset"),
    ("schedule-at-naive", base(schedule={"at": "2026-01-01T00:00:00"}), "schedule.at"),
    ("schedule-at-garbage", base(schedule={"at": "tomorrow"}), "schedule.at"),
    ("schedule-at-int", base(schedule={"at": 1700000000}), "schedule.at"),
    ("schedule-at-bad-date", base(schedule={"at": "2026-02-30T00:00:00Z"}), "schedule.at"),
    ("command-and-call", base(call="a.b:c"), "command"),
    ("neither-command-nor-call", without("command"), "command"),
    ("command-empty", base(command=[]), "command"),
    ("command-str", base(command="ls -l"), "command"),
    ("command-too-many", base(command=["x"] * (MAX_ARGV + 1)), "command"),
    ("command-0-int", base(command=[1]), "command[0]"),
    ("command-0-empty", base(command=[""]), "command[0]"),
    ("command-1-int", base(command=["ls", 2]), "command[1]"),
    ("command-2-nul", base(command=["ls", "a", "b\x00c"]), "command[2]"),
    ("command-1-long", base(command=["ls", "x" * 4097]), "command[1]"),
    ("call-no-colon", base(command=None, call="module.func"), "call"),
    ("call-int", base(command=None, call=5), "call"),
    ("call-bad-ident", base(command=None, call="1mod:f"), "call"),
    ("call-too-long", base(command=None, call="a" * 250 + ".b:cdefgh"), "call"),
    ("timeout-zero", base(timeout="0s"), "timeout"),
    ("timeout-sub-second", base(timeout="999ms"), "timeout"),
    ("timeout-too-long", base(timeout="8d"), "timeout"),
    ("timeout-garbage", base(timeout="forever"), "timeout"),
    ("timeout-bool", base(timeout=True), "timeout"),
    ("timeout-negative", base(timeout=-5), "timeout"),
    ("timeout-float", base(timeout=1.5), "timeout"),
    ("overlap-bad", base(overlap="sometimes"), "overlap"),
    ("overlap-int", base(overlap=1), "overlap"),
    ("overlap-list", base(overlap=["skip"]), "overlap"),
    ("misfire-str", base(misfire="once"), "misfire"),
    ("misfire-unknown", base(misfire={"polcy": "once"}), "misfire.polcy"),
    ("misfire-policy", base(misfire={"policy": "twice"}), "misfire.policy"),
    ("misfire-grace-negative", base(misfire={"grace": "-1s"}), "misfire.grace"),
    ("misfire-grace-too-long", base(misfire={"grace": "367d"}), "misfire.grace"),
    ("misfire-grace-list", base(misfire={"grace": [1]}), "misfire.grace"),
    ("misfire-catchup-zero", base(misfire={"max_catchup": 0}), "misfire.max_catchup"),
    ("misfire-catchup-big", base(misfire={"max_catchup": 1001}), "misfire.max_catchup"),
    ("misfire-catchup-bool", base(misfire={"max_catchup": True}), "misfire.max_catchup"),
    ("misfire-catchup-str", base(misfire={"max_catchup": "3"}), "misfire.max_catchup"),
    ("retries-int", base(retries=3), "retries"),
    ("retries-unknown", base(retries={"maximum": 3}), "retries.maximum"),
    ("retries-max-negative", base(retries={"max": -1}), "retries.max"),
    ("retries-max-big", base(retries={"max": 101}), "retries.max"),
    ("retries-max-bool", base(retries={"max": False}), "retries.max"),
    ("retries-max-float", base(retries={"max": 1.0}), "retries.max"),
    ("retries-backoff", base(retries={"backoff": "25h"}), "retries.backoff"),
    ("retries-backoff-garbage", base(retries={"backoff": "soon"}), "retries.backoff"),
    ("retries-backoff-max", base(retries={"backoff_max": "8d"}), "retries.backoff_max"),
    ("on-node-lost", base(on_node_lost="panic"), "on_node_lost"),
    ("on-node-lost-none", base(on_node_lost=None), "on_node_lost"),
    ("tags-str", base(tags="gpu"), "tags"),
    ("tags-too-many", base(tags=[f"t{i}" for i in range(MAX_TAGS + 1)]), "tags"),
    ("tags-0-int", base(tags=[1]), "tags[0]"),
    ("tags-1-space", base(tags=["ok", "not ok"]), "tags[1]"),
    ("tags-0-empty", base(tags=[""]), "tags[0]"),
    ("tags-0-long", base(tags=["x" * 65]), "tags[0]"),
    ("jitter-too-long", base(jitter="2h"), "jitter"),
    ("jitter-negative", base(jitter=-1), "jitter"),
    ("jitter-garbage", base(jitter="abit"), "jitter"),
    ("paused-str", base(paused="yes"), "paused"),
    ("paused-int", base(paused=1), "paused"),
    ("paused-none", base(paused=None), "paused"),
    ("env-str", base(env="A=1"), "env"),
    ("env-list", base(env=[["A", "1"]]), "env"),
    ("env-too-many", base(env={f"V{i}": "x" for i in range(MAX_ENV + 1)}), "env"),
    ("env-name-digit", base(env={"1A": "x"}), "env"),
    ("env-name-dash", base(env={"A-B": "x"}), "env"),
    ("env-name-empty", base(env={"": "x"}), "env"),
    ("env-name-int", base(env={1: "x"}), "env"),
    ("env-name-reserved", base(env={"RAFTSCHED_NODE": "x"}), "env.RAFTSCHED_NODE"),
]


@pytest.mark.parametrize("spec,field", [pytest.param(s, f, id=i) for i, s, f in BAD])
def test_bad_spec_names_field(spec: Any, field: str) -> None:
    before = copy.deepcopy(spec)
    with pytest.raises(InvalidSpec) as ei:
        JobSpec.from_spec(spec)
    assert ei.value.field == field
    assert ei.value.code == "invalid_spec"
    assert str(ei.value).startswith(f"{field}: ")
    assert isinstance(ei.value, ValueError)
    assert spec == before  # validation never mutates its input


BAD_ENV_VALUES: list[tuple[str, Any]] = [
    ("int", 12345),
    ("none", None),
    ("bytes", SECRET.encode()),
    ("nul", SECRET + "\x00tail"),
    ("too-long", SECRET * (MAX_ENV_VALUE // len(SECRET) + 1)),
    ("list", [SECRET]),
]


@pytest.mark.parametrize("value", [pytest.param(v, id=i) for i, v in BAD_ENV_VALUES])
def test_bad_env_value_never_in_message(value: Any) -> None:
    with pytest.raises(InvalidSpec) as ei:
        JobSpec.from_spec(base(env={"OK": "fine", "TOKEN": value}))
    assert ei.value.field == "env.TOKEN"
    text = str(ei.value) + repr(ei.value) + repr(ei.value.to_wire())
    assert SECRET not in text
    assert "12345" not in text
    assert "fine" not in text


def test_env_reserved_name_does_not_leak_value() -> None:
    with pytest.raises(InvalidSpec) as ei:
        JobSpec.from_spec(base(env={"RAFTSCHED_SECRET": SECRET}))
    assert SECRET not in str(ei.value)


def test_env_bad_name_does_not_leak_other_values() -> None:
    with pytest.raises(InvalidSpec) as ei:
        JobSpec.from_spec(base(env={"GOOD": SECRET, "bad-name": SECRET}))
    assert ei.value.field == "env"
    assert SECRET not in str(ei.value)


def test_unknown_field_name_is_bounded() -> None:
    with pytest.raises(InvalidSpec) as ei:
        JobSpec.from_spec(base(**{"z" * 500: 1}))
    assert len(ei.value.field) <= 64


# --------------------------------------------------------------------- redaction

def test_redacted_masks_env_values() -> None:
    spec = JobSpec.from_spec(base(env={"TOKEN": SECRET, "USER": "bob"}))
    red = spec.redacted()
    assert red["env"] == {"TOKEN": "***", "USER": "***"}
    assert SECRET not in repr(red)
    # to_spec keeps them (it is what the log carries); redacted() did not mutate the spec.
    assert spec.to_spec()["env"] == {"TOKEN": SECRET, "USER": "bob"}
    assert spec.env == {"TOKEN": SECRET, "USER": "bob"}
    red_no_env = JobSpec.from_spec(base()).redacted()
    assert red_no_env["env"] == {}


# --------------------------------------------------------------------- round trip

_durations_ms = st.integers(min_value=0, max_value=3 * 86_400_000)
_ident = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,10}", fullmatch=True)
_CRONS = ["* * * * *", "*/5 * * * *", "0 3 * * mon-fri", "30 2 * * *", "0 0 1 * *",
          "15 10 * * 0", "0 */2 * * *", "10 * * * * *", "0 0 l * *", "@hourly", "@weekly",
          "0 9 1,15 * 1"]
_TZS = ["UTC", "Europe/Berlin", "America/New_York", "Asia/Kolkata", "Australia/Lord_Howe"]


@st.composite
def schedules(draw: Any) -> dict[str, Any]:
    kind = draw(st.sampled_from(["every", "cron", "at"]))
    if kind == "every":
        every = draw(st.integers(min_value=1000, max_value=366 * 86_400_000))
        out: dict[str, Any] = {"every": _fmt(every)}
        if draw(st.booleans()):
            out["offset"] = _fmt(draw(st.integers(min_value=0, max_value=every - 1)))
        return out
    if kind == "cron":
        out = {"cron": draw(st.sampled_from(_CRONS))}
        if draw(st.booleans()):
            out["tz"] = draw(st.sampled_from(_TZS))
        return out
    at = draw(st.integers(min_value=-10**12, max_value=10**13))
    return {"at": _iso(at)}


def _fmt(ms: int) -> str:
    from raftsched.core.durations import format_duration
    return format_duration(ms)


def _iso(ms: int) -> str:
    from datetime import UTC, datetime, timedelta
    d = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=ms)
    return d.strftime("%Y-%m-%dT%H:%M:%S") + f".{ms % 1000:03d}Z"


@st.composite
def valid_specs(draw: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "id": draw(st.from_regex(r"[A-Za-z0-9_.-]{1,20}", fullmatch=True)),
        "schedule": draw(schedules()),
    }
    if draw(st.booleans()):
        spec["command"] = draw(st.lists(st.text(
            alphabet=st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)),
            max_size=8), min_size=1, max_size=4).filter(lambda a: a[0] != ""))
    else:
        spec["call"] = f"{draw(_ident)}.{draw(_ident)}:{draw(_ident)}"
    optional: dict[str, Any] = {
        "timeout": st.integers(min_value=1000, max_value=7 * 86_400_000).map(_fmt),
        "overlap": st.sampled_from([o.value for o in Overlap]),
        "misfire": st.fixed_dictionaries({}, optional={
            "policy": st.sampled_from([p.value for p in MisfirePolicy]),
            "grace": _durations_ms.map(_fmt),
            "max_catchup": st.integers(min_value=1, max_value=1000)}),
        "retries": st.fixed_dictionaries({}, optional={
            "max": st.integers(min_value=0, max_value=100),
            "backoff": st.integers(min_value=0, max_value=86_400_000).map(_fmt),
            "backoff_max": _durations_ms.map(_fmt)}),
        "on_node_lost": st.sampled_from([o.value for o in OnNodeLost]),
        "tags": st.lists(st.from_regex(r"[A-Za-z0-9_.:-]{1,10}", fullmatch=True), max_size=4),
        "jitter": st.integers(min_value=0, max_value=3_600_000).map(_fmt),
        "paused": st.booleans(),
        "env": st.dictionaries(
            st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,8}", fullmatch=True).filter(
                lambda n: not n.startswith("RAFTSCHED_")),
            st.text(alphabet=st.characters(blacklist_characters="\x00",
                                           blacklist_categories=("Cs",)), max_size=10),
            max_size=4),
    }
    for key, strat in optional.items():
        if draw(st.booleans()):
            spec[key] = draw(strat)
    return spec


@settings(max_examples=examples(150), deadline=None)
@given(valid_specs())
def test_round_trip(raw: dict[str, Any]) -> None:
    spec = JobSpec.from_spec(raw)
    out = spec.to_spec()
    again = JobSpec.from_spec(out)
    assert again == spec
    assert again.to_spec() == out
    # The normalized form writes every field out.
    assert set(out) >= {"id", "schedule", "timeout", "overlap", "misfire", "retries",
                        "on_node_lost", "tags", "jitter", "paused", "env"}
    assert ("command" in out) != ("call" in out)
    # And it is stable under a deep copy (no shared mutable state with the spec).
    mutated = copy.deepcopy(out)
    mutated["env"]["NEW"] = "x"
    assert "NEW" not in spec.env


def test_round_trip_examples() -> None:
    for raw in (base(), base(schedule={"at": "2026-12-01T10:00:00.250+02:00"}),
                base(schedule={"every": "1h", "offset": "15m"}),
                base(schedule={"cron": "0 30 2 * * *", "tz": "Europe/Berlin"})):
        spec = JobSpec.from_spec(raw)
        assert JobSpec.from_spec(spec.to_spec()) == spec


# --------------------------------------------------------------------- retries

def test_delay_exponential_with_cap() -> None:
    r = RetrySpec(max=10, backoff_ms=1000, backoff_max_ms=10_000)
    assert [r.delay_ms(a) for a in range(0, 8)] == [
        1000, 1000, 2000, 4000, 8000, 10_000, 10_000, 10_000]
    assert r.delay_ms(10_000) == 10_000  # no huge shift


def test_delay_defaults_and_zero() -> None:
    d = RetrySpec()
    assert d.delay_ms(1) == DEFAULT_BACKOFF_MS
    assert d.delay_ms(2) == 2 * DEFAULT_BACKOFF_MS
    assert d.delay_ms(100) == DEFAULT_BACKOFF_MAX_MS
    assert RetrySpec(backoff_ms=0).delay_ms(5) == 0
    assert RetrySpec(backoff_ms=5000, backoff_max_ms=1000).delay_ms(1) == 1000


@settings(max_examples=examples(100), deadline=None)
@given(st.integers(0, 86_400_000), st.integers(0, 7 * 86_400_000), st.integers(1, 200))
def test_delay_monotonic_and_bounded(backoff: int, cap: int, attempt: int) -> None:
    r = RetrySpec(max=100, backoff_ms=backoff, backoff_max_ms=cap)
    assert 0 <= r.delay_ms(attempt) <= cap
    assert r.delay_ms(attempt) <= r.delay_ms(attempt + 1)
    assert r.delay_ms(1) == min(backoff, cap)


def test_run_ids() -> None:
    assert run_id_of("a.b-c", 1234) == "a.b-c@1234"
    assert job_of_run("a.b-c@1234") == "a.b-c"
