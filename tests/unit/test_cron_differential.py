"""raftsched's cron against an independent implementation: cronsim (Debian/Vixie rules).

Many generated 5-field expressions in zones with whole-hour DST shifts (at 01:00, 02:00,
midnight …), each walked from random starts and from just before DST transitions.
What cronsim is known to get wrong, and what we decide differently on purpose, is
whitelisted here, not hidden:

* Zones whose DST shift is not a whole hour (Australia/Lord_Howe, Pacific/Chatham):
  cronsim skips or loops there. Not compared (tests/unit/test_trigger.py checks them
  against a brute-force model of the rule).
* A start inside a repeated (fall-back) hour: cronsim reads the wall clock and
  repeats fire times already passed. Starts are chosen outside such hours.
* Several fixed times inside one spring-forward gap (``0,30 2 * * *``): cron and
  cronsim start the job once per skipped time, all at the first minute after the
  gap; raftsched runs it once (a run id is job + instant). cronsim's consecutive
  duplicates are folded before comparing.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from cronsim import CronSim

from raftsched.core.errors import InvalidSpec
from raftsched.core.trigger import Schedule, next_fire, schedule_from_spec
from tests.support.zones import zone as tzdata_zone

pytestmark = pytest.mark.timeout(120)

_M, _H, _D = 60_000, 3_600_000, 86_400_000
ZONES = ["UTC", "Europe/Berlin", "America/New_York", "Asia/Kolkata", "Europe/London",
         "Australia/Sydney", "America/Santiago", "America/Havana", "Asia/Tehran",
         "America/Sao_Paulo"]
FIRES = 40
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _field(rng: random.Random, lo: int, hi: int, hot: tuple[int, ...],
           names: list[str] | None = None) -> str:
    def value() -> int:
        return rng.choice(hot) if hot and rng.random() < 0.5 else rng.randint(lo, hi)

    kind = rng.choice(["star", "star", "step", "one", "one", "range", "rstep", "list"])
    if kind == "star":
        return "*"
    if kind == "step":
        return f"*/{rng.randint(1, max(2, (hi - lo + 1) // 2))}"
    if kind == "one":
        v = value()
        return names[v - lo] if names and rng.random() < 0.3 else str(v)
    if kind == "list":
        return ",".join(str(v) for v in sorted({value() for _ in range(rng.randint(2, 4))}))
    a, b = sorted(rng.sample(range(lo, hi + 1), 2))  # cronsim reads ascending ranges only
    return f"{a}-{b}" + (f"/{rng.randint(1, 4)}" if kind == "rstep" else "")


def _expression(rng: random.Random) -> str:
    minute = _field(rng, 0, 59, (0, 15, 30, 45))
    hour = _field(rng, 0, 23, (0, 1, 2, 3, 23))
    dom = "L" if rng.random() < 0.05 else _field(rng, 1, 31, (1, 13, 28, 29, 30, 31))
    month = _field(rng, 1, 12, (2, 3, 10, 11),
                   "jan feb mar apr may jun jul aug sep oct nov dec".split())
    dow = rng.choice(["0-7", "0-7/2", "7", "mon-fri"]) if rng.random() < 0.1 else _field(
        rng, 0, 7, (0, 1, 5, 6, 7), "sun mon tue wed thu fri sat sun".split())
    return f"{minute} {hour} {dom} {month} {dow}"


def _transitions(zone: ZoneInfo, year: int) -> list[int]:
    """Instants (ms) where ``zone``'s offset changes in ``year``."""
    def off(t: int) -> timedelta | None:
        return (_EPOCH + timedelta(milliseconds=t)).astimezone(zone).utcoffset()

    out, t = [], int((datetime(year, 1, 1, tzinfo=UTC) - _EPOCH) / timedelta(milliseconds=1))
    end = t + 366 * _D
    while t < end:
        if off(t) != off(t + 6 * _H):
            lo, hi = t, t + 6 * _H
            while hi - lo > 1:
                mid = (lo + hi) // 2
                lo, hi = (lo, mid) if off(mid) != off(lo) else (mid, hi)
            out.append(hi)
        t += 6 * _H
    return out


def _ambiguous(zone: ZoneInfo, t: int) -> bool:
    """Is the wall clock at ``t`` shown twice (a fall-back hour, either pass)?"""
    local = (_EPOCH + timedelta(milliseconds=t)).astimezone(zone)
    wall = local.replace(tzinfo=None)
    return (wall.replace(tzinfo=zone, fold=0).utcoffset()
            != wall.replace(tzinfo=zone, fold=1).utcoffset())


def _cronsim(expr: str, tz: str, start: int, n: int) -> list[int]:
    zone = UTC if tz == "UTC" else tzdata_zone(tz)
    it = CronSim(expr.upper(), (_EPOCH + timedelta(milliseconds=start)).astimezone(zone))
    out: list[int] = []
    for _ in range(n * 4):
        t = int((next(it) - _EPOCH) / timedelta(milliseconds=1))
        if not out or t != out[-1]:  # several skipped fixed times: we run once (see doc)
            out.append(t)
        if len(out) == n:
            break
    return out


def _ours(s: Schedule, start: int, n: int) -> list[int]:
    out, t = [], start
    for _ in range(n):
        t = next_fire(s, t)  # type: ignore[assignment]
        out.append(t)
    return out


@pytest.mark.parametrize("chunk", range(8))
def test_fire_times_agree_with_cronsim(chunk: int) -> None:
    rng = random.Random(f"cron-differential-{chunk}")
    compared = refused = 0
    for _ in range(40):
        expr = _expression(rng)
        tz = rng.choice(ZONES)
        try:
            s = schedule_from_spec({"cron": expr, "tz": tz})
        except InvalidSpec:
            refused += 1
            continue
        zone = tzdata_zone(tz)
        year = rng.randint(2005, 2035)
        starts = [rng.randint(0, 365 * _D) + int(
            (datetime(year, 1, 1, tzinfo=UTC) - _EPOCH) / timedelta(milliseconds=1))]
        starts += [c - rng.randint(1, 48 * 60) * _M for c in _transitions(zone, year)]
        for start in starts:
            start -= start % 1000
            if _ambiguous(zone, start):  # cronsim's known bug (see module doc)
                continue
            want = _cronsim(expr, tz, start, FIRES)
            got = _ours(s, start, len(want))
            assert got == want, (expr, tz, datetime.fromtimestamp(start / 1000, zone))
            compared += len(want)
    assert refused <= 4 and compared > 1000, (refused, compared)
