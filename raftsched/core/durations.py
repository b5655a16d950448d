"""The text forms of time in specs: durations and RFC 3339 timestamps.

A duration is a string of one or more ``<number><unit>`` components, units
``d``, ``h``, ``m``, ``s``, ``ms`` in strictly decreasing order (``"30s"``,
``"1h30m"``, ``"250ms"``, ``"1.5s"``), or a plain non-negative integer meaning
seconds. A timestamp is RFC 3339 with ``Z`` or an explicit offset. Both come
back as ``int`` milliseconds (timestamps: since the Unix epoch, UTC), and the
``format_*`` functions write canonical text that parses back to the same number.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from raftsched.core.errors import InvalidSpec

__all__ = ["MAX_DURATION_CHARS", "format_duration", "format_timestamp", "parse_duration",
           "parse_timestamp"]

#: Longest duration string accepted; anything longer is a mistake or an attack.
MAX_DURATION_CHARS = 64

_UNIT_MS = {"d": 86_400_000, "h": 3_600_000, "m": 60_000, "s": 1_000, "ms": 1}
_UNIT_ORDER = ("d", "h", "m", "s", "ms")
_UNITS_TEXT = "ms, s, m, h or d"
_NUMBER_RE = re.compile(r"([0-9]+)(?:\.([0-9]+))?")
# Any run of letters is read as the unit, so "5sec" or "3y" is reported as an
# unknown unit rather than as garbage at some position.
_UNIT_RE = re.compile(r"[A-Za-z\u00b5\u03bc]+")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_TIMESTAMP_RE = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt][0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]{1,9})?"
    r"(?P<zone>[Zz]|[+-][0-9]{2}:[0-9]{2})?")


def parse_duration(
    value: object, field: str, *, minimum_ms: int = 0, maximum_ms: int | None = None
) -> int:
    """Return ``value`` in milliseconds, or raise ``InvalidSpec(field, ...)``.

    ``value`` is a duration string or a non-negative ``int`` of seconds; ``bool``
    and other types are refused. The result must lie in ``[minimum_ms,
    maximum_ms]`` (no upper bound when ``maximum_ms`` is ``None``).
    """
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise InvalidSpec(field, 'must be a duration like "30s", "1h30m" or "250ms", or a '
                                 f"whole number of seconds, not {type(value).__name__}")
    if isinstance(value, int):
        if value < 0:
            raise InvalidSpec(field, f"must not be negative, got {value}")
        ms = value * 1000
    else:
        ms = _parse_text(value, field)
    if ms < minimum_ms:
        raise InvalidSpec(field, f"must be at least {format_duration(minimum_ms)}, "
                                 f"got {_show(value)}")
    if maximum_ms is not None and ms > maximum_ms:
        raise InvalidSpec(field, f"must be at most {format_duration(maximum_ms)}, "
                                 f"got {_show(value)}")
    return ms


def format_duration(ms: int) -> str:
    """The canonical spelling of ``ms`` milliseconds: ``90000`` -> ``"1m30s"``, 0 -> ``"0s"``."""
    if isinstance(ms, bool) or not isinstance(ms, int):
        raise TypeError(f"format_duration needs an int of milliseconds, not {type(ms).__name__}")
    if ms < 0:
        raise ValueError(f"format_duration needs a non-negative duration, got {ms}")
    parts: list[str] = []
    for unit in _UNIT_ORDER:
        count, ms = divmod(ms, _UNIT_MS[unit])
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts) or "0s"


def parse_timestamp(value: object, field: str) -> int:
    """Epoch milliseconds of an RFC 3339 timestamp with ``Z`` or an explicit offset.

    A naive timestamp is refused (whose local time would it be?); digits finer
    than a millisecond are dropped. Raises ``InvalidSpec(field, ...)``.
    """
    example = 'an RFC 3339 timestamp like "2026-12-01T00:00:00Z"'
    if not isinstance(value, str):
        raise InvalidSpec(field, f"must be {example}, not {type(value).__name__}")
    m = _TIMESTAMP_RE.fullmatch(value) if len(value) <= 64 else None
    if m is None:
        raise InvalidSpec(field, f"must be {example}, got {_show(value)}")
    if m["zone"] is None:
        raise InvalidSpec(field, f"needs an explicit UTC offset (Z or +hh:mm), got {value!r}")
    try:
        parsed = datetime.fromisoformat(value.upper().replace("Z", "+00:00"))
    except ValueError as exc:
        raise InvalidSpec(field, f"is not a valid date and time ({exc}): {value!r}") from None
    return (parsed - _EPOCH) // timedelta(milliseconds=1)


def format_timestamp(ms: int) -> str:
    """RFC 3339 in UTC, milliseconds only when nonzero: ``"2026-12-01T00:00:00Z"``."""
    d = _EPOCH + timedelta(milliseconds=ms)
    text = f"{d.year:04d}-{d.month:02d}-{d.day:02d}T{d.hour:02d}:{d.minute:02d}:{d.second:02d}"
    return text + (f".{ms % 1000:03d}Z" if ms % 1000 else "Z")


def _parse_text(text: str, field: str) -> int:
    if not text:
        raise InvalidSpec(field, "must not be empty")
    if len(text) > MAX_DURATION_CHARS:
        raise InvalidSpec(field, f"is too long ({len(text)} characters, "
                                 f"at most {MAX_DURATION_CHARS})")
    shown = _show(text)
    if text[0] == "-":
        raise InvalidSpec(field, f"must not be negative, got {shown}")
    if any(ch.isspace() for ch in text):
        raise InvalidSpec(field, f"must not contain spaces, got {shown}")
    # Summed as an exact fraction over a power of ten: floats would make "0.3s" 299 ms.
    total_num, total_den = 0, 1
    pos = 0
    last_unit: str | None = None
    while pos < len(text):
        number = _NUMBER_RE.match(text, pos)
        if number is None:
            raise InvalidSpec(field, f"expected a number at position {pos + 1} of {shown}")
        unit_match = _UNIT_RE.match(text, number.end())
        if unit_match is None:
            raise InvalidSpec(field, f"missing unit after {number[0]!r} in {shown} "
                                     f"(use {_UNITS_TEXT})")
        unit, pos = unit_match[0], unit_match.end()
        if unit not in _UNIT_MS:
            raise InvalidSpec(field, f"unknown unit {unit!r} in {shown} (use {_UNITS_TEXT})")
        if last_unit is not None and _UNIT_ORDER.index(unit) <= _UNIT_ORDER.index(last_unit):
            raise InvalidSpec(field, "units must appear once each, largest first "
                                     f"(like 1h30m), got {shown}")
        last_unit = unit
        frac = number[2] or ""
        den = 10 ** len(frac)
        num = (int(number[1]) * den + int(frac or 0)) * _UNIT_MS[unit]
        total_num, total_den = total_num * den + num * total_den, total_den * den
    ms, remainder = divmod(total_num, total_den)
    if remainder:
        raise InvalidSpec(field, f"is finer than a millisecond: {shown}")
    return ms


def _show(value: object) -> str:
    # Echo user input back bounded, so a huge value cannot bloat an error reply.
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
