"""W5's cron jobs: one mix of expressions and time zones, for raftsched and APScheduler.

Every expression means the same to raftsched (cronie semantics, 6 fields = seconds
first) and to APScheduler 3's ``CronTrigger`` built from the same fields: day-of-week
is written with names (APScheduler numbers Monday 0, cron Sunday 0) and no expression
restricts both day fields (cron ORs them, APScheduler ANDs them). Twelve zones: DST
zones on both hemispheres, half-hour and 45-minute offsets, Lord Howe's half-hour DST.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

#: 5-field (minute hour dom month dow) and 6-field (second first) expressions: steps,
#: lists, ranges; "30 2 * * *" falls in the Europe spring-forward gap on 2027-03-28.
EXPRESSIONS = (
    "* * * * *",
    "*/5 * * * *",
    "0,15,30,45 * * * *",
    "*/2 * * * mon-fri",
    "30 2 * * *",
    "0 */6 * * *",
    "10-50/20 0-3 * * *",
    "*/10 * * * * *",
    "0 */2 * * * *",
    "15,45 * * * * *",
    "*/20 */3 * * * sat,sun",
    "5 * 0-3 * * *",
)

ZONES = (
    "UTC", "Europe/Berlin", "Europe/London", "America/New_York", "America/Los_Angeles",
    "America/St_Johns", "Asia/Kolkata", "Asia/Kathmandu", "Australia/Adelaide",
    "Australia/Lord_Howe", "Asia/Tokyo", "Pacific/Chatham",
)

#: The window is placed around this DST change (Europe/Berlin and Europe/London spring
#: forward at 01:00 UTC on the last Sunday of March).
DST_CHANGE_MS = int(dt.datetime(2027, 3, 28, 1, 0, tzinfo=dt.UTC).timestamp() * 1000)


def job(i: int) -> tuple[str, str, str]:
    """Job ``i``'s (id, expression, zone): every (expression, zone) pair occurs once in
    each run of 144 consecutive jobs."""
    expr = EXPRESSIONS[i % len(EXPRESSIONS)]
    zone = ZONES[(i // len(EXPRESSIONS) + i) % len(ZONES)]
    return f"w5-{i:05d}", expr, zone


def raftsched_spec(i: int, call: str) -> dict[str, Any]:
    jid, expr, zone = job(i)
    return {"id": jid, "schedule": {"cron": expr, "tz": zone}, "call": call,
            "misfire": {"policy": "skip", "grace": "60s"}}


def aps_fields(expr: str) -> dict[str, str]:
    """APScheduler ``CronTrigger`` keyword fields for a 5- or 6-field expression."""
    parts = expr.split()
    if len(parts) == 5:
        parts = ["0", *parts]
    second, minute, hour, day, month, dow = parts
    return {"second": second, "minute": minute, "hour": hour, "day": day, "month": month,
            "day_of_week": dow}
