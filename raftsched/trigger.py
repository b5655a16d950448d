"""The pure time trigger: the schedule data shape and its fire times.

Kinds: ``cron`` (an expression on the wall clock of an IANA zone), ``every``
(``offset_ms + k * every_ms`` since the Unix epoch: anchored, no drift) and
``at`` (one instant). Times are ``int`` epoch ms, UTC; no clock is read here.

Cron: 5 fields (minute hour day-of-month month day-of-week) or 6 with SECONDS
FIRST; numbers, ``*``, ranges (also wrapping), steps, lists, names, ``?``, ``L``
(last day of month) and the @yearly/@annually/@monthly/@weekly/@daily/@midnight/
@hourly macros. ``W``, ``#``, day-of-week ``L`` and ``H``/``R`` are refused (``R``
is random per replica). Both day fields restricted: either may match (``day_or``).
croniter validates and expands the fields; the search runs on tables built
from the expansion (fast, and exact around DST).

DST rule (classic Vixie cron), chosen per job by the text of the HOUR field:

* Fixed hour (number, list or range: ``30 2 * * *``, ``0 1,2 * * *``): each
  matching wall time fires once, at the earliest instant whose wall clock
  reaches it: a time repeated on fall-back fires at its FIRST occurrence only;
  a time inside a spring-forward gap fires at the first instant after the gap
  (``30 2 * * *``, Europe/Berlin, 2026-03-29: 03:00+02:00), several skipped
  times collapsing into that one run. A daily job runs once every local day.
* Wildcard hour (``*`` or a step starting with ``*``: ``0 * * * *``): elapsed
  time; an instant fires iff its wall clock matches. Repeated times fire twice
  (Berlin fall-back: 01:00+02, 02:00+02, 02:00+01, 03:00+01); times in a gap do
  not exist (spring-forward: 01:00+01, then 03:00+02).

Unlike Vixie cron, a ``*`` minute alone does not make a job "wildcard". Assumed:
no zone changes its UTC offset twice within a day (tzdata minimum: ~4 days).
"""

from __future__ import annotations

import calendar
import enum
import functools
import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from croniter import croniter

from raftsched.durations import format_duration, format_timestamp, parse_duration, parse_timestamp
from raftsched.errors import InvalidSpec

__all__ = ["MAX_CRON_CHARS", "MAX_EVERY_MS", "MIN_EVERY_MS", "Schedule", "ScheduleKind",
           "count_fires", "fire_times", "jitter_ms", "latest_fire_at_or_before", "next_fire"]

MIN_EVERY_MS = 1_000
MAX_EVERY_MS = 366 * 86_400_000
MAX_CRON_CHARS = 256
_DAY_MS = 86_400_000
# Cron search stays where datetime works, with room for UTC offsets.
_MIN_MS = -62_135_424_000_000  # 0001-01-03T00:00:00Z
_MAX_MS = 253_401_955_200_000  # 9999-12-28T00:00:00Z
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_EPOCH_NAIVE = datetime(1970, 1, 1)
_EPOCH_ORDINAL = _EPOCH_NAIVE.toordinal()
_ONE_MS = timedelta(milliseconds=1)
_MACROS = {"@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *",
           "@weekly": "0 0 * * 0", "@daily": "0 0 * * *", "@midnight": "0 0 * * *",
           "@hourly": "0 * * * *"}


class ScheduleKind(enum.StrEnum):
    """What a schedule is made of; the value is the spec key."""

    #: A cron expression evaluated on the wall clock of ``tz``.
    cron = "cron"
    #: A fixed interval anchored at the Unix epoch (plus ``offset_ms``).
    every = "every"
    #: A single instant.
    at = "at"


