"""The pure time trigger: schedule parsing, fire-time arithmetic, the DST rule."""

from __future__ import annotations

import calendar
import functools
import time
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta

import pytest
from croniter import croniter
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from raftsched.core.errors import InvalidSpec
from raftsched.core.trigger import (
    AtSchedule,
    CronSchedule,
    EverySchedule,
    Schedule,
    ScheduleKind,
    count_fires,
    fire_times,
    jitter_ms,
    latest_fire_at_or_before,
    next_fire,
    schedule_from_row,
    schedule_from_spec,
    schedule_to_row,
)
from tests.support.budget import examples
from tests.support.zones import zone as tzdata_zone

pytestmark = pytest.mark.timeout(60)

_S, _M, _H, _D = 1000, 60_000, 3_600_000, 86_400_000
ZONES = ["UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "Asia/Kolkata"]
DST_ZONES = ["Europe/Berlin", "America/New_York", "Australia/Lord_Howe"]
PROPS = settings(max_examples=examples(200), deadline=None,
                 suppress_health_check=[HealthCheck.too_slow])
instants = st.integers(946_684_800_000, 4_102_444_800_000)  # 2000 .. 2100


def ms(text: str) -> int:
    """Epoch ms of an ISO timestamp with an offset (``Z`` allowed)."""
    parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return (parsed - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(milliseconds=1)


def cron(expr: str, tz: str = "UTC") -> Schedule:
    return schedule_from_spec({"cron": expr, "tz": tz})


def walk(schedule: Schedule, after: int, until: int, cap: int = 10_000) -> list[int]:
    """Fire times in (after, until] by iterating next_fire: the reference for the rest."""
    out: list[int] = []
    t: int | None = after
    while len(out) < cap and (t := next_fire(schedule, t)) is not None and t <= until:
        out.append(t)
    return out


def local(t: int, tz: str) -> datetime:
    return datetime.fromtimestamp(t / 1000, tzdata_zone(tz))


# --- parsing ------------------------------------------------------------------------------
def test_specs_of_each_kind() -> None:
    s = cron(" 30  2 * * MON-FRI ", "Europe/Berlin")
    assert s == CronSchedule(cron="30 2 * * mon-fri", tz="Europe/Berlin")
    assert s.to_spec() == {"cron": "30 2 * * mon-fri", "tz": "Europe/Berlin"}
    assert schedule_from_spec({"cron": "0 0 * * *"}).tz == "UTC"
    s = schedule_from_spec({"every": "1h30m", "offset": "15m"})
    assert isinstance(s, EverySchedule)
    assert (s.kind, s.every_ms, s.offset_ms) == (ScheduleKind.every, 90 * _M, 15 * _M)
    assert s.to_spec() == {"every": "1h30m", "offset": "15m"}
    assert schedule_from_spec({"every": 60}).to_spec() == {"every": "1m"}
    assert schedule_from_spec({"every": "1m", "offset": "0s"}).to_spec() == {"every": "1m"}
    s = schedule_from_spec({"at": "2026-12-01T01:00:00.250+01:00"})
    assert isinstance(s, AtSchedule)
    assert (s.at_ms, s.to_spec()) == (ms("2026-12-01T00:00:00.250Z"),
                                      {"at": "2026-12-01T00:00:00.250Z"})
    assert schedule_from_spec({"at": "2026-12-01T00:00:00+00:00"}).to_spec() == {
        "at": "2026-12-01T00:00:00Z"}
    assert [k.value for k in ScheduleKind] == ["cron", "every", "at", "after"]
    macros = {"@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *",
              "@weekly": "0 0 * * 0", "@daily": "0 0 * * *", "@midnight": "0 0 * * *",
              "@hourly": "0 * * * *", "@DAILY": "0 0 * * *"}
    assert {m: cron(m).to_spec()["cron"] for m in macros} == macros
    with pytest.raises(InvalidSpec, match="^jobs.3..schedule.cron: "):
        schedule_from_spec({"cron": "x"}, "jobs[3].schedule")


@pytest.mark.parametrize("spec", [
    {"cron": "*/5 * * * *"}, {"cron": "0 9 * * mon-fri", "tz": "America/New_York"},
    {"cron": "@weekly", "tz": "Asia/Kolkata"}, {"cron": "0 0 L 2 *"}, {"cron": "0 0 12 ? * *"},
    {"cron": "0 23-1 * * fri-mon"}, {"every": "30s"}, {"every": "1d", "offset": "2h"},
    {"every": "366d", "offset": "365d23h59m59s999ms"}, {"at": "2026-12-01T00:00:00Z"},
    {"at": "1969-07-20T20:17:40-05:00"}])
def test_round_trip(spec: dict[str, object]) -> None:
    s = schedule_from_spec(spec)
    again = schedule_from_spec(s.to_spec())
    assert again == s and hash(again) == hash(s) and again.to_spec() == s.to_spec()


@pytest.mark.parametrize(("text", "problem"), [
    (5, "must be a cron expression string"), (None, "must be a cron expression string"),
    ("", "needs 5 fields"), ("* * * *", "got 4"), ("* * * * * * *", "got 7"),
    ("61 * * * *", "minute 61 out of range 0-59"), ("* 24 * * *", "hour 24 out of range 0-23"),
    ("0 0 32 * *", "day-of-month 32 out of range 1-31"), ("0 0 0 * *", "day-of-month 0 out"),
    ("0 0 * 13 *", "month 13 out of range 1-12"), ("0 0 * * 8", "day-of-week 8 out of range 0-7"),
    ("60 * * * * *", "second 60 out of range 0-59"), ("5-70 * * * *", "minute 70 out of range"),
    ("*/0 * * * *", "minute step 0 out of range 1-60"), ("0 0 */ * *", "no step after '/'"),
    ("0 0 * foo *", "month 'foo' is not a month name or number (1-12)"),
    ("0 0 * * funday", "day-of-week 'funday' is not a weekday name"),
    ("0 0 * jan-feb-mar *", "is not a value, range or step"),
    ("0 0 31 2 *", "never fires"), ("0 0 30,31 2 *", "never fires"),
    ("5-5 * * * *", "equal bounds"), ("0 0 * jan-jan *", "equal bounds"),
    ("0 0 * * 7-0", "equal bounds; write '0'"), ("0 0 * * 0-0", "equal bounds; write '0'"),
    ("0 0 30 2 */2", "never fires"), ("H * * * *", "H (hashed)"), ("R * * * *", "R (random)"),
    ("0 0 * * r", "hashed/random"), ("0 0 15W * *", "W (nearest weekday)"),
    ("0 0 * * mon#2", "# (nth weekday)"), ("0 0 * * L5", "not supported"),
    ("0 0 ? ? *", "month field"), ("1,,2 * * * *", "empty list item"),
    ("@often", "unknown macro"), ("\u00a00 * * * *", "printable ASCII"),
    ("0 " * 200, "too long")])
def test_cron_errors_name_the_field(text: object, problem: str) -> None:
    with pytest.raises(InvalidSpec) as info:
        schedule_from_spec({"cron": text})
    assert (info.value.field, problem in str(info.value)) == ("schedule.cron", True), info.value
    assert str(info.value).startswith("schedule.cron: ")


@pytest.mark.parametrize("tz", ["", "Mars/Olympus", "/etc/localtime", "../zoneinfo/UTC",
                                "localtime", "Europe", "europe/berlin", 1, "Europe/Berlin "])
def test_tz_errors_name_the_field(tz: object) -> None:
    with pytest.raises(InvalidSpec, match="^schedule.tz: must be a known IANA time zone"):
        schedule_from_spec({"cron": "* * * * *", "tz": tz})


@pytest.mark.parametrize(("spec", "field", "problem"), [
    (None, "schedule", "must be a map"), ("0 * * * *", "schedule", "must be a map"),
    ({1: "x"}, "schedule", "must be a map"), ({}, "schedule", "exactly one of cron, every, at"),
    ({"cron": "* * * * *", "at": "2026-01-01T00:00:00Z"}, "schedule", "got cron and at"),
    ({"cron": "* * * * *", "nope": 1}, "schedule.nope", "unknown key"),
    ({"cron": "* * * * *", "offset": "1s"}, "schedule.offset", "not allowed with cron"),
    ({"every": "1m", "tz": "UTC"}, "schedule.tz", "not allowed with every"),
    ({"every": "999ms"}, "schedule.every", "at least 1s"),
    ({"every": "367d"}, "schedule.every", "at most 366d"),
    ({"every": True}, "schedule.every", "not bool"),
    ({"every": "soon"}, "schedule.every", "expected a number"),
    ({"every": "1m", "offset": "1m"}, "schedule.offset", "less than every (1m)"),
    ({"every": "1m", "offset": -1}, "schedule.offset", "must not be negative"),
    ({"at": "2026-12-01T00:00:00"}, "schedule.at", "explicit UTC offset"),
    ({"at": "2026-12-01"}, "schedule.at", "RFC 3339"),
    ({"at": 1_796_083_200_000}, "schedule.at", "RFC 3339"),
    ({"at": "2026-02-30T00:00:00Z"}, "schedule.at", "not a valid date"),
    ({"at": "0001-01-01T00:00:00Z"}, "schedule.at", "supported range")])
def test_spec_errors_name_the_field(spec: object, field: str, problem: str) -> None:
    with pytest.raises(InvalidSpec) as info:
        schedule_from_spec(spec)
    assert info.value.field == field and str(info.value).startswith(f"{field}: ")
    assert problem in str(info.value)


def test_direct_construction_checks_the_shape_only() -> None:
    # The snapshot path builds schedules from rows without re-validating cron text.
    s = schedule_from_row(["every", None, "UTC", _M, 0, None])
    assert s == EverySchedule(every_ms=_M) == schedule_from_spec({"every": "1m"})
    assert schedule_from_row(["at", None, "UTC", None, 0, 5]) == AtSchedule(at_ms=5)
    assert AtSchedule(at_ms=5).kind is ScheduleKind.at
    assert CronSchedule(cron="* * * * *").kind is ScheduleKind.cron
    for bad in [["cron", None, "UTC", None, 0, None], ["every", None, "UTC", 500, 0, None],
                ["every", None, "UTC", True, 0, None], ["every", None, "UTC", _M, _M, None],
                ["every", None, "Europe/Berlin", _M, 0, None], ["at", None, "UTC", None, 0, None],
                ["at", "* * * * *", "UTC", None, 0, 1],
                ["cron", "* * * * *", "UTC", 1000, 0, None]]:
        with pytest.raises(InvalidSpec):
            schedule_from_row(bad)
    with pytest.raises(ValueError):
        schedule_from_row(["weekly", None, "UTC", None, 0, None])
    with pytest.raises(InvalidSpec):
        EverySchedule(every_ms=_M, offset_ms=_M)


def test_snapshot_rows_keep_the_layout_of_the_bag_of_fields() -> None:
    """[kind, cron, tz, every_ms, offset_ms, at_ms]: the bytes of old snapshots."""
    cases = [(CronSchedule(cron="0 3 * * *", tz="Europe/Berlin"),
              ["cron", "0 3 * * *", "Europe/Berlin", None, 0, None]),
             (EverySchedule(every_ms=_M, offset_ms=5), ["every", None, "UTC", _M, 5, None]),
             (AtSchedule(at_ms=7), ["at", None, "UTC", None, 0, 7])]
    for s, row in cases:
        assert schedule_to_row(s) == row and schedule_from_row(row) == s


# --- every, at and cron basics ----------------------------------------------------------
def test_every_is_anchored_and_at_fires_once() -> None:
    hourly = schedule_from_spec({"every": "1h"})
    starts = [ms("2026-05-01T10:00:00Z") + k * 7_177 for k in range(500)]
    assert {next_fire(hourly, t) for t in starts} == {ms("2026-05-01T11:00:00Z")}  # no drift
    s = schedule_from_spec({"every": "1d", "offset": "2h"})
    day = ms("2026-05-01T00:00:00Z")
    assert next_fire(s, day) == next_fire(s, day + 2 * _H - 1) == day + 2 * _H
    assert next_fire(s, day + 2 * _H) == day + _D + 2 * _H  # exactly on a fire: the next one
    assert next_fire(s, -_D) == 2 * _H - _D  # before the epoch too
    assert latest_fire_at_or_before(s, 0, day + 2 * _H) == day + 2 * _H
    assert latest_fire_at_or_before(s, day + 2 * _H, day + 3 * _H) is None
    assert count_fires(s, day, day + 10 * _D) == 10
    assert fire_times(s, day, day + 3 * _D, 2) == [day + 2 * _H, day + _D + 2 * _H]
    at = ms("2026-12-01T00:00:00Z")
    s = schedule_from_spec({"at": "2026-12-01T00:00:00Z"})
    assert next_fire(s, at - 1) == at and next_fire(s, at) is next_fire(s, at + _D) is None
    assert (fire_times(s, 0, at, 5), fire_times(s, 0, at - 1, 5)) == ([at], [])
    assert (count_fires(s, at - 1, at), count_fires(s, at, at + 1)) == (1, 0)
    assert latest_fire_at_or_before(s, at - 1, at + _D) == at
    assert latest_fire_at_or_before(s, at, at + _D) is None


def test_cron_basics_in_utc() -> None:
    s = cron("*/15 9-17 * * mon-fri")
    assert next_fire(s, ms("2026-05-01T17:45:00Z")) == ms("2026-05-04T09:00:00Z")  # Fri -> Mon
    assert next_fire(s, ms("2026-05-04T09:00:00Z")) == ms("2026-05-04T09:15:00Z")
    assert next_fire(cron("0 0 29 2 *"), ms("2026-01-01T00:00:00Z")) == ms("2028-02-29T00:00:00Z")
    assert next_fire(cron("0 0 29 2 *"), ms("2096-03-01T00:00:00Z")) == ms("2104-02-29T00:00:00Z")
    assert next_fire(cron("0 12 L * *"), ms("2026-02-01T00:00:00Z")) == ms("2026-02-28T12:00:00Z")
    fires = walk(cron("0 0 13 * fri"), ms("2026-03-01T00:00:00Z"), ms("2026-03-31T00:00:00Z"))
    assert [local(t, "UTC").day for t in fires] == [6, 13, 20, 27]  # neither "*": either matches
    berlin = cron("0 0 1 1 *", "Europe/Berlin")
    assert next_fire(berlin, ms("9999-06-01T00:00:00Z")) is None  # the end of time is quiet
    assert next_fire(cron("0 0 1 1 *"), ms("9998-06-01T00:00:00Z")) == ms("9999-01-01T00:00:00Z")
    assert latest_fire_at_or_before(berlin, -(10**15), -(10**14)) is None
    six = cron("15 30 2 * * *")  # seconds first
    assert walk(six, ms("2026-05-01T00:00:00Z"), ms("2026-05-02T03:00:00Z")) == [
        ms("2026-05-01T02:30:15Z"), ms("2026-05-02T02:30:15Z")]
    assert walk(cron("*/10 * * * * *"), ms("2026-05-01T00:00:05Z"), ms("2026-05-01T00:00:30Z")
                ) == [ms(f"2026-05-01T00:00:{sec}Z") for sec in (10, 20, 30)]
    s, t = cron("* * * * * *"), ms("2026-05-01T00:00:00Z")
    for span, want in [(_D, 86_400), (100 * _S, 100), (99 * _S, 99), (0, 0), (-_S, 0),
                       (7 * _D + 1, 7 * 86_400)]:
        assert count_fires(s, t, t + span) == want
    assert fire_times(s, t, t + _D, 0) == []


# --- cronie semantics (issue 12 item 8) ------------------------------------------------------
@pytest.mark.parametrize(("expr", "days"), [
    ("0 0 */2 * mon", [9, 23]),  # "*"-led day-of-month: odd days AND Mondays
    ("0 9 */2 * 1-5", [3, 5, 9, 11, 13, 17, 19, 23, 25, 27, 31]),  # odd weekdays
    ("0 0 1 * */1", [1]),  # "*"-led day-of-week: the 1st only, not every day
    ("0 0 * * mon", [2, 9, 16, 23, 30]),
    ("0 0 13 * fri", [6, 13, 20, 27]),  # neither "*"-led: either field matches
    ("0 0 1-31 * mon", list(range(1, 32))),  # a full range is not "*": ORed
    ("0 0 ? * mon", [2, 9, 16, 23, 30]),  # "?" counts as "*"
    ("0 0 * * 0-7", list(range(1, 32))), ("0 0 * * 0-7/2", [1, 3, 5, 7, 8, 10, 12, 14, 15,
                                                           17, 19, 21, 22, 24, 26, 28, 29, 31]),
    ("0 0 * * 7", [1, 8, 15, 22, 29]), ("0 0 * * 5-7", [1, 6, 7, 8, 13, 14, 15, 20, 21, 22,
                                                        27, 28, 29]),
    ("0 0 * * sun,7", [1, 8, 15, 22, 29])])
def test_day_fields_follow_cronie(expr: str, days: list[int]) -> None:
    # March 2026: the 1st is a Sunday.
    fires = walk(cron(expr), ms("2026-02-28T23:59:59Z"), ms("2026-03-31T23:59:59Z"))
    assert [local(t, "UTC").day for t in fires] == days


@pytest.mark.parametrize(("expr", "tz", "day", "expected"), [
    # minute "*"-led, hour fixed: a wildcard job in cron, so elapsed time.
    ("*/15 2 * * *", "Europe/Berlin", "2026-10-25", [
        "02:00+02:00", "02:15+02:00", "02:30+02:00", "02:45+02:00",
        "02:00+01:00", "02:15+01:00", "02:30+01:00", "02:45+01:00"]),
    ("*/15 2 * * *", "Europe/Berlin", "2026-03-29", []),
    ("*/20 1 * * *", "America/New_York", "2026-11-01", [
        "01:00-04:00", "01:20-04:00", "01:40-04:00", "01:00-05:00", "01:20-05:00",
        "01:40-05:00"]),
    ("*/30 2 * * *", "America/New_York", "2026-03-08", []),
    # both fixed: once, at the first occurrence / the first instant after the gap.
    ("0,30 2 * * *", "Europe/Berlin", "2026-10-25", ["02:00+02:00", "02:30+02:00"]),
    ("15,45 2 * * *", "Europe/Berlin", "2026-03-29", ["03:00+02:00"]),
    ("0-59/30 2 * * *", "Europe/Berlin", "2026-10-25", ["02:00+02:00", "02:30+02:00"])])
def test_dst_wildcard_is_minute_or_hour_starting_with_star(
    expr: str, tz: str, day: str, expected: list[str]
) -> None:
    zone = tzdata_zone(tz)
    start = int(datetime.fromisoformat(f"{day}T00:00").replace(tzinfo=zone).timestamp() * 1000)
    end = int(datetime.fromisoformat(f"{day}T23:59").replace(tzinfo=zone).timestamp() * 1000)
    want = [ms(f"{day}T{e}") for e in expected]
    assert walk(cron(expr, tz), start, end) == want
    assert count_fires(cron(expr, tz), start, end) == len(want)


# --- DST ------------------------------------------------------------------------------------
@pytest.mark.parametrize(("expr", "tz", "start", "end", "expected"), [
    ("30 2 * * *", "Europe/Berlin", "2026-03-27T00:00+01:00", "2026-03-31T23:00+02:00",
     ["03-27T01:30", "03-28T01:30", "03-29T01:00", "03-30T00:30", "03-31T00:30"]),  # gap end
    ("30 2 * * *", "Europe/Berlin", "2026-10-23T00:00+02:00", "2026-10-27T23:00+01:00",
     ["10-23T00:30", "10-24T00:30", "10-25T00:30", "10-26T01:30", "10-27T01:30"]),  # first
    ("30 2 * * *", "America/New_York", "2026-03-06T00:00-05:00", "2026-03-10T23:00-04:00",
     ["03-06T07:30", "03-07T07:30", "03-08T07:00", "03-09T06:30", "03-10T06:30"]),
    ("30 2 * * *", "America/New_York", "2026-10-30T00:00-04:00", "2026-11-03T23:00-05:00",
     ["10-30T06:30", "10-31T06:30", "11-01T07:30", "11-02T07:30", "11-03T07:30"]),
    ("0 1 * * *", "America/New_York", "2026-10-30T00:00-04:00", "2026-11-03T23:00-05:00",
     ["10-30T05:00", "10-31T05:00", "11-01T05:00", "11-02T06:00", "11-03T06:00"]),
    ("15 2 * * *", "Australia/Lord_Howe", "2026-10-02T00:00+10:30", "2026-10-05T23:00+11:00",
     ["10-01T15:45", "10-02T15:45", "10-03T15:30", "10-04T15:15"]),  # 30-minute gap
    ("45 1 * * *", "Australia/Lord_Howe", "2026-04-03T00:00+11:00", "2026-04-06T23:00+10:30",
     ["04-02T14:45", "04-03T14:45", "04-04T14:45", "04-05T15:15"]),  # 01:30-02:00 repeats
    ("0,30 2 * * *", "Europe/Berlin", "2026-03-28T00:00+01:00", "2026-03-30T23:00+02:00",
     ["03-28T01:00", "03-28T01:30", "03-29T01:00", "03-30T00:00", "03-30T00:30"])])
def test_fixed_hour_jobs_run_once_a_day_across_dst(
    expr: str, tz: str, start: str, end: str, expected: list[str]
) -> None:
    s = cron(expr, tz)
    fires = walk(s, ms(start), ms(end))
    assert fires == [ms(f"2026-{e}:00Z") for e in expected]  # explicit UTC instants
    days = [local(t, tz).date() for t in fires]
    assert sorted(set(days)) == [days[0] + timedelta(days=k) for k in range(len(set(days)))]
    if "," not in expr:
        assert len(set(days)) == len(days), "a fixed-hour daily job fired twice on one day"
    for t in fires:  # the backward search agrees on every fire
        assert latest_fire_at_or_before(s, ms(start), t) == t
        assert latest_fire_at_or_before(s, ms(start), t + 10 * _M) == t


@pytest.mark.parametrize(("expr", "tz", "start", "expected"), [
    ("0 * * * *", "Europe/Berlin", "2026-10-25T00:00+02:00",
     ["01:00+02:00", "02:00+02:00", "02:00+01:00", "03:00+01:00", "04:00+01:00"]),
    ("0 * * * *", "Europe/Berlin", "2026-03-29T00:00+01:00",
     ["01:00+01:00", "03:00+02:00", "04:00+02:00"]),
    ("0 * * * *", "America/New_York", "2026-03-08T00:00-05:00",
     ["01:00-05:00", "03:00-04:00", "04:00-04:00"]),
    ("0 * * * *", "America/New_York", "2026-11-01T00:00-04:00",
     ["01:00-04:00", "01:00-05:00", "02:00-05:00", "03:00-05:00"]),
    ("*/30 * * * *", "Europe/Berlin", "2026-10-25T01:45+02:00",
     ["02:00+02:00", "02:30+02:00", "02:00+01:00", "02:30+01:00", "03:00+01:00"]),
    ("*/30 * * * *", "America/New_York", "2026-11-01T00:45-04:00",
     ["01:00-04:00", "01:30-04:00", "01:00-05:00", "01:30-05:00", "02:00-05:00"]),
    ("*/30 * * * *", "Australia/Lord_Howe", "2026-04-05T00:45+11:00",
     ["01:00+11:00", "01:30+11:00", "01:30+10:30", "02:00+10:30"]),
    ("0 */2 * * *", "Europe/Berlin", "2026-03-29T00:00+01:00",
     ["04:00+02:00", "06:00+02:00"])])  # 02:00 does not exist: skipped, not moved
def test_wildcard_hour_jobs_follow_elapsed_time(
    expr: str, tz: str, start: str, expected: list[str]
) -> None:
    s = cron(expr, tz)
    want = [ms(f"{start[:10]}T{e}") for e in expected]
    assert walk(s, ms(start), want[-1]) == want
    assert all(latest_fire_at_or_before(s, ms(start), t) == t for t in want)
    if expr == "0 * * * *":  # every real hour, three days around the transition
        fires = walk(s, want[0] - _D, want[0] + 2 * _D)
        assert {b - a for a, b in zip(fires, fires[1:], strict=False)} == {_H}


# --- a brute-force model of the DST rule -------------------------------------------------
@functools.cache
def _transitions(tz: str, year: int) -> tuple[int, ...]:
    """UTC offset changes of ``tz`` in ``year`` (ms), found by scanning and bisecting."""
    zone = tzdata_zone(tz)

    def off(t: int) -> timedelta | None:
        return datetime.fromtimestamp(t / 1000, zone).utcoffset()

    out, t, end = [], ms(f"{year}-01-01T00:00:00Z"), ms(f"{year + 1}-01-01T00:00:00Z")
    while t < end:
        if off(t) != off(t + 6 * _H):
            lo, hi = t, t + 6 * _H
            while hi - lo > 1:
                mid = (lo + hi) // 2
                lo, hi = (lo, mid) if off(mid) != off(lo) else (mid, hi)
            out.append(hi)
        t += 6 * _H
    return tuple(out)


def _matcher(expr: str) -> Callable[[datetime], bool]:
    """A plain set-membership matcher over croniter's expansion (independent of trigger);
    day fields ANDed when either one's text starts with "*" (cronie)."""
    six = len(expr.split()) == 6
    texts = expr.split()[-5:]
    day_and = texts[2][0] in "*?" or texts[4][0] in "*?"
    exp, _ = croniter.expand(expr, second_at_beginning=six)
    full = [None if "*" in f else set(f) for f in exp]
    mins, hours, doms, months, dows = full[:5]
    secs = full[5] if six else {0}

    def match(w: datetime) -> bool:
        for allowed, value in ((secs, w.second), (mins, w.minute), (hours, w.hour),
                               (months, w.month)):
            if allowed is not None and value not in allowed:
                return False
        last = calendar.monthrange(w.year, w.month)[1]
        dom_ok = doms is None or w.day in doms or ("l" in doms and w.day == last)
        dow_ok = dows is None or (w.isoweekday() % 7) in dows
        return dom_ok and dow_ok if day_and else dom_ok or dow_ok

    return match


def _brute(expr: str, tz: str, start: int, end: int, step: int) -> list[int]:
    """Fire times in (start, end] straight from the DST rule, stepping ``step`` ms: wildcard
    (minute or hour starts with "*"), an instant fires iff its wall clock matches; fixed,
    iff its wall clock is the first to reach a matching wall time. ``start`` must not be
    in a repeated hour."""
    minute, hour = expr.split()[-5:-3]
    match, zone, wild = _matcher(expr), tzdata_zone(tz), minute[0] == "*" or hour[0] == "*"

    def wall(t: int) -> datetime:
        return datetime.fromtimestamp(t / 1000, zone).replace(tzinfo=None, fold=0)

    fires, high = [], wall(start)
    for t in range(start + step, end + 1, step):
        w = wall(t)
        if wild:
            if match(w):
                fires.append(t)
        elif w > high:
            w2 = high + timedelta(milliseconds=step)
            while w2 <= w and not match(w2):
                w2 += timedelta(milliseconds=step)
            if w2 <= w:
                fires.append(t)
            high = w
    return fires


@st.composite
def field(draw: st.DrawFn, lo: int, hi: int, hot: tuple[int, ...] = ()) -> str:
    def value() -> int:
        return draw(st.sampled_from(hot) if hot and draw(st.booleans()) else st.integers(lo, hi))

    kind = draw(st.sampled_from(["star", "step", "one", "range", "rstep", "start", "list"]))
    if kind in ("star", "step"):
        return "*" if kind == "star" else f"*/{draw(st.integers(1, hi - lo + 1))}"
    if kind == "start":
        return f"{value()}/{draw(st.integers(1, 10))}"
    if kind == "list":
        return ",".join(str(v) for v in sorted({value() for _ in range(draw(st.integers(2, 4)))}))
    a, b = value(), value()  # also wrapping ranges (b < a); equal bounds are refused
    return str(a) if a == b else f"{a}-{b}" + (
        f"/{draw(st.integers(1, 5))}" if kind == "rstep" else "")


@st.composite
def cron_exprs(draw: st.DrawFn, six: bool | None = None, mostly_daily: bool = False) -> str:
    six = draw(st.booleans()) if six is None else six
    days = [st.just("*")] * (6 if mostly_daily else 2)
    dom = draw(st.one_of(*days, field(1, 31), st.just("L")))
    month = draw(st.one_of(*days, st.just("*"), field(1, 12)))
    dow = draw(st.one_of(*days, field(0, 7), st.sampled_from(["mon-fri", "sat,sun", "fri-mon"])))
    parts = [draw(field(0, 59, (0, 15, 30, 45))), draw(field(0, 23, (0, 1, 2, 3))), dom, month, dow]
    return " ".join([draw(field(0, 59, (0, 30))), *parts] if six else parts)


def _valid(expr: str, tz: str) -> Schedule:
    try:
        return cron(expr, tz)
    except InvalidSpec:
        assume(False)
        raise


@settings(max_examples=examples(80), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cron_exprs(six=False, mostly_daily=True), st.sampled_from(DST_ZONES),
       st.integers(2001, 2099), st.integers(0, 1), st.integers(1, 36 * 60))
def test_matches_brute_force_around_transitions(
    expr: str, tz: str, year: int, which: int, minutes_before: int
) -> None:
    s = _valid(expr, tz)
    changes = _transitions(tz, year)
    assume(len(changes) == 2)
    start = changes[which] - minutes_before * _M
    end = start + 60 * _H
    want = _brute(expr.lower(), tz, start, end, _M)
    assert walk(s, start, end) == want
    for probe in range(start, end, 7 * _H + 13 * _M):
        before = [t for t in want if t <= probe]
        assert latest_fire_at_or_before(s, start, probe) == (before[-1] if before else None)


@settings(max_examples=examples(20), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cron_exprs(six=True, mostly_daily=True), st.sampled_from(DST_ZONES), st.integers(0, 1),
       st.integers(1, 120))
def test_matches_brute_force_with_seconds(expr: str, tz: str, which: int, minutes: int) -> None:
    s = _valid(expr, tz)
    start = _transitions(tz, 2026)[which] - minutes * _M
    end = start + 3 * _H
    assert walk(s, start, end, cap=20_000) == _brute(expr.lower(), tz, start, end, _S)


# --- properties -----------------------------------------------------------------------------
@PROPS
@given(cron_exprs(), st.sampled_from(ZONES), instants)
def test_cron_always_advances(expr: str, tz: str, t: int) -> None:
    s = _valid(expr, tz)
    seen = []
    for _ in range(50):
        n = next_fire(s, t)
        assert n is not None and n > t
        seen.append(n)
        t = n
    assert seen == sorted(set(seen))


@PROPS
@given(cron_exprs(), instants)
def test_cron_agrees_with_croniter_in_utc(expr: str, t: int) -> None:
    s = _valid(expr, "UTC")
    dom, dow = expr.split()[-3], expr.split()[-1]  # croniter's day_or is ours by text
    it = croniter(s.cron, datetime.fromtimestamp(t / 1000, UTC).replace(tzinfo=None),
                  second_at_beginning=len(expr.split()) == 6,
                  day_or=not (dom[0] in "*?" or dow[0] in "*?"))
    for _ in range(20):
        want = int(it.get_next(datetime).replace(tzinfo=UTC).timestamp() * 1000)
        t = next_fire(s, t)  # type: ignore[assignment]
        assert t == want


@PROPS
@given(st.integers(1000, 366 * _D), st.data(), instants)
def test_every_always_advances_on_its_grid(every: int, data: st.DataObject, t: int) -> None:
    offset = data.draw(st.integers(0, every - 1))
    s = EverySchedule(every_ms=every, offset_ms=offset)
    first = next_fire(s, t)
    assert first is not None and t < first <= t + every and (first - offset) % every == 0
    assert walk(s, t, t + 50 * every) == [first + k * every for k in range(50)]


@st.composite
def schedules(draw: st.DrawFn) -> Schedule:
    kind = draw(st.sampled_from(["cron", "cron", "every", "at"]))
    if kind == "cron":
        return _valid(draw(cron_exprs()), draw(st.sampled_from(ZONES)))
    if kind == "every":
        every = draw(st.sampled_from([1000, 7000, _M, 90 * _M, _D]))
        return EverySchedule(every_ms=every, offset_ms=draw(st.integers(0, every - 1)))
    return AtSchedule(at_ms=draw(instants))


@PROPS
@given(schedules(), instants, st.integers(0, 3 * _D), st.integers(0, 40))
def test_range_functions_agree_with_next_fire(
    s: Schedule, after: int, span: int, limit: int
) -> None:
    until = after + span
    fires = walk(s, after, until, cap=301)
    if len(fires) > 300:  # keep the walk modest: shrink the range to 300 fires
        fires, until = fires[:300], fires[299]
    assert fire_times(s, after, until, limit) == fires[:limit]
    assert fire_times(s, after, until, 1000) == fires
    assert count_fires(s, after, until) == len(fires)
    assert latest_fire_at_or_before(s, after, until) == (fires[-1] if fires else None)


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cron_exprs(), st.sampled_from([*DST_ZONES, "UTC", "Asia/Kolkata"]),
       st.integers(2001, 2099), st.integers(0, 1), st.integers(-3 * _D, 2 * _D),
       st.integers(0, 4 * _D))
def test_fast_count_equals_brute_force_around_transitions(
    expr: str, tz: str, year: int, which: int, shift: int, span: int
) -> None:
    """count_fires works per day from the field tables; the walk steps fire by fire."""
    s = _valid(expr, tz)
    changes = _transitions(tz, year) or (ms(f"{year}-03-29T01:00:00Z"),)
    after = changes[min(which, len(changes) - 1)] + shift
    until = after + span
    fires = walk(s, after, until, cap=3001)
    if len(fires) > 3000:  # too many to walk: shrink the range to the walked part
        fires, until = fires[:3000], fires[2999] + (fires[3000] - fires[2999]) // 2
    assert count_fires(s, after, until) == len(fires)
    mid = after + (until - after) // 3
    assert count_fires(s, after, mid) + count_fires(s, mid, until) == len(fires)


@PROPS
@given(cron_exprs(), st.sampled_from(ZONES), instants, st.integers(0, 800 * _D),
       st.integers(0, 800 * _D))
def test_fast_count_is_additive_over_long_ranges(
    expr: str, tz: str, after: int, a: int, b: int
) -> None:
    s = _valid(expr, tz)
    mid, until = after + min(a, b), after + max(a, b)
    total = count_fires(s, after, until)
    assert total == count_fires(s, after, mid) + count_fires(s, mid, until) >= 0
    first = next_fire(s, after)
    assert (total == 0) == (first is None or first > until)


@pytest.mark.parametrize(("expr", "tz", "start", "end", "want"), [
    # A local week holding a fall-back day has one hour more, a spring-forward one less.
    ("* * * * * *", "Europe/Berlin", "2026-10-22T00:00+02:00", "2026-10-29T00:00+01:00",
     7 * 86_400 + 3600),
    ("* * * * * *", "Europe/Berlin", "2026-03-26T00:00+01:00", "2026-04-02T00:00+02:00",
     7 * 86_400 - 3600),
    ("* * * * *", "Europe/Berlin", "2026-03-26T00:00+01:00", "2026-04-02T00:00+02:00",
     7 * 1440 - 60),
    ("* * * * *", "America/New_York", "2026-10-29T00:00-04:00", "2026-11-05T00:00-05:00",
     7 * 1440 + 60),
    ("30 2 * * *", "Europe/Berlin", "2026-10-22T00:00+02:00", "2026-10-29T00:00+01:00", 7),
    ("30 2 * * *", "Europe/Berlin", "2026-03-26T00:00+01:00", "2026-04-02T00:00+02:00", 7),
    ("0,30 2 * * *", "Europe/Berlin", "2026-03-26T00:00+01:00", "2026-04-02T00:00+02:00",
     13),  # the two times in the gap run once, at 03:00
    ("* * * * *", "UTC", "2026-01-01T00:00Z", "2027-01-01T00:00Z", 365 * 1440),
    ("*/10 * * * * *", "Asia/Kolkata", "2026-01-01T00:00+05:30", "2027-01-01T00:00+05:30",
     365 * 8640)])
def test_count_over_a_local_week_or_year_is_exact(
    expr: str, tz: str, start: str, end: str, want: int
) -> None:
    assert count_fires(cron(expr, tz), ms(start), ms(end)) == want


@pytest.mark.parametrize("tz", ZONES)
def test_latest_fire_is_cheap_over_long_ranges(tz: str) -> None:
    s = cron("*/7 * * * * *", tz)
    until = ms("2026-10-25T01:30:01.5Z")
    # CPU time of this process, not wall time: other processes on a loaded machine do
    # not count. A walk over the year's 4.5 M fire times would take seconds of CPU.
    started = time.process_time()
    latest = latest_fire_at_or_before(s, until - 366 * _D, until)
    assert time.process_time() - started < 0.5
    assert latest is not None and latest <= until
    assert next_fire(s, latest - 1) == latest and next_fire(s, latest) > until  # type: ignore
    new_year = latest_fire_at_or_before(cron("0 0 1 1 *", tz), 0, until)
    assert new_year is not None and local(new_year, tz).date() == date(2026, 1, 1)


# --- jitter ---------------------------------------------------------------------------------
def test_jitter() -> None:
    values = [jitter_ms("job-1", 1_780_000_000_000 + k * _M, 30_000) for k in range(300)]
    assert all(0 <= v <= 30_000 for v in values)
    assert len(set(values)) > 250  # spread out, not a constant
    assert values == [jitter_ms("job-1", 1_780_000_000_000 + k * _M, 30_000) for k in range(300)]
    assert jitter_ms("job-2", 1_780_000_000_000, 30_000) != values[0]
    assert jitter_ms("job-1", 1_780_000_000_000, 0) == 0 and jitter_ms("x", 5, 0) == 0
    assert {jitter_ms("j", k, 1) for k in range(100)} == {0, 1}
    # pinned: must never change between versions or processes (replicas compare these)
    assert (values[0], jitter_ms("a", 0, 10**9)) == (27463, 982576189)
    with pytest.raises(ValueError):
        jitter_ms("job-1", 0, -1)


@settings(max_examples=examples(200), deadline=None)
@given(expr=st.sampled_from(["*/5 * * * *", "30 2 * * *", "15,45 * * * * *", "0 */6 * * *"]),
       zones=st.lists(st.sampled_from(["UTC", "Europe/Berlin", "Australia/Lord_Howe",
                                       "America/St_Johns"]), min_size=2, max_size=2),
       after=st.integers(1_790_000_000_000, 1_830_000_000_000))
def test_remembered_cron_fire_times_match_a_fresh_search(expr: str, zones: list[str],
                                                         after: int) -> None:
    """The next fire time a cron schedule remembers (trigger._cron_next) is the calendar
    search's, for its own zone: two schedules with one expression in two zones, asked in
    turn, each get theirs, also when asked again."""
    from raftsched.core import cron as cronmod
    from raftsched.core import trigger

    want = {z: cronmod.fire(cronmod.compile_cron(expr), cronmod.zone_of(z), after, True)
            for z in zones}
    for _ in range(2):
        for z in zones:
            assert next_fire(CronSchedule(cron=expr, tz=z), after) == want[z]
    assert trigger._cron_next.cache_info().currsize <= trigger._cron_next.cache_info().maxsize
