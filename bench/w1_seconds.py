"""W1 second by second: what each second's fire times became, how late its last call
and its last finish were, and which nodes were writing a snapshot meanwhile.

    python -m bench.w1_seconds --jobs 5000 --window 60

A probe, not a workload of the report: it finds *which* seconds of a storm go wrong
(``bench/results/2026-12-05-finish-window.md`` is what it found). A node's snapshot
writer is a forked child of the node; children present before the window (the guard)
are left out.
"""

from __future__ import annotations

import argparse
import collections
import glob
import tempfile
import threading
import time

from bench.cluster import BenchCluster


def _children(pid: int) -> set[str]:
    found: set[str] = set()
    for path in glob.glob(f"/proc/{pid}/task/*/children"):
        try:
            with open(path, encoding="ascii") as f:
                found |= set(f.read().split())
        except OSError:
            pass
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=5000)
    ap.add_argument("--window", type=int, default=60, help="seconds")
    ap.add_argument("--workers", type=int, default=1024)
    args = ap.parse_args()
    c = BenchCluster(tempfile.mkdtemp(prefix="w1sec-"), workers=args.workers)
    writing: dict[int, set[str]] = collections.defaultdict(set)
    done = threading.Event()

    def watch(w0: int) -> None:
        base = {n: _children(c.pid(n)) for n in c.ids}
        while not done.wait(0.05):
            for n in c.ids:
                if _children(c.pid(n)) - base[n]:
                    writing[int((time.time() * 1000 - w0) // 1000)].add(n)

    ids = [f"j{i}" for i in range(args.jobs)]
    try:
        leader = c.start_stamping(ids)
        time.sleep(5)
        w0 = (int(time.time()) + 1) * 1000
        watcher = threading.Thread(target=watch, args=(w0,), daemon=True)
        watcher.start()
        time.sleep(args.window + 3)
        done.set()
        runs = c.fetch_runs(ids, 200, nid=leader)
        stamps = c.stamps()
    finally:
        c.close()
    w1 = w0 + args.window * 1000
    called = {run_id: call_ms for run_id, attempt, _f, call_ms, _n in stamps if attempt == 1}
    outcomes: dict[int, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    last_call: dict[int, int] = collections.defaultdict(int)
    last_finish: dict[int, int] = collections.defaultdict(int)
    for recs in runs.values():
        for r in recs:
            if not w0 <= r["scheduled_ms"] < w1:
                continue
            sec = (r["scheduled_ms"] - w0) // 1000
            outcomes[sec][f"{r['state']} ({r.get('reason') or ''})"] += 1
            if r["run_id"] in called:
                last_call[sec] = max(last_call[sec], called[r["run_id"]] - r["scheduled_ms"])
            if r.get("finished_ms"):
                last_finish[sec] = max(last_finish[sec], r["finished_ms"] - r["scheduled_ms"])
    print(f"leader {leader}; {args.jobs} every-second jobs, {args.workers} workers per node")
    print("| second | not succeeded | last call ms | last finish ms | snapshot writers |")
    print("|---|---|---|---|---|")
    total: collections.Counter[str] = collections.Counter()
    for sec in sorted(outcomes):
        other = {k: v for k, v in outcomes[sec].items() if k != "succeeded (returned)"}
        total.update(other)
        print(f"| {sec} | {', '.join(f'{k} {v}' for k, v in other.items()) or '-'} "
              f"| {last_call[sec]} | {last_finish[sec]} | "
              f"{', '.join(sorted(writing.get(sec, ()))) or '-'} |")
    print(f"not succeeded in all: {dict(total) or 'none'}")


if __name__ == "__main__":
    main()
