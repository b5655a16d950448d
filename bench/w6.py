"""W6 long-outage recovery: a whole cluster down for a week, restarted.

J per-minute cron jobs in Europe/Berlin (``misfire = once``, grace 60 s, the no-op
``bench.noop:stamp``) are put in one bulk import, then all three nodes stop (SIGTERM)
and start again with their clocks a week ahead (``RAFTSCHED_CLOCK_OFFSET_MS``): every
job has ~10,080 missed fire times to record as one range and one catch-up run to start.
A thread asks every node for ``status`` (1 s timeout) in turn from before the restart.
Figures: time to a stable leader, term changes, seconds without any ``status`` answer,
time until every job's catch-up run has started and its missed range is recorded (from
the run records' own times), and the Raft lock holds.
"""

from __future__ import annotations

import os
import time
from typing import Any

from bench.cluster import BenchCluster, now_ms, wait_until
from bench.common import Ctx, Result, bulk_batch, fmt, lock_cells, lock_cpu_note, lock_report
from raftsched.faces.launcher import StatusPoller

WEEK_MS = 7 * 86_400_000
SCHEDULE = {"cron": "* * * * *", "tz": "Europe/Berlin"}
CALL = "bench.noop:stamp"


def _accounted(runs: list[dict[str, Any]]) -> tuple[int, int] | None:
    """(when the missed range was recorded, when the catch-up run started), node clock
    ms, once both exist; else None."""
    ranges = [r for r in runs if r["until_ms"] is not None and r["state"] == "missed"]
    if not ranges:
        return None
    rng = max(ranges, key=lambda r: r["until_ms"])
    after = [r for r in runs if r["until_ms"] is None and r["scheduled_ms"] > rng["until_ms"]
             and r["started_ms"] is not None]
    if not after:
        return None
    run = min(after, key=lambda r: r["scheduled_ms"])
    return rng["created_ms"], run["started_ms"]


def run_w6(ctx: Ctx) -> Result:
    res = Result("W6", "W6 long-outage recovery: cron jobs, whole cluster down a week")
    jobs = int(os.environ.get("BENCH_W6_JOBS", 300 if ctx.quick else 1000))
    c = BenchCluster(ctx.dir("w6"), workers=64, queue=4096, history_limit=100)
    try:
        c.start_all()
        c.wait_leader(60)
        c.wait_all_alive(60)
        ids = [f"w6-{i:04d}" for i in range(jobs)]
        batch = bulk_batch()
        with c.client(timeout=120) as cl:
            for k in range(0, jobs, batch):
                reply = cl.call("put_jobs", specs=[
                    {"id": j, "schedule": SCHEDULE, "call": CALL,
                     "misfire": {"policy": "once", "grace": "60s"}} for j in ids[k:k + batch]])
                bad = [r for r in reply["results"] if not r.get("ok")]
                if bad:
                    raise RuntimeError(f"put_jobs refused {len(bad)} specs: {bad[:2]}")
        ctx.log(f"W6: {jobs} jobs put (batches of {batch}); stopping the whole cluster")
        stop_s = c.terminate_all(60)
        offset = {"RAFTSCHED_CLOCK_OFFSET_MS": str(WEEK_MS)}
        t_restart = time.monotonic()
        restart_node_ms = now_ms() + WEEK_MS
        with StatusPoller(c) as poller:
            c.start_all(env={n: offset for n in c.ids})
            leader = c.wait_leader(120)
            t_lead = time.monotonic()
            done: dict[str, tuple[int, int]] = {}

            def all_accounted() -> bool:
                missing = [j for j in ids if j not in done]
                got = c.fetch_runs(missing, 20)
                for j, runs in got.items():
                    acc = _accounted(runs)
                    if acc is not None:
                        done[j] = acc
                return len(done) == jobs

            # Cheap first: the leader's counters say when the catch-up runs are done.
            try:
                wait_until(lambda: c.metrics(leader).get(
                    'raftsched_runs{outcome="succeeded"}', 0) >= jobs, 120,
                    "the catch-up runs", interval=0.25)
            except AssertionError as exc:
                res.notes.append(f"catch-up not seen in the leader's counters: {exc}")
            wait_until(all_accounted, 120, "every job's range and catch-up run", interval=1.0)
            t_done = time.monotonic()
            time.sleep(5)  # keep asking: nothing may stall after the catch-up
        figures = poller.figures(t_restart)
        locks = lock_report(c)
        status_end = c.status(c.wait_leader(30))
    finally:
        c.close()
    range_ms = [d[0] - restart_node_ms for d in done.values()]
    run_ms = [d[1] - restart_node_ms for d in done.values()]
    catch_up_s = max(max(range_ms), max(run_ms)) / 1000
    raw = {"jobs": jobs, "put_batch": batch, "stop_s": stop_s, **figures,
           "leader_wait_s": round(t_lead - t_restart, 2),
           "catch_up_s": round(catch_up_s, 2),
           "ranges_recorded_s": round(max(range_ms) / 1000, 2),
           "runs_started_s": round(max(run_ms) / 1000, 2),
           "runs_started_p50_s": round(sorted(run_ms)[len(run_ms) // 2] / 1000, 2),
           "accounted_seen_s": round(t_done - t_restart, 2), "jobs_accounted": len(done),
           "term_end": status_end["term"], "lock": locks}
    res.raw = raw
    res.tables.append((
        f"{jobs} per-minute Europe/Berlin cron jobs, 3 nodes restarted a week ahead "
        "(seconds after the restart)",
        ["first leader", "stable leader", "term changes (goal 0)",
         "status unanswered s (goal 0)", "all ranges recorded", "all catch-up runs started",
         "catch-up done (goal ≤ 5 s)", "jobs accounted"],
        [[fmt(figures["first_leader_s"]), fmt(figures["stable_leader_s"]),
          fmt(figures["term_changes"]), fmt(figures["unanswered_seconds"]),
          fmt(raw["ranges_recorded_s"]), fmt(raw["runs_started_s"]), fmt(raw["catch_up_s"]),
          f"{len(done)}/{jobs}"]]))
    res.tables.append((
        "Raft lock (target: no hold over 20 ms)",
        ["lock hold max ms (any node, since start)", "holds over 20 ms (3 nodes)",
         "holds over 20 ms by site (count, max ms)"], [lock_cells(locks)]))
    res.notes += [
        "Times are from the run records (node clocks, a week ahead) minus the restart: "
        "*all ranges recorded* = the latest `created_ms` of the jobs' missed-range records; "
        "*all catch-up runs started* = the latest `started_ms` of the first run after "
        "each range. *catch-up done* is the later of the two.",
        "*stable leader*: from then on every `status` answer named the same leader and "
        "term. *status unanswered s*: whole seconds after the first leader in which no "
        "node answered `status` (1 s timeout, each node asked in turn every ~0.1 s).",
        f"The jobs were put with `put_jobs` in batches of {batch} (one bulk import); the "
        "restarted nodes replay that from their journals, which counts in the lock "
        "figures (the site column says which holds were replay applies).",
        "Lock holds over 20 ms are logged by each node with where the lock was taken "
        "(`raftsched/node/replica/timedlock.py`); the site column groups them.",
        lock_cpu_note(locks),
    ]
    return res
