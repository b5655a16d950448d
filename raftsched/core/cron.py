"""Cron expressions, pure: parsing, the calendar search, counting, and the DST rule.

:mod:`raftsched.core.trigger` is the public face (``Schedule``, ``next_fire`` …); this
module does the work on ``int`` epoch ms. Semantics follow cronie (Vixie cron):

* Day fields: when the TEXT of day-of-month or day-of-week starts with ``*`` (``*``,
  ``*/2``; ``?`` counts as ``*``), a day must match both; only when neither does is
  either enough (``0 0 */2 * mon``: odd days that are Mondays; ``0 0 13 * fri``: the
  13th or any Friday). Day-of-week 0 and 7 are Sunday (``0-7`` is every day).
* DST: a job is *wildcard* when its minute OR hour field starts with ``*`` (cronie's
  ``MIN_STAR || HR_STAR``). Wildcard jobs follow elapsed time: an instant fires iff its
  wall clock matches (a repeated hour fires again, a skipped hour does not exist).
  Fixed jobs fire each matching wall time once, at the earliest instant whose wall
  clock reaches it: the first occurrence on fall-back; the first instant after the
  gap on spring-forward, several skipped times collapsing into that one run (cron
  starts one per skipped time; a run id here is job + instant). The seconds field of
  a 6-field expression does not take part in that choice.

Counting is arithmetic: matching wall times per day come from the field tables, so a
count over a range costs O(months + days with a UTC offset change), not O(fires).
Assumed: no zone changes its UTC offset twice within a day (tzdata minimum: ~4 days).
"""

from __future__ import annotations

import calendar
import functools
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from importlib import resources
from typing import Any
from zoneinfo import ZoneInfo

from croniter import croniter

__all__ = ["MAX_CRON_CHARS", "MAX_MS", "MIN_MS", "BadCron", "Cron", "compile_cron",
           "count_fires", "fire"]

MAX_CRON_CHARS = 256
_DAY_MS = 86_400_000
# The search stays where datetime works, with room for UTC offsets.
MIN_MS = -62_135_424_000_000  # 0001-01-03T00:00:00Z
MAX_MS = 253_401_955_200_000  # 9999-12-28T00:00:00Z
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_EPOCH_NAIVE = datetime(1970, 1, 1)
_EPOCH_ORDINAL = _EPOCH_NAIVE.toordinal()
_ONE_MS = timedelta(milliseconds=1)
#: The Gregorian calendar repeats every 400 years: a satisfiable expression fires
#: within that (Feb 29 on a Sunday can be 40 years apart), which bounds every search.
_SEARCH_YEARS = 400
_MACROS = {"@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *",
           "@weekly": "0 0 * * 0", "@daily": "0 0 * * *", "@midnight": "0 0 * * *",
           "@hourly": "0 * * * *"}


