"""``python -m bench.failover_times [KILLS]``: where a leader failover's time goes.

A 3-node loopback cluster (the integration tests' launcher: info logs; raftsched's
default timing) runs 8 every-second jobs; the leader is SIGKILLed KILLS times (default
8) at a random phase of the second, then restarted. Per kill, seconds after it: the new
leader's ``leader`` record applied on it (``leader.changed``: the election and that
record's commit), the survivors agreeing on it in ``status``, its first assignment, the
first start of a run it assigned, and the first start of any run. Prints one JSON line
per kill and the medians; never asserts. Run it under ``flock /work/heavy.lock``.
"""

from __future__ import annotations

import json
import random
import statistics
import sys
import tempfile
import time
from typing import Any

from tests.support.harness import Cluster, wait_until, witness_command

JOBS = 8


def _after(t_kill: float, ms: float | None) -> float | None:
    return None if ms is None else round((ms - t_kill) / 1000, 3)


def one_kill(c: Cluster, ids: list[str], rng: random.Random) -> dict[str, Any]:
    leader = c.wait_leader(30)
    time.sleep(rng.random())
    t_kill = c.kill(leader) * 1000
    survivors = [n for n in c.ids if n != leader]

    def agreed() -> str | None:
        got = {c.status(n, timeout=1.0)["leader"] for n in survivors}
        return got.pop() if len(got) == 1 and None not in got and leader not in got else None

    new = wait_until(agreed, 30, "a new leader", 0.01)
    t_seen = time.time() * 1000
    time.sleep(2.5)
    record = next((e["ts_ms"] for e in c.events(new) if e.get("ts_ms", 0) > t_kill
                   and e.get("event") == "leader.changed" and e.get("leader") == new), None)
    with c.client([new]) as cl:
        recs = [r for j in ids for r in cl.runs(j, limit=10)["runs"]]
    starts = [r["started_ms"] for r in recs if (r["started_ms"] or 0) > t_kill]
    by_new = [r["started_ms"] for r in recs if (r["started_ms"] or 0) > t_kill
              and any(tr["state"] == "assigned" and tr["at_ms"] > t_kill
                      for tr in r["transitions"])]
    assigns = [tr["at_ms"] for r in recs for tr in r["transitions"]
               if tr["state"] == "assigned" and tr["at_ms"] > t_kill]
    c.start(leader)
    c.wait_leader(30)
    return {"phase_ms": int(t_kill % 1000), "leader_record_s": _after(t_kill, record),
            "status_agrees_s": _after(t_kill, t_seen),
            "first_assign_s": _after(t_kill, min(assigns, default=None)),
            "new_leader_run_start_s": _after(t_kill, min(by_new, default=None)),
            "any_run_start_s": _after(t_kill, min(starts, default=None))}


def main(kills: int) -> None:
    tmp = tempfile.mkdtemp(prefix="failover-times-")
    c = Cluster(tmp, 3, workers=8, timing={"node_timeout": "3s", "heartbeat": "500ms"})
    rows = []
    try:
        c.start_all()
        c.wait_leader(30)
        ids = [f"e{i}" for i in range(JOBS)]
        with c.client() as cl:
            cl.put_jobs([{"id": j, "schedule": {"every": "1s"}, "overlap": "allow",
                          "command": witness_command(tmp + "/w.jsonl")} for j in ids],
                        atomic=True)
        time.sleep(4)
        rng = random.Random(7)
        for _ in range(kills):
            rows.append(one_kill(c, ids, rng))
            print(json.dumps(rows[-1]), flush=True)  # noqa: T201 - the report
            time.sleep(2)
    finally:
        c.close()
    for key in rows[0]:
        vals = [r[key] for r in rows if r[key] is not None]
        print(f"{key}: median {statistics.median(vals):.3f} max {max(vals):.3f}")  # noqa: T201


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 8)
