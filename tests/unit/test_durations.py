"""Durations and RFC 3339 timestamps: parsing, formatting and their round trips."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftsched.core.durations import (
    MAX_DURATION_CHARS,
    format_duration,
    format_timestamp,
    parse_duration,
    parse_timestamp,
)
from raftsched.core.errors import InvalidSpec
from tests.support.budget import examples

pytestmark = pytest.mark.timeout(60)

_S = 1000
_M = 60 * _S
_H = 60 * _M
_D = 24 * _H


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("30s", 30 * _S), ("15m", 15 * _M), ("1h", _H), ("2d", 2 * _D), ("250ms", 250),
        ("1h30m", 90 * _M), ("1.5s", 1500), ("0s", 0), ("0ms", 0),
        ("1d2h3m4s5ms", _D + 2 * _H + 3 * _M + 4 * _S + 5),
        ("0.5h", 30 * _M), ("1.25m", 75 * _S), ("0.001s", 1), ("1.0005s30ms", None),
        ("007s", 7 * _S), ("2h0m", 2 * _H), ("1m500ms", _M + 500),
    ],
)
def test_parse_strings(text: str, ms: int | None) -> None:
    if ms is None:
        with pytest.raises(InvalidSpec, match="finer than a millisecond"):
            parse_duration(text, "f")
    else:
        assert parse_duration(text, "f") == ms


@pytest.mark.parametrize(("value", "ms"), [(0, 0), (1, 1000), (90, 90_000), (86400, _D)])
def test_plain_ints_are_seconds(value: int, ms: int) -> None:
    assert parse_duration(value, "f") == ms


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        (True, "not bool"), (False, "not bool"), (1.5, "not float"), (None, "not NoneType"),
        ([1], "not list"), (-1, "must not be negative"), ("-5s", "must not be negative"),
        ("", "must not be empty"), ("30", "missing unit"), ("5y", "unknown unit 'y'"),
        ("5S", "unknown unit 'S'"), ("5sec", "unknown unit 'sec'"), ("1m1h", "largest first"),
        ("1s1s", "largest first"), ("30m1h", "largest first"), ("1 h", "must not contain spaces"),
        (" 1h", "must not contain spaces"), ("h", "expected a number at position 1"),
        ("1h.5m", "expected a number at position 3"), (".5s", "expected a number"),
        ("1" * 63 + "s" + "1", "too long"), ("1e3s", "unknown unit 'e'"),
        ("1,5s", "missing unit after '1'"), ("１s", "expected a number"),
    ],
)
def test_parse_errors_name_the_field(value: object, problem: str) -> None:
    with pytest.raises(InvalidSpec) as info:
        parse_duration(value, "job.timeout")
    assert info.value.field == "job.timeout"
    assert str(info.value).startswith("job.timeout: ")
    assert problem in str(info.value)
    assert isinstance(info.value, ValueError)


def test_length_limit_is_exact() -> None:
    text = "0" * (MAX_DURATION_CHARS - 1) + "s"
    assert parse_duration(text, "f") == 0
    with pytest.raises(InvalidSpec, match="too long"):
        parse_duration("0" + text, "f")


def test_minimum_and_maximum() -> None:
    assert parse_duration("1s", "f", minimum_ms=1000) == 1000
    assert parse_duration("366d", "f", maximum_ms=366 * _D) == 366 * _D
    with pytest.raises(InvalidSpec, match="at least 1s, got '999ms'"):
        parse_duration("999ms", "f", minimum_ms=1000)
    with pytest.raises(InvalidSpec, match="at most 1h, got 3601"):
        parse_duration(3601, "f", maximum_ms=_H)
    with pytest.raises(InvalidSpec, match="at most 1m"):
        parse_duration("1m1ms", "f", maximum_ms=_M)


def test_huge_values_stay_exact() -> None:
    assert parse_duration("99999999999999999999d", "f") == 99999999999999999999 * _D
    with pytest.raises(InvalidSpec, match="at most"):
        parse_duration(10**30, "f", maximum_ms=10**20)


def test_error_echo_is_bounded() -> None:
    with pytest.raises(InvalidSpec) as info:
        parse_duration(10**200, "f", maximum_ms=1)
    assert len(str(info.value)) < 200


@pytest.mark.parametrize(
    ("ms", "text"),
    [(0, "0s"), (1, "1ms"), (250, "250ms"), (1000, "1s"), (1500, "1s500ms"), (90_000, "1m30s"),
     (_H, "1h"), (_D + _H, "1d1h"), (366 * _D, "366d"), (_D + 1, "1d1ms")],
)
def test_format(ms: int, text: str) -> None:
    assert format_duration(ms) == text


def test_format_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="non-negative"):
        format_duration(-1)
    with pytest.raises(TypeError):
        format_duration(1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        format_duration(True)


@settings(max_examples=examples(300), deadline=None)
@given(st.integers(min_value=0, max_value=10**15))
def test_round_trip_from_ms(ms: int) -> None:
    text = format_duration(ms)
    assert parse_duration(text, "f") == ms
    assert len(text) <= MAX_DURATION_CHARS


_COMPONENT = st.tuples(st.integers(0, 10**6), st.sampled_from(["d", "h", "m", "s", "ms"]))


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(_COMPONENT, min_size=1, max_size=5, unique_by=lambda c: c[1]))
def test_round_trip_from_text(components: list[tuple[int, str]]) -> None:
    order = ["d", "h", "m", "s", "ms"]
    components.sort(key=lambda c: order.index(c[1]))
    text = "".join(f"{n}{unit}" for n, unit in components)
    ms = parse_duration(text, "f")
    unit_ms = {"d": _D, "h": _H, "m": _M, "s": _S, "ms": 1}
    assert ms == sum(n * unit_ms[unit] for n, unit in components)
    canonical = format_duration(ms)
    assert parse_duration(canonical, "f") == ms
    assert format_duration(parse_duration(canonical, "f")) == canonical


@settings(max_examples=examples(200), deadline=None)
@given(st.integers(0, 10**6), st.integers(0, 999), st.sampled_from(["s", "m", "h", "d"]))
def test_decimal_fractions_are_exact(whole: int, frac: int, unit: str) -> None:
    unit_ms = {"d": _D, "h": _H, "m": _M, "s": _S}[unit]
    text = f"{whole}.{frac:03d}{unit}"
    assert parse_duration(text, "f") == whole * unit_ms + frac * unit_ms // 1000


# --- timestamps ---------------------------------------------------------------------

@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("1970-01-01T00:00:00Z", 0),
        ("2026-12-01T00:00:00Z", 1_796_083_200_000),
        ("2026-12-01T01:00:00+01:00", 1_796_083_200_000),
        ("2026-11-30T19:00:00-05:00", 1_796_083_200_000),
        ("2026-12-01t00:00:00z", 1_796_083_200_000),
        ("2026-12-01T00:00:00.250Z", 1_796_083_200_250),
        ("2026-12-01T00:00:00.5Z", 1_796_083_200_500),
        ("2026-12-01T00:00:00.123999999Z", 1_796_083_200_123),
        ("1969-12-31T23:59:59.999Z", -1),
        ("2026-12-01T05:30:00+05:30", 1_796_083_200_000),
    ],
)
def test_parse_timestamp(text: str, ms: int) -> None:
    assert parse_timestamp(text, "at") == ms


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("2026-12-01T00:00:00", "explicit UTC offset"),
        ("2026-12-01 00:00:00Z", "RFC 3339"),
        ("2026-12-01", "RFC 3339"),
        ("2026-13-01T00:00:00Z", "not a valid date"),
        ("2026-02-29T00:00:00Z", "not a valid date"),
        ("2026-12-01T24:00:00Z", "not a valid date"),
        ("2026-12-01T00:00:60Z", "not a valid date"),
        ("2026-12-01T00:00:00+24:00", "not a valid date"),
        ("2026-12-01T00:00:00+0100", "RFC 3339"),
        ("tomorrow", "RFC 3339"),
        ("", "RFC 3339"),
        (1_796_083_200_000, "not int"),
        (None, "not NoneType"),
        ("2026-12-01T00:00:00Z" + " " * 60, "RFC 3339"),
    ],
)
def test_parse_timestamp_errors(value: object, problem: str) -> None:
    with pytest.raises(InvalidSpec) as info:
        parse_timestamp(value, "schedule.at")
    assert info.value.field == "schedule.at"
    assert problem in str(info.value)


@pytest.mark.parametrize(
    ("ms", "text"),
    [(0, "1970-01-01T00:00:00Z"), (1_796_083_200_250, "2026-12-01T00:00:00.250Z"),
     (-1, "1969-12-31T23:59:59.999Z"), (-62_135_596_800_000, "0001-01-01T00:00:00Z")],
)
def test_format_timestamp(ms: int, text: str) -> None:
    assert format_timestamp(ms) == text


@settings(max_examples=examples(200), deadline=None)
@given(st.integers(min_value=-62_135_596_800_000, max_value=253_402_300_799_999))
def test_timestamp_round_trip(ms: int) -> None:
    assert parse_timestamp(format_timestamp(ms), "at") == ms
