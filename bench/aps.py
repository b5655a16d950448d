"""Baseline (b): APScheduler 3.x in one process, the same fire storm as W1.

``python -m bench.aps --jobs J --seconds T --warmup W [--threads 64]`` prints one JSON
line. A ``BackgroundScheduler`` with a ``ThreadPoolExecutor`` runs J jobs with
``IntervalTrigger(seconds=1)`` all aligned on whole seconds (raftsched's ``every: 1s``
fires on whole epoch seconds too), ``coalesce=False``, ``misfire_grace_time=3600``,
``max_instances=100``.

How the scheduled time is known exactly: the executor is subclassed so each
submission calls APScheduler's own ``run_job`` once per scheduled run time, after
putting that run time in a thread-local; the job function reads it and records
``(job, scheduled_run_time, time.time() at entry)``. So lag = actual call time -
scheduled_run_time, with no matching heuristics.

``--cron-window-ms W0`` (W5): the cron mix of :mod:`bench.cron_mix` as ``CronTrigger``s
in their zones, ``misfire_grace_time=60``, APScheduler's clock shifted (its
``datetime.now``) so that the window ``[W0, W0 + seconds)`` starts ``warmup`` seconds
after the start, as raftsched's nodes are shifted with ``RAFTSCHED_CLOCK_OFFSET_MS``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import resource
import sys
import threading
import time
from typing import Any

#: The clock shift of this process's APScheduler (W5 places its window around a DST
#: change): the scheduler and its executors read ``datetime.now`` through this.
_SHIFT = {"ms": 0}


def _now_ms() -> float:
    return time.time() * 1000 + _SHIFT["ms"]


def shift_clock(offset_ms: int) -> None:
    """Make APScheduler's ``datetime.now`` run ``offset_ms`` ahead (like raftsched's
    ``RAFTSCHED_CLOCK_OFFSET_MS``); the jobs' call times use the same clock."""
    import apscheduler.executors.base as exb
    import apscheduler.schedulers.base as scb

    class ShiftedDatetime(dt.datetime):
        @classmethod
        def now(cls, tz: Any = None) -> Any:  # type: ignore[override]
            return dt.datetime.now(tz) + dt.timedelta(milliseconds=_SHIFT["ms"])

    _SHIFT["ms"] = int(offset_ms)
    scb.datetime = ShiftedDatetime  # type: ignore[misc]
    exb.datetime = ShiftedDatetime  # type: ignore[misc]


def stamping_scheduler(threads: int, grace_s: int = 3600
                       ) -> tuple[Any, Any, list[Any], dict[str, int]]:
    """A ``BackgroundScheduler``, the job function ``stamp(job_id)`` that records
    ``(job, scheduled_run_time, call time)`` (seconds, on the shifted clock) in the
    returned list, and the scheduler's miss counters."""
    from apscheduler.events import EVENT_JOB_MAX_INSTANCES, EVENT_JOB_MISSED
    from apscheduler.executors.base import run_job
    from apscheduler.executors.pool import ThreadPoolExecutor
    from apscheduler.schedulers.background import BackgroundScheduler

    tl = threading.local()
    records: list[tuple[str, float, float]] = []
    missed = {"missed": 0, "max_instances": 0}

    class StampingExecutor(ThreadPoolExecutor):
        def _do_submit_job(self, job: Any, run_times: list[dt.datetime]) -> None:
            def task() -> list[Any]:
                events: list[Any] = []
                for rt in run_times:
                    tl.sched = rt.timestamp()
                    events.extend(run_job(job, job._jobstore_alias, [rt], self._logger.name))
                return events

            def callback(f: Any) -> None:
                exc = f.exception()
                if exc:
                    self._run_job_error(job.id, exc, getattr(exc, "__traceback__", None))
                else:
                    self._run_job_success(job.id, f.result())

            self._pool.submit(task).add_done_callback(callback)

    def on_event(ev: Any) -> None:
        if ev.code == EVENT_JOB_MISSED:
            missed["missed"] += 1
        else:
            missed["max_instances"] += 1

    sched = BackgroundScheduler(
        executors={"default": StampingExecutor(max_workers=threads)},
        job_defaults={"coalesce": False, "misfire_grace_time": grace_s, "max_instances": 100},
        timezone=dt.UTC)
    sched.add_listener(on_event, EVENT_JOB_MISSED | EVENT_JOB_MAX_INSTANCES)

    def stamp(job_id: str) -> None:
        records.append((job_id, tl.sched, _now_ms() / 1000))

    return sched, stamp, records, missed


