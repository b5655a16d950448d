"""DUR: what group commit costs, ``[cluster] durability = "sync"`` ÷ ``"none"``.

Each figure pairs two clusters run back to back in this invocation, the same except
for ``durability``:

1. W1 fire storms (every-second no-op jobs, 3 nodes) at J = 1,000 and 5,000: runs/s,
   lag(call) p50/p99, CPU per run, term changes, and each node's syncs.
2. Writes: ``put_job`` from 8 client threads as fast as answered (puts/s), and from
   one thread (latency p50/p99 of an acknowledged write: the API latency a user sees).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from bench import stats
from bench.cluster import BenchCluster
from bench.common import Ctx, Result, fmt

MODES = ("none", "sync")


def _puts(ctx: Ctx, mode: str, seconds: float) -> dict[str, Any]:
    c = BenchCluster(ctx.dir(f"dur-put-{mode}"), workers=16, queue=64, history_limit=100,
                     durability=mode)
    try:
        c.start_all()
        leader = c.wait_leader(60)
        c.wait_all_alive(60)
        done = [0]
        lock = threading.Lock()
        stop = threading.Event()

        def writer(k: int) -> None:
            with c.client(timeout=30) as cl:
                i = 0
                while not stop.is_set():
                    cl.put_job({"id": f"p{k}-{i}", "schedule": {"every": "24h"},
                                "command": ["true"]})
                    i += 1
                    with lock:
                        done[0] += 1

        threads = [threading.Thread(target=writer, args=(k,), daemon=True) for k in range(8)]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        time.sleep(seconds)
        stop.set()
        for t in threads:
            t.join(30)
        rate = done[0] / (time.monotonic() - t0)
        lat: list[float] = []
        with c.client(timeout=30) as cl:
            end = time.monotonic() + seconds
            i = 0
            while time.monotonic() < end:
                ts = time.perf_counter()
                cl.put_job({"id": f"s-{i}", "schedule": {"every": "24h"}, "command": ["true"]})
                lat.append((time.perf_counter() - ts) * 1000)
                i += 1
        st = c.status(leader)
    finally:
        c.close()
    return {"puts_per_s": rate, "latency_ms": stats.summary(lat), "leader": leader,
            "durability": st.get("durability"), "term": st.get("term")}


def _syncs(r: dict[str, Any]) -> str:
    d = r.get("durability") or {}
    per = [v for v in d.values() if v]
    if not per:
        return "—"
    return (f"{sum(v['syncs'] for v in per):,} "
            f"(max {max(v['sync_ms_max'] for v in per):.1f} ms)")


def run_dur(ctx: Ctx) -> Result:
    from bench import w1

    res = Result("DUR", "DUR — the cost of group commit (durability sync ÷ none)")
    seconds = 10 if ctx.quick else 20
    storms: dict[tuple[int, str], dict[str, Any]] = {}
    for jobs in (1000, 5000):
        for mode in MODES:
            ctx.log(f"DUR: W1 J={jobs} durability={mode}")
            storms[(jobs, mode)] = w1.run_raftsched(ctx, jobs, seconds, 5,
                                                    name=f"dur-w1-{jobs}-{mode}",
                                                    durability=mode)
    rows = []
    for jobs in (1000, 5000):
        none, sync = storms[(jobs, "none")], storms[(jobs, "sync")]
        for mode, r in (("none", none), ("sync", sync)):
            rows.append([f"{jobs:,}", mode, fmt(r["runs_per_s"], 0),
                         fmt(r["lag_call"]["p50"], 0), fmt(r["lag_call"]["p99"], 0),
                         fmt(r["cpu_ms_per_run"], 3),
                         f"{r['term_start']}→{r['term_drained']}", _syncs(r)])
        rows.append([f"{jobs:,}", "**sync ÷ none**",
                     fmt(stats.ratio(sync["runs_per_s"], none["runs_per_s"]), 3),
                     fmt(stats.ratio(sync["lag_call"]["p50"], none["lag_call"]["p50"]), 2),
                     fmt(stats.ratio(sync["lag_call"]["p99"], none["lag_call"]["p99"]), 2),
                     fmt(stats.ratio(sync["cpu_ms_per_run"], none["cpu_ms_per_run"]), 2),
                     "", ""])
    res.tables.append((f"W1 storms, {seconds} s window, 3 nodes",
                       ["J", "durability", "runs/s", "lag(call) p50 ms", "lag(call) p99 ms",
                        "CPU ms/run (3 nodes)", "term (start→drained)",
                        "journal syncs, 3 nodes (longest)"], rows))
    puts = {}
    for mode in MODES:
        ctx.log(f"DUR: writes durability={mode}")
        puts[mode] = _puts(ctx, mode, 5 if ctx.quick else 10)
    prow = [[mode, fmt(p["puts_per_s"], 0), fmt(p["latency_ms"]["p50"], 2),
             fmt(p["latency_ms"]["p99"], 2)] for mode, p in puts.items()]
    prow.append(["**sync ÷ none**",
                 fmt(stats.ratio(puts["sync"]["puts_per_s"], puts["none"]["puts_per_s"]), 3),
                 fmt(stats.ratio(puts["sync"]["latency_ms"]["p50"],
                                 puts["none"]["latency_ms"]["p50"]), 2),
                 fmt(stats.ratio(puts["sync"]["latency_ms"]["p99"],
                                 puts["none"]["latency_ms"]["p99"]), 2)])
    res.tables.append(("Writes: put_job, 8 threads (rate) and 1 thread (latency)",
                       ["durability", "puts/s (8 threads)", "latency p50 ms (1 thread)",
                        "latency p99 ms"], prow))
    res.notes.append("Goal (issue 27): sync costs at most 10 % of runs/s at J = 5,000.")
    res.raw = {"storms": {f"{j}-{m}": {k: v for k, v in r.items()
                                        if k not in ("lag_call_sorted", "lag_start_sorted")}
                          for (j, m), r in storms.items()}, "puts": puts}
    return res
