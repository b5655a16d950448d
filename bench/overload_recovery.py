"""After an overload ends: does a storm's cluster return to its fire times, and how soon.

    python -m bench.overload_recovery --jobs 5000 --before 15 --hog 15 --after 40 --hogs 1

A probe, not a workload of the report. W1's cluster (3 nodes, J every-second
``bench.noop:stamp`` jobs, 1024 workers per node), then ``--hogs`` busy-looping
processes take CPU from the nodes for ``--hog`` seconds (``--idle``: at SCHED_IDLE, so
that they run only on a core no other task wants), then none for ``--after``.
Per second of fire times: how many runs were called and the lag(call) of each run's
first call, p50 / p99 (the stamp's wall-clock ms minus the fire time, as W1), and per phase the
fire times' outcomes read from the run records. Then *back after*: the seconds from
the hogs' end to the first fire-time second that begins ``--steady`` seconds in a row
on time (every fire time called, lag(call) p99 at most ``--ok-ms``), and how many
seconds after those were not on time (at this machine's ceiling a snapshot writer
alone can make a second late: ``2026-12-07-overload-recovery.md``); and the fire times
of the whole window with no record, two different outcomes, or a doubled execution
(each should be 0: an overload may cost fire times, recorded, never lose or double
one).

A cluster that stays behind once pushed over its ceiling (a metastable overload) would
show as no *back after* at all. The hogs are ``python -c`` busy loops, so that the
probe needs nothing the project does not install.
"""

from __future__ import annotations

import argparse
import collections
import subprocess
import sys
import tempfile
import time

from bench import stats
from bench.cluster import BenchCluster, close_all, now_ms, track
from bench.w1 import _await_reached

_HOG = ("import os, time\n{idle}end = time.monotonic() + {s}\n"
        "while time.monotonic() < end: pass\n")
_IDLE = "os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))\n"


def _q(values: list[int], p: float) -> int:
    values = sorted(values)
    return values[min(len(values) - 1, int(p * len(values)))]


def _sleep_until(ms: int) -> None:
    time.sleep(max(0.0, (ms - now_ms()) / 1000))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=5000)
    ap.add_argument("--before", type=int, default=15, help="seconds before the hogs")
    ap.add_argument("--hog", type=int, default=15, help="seconds the hogs run")
    ap.add_argument("--after", type=int, default=40, help="seconds after the hogs")
    ap.add_argument("--hogs", type=int, default=1, help="busy-looping processes")
    ap.add_argument("--idle", action="store_true",
                    help="the hogs at SCHED_IDLE (they yield to every other task)")
    ap.add_argument("--steady", type=int, default=5,
                    help="seconds in a row on time that count as back")
    ap.add_argument("--ok-ms", type=int, default=500,
                    help="lag(call) p99 of a second counted as caught up")
    args = ap.parse_args()
    c = BenchCluster(tempfile.mkdtemp(prefix="overload-"), workers=1024)
    ids = [f"j{i}" for i in range(args.jobs)]
    try:
        leader = c.start_stamping(ids)
        term0 = c.status(leader)["term"]
        w0 = -(-(now_ms() + 5000) // 1000) * 1000  # 5 s warm-up, a whole second
        hog0 = w0 + args.before * 1000
        _sleep_until(hog0)
        hog = _HOG.format(s=args.hog, idle=_IDLE if args.idle else "")
        # Tracked: close_all (Ctrl-C, an exception) kills them with the nodes.
        hogs = [track(subprocess.Popen([sys.executable, "-c", hog])) for _ in range(args.hogs)]
        for h in hogs:
            h.wait(timeout=args.hog + 60)
        hog1 = now_ms()  # when they ended, not when they were meant to
        w1 = -(-hog1 // 1000) * 1000 + args.after * 1000
        _sleep_until(w1)
        reach_s = _await_reached(c, leader, w1)
        _sleep_until(max(w1, now_ms()) + 2500)
        term1 = c.status(leader)["term"]
        limit = (w1 - w0) // 1000 + 60
        runs = c.fetch_runs(ids, limit, nid=leader)
        stamps = c.stamps()
    finally:
        c.close()
        close_all()  # a hog still running (the probe failed meanwhile)
    acc = stats.account(runs, w0, w1)
    ex = stats.stamp_executions(stamps, w0, w1)
    lags: dict[int, list[int]] = collections.defaultdict(list)
    for run_id, call_ms in ex["first_call"].items():
        fire = int(run_id.rpartition("@")[2])
        lags[fire].append(call_ms - fire)
    phase_out: dict[str, collections.Counter[str]] = {
        p: collections.Counter() for p in ("before", "hogs", "after")}
    for (_job, fire), recs in acc["by_fire"].items():
        phase = "before" if fire < hog0 else "hogs" if fire < hog1 else "after"
        phase_out[phase][stats.outcome_of(recs) if recs else "none"] += 1
    seconds = list(range(w0, w1, 1000))
    ok = {s: len(lags[s]) == args.jobs and _q(lags[s], .99) <= args.ok_ms
          for s in seconds if lags[s]}
    back = None
    late_after = 0
    for i, s in enumerate(seconds):
        run = seconds[i:i + args.steady]
        if s >= hog1 and len(run) == args.steady and all(ok.get(t, False) for t in run):
            back = max(0, s - hog1) / 1000
            late_after = sum(not ok.get(t, False) for t in seconds[i:])
            break
    how = " at SCHED_IDLE" if args.idle else ""
    print(f"J={args.jobs:,}, leader {leader}, term {term0} → {term1}; {args.hogs} hog(s){how} "
          f"from {(hog0 - w0) / 1000:.0f} s to {(hog1 - w0) / 1000:.1f} s of a "
          f"{(w1 - w0) / 1000:.0f} s window; leader reached every job "
          f"{'?' if reach_s is None else f'{reach_s:.1f} s'} after it")
    print(f"**back after**: {'never in the window' if back is None else f'{back:.0f} s'} "
          f"({args.steady} s in a row with all {args.jobs:,} called, lag(call) p99 ≤ "
          f"{args.ok_ms} ms); later seconds not on time: {late_after}")
    print(f"fire times with no record {acc['outcomes'].get('none', 0)}, with two "
          f"outcomes {len(acc['multi'])}, doubled records {len(acc['dup_records'])}, "
          f"an attempt executed twice {len(ex['same_attempt_twice'])}")
    print("\n| phase | fire times | outcomes |\n|---|---|---|")
    for p, cnt in phase_out.items():
        print(f"| {p} | {sum(cnt.values()):,} | "
              f"{', '.join(f'{k} {v:,}' for k, v in cnt.most_common())} |")
    print("\n| second | phase | called | lag(call) p50 | p99 |\n|---|---|---|---|---|")
    for s in seconds:
        phase = "before" if s < hog0 else "hogs" if s < hog1 else "after"
        got = lags[s]
        p50, p99 = (_q(got, .5), _q(got, .99)) if got else ("—", "—")
        print(f"| {(s - w0) // 1000} | {phase} | {len(got):,} | {p50} | {p99} |")


if __name__ == "__main__":
    main()
