"""W3 crashed claim holder: a node that dies the moment a run is assigned to it.

n1 and n2 start and elect a leader; n3 starts with ``RAFTSCHED_FAULT=exit_after_claim``
(it ``os._exit``\\ s as soon as its worker sees a run assigned to it). 20 every-second
jobs are put. Each time n3 exits, the runs it held are found in the records (their
transitions show ``assigned`` to n3) and the delay is measured as
``started_ms`` (on the other node) − max(n3's assignment time, ``scheduled_ms``): how
long the crashed claim delayed the run beyond when it could have started. n3 is then
restarted with the fault, a few times.

Lock-with-TTL schedulers hold a crashed worker's claim until the lock expires:
APScheduler 4's data-store lease is 30 s (RedBeat's lock timeout defaults to 1500 s);
the ratio to 30 s is reported.
"""

from __future__ import annotations

import time
from typing import Any

from bench import stats
from bench.cluster import BenchCluster, now_ms, wait_until
from bench.common import Ctx, Result, fmt, pysyncobj_problems
from raftsched.config import Timing

JOBS = 20
LEASE_S = 30.0
REDBEAT_S = 1500.0


def _cluster_run(ctx: Ctx, name: str, reps: int) -> dict[str, Any]:
    """One cluster: n1, n2, then n3 with the fault; n3 restarted in place ``reps - 1``
    times. Returns the exits, the runs and the node-log problems."""
    c = BenchCluster(ctx.dir(name), workers=64, queue=4096, history_limit=1000)
    ids = [f"w3-{i:02d}" for i in range(JOBS)]
    fault = {"RAFTSCHED_FAULT": "exit_after_claim"}
    exits: list[dict[str, Any]] = []
    try:
        c.start("n1")
        c.start("n2")
        c.wait_leader(60, among=["n1", "n2"])
        c.start("n3", env=fault)
        wait_until(lambda: _n3_alive(c), 60, "n3 joined")
        with c.client(["n1", "n2"], timeout=30) as cl:
            cl.call("put_jobs", specs=[{"id": j, "schedule": {"every": "1s"},
                                        "call": "bench.noop:stamp"} for j in ids])
        for k in range(reps):
            t_up = now_ms()
            wait_until(lambda: not c.alive("n3"), 60, "n3 to exit on a claim", 0.01)
            t_exit = now_ms()
            code = c.procs["n3"].returncode
            ctx.log(f"W3 {name} crash {k + 1}/{reps}: n3 exited (code {code}) "
                    f"{(t_exit - t_up) / 1000:.2f}s after it was (re)started")
            exits.append({"t_up": t_up, "t_exit": t_exit, "code": code,
                          "kind": "first start" if k == 0 else "restarted in place"})
            time.sleep(2.0)  # the released runs are placed elsewhere and start
            if k + 1 < reps:
                c.start("n3", env=fault)
        time.sleep(1.0)
        leader = c.wait_leader(30, among=["n1", "n2"])
        runs = c.fetch_runs(ids, 10_000, nid=leader)
        problems = pysyncobj_problems(c)
    finally:
        c.close()
    return {"exits": exits, "runs": runs, "problems": problems}


def _analyse(run: dict[str, Any]) -> tuple[list[dict[str, Any]], list[str]]:
    """Per exit: the runs n3 held (assigned to it between its start and its exit) and
    their delays; plus runs assigned to n3 that never started elsewhere."""
    exits = run["exits"]
    for e in exits:
        e["delays"], e["release"] = [], []
    never: list[str] = []
    for rs in run["runs"].values():
        for r in rs:
            trs = r["transitions"]
            n3 = [tr for tr in trs if tr[1] == "assigned" and tr[2] == "n3"]
            if not n3:
                continue
            a_ms = max(tr[0] for tr in n3)
            e = next((e for e in exits if e["t_up"] - 50 <= a_ms <= e["t_exit"] + 50), None)
            if r["started_ms"] is None or r["node"] == "n3":
                never.append(f"{r['run_id']} {r['state']} {r['reason']}")
                continue
            if e is None:
                continue
            e["delays"].append(r["started_ms"] - max(a_ms, r["scheduled_ms"]))
            rel = [tr for tr in trs if tr[1] == "pending" and tr[0] >= a_ms
                   and str(tr[4]).startswith("released")]
            if rel:
                e["release"].append(rel[0][0] - a_ms)
    return exits, never


