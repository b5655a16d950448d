"""GROUPS: one Raft group against several, the same jobs partitioned by id
(``raftsched.wire.groups``, ``docs/scaling.md``).

The same total of J every-second no-op jobs runs on one 3-node group, then on G groups
of 3 nodes side by side on this machine, the jobs split by rendezvous hashing; both in
one invocation. Reported per configuration: runs/s, CPU per run summed over every node,
and the term changes. On one machine the groups share its cores, so the total cannot
grow past what the cores run; what the comparison shows is whether splitting costs
anything per run — the figure that, on G machines (or G times the cores), multiplies.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import time
from typing import Any

from bench.cluster import BenchCluster, now_ms
from bench.common import Ctx, Result, bulk_batch, fmt
from bench.w1 import SPEC_CALL, WORKERS
from raftsched.wire.groups import owner


def _pin(pids: list[int], core: int) -> None:
    """Every thread of ``pids`` and of their children on CPU ``core`` alone (threads made
    later inherit it from the thread that makes them)."""
    import psutil

    for pid in pids:
        root = psutil.Process(pid)
        for proc in [root, *root.children(recursive=True)]:
            for thread in proc.threads():
                with contextlib.suppress(OSError):
                    os.sched_setaffinity(thread.id, {core})


def _storm(ctx: Ctx, groups: int, jobs: int, seconds: int, warmup: int,
           pin: bool = False) -> dict[str, Any]:
    """``pin``: group i's nodes on CPU i alone (each group a machine of one core)."""
    import psutil

    names = [f"g{i + 1}" for i in range(groups)]
    ids = [f"w1-{i:05d}" for i in range(jobs)]
    share = {n: [j for j in ids if owner(j, names) == n] for n in names}
    where = f"groups-{groups}{'-pinned' if pin else ''}"  # a fresh data dir per storm
    clusters = {n: BenchCluster(ctx.dir(f"{where}-{n}"), workers=WORKERS, queue=4096,
                                history_limit=1000) for n in names}
    try:
        for c in clusters.values():
            c.start_all()
        terms0 = {}
        for n, c in clusters.items():
            leader = c.wait_leader(60)
            c.wait_all_alive(60)
            terms0[n] = c.status(leader)["term"]
        if pin:
            for i, c in enumerate(clusters.values()):
                _pin([c.pid(nid) for nid in c.ids], i % (os.cpu_count() or 1))
        for n, c in clusters.items():
            with c.client(timeout=60) as cl:
                for i in range(0, len(share[n]), bulk_batch()):
                    cl.call("put_jobs", specs=[{"id": j, "schedule": {"every": "1s"},
                                                "call": SPEC_CALL}
                                               for j in share[n][i:i + bulk_batch()]])
        procs = [psutil.Process(c.pid(nid)) for c in clusters.values() for nid in c.ids]
        start = now_ms()
        w0 = -(-(start + warmup * 1000) // 1000) * 1000
        w1 = w0 + seconds * 1000
        time.sleep(max(0.0, (w0 - now_ms()) / 1000))
        cpu0 = sum(sum(p.cpu_times()[:2]) for p in procs)
        time.sleep(max(0.0, (w1 - now_ms()) / 1000))
        cpu1 = sum(sum(p.cpu_times()[:2]) for p in procs)
        time.sleep(3.0)  # the window's last runs end and are stamped
        runs, changes = 0, 0
        for n, c in clusters.items():
            runs += sum(1 for s in c.stamps() if w0 <= int(s[0].rpartition("@")[2]) < w1)
            leader = c.wait_leader(60)
            changes += c.status(leader)["term"] - terms0[n]
        return {"groups": groups, "jobs": jobs, "runs_per_s": runs / seconds,
                "cpu_ms_per_run": (cpu1 - cpu0) * 1000 / max(runs, 1),
                "term_changes": changes, "per_group": {n: len(share[n]) for n in names}}
    finally:
        with concurrent.futures.ThreadPoolExecutor(len(clusters)) as pool:
            list(pool.map(lambda c: c.close(), clusters.values()))


def run_groups(ctx: Ctx) -> Result:
    res = Result("GROUPS", "GROUPS: one Raft group against several, jobs partitioned by id")
    jobs = 2000 if ctx.quick else 4000
    seconds = 10 if ctx.quick else 20
    rows, raw = [], []
    for groups in (1, 2):
        ctx.log(f"GROUPS: {groups} group(s) of 3 nodes, {jobs} jobs in all")
        r = _storm(ctx, groups, jobs, seconds, warmup=8)
        raw.append(r)
        rows.append([str(groups), fmt(jobs), fmt(r["runs_per_s"]), fmt(r["cpu_ms_per_run"], 3),
                     str(r["term_changes"]), str(r["per_group"])])
    res.tables.append((f"{jobs} every-second jobs, {seconds} s window, all on this machine",
                       ["groups", "jobs", "runs/s", "CPU ms/run (every node)",
                        "term changes", "jobs per group"], rows))
    # Each group on a core of its own (the machine's two cores, one per group): more
    # jobs than one core runs, so the one group saturates and the two show what adds up.
    pinned_jobs = 3000 if ctx.quick else 6000
    pinned_rows, pinned = [], []
    for groups in (1, 2):
        ctx.log(f"GROUPS: {groups} group(s), each pinned to one CPU, {pinned_jobs} jobs")
        r = _storm(ctx, groups, pinned_jobs, seconds, warmup=8, pin=True)
        pinned.append(r)
        pinned_rows.append([str(groups), fmt(pinned_jobs), fmt(r["runs_per_s"]),
                            fmt(r["cpu_ms_per_run"], 3), str(r["term_changes"]),
                            str(r["per_group"])])
    res.tables.append((f"{pinned_jobs} every-second jobs, {seconds} s window, each group "
                       "pinned to one CPU of its own (one group: CPU 0; two: CPU 0 and 1)",
                       ["groups", "jobs", "runs/s", "CPU ms/run (every node)",
                        "term changes", "jobs per group"], pinned_rows))
    res.raw = {"runs": raw, "pinned": pinned}
    res.notes.append(
        "Pinned, runs/s of 2 groups ÷ 1: "
        f"{fmt(pinned[1]['runs_per_s'] / max(pinned[0]['runs_per_s'], 1), 2)} "
        "(each group a one-core machine: what a second group adds; fire times one "
        "group could not run are recorded missed by its admission control).")
    base, split = raw
    res.notes.append(
        "CPU per run, 2 groups ÷ 1: "
        f"{fmt(split['cpu_ms_per_run'] / base['cpu_ms_per_run'], 2)} (the cost of splitting; "
        "1.0 means none). On one 2-core machine both share the cores: the total is bounded "
        "by them. On G machines each group has its own cores and the runs/s one group "
        "sustains adds up G times (docs/scaling.md).")
    return res