class BadCron(ValueError):
    """A cron expression was refused; the message is the user-facing problem."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Cron:
    """A compiled cron expression: tables mapping a value to the nearest allowed one.

    :var expr: the normalized expression.
    :var wild: minute or hour field starts with ``*`` (cronie's DST "wildcard job").
    :var nexts: per level (year, month, day, hour, minute, second; year and day
        unused), ``t[x]`` is the smallest allowed value ``>= x``, ``_LIMITS[level]`` if none.
    :var prevs: same levels, the largest allowed value ``<= x``, below ``_LOWS[level]`` if none.
    :var day_next: as ``nexts``, per ``_month_key`` (month length, weekday of the 1st).
    :var day_prev: as ``prevs``, per ``_month_key``.
    :var day_count: per ``_month_key``, ``t[d]`` = allowed days ``< d`` (d in 1..32).
    :var months: allowed months.
    :var below: per level hour, minute, second: ``t[x]`` = allowed values ``< x`` (x 0..60).
    :var sizes: allowed values per level hour, minute, second.
    """

    expr: str
    wild: bool
    nexts: tuple[tuple[int, ...], ...]
    prevs: tuple[tuple[int, ...], ...]
    day_next: tuple[tuple[int, ...], ...]
    day_prev: tuple[tuple[int, ...], ...]
    day_count: tuple[tuple[int, ...], ...]
    months: frozenset[int]
    below: tuple[tuple[int, ...], ...]
    sizes: tuple[int, int, int]


_FIELD_NAMES = ("second", "minute", "hour", "day-of-month", "month", "day-of-week")
_RANGES = ((0, 59), (0, 59), (0, 23), (1, 31), (1, 12), (0, 7))
_FIELD_CHARS = tuple(re.compile(p) for p in (r"[0-9*/,-]+",) * 3 + (
    r"[0-9*/,?l-]+", r"[0-9a-z*/,-]+", r"[0-9a-z*/,?-]+"))
_NAMES: tuple[dict[str, int], ...] = ({},) * 4 + (
    {n: i + 1 for i, n in enumerate("jan feb mar apr may jun jul aug sep oct nov dec".split())},
    {n: i for i, n in enumerate("sun mon tue wed thu fri sat".split())})
_TOKEN_RE = re.compile(r"(\*|\?|l|[0-9a-z]+)(?:-([0-9a-z]+))?(?:/([0-9]*))?")
# Per level (year, month, day, hour, minute, second): lowest and highest value,
# and the "nothing left" mark of the next-tables.
_LOWS = (0, 1, 1, 0, 0, 0)
_HIGHS = (0, 12, 31, 23, 59, 59)
_LIMITS = (0, 13, 32, 24, 60, 60)


@functools.lru_cache(maxsize=4096)
def compile_cron(text: str) -> Cron:
    """Validate and compile ``text``; :class:`BadCron` says what is wrong."""
    if len(text) > MAX_CRON_CHARS:
        raise BadCron(f"is too long ({len(text)} characters, at most {MAX_CRON_CHARS})")
    if not re.fullmatch(r"[\t\x20-\x7e]*", text):
        raise BadCron("may only contain printable ASCII characters")
    low = text.strip().lower()
    if low.startswith("@"):
        if low not in _MACROS:
            raise BadCron(f"unknown macro {low[:32]!r} (use {', '.join(sorted(_MACROS))})")
        low = _MACROS[low]
    parts = low.split()
    if len(parts) not in (5, 6):
        raise BadCron("needs 5 fields (minute hour day-of-month month day-of-week) "
                      f"or 6 with seconds first, got {len(parts)}")
    six = len(parts) == 6
    full = parts if six else ["0", *parts]
    for idx, part in enumerate(full):
        _screen_field(idx, part)
    expr = " ".join(parts)
    expanded, nth = _expand(expr, six, full)
    if nth:
        raise BadCron("nth/last weekday forms ('#', 'L' in day-of-week) are not supported")
    minutes, hours, doms, months, dows = expanded[:5]
    sets = [frozenset(range(lo, hi + 1)) if "*" in vals else frozenset(map(int, vals))
            for vals, lo, hi in (([], 0, 0), (months, 1, 12), ([], 0, 0), (hours, 0, 23),
                                 (minutes, 0, 59), (expanded[5] if six else [0], 0, 59))]
    # cronie: the day fields are ANDed when either one's text starts with "*".
    day_and = full[3][0] in "*?" or full[5][0] in "*?"
    days = [_days_allowed(doms, dows, n, first, day_and)
            for n in (28, 29, 30, 31) for first in range(7)]
    # Every (month length, weekday of the 1st) occurs in every month within 400 years.
    if not any(days[(n - 28) * 7 + first] for m in sets[1] for n in _lengths(m)
               for first in range(7)):
        raise BadCron("never fires (no allowed day exists in any allowed month)")
    return Cron(
        expr=expr, wild=full[1].startswith("*") or full[2].startswith("*"),
        nexts=tuple(_table(a, lim + 1, lim, True) for a, lim in zip(sets, _LIMITS, strict=True)),
        prevs=tuple(_table(a, hi + 1, lo - 1, False)
                    for a, lo, hi in zip(sets, _LOWS, _HIGHS, strict=True)),
        day_next=tuple(_table(a, 33, 32, True) for a in days),
        day_prev=tuple(_table(a, 32, 0, False) for a in days),
        day_count=tuple(_below(a, 33) for a in days),
        months=sets[1], below=tuple(_below(a, 61) for a in sets[3:]),
        sizes=(len(sets[3]), len(sets[4]), len(sets[5])))


def _lengths(month: int) -> tuple[int, ...]:
    return (28, 29) if month == 2 else (calendar.monthrange(2001, month)[1],)


def _expand(expr: str, six: bool, full: list[str]) -> tuple[list[Any], Any]:
    try:
        return croniter.expand(expr, second_at_beginning=six)
    except Exception:  # noqa: BLE001 - whatever croniter raises, find the field to name
        pass
    for idx, part in enumerate(full):
        if idx == 0 and not six:
            continue
        alone = ["*"] * 6
        alone[idx] = part
        try:
            croniter.expand(" ".join(alone), second_at_beginning=True)
        except Exception:  # noqa: BLE001
            raise BadCron(f"{_FIELD_NAMES[idx]} field {part[:32]!r} is not valid "
                          f"(allowed {_RANGES[idx][0]}-{_RANGES[idx][1]})") from None
    raise BadCron("is not a valid cron expression")


def _screen_field(idx: int, part: str) -> None:
    """Refuse what croniter would misread or report without naming the field."""
    name, chars, (lo, hi) = _FIELD_NAMES[idx], _FIELD_CHARS[idx], _RANGES[idx]
    if not chars.fullmatch(part):
        bad = next(ch for ch in part if not chars.fullmatch(ch))
        hint = {"w": "; W (nearest weekday)", "#": "; # (nth weekday)", "h": "; H (hashed)",
                "r": "; R (random)"}.get(bad)
        raise BadCron(f"{name} field {part[:32]!r} has an unsupported character {bad!r}"
                      + (f"{hint} is not supported" if hint else ""))
    for token in part.split(","):
        if not token:
            raise BadCron(f"{name} field {part[:32]!r} has an empty list item")
        if token[0] in "hr":
            raise BadCron(f"{name} field: hashed/random values (H, R) are not supported")
        m = _TOKEN_RE.fullmatch(token)
        if m is None:
            raise BadCron(f"{name} field: {token[:32]!r} is not a value, range or step")
        first, second, step = m.groups()
        bounds = [] if first in "*?l" else [_value(idx, first)]
        if second is not None:
            if not bounds:
                raise BadCron(f"{name} field: {token[:32]!r} is not a value, range or step")
            bounds.append(_value(idx, second))
        if step is not None:
            if not step:
                raise BadCron(f"{name} field: {token[:32]!r} has no step after '/'")
            if not 1 <= int(step) <= hi - lo + 1:
                raise BadCron(f"{name} step {int(step)} out of range 1-{hi - lo + 1}")
        # croniter reads an equal-bound range ("5-5") as the WHOLE field; 7-0 is
        # Sunday to Sunday, which cron refuses as a backward range.
        if len(bounds) == 2 and (bounds[0] == bounds[1] or (idx == 5 and bounds == [7, 0])):
            raise BadCron(f"{name} field: range {token!r} has equal bounds; "
                          f"write {str(bounds[1] % 7 if idx == 5 else bounds[0])!r}")


def _value(idx: int, text: str) -> int:
    name, (lo, hi) = _FIELD_NAMES[idx], _RANGES[idx]
    if text.isdigit():
        value = int(text)
        if not lo <= value <= hi:
            raise BadCron(f"{name} {value} out of range {lo}-{hi}")
        return value
    if text in _NAMES[idx]:
        return _NAMES[idx][text]
    if idx == 5 and "l" in text:
        raise BadCron("nth/last weekday forms ('#', 'L' in day-of-week) are not supported")
    kind = {4: "a month name or number", 5: "a weekday name or number"}.get(idx, "a number")
    raise BadCron(f"{name} {text[:16]!r} is not {kind} ({lo}-{hi})")


def _days_allowed(doms: list[Any], dows: list[Any], mlen: int, first: int,
                  day_and: bool) -> frozenset[int]:
    """Allowed days of a month of ``mlen`` days whose 1st is weekday ``first`` (0 = Sunday)."""
    every_day = frozenset(range(1, mlen + 1))
    by_dom = every_day if "*" in doms else frozenset(
        mlen if v == "l" else v for v in doms if v == "l" or v <= mlen)
    by_dow = every_day if "*" in dows else frozenset(
        d for d in every_day if (first + d - 1) % 7 in dows)
    return by_dom & by_dow if day_and else by_dom | by_dow


# Cached so that equal tables (most day tables) are shared between compiled expressions.
@functools.lru_cache(maxsize=8192)
def _table(allowed: frozenset[int], size: int, none: int, forward: bool) -> tuple[int, ...]:
    """``t[x]`` = nearest allowed value ``>= x`` (forward) or ``<= x``, else ``none``."""
    out, near = [], none
    for i in range(size - 1, -1, -1) if forward else range(size):
        near = i if i in allowed else near
        out.append(near)
    return tuple(reversed(out)) if forward else tuple(out)


@functools.lru_cache(maxsize=8192)
def _below(allowed: frozenset[int], size: int) -> tuple[int, ...]:
    """``t[x]`` = how many allowed values are ``< x``, for ``x`` in ``0 .. size - 1``."""
    out, n = [], 0
    for x in range(size):
        out.append(n)
        n += x in allowed
    return tuple(out)


@functools.lru_cache(maxsize=1024)
def zone_of(tz: str) -> ZoneInfo | None:
    """The zone; None marks UTC, which takes the arithmetic-only path.

    Read from the pinned ``tzdata`` package, never through ``zoneinfo``'s search path
    (``TZPATH``, the host's ``/usr/share/zoneinfo`` first): every replica, and a
    preview computed without a node (``raftsched job next FILE``), must get the same
    fire times from the same rules, whatever zone files a machine holds. Raises
    ``ValueError`` (or an ``OSError``) for a name that is no zone of it."""
    if tz == "UTC":
        return None
    parts = tz.split("/")
    if any(p in ("", ".", "..") or "\\" in p for p in parts):
        raise ValueError(f"not a zone name: {tz!r}")
    with resources.files("tzdata").joinpath("zoneinfo", *parts).open("rb") as f:
        return ZoneInfo.from_file(f, key=tz)


# --- calendar search and counting on "wall ms" (a wall-clock time counted as if UTC) ----

def _month_key(y: int, mo: int) -> tuple[int, int]:
    """(index into the day tables, month length) for month ``mo`` of year ``y``."""
    monday_first, mlen = calendar.monthrange(y, mo)
    return (mlen - 28) * 7 + (monday_first + 1) % 7, mlen


def _match(c: Cron, wall: int, forward: bool) -> int | None:
    """The nearest matching wall time ``>= wall`` (forward) or ``<= wall`` (backward)."""
    days, sod = divmod(-(-wall // 1000) if forward else wall // 1000, 86400)
    day = date.fromordinal(days + _EPOCH_ORDINAL)
    v = [day.year, day.month, day.day, sod // 3600, sod // 60 % 60, sod % 60]
    stop = min(v[0] + _SEARCH_YEARS, 9999) if forward else max(v[0] - _SEARCH_YEARS, 1)
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
    return found if MIN_MS <= found <= MAX_MS else None


def _day_matches(c: Cron, day: int) -> bool:
    d = date.fromordinal(day + _EPOCH_ORDINAL)
    if d.month not in c.months:
        return False
    key, _ = _month_key(d.year, d.month)
    return c.day_count[key][d.day + 1] > c.day_count[key][d.day]


def _days_matching(c: Cron, first: int, end: int) -> int:
    """How many days ``first <= day < end`` (days since the epoch) match; O(months)."""
    n = 0
    d = date.fromordinal(first + _EPOCH_ORDINAL)
    y, mo, dom = d.year, d.month, d.day
    while first < end:
        key, mlen = _month_key(y, mo)
        last = min(mlen + 1, dom + end - first)  # exclusive, within this month
        if mo in c.months:
            n += c.day_count[key][last] - c.day_count[key][dom]
        first += last - dom
        y, mo, dom = (y + 1, 1, 1) if mo == 12 else (y, mo + 1, 1)
    return n


def _times_upto(c: Cron, ms_of_day: int) -> int:
    """Allowed times of day ``<= ms_of_day``."""
    sod = ms_of_day // 1000
    h, m, s = sod // 3600, sod // 60 % 60, sod % 60
    (bh, bm, bs), (_, nm, ns) = c.below, c.sizes
    n = bh[h] * nm * ns
    if bh[h + 1] > bh[h]:
        n += bm[m] * ns + (bs[s + 1] if bm[m + 1] > bm[m] else 0)
    return n


def count_walls(c: Cron, lo: int, hi: int) -> int:
    """How many matching wall times lie in ``(lo, hi]`` (wall ms)."""
    lo, hi = max(lo, MIN_MS - 1), min(hi, MAX_MS)
    if hi <= lo:
        return 0
    (dlo, rlo), (dhi, rhi) = divmod(lo, _DAY_MS), divmod(hi, _DAY_MS)
    n = _days_matching(c, dlo, dhi) * c.sizes[0] * c.sizes[1] * c.sizes[2]
    if _day_matches(c, dhi):
        n += _times_upto(c, rhi)
    if _day_matches(c, dlo):
        n -= _times_upto(c, rlo)
    return n


# --- wall times <-> instants in a zone -------------------------------------------------

# Offsets are probed at most this far apart when looking for a transition; the
# one-change-per-day assumption in the module docstring makes that safe.
_PROBE_MS = _DAY_MS


def _offset(zone: ZoneInfo, t: int) -> int:
    offset = (_EPOCH + timedelta(milliseconds=t)).astimezone(zone).utcoffset()
    return 0 if offset is None else offset // _ONE_MS  # None only for a naive zone


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


def fire(c: Cron, zone: ZoneInfo | None, t: int, forward: bool) -> int | None:
    """The first fire time ``> t`` (forward) or the last one ``<= t`` (backward)."""
    if zone is None:
        return _match(c, t + forward, forward)
    if not c.wild:
        # Fixed: wall w fires at E(w), the earliest instant reaching w, and E only
        # grows with w; so E(w) > t exactly when w is past every wall shown up to t.
        wall = _match(c, _high_water_wall(zone, t) + forward, forward)
        return None if wall is None else _earliest_instant(zone, wall)
    # Wildcard: inside one offset segment the wall clock is instant + offset, so the
    # nearest match maps straight to an instant unless a transition comes first.
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


def _segments(zone: ZoneInfo, after: int, until: int) -> Iterator[tuple[int, int, int]]:
    """``(lo, hi, offset)``: ``(after, until]`` cut into runs ``(lo, hi]`` of one offset."""
    t = after
    while t < until:
        off = _offset(zone, t + 1)
        change = _transition(zone, t + 1, off, until)
        end = until if change is None else change - 1
        yield t, end, off
        t = end


def count_fires(c: Cron, zone: ZoneInfo | None, after: int, until: int) -> int:
    """How many fire times lie in ``(after, until]``, exactly, by the rule of :func:`fire`."""
    if until <= after:
        return 0
    if zone is None:
        return count_walls(c, after, until)
    after, until = max(after, MIN_MS - _DAY_MS), min(until, MAX_MS + _DAY_MS)
    if c.wild:  # inside one offset segment, wall = instant + offset
        return sum(count_walls(c, lo + off, hi + off)
                   for lo, hi, off in _segments(zone, after, until))
    # Fixed (see fire()): E(w) lies in (after, until] iff w in (HW(after), HW(until)];
    # but the walls of a gap, and its end, share one instant E: count that once.
    n = count_walls(c, _high_water_wall(zone, after), _high_water_wall(zone, until))
    prev = None
    for lo, _, off in _segments(zone, after, until):
        if prev is not None and off > prev:  # a gap starts at instant lo + 1
            n -= max(count_walls(c, lo + prev, lo + 1 + off) - 1, 0)
        prev = off
    return n
