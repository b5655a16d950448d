"""IDLE: what a cluster costs when it has (almost) nothing to do (issue 31 item 3).

Two 3-node clusters with the defaults a user gets (4 worker slots, default timing,
``durability = "sync"``), one after the other: one with no jobs, one with 10
every-minute jobs (a shell ``true``). Each is measured over the same window after a
warm-up: the CPU (utime + stime from ``/proc``) of every node process, and of its guard (the
node's child that outlives it),
as a percentage of one core, and the Raft log entries the cluster committed in that
time (what keeps an idle cluster busy: node heartbeats, the leader's record, the runs).
Goal (issue 31): at most 1 % of a core per node. No baseline runs beside it: a figure
in % of a core is its own unit.
"""

from __future__ import annotations

import os
import time
from typing import Any

from bench.cluster import BenchCluster
from bench.common import Ctx, Result, fmt

CASES = (("no jobs", 0), ("10 every-minute jobs", 10))


def _cpu_s(pid: int | None) -> float | None:
    """utime + stime of process ``pid`` (all its threads), seconds."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def _commit_index(c: BenchCluster, nid: str) -> int | None:
    try:
        st = c.status(nid)
    except Exception:  # noqa: BLE001 - a figure, best effort
        return None
    value = st.get("commit_index")
    return int(value) if isinstance(value, int) else None


def _measure(ctx: Ctx, label: str, jobs: int, window: float, warmup: float) -> dict[str, Any]:
    c = BenchCluster(ctx.dir(f"idle-{jobs}"), workers=4, queue=16)
    try:
        specs = [{"id": f"m{i}", "schedule": {"cron": "* * * * *"}, "command": ["true"]}
                 for i in range(jobs)]
        c.start_all()
        leader = c.wait_leader(60)
        c.wait_all_alive(60)
        if specs:
            with c.client(timeout=30) as cl:
                cl.call("put_jobs", specs=specs)
        time.sleep(warmup)  # the window starts once elections and first puts are over
        pids = {n: c.pid(n) for n in c.ids}
        guards = {n: c.guard_pid(n) for n in c.ids}
        c0 = {n: _cpu_s(p) for n, p in pids.items()}
        g0 = {n: _cpu_s(p) for n, p in guards.items()}
        i0 = _commit_index(c, leader)
        t0 = time.monotonic()
        time.sleep(window)
        wall = time.monotonic() - t0
        c1 = {n: _cpu_s(p) for n, p in pids.items()}
        g1 = {n: _cpu_s(p) for n, p in guards.items()}
        i1 = _commit_index(c, leader)
        term = c.status(leader).get("term")
    finally:
        c.close()

    def pct(a: dict[str, float | None], b: dict[str, float | None]) -> dict[str, float | None]:
        return {n: (None if a[n] is None or b[n] is None
                    else round((b[n] - a[n]) / wall * 100, 2)) for n in a}

    return {"label": label, "jobs": jobs, "window_s": round(wall, 1), "leader": leader,
            "node_pct": pct(c0, c1), "guard_pct": pct(g0, g1), "term": term,
            "entries_per_s": (None if i0 is None or i1 is None
                              else round((i1 - i0) / wall, 2))}


def run_idle(ctx: Ctx) -> Result:
    res = Result("IDLE", "IDLE — a 3-node cluster with nothing to do, % of one core per node")
    window = 60.0 if ctx.quick else 300.0
    rows = []
    for label, jobs in CASES:
        ctx.log(f"IDLE: {label}, {window:.0f} s window")
        r = _measure(ctx, label, jobs, window, warmup=10.0)
        res.raw[label] = r
        nodes = [v for v in r["node_pct"].values() if v is not None]
        guards = [v for v in r["guard_pct"].values() if v is not None]
        rows.append([label, fmt(r["window_s"], 0),
                     ", ".join(f"{n} {fmt(v, 2)}" for n, v in sorted(r["node_pct"].items())
                               if v is not None) + (f" (leader {r['leader']})"),
                     fmt(max(nodes), 2) if nodes else "—",
                     fmt(max(guards), 2) if guards else "—",
                     fmt(r["entries_per_s"], 1) if r["entries_per_s"] is not None else "—"])
    res.tables.append(("CPU of each node process and of its guard, % of one core",
                       ["cluster", "window s", "node processes", "max node", "max guard",
                        "log entries committed/s"], rows))
    res.notes.append("Goal (issue 31 item 3): at most 1 % of a core per node.")
    return res
