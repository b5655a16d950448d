"""W4 scale: N far-future jobs (bulk put), memory, snapshot, restart, tick cost.

Steps (one 3-node cluster, N grows in steps):

1. 10 every-second ``bench.noop:stamp`` jobs ("tick probes") run all along; their lag
   at each N shows whether the leader's tick cost grows with the job table.
2. Far-future jobs (``{"at": "2099-01-01T00:00:00Z"}``) are bulk-put with ``put_jobs``
   in batches (5000, or the node's smaller ``MAX_PUT_BATCH``) up to each N: put rate,
   RSS per node, RSS per job.
3. After the last N: small ``put_job`` writes from 16 threads, timed one by one, until
   every node has written ``raft.dump`` (pysyncobj compacts after 50,000 log entries
   or 600 s, both fixed in ``raftsched/node/replica/raft.py``), so the writes are both the load that
   reaches the compaction threshold and the latency probe during the dump.
4. Restart: SIGTERM all nodes, start them again, time until ``status`` answers with a
   leader and ``list_jobs`` reports all N jobs.

Also an in-process ``tracemalloc`` breakdown of the state's bytes per job (by source
line), to explain the RSS figure.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Any

from bench import stats
from bench.cluster import BenchCluster, now_ms, wait_until
from bench.common import Ctx, Result, bulk_batch, fmt, lock_report, pysyncobj_problems
from bench.replicas import diff_runs, snapshot_runs
from raftsched.node.replica.raft import LOG_COMPACTION_ENTRIES

FAR = {"at": "2099-01-01T00:00:00Z"}
TICK_JOBS = 10
#: Writer threads of the snapshot phase (one API connection each: a connection is
#: served one request at a time).
WRITERS = 16
#: How often a restart's figures are polled (seconds).
POLL_S = 0.02


def far_spec(i: int) -> dict[str, Any]:
    return {"id": f"far-{i:07d}", "schedule": FAR, "call": "bench.noop:noop"}


def run_w4(ctx: Ctx, steps: list[int] | None = None, snap_budget: float | None = None,
           force_snapshot: bool = False) -> Result:
    res = Result("W4", "W4 scale: far-future jobs, memory, snapshot, restart, tick cost")
    steps = steps or ([20_000, 100_000] if ctx.quick else [100_000, 500_000, 1_000_000])
    window = 5 if ctx.quick else 10
    snap_budget = snap_budget or (150 if ctx.quick else 300)
    # max_jobs above the largest N: the tick probes and fillers come on top of N.
    c = BenchCluster(ctx.dir("w4"), workers=16, queue=64, history_limit=100,
                     max_jobs=max(steps) + 10_000)
    rows, tick_rows, snap_rows, restart_rows, replay_rows = [], [], [], [], []
    one_rows: list[list[str]] = []
    curve: list[dict[str, Any]] = []
    try:
        c.start_all()
        leader = c.wait_leader(60)
        c.wait_all_alive(60)
        with c.client(timeout=30) as cl:
            cl.call("put_jobs", specs=[{"id": f"tick-{i}", "schedule": {"every": "1s"},
                                        "call": "bench.noop:stamp"}
                                       for i in range(TICK_JOBS)])
        time.sleep(3)
        rss0 = {n: c.rss_kb(n) for n in c.ids}
        tick0 = _tick_window(c, leader, window)
        tick0["n"] = 0
        curve.append({"n": 0, "rss": rss0, **tick0})
        tick_rows.append(_tick_row(0, tick0))
        done = 0
        refused, refused_example = 0, ""
        for target in steps:
            ctx.log(f"W4 putting far-future jobs {done:,} → {target:,}")
            t0 = time.monotonic()
            batch_s: list[float] = []
            batch = bulk_batch()
            with c.client([leader], timeout=120) as cl:
                while done < target:
                    n = min(batch, target - done)
                    tb = time.monotonic()
                    reply = cl.call("put_jobs", specs=[far_spec(i) for i in
                                                       range(done, done + n)])
                    batch_s.append(time.monotonic() - tb)
                    bad = [r for r in reply["results"] if not r.get("ok")]
                    if bad:
                        refused += len(bad)
                        refused_example = refused_example or str(bad[0])[:200]
                    done += n
            put_s = time.monotonic() - t0
            added = target - (curve[-1]["n"] if curve else 0)
            wait_until(lambda t=target, r=refused: all(c.status(n)["jobs"] >= t + TICK_JOBS - r
                                                       for n in c.ids),
                       300, f"{target} jobs everywhere")
            applied_all_s = time.monotonic() - t0
            time.sleep(1.0)
            rss = {n: c.rss_kb(n) for n in c.ids}
            rss_file = [c.rss_kb(n, "RssFile") for n in c.ids]
            per_job = {n: ((rss[n] - rss0[n]) * 1024 / target)
                       if rss[n] and rss0[n] else None for n in c.ids}
            tl = time.monotonic()
            with c.client([leader], timeout=120) as cl:
                total = cl.list_jobs(prefix="far-", limit=1)["total"]
            list_s = time.monotonic() - tl
            tick = _tick_window(c, leader, window)
            st = c.status(leader)
            curve.append({"n": target, "rss": rss, **tick})
            rows.append([fmt(target), fmt(added / put_s), fmt(max(batch_s), 2),
                         fmt(applied_all_s, 1)]
                        + [fmt(rss[n] / 1024 if rss[n] else None) for n in c.ids]
                        + [fmt(sum(v for v in per_job.values() if v) / len(c.ids))]
                        + [fmt(sum(v or 0 for v in rss_file) / 1024 / len(rss_file))]
                        + [fmt(list_s * 1000), "yes" if total == target else f"no ({total})",
                           str(st["term"])])
            tick_rows.append(_tick_row(target, tick))
            leader = c.wait_leader(30)
        # ------------------------------------------------------------ snapshot
        if ctx.quick and not force_snapshot:
            res.notes.append("**--quick skips the snapshot phase**: reaching pysyncobj's "
                             "50,000-entry compaction threshold takes ~60 s of small writes "
                             "on this machine (~800 writes/s at best); the full run "
                             "measures it.")
            snap = {"dumps": {}, "skipped": True}
        else:
            ctx.log(f"W4 snapshot: small writes until every node dumps (≤ {snap_budget}s)")
            snap = _snapshot_phase(c, leader, snap_budget)
        res.raw["snapshot"] = {k: v for k, v in snap.items() if k != "lat"}
        for nid in c.ids:
            d = snap["dumps"].get(nid, {})
            snap_rows.append([nid, fmt(d.get("size", 0) / 1e6 if d.get("size") else None, 1),
                              fmt(d.get("tmp_at")), fmt(d.get("done_at")),
                              fmt(d.get("dump_s"), 2)])
        # ------------------------------------------------------------ restart
        ctx.log("W4 restart: SIGTERM all, start all")
        final_n = steps[-1]
        tick_ids = [f"tick-{i}" for i in range(TICK_JOBS)]
        pre = {n: snapshot_runs(c, n, tick_ids, 1000) for n in c.ids}
        pre_applied = {n: c.status(n)["applied"] for n in c.ids}
        cut = now_ms() - 3000
        stop_s = c.terminate_all(60)
        t0 = time.monotonic()
        c.start_all()
        for n in c.ids:
            _api_accepts(c, n, t0)
        status_s = wait_until(lambda: _status_ok(c) and time.monotonic() - t0, 600,
                              "status after restart", POLL_S)
        leader = c.wait_leader(120)

        def all_jobs() -> float | None:
            with c.client([leader], timeout=60) as cl:
                if cl.list_jobs(prefix="far-", limit=1)["total"] == final_n:
                    return time.monotonic() - t0
            return None
        jobs_s = wait_until(all_jobs, 600, "all jobs after restart", 0.2)
        wait_until(lambda: all(c.status(n)["applied"] >= pre_applied[n] for n in c.ids),
                   300, "replay past the pre-restart log", 0.2)
        time.sleep(1)
        rss_r = {n: c.rss_kb(n) for n in c.ids}
        post = {n: snapshot_runs(c, n, tick_ids, 1000) for n in c.ids}
        replay = {n: diff_runs(pre[n], post[n], cut) for n in c.ids}
        cross = diff_runs(post["n1"], post["n2"], cut), diff_runs(post["n1"], post["n3"], cut)
        res.raw["replay_check"] = {"per_node": replay, "cross": cross}
        for n in c.ids:
            d = replay[n]
            replay_rows.append([n, fmt(d["compared"]), fmt(d["mismatched"]),
                                fmt(d["only_one_side"]), "; ".join(d["examples"][:2]) or "—"])
        for name, d in (("n1 vs n2 after restart", cross[0]), ("n1 vs n3 after restart",
                                                                  cross[1])):
            replay_rows.append([name, fmt(d["compared"]), fmt(d["mismatched"]),
                                fmt(d["only_one_side"]), "; ".join(d["examples"][:2]) or "—"])
        # The same measure as the put steps' (against each node's RSS before any far-
        # future job), once the Raft log the puts left in memory is compacted away.
        after = [(rss_r[n] - rss0[n]) * 1024 / final_n for n in c.ids if rss_r[n] and rss0[n]]
        restart_rows.append([fmt(final_n), fmt(max(stop_s.values()), 2), fmt(status_s, 2),
                             fmt(jobs_s, 2)] + [fmt(rss_r[n] / 1024 if rss_r[n] else None)
                                                for n in c.ids]
                            + [fmt(sum(after) / len(after)) if after else "—"])
        res.raw["restart"] = {"stop_s": stop_s, "status_s": status_s, "jobs_s": jobs_s,
                              "rss_kb": rss_r}
        one_rows.append(_restart_one(c, final_n))
        res.raw["restart_one"] = one_rows[-1]
        res.raw["problems"] = pysyncobj_problems(c)
        res.locks.append(("W4 cluster (nodes restarted in the restart phase: since then)",
                          lock_report(c)))
        if refused:
            res.notes.append(f"**put_jobs refused {refused} specs**, e.g. `{refused_example}`")
    finally:
        c.close()
    res.raw["curve"] = curve
    res.raw["breakdown"] = _tracemalloc_breakdown(20_000)
    res.tables.append((
        "bulk put and memory (RSS of each node process)",
        ["N far-future jobs", "put rate jobs/s", "slowest put_jobs s", "put → all nodes s"]
        + [f"RSS {n} MB" for n in ("n1", "n2", "n3")]
        + ["RSS/job B (mean of nodes)", "of RSS file-backed MB (mean)",
           "list_jobs(limit=1) ms", "list total == N", "term"],
        rows))
    res.tables.append((
        f"tick probes: {TICK_JOBS} every-second jobs beside N far-future ones "
        f"({window} s window, ms)",
        ["N", "lag(start rec) p50", "p99", "lag(call) p50", "p99", "runs ok/expected",
         "leader apply ms/cmd", "leader commit mean ms", "leader plan ms/s",
         "plans committed", "leader CPU %"], tick_rows))
    res.tables.append((
        "snapshot (log compaction) after the last step",
        ["node", "raft.dump MB", "dump started s (after puts)", "dump file replaced s",
         "dump duration s"], snap_rows))
    s = res.raw.get("snapshot", {})
    res.tables.append((
        f"writes during the snapshot phase (put_job from {WRITERS} threads, latency ms)",
        ["writes", "entries to 50k (50,000 − commit index at start)", "write/s",
         "p50 before dump", "p99 before", "max before", "p50 during dump", "p99 during",
         "max during", "dump reached", "term (leader) before → after"],
        [[fmt(s.get("writes")), fmt(s.get("entries_needed")), fmt(s.get("rate")),
          fmt(s.get("before", {}).get("p50")), fmt(s.get("before", {}).get("p99")),
          fmt(s.get("before", {}).get("max")), fmt(s.get("during", {}).get("p50")),
          fmt(s.get("during", {}).get("p99")), fmt(s.get("during", {}).get("max")),
          "yes" if s.get("all_dumped") else "no",
          "{0[0]} ({1[0]}) → {0[1]} ({1[1]})".format(s.get("term", [None, None]),
                                                      s.get("leader", [None, None]))]]))
    if s.get("terms"):
        windows = ", ".join(f"{n} {fmt(d.get('tmp_at'))}–{fmt(d.get('done_at'))} s"
                            for n, d in s.get("dumps", {}).items())
        moves = ", ".join(f"{fmt(t)} s: term {term} ({lead})" for t, term, lead in s["terms"][1:])
        res.notes.append(f"Snapshot phase: dump windows {windows}; term changes "
                         f"{moves or 'none'} (polled every 0.1 s on the first leader).")
    res.tables.append((
        "restart of all three nodes (SIGTERM, start again)",
        ["N", "slowest SIGTERM exit s", "status answers s", "list_jobs total == N s"]
        + [f"RSS {n} MB after" for n in ("n1", "n2", "n3")]
        + ["RSS/job B after (mean of nodes)"], restart_rows))
    res.tables.append((
        "restart of one follower (SIGTERM, start again; the other two go on)",
        ["N", "node", "SIGTERM exit s", "API port accepts s", "status answers s",
         "consistent list_jobs on it, total == N s", "RSS MB after"], one_rows))
    res.tables.append((
        "journal replay check: tick-probe run records before the restart vs after it "
        "(terminal records finished > 3 s before the SIGTERM)",
        ["node", "records compared", "differ", "on one side only", "examples"], replay_rows))
    bd = res.raw["breakdown"]
    res.tables.append((
        "why: tracemalloc of ClusterState.apply(put_jobs) in-process, 20,000 jobs in "
        f"batches of {bulk_batch()} (bytes per job by source line)",
        ["source line", "B/job"], [[f"`{k}`", fmt(v)] for k, v in bd["top"]]
        + [["**total**", fmt(bd["total"])]]))
    res.notes += [
        f"Bulk put: `put_jobs` with {bulk_batch()} specs per call (the node's cap, "
        "`raftsched.core.machine.MAX_PUT_BATCH`; the brief asked for 5000, the API now refuses "
        "more than the cap), one call at a time on one connection to the leader.",
        "RSS/job = (RSS after the step − RSS before any far-future job) ÷ N, per node, "
        "averaged over the three nodes; the target is ≤ 1 KB/job.",
        "The tick probes' lag must not grow with N; *leader apply ms/cmd* comes from "
        "`raftsched_apply_seconds`/`raftsched_applied_commands` deltas on the leader's "
        "/metrics; *leader plan ms/s* is the time the leader spent building plans (the tick "
        "that finds due jobs and places them: `raftsched_leader_plan_seconds` delta ÷ "
        "window) and *plans committed* the plan commands it committed in the window.",
        f"Snapshot: pysyncobj compacts when the log exceeds {LOG_COMPACTION_ENTRIES:,}-"
        f"{LOG_COMPACTION_ENTRIES * 3 // 2:,} (drawn per node) "
        "entries (`logCompactionMinEntries`), after 600 s, or once the log since the last "
        "snapshot holds 32 MiB (`RaftSyncObj.rs_compaction_bytes`: ~330,000 of these specs, "
        "so the puts of the larger steps are compacted as they go). The snapshot phase "
        "starts right after the puts, so the time until its dump appears is the time our "
        f"small writes take to reach {LOG_COMPACTION_ENTRIES:,} entries, not a property "
        "of N. "
        "*dump duration* = first sight of "
        "`raft.dump.tmp` → `raft.dump` replaced (polled every 20 ms).",
    ]
    if curve:
        res.plots.append(_plot(ctx, curve))
    return res


def _restart_one(c: BenchCluster, n: int) -> list[str]:
    """Issue 31's "restart of a node to answering consistent reads": one follower
    restarts while the other two keep the cluster; a read on it is served from its own
    state once it has applied a barrier through the log (``node/replica/reads.py``)."""
    leader = c.wait_leader(120)
    nid = next(x for x in c.ids if x != leader)
    stop_s = c.terminate(nid, 60)
    t0 = time.monotonic()
    c.start(nid)
    port_s = _api_accepts(c, nid, t0)
    status_s = wait_until(lambda: c.status(nid, timeout=2)["leader"] is not None
                          and time.monotonic() - t0, 600, f"status of {nid}", POLL_S)

    def listed() -> float | None:
        with c.client([nid], timeout=60) as cl:
            if cl.list_jobs(prefix="far-", limit=1)["total"] == n:
                return time.monotonic() - t0
        return None
    jobs_s = wait_until(listed, 600, f"all jobs on {nid}", POLL_S)
    rss = c.rss_kb(nid)
    return [fmt(n), nid, fmt(stop_s, 2), fmt(port_s, 2), fmt(status_s, 2), fmt(jobs_s, 2),
            fmt(rss / 1024 if rss else None)]


def _api_accepts(c: BenchCluster, nid: str, t0: float) -> float:
    """Seconds since ``t0`` until node ``nid``'s API port accepts a connection, polled
    every POLL_S: where a restart's start-up ends (the port opens before the state is
    loaded). The reads are asked only from then, so none meets a refused connection,
    after which a one-address client pauses 0.5 s (``wire/client.py``)."""
    host, port = c.api[nid].rsplit(":", 1)

    def accepts() -> float | None:
        with socket.create_connection((host, int(port)), timeout=1.0):
            return time.monotonic() - t0
    return float(wait_until(accepts, 600, f"{nid}'s API port", POLL_S))


def _status_ok(c: BenchCluster) -> bool:
    for n in c.ids:
        if c.status(n, timeout=2)["leader"] is None:
            return False
    return True


def _tick_window(c: BenchCluster, leader: str, seconds: int) -> dict[str, Any]:
    """Lag of the tick probes for ``seconds`` whole seconds from now."""
    start = now_ms()
    w0 = -(-(start + 500) // 1000) * 1000
    w1 = w0 + seconds * 1000
    m0 = _m(c, leader)
    cpu0 = c.cpu_s(leader)
    while now_ms() < w1:
        time.sleep(min(0.5, max((w1 - now_ms()) / 1000, 0.01)))
    m1 = _m(c, leader)
    cpu1 = c.cpu_s(leader)
    while now_ms() < w1 + 2000:
        time.sleep(0.2)
    ids = [f"tick-{i}" for i in range(TICK_JOBS)]
    runs = c.fetch_runs(ids, 200, nid=leader, threads=1)
    stamps = stats.stamp_executions(c.stamps(), w0, w1)
    lag_s, lag_c = [], []
    ok = 0
    for job_runs in runs.values():
        for r in job_runs:
            if w0 <= r["scheduled_ms"] < w1 and r["state"] == "succeeded":
                ok += 1
                if r["started_ms"] is not None:
                    lag_s.append(r["started_ms"] - r["scheduled_ms"])
                call = stamps["first_call"].get(r["run_id"])
                if call is not None:
                    lag_c.append(call - r["scheduled_ms"])
    applied = m1.get("applied", 0) - m0.get("applied", 0)
    apply_s = m1.get("apply_s", 0) - m0.get("apply_s", 0)
    cn = m1.get("commit_n", 0) - m0.get("commit_n", 0)
    cs = m1.get("commit_sum", 0) - m0.get("commit_sum", 0)
    plan_s = m1.get("plan_s", 0) - m0.get("plan_s", 0)
    return {"plan_ms_per_s": plan_s / seconds * 1000 if m1 else None,
            "plans": m1.get("plans", 0) - m0.get("plans", 0) if m1 else None,
"lag_start": stats.summary(lag_s), "lag_call": stats.summary(lag_c), "ok": ok,
            "expected": TICK_JOBS * seconds,
            "apply_ms": apply_s / applied * 1000 if applied else None,
            "commit_ms": cs / cn * 1000 if cn else None,
            "cpu_pct": (cpu1 - cpu0) / seconds * 100 if cpu0 is not None and cpu1 is not None
            else None}


def _tick_row(n: int, t: dict[str, Any]) -> list[str]:
    return [fmt(n), fmt(t["lag_start"]["p50"]), fmt(t["lag_start"]["p99"]),
            fmt(t["lag_call"]["p50"]), fmt(t["lag_call"]["p99"]),
            f"{t['ok']}/{t['expected']}", fmt(t["apply_ms"], 2), fmt(t["commit_ms"], 1),
            fmt(t["plan_ms_per_s"], 2), fmt(t["plans"]), fmt(t["cpu_pct"])]


def _m(c: BenchCluster, nid: str) -> dict[str, float]:
    try:
        m = c.metrics(nid)
    except OSError:
        return {}
    return {"applied": m.get("raftsched_applied_commands_total", 0.0),
            "apply_s": m.get("raftsched_apply_seconds_total", 0.0),
            "commit_n": m.get("raftsched_commit_latency_seconds_count", 0.0),
            "commit_sum": m.get("raftsched_commit_latency_seconds_sum", 0.0),
            "plan_s": m.get("raftsched_leader_plan_seconds_total", 0.0),
            "plans": m.get("raftsched_leader_plans_total", 0.0)}


def _snapshot_phase(c: BenchCluster, leader: str, budget: float) -> dict[str, Any]:
    dump_paths = {n: os.path.join(c.data_dir, n, "raft.dump") for n in c.ids}
    before_mtime = {n: os.path.getmtime(p) if os.path.exists(p) else None
                    for n, p in dump_paths.items()}
    st0 = c.status(leader)
    commit0 = st0.get("commit_index") or 0
    stop = threading.Event()
    lat: list[tuple[float, float]] = []  # (start monotonic, seconds)
    lock = threading.Lock()
    errors: list[str] = []

    def writer(k: int) -> None:
        spec = {"id": f"fill-{k}", "schedule": FAR, "call": "bench.noop:noop"}
        with c.client([leader], timeout=30) as cl:
            while not stop.is_set():
                t = time.monotonic()
                try:
                    cl.put_job(spec)
                except Exception as exc:  # noqa: BLE001 - count and go on
                    if len(errors) < 5:
                        errors.append(repr(exc))
                    time.sleep(0.05)
                    continue
                with lock:
                    lat.append((t, time.monotonic() - t))

    t0 = time.monotonic()
    threads = [threading.Thread(target=writer, args=(k,), daemon=True) for k in range(WRITERS)]
    for th in threads:
        th.start()
    dumps: dict[str, dict[str, Any]] = {n: {} for n in c.ids}
    done_at: float | None = None
    # (seconds from t0, term, leader) whenever the term moves: is an election due to a
    # dump (inside a dump window) or to the load alone?
    terms: list[tuple[float, Any, Any]] = [(0.0, st0.get("term"), st0.get("leader"))]
    next_term_check = t0
    try:
        while time.monotonic() - t0 < budget:
            now = time.monotonic()
            if now >= next_term_check:
                next_term_check = now + 0.1
                try:
                    st = c.status(leader, timeout=1)
                except Exception:  # noqa: BLE001 - the leader is busy or gone: try later
                    st = {}
                if st and st.get("term") != terms[-1][1]:
                    terms.append((now - t0, st.get("term"), st.get("leader")))
            for n, p in dump_paths.items():
                d = dumps[n]
                if "tmp_mono" not in d and os.path.exists(p + ".tmp"):
                    d["tmp_mono"] = now
                if "done_mono" not in d and os.path.exists(p) \
                        and os.path.getmtime(p) != before_mtime[n]:
                    d["done_mono"] = now
                    d["size"] = os.path.getsize(p)
            if all("done_mono" in d for d in dumps.values()):
                if done_at is None:
                    done_at = now
                if now - done_at > 2.0:
                    break
            time.sleep(0.02)
    finally:
        stop.set()
        for th in threads:
            th.join(35)
    st1 = c.status(leader)
    commit1 = st1.get("commit_index") or 0
    for d in dumps.values():
        if "tmp_mono" in d:
            d["tmp_at"] = d["tmp_mono"] - t0
        if "done_mono" in d:
            d["done_at"] = d["done_mono"] - t0
            if "tmp_mono" in d:
                d["dump_s"] = d["done_mono"] - d["tmp_mono"]
    starts = [d["tmp_mono"] for d in dumps.values() if "tmp_mono" in d] + \
        [d["done_mono"] for d in dumps.values() if "done_mono" in d and "tmp_mono" not in d]
    ends = [d["done_mono"] for d in dumps.values() if "done_mono" in d]
    lo = min(starts) if starts else None
    hi = max(ends) if ends else None
    before = [s * 1000 for t, s in lat if lo is None or t + s < lo]
    during = [s * 1000 for t, s in lat if lo is not None and hi is not None
              and t <= hi and t + s >= lo]
    elapsed = time.monotonic() - t0
    return {"writes": len(lat), "rate": len(lat) / elapsed if elapsed else None,
            "entries_needed": max(50_000 - commit0, 0), "commit_start": commit0,
            "commit_end": commit1, "before": stats.summary(before),
            "during": stats.summary(during), "dumps": dumps,
            "all_dumped": all("done_mono" in d for d in dumps.values()), "errors": errors,
            "lat": lat, "term": [st0.get("term"), st1.get("term")], "terms": terms,
            "leader": [st0.get("leader"), st1.get("leader")]}


def _tracemalloc_breakdown(n: int) -> dict[str, Any]:
    import tracemalloc

    from raftsched.core.machine import ClusterState

    st = ClusterState()
    tracemalloc.start()
    snap0 = tracemalloc.take_snapshot()
    batch = bulk_batch()
    for i in range(0, n, batch):
        apply = getattr(st, "apply_map", st.apply)  # a baseline tree's apply took maps
        apply({"op": "put_jobs", "at": 1_800_000_000_000, "rid": f"bench-{i}",
               "specs": [far_spec(k) for k in range(i, min(i + batch, n))]})
        st.take_effects()  # the node drains them after every apply
    snap1 = tracemalloc.take_snapshot()
    tracemalloc.stop()
    diffs = snap1.compare_to(snap0, "lineno")
    total = sum(d.size_diff for d in diffs) / n
    top = []
    for d in diffs[:8]:
        frame = d.traceback[0]
        fn = os.path.relpath(frame.filename, os.path.dirname(os.path.dirname(
            os.path.abspath(__file__))))
        line = ""
        try:
            with open(frame.filename, encoding="utf-8") as f:
                line = f.readlines()[frame.lineno - 1].strip()[:70]
        except (OSError, IndexError):
            pass
        top.append((f"{fn}:{frame.lineno} {line}", d.size_diff / n))
    return {"total": total, "top": top}


def _plot(ctx: Ctx, curve: list[dict[str, Any]]) -> str:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ns = [p["n"] for p in curve]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for key, style, label in (("lag_call", "o-", "lag(call)"),
                              ("lag_start", "s--", "lag(start record)")):
        a1.plot(ns, [p[key]["p50"] for p in curve], style, label=f"{label} p50")
        a1.plot(ns, [p[key]["p99"] for p in curve], style, alpha=0.5, label=f"{label} p99")
    a1.set_xlabel("far-future jobs N")
    a1.set_ylabel("ms")
    a1.set_title(f"tick probes ({TICK_JOBS} every-second jobs): lag vs N")
    a1.grid(True, alpha=0.3)
    a1.legend(fontsize=8)
    for nid in ("n1", "n2", "n3"):
        a2.plot(ns, [(p["rss"].get(nid) or 0) / 1024 for p in curve], "o-", label=nid)
    a2.set_xlabel("far-future jobs N")
    a2.set_ylabel("RSS MB")
    a2.set_title("RSS per node vs N")
    a2.grid(True, alpha=0.3)
    a2.legend(fontsize=8)
    fig.tight_layout()
    path = os.path.join(ctx.out, f"{ctx.stamp}-w4-scale.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