@dataclass(frozen=True, slots=True, kw_only=True)
class Schedule:
    """When a job fires. Build it from user input with :meth:`from_spec`; direct
    construction (snapshot rows) checks the shape only, not the cron text or zone.

    :var kind: which of the fields below are in use.
    :var cron: normalized cron expression (5 fields, or 6 with seconds first); cron only.
    :var tz: IANA zone the cron expression is read in; ``"UTC"`` for other kinds.
    :var every_ms: interval length, 1 s .. 366 d; every only.
    :var offset_ms: interval phase, ``0 <= offset_ms < every_ms``: fire times are
        ``offset_ms + k * every_ms`` since the epoch; 0 for other kinds.
    :var at_ms: the one instant; at only.
    """

    kind: ScheduleKind
    cron: str | None = None
    tz: str = "UTC"
    every_ms: int | None = None
    offset_ms: int = 0
    at_ms: int | None = None

    def __post_init__(self) -> None:
        # Cheap checks only: a snapshot restore rebuilds millions of these.
        kind = ScheduleKind(self.kind)
        object.__setattr__(self, "kind", kind)
        c, z, e, o, a = self.cron, self.tz, self.every_ms, self.offset_ms, self.at_ms
        if kind is ScheduleKind.cron:
            ok = isinstance(c, str) and isinstance(z, str) and (e, o, a) == (None, 0, None)
        elif kind is ScheduleKind.every:
            ok = (type(e) is int and type(o) is int and MIN_EVERY_MS <= e <= MAX_EVERY_MS
                  and 0 <= o < e and (c, z, a) == (None, "UTC", None))
        else:
            ok = (type(a) is int and _MIN_MS <= a <= _MAX_MS
                  and (c, z, e, o) == (None, "UTC", None, 0))
        if not ok:
            raise InvalidSpec("schedule", f"fields do not make a valid {kind.value} schedule")

    @classmethod
    def from_spec(cls, spec: object, field: str = "schedule") -> Schedule:
        """Validate and normalize a spec map; errors name ``field`` or ``field.<key>``.

        Exactly one of ``{"cron": str, "tz": str}`` (tz optional, default UTC),
        ``{"every": duration, "offset": duration}`` (offset optional) or
        ``{"at": RFC 3339 string with Z or an explicit offset}``.
        """
        if not isinstance(spec, Mapping) or not all(isinstance(k, str) for k in spec):
            raise InvalidSpec(field, "must be a map with one of the keys cron, every, at")
        kinds = [k for k in ("cron", "every", "at") if k in spec]
        if len(kinds) != 1:
            got = f", got {' and '.join(kinds)}" if kinds else ""
            raise InvalidSpec(field, f"needs exactly one of cron, every, at{got}")
        kind = ScheduleKind(kinds[0])
        for key in sorted(spec):
            if key not in _KEYS[kind]:
                known = any(key in keys for keys in _KEYS.values())
                raise InvalidSpec(f"{field}.{key[:64]}",
                                  f"is not allowed with {kind.value}" if known else "unknown key")
        if kind is ScheduleKind.cron:
            text, tz = spec["cron"], spec.get("tz", "UTC")
            try:
                if not isinstance(text, str):
                    raise _BadCron(f"must be a cron expression string, not {type(text).__name__}")
                expr = _compile(text).expr
            except _BadCron as exc:
                raise InvalidSpec(f"{field}.cron", str(exc)) from None
            try:  # "localtime"/"posixrules" are host files, not zones: replicas could differ
                if len(tz) > 64 or tz in ("localtime", "posixrules") or not _TZ_RE.fullmatch(tz):
                    raise ValueError(tz)
                _zone(tz)
            except Exception:  # zoneinfo raises KeyError, ValueError or OSError subclasses
                raise InvalidSpec(f"{field}.tz", "must be a known IANA time zone name like "
                                                 f"'Europe/Berlin', got {str(tz)[:64]!r}") from None
            return cls(kind=kind, cron=expr, tz=tz)
        if kind is ScheduleKind.every:
            every = parse_duration(spec["every"], f"{field}.every",
                                   minimum_ms=MIN_EVERY_MS, maximum_ms=MAX_EVERY_MS)
            offset = parse_duration(spec.get("offset", 0), f"{field}.offset")
            if offset >= every:
                raise InvalidSpec(f"{field}.offset",
                                  f"must be less than every ({format_duration(every)})")
            return cls(kind=kind, every_ms=every, offset_ms=offset)
        at = parse_timestamp(spec["at"], f"{field}.at")
        if not _MIN_MS <= at <= _MAX_MS:
            raise InvalidSpec(f"{field}.at", f"is out of the supported range: {spec['at']!r}")
        return cls(kind=kind, at_ms=at)

    def to_spec(self) -> dict[str, Any]:
        """The normalized msgpack-friendly map; ``from_spec`` of it equals ``self``."""
        if self.kind is ScheduleKind.cron:
            return {"cron": self.cron, "tz": self.tz}
        if self.kind is ScheduleKind.at:
            return {"at": format_timestamp(self.at_ms)}
        out: dict[str, Any] = {"every": format_duration(self.every_ms)}
        if self.offset_ms:
            out["offset"] = format_duration(self.offset_ms)
        return out


