"""How soon a 3-node cluster answers again after whole-node faults, one tree at a time:
``python -m bench.recover_ab OUT.json REPS`` from a tree (cwd and ``PYTHONPATH`` both the
tree, as ``bench.w1tree`` does, to compare two codes in turn).

3 nodes, 12 every-second jobs. Each repetition runs three faults, and each figure is the
seconds until some node answers a consistent ``status`` naming itself leader (what the
nemesis counts as available):

- ``restart_all``: SIGKILL all three, start all three; from the start.
- ``kill2``: SIGKILL the leader and a follower, start both; from the start.
- ``stop2``: SIGSTOP the leader and a follower for 2 s, then SIGCONT; from the SIGCONT.

Prints one line per repetition; writes ``{scenario: [seconds or null]}`` to OUT.json.
"""

from __future__ import annotations

import json
import signal
import sys
import tempfile
import time

from bench.cluster import BenchCluster


def up_after(c: BenchCluster, t0: float, limit: float = 20.0) -> float | None:
    """Seconds from ``t0`` until a node answers as leader (None after ``limit``)."""
    while time.monotonic() - t0 < limit:
        for nid in c.ids:
            try:
                st = c.status(nid, timeout=0.3)
            except Exception:  # noqa: BLE001, S112 - not answering is what is measured
                continue
            if st.get("leader") == nid and st.get("health") != "down":
                return time.monotonic() - t0
        time.sleep(0.01)
    return None


def main(out: str, reps: int) -> None:
    res: dict[str, list[float | None]] = {"restart_all": [], "stop2": [], "kill2": []}
    c = BenchCluster(tempfile.mkdtemp(prefix="recab-"), workers=8, queue=64)
    try:
        c.start_all()
        c.wait_leader(60)
        c.wait_all_alive(60)
        with c.client(timeout=30) as cl:
            cl.call("put_jobs", specs=[{"id": f"j{i}", "schedule": {"every": "1s"},
                                        "call": "bench.noop:stamp"} for i in range(12)])
        for r in range(reps):
            time.sleep(3)
            for nid in c.ids:
                c.kill(nid)
            t0 = time.monotonic()
            for nid in c.ids:
                c.start(nid)
            res["restart_all"].append(up_after(c, t0))
            time.sleep(3)
            leader = c.wait_leader(30)
            pair = (leader, next(n for n in c.ids if n != leader))
            for n in pair:
                c.signal(n, signal.SIGSTOP)
            time.sleep(2)
            for n in pair:
                c.signal(n, signal.SIGCONT)
            t0 = time.monotonic()
            res["stop2"].append(up_after(c, t0))
            time.sleep(3)
            leader = c.wait_leader(30)
            pair = (leader, next(n for n in c.ids if n != leader))
            for n in pair:
                c.kill(n)
            t0 = time.monotonic()
            for n in pair:
                c.start(n)
            res["kill2"].append(up_after(c, t0))
            print(r, {k: v[-1] for k, v in res.items()}, flush=True)
    finally:
        c.close()
    with open(out, "w", encoding="utf-8") as f:
        json.dump(res, f)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
