"""One client's commit and consistent-read latency, source trees side by side.

    python -m bench.commit_latency --tree /path/to/old --tree . [--nodes 1] [--n 400]

Each round starts, in every tree in turn (its own ``PYTHONPATH``), a fresh cluster of
``--nodes`` real ``raftsched node`` processes on loopback (``bench/cluster.py``, no
cluster secret) and sends ``--n`` ``put_job`` (a commit) and ``get_job`` (a consistent
read) one after another to its leader; rounds alternate, so a loaded machine's drift
falls on every tree alike. Prints median and p99 per op and tree (µs). ``--nodes 1`` is
the embedded default's case: no peer's answer wakes a lone leader's Raft thread.
Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

if __package__ in (None, ""):  # run by path inside another tree (the worker)
    sys.path[0] = os.environ.get("PYTHONPATH", "").split(os.pathsep)[0] or sys.path[0]

from bench.stats import pct  # noqa: E402


def _worker(nodes: int, n: int) -> dict[str, list[float]]:
    """Runs inside the measured tree."""
    from bench.cluster import BenchCluster

    c = BenchCluster(tempfile.mkdtemp(prefix="commit-latency-"), n=nodes, workers=4, queue=16)
    try:
        c.start_all()
        leader = c.wait_leader(60)
        c.wait_all_alive(60)
        out: dict[str, list[float]] = {"put_job": [], "get_job": []}
        spec = {"id": "bench", "schedule": {"at": "2099-01-01T00:00:00Z"},
                "command": ["true"]}
        with c.client([leader]) as client:
            for i in range(n + 20):  # the first 20 warm up
                t0 = time.perf_counter()
                client.put_job(dict(spec, id=f"bench-{i % 50}"))
                t1 = time.perf_counter()
                client.get_job(f"bench-{i % 50}")
                t2 = time.perf_counter()
                if i >= 20:
                    out["put_job"].append(t1 - t0)
                    out["get_job"].append(t2 - t1)
        return out
    finally:
        c.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", action="append", required=True, help="a source tree (repeat)")
    ap.add_argument("--nodes", type=int, default=1)
    ap.add_argument("--n", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(_worker(args.nodes, args.n)))
        return 0
    trees = [os.path.abspath(t) for t in args.tree]
    got: dict[str, dict[str, list[float]]] = {t: {} for t in trees}
    for _ in range(args.rounds):
        for tree in trees:
            # This file, run in the tree: its bench.cluster and raftsched, ours the loop.
            res = subprocess.run(
                [sys.executable, os.path.abspath(__file__), "--worker", "--tree", tree,
                 "--nodes", str(args.nodes), "--n", str(args.n)],
                cwd=tree, env=dict(os.environ, PYTHONPATH=tree), capture_output=True,
                text=True, timeout=600, check=True)
            for op, values in json.loads(res.stdout.strip().splitlines()[-1]).items():
                got[tree].setdefault(op, []).extend(values)
    print(f"{args.nodes} node(s), {args.rounds} rounds of {args.n} per tree")
    print("| tree | op | median µs | p99 µs |")
    print("|---|---|---|---|")
    for tree, ops in got.items():
        for op, values in ops.items():
            p50, p99 = pct(values, 50) or 0.0, pct(values, 99) or 0.0
            print(f"| {tree} | {op} | {p50 * 1e6:,.0f} | {p99 * 1e6:,.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
