"""W2 failover: SIGKILL the leader repeatedly under ~50 every-second jobs.

Per kill: the time from the kill to the first run *assigned by the new leader* (the
first ``assigned`` transition stamped after the kill: the old leader is dead, so only
a new one can write it) and to the first start of such a run (its ``started_ms``, and
the moment ``bench.noop:stamp`` was entered). Between kills the killed node is
restarted and must rejoin (alive and connected in the leader's view).

Each kill lands ``KILL_BEFORE_INSTANT_MS`` before a whole second, before the old leader
assigns that instant's runs (it assigns ``lookahead``, 250 ms, ahead): the new leader
must be elected, record itself and plan within that time for the instant's runs to
start on time. *first instant's lag* is how late they started: the failover's cost as
a job sees it (a kill at a random phase mostly measures the wait for the next second).

Over the whole window: every fire time must have exactly one outcome; *lost* = fire
times without any record, *doubled* = a (run_id, attempt) executed twice (stamps) or
started twice (records). Re-executions with a higher attempt (``on_node_lost =
retry`` after the node holding a started run died) are counted separately: that is
the documented at-least-once behaviour, not a double. Finally the replicas' terminal
run records are compared (the killed and replayed nodes must agree with the leader).
"""

from __future__ import annotations

import os
import time
from typing import Any

from bench import stats
from bench.cluster import BenchCluster, env_timing, now_ms, wait_until
from bench.common import Ctx, Result, fmt, lock_report, pysyncobj_problems
from bench.replicas import diff_runs, snapshot_runs
from raftsched.node.config.config import Timing

JOBS = 50
#: How long before a whole second each kill lands (see the module docstring).
KILL_BEFORE_INSTANT_MS = 400


