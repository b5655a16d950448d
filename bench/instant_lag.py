"""W1's lag inside one instant, per node: how late its first call is, and how long its
node takes from that first call to its last.

    python -m bench.instant_lag --jobs 1000 --window 15

A probe, not a workload of the report: J every-second ``bench.noop:stamp`` jobs on a
3-node cluster (1024 workers per node, as W1), then per node the instants of the
window: runs per instant, lag(call) p50 / p99, the first call's lag (median over the
instants) and the span from the first call to the last (median and max), and the
node's CPU (cores). Lag(call) is W1's: the stamp's wall-clock ms minus the fire time.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import tempfile
import time

from bench.cluster import BenchCluster


def _q(values: list[int], p: float) -> int:
    values = sorted(values)
    return values[min(len(values) - 1, int(p * len(values)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--window", type=int, default=15, help="seconds")
    args = ap.parse_args()
    c = BenchCluster(tempfile.mkdtemp(prefix="instlag-"), workers=1024)
    ids = [f"j{i}" for i in range(args.jobs)]
    try:
        leader = c.start_stamping(ids)
        time.sleep(5)
        w0 = (int(time.time()) + 1) * 1000
        cpu0 = {n: c.cpu_s(n) or 0.0 for n in c.ids}
        time.sleep(args.window + 1)
        cpu1 = {n: c.cpu_s(n) or 0.0 for n in c.ids}
        time.sleep(2)
        stamps = c.stamps()
    finally:
        c.close()
    w1 = w0 + args.window * 1000
    per: dict[tuple[str, int], list[int]] = collections.defaultdict(list)
    for run_id, attempt, _fence, call_ms, node in stamps:
        fire = int(run_id.rsplit("@", 1)[1])
        if attempt == 1 and w0 <= fire < w1:
            per[(node, fire)].append(call_ms - fire)
    lags: dict[str, list[int]] = collections.defaultdict(list)
    firsts: dict[str, list[int]] = collections.defaultdict(list)
    spans: dict[str, list[int]] = collections.defaultdict(list)
    sizes: dict[str, list[int]] = collections.defaultdict(list)
    for (node, _fire), got in per.items():
        lags[node] += got
        firsts[node].append(min(got))
        spans[node].append(max(got) - min(got))
        sizes[node].append(len(got))
    every = [x for v in lags.values() for x in v]
    print(f"J={args.jobs:,}, {args.window} s window, leader {leader}; lag(call) of every "
          f"node p50 {_q(every, .5)} / p99 {_q(every, .99)} ms, {len(every):,} calls")
    print("| node | runs per instant | lag(call) p50 / p99 ms | first call ms (median) "
          "| first → last call ms (median / max) | CPU cores |")
    print("|---|---|---|---|---|---|")
    for n in c.ids:
        cpu = (cpu1[n] - cpu0[n]) / (args.window + 1)
        if n not in lags:
            print(f"| {n}{' (leader)' if n == leader else ''} | 0 | — | — | — | {cpu:.3f} |")
            continue
        print(f"| {n}{' (leader)' if n == leader else ''} | {statistics.mean(sizes[n]):.0f} "
              f"| {_q(lags[n], .5)} / {_q(lags[n], .99)} | {statistics.median(firsts[n]):.0f} "
              f"| {statistics.median(spans[n]):.0f} / {max(spans[n])} | {cpu:.3f} |")


if __name__ == "__main__":
    main()
