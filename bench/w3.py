"""W3 crashed claim holder: a node that dies the moment a run is assigned to it.

n1 and n2 start and elect a leader; n3 starts with the test fault ``exit_after_claim``
(``tests/support/faulthooks.py``: it exits as soon as its worker sees a run assigned to
it). 20 every-second jobs are put. Each time n3 exits, the runs it held are found in
the records (their transitions show ``assigned`` to n3) and the delay is measured as
``started_ms`` (on the other node) − max(n3's assignment time, ``scheduled_ms``): how
long the crashed claim delayed the run beyond when it could have started. n3 is then
restarted with the fault, a few times.

Lock-with-TTL schedulers hold a crashed worker's claim until the lock expires:
APScheduler 4's data-store lease is 30 s (RedBeat's lock timeout defaults to 1500 s);
the ratio to 30 s is reported.

The second case (issue 14, "killed follower"): a 3-node cluster, 12 every-second jobs
(8 ``on_node_lost = retry``, 4 ``fail``); a follower holding runs is SIGKILLed 100 ms
before a fire instant, when the runs of that instant are assigned to it and their
starts committed (pre-started: the node waits for the instant to spawn them). Per kill:
when each of those runs started on another node, as delay after its fire time. A lock
with a TTL holds them for the TTL; before issue 14 raftsched held the pre-started ones
for the node timeout (3 s).
"""

from __future__ import annotations

import os
import time
from typing import Any

from bench import stats
from bench.cluster import BenchCluster, now_ms, wait_until
from bench.common import Ctx, Result, fmt, lock_report, pysyncobj_problems
from raftsched.node.config.config import Timing
from tests.support.faulthooks import fault_env

JOBS = 20
#: The killed-follower case: jobs, kills, and how long before an instant the kill comes.
KF_RETRY, KF_FAIL = 8, 4
KF_BEFORE_MS = 100
LEASE_S = 30.0
REDBEAT_S = 1500.0


def _cluster_run(ctx: Ctx, name: str, reps: int) -> dict[str, Any]:
    """One cluster: n1, n2, then n3 with the fault; n3 restarted in place ``reps - 1``
    times. Returns the exits, the runs and the node-log problems."""
    c = BenchCluster(ctx.dir(name), workers=64, queue=4096, history_limit=1000)
    ids = [f"w3-{i:02d}" for i in range(JOBS)]
    fault = fault_env(ctx.dir(name), "exit_after_claim")
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
        lock = lock_report(c)
    finally:
        c.close()
    return {"exits": exits, "runs": runs, "problems": problems, "lock": lock}


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
            n3 = [tr for tr in trs if tr["state"] == "assigned" and tr["node"] == "n3"]
            if not n3:
                continue
            a_ms = max(tr["at_ms"] for tr in n3)
            e = next((e for e in exits if e["t_up"] - 50 <= a_ms <= e["t_exit"] + 50), None)
            if r["started_ms"] is None or r["node"] == "n3":
                never.append(f"{r['run_id']} {r['state']} {r['reason']}")
                continue
            if e is None:
                continue
            e["delays"].append(r["started_ms"] - max(a_ms, r["scheduled_ms"]))
            rel = [tr for tr in trs if tr["state"] == "pending" and tr["at_ms"] >= a_ms
                   and str(tr["note"]).startswith("released")]
            if rel:
                e["release"].append(rel[0]["at_ms"] - a_ms)
    return exits, never


def run_w3(ctx: Ctx) -> Result:
    res = Result("W3", "W3 crashed claim holder (exit_after_claim on n3)")
    reps = 3 if ctx.quick else 10
    main = _cluster_run(ctx, "w3", reps)
    exits, never = _analyse(main)
    problems = {"w3": main["problems"]}
    res.locks.append(("w3 (n3 restarted: since its last start)", main["lock"]))
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
        res.locks.append((f"w3-fresh{i + 1}", extra["lock"]))
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
    run_w3_follower(ctx, res)
    return res


#: How W3F kills the follower: the node process alone (its guard certifies the death),
#: or the node and its guard (a host loss: the lease applies).
KILLS = {"node": "SIGKILL of the node (its guard certifies it dead)",
         "host": "SIGKILL of guard and node (host loss: the lease applies)"}


