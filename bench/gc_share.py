"""What the garbage collector costs a storm: J every-second no-op jobs on 3 nodes, and
per node its CPU and the wall time of its collections over the window, by generation
(``raftsched_gc_*`` from ``/metrics``).

    python -m bench.gc_share --jobs 5000 --window 20

A probe, not a workload of the report. A collection holds the GIL and stops every thread
of its process, so its wall time is the process's CPU it takes (on a loaded machine also
some waiting: an upper bound). The node's thresholds are ``node.GC_THRESHOLDS``.
"""

from __future__ import annotations

import argparse
import tempfile
import time

from bench.cluster import BenchCluster


def _gc(m: dict[str, float], what: str, gen: int) -> float:
    return m.get(f'raftsched_gc_{what}{{generation="{gen}"}}', 0.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=5000)
    ap.add_argument("--window", type=int, default=20, help="seconds")
    args = ap.parse_args()
    c = BenchCluster(tempfile.mkdtemp(prefix="gcshare-"), workers=1024)
    try:
        leader = c.start_stamping([f"j{i}" for i in range(args.jobs)])
        time.sleep(5)
        m0 = {n: c.metrics(n) for n in c.ids}
        cpu0 = {n: c.cpu_s(n) or 0.0 for n in c.ids}
        own0 = {n: c.cpu_s(n, own=True) or 0.0 for n in c.ids}
        t0 = time.monotonic()
        time.sleep(args.window)
        m1 = {n: c.metrics(n) for n in c.ids}
        cpu1 = {n: c.cpu_s(n) or 0.0 for n in c.ids}
        own1 = {n: c.cpu_s(n, own=True) or 0.0 for n in c.ids}
        took = time.monotonic() - t0
        runs = sum(m1[n].get("raftsched_worker_started_total", 0.0)
                   - m0[n].get("raftsched_worker_started_total", 0.0) for n in c.ids)
    finally:
        c.close()
    print(f"J={args.jobs:,}, {took:.0f} s window, leader {leader}, {runs / took:,.0f} runs "
          "started per second")
    print("| node | CPU s (process tree) | collections gen 0 / 1 / 2 | their seconds "
          "gen 0 / 1 / 2 | longest ms (since the node started) | share of the node process's CPU |")
    print("|---|---|---|---|---|---|")
    cpu_all = gc_all = own_all = 0.0
    for n in c.ids:
        cpu = cpu1[n] - cpu0[n]
        counts = [_gc(m1[n], "collections_total", g) - _gc(m0[n], "collections_total", g)
                  for g in range(3)]
        secs = [_gc(m1[n], "seconds_total", g) - _gc(m0[n], "seconds_total", g)
                for g in range(3)]
        longest = max(_gc(m1[n], "longest_seconds", g) for g in range(3)) * 1000
        cpu_all += cpu
        own = own1[n] - own0[n]
        own_all += own
        gc_all += sum(secs)
        print(f"| {n}{' (leader)' if n == leader else ''} | {cpu:.2f} "
              f"| {' / '.join(f'{x:.0f}' for x in counts)} "
              f"| {' / '.join(f'{x:.3f}' for x in secs)} | {longest:.1f} "
              f"| {100 * sum(secs) / own if own else 0:.1f} % |")
    if runs:
        print(f"all three: CPU {cpu_all * 1000 / runs:.3f} ms per run, of it collections "
              f"{gc_all * 1000 / runs:.4f} ms ({100 * gc_all / own_all:.1f} % of the node "
              "processes' own CPU), the node "
              f"processes alone {own_all * 1000 / runs:.3f} ms (the rest is their children: "
              "snapshot writers, guards)")


if __name__ == "__main__":
    main()
