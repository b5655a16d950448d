"""The pure time trigger: the schedule shapes and their fire times.

A :data:`Schedule` is one of three frozen shapes, each holding only its own fields:
:class:`CronSchedule` (an expression on the wall clock of an IANA zone),
:class:`EverySchedule` (``offset_ms + k * every_ms`` since the Unix epoch: anchored, no
drift) and :class:`AtSchedule` (one instant). Times are ``int`` epoch ms, UTC; no
clock is read here.

Every shape may carry bounds (the job spec's ``start`` and ``end``): no fire time lies
before ``start_ms`` or after ``end_ms`` (both inclusive). The bounds are applied here,
in the functions every fire time comes from (:func:`next_fire`, :func:`fire_times`,
:func:`count_fires`, :func:`latest_fire_at_or_before`), so the leader's plans, the miss
detector, resume, trigger and the previews all honour them without knowing of them.

Cron: 5 fields (minute hour day-of-month month day-of-week) or 6 with SECONDS
FIRST; numbers, ``*``, ranges (also wrapping), steps, lists, names, ``?``, ``L``
(last day of month) and the @yearly/@annually/@monthly/@weekly/@daily/@midnight/
@hourly macros. ``W``, ``#``, day-of-week ``L`` and ``H``/``R`` are refused (``R``
is random per replica). Day fields, day-of-week 7 and daylight saving time follow
cronie (Vixie cron): see :mod:`raftsched.core.cron`, which does the work.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, ClassVar, TypeAlias

from raftsched.core import cron as _cron
from raftsched.core.cron import MAX_CRON_CHARS, BadCron, compile_cron, zone_of
from raftsched.core.durations import (
    format_duration,
    format_timestamp,
    parse_duration,
    parse_timestamp,
)
from raftsched.core.errors import InvalidSpec, unknown_hint

__all__ = ["AFTER", "MAX_CRON_CHARS", "MAX_EVERY_MS", "MIN_EVERY_MS", "AfterSchedule",
           "AtSchedule", "CronSchedule",
           "EverySchedule", "Schedule", "ScheduleKind", "bounded", "bounds_from_spec",
           "bounds_to_spec", "count_fires", "fire_times", "jitter_ms",
           "latest_fire_at_or_before", "next_fire", "schedule_from_row", "schedule_from_spec",
           "schedule_to_row", "schedule_tz"]

MIN_EVERY_MS = 1_000
MAX_EVERY_MS = 366 * 86_400_000
_MIN_MS, _MAX_MS = _cron.MIN_MS, _cron.MAX_MS
_TZ_RE = re.compile(r"[A-Za-z][A-Za-z0-9_+-]*(?:/[A-Za-z0-9_+-]+)*")


class ScheduleKind(enum.StrEnum):
    """What a schedule is made of; the value is the spec key."""

    #: A cron expression evaluated on the wall clock of ``tz``.
    cron = "cron"
    #: A fixed interval anchored at the Unix epoch (plus ``offset_ms``).
    every = "every"
    #: A single instant.
    at = "at"
    #: No fire times of its own: a dependent job (``after``) runs after its parents.
    after = "after"


@dataclass(frozen=True, slots=True, kw_only=True)
class _Bounds:
    """The bounds every schedule shape carries (the job spec's ``start``/``end``).

    :var start_ms: no fire time before this instant (inclusive); None: unbounded.
    :var end_ms: no fire time after this instant (inclusive); None: unbounded.
    """

    start_ms: int | None = None
    end_ms: int | None = None

    def _check_bounds(self) -> None:
        # Cheap, like the shapes' own checks: restoring a snapshot rebuilds these.
        lo, hi = self.start_ms, self.end_ms
        if lo is None and hi is None:
            return
        if not (_bound_ok(lo) and _bound_ok(hi) and (lo is None or hi is None or lo < hi)):
            raise InvalidSpec("schedule", "start/end do not make valid bounds")


def _bound_ok(ms: int | None) -> bool:
    return ms is None or (type(ms) is int and _MIN_MS <= ms <= _MAX_MS)


@dataclass(frozen=True, slots=True, kw_only=True)
class CronSchedule(_Bounds):
    """A cron expression read on the wall clock of an IANA zone. Build it from user
    input with :func:`schedule_from_spec`; direct construction (snapshot rows) checks
    the types only, not the cron text or the zone.

    :var cron: the normalized expression (5 fields, or 6 with seconds first).
    :var tz: the IANA zone the expression is read in.
    """

    kind: ClassVar[ScheduleKind] = ScheduleKind.cron
    cron: str
    tz: str = "UTC"

    def __post_init__(self) -> None:
        # Cheap checks only: a snapshot restore rebuilds millions of these.
        if not isinstance(self.cron, str) or not isinstance(self.tz, str):
            raise InvalidSpec("schedule", "fields do not make a valid cron schedule")
        self._check_bounds()

    def to_spec(self) -> dict[str, Any]:
        """The normalized msgpack-friendly map; ``schedule_from_spec`` of it equals
        ``self`` without its bounds (they are the job spec's: :func:`bounds_to_spec`)."""
        return {"cron": self.cron, "tz": self.tz}


@dataclass(frozen=True, slots=True, kw_only=True)
class EverySchedule(_Bounds):
    """A fixed interval anchored at the Unix epoch: fire times are
    ``offset_ms + k * every_ms`` (no drift, the same on every replica).

    :var every_ms: the interval, 1 s .. 366 d.
    :var offset_ms: the phase, ``0 <= offset_ms < every_ms``.
    """

    kind: ClassVar[ScheduleKind] = ScheduleKind.every
    every_ms: int
    offset_ms: int = 0

    def __post_init__(self) -> None:
        e, o = self.every_ms, self.offset_ms
        if not (type(e) is int and type(o) is int and MIN_EVERY_MS <= e <= MAX_EVERY_MS
                and 0 <= o < e):
            raise InvalidSpec("schedule", "fields do not make a valid every schedule")
        self._check_bounds()

    def to_spec(self) -> dict[str, Any]:
        """The normalized msgpack-friendly map (``offset`` only when not 0)."""
        out: dict[str, Any] = {"every": format_duration(self.every_ms)}
        if self.offset_ms:
            out["offset"] = format_duration(self.offset_ms)
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class AtSchedule(_Bounds):
    """One instant.

    :var at_ms: the instant, epoch ms UTC, within the supported range of years.
    """

    kind: ClassVar[ScheduleKind] = ScheduleKind.at
    at_ms: int

    def __post_init__(self) -> None:
        if not (type(self.at_ms) is int and _MIN_MS <= self.at_ms <= _MAX_MS):
            raise InvalidSpec("schedule", "fields do not make a valid at schedule")
        self._check_bounds()

    def to_spec(self) -> dict[str, Any]:
        """The normalized msgpack-friendly map."""
        return {"at": format_timestamp(self.at_ms)}


@dataclass(frozen=True, slots=True, kw_only=True)
class AfterSchedule(_Bounds):
    """The schedule of a dependent job (``after``): it has no fire times of its own.
    Its runs are made when its parents' runs end (:mod:`raftsched.core.deps`), each for
    its parents' fire time; every function here finds none for it."""

    kind: ClassVar[ScheduleKind] = ScheduleKind.after

    def to_spec(self) -> dict[str, Any]:
        """Empty: a dependent job's spec has ``after``, not a ``schedule``."""
        return {}


#: The one schedule every dependent job shares.
AFTER = AfterSchedule()

#: When a job fires: one of the shapes above (``kind`` names it).
Schedule: TypeAlias = CronSchedule | EverySchedule | AtSchedule | AfterSchedule


def schedule_from_spec(spec: object, field: str = "schedule") -> Schedule:
    """Validate and normalize a spec map; errors name ``field`` or ``field.<key>``.

    Exactly one of ``{"cron": str, "tz": str}`` (tz optional, default UTC),
    ``{"every": duration, "offset": duration}`` (offset optional) or
    ``{"at": RFC 3339 string with Z or an explicit offset}``.
    """
    if not isinstance(spec, Mapping) or not all(isinstance(k, str) for k in spec):
        raise InvalidSpec(field, "must be a map with one of the keys cron, every, at")
    kinds = [k for k in ("cron", "every", "at") if k in spec]
    all_keys = sorted(set().union(*_KEYS.values()))
    if not kinds:
        for key in sorted(spec):  # a typo of a kind (`evry`) says so, not "needs one of"
            hint = unknown_hint("unknown key", key, all_keys)
            if key not in all_keys and "did you mean" in hint:
                raise InvalidSpec(f"{field}.{key[:64]}", hint)
    if len(kinds) != 1:
        got = f", got {' and '.join(kinds)}" if kinds else ""
        raise InvalidSpec(field, f"needs exactly one of cron, every, at{got}")
    kind = ScheduleKind(kinds[0])
    for key in sorted(spec):
        if key not in _KEYS[kind]:
            known = any(key in keys for keys in _KEYS.values())
            raise InvalidSpec(f"{field}.{key[:64]}",
                              f"is not allowed with {kind.value}" if known
                              else unknown_hint("unknown key", key, _KEYS[kind]))
    if kind is ScheduleKind.cron:
        text, tz = spec["cron"], spec.get("tz", "UTC")
        try:
            if not isinstance(text, str):
                raise BadCron(f"must be a cron expression string, not {type(text).__name__}")
            expr = compile_cron(text).expr
        except BadCron as exc:
            raise InvalidSpec(f"{field}.cron", str(exc)) from None
        try:  # "localtime"/"posixrules" are host files, not zones: replicas could differ
            if len(tz) > 64 or tz in ("localtime", "posixrules") or not _TZ_RE.fullmatch(tz):
                raise ValueError(tz)
            zone_of(tz)
        except Exception:  # zoneinfo raises KeyError, ValueError or OSError subclasses
            raise InvalidSpec(f"{field}.tz", "must be a known IANA time zone name like "
                                             f"'Europe/Berlin', got {str(tz)[:64]!r}") from None
        return CronSchedule(cron=expr, tz=tz)
    if kind is ScheduleKind.every:
        every = parse_duration(spec["every"], f"{field}.every",
                               minimum_ms=MIN_EVERY_MS, maximum_ms=MAX_EVERY_MS)
        offset = parse_duration(spec.get("offset", 0), f"{field}.offset")
        if offset >= every:
            raise InvalidSpec(f"{field}.offset",
                              f"must be less than every ({format_duration(every)})")
        return EverySchedule(every_ms=every, offset_ms=offset)
    at = parse_timestamp(spec["at"], f"{field}.at")
    if not _MIN_MS <= at <= _MAX_MS:
        raise InvalidSpec(f"{field}.at", f"is out of the supported range: {spec['at']!r}")
    return AtSchedule(at_ms=at)


def schedule_to_row(s: Schedule) -> list[Any]:
    """The snapshot row ``[kind, cron, tz, every_ms, offset_ms, at_ms]`` (the layout of
    the bag of fields schedules once were: snapshots keep it byte for byte)."""
    if isinstance(s, CronSchedule):
        return [s.kind.value, s.cron, s.tz, None, 0, None]
    if isinstance(s, EverySchedule):
        return [s.kind.value, None, "UTC", s.every_ms, s.offset_ms, None]
    if isinstance(s, AfterSchedule):
        return [s.kind.value, None, "UTC", None, 0, None]
    return [s.kind.value, None, "UTC", None, 0, s.at_ms]


def schedule_from_row(row: list[Any]) -> Schedule:
    """The schedule of a snapshot row (see :func:`schedule_to_row`); a row whose fields
    do not make its kind is refused, as the bag of fields refused it."""
    kind, cron, tz, every, offset, at = row
    kind = ScheduleKind(kind)
    if kind is ScheduleKind.cron and (every, offset, at) == (None, 0, None):
        return CronSchedule(cron=cron, tz=tz)
    if kind is ScheduleKind.every and (cron, tz, at) == (None, "UTC", None):
        return EverySchedule(every_ms=every, offset_ms=offset)
    if kind is ScheduleKind.at and (cron, tz, every, offset) == (None, "UTC", None, 0):
        return AtSchedule(at_ms=at)
    if kind is ScheduleKind.after and (cron, tz, every, offset, at) == (None, "UTC", None, 0,
                                                                       None):
        return AFTER
    raise InvalidSpec("schedule", f"fields do not make a valid {kind.value} schedule")


def schedule_tz(s: Schedule) -> str:
    """The zone the schedule is read in: a cron schedule's ``tz``, else UTC."""
    return s.tz if isinstance(s, CronSchedule) else "UTC"


_KEYS = {ScheduleKind.cron: frozenset({"cron", "tz"}),
         ScheduleKind.every: frozenset({"every", "offset"}), ScheduleKind.at: frozenset({"at"})}


def bounded(schedule: Schedule, start_ms: int | None, end_ms: int | None) -> Schedule:
    """``schedule`` with these bounds (the same object when they are its own)."""
    if schedule.start_ms == start_ms and schedule.end_ms == end_ms:
        return schedule
    return replace(schedule, start_ms=start_ms, end_ms=end_ms)


def bounds_from_spec(spec: Mapping[str, Any], schedule: Schedule) -> Schedule:
    """``schedule`` bounded by a job spec's ``start`` and ``end`` keys (both optional,
    both inclusive); errors name ``start`` or ``end``."""
    start, end = _bound(spec, "start"), _bound(spec, "end")
    if start is None and end is None:
        return schedule
    if start is not None and end is not None and end <= start:
        raise InvalidSpec("end", f"must be after start ({format_timestamp(start)}), "
                                 f"got {format_timestamp(end)}")
    if isinstance(schedule, AtSchedule):
        # A one-shot outside its own bounds could never fire: surely a mistake.
        at = format_timestamp(schedule.at_ms)
        if start is not None and schedule.at_ms < start:
            raise InvalidSpec("start", f"is after schedule.at ({at}): the job would never "
                                       "fire")
        if end is not None and schedule.at_ms > end:
            raise InvalidSpec("end", f"is before schedule.at ({at}): the job would never fire")
    return bounded(schedule, start, end)


def _bound(spec: Mapping[str, Any], key: str) -> int | None:
    if key not in spec:
        return None
    value = spec[key]
    if value is None:
        # Refused, not read as absent: a spec holding the key always sets the bound
        # (a command carrying one is of the version that knows them).
        raise InvalidSpec(key, 'must be an RFC 3339 timestamp like "2026-12-01T00:00:00Z" '
                               "(leave the key out for no bound)")
    ms = parse_timestamp(value, key)
    if not _MIN_MS <= ms <= _MAX_MS:
        raise InvalidSpec(key, f"is out of the supported range: {value!r}")
    return ms


def bounds_to_spec(schedule: Schedule) -> dict[str, str]:
    """The job spec's ``start``/``end`` keys of the schedule's bounds (those set)."""
    out: dict[str, str] = {}
    if schedule.start_ms is not None:
        out["start"] = format_timestamp(schedule.start_ms)
    if schedule.end_ms is not None:
        out["end"] = format_timestamp(schedule.end_ms)
    return out


def next_fire(schedule: Schedule, after_ms: int) -> int | None:
    """The smallest fire time strictly greater than ``after_ms``, or ``None``."""
    start, end = schedule.start_ms, schedule.end_ms
    if start is not None and after_ms < start:
        after_ms = start - 1
    t = _next_unbounded(schedule, after_ms)
    return t if end is None or t is None or t <= end else None


def _next_unbounded(schedule: Schedule, after_ms: int) -> int | None:
    if isinstance(schedule, EverySchedule):
        every, offset = schedule.every_ms, schedule.offset_ms
        return offset + ((after_ms - offset) // every + 1) * every
    if isinstance(schedule, AtSchedule):
        return schedule.at_ms if schedule.at_ms > after_ms else None
    if isinstance(schedule, AfterSchedule) or after_ms >= _MAX_MS:
        return None
    return _cron_next(schedule.cron, schedule.tz, max(after_ms, _MIN_MS))


@functools.lru_cache(maxsize=1 << 14)
def _cron_next(cron: str, tz: str, after_ms: int) -> int | None:
    """The first fire time of ``cron`` in ``tz`` after ``after_ms`` (a pure function,
    remembered). The leader asks for each about three times (its plan's search past the
    lookahead, the ``Next`` the plan carries, the next plan's first fire time), and every
    job with the same expression and zone asks for the same ones: a calendar search was
    two thirds of a cron-heavy plan (``python -m bench.apply_cost --cron``). Bounded:
    ~3 MB when full. Backward searches are not kept (their ends are rarely asked twice)."""
    return _cron.fire(compile_cron(cron), zone_of(tz), after_ms, True)


def fire_times(schedule: Schedule, after_ms: int, until_ms: int, limit: int) -> list[int]:
    """Ascending fire times ``t`` with ``after_ms < t <= until_ms``: the oldest ``limit``
    (each found by one calendar search: cost grows with ``limit``, not with the range)."""
    out: list[int] = []
    t = after_ms
    while len(out) < limit:
        nxt = next_fire(schedule, t)
        if nxt is None or nxt > until_ms:
            break
        out.append(nxt)
        t = nxt
    return out


def count_fires(schedule: Schedule, after_ms: int, until_ms: int) -> int:
    """How many fire times lie in ``(after_ms, until_ms]``, exactly, for any range.

    every/at: arithmetic. cron: per day from the field tables (O(months + days) for a
    zone with DST, O(months) otherwise), never one fire time at a time.
    """
    after_ms, until_ms = _clamp(schedule, after_ms, until_ms)
    if until_ms <= after_ms:
        return 0
    if isinstance(schedule, EverySchedule):
        every, offset = schedule.every_ms, schedule.offset_ms
        return (until_ms - offset) // every - (after_ms - offset) // every
    if isinstance(schedule, AtSchedule):
        return int(after_ms < schedule.at_ms <= until_ms)
    if isinstance(schedule, AfterSchedule):
        return 0
    return _cron.count_fires(compile_cron(schedule.cron), zone_of(schedule.tz),
                             after_ms, until_ms)


def latest_fire_at_or_before(schedule: Schedule, after_ms: int, until_ms: int) -> int | None:
    """The newest fire time in ``(after_ms, until_ms]``, or ``None``; cheap for any range."""
    after_ms, until_ms = _clamp(schedule, after_ms, until_ms)
    if until_ms <= after_ms:
        return None
    if isinstance(schedule, EverySchedule):
        every, offset = schedule.every_ms, schedule.offset_ms
        t: int | None = offset + (until_ms - offset) // every * every
    elif isinstance(schedule, AtSchedule):
        t = schedule.at_ms
    elif isinstance(schedule, AfterSchedule):
        t = None
    else:
        t = None if until_ms < _MIN_MS else _cron.fire(
            compile_cron(schedule.cron), zone_of(schedule.tz), min(until_ms, _MAX_MS), False)
    return t if t is not None and after_ms < t <= until_ms else None


def _clamp(schedule: Schedule, after_ms: int, until_ms: int) -> tuple[int, int]:
    """The range ``(after_ms, until_ms]`` narrowed to the schedule's bounds."""
    start, end = schedule.start_ms, schedule.end_ms
    if start is not None and after_ms < start - 1:
        after_ms = start - 1
    if end is not None and until_ms > end:
        until_ms = end
    return after_ms, until_ms


def jitter_ms(job_id: str, scheduled_ms: int, max_ms: int) -> int:
    """A deterministic pseudo-random delay in ``[0, max_ms]`` for one run."""
    if max_ms < 0:
        raise ValueError(f"max_ms must not be negative, got {max_ms}")
    if max_ms == 0:
        return 0
    # blake2b, not hash(): that is salted per process, and replicas must agree.
    digest = hashlib.blake2b(f"{job_id}\x00{scheduled_ms}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % (max_ms + 1)