def run(jobs: int, seconds: float, warmup: float, threads: int = 64) -> dict[str, Any]:
    from apscheduler.triggers.interval import IntervalTrigger

    sched, stamp, records, missed = stamping_scheduler(threads)
    start = dt.datetime.fromtimestamp(int(time.time()) + 2, tz=dt.UTC)
    for i in range(jobs):
        sched.add_job(stamp, IntervalTrigger(seconds=1, start_date=start, timezone=dt.UTC),
                      args=(f"a{i:05d}",), id=f"a{i:05d}")
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    sched.start()
    w0 = int(start.timestamp() + warmup)
    w1 = w0 + int(seconds)
    while time.time() < w1 + 2.0:  # bounded: ends 2 s after the window
        time.sleep(0.1)
    sched.shutdown(wait=False)
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    inside = [(j, s, c) for j, s, c in list(records) if w0 <= s < w1]
    lags = sorted((c - s) * 1000 for _, s, c in inside)
    seen = {(j, int(round(s))) for j, s, _ in inside}
    return {"jobs": jobs, "seconds": seconds, "threads": threads,
            "expected": jobs * int(seconds), "got": len(inside), "distinct": len(seen),
            "runs_per_s": len(inside) / seconds, "lags_ms": lags,
            "missed_events": missed["missed"], "max_instances_events": missed["max_instances"],
            "cpu_s": (ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime),
            "total_runs": len(records),
            "window": [w0, w1]}


def run_cron(jobs: int, w0_ms: int, seconds: float, setup_s: float,
             threads: int = 64) -> dict[str, Any]:
    """W5's baseline: the same cron jobs (:mod:`bench.cron_mix`) as ``CronTrigger``s, the
    clock shifted so that the window ``[w0_ms, w0_ms + seconds)`` starts ``setup_s``
    after now (the jobs are added meanwhile)."""
    from apscheduler.triggers.cron import CronTrigger

    from bench.cron_mix import aps_fields, job

    shift_clock(w0_ms - int(setup_s * 1000) - int(time.time() * 1000))
    sched, stamp, records, missed = stamping_scheduler(threads, grace_s=60)
    t_add = time.monotonic()
    for i in range(jobs):
        jid, expr, zone = job(i)
        sched.add_job(stamp, CronTrigger(timezone=zone, **aps_fields(expr)),
                      args=(jid,), id=jid)
    add_s = time.monotonic() - t_add
    sched.start()
    w1_ms = w0_ms + int(seconds * 1000)
    late = _now_ms() - w0_ms
    while _now_ms() < w0_ms:
        time.sleep(0.1)
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    while _now_ms() < w1_ms:
        time.sleep(0.1)
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    while _now_ms() < w1_ms + 3000:  # the window's last calls
        time.sleep(0.1)
    sched.shutdown(wait=False)
    inside = [(j, s, c) for j, s, c in list(records) if w0_ms <= s * 1000 < w1_ms]
    return {"jobs": jobs, "seconds": seconds, "threads": threads, "add_s": add_s,
            "started_late_ms": max(late, 0), "got": len(inside),
            "distinct": len({(j, round(s * 1000)) for j, s, _ in inside}),
            "lags_ms": sorted((c - s) * 1000 for _, s, c in inside),
            "missed_events": missed["missed"], "max_instances_events": missed["max_instances"],
            "cpu_s": (ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime),
            "fires": sorted({(j, round(s * 1000)) for j, s, _ in inside}),
            "window": [w0_ms, w1_ms]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, required=True)
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--warmup", type=float, default=3)
    ap.add_argument("--threads", type=int, default=64)
    ap.add_argument("--cron-window-ms", type=int, default=None,
                    help="W5: the cron mix, window starting at this (shifted) epoch ms")
    a = ap.parse_args()
    if a.cron_window_ms is not None:
        out = run_cron(a.jobs, a.cron_window_ms, a.seconds, a.warmup, a.threads)
    else:
        out = run(a.jobs, a.seconds, a.warmup, a.threads)
    sys.stdout.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    main()