_KEYS = {ScheduleKind.cron: frozenset({"cron", "tz"}),
         ScheduleKind.every: frozenset({"every", "offset"}), ScheduleKind.at: frozenset({"at"})}


def next_fire(schedule: Schedule, after_ms: int) -> int | None:
    """The smallest fire time strictly greater than ``after_ms``, or ``None``."""
    if schedule.kind is ScheduleKind.every:
        every, offset = schedule.every_ms, schedule.offset_ms
        return offset + ((after_ms - offset) // every + 1) * every
    if schedule.kind is ScheduleKind.at:
        return schedule.at_ms if schedule.at_ms > after_ms else None
    return None if after_ms >= _MAX_MS else _cron_fire(schedule, max(after_ms, _MIN_MS), True)


def fire_times(schedule: Schedule, after_ms: int, until_ms: int, limit: int) -> list[int]:
    """Ascending fire times ``t`` with ``after_ms < t <= until_ms``: the oldest ``limit``."""
    out: list[int] = []
    t: int | None = after_ms
    while len(out) < limit and (t := next_fire(schedule, t)) is not None and t <= until_ms:
        out.append(t)
    return out


def count_fires(schedule: Schedule, after_ms: int, until_ms: int, cap: int) -> tuple[int, bool]:
    """How many fire times lie in ``(after_ms, until_ms]``, as ``(n, exact)``.

    every/at: exact arithmetic whatever ``cap`` is. cron: steps through at most
    ``cap`` fires; ``(n, True)`` when there are ``n <= cap``, ``(cap, False)`` when more.
    """
    if until_ms <= after_ms:
        return 0, True
    if schedule.kind is ScheduleKind.every:
        every, offset = schedule.every_ms, schedule.offset_ms
        return (until_ms - offset) // every - (after_ms - offset) // every, True
    if schedule.kind is ScheduleKind.at:
        return int(after_ms < schedule.at_ms <= until_ms), True
    n = 0
    t: int | None = after_ms
    while (t := next_fire(schedule, t)) is not None and t <= until_ms:
        if n == cap:
            return cap, False
        n += 1
    return n, True


def latest_fire_at_or_before(schedule: Schedule, after_ms: int, until_ms: int) -> int | None:
    """The newest fire time in ``(after_ms, until_ms]``, or ``None``; cheap for any range."""
    if until_ms <= after_ms:
        return None
    if schedule.kind is ScheduleKind.every:
        every, offset = schedule.every_ms, schedule.offset_ms
        t: int | None = offset + (until_ms - offset) // every * every
    elif schedule.kind is ScheduleKind.at:
        t = schedule.at_ms
    else:
        t = None if until_ms < _MIN_MS else _cron_fire(schedule, min(until_ms, _MAX_MS), False)
    return t if t is not None and after_ms < t <= until_ms else None


def jitter_ms(job_id: str, scheduled_ms: int, max_ms: int) -> int:
    """A deterministic pseudo-random delay in ``[0, max_ms]`` for one run."""
    if max_ms < 0:
        raise ValueError(f"max_ms must not be negative, got {max_ms}")
    if max_ms == 0:
        return 0
    # blake2b, not hash(): that is salted per process, and replicas must agree.
    digest = hashlib.blake2b(f"{job_id}\x00{scheduled_ms}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % (max_ms + 1)


# --- cron: parsing -------------------------------------------------------------------

class _BadCron(ValueError):
    """A cron expression was refused; the message is the user-facing problem."""


@dataclass(frozen=True, slots=True, kw_only=True)
class _Cron:
    """A compiled cron expression: tables mapping a value to the nearest allowed one.

    :var expr: the normalized expression.
    :var wild_hour: the hour field starts with ``*`` (the DST "elapsed time" rule).
    :var nexts: per level (year, month, day, hour, minute, second; year and day
        unused), ``t[x]`` is the smallest allowed value ``>= x``, ``_LIMITS[level]`` if none.
    :var prevs: same levels, the largest allowed value ``<= x``, below ``_LOWS[level]`` if none.
    :var day_next: as ``nexts``, per ``_month_key`` (month length, weekday of the 1st).
    :var day_prev: as ``prevs``, per ``_month_key``.
    """

    expr: str
    wild_hour: bool
    nexts: tuple[tuple[int, ...], ...]
    prevs: tuple[tuple[int, ...], ...]
    day_next: tuple[tuple[int, ...], ...]
    day_prev: tuple[tuple[int, ...], ...]


_FIELD_NAMES = ("second", "minute", "hour", "day-of-month", "month", "day-of-week")
_FIELD_CHARS = tuple(re.compile(p) for p in (r"[0-9*/,-]+",) * 3 + (
    r"[0-9*/,?l-]+", r"[0-9a-z*/,-]+", r"[0-9a-z*/,?-]+"))
_NAMES: tuple[dict[str, int], ...] = ({},) * 4 + (
    {n: i + 1 for i, n in enumerate("jan feb mar apr may jun jul aug sep oct nov dec".split())},
    {n: i for i, n in enumerate("sun mon tue wed thu fri sat".split())})
_RANGE_RE = re.compile(r"([0-9a-z]+)-([0-9a-z]+)(?:/[0-9]+)?")
_TZ_RE = re.compile(r"[A-Za-z][A-Za-z0-9_+-]*(?:/[A-Za-z0-9_+-]+)*")
# Per level (year, month, day, hour, minute, second): lowest and highest value,
# and the "nothing left" mark of the next-tables.
_LOWS = (0, 1, 1, 0, 0, 0)
_HIGHS = (0, 12, 31, 23, 59, 59)
_LIMITS = (0, 13, 32, 24, 60, 60)


@functools.lru_cache(maxsize=4096)
def _compile(text: str) -> _Cron:
    if len(text) > MAX_CRON_CHARS:
        raise _BadCron(f"is too long ({len(text)} characters, at most {MAX_CRON_CHARS})")
    if not re.fullmatch(r"[\t\x20-\x7e]*", text):
        raise _BadCron("may only contain printable ASCII characters")
    low = text.strip().lower()
    if low.startswith("@"):
        if low not in _MACROS:
            raise _BadCron(f"unknown macro {low[:32]!r} (use {', '.join(sorted(_MACROS))})")
        low = _MACROS[low]
    parts = low.split()
    if len(parts) not in (5, 6):
        raise _BadCron("needs 5 fields (minute hour day-of-month month day-of-week) "
                       f"or 6 with seconds first, got {len(parts)}")
    six = len(parts) == 6
    for idx, part in enumerate(parts if six else ["0", *parts]):
        _screen_field(idx, part)
    expr = " ".join(parts)
    try:
        expanded, nth = croniter.expand(expr, second_at_beginning=six)
    except Exception as exc:  # whatever croniter raises, the text is not a cron expression
        raise _BadCron(f"is not a valid cron expression: {str(exc)[:160]}") from None
    if nth:
        raise _BadCron("nth/last weekday forms ('#', 'L' in day-of-week) are not supported")
    minutes, hours, doms, months, dows = expanded[:5]
    sets = [frozenset(range(lo, hi + 1)) if "*" in vals else frozenset(map(int, vals))
            for vals, lo, hi in (([], 0, 0), (months, 1, 12), ([], 0, 0), (hours, 0, 23),
                                 (minutes, 0, 59), (expanded[5] if six else [0], 0, 59))]
    # croniter iterates "0 0 31 2 *" until its search gives up; refuse it up front.
    if not any(_days_allowed(doms, dows, calendar.monthrange(2000, m)[1], 0) for m in sets[1]):
        raise _BadCron("never fires (no allowed day exists in any allowed month)")
    days = [_days_allowed(doms, dows, n, first) for n in (28, 29, 30, 31) for first in range(7)]
    return _Cron(
        expr=expr, wild_hour=parts[-4].startswith("*"),
        nexts=tuple(_table(a, lim + 1, lim, True) for a, lim in zip(sets, _LIMITS, strict=True)),
        prevs=tuple(_table(a, hi + 1, lo - 1, False)
                    for a, lo, hi in zip(sets, _LOWS, _HIGHS, strict=True)),
        day_next=tuple(_table(a, 33, 32, True) for a in days),
        day_prev=tuple(_table(a, 32, 0, False) for a in days))


def _screen_field(idx: int, part: str) -> None:
    # Screened here because croniter accepts forms that must not be (see module doc).
    name, chars = _FIELD_NAMES[idx], _FIELD_CHARS[idx]
    if not chars.fullmatch(part):
        bad = next(ch for ch in part if not chars.fullmatch(ch))
        hint = {"w": "; W (nearest weekday)", "#": "; # (nth weekday)", "h": "; H (hashed)",
                "r": "; R (random)"}.get(bad)
        raise _BadCron(f"{name} field {part[:32]!r} has an unsupported character {bad!r}"
                       + (f"{hint} is not supported" if hint else ""))
    for token in part.split(","):
        if not token:
            raise _BadCron(f"{name} field {part[:32]!r} has an empty list item")
        if token[0] in "hr":
            raise _BadCron(f"{name} field: hashed/random values (H, R) are not supported")
        m = _RANGE_RE.fullmatch(token)
        bounds = [int(b) if b.isdigit() else _NAMES[idx].get(b) for b in m.groups()] if m else []
        if idx == 5:
            bounds = [0 if b == 7 else b for b in bounds]
        # croniter reads an equal-bound range ("5-5") as the WHOLE field.
        if bounds and bounds[0] == bounds[1] is not None:
            raise _BadCron(f"{name} field: range {token!r} has equal bounds; write {m[1]!r}")


def _days_allowed(doms: list[Any], dows: list[Any], mlen: int, first: int) -> frozenset[int]:
    """Allowed days of a month of ``mlen`` days whose 1st is weekday ``first`` (0 = Sunday)."""
    every_day = frozenset(range(1, mlen + 1))
    by_dom = every_day if "*" in doms else frozenset(
        mlen if v == "l" else v for v in doms if v == "l" or v <= mlen)
    by_dow = every_day if "*" in dows else frozenset(
        d for d in every_day if (first + d - 1) % 7 in dows)
    return by_dom & by_dow if "*" in doms or "*" in dows else by_dom | by_dow


# Cached so that equal tables (most day tables) are shared between compiled expressions.
@functools.lru_cache(maxsize=8192)
def _table(allowed: frozenset[int], size: int, none: int, forward: bool) -> tuple[int, ...]:
    """``t[x]`` = nearest allowed value ``>= x`` (forward) or ``<= x``, else ``none``."""
    out, near = [], none
    for i in range(size - 1, -1, -1) if forward else range(size):
        near = i if i in allowed else near
        out.append(near)
    return tuple(reversed(out)) if forward else tuple(out)


@functools.lru_cache(maxsize=1024)
def _zone(tz: str) -> ZoneInfo | None:
    # None marks UTC, which takes the arithmetic-only path.
    return None if tz == "UTC" else ZoneInfo(tz)


# --- cron: calendar search on "wall ms" (a wall-clock time counted as if UTC) ----------

def _month_key(y: int, mo: int) -> tuple[int, int]:
    """(index into the day tables, month length) for month ``mo`` of year ``y``."""
    monday_first, mlen = calendar.monthrange(y, mo)
    return (mlen - 28) * 7 + (monday_first + 1) % 7, mlen


def _match(c: _Cron, wall: int, forward: bool) -> int | None:
    """The nearest matching wall time ``>= wall`` (forward) or ``<= wall`` (backward)."""
    days, sod = divmod(-(-wall // 1000) if forward else wall // 1000, 86400)
    day = date.fromordinal(days + _EPOCH_ORDINAL)
    v = [day.year, day.month, day.day, sod // 3600, sod // 60 % 60, sod % 60]
    # A satisfiable expression fires within 8 years (Feb 29); this bounds the rest.
    stop = min(v[0] + 16, 9999) if forward else max(v[0] - 16, 1)
    tables, resets, step = (c.nexts, _LOWS, 1) if forward else (c.prevs, _HIGHS, -1)
    level = 1  # index into v; the year level is only ever carried into
    while level < 6:
        if (v[0] - stop) * step > 0:
            return None
        if level == 2:
            key, mlen = _month_key(v[0], v[1])
            if not forward:
                v[2] = min(v[2], mlen)  # after a reset to 31
            x = (c.day_next if forward else c.day_prev)[key][v[2]]
        else:
            x = tables[level][v[level]] if v[level] >= 0 else -1
        if x == _LIMITS[level] or x < _LOWS[level]:  # none left here: carry into the parent
            v[level - 1] += step
            v[level:] = resets[level:]
            level = max(level - 1, 1)
        else:
            if x != v[level]:
                v[level] = x
                v[level + 1:] = resets[level + 1:]
            level += 1
    days = date(*v[:3]).toordinal() - _EPOCH_ORDINAL
    found = ((days * 24 + v[3]) * 60 + v[4]) * 60_000 + v[5] * 1000
    return found if _MIN_MS <= found <= _MAX_MS else None


# --- cron: wall times <-> instants in a zone -------------------------------------------

# Offsets are probed at most this far apart when looking for a transition; the
# one-change-per-day assumption in the module docstring makes that safe.
_PROBE_MS = _DAY_MS


def _offset(zone: ZoneInfo, t: int) -> int:
    return (_EPOCH + timedelta(milliseconds=t)).astimezone(zone).utcoffset() // _ONE_MS


def _change_in(zone: ZoneInfo, lo: int, hi: int, base: int) -> int:
    """The smallest ``t`` in ``(lo, hi]`` whose offset is not ``base`` (one change in there)."""
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if _offset(zone, mid) != base else (mid, hi)
    return hi


def _transition(zone: ZoneInfo, t: int, off: int, end: int) -> int | None:
    """The first transition met walking from ``t`` (offset ``off``) to ``end``, or None."""
    step = _PROBE_MS if end > t else -_PROBE_MS
    while t != end:
        probe = min(t + step, end) if step > 0 else max(t + step, end)
        if _offset(zone, probe) != off:
            lo, hi = (t, probe) if step > 0 else (probe, t)
            return _change_in(zone, lo, hi, _offset(zone, lo))
        t = probe
    return None


def _earliest_instant(zone: ZoneInfo, wall: int) -> int:
    """The first instant whose wall clock reaches ``wall`` (first occurrence or gap end)."""
    local = (_EPOCH_NAIVE + timedelta(milliseconds=wall)).replace(tzinfo=zone)
    # PEP 495: fold=0 reads the pre-transition offset, fold=1 the post-transition one.
    before = local.utcoffset() // _ONE_MS  # type: ignore[operator]
    after = local.replace(fold=1).utcoffset() // _ONE_MS  # type: ignore[operator]
    if before >= after:
        return wall - before
    return _change_in(zone, wall - after, wall - before, before)


def _high_water_wall(zone: ZoneInfo, t: int) -> int:
    """The latest wall-clock time shown at any instant ``<= t``."""
    local = (_EPOCH + timedelta(milliseconds=t)).astimezone(zone)
    now_off = local.utcoffset() // _ONE_MS  # type: ignore[operator]
    if not local.fold:
        return t + now_off
    old_off = local.replace(fold=0).utcoffset() // _ONE_MS  # type: ignore[operator]
    # t repeats wall times already shown: the clock went back in (t - fold length, t].
    return _change_in(zone, t - (old_off - now_off), t, old_off) - 1 + old_off


def _cron_fire(schedule: Schedule, t: int, forward: bool) -> int | None:
    """The first fire time ``> t`` (forward) or the last one ``<= t`` (backward)."""
    c, zone = _compile(schedule.cron), _zone(schedule.tz)
    if zone is None:
        return _match(c, t + forward, forward)
    if not c.wild_hour:
        # Fixed hour: wall w fires at E(w), the earliest instant reaching w, and E only
        # grows with w; so E(w) > t exactly when w is past every wall shown up to t.
        wall = _match(c, _high_water_wall(zone, t) + forward, forward)
        return None if wall is None else _earliest_instant(zone, wall)
    # Wildcard hour: inside one offset segment the wall clock is instant + offset, so
    # the nearest match maps straight to an instant unless a transition comes first.
    off = _offset(zone, t)
    wall = _match(c, t + off + forward, forward)
    while wall is not None:
        cand = wall - off
        change = _transition(zone, t, off, cand)
        if change is None:
            return cand
        t = change if forward else change - 1
        off = _offset(zone, t)
        wall = _match(c, t + off, forward)
    return None
