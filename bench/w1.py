"""W1 fire storm (with baselines): J every-second no-op jobs on a 3-node cluster.

Also runs, in the same invocation, baseline (a) raw pysyncobj commit rate
(:mod:`bench.raw_raft`) and baseline (b) APScheduler 3 with the same J and window
(:mod:`bench.aps`), alternating raftsched and APScheduler per J so that machine
noise hits both alike.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

from bench import stats
from bench.cluster import ROOT, BenchCluster, now_ms, track
from bench.common import Ctx, Result, bulk_batch, fmt, lock_report, pysyncobj_problems
from raftsched.node.config.config import Timing

SPEC_CALL = "bench.noop:stamp"


#: Worker slots per node (raftsched.node.config.config.MAX_WORKERS).
WORKERS = 1024


def sizes(ctx: Ctx) -> tuple[list[int], int, int]:
    """(J values, window seconds, warm-up seconds). The quick run includes the J = 5,000
    storm (the regression guard: run it before landing a change to raftsched/core or
    raftsched/node); the full run offers more than this machine can run (J = 10,000
    and 20,000), where overload must degrade by recorded outcomes, not elections."""
    return ([100, 1000, 5000], 10, 3) if ctx.quick else ([100, 1000, 5000, 10_000, 20_000],
                                                         30, 5)


#: The benchmark of record's W1 figures (runs/s, lag, CPU, term changes per J), which
#: every W1 run prints beside its own: ``python -m bench.w1 --record FILE.json`` makes
#: a new one from a run's JSON.
RECORD = os.path.join(ROOT, "bench", "results", "record-w1.json")


def record_rows(own: dict[int, dict[str, Any]]) -> tuple[str, list[list[Any]]] | None:
    """This run's storms beside the record's, per J both have."""
    try:
        with open(RECORD, encoding="utf-8") as f:
            rec = json.load(f)
    except (OSError, ValueError):
        return None
    rows = []
    for j, r in sorted(own.items()):
        old = rec.get("storms", {}).get(str(j))
        if old is None:
            continue
        rows.append([fmt(j), fmt(r["runs_per_s"]), fmt(old["runs_per_s"]),
                     fmt(r["lag_call"]["p99"]), fmt(old["lag_call_p99"]),
                     fmt(r["cpu_ms_per_run"], 3), fmt(old["cpu_ms_per_run"], 3),
                     fmt(r["term_end"] - r["term_start"]), fmt(old["term_changes"]),
                     fmt(r["fires"] - r["succeeded"]), fmt(old["not_succeeded"])])
    return (f"this run vs the benchmark of record ({rec.get('source', '?')}, window "
            f"{rec.get('seconds', '?')} s)", rows)


# ------------------------------------------------------------------ baseline (a)

def run_raw(ctx: Ctx) -> Result:
    res = Result("BASE-RAFT", "Baseline (a): raw pysyncobj commit rate")
    from bench.raw_raft import run
    ctx.log("raw pysyncobj: 3 processes, nobatch, 1000 in flight, 100-byte payload, 10 s")
    out = run(seconds=10.0, inflight=1000, payload=100)
    res.raw = out
    if "error" in out:
        res.error = str(out["error"])
        return res
    ctx.shared["raw_commits_per_s"] = out["commits_per_s"]
    res.tables.append(("raw pysyncobj 0.3.17, 3 nodes on loopback",
                       ["commits/s", "committed", "errors", "in flight", "payload B",
                        "commit latency p50 ms", "p99 ms"],
                       [[fmt(out["commits_per_s"]), fmt(out["ok"]), fmt(out["errors"]),
                         fmt(out["inflight"]), fmt(out["payload_bytes"]),
                         fmt(out["latency_p50_ms"]), fmt(out["latency_p99_ms"])]]))
    res.notes.append("appendEntriesUseBatch=False, async `@replicated` no-op with a callback, "
                     "in-memory journal, no password; run on the node that won the election. "
                     "Latency here is queueing behind 1000 in-flight commands, not an idle "
                     "commit.")
    return res


# ------------------------------------------------------------------ APScheduler

def run_aps(ctx: Ctx, jobs: int, seconds: int, warmup: int, extra: tuple[str, ...] = (),
            slack_s: int = 90) -> dict[str, Any]:
    """``python -m bench.aps`` (with ``extra`` arguments) in a process of its own: its
    JSON line, or ``{"error": ...}``."""
    cmd = [sys.executable, "-m", "bench.aps", "--jobs", str(jobs), "--seconds", str(seconds),
           "--warmup", str(warmup), "--threads", "64", *extra]
    proc = track(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, cwd=ROOT))
    try:
        out, err = proc.communicate(timeout=seconds + warmup + slack_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return {"error": "APScheduler run timed out"}
    if proc.returncode != 0:
        return {"error": f"exit {proc.returncode}: {err.strip()[-300:]}"}
    return json.loads(out.strip().splitlines()[-1])


# ------------------------------------------------------------------ raftsched

def run_raftsched(ctx: Ctx, jobs: int, seconds: int, warmup: int, *,
                  profile_s: float = 0.0, name: str | None = None,
                  durability: str | None = None) -> dict[str, Any]:
    """One fire storm; with ``profile_s`` a py-spy recording of the leader runs inside
    the window (see :mod:`bench.profile`); ``durability``: ``[cluster] durability``
    (None: the tree's default)."""
    tag = name or f"w1-{jobs}"
    # Every W1 job fires at the same instant: a node needs J/3 slots to start its share
    # at once, so each node gets the most a node may have (MAX_WORKERS).
    c = BenchCluster(ctx.dir(tag), workers=WORKERS, queue=4096, history_limit=1000,
                     durability=durability)
    try:
        c.start_all()
        leader = c.wait_leader(60)
        c.wait_all_alive(60)
        term0 = c.status(leader)["term"]
        ids = [f"w1-{i:05d}" for i in range(jobs)]
        t_put = time.monotonic()
        batch = bulk_batch()
        with c.client(timeout=60) as cl:
            for i in range(0, jobs, batch):
                specs = [{"id": j, "schedule": {"every": "1s"}, "call": SPEC_CALL}
                         for j in ids[i:i + batch]]
                reply = cl.call("put_jobs", specs=specs)
                bad = [r for r in reply["results"] if not r.get("ok")]
                if bad:
                    raise RuntimeError(f"put_jobs refused {len(bad)} specs: {bad[:2]}")
        put_s = time.monotonic() - t_put
        start_ms = now_ms()
        w0 = -(-(start_ms + warmup * 1000) // 1000) * 1000
        w1 = w0 + seconds * 1000
        ctx.log(f"{tag}: leader {leader}, {jobs} jobs put in {put_s:.2f}s; window "
                f"{seconds}s after {(w0 - start_ms) / 1000:.1f}s warm-up")
        _sleep_until(w0)
        cpu0 = {n: c.cpu_s(n) for n in c.ids}
        m0 = _leader_metrics(c, leader)
        prof: dict[str, Any] = {}
        if profile_s:
            from bench.profile import record_pyspy
            prof = record_pyspy(ctx, c.pid(leader), min(profile_s, seconds - 1), tag)
        _sleep_until(w1)
        cpu1 = {n: c.cpu_s(n) for n in c.ids}
        if prof:
            from bench.profile import finish_pyspy
            prof = finish_pyspy(prof)
        m1 = _leader_metrics(c, leader)
        # Drain: the leader has reached every job past the window (an overloaded one
        # reaches its jobs late, and their fire times have no record until it does),
        # then the window's last runs finish and are recorded.
        reach_s = _await_reached(c, leader, w1)
        _sleep_until(max(w1, now_ms()) + 2500)
        # The storm's own figures, before the fetch: a bulk read of every job's runs on
        # the leader while the storm goes on can itself cause an election (not yet
        # throttled, bench/results/2026-12-03-overload.md).
        term_drained = c.status(leader)["term"]
        fenced_drained = {n: _self_fenced(c, n) for n in c.ids}
        limit = int((now_ms() - start_ms) / 1000) + 50
        t_fetch = time.monotonic()
        runs = c.fetch_runs(ids, limit, nid=leader)
        fetch_s = time.monotonic() - t_fetch
        st_end = c.status(leader)
        sync_stats = {n: _durability(c, n) for n in c.ids}
        fenced = {n: _self_fenced(c, n) for n in c.ids}
        stamps = c.stamps()
        problems = pysyncobj_problems(c)
        locks = lock_report(c)
    finally:
        c.close()
    acc = stats.account(runs, w0, w1)
    ex = stats.stamp_executions(stamps, w0, w1)
    lag_start, lag_call = [], []
    parts: dict[str, list[float]] = {"lead": [], "slot": [], "commit": [], "finish": [],
                                     "commit_on_leader": [], "commit_on_follower": []}
    for (_job, t), recs in acc["by_fire"].items():
        for r in recs:
            if r["state"] == "succeeded" and r["attempt"] == 1 and r["started_ms"] is not None:
                lag_start.append(r["started_ms"] - t)
                call = ex["first_call"].get(r["run_id"])
                if call is not None:
                    lag_call.append(call - t)
                    parts["commit"].append(call - r["started_ms"])
                    role = "leader" if r["node"] == leader else "follower"
                    parts[f"commit_on_{role}"].append(call - r["started_ms"])
                    if r["finished_ms"] is not None:
                        parts["finish"].append(r["finished_ms"] - call)
                if r["assigned_ms"] is not None:
                    parts["lead"].append(t - r["assigned_ms"])
                parts["slot"].append(r["started_ms"] - t)
    succeeded = acc["outcomes"].get("succeeded", 0)
    cpu = {n: (cpu1[n] - cpu0[n]) if cpu0[n] is not None and cpu1[n] is not None else None
           for n in cpu0}
    total_cpu = sum(v for v in cpu.values() if v is not None)
    commit_n = m1.get("commit_n", 0) - m0.get("commit_n", 0)
    commit_sum = m1.get("commit_sum", 0) - m0.get("commit_sum", 0)
    applied = m1.get("applied", 0) - m0.get("applied", 0)
    apply_s = m1.get("apply_s", 0) - m0.get("apply_s", 0)
    return {
        "jobs": jobs, "seconds": seconds, "leader": leader, "put_s": put_s,
        "fires": acc["fires"], "succeeded": succeeded, "runs_per_s": succeeded / seconds,
        "outcomes": dict(acc["outcomes"]), "multi": acc["multi"][:20],
        "noncontig": acc["noncontig"][:20], "noncontig_n": len(acc["noncontig"]),
        "dup_records": acc["dup_records"][:20], "dup_exec": ex["same_attempt_twice"][:20],
        "retried": ex["retried"][:20], "executions": ex["executions"],
        "lag_start": stats.summary(lag_start), "lag_call": stats.summary(lag_call),
        "lag_parts": {k: stats.summary(v) for k, v in parts.items()},
        "lag_call_sorted": stats.downsample(sorted(lag_call)),
        "lag_start_sorted": stats.downsample(sorted(lag_start)),
        "cpu_s": cpu, "cpu_ms_per_run": (total_cpu * 1000 / succeeded) if succeeded else None,
        "leader_commits": commit_n,
        "leader_commit_mean_ms": (commit_sum / commit_n * 1000) if commit_n else None,
        "applied_per_s": applied / seconds, "apply_ms_per_cmd": (apply_s / applied * 1000)
        if applied else None,
        "term_start": term0, "term_end": st_end["term"], "fetch_s": fetch_s,
        "reach_s": reach_s, "self_fenced": fenced, "term_drained": term_drained,
        "self_fenced_drained": fenced_drained,
        "problems": problems, "window": [w0, w1], "profile": prof, "lock": locks,
        "durability": sync_stats,
    }


def _durability(c: BenchCluster, nid: str) -> dict[str, Any] | None:
    """Node ``nid``'s group-commit figures (status ``durability``; None: an older tree)."""
    try:
        return c.status(nid).get("durability")  # type: ignore[no-any-return]
    except Exception:  # noqa: BLE001 - a node not answering
        return None


def _self_fenced(c: BenchCluster, nid: str) -> int | None:
    """Times node ``nid`` stopped its runs for want of a quorum since it started."""
    try:
        return int(c.status(nid)["worker"]["self_fenced"])
    except Exception:  # noqa: BLE001 - an older tree's status, or a node not answering
        return None


def _await_reached(c: BenchCluster, leader: str, w1: int, limit_s: float = 120.0) -> float | None:
    """Seconds after ``w1`` until the leader's oldest unreached fire time is past it
    (status ``next_due_ms``; None: the tree's status has no such field, or it never
    did within ``limit_s``)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            st = c.status(leader)
        except Exception:  # noqa: BLE001 - refused or timed out under load: ask again
            st = {}
        if "next_due_ms" not in st and st:
            return None
        nxt = st.get("next_due_ms")
        if st and (nxt is None or nxt > w1):
            return max(now_ms() - w1, 0) / 1000
        time.sleep(0.2)
    return None


def _sleep_until(t_ms: int) -> None:
    while True:
        left = (t_ms - now_ms()) / 1000
        if left <= 0:
            return
        time.sleep(min(left, 0.5))


def _leader_metrics(c: BenchCluster, leader: str) -> dict[str, float]:
    try:
        m = c.metrics(leader)
    except OSError:
        return {}
    return {"commit_n": m.get("raftsched_commit_latency_seconds_count", 0.0),
            "commit_sum": m.get("raftsched_commit_latency_seconds_sum", 0.0),
            "applied": m.get("raftsched_applied_commands_total",
                             m.get("raftsched_applied_commands", 0.0)),
            "apply_s": m.get("raftsched_apply_seconds_total",
                             m.get("raftsched_apply_seconds", 0.0))}


# ------------------------------------------------------------------ W1

def run_w1(ctx: Ctx) -> Result:
    res = Result("W1", "W1 fire storm: J every-second no-op jobs, 3 nodes")
    js, seconds, warmup = sizes(ctx)
    raw = ctx.shared.get("raw_commits_per_s")
    rows, ratio_rows, miss_rows, part_rows = [], [], [], []
    curves: dict[int, dict[str, list[float]]] = {}
    for j in js:
        ctx.log(f"W1 raftsched J={j}")
        try:
            r = run_raftsched(ctx, j, seconds, warmup)
        except Exception as exc:  # noqa: BLE001 - report and go on with the next J
            res.notes.append(f"**J={j}: raftsched run failed: {exc!r}**")
            ctx.log(f"W1 J={j} failed: {exc!r}")
            continue
        ctx.log(f"W1 APScheduler J={j}")
        a = run_aps(ctx, j, seconds, warmup)
        res.locks.append((f"J={j}", r["lock"]))
        res.raw[f"raftsched_{j}"] = {k: v for k, v in r.items() if not k.endswith("_sorted")}
        res.raw[f"aps_{j}"] = {k: v for k, v in a.items() if k != "lags_ms"}
        a_lag = stats.summary(a.get("lags_ms", []))
        a_rps = a.get("runs_per_s")
        curves[j] = {"call": r["lag_call_sorted"], "start": r["lag_start_sorted"],
                     "aps": stats.downsample(a.get("lags_ms", []))}
        dups = len(r["dup_records"]) + len(r["dup_exec"])
        misses = r["fires"] - r["succeeded"]
        rows.append([fmt(j), fmt(r["fires"]), fmt(r["runs_per_s"]),
                     fmt(r["lag_start"]["p50"]), fmt(r["lag_start"]["p99"]),
                     fmt(r["lag_start"]["max"]), fmt(r["lag_call"]["p50"]),
                     fmt(r["lag_call"]["p99"]), fmt(r["lag_call"]["max"]), fmt(dups),
                     fmt(misses), fmt(r["cpu_ms_per_run"], 2),
                     f"{r['term_start']}→{r['term_end']}"])
        ratio_rows.append([
            fmt(j), fmt(a_rps), fmt(a_lag["p50"]), fmt(a_lag["p99"]), fmt(a_lag["max"]),
            fmt(stats.ratio(r["runs_per_s"], a_rps), 2),
            fmt(stats.ratio(r["lag_call"]["p99"], a_lag["p99"]), 2),
            fmt(stats.ratio(r["lag_start"]["p99"], a_lag["p99"]), 2),
            fmt(stats.ratio(r["runs_per_s"], raw), 3),
            fmt((a["cpu_s"] * 1000 / a["total_runs"]) if a.get("total_runs") else None, 2),
        ])
        if a.get("error"):
            res.notes.append(f"J={j}: APScheduler run failed: {a['error']}")
        outcomes = {k: v for k, v in r["outcomes"].items() if k != "succeeded"}
        miss_rows.append([fmt(j), ", ".join(f"{k} ×{v}" for k, v in sorted(outcomes.items()))
                          or "none", fmt(r.get("reach_s"), 1),
                          fmt(len(r["dup_records"])), fmt(len(r["dup_exec"])),
                          fmt(len(r["retried"])), fmt(len(r["multi"])),
                          fmt(r["leader_commits"]), fmt(r["leader_commit_mean_ms"]),
                          fmt(r["applied_per_s"]), fmt(r["apply_ms_per_cmd"], 2)])
        lp = r["lag_parts"]
        part_rows.append([fmt(j)] + [f"{fmt(lp[k]['p50'])} / {fmt(lp[k]['p99'])}"
                                     for k in ("lead", "slot", "commit", "commit_on_leader",
                                               "commit_on_follower", "finish")])
        if r["noncontig_n"]:
            ex = r["noncontig"][0]
            res.notes.append(
                f"J={j}: **{r['noncontig_n']} folded miss ranges span fire times that ran** "
                f"(e.g. `{ex[0]}` skipped range {ex[1]}..{ex[2]} with count {ex[3]}, fewer "
                "than the fire times it spans): `claims.record_miss` folds a new miss into "
                "the previous history record even when a run of the same job sat between "
                "them. Counted by their own records here.")
        if r["problems"]:
            res.notes.append(f"J={j} node log warnings+: `{json.dumps(r['problems'])}`")
    if ctx.shared.get("baseline_tree"):
        from bench.w1tree import storm
        tree = ctx.shared["baseline_tree"]
        base_rows = []
        for j in js:
            ctx.log(f"W1 baseline tree {tree} J={j}")
            b = storm(tree, j, seconds, warmup)
            res.raw[f"baseline_{j}"] = b
            mine = res.raw.get(f"raftsched_{j}")
            if "error" in b:
                base_rows.append([fmt(j), f"failed: {b['error'][:200]}"] + [""] * 8)
                continue
            base_rows.append([
                fmt(j), fmt(mine["runs_per_s"]) if mine else "—", fmt(b["runs_per_s"]),
                fmt(stats.ratio(mine["runs_per_s"], b["runs_per_s"]), 2) if mine else "—",
                fmt(mine["lag_call"]["p99"]) if mine else "—", fmt(b["lag_call"]["p99"]),
                fmt(mine["cpu_ms_per_run"], 3) if mine else "—", fmt(b["cpu_ms_per_run"], 3),
                f"{mine['term_start']}→{mine['term_end']}" if mine else "—",
                f"{b['term_start']}→{b['term_end']}"])
        res.tables.append((f"this tree vs the baseline tree `{tree}`, same J and window",
                           ["J", "runs/s", "baseline runs/s", "ratio", "lag(call) p99",
                            "baseline p99", "CPU ms/run", "baseline CPU ms/run", "term",
                            "baseline term"], base_rows))
    own = {j: res.raw[f"raftsched_{j}"] for j in js if f"raftsched_{j}" in res.raw}
    versus = record_rows(own)
    if versus is not None and versus[1]:
        res.tables.append((versus[0], ["J", "runs/s", "record", "lag(call) p99", "record",
                                       "CPU ms/run", "record", "term changes", "record",
                                       "not succeeded", "record"], versus[1]))
    res.tables.append((
        f"raftsched, {seconds} s window after warm-up (lags in ms)",
        ["J", "fire times", "runs/s", "lag(start rec) p50", "p99", "max", "lag(call) p50",
         "p99", "max", "dups", "not succeeded", "CPU ms/run (3 nodes)", "term"], rows))
    res.tables.append((
        "vs baselines measured in this invocation",
        ["J", "APS runs/s", "APS lag p50", "APS lag p99", "APS lag max",
         "runs/s ÷ APS", "lag(call) p99 ÷ APS p99", "lag(start rec) p99 ÷ APS p99",
         "runs/s ÷ raw commits/s", "APS CPU ms/run"], ratio_rows))
    res.tables.append((
        "outcomes other than succeeded, duplicates, leader commits",
        ["J", "outcomes (fire times in window)", "window reached (s after its end)",
         "dup records", "dup executions",
         "re-executed (retry)", "2+ outcomes", "leader commits in window",
         "leader-loop commit mean ms", "commands applied/s (leader)", "apply ms/cmd"],
        miss_rows))
    res.tables.append((
        "where the time goes, per run (p50 / p99 ms)",
        ["J", "assigned ahead of fire time", "fire time → start submitted",
         "start submitted → callable entered", "… on the leader node",
         "… on follower nodes", "callable entered → finish submitted"],
        part_rows))
    res.notes += [
        f"Lag parts: *assigned ahead* = scheduled − assigned (the plan's lookahead, "
        f"{Timing().lookahead_ms} ms by default); *fire time → start submitted* = 0 when the "
        "worker committed the start ahead (it does so up to 4/5 of the lookahead early and "
        "stamps it with the fire time), else the wait for a free slot (a slot is busy from "
        "the start commit until the run ends); *start submitted → callable entered* = the "
        "wait for the instant's timer and the hop to a callable thread; *callable entered → "
        "finish submitted* = the run, the hold of finishes just after a big instant (while "
        "its calls still queue for a thread, and at least 30 ms) and the wait for the "
        "previous finish batch to commit.",
        "*lag(start rec)* = `started_ms − scheduled_ms` from the run records: `started_ms` is "
        "the `at` the worker stamps into its `start` command when it submits it, i.e. "
        "**before** that command commits and before the callable runs.",
        "*lag(call)* = the wall-clock time `bench.noop:stamp` was entered on the worker "
        "thread − `scheduled_ms`: the same quantity as APScheduler's lag (actual call − "
        "scheduled_run_time), so the ratio uses this one.",
        "*runs/s* counts succeeded runs whose fire time lies in the window ÷ window. "
        "*dups*: two started records with one (run_id, attempt) or two stamped executions "
        "of one (run_id, attempt). *not succeeded*: fire times in the window without a "
        "succeeded record (details in the third table).",
        "*CPU ms/run*: utime+stime of all three nodes' process trees over the window ÷ "
        "runs: the node processes, their reaped children (snapshot writers: cutime + "
        "cstime) and their live descendants (guards, a writer at work); before "
        "2026-12-07's record 13 the node processes alone, without their snapshot writers. "
        "raftsched runs 3 processes on 2 cores; APScheduler runs 1 process.",
        f"raw commits/s = {fmt(raw)} (baseline a); a ratio above 1 is possible because a "
        "plan/start/finish command carries many runs.",
    ]
    if curves:
        res.plots.append(_plot_cdf(ctx, curves))
    return res


def _plot_cdf(ctx: Ctx, curves: dict[int, dict[str, list[float]]]) -> str:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    colors = ["tab:blue", "tab:orange", "tab:green", "tab:red"]
    for (j, cv), color in zip(sorted(curves.items()), colors, strict=False):
        for key, style, label in (("call", "-", "raftsched call"),
                                  ("start", ":", "raftsched start record"),
                                  ("aps", "--", "APScheduler 3")):
            xs = [max(x, 0.1) for x in cv[key]]
            if not xs:
                continue
            ys = [(i + 1) / len(xs) for i in range(len(xs))]
            ax.plot(xs, ys, style, color=color, label=f"{label}, J={j}")
    ax.set_xscale("log")
    ax.set_xlabel("scheduling lag, ms (log; values < 0.1 ms drawn at 0.1)")
    ax.set_ylabel("fraction of runs")
    ax.set_title("W1: lag CDF per J (fire times in the window)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    path = os.path.join(ctx.out, f"{ctx.stamp}-w1-lag-cdf.png")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_record(run_json: str, out: str = RECORD) -> None:
    """Make ``out`` the record from a ``python -m bench`` JSON file's W1 storms."""
    with open(run_json, encoding="utf-8") as f:
        data = json.load(f)
    w1 = next(r for r in data["results"] if r["name"] == "W1")
    storms = {}
    for key, r in w1["raw"].items():
        if not key.startswith("raftsched_"):
            continue
        storms[key.split("_", 1)[1]] = {
            "runs_per_s": r["runs_per_s"], "lag_call_p99": r["lag_call"]["p99"],
            "cpu_ms_per_run": r["cpu_ms_per_run"],
            "term_changes": r["term_end"] - r["term_start"],
            "not_succeeded": r["fires"] - r["succeeded"]}
    seconds = next(iter(w1["raw"].values())).get("seconds")
    with open(out, "w", encoding="utf-8") as f:
        json.dump({"source": os.path.basename(run_json), "command": data["command"],
                   "seconds": seconds, "storms": storms}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser(prog="python -m bench.w1")
    ap.add_argument("--record", metavar="RUN_JSON", required=True,
                    help="make bench/results/record-w1.json from this run's JSON")
    write_record(ap.parse_args().record)