def run_w2(ctx: Ctx) -> Result:
    res = Result("W2", f"W2 failover: SIGKILL the leader, {JOBS} every-second jobs")
    kills = 3 if ctx.quick else 10
    c = BenchCluster(ctx.dir("w2"), workers=64, queue=4096, history_limit=1000,
                     timing=bench_timing())
    ids = [f"w2-{i:03d}" for i in range(JOBS)]
    events: list[dict[str, Any]] = []
    try:
        # BENCH_W2_ON_NODE_LOST=fail: the same under at-most-once (default: retry).
        lost_policy = os.environ.get("BENCH_W2_ON_NODE_LOST", "retry")
        c.start_with_jobs([{"id": j, "schedule": {"every": "1s"}, "call": "bench.noop:stamp",
                            "on_node_lost": lost_policy} for j in ids])
        time.sleep(3)
        t_begin = now_ms()
        for k in range(kills):
            leader = c.wait_leader(60)
            survivors = [n for n in c.ids if n != leader]
            _sleep_to_phase(KILL_BEFORE_INSTANT_MS)
            t_kill = c.kill(leader)
            ctx.log(f"W2 kill {k + 1}/{kills}: SIGKILL leader {leader}")

            def new_leader(old: str = leader, surv: list[str] = survivors) -> str | None:
                got = {c.status(n, timeout=1.0)["leader"] for n in surv}
                if len(got) == 1:
                    cur = got.pop()
                    return cur if cur not in (None, old) else None
                return None
            nl = wait_until(new_leader, 60, "a new leader", 0.02)
            t_seen = now_ms()

            def assigned_after(t: int = t_kill, nid: str = nl) -> bool:
                with c.client([nid], timeout=5) as cl:
                    for j in ids[:3]:
                        for r in cl.runs(j, limit=5)["runs"]:
                            if r["started_ms"] and any(tr["state"] == "assigned"
                                                       and tr["at_ms"] > t
                                                       for tr in r["transitions"]):
                                return True
                return False
            wait_until(assigned_after, 60, "a run assigned and started by the new leader", 0.1)
            c.start(leader)
            t_restart = now_ms()
            c.wait_all_alive(60)
            t_rejoin = now_ms()
            events.append({"old": leader, "new": nl, "t_kill": t_kill, "t_seen": t_seen,
                           "t_restart": t_restart, "t_rejoin": t_rejoin})
            time.sleep(2.0)
        t_end = now_ms()
        time.sleep(3.5)  # the last runs of the window finish and are recorded
        leader = c.wait_leader(60)
        runs = c.fetch_runs(ids, 10_000, nid=leader)
        stamps = c.stamps()
        cut = now_ms() - 3000
        replicas = {n: snapshot_runs(c, n, ids) for n in c.ids if n != leader}
        agree = {n: diff_runs(runs, r, cut) for n, r in replicas.items()}
        problems = pysyncobj_problems(c)
        res.locks.append(("W2 cluster, after the kills (a restarted node: since its restart)",
                          lock_report(c)))
    finally:
        c.close()
    # ---------------------------------------------------------------- per kill
    allrecs = [r for rs in runs.values() for r in rs]
    first_call = stats.stamp_executions(stamps, 0, 1 << 62)["first_call"]
    rows, per_kill = [], []
    for i, ev in enumerate(events):
        lo = ev["t_kill"]
        hi = events[i + 1]["t_kill"] if i + 1 < len(events) else t_end + 3000
        t_assign, start_ms, call_ms = None, None, None
        # Any run's first start/call after the kill: a run the old leader had assigned
        # (lookahead) starts without waiting for the new one.
        any_start = min((r["started_ms"] for r in allrecs
                         if r["started_ms"] is not None and lo < r["started_ms"] < hi),
                        default=None)
        any_call = min((t for t in first_call.values() if lo < t < hi), default=None)
        for r in allrecs:
            ats = [tr["at_ms"] for tr in r["transitions"]
                   if tr["state"] == "assigned" and lo < tr["at_ms"] < hi]
            if not ats:
                continue
            a = min(ats)
            if t_assign is None or a < t_assign:
                t_assign = a
            if r["started_ms"] is not None and r["started_ms"] > lo and \
                    (start_ms is None or r["started_ms"] < start_ms):
                start_ms = r["started_ms"]
            call = first_call.get(r["run_id"])
            if call is not None and call > lo and (call_ms is None or call < call_ms):
                call_ms = call
        # The first instant after the kill: how late its runs started (any node's).
        first_fire = min((r["scheduled_ms"] for r in allrecs if r["scheduled_ms"] > lo),
                         default=None)
        lags = sorted(r["started_ms"] - r["scheduled_ms"] for r in allrecs
                      if r["scheduled_ms"] == first_fire and r["started_ms"] is not None)
        d = {"leader_seen_s": (ev["t_seen"] - lo) / 1000,
             "first_fire_s": (first_fire - lo) / 1000 if first_fire else None,
             "first_lag_p50_s": lags[len(lags) // 2] / 1000 if lags else None,
             "first_lag_max_s": lags[-1] / 1000 if lags else None,
             "assign_s": (t_assign - lo) / 1000 if t_assign else None,
             "start_s": (start_ms - lo) / 1000 if start_ms else None,
             "call_s": (call_ms - lo) / 1000 if call_ms else None,
             "any_start_s": (any_start - lo) / 1000 if any_start else None,
             "any_call_s": (any_call - lo) / 1000 if any_call else None,
             "rejoin_s": (ev["t_rejoin"] - ev["t_restart"]) / 1000}
        per_kill.append(d)
        rows.append([str(i + 1), f"{ev['old']} → {ev['new']}", fmt(d["leader_seen_s"], 2),
                     fmt(d["assign_s"], 3), fmt(d["start_s"], 3), fmt(d["call_s"], 3),
                     fmt(d["any_start_s"], 3), fmt(d["any_call_s"], 3),
                     fmt(d["first_fire_s"], 3), fmt(d["first_lag_p50_s"], 3),
                     fmt(d["first_lag_max_s"], 3), fmt(d["rejoin_s"], 2)])
    summ_rows = []
    for key, label in (("leader_seen_s", "new leader visible in status"),
                       ("assign_s", "first run assigned by the new leader"),
                       ("start_s", "first start of a new-leader run (start record)"),
                       ("call_s", "first call of a new-leader run (stamp)"),
                       ("any_start_s", "first start of any run (start record)"),
                       ("any_call_s", "first call of any run (stamp)"),
                       ("first_lag_p50_s", "first instant after the kill: start lag p50"),
                       ("first_lag_max_s", "first instant after the kill: start lag max"),
                       ("rejoin_s", "killed node restarted → alive again")):
        vals = [d[key] for d in per_kill if d[key] is not None]
        summ_rows.append([label, fmt(stats.median(vals), 3),
                          fmt(max(vals) if vals else None, 3), f"{len(vals)}/{len(per_kill)}"])
    # ---------------------------------------------------------------- totals
    acc = stats.account(runs, t_begin, t_end)
    ex = stats.stamp_executions(stamps, t_begin, t_end)
    outcomes = dict(acc["outcomes"])
    lost = outcomes.get("none", 0)
    not_run = {k: v for k, v in outcomes.items() if k != "succeeded"}
    doubled = len(ex["same_attempt_twice"]) + len(acc["dup_records"])
    res.raw = {"events": events, "per_kill": per_kill, "outcomes": outcomes,
               "multi": acc["multi"][:20], "same_attempt_twice": ex["same_attempt_twice"][:20],
               "dup_records": acc["dup_records"][:20], "retried": ex["retried"][:50],
               "replicas": agree, "problems": problems, "window": [t_begin, t_end]}
    res.tables.append(("per kill (seconds after the SIGKILL)",
                       ["#", "leader old → new", "new leader in status", "first assign",
                        "first start", "first call", "any run: start", "any run: call",
                        "first instant", "its lag p50", "its lag max", "rejoin"], rows))
    res.tables.append((f"median and max over {len(per_kill)} kills (s)",
                       ["measure", "median", "max", "measured"], summ_rows))
    res.tables.append(("whole window: every fire time exactly once",
                       ["fire times", "succeeded", "lost (no record)",
                        "other outcomes", "2+ outcomes", "doubled (same attempt)",
                        "re-executed as retry (attempt ≥ 2)"],
                       [[fmt(acc["fires"]), fmt(outcomes.get("succeeded", 0)), fmt(lost),
                         ", ".join(f"{k} ×{v}" for k, v in sorted(not_run.items())
                                   if k != "none") or "none",
                         fmt(len(acc["multi"])), fmt(doubled), fmt(len(ex["retried"]))]]))
    res.tables.append(("replica agreement after the kills (terminal records, leader vs node)",
                       ["node", "records compared", "differ", "on one side only", "examples"],
                       [[n, fmt(d["compared"]), fmt(d["mismatched"]), fmt(d["only_one_side"]),
                         "; ".join(d["examples"][:2]) or "—"] for n, d in agree.items()]))
    _t = Timing(**_timing_ms())
    res.notes += [
        f"Timing config: raftsched defaults (election timeout {_t.election_timeout_min_ms}–"
        f"{_t.election_timeout_max_ms} ms, heartbeat {_t.heartbeat_ms} ms, node_timeout "
        f"{_t.node_timeout_ms} ms, lookahead {_t.lookahead_ms} ms). Jobs: `every: 1s`, "
        "default policies "
        "(misfire `once` with 60 s grace), `on_node_lost = "
        f"{os.environ.get('BENCH_W2_ON_NODE_LOST', 'retry')}`.",
        "*first assign* is the `at` the new leader stamped into its first plan; it includes "
        "the election, the new leader's `leader` record commit and its first plan.",
        "*re-executed as retry*: runs the killed node had started whose finish never "
        "committed; the leader released them after `node_timeout` (or at the node's "
        "restart) and ran attempt 2 elsewhere (at-least-once by design).",
    ]
    if acc["noncontig"]:
        res.notes.append(f"{len(acc['noncontig'])} folded miss ranges span fire times that "
                         f"ran (counted by their own records), e.g. `{acc['noncontig'][0]}`")
    if problems:
        res.notes.append(f"node log warnings+: `{problems}`")
    res.plots.append(_plot(ctx, per_kill))
    return res


def _sleep_to_phase(before_ms: int) -> None:
    """Sleep until ``before_ms`` before a whole second (at least 50 ms from now)."""
    now = time.time()
    target = int(now) + 1 - before_ms / 1000
    while target < now + 0.05:
        target += 1.0
    time.sleep(target - now)


def bench_timing() -> dict[str, str]:
    """``[timing]`` overrides for W2 and W3F from ``BENCH_TIMING``, in the one format
    every bench cluster reads it in (``bench.cluster.env_timing``: ``key=value,...``; a
    JSON reading here refused what the other workloads took); raftsched's defaults when
    unset."""
    return env_timing()


def _timing_ms() -> dict[str, int]:
    from raftsched.core.durations import parse_duration
    return {f"{k}_ms": parse_duration(v, k) for k, v in bench_timing().items()}


def _plot(ctx: Ctx, per_kill: list[dict[str, Any]]) -> str:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.2))
    xs = list(range(1, len(per_kill) + 1))
    for key, label, off in (("leader_seen_s", "new leader in status", -0.27),
                            ("assign_s", "first assign by new leader", -0.09),
                            ("start_s", "first start (record)", 0.09),
                            ("call_s", "first call (stamp)", 0.27)):
        ax.bar([x + off for x in xs], [d[key] or 0 for d in per_kill], width=0.18, label=label)
    ax.set_xlabel("kill #")
    ax.set_ylabel("seconds after SIGKILL of the leader")
    ax.set_title("W2: failover times per leader kill")
    ax.set_xticks(xs)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = os.path.join(ctx.out, f"{ctx.stamp}-w2-failover.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
