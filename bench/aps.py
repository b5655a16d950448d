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


def run(jobs: int, seconds: float, warmup: float, threads: int = 64) -> dict[str, Any]:
    from apscheduler.events import EVENT_JOB_MAX_INSTANCES, EVENT_JOB_MISSED
    from apscheduler.executors.base import run_job
    from apscheduler.executors.pool import ThreadPoolExecutor
    from apscheduler.schedulers.background import BackgroundScheduler
    from apscheduler.triggers.interval import IntervalTrigger

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

    def fn(job_id: str) -> None:
        records.append((job_id, tl.sched, time.time()))

    def on_event(ev: Any) -> None:
        if ev.code == EVENT_JOB_MISSED:
            missed["missed"] += 1
        else:
            missed["max_instances"] += 1

    sched = BackgroundScheduler(
        executors={"default": StampingExecutor(max_workers=threads)},
        job_defaults={"coalesce": False, "misfire_grace_time": 3600, "max_instances": 100},
        timezone=dt.UTC)
    sched.add_listener(on_event, EVENT_JOB_MISSED | EVENT_JOB_MAX_INSTANCES)
    start = dt.datetime.fromtimestamp(int(time.time()) + 2, tz=dt.UTC)
    for i in range(jobs):
        sched.add_job(fn, IntervalTrigger(seconds=1, start_date=start, timezone=dt.UTC),
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, required=True)
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--warmup", type=float, default=3)
    ap.add_argument("--threads", type=int, default=64)
    a = ap.parse_args()
    sys.stdout.write(json.dumps(run(a.jobs, a.seconds, a.warmup, a.threads)) + "\n")


if __name__ == "__main__":
    main()
