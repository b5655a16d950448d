"""W5 cron-heavy: J cron jobs over a window crossing a DST change, beside APScheduler 3.

The jobs (:mod:`bench.cron_mix`): 5- and 6-field expressions with steps, lists and
ranges in 12 time zones (DST on both hemispheres, half-hour and 45-minute offsets), the
no-op ``bench.noop:stamp``. The nodes' clocks are shifted (``RAFTSCHED_CLOCK_OFFSET_MS``)
so that the measured window is centred on the Europe spring-forward of 2027-03-28
01:00 UTC. Then APScheduler 3 runs the same expressions as ``CronTrigger``s over the
same (shifted) window in this invocation (:func:`bench.aps.run_cron`).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from bench import stats, w1
from bench.cluster import BenchCluster, now_ms
from bench.common import (
    Ctx,
    Result,
    bulk_batch,
    fmt,
    lock_cells,
    lock_cpu_note,
    lock_report,
    lock_snapshot,
    pysyncobj_problems,
)
from bench.cron_mix import DST_CHANGE_MS, EXPRESSIONS, ZONES, raftsched_spec

CALL = "bench.noop:stamp"
#: Worker slots per node: the minute's first second starts a few thousand runs at once.
WORKERS = 1024


def sizes(ctx: Ctx) -> tuple[int, int, int]:
    """(jobs, window seconds, seconds allowed for starting the cluster and the put);
    ``BENCH_W5_JOBS`` / ``BENCH_W5_WINDOW_S`` override the first two (smoke runs)."""
    jobs, window, setup = (2000, 60, 60) if ctx.quick else (10_000, 120, 120)
    return (int(os.environ.get("BENCH_W5_JOBS", jobs)),
            int(os.environ.get("BENCH_W5_WINDOW_S", window)), setup)


def _sleep_until_node(t_ms: int, offset: int) -> None:
    while True:
        left = (t_ms - (now_ms() + offset)) / 1000
        if left <= 0:
            return
        time.sleep(min(left, 0.5))


def run_raftsched(ctx: Ctx, jobs: int, window_s: int, setup_s: int) -> dict[str, Any]:
    w0 = DST_CHANGE_MS - window_s * 500
    # The nodes' clocks: the window starts setup_s after they start (later if slower).
    offset = (w0 - setup_s * 1000 - now_ms()) // 1000 * 1000
    c = BenchCluster(ctx.dir("w5"), workers=WORKERS, queue=4096, history_limit=100)
    try:
        c.start_all(env={n: {"RAFTSCHED_CLOCK_OFFSET_MS": str(offset)} for n in c.ids})
        leader = c.wait_leader(60)
        c.wait_all_alive(60)
        t_put = time.monotonic()
        batch = bulk_batch()
        with c.client(timeout=120) as cl:
            for k in range(0, jobs, batch):
                reply = cl.call("put_jobs", specs=[raftsched_spec(i, CALL)
                                                   for i in range(k, min(k + batch, jobs))])
                bad = [r for r in reply["results"] if not r.get("ok")]
                if bad:
                    raise RuntimeError(f"put_jobs refused {len(bad)} specs: {bad[:2]}")
        put_s = time.monotonic() - t_put
        node_now = now_ms() + offset
        late = max(0, node_now + 10_000 - w0)
        w0 += -(-late // 1000) * 1000
        w1 = w0 + window_s * 1000
        ctx.log(f"W5: {jobs} jobs put in {put_s:.1f}s; window starts in "
                f"{(w0 - node_now) / 1000:.0f}s{' (late)' if late else ''}")
        _sleep_until_node(w0, offset)
        cpu0 = {n: c.cpu_s(n) for n in c.ids}
        m0 = c.metrics(leader)
        locks0 = lock_snapshot(c)
        t0_wall = now_ms()
        term0 = c.status(leader)["term"]
        _sleep_until_node(w1, offset)
        t1_wall = now_ms()
        cpu1 = {n: c.cpu_s(n) for n in c.ids}
        m1 = c.metrics(leader)
        _sleep_until_node(w1 + 3000, offset)
        locks = lock_report(c, locks0, (t0_wall, t1_wall))
        term1 = c.status(leader)["term"]
        t_fetch = time.monotonic()
        ids = [raftsched_spec(i, CALL)["id"] for i in range(jobs)]
        runs = c.fetch_runs(ids, 100, nid=leader)
        fetch_s = time.monotonic() - t_fetch
        stamps = c.stamps()
        problems = pysyncobj_problems(c)
    finally:
        c.close()
    first_call: dict[tuple[str, int], int] = {}
    for run_id, attempt, _fence, call_ms, _node in stamps:
        if attempt == 1:
            first_call.setdefault((run_id, attempt), call_ms + offset)
    lag_start, lag_call, outcomes = [], [], {}
    fires: set[tuple[str, int]] = set()
    for job, recs in runs.items():
        for r in recs:
            if not w0 <= r["scheduled_ms"] < w1 or r["until_ms"] is not None:
                continue
            key = f"{r['state']}:{r['reason']}" if r["state"] != "succeeded" else "succeeded"
            outcomes[key] = outcomes.get(key, 0) + 1
            fires.add((job, r["scheduled_ms"]))
            if r["started_ms"] is not None and r["attempt"] == 1:
                lag_start.append(r["started_ms"] - r["scheduled_ms"])
                call = first_call.get((r["run_id"], 1))
                if call is not None:
                    lag_call.append(call - r["scheduled_ms"])
    plan_s = m1.get("raftsched_leader_plan_seconds_total", m1.get(
        "raftsched_leader_plan_seconds", 0.0)) - m0.get(
        "raftsched_leader_plan_seconds_total", m0.get("raftsched_leader_plan_seconds", 0.0))
    plans = m1.get("raftsched_leader_plans_total", m1.get("raftsched_leader_plans", 0.0)) - \
        m0.get("raftsched_leader_plans_total", m0.get("raftsched_leader_plans", 0.0))
    cpu = sum((cpu1[n] or 0) - (cpu0[n] or 0) for n in c.ids)
    succeeded = outcomes.get("succeeded", 0)
    return {"jobs": jobs, "window": [w0, w1], "window_crosses_dst": w0 < DST_CHANGE_MS < w1,
            "offset_ms": offset, "put_s": put_s, "put_batch": batch, "leader": leader,
            "fires": len(fires), "fire_set": sorted(fires), "outcomes": outcomes,
            "runs_per_s": succeeded / window_s,
            "lag_start": stats.summary(lag_start), "lag_call": stats.summary(lag_call),
            "plan_ms_per_s": plan_s * 1000 / window_s, "plans_per_s": plans / window_s,
            "plan_ms_per_plan": plan_s * 1000 / plans if plans else None,
            "cpu_ms_per_run": cpu * 1000 / succeeded if succeeded else None,
            "term": [term0, term1], "fetch_s": fetch_s, "lock": locks, "problems": problems}


def run_w5(ctx: Ctx) -> Result:
    res = Result("W5", "W5 cron-heavy: cron jobs in 12 zones over a DST change, 3 nodes")
    jobs, window_s, setup_s = sizes(ctx)
    ctx.log(f"W5 raftsched: {jobs} cron jobs, {window_s}s window")
    r = run_raftsched(ctx, jobs, window_s, setup_s)
    ctx.log("W5 APScheduler: the same CronTriggers")
    a = w1.run_aps(ctx, jobs, window_s, 30, ("--cron-window-ms", str(r["window"][0])), 120)
    a_lag = stats.summary(a.get("lags_ms", []))
    a_fires = {(j, t) for j, t in a.get("fires", [])}
    r_fires = {(j, t) for j, t in r.pop("fire_set")}
    only_r, only_a = sorted(r_fires - a_fires), sorted(a_fires - r_fires)
    res.raw = {"raftsched": r, "aps": {k: v for k, v in a.items() if k not in ("lags_ms", "fires")},
               "aps_lag": a_lag, "only_raftsched": only_r[:50], "only_aps": only_a[:50],
               "only_raftsched_n": len(only_r), "only_aps_n": len(only_a)}
    if a.get("error"):
        res.notes.append(f"APScheduler run failed: {a['error']}")
    a_cpu = (a["cpu_s"] * 1000 / a["got"]) if a.get("got") else None
    rows = [[fmt(jobs), fmt(r["fires"]), fmt(r["runs_per_s"]), fmt(r["plan_ms_per_s"]),
             fmt(r["plans_per_s"]), fmt(r["plan_ms_per_plan"], 2),
             fmt(r["lag_start"]["p50"]), fmt(r["lag_start"]["p99"]),
             fmt(r["lag_call"]["p50"]), fmt(r["lag_call"]["p99"]), fmt(r["lag_call"]["max"]),
             fmt(r["cpu_ms_per_run"], 2), f"{r['term'][0]}→{r['term'][1]}"]]
    res.tables.append((
        f"raftsched, {window_s} s window "
        f"{'across' if r['window_crosses_dst'] else 'NOT across'} the 2027-03-28 Europe DST "
        "change (lags in ms)",
        ["J", "fire times", "runs/s", "leader plan ms/s", "plans/s", "plan ms/plan",
         "lag(start rec) p50", "p99", "lag(call) p50", "p99", "max", "CPU ms/run (3 nodes)",
         "term"], rows))
    res.tables.append((
        "vs APScheduler 3 in this invocation (same expressions, zones and window)",
        ["APS calls in window", "APS lag p50", "APS lag p99", "APS lag max",
         "lag(call) p99 ÷ APS p99", "lag(call) p50 ÷ APS p50", "runs ÷ APS calls",
         "fire times only raftsched", "only APS", "APS CPU ms/run"],
        [[fmt(a.get("got")), fmt(a_lag["p50"]), fmt(a_lag["p99"]), fmt(a_lag["max"]),
          fmt(stats.ratio(r["lag_call"]["p99"], a_lag["p99"]), 2),
          fmt(stats.ratio(r["lag_call"]["p50"], a_lag["p50"]), 2),
          fmt(stats.ratio(r["outcomes"].get("succeeded", 0), a.get("got")), 3),
          fmt(len(only_r)), fmt(len(only_a)), fmt(a_cpu, 2)]]))
    lk = r["lock"]
    res.tables.append((
        "Raft lock (target: no hold over 20 ms)",
        ["lock hold max ms (any node, since start)", "holds over 20 ms (3 nodes, whole run)",
         "holds over 20 ms by site (count, max ms)", "longest hold in the window ms",
         "holds over 20 ms in the window"],
        [lock_cells(lk) + [fmt(lk["window_max_ms"]) if lk["window_max_ms"] else "≤ 20",
                           fmt(sum(lk["over_20ms_since"].values()))]]))
    res.notes.append(lock_cpu_note(lk))
    others = {k: v for k, v in r["outcomes"].items() if k != "succeeded"}
    res.notes += [
        f"{len(EXPRESSIONS)} expressions × {len(ZONES)} zones: "
        + ", ".join(f"`{e}`" for e in EXPRESSIONS) + "; zones " + ", ".join(ZONES)
        + ". Misfire `skip`, grace 60 s; the call is `bench.noop:stamp`.",
        f"Put: {jobs} specs in `put_jobs` batches of {r['put_batch']} in {r['put_s']:.1f} s "
        "(before the window; its applies are in the whole-run lock figures).",
        "*leader plan ms/s*: the leader's `raftsched_leader_plan_seconds` over the window "
        "÷ window (time building plans outside the lock). *lag(start rec)* = `started_ms − "
        "scheduled_ms`; *lag(call)* = when `bench.noop:stamp` was entered − scheduled "
        "(APScheduler's lag is the same quantity, on its shifted clock).",
        "outcomes other than succeeded in the window: "
        + (", ".join(f"{k} ×{v}" for k, v in sorted(others.items())) or "none"),
        "*fire times only raftsched / only APS*: (job, fire time) pairs in the window one "
        "scheduler ran and the other did not (DST and day-field semantics differ: "
        "raftsched follows cronie) — e.g. "
        f"`{only_r[:3]}` / `{only_a[:3]}`.",
    ]
    if r["problems"]:
        res.notes.append(f"node log warnings+: `{json.dumps(r['problems'])[:1500]}`")
    return res