def _killed_follower(ctx: Ctx, kills: int, how: str = "node") -> dict[str, Any]:
    """SIGKILL a follower holding pre-started runs KF_BEFORE_MS before their instant;
    restart it, let it rejoin, again ``kills`` times. Returns the kills and the runs."""
    from bench.w2 import bench_timing
    c = BenchCluster(ctx.dir(f"w3-follower-{how}"), workers=64, queue=4096,
                     history_limit=1000, timing=bench_timing())
    ids = [f"kf-r{i:02d}" for i in range(KF_RETRY)] + [f"kf-f{i:02d}" for i in range(KF_FAIL)]
    kills_at: list[dict[str, Any]] = []
    try:
        c.start_with_jobs([{"id": j, "schedule": {"every": "1s"}, "call": "bench.noop:stamp",
                            "on_node_lost": "fail" if "-f" in j else "retry"} for j in ids])
        time.sleep(4)
        for k in range(kills):
            leader = c.wait_leader(60)
            victim = next(n for n in c.ids if n != leader and c.alive(n))
            # 100 ms before the next whole second: that instant's runs are assigned
            # (lookahead) and their starts committed (pre-start) on the victim.
            time.sleep((1.0 - KF_BEFORE_MS / 1000 - time.time() % 1.0) % 1.0)
            t_kill = c.kill(victim) if how == "node" else c.kill_host(victim)
            instant = (t_kill // 1000 + 1) * 1000
            ctx.log(f"W3 killed follower ({how}) {k + 1}/{kills}: SIGKILL {victim} "
                    f"{instant - t_kill} ms before {instant}")
            kills_at.append({"victim": victim, "t_kill": t_kill, "instant": instant})
            time.sleep(5.0)  # past the old node timeout: the runs moved on either way
            c.start(victim)
            c.wait_all_alive(60)
            time.sleep(2.0)
        time.sleep(2.0)
        leader = c.wait_leader(30)
        runs = c.fetch_runs(ids, 2000, nid=leader)
        problems = pysyncobj_problems(c)
        stamps = c.stamps()
    finally:
        c.close()
    # Executions of one attempt of one run more than once, or of two attempts of one run
    # at once, would be doubles (the stamps are written when the callable is entered).
    per_attempt: dict[tuple[str, int], int] = {}
    for run_id, attempt, *_ in stamps:
        per_attempt[(run_id, attempt)] = per_attempt.get((run_id, attempt), 0) + 1
    doubled = sum(n - 1 for n in per_attempt.values() if n > 1)
    return {"kills": kills_at, "runs": runs, "problems": problems, "doubled": doubled,
            "executions": len(stamps)}


def _analyse_follower(run: dict[str, Any]) -> dict[str, Any]:
    """Per kill, the runs of its instant the victim held: pre-started (start committed on
    the victim) or only assigned; where and when each started next."""
    out = []
    for kv in run["kills"]:
        victim, instant = kv["victim"], kv["instant"]
        pre, assigned, lost, never = [], [], [], []
        skipped = 0
        reasons: dict[str, int] = {}
        for job, recs in run["runs"].items():
            # Fires after the instant recorded skipped for overlap while the dead node's
            # run still counted as active (until it was released).
            skipped += sum(int(r.get("count") or 1) for r in recs
                           if r["state"] == "skipped" and instant < r["scheduled_ms"]
                           <= instant + 5000)
            mine = [r for r in recs if r["scheduled_ms"] == instant]
            if not mine:
                continue
            for r in mine:
                if r["state"] == "lost":
                    reasons[r["reason"]] = reasons.get(r["reason"], 0) + 1
            trs = [tr for r in mine for tr in r["transitions"]]
            held_started = any(tr["state"] == "started" and tr["node"] == victim
                               and tr["at_ms"] <= kv["t_kill"] + 2000 for tr in trs)
            held = held_started or any(tr["state"] == "assigned" and tr["node"] == victim
                                       for tr in trs)
            if not held:
                continue
            elsewhere = [r["started_ms"] for r in mine
                         if r["started_ms"] is not None and r["node"] not in (None, victim)]
            if elsewhere:
                (pre if held_started else assigned).append(min(elsewhere) - instant)
            elif any(r["state"] == "lost" for r in mine):
                lost.append(job)
            else:
                never.append(f"{job}: {[(r['state'], r['node']) for r in mine]}")
        out.append({**kv, "prestarted_delays": pre, "assigned_delays": assigned,
                    "lost": lost, "never": never, "skipped": skipped, "reasons": reasons})
    return {"kills": out}


def run_w3_follower(ctx: Ctx, res: Result) -> None:
    kills = 4 if ctx.quick else 10
    summary = []
    for how, what in KILLS.items():
        data = _killed_follower(ctx, kills, how)
        an = _analyse_follower(data)
        rows, pre_all, asg_all, lost_all, skipped_all = [], [], [], 0, 0
        reasons: dict[str, int] = {}
        for i, kv in enumerate(an["kills"]):
            pre, asg = kv["prestarted_delays"], kv["assigned_delays"]
            pre_all += pre
            asg_all += asg
            lost_all += len(kv["lost"])
            skipped_all += kv["skipped"]
            for reason, n in kv["reasons"].items():
                reasons[reason] = reasons.get(reason, 0) + n
            rows.append([str(i + 1), kv["victim"], str(kv["instant"] - kv["t_kill"]),
                         fmt(len(pre)),
                         f"{fmt(stats.median(pre))} / {fmt(max(pre) if pre else None)}",
                         fmt(len(asg)),
                         f"{fmt(stats.median(asg))} / {fmt(max(asg) if asg else None)}",
                         fmt(len(kv["lost"])), fmt(len(kv["never"])), fmt(kv["skipped"])])
        res.raw[f"killed_follower_{how}"] = {"kills": an["kills"],
                                             "problems": data["problems"]}
        res.tables.append((
            f"killed follower, {what}: {KF_BEFORE_MS} ms before an instant ({KF_RETRY} "
            f"retry + {KF_FAIL} fail every-second jobs); delay = start elsewhere − fire "
            "time, ms",
            ["#", "victim", "ms before instant", "pre-started runs re-dispatched",
             "their delay median / max", "assigned-only runs", "their delay median / max",
             "lost (on_node_lost = fail)", "never started",
             "next fires skipped (overlap) within 5 s"], rows))
        summary.append([what, fmt(len(pre_all)), fmt(stats.median(pre_all)),
                        fmt(max(pre_all) if pre_all else None), fmt(len(asg_all)),
                        fmt(stats.median(asg_all)), fmt(lost_all), fmt(skipped_all),
                        f"{data['doubled']} of {data['executions']}",
                        "; ".join(f"{r} ×{n}" for r, n in sorted(reasons.items()))])
        if any(data["problems"].values()):
            res.notes.append(f"killed follower ({how}), node log warnings+: "
                             f"`{data['problems']}`")
    res.tables.append((
        "killed follower, all kills (ms after the fire time)",
        ["kill", "pre-started re-dispatched", "delay median", "delay max", "assigned-only",
         "delay median", "lost (fail)", "fires skipped (overlap) within 5 s",
         "doubled executions", "reasons recorded"], summary))
    rows = []
    for how in ("sigkill", "oom"):
        if how == "oom" and _oom_unavailable():
            res.notes.append(f"OOM variant not run: {_oom_unavailable()}")
            continue
        mid = _killed_mid_run(ctx, 3 if ctx.quick else 6, how)
        res.raw[f"killed_mid_run_{how}"] = mid
        rows.append([
            "SIGKILL" if how == "sigkill"
            else "OOM kill (cgroup memory limit; from the limit set, the death follows)",
            fmt(mid["kills"]), fmt(len(mid["delays"])), fmt(stats.median(mid["delays"])),
            fmt(max(mid["delays"]) if mid["delays"] else None),
            "; ".join(f"{r} ×{n}" for r, n in sorted(mid["reasons"].items()))])
    res.tables.append((
        "a node killed while its runs execute (on_node_lost = retry, 0.5 s runs): the "
        "node's death → the new attempt's start, ms",
        ["how", "kills", "runs re-dispatched", "delay median", "delay max",
         "reasons recorded"], rows))


#: A memory cgroup (v1) the OOM variant puts a node into.
_MEMCG = "/sys/fs/cgroup/memory"


def _oom_unavailable() -> str | None:
    if os.geteuid() != 0 or not os.path.exists(f"{_MEMCG}/cgroup.procs"):
        return "needs root and a cgroup v1 memory controller"
    return None


def _oom_kill(c: BenchCluster, nid: str) -> int:
    """Put ``nid``'s node process (not its guard) in a memory cgroup whose limit sits
    just above what it uses: its next allocations make the kernel's OOM killer SIGKILL
    it. Returns when the limit was set (epoch ms): the death follows at the node's next
    allocation, and only the kernel knows when exactly (the poll that notices it comes
    later than the certificate its guard sends, so it cannot be the reference)."""
    pid = c.pid(nid)
    limited = now_ms()
    group = f"{_MEMCG}/raftsched-bench-oom-{pid}"
    os.makedirs(group, exist_ok=True)
    with open(f"{group}/cgroup.procs", "w") as f:
        f.write(str(pid))
    with open(f"{group}/memory.usage_in_bytes") as f:
        usage = int(f.read())
    with open(f"{group}/memory.limit_in_bytes", "w") as f:
        f.write(str(usage + (64 << 10)))
    # Requests make it allocate (an idle node may take a while to need 64 KB more).
    deadline = time.monotonic() + 60
    while c.procs[nid].poll() is None and time.monotonic() < deadline:
        try:
            c.status(nid, timeout=0.5)
        except Exception:  # noqa: BLE001 - it may be dying
            time.sleep(0.01)
    c.procs[nid].wait(10)
    for _ in range(50):
        try:
            os.rmdir(group)
            break
        except OSError:
            time.sleep(0.1)
    return limited


def _killed_mid_run(ctx: Ctx, kills: int, how: str = "sigkill") -> dict[str, Any]:
    """Kill a follower (``sigkill``, or ``oom``: the kernel's OOM killer) while runs of it
    execute (0.5 s sleeps): how soon each one's next attempt starts elsewhere, from the
    node's death."""
    from bench.w2 import bench_timing
    c = BenchCluster(ctx.dir(f"w3-mid-run-{how}"), workers=64, queue=4096,
                     history_limit=1000, timing=bench_timing())
    ids = [f"mr-{i:02d}" for i in range(KF_RETRY)]
    delays: list[float] = []
    reasons: dict[str, int] = {}
    try:
        c.start_with_jobs([{"id": j, "schedule": {"every": "2s"}, "overlap": "allow",
                            "call": "bench.noop:sleep_half"} for j in ids])
        time.sleep(4)
        for k in range(kills):
            leader = c.wait_leader(60)
            victim = next(n for n in c.ids if n != leader and c.alive(n))
            # 200 ms into an even second: that instant's runs are executing.
            time.sleep((2.2 - time.time() % 2.0) % 2.0)
            t_kill = c.kill(victim) if how == "sigkill" else _oom_kill(c, victim)
            ctx.log(f"W3 killed mid-run {k + 1}/{kills}: {how} {victim}")
            time.sleep(3.0)
            with c.client([leader], timeout=30) as cl:
                for j in ids:
                    recs = cl.call("runs", id=j, limit=20)["runs"]
                    for r in recs:
                        if r["state"] == "lost" and r["node"] == victim \
                                and r["finished_ms"] >= t_kill:
                            reasons[r["reason"]] = reasons.get(r["reason"], 0) + 1
                            nxt = next((x for x in recs if x["run_id"] == r["run_id"]
                                        and x["attempt"] == r["attempt"] + 1
                                        and x["started_ms"] is not None), None)
                            if nxt is not None:
                                delays.append(nxt["started_ms"] - t_kill)
            c.start(victim)
            c.wait_all_alive(60)
            time.sleep(2.0)
    finally:
        c.close()
    return {"kills": kills, "delays": delays, "reasons": reasons}


def run_w3f(ctx: Ctx) -> Result:
    """W3's killed-follower case alone (``--only W3F``)."""
    res = Result("W3F", f"W3 killed follower: SIGKILL {KF_BEFORE_MS} ms before an instant "
                        "with pre-started runs")
    run_w3_follower(ctx, res)
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


__all__ = ["run_w3", "run_w3f"]
