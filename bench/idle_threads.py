"""An idle 3-node cluster's CPU per node and per thread, and its wakeups.

    python -m bench.idle_threads --window 60
    python -m bench.idle_threads --window 60 append_period=100ms heartbeat=1000ms
    python -m bench.idle_threads --window 60 --nodes 1     # the embedded default: one node

A probe beside the IDLE workload (``bench/idle.py``, which reports per node only): it
says *which* thread an idle node's CPU goes to (the Raft thread, the event loop, the
journal's sync thread), how often each wakes, and how many entries the cluster commits
per second. ``key=value`` arguments are ``[timing]`` values for every node
(``bench/results/2026-12-05-idle-floor.md`` is what it found).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

from bench.cluster import BenchCluster

_TCK = os.sysconf("SC_CLK_TCK")


def _threads(pid: int) -> dict[str, tuple[float, int]]:
    """tid -> (CPU seconds, voluntary context switches) of each thread of ``pid``."""
    out: dict[str, tuple[float, int]] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat", encoding="ascii") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            switches = 0
            with open(f"/proc/{pid}/task/{tid}/status", encoding="ascii") as f:
                for line in f:
                    if line.startswith("voluntary_ctxt_switches"):
                        switches = int(line.split()[1])
        except OSError:
            continue
        out[tid] = ((int(fields[11]) + int(fields[12])) / _TCK, switches)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--window", type=float, default=60.0, help="seconds")
    ap.add_argument("--nodes", type=int, default=3, help="cluster size (1: a lone node)")
    ap.add_argument("timing", nargs="*", help="[timing] key=value for every node")
    args = ap.parse_args()
    timing = dict(kv.split("=", 1) for kv in args.timing)
    c = BenchCluster(tempfile.mkdtemp(prefix="idle-threads-"), n=args.nodes, workers=4,
                     queue=16, timing=timing)
    try:
        c.start_all()
        leader = c.wait_leader(60)
        c.wait_all_alive(60)
        time.sleep(5)
        pids = {n: c.pid(n) for n in c.ids}
        before = {n: _threads(p) for n, p in pids.items()}
        i0 = c.status(leader).get("commit_index") or 0
        t0 = time.monotonic()
        time.sleep(args.window)
        wall = time.monotonic() - t0
        after = {n: _threads(p) for n, p in pids.items()}
        i1 = c.status(leader).get("commit_index") or 0
    finally:
        c.close()
    print(f"timing {timing or 'default'}; leader {leader}; "
          f"{(i1 - i0) / wall:.2f} entries committed/s over {wall:.0f} s")
    print("| node | CPU % of a core | wakeups/s | busiest threads: CPU % (wakeups/s) |")
    print("|---|---|---|---|")
    for n in c.ids:
        rows = []
        for tid, (cpu0, sw0) in before[n].items():
            cpu1, sw1 = after[n].get(tid, (cpu0, sw0))
            rows.append(((cpu1 - cpu0) / wall * 100, (sw1 - sw0) / wall))
        rows.sort(reverse=True)
        busiest = ", ".join(f"{cpu:.2f} ({sw:.0f})" for cpu, sw in rows[:3])
        print(f"| {n}{' (leader)' if n == leader else ''} | {sum(r[0] for r in rows):.2f} "
              f"| {sum(r[1] for r in rows):.0f} | {busiest} |")


if __name__ == "__main__":
    main()