def run_w3(ctx: Ctx) -> Result:
    res = Result("W3", "W3 crashed claim holder (RAFTSCHED_FAULT=exit_after_claim on n3)")
    reps = 3 if ctx.quick else 10
    main = _cluster_run(ctx, "w3", reps)
    exits, never = _analyse(main)
    problems = {"w3": main["problems"]}
    stale = [e for e in exits if not e["delays"]]
    # A restarted n3 may die while replaying its journal, on a claim that is long gone
    # (see the notes): such a crash holds no live run. Replace each by a fresh cluster.
    for i in range(len(stale)):
        extra = _cluster_run(ctx, f"w3-fresh{i + 1}", 1)
        ex2, nv2 = _analyse(extra)
        for e in ex2:
            e["kind"] = "fresh cluster"
        exits += ex2
        never += nv2
        problems[f"w3-fresh{i + 1}"] = extra["problems"]
    rows, delays, release = [], [], []
    for i, e in enumerate(exits):
        ds = e["delays"]
        delays += ds
        release += e["release"]
        rows.append([str(i + 1), e["kind"], fmt((e["t_exit"] - e["t_up"]) / 1000, 2),
                     str(e["code"]), fmt(len(ds)),
                     "no live claim (stale, during replay)" if not ds else
                     f"{fmt(stats.median(ds))} / {fmt(max(ds))}"])
    med = stats.median(delays)
    mx = max(delays) if delays else None
    valid = sum(1 for e in exits if e["delays"])
    res.raw = {"exits": exits, "delays_ms": delays, "release_ms": release,
               "not_restarted": never[:20], "problems": problems}
    res.tables.append(("per n3 crash", ["#", "how n3 was started", "n3 up → exit s",
                                        "exit code", "live runs it held",
                                        "delay median / max ms"], rows))
    res.tables.append((
        f"runs held by a crashed n3 ({valid} crashes with live claims; delay = start "
        "elsewhere − max(assignment to n3, fire time))",
        ["runs", "never started elsewhere", "delay median ms", "delay max ms",
         "assign→released median ms", "median ÷ 30 s lease", "max ÷ 30 s lease",
         "median ÷ 1500 s (RedBeat)"],
        [[fmt(len(delays)), fmt(len(never)), fmt(med), fmt(mx), fmt(stats.median(release)),
          fmt(stats.ratio(med, LEASE_S * 1000), 4), fmt(stats.ratio(mx, LEASE_S * 1000), 4),
          fmt(stats.ratio(med, REDBEAT_S * 1000), 6)]]))
    res.notes += [
        "A claim holder that dies before starting is noticed by the leader through the "
        "dropped Raft connection; its assigned runs are released after "
        "`DISCONNECT_GRACE_S` (50 ms) and placed again with a new fence. Runs are "
        f"assigned `lookahead` ({Timing().lookahead_ms} ms) before their fire time, so "
        "most of the release "
        "happens before the fire time and the delay is small.",
        "Lease baselines are the lock TTLs a crashed holder keeps a run blocked for: "
        "APScheduler 4 lease 30 s, RedBeat lock timeout 1500 s (its default). The ratio is "
        "our measured delay ÷ that TTL.",
    ]
    if stale:
        res.notes.append(
            f"**{len(stale)} of {reps - 1} in-place restarts of n3 died without any live "
            "claim** "
            "(n3 up → exit well under a second, no run assigned to it after it started): "
            "the restarted node's worker acted on its half-replayed journal, saw a run that "
            "*had been* assigned to n3 before its previous crash and tripped the fault on "
            "that stale claim. Each such crash was replaced by one on a fresh cluster.")
    if never:
        res.notes.append(f"runs assigned to n3 and never started elsewhere: `{never[:5]}`")
    if any(problems.values()):
        res.notes.append(f"node log warnings+: `{problems}`")
    return res


def _n3_alive(c: BenchCluster) -> bool:
    if not c.alive("n3"):
        return True  # it already died on a claim: that is "joined" enough
    for n in ("n1", "n2"):
        st = c.status(n)
        if st["leader"] is not None:
            seen = {x["node_id"]: x for x in st["nodes"]}
            return "n3" in seen and seen["n3"]["alive"]
    return False


__all__ = ["run_w3"]
