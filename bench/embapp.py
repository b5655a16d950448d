"""One process of the embedded benchmark (``bench/embedded.py``): the same 20 jobs,
every second, scheduled either by APScheduler 3 in this process or by a raftsched
member embedded in this process.

``python -m bench.embapp aps|raftsched --out FILE --jobs 20 [--node nX --peers LINE
--data DIR]`` appends one JSON line per execution to FILE: ``[job, fire time (s),
call time (s)]``, and runs until SIGTERM or SIGKILL.

APScheduler: W1's ``BackgroundScheduler`` (``bench.aps.stamping_scheduler``: its
executor hands each run its exact scheduled time) with ``IntervalTrigger(seconds=1)``
aligned on whole seconds, ``coalesce=False``, ``misfire_grace_time=60`` — the usual
deployment, each process its own scheduler; records reach the file within 50 ms (a
SIGKILL may drop that last tail of the killed process).
raftsched: ``Scheduler(peers=..., node_id=...)`` and ``every="1s"`` (whole seconds),
``overlap="allow"``; the fire time is ``ctx.scheduled_ms``.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from typing import Any

_LOCK = threading.Lock()
_OUT: Any = None


def _record(job: str, fire_s: float, call_s: float) -> None:
    with _LOCK:
        _OUT.write(json.dumps([job, fire_s, call_s]) + "\n")
        _OUT.flush()


def raft_job(ctx: Any) -> None:
    _record(ctx.job_id, ctx.scheduled_ms / 1000, time.time())


def run_aps(jobs: int) -> Any:
    from apscheduler.triggers.interval import IntervalTrigger

    from bench.aps import stamping_scheduler

    # W1's APScheduler: the executor hands each run its scheduled time exactly.
    sched, stamp, records, _missed = stamping_scheduler(threads=16, grace_s=60)
    start = int(time.time()) + 2
    for i in range(jobs):
        job = f"j{i}"
        sched.add_job(stamp, IntervalTrigger(seconds=1, start_date=_utc(start)), args=[job],
                      id=job)
    sched.start()

    def flush() -> None:  # the records reach the file within 50 ms
        done = 0
        while True:
            time.sleep(0.05)
            while done < len(records):
                _record(*records[done])
                done += 1

    threading.Thread(target=flush, daemon=True).start()
    return sched


def _utc(epoch: int) -> Any:
    import datetime as dt
    return dt.datetime.fromtimestamp(epoch, dt.UTC)


def run_raftsched(jobs: int, node: str, peers: str, data: str) -> Any:
    import raftsched

    sched = raftsched.Scheduler(peers=peers, node_id=node, data_dir=data, workers=8,
                                stop_timeout=5)
    for i in range(jobs):
        sched.add_job(raft_job, id=f"j{i}", every="1s", overlap="allow", timeout="30s",
                      misfire={"policy": "all", "grace": "60s", "max_catchup": 100})
    return sched.start()


def main() -> None:
    global _OUT
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["aps", "raftsched"])
    ap.add_argument("--out", required=True)
    ap.add_argument("--jobs", type=int, default=20)
    ap.add_argument("--node", default="n1")
    ap.add_argument("--peers", default="")
    ap.add_argument("--data", default="")
    args = ap.parse_args()
    _OUT = open(args.out, "a", encoding="utf-8")  # noqa: SIM115 - open for the process
    if args.mode == "aps":
        run_aps(args.jobs)
    else:
        run_raftsched(args.jobs, args.node, args.peers, args.data)
    while True:  # until a signal
        time.sleep(3600)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
