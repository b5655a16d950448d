"""Schedule previews and put dry-runs: what a schedule will do, what a put would change.

Pure functions of their inputs (the caller passes ``now_ms`` and the existing specs);
they live in the node layer because the words come from ``cron-descriptor``, which the
pure core keeps out of its replicated path. Local times use the core's zones (the
pinned ``tzdata``), so a preview shows the offsets the cluster schedules by.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from raftsched.core.cron import zone_of
from raftsched.core.durations import format_duration, format_timestamp
from raftsched.core.trigger import (
    AfterSchedule,
    CronSchedule,
    EverySchedule,
    Schedule,
    bounds_to_spec,
    next_fire,
    schedule_tz,
)

#: Most fire times one preview lists.
MAX_COUNT = 100
_UNITS = (("d", 86_400_000, "day"), ("h", 3_600_000, "hour"), ("m", 60_000, "minute"),
          ("s", 1000, "second"), ("ms", 1, "millisecond"))


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def duration_words(ms: int) -> str:
    """``5400000`` -> ``1 hour 30 minutes``; ``30000`` -> ``30 seconds``."""
    parts = []
    for _, size, word in _UNITS:
        count, ms = divmod(ms, size)
        if count:
            parts.append(_plural(count, word))
    return " ".join(parts) or "0 seconds"


def describe(schedule: Schedule) -> str:
    """The schedule in words (English): cron through cron-descriptor, the rest here;
    its bounds after it (``…, from <start> until <end>``)."""
    text = _describe_shape(schedule)
    if schedule.start_ms is not None:
        text += f", from {format_timestamp(schedule.start_ms)}"
    if schedule.end_ms is not None:
        text += f", until {format_timestamp(schedule.end_ms)}"
    return text


def _describe_shape(schedule: Schedule) -> str:
    if isinstance(schedule, CronSchedule):
        from cron_descriptor import Options, get_description

        opts = Options()
        opts.use_24hour_time_format = True
        try:
            text = get_description(schedule.cron, opts)
        except Exception:  # noqa: BLE001 - words are a courtesy; the expression is valid
            text = f"cron {schedule.cron}"
        return f"{text} ({schedule.tz})"
    if isinstance(schedule, EverySchedule):
        every = schedule.every_ms
        text = "every " + (duration_words(every) if every % 1000 or every > 1000
                           else "second")
        if schedule.offset_ms:
            text += f", offset {duration_words(schedule.offset_ms)} from the epoch"
        return text
    if isinstance(schedule, AfterSchedule):
        return "after its parents"
    return f"once, at {format_timestamp(schedule.at_ms)}"


def describe_after(after: tuple[str, ...], on: str) -> str:
    """A dependent job's trigger in words: ``after extract``, ``after a, b (on failure)``."""
    return f"after {', '.join(after)}" + ("" if on == "success" else f" (on {on})")


def _zone(tz: str) -> Any:
    return zone_of(tz) or UTC


def _dst_change(zone: Any, day: datetime) -> str | None:
    """``"+1h"``/``"-1h"`` when the UTC offset changes during the local ``day``."""
    start = datetime(day.year, day.month, day.day, tzinfo=zone)
    end = start + timedelta(days=1)
    # Wall-clock arithmetic: compare the offsets at the local midnights around the day.
    before = start.utcoffset() or timedelta(0)
    after = datetime(end.year, end.month, end.day, tzinfo=zone).utcoffset() or timedelta(0)
    if before == after:
        return None
    delta = int((after - before).total_seconds())
    sign = "+" if delta > 0 else "-"
    return f"{sign}{format_duration(abs(delta) * 1000)}"


def next_fires(schedule: Schedule, now_ms: int, count: int, *,
               parents: tuple[str, ...] = (), on: str = "success") -> dict[str, Any]:
    """The next ``count`` fire times after ``now_ms``: each in UTC and in the
    schedule's zone, the local days with a DST change marked, and the words. A
    dependent job (``parents``: its ``after``) has none of its own: its words say whom
    it runs after."""
    zone = _zone(schedule_tz(schedule))
    fires: list[dict[str, Any]] = []
    after = now_ms
    while len(fires) < count:
        t = next_fire(schedule, after)
        if t is None:
            break
        local = datetime.fromtimestamp(t / 1000, tz=UTC).astimezone(zone)
        item: dict[str, Any] = {"at_ms": t, "utc": format_timestamp(t),
                                "local": local.isoformat(timespec="seconds"),
                                "weekday": local.strftime("%a")}
        change = _dst_change(zone, local)
        if change is not None:
            item["dst_change"] = change
        fires.append(item)
        after = t
    out = {"schedule": schedule.to_spec(), "tz": schedule_tz(schedule),
           "description": describe_after(parents, on) if parents else describe(schedule),
           "fires": fires, "now_ms": now_ms}
    if parents:
        out["after"] = list(parents)
        out["on"] = on
    out.update(bounds_to_spec(schedule))  # the bounds, as the spec writes them
    return out


#: Spec keys whose values are never echoed in a diff (only that they changed).
_SECRET_KEYS = frozenset({"env"})


def diff_specs(old: dict[str, Any] | None, new: dict[str, Any]) -> dict[str, Any]:
    """What a put of ``new`` (normalized) does to ``old`` (normalized, or None)."""
    if old is None:
        return {"id": new["id"], "change": "created", "fields": sorted(new)}
    fields = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
    out: dict[str, Any] = {"id": new["id"], "change": "updated" if fields else "unchanged",
                           "fields": fields}
    if fields:
        out["diff"] = {k: ({"from": old.get(k), "to": new.get(k)} if k not in _SECRET_KEYS
                           else {"from": "(hidden)", "to": "(hidden)"}) for k in fields}
    return out


__all__ = ["MAX_COUNT", "describe", "describe_after", "diff_specs", "duration_words", "next_fires"]
