"""The setup of the killed-follower tests (W3' and W3F): every-second jobs, a follower
killed just before an instant whose runs it had pre-started, what it held, and whether
the cluster sees a node alive."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from tests.support.harness import wait_until, witness_command

#: Jobs whose runs are retried elsewhere (``on_node_lost = "retry"``), and recorded lost.
RETRY = [f"r{i}" for i in range(6)]
FAIL = [f"f{i}" for i in range(3)]


def held_runs(cl: Any, victim: str, instant: int) -> dict[str, list[dict[str, Any]]]:
    """The records of ``instant`` of each job whose run ``victim`` had started."""
    out = {}
    for j in RETRY + FAIL:
        recs = [r for r in cl.runs(j, limit=50)["runs"] if r["scheduled_ms"] == instant]
        if any(tr["state"] == "started" and tr["node"] == victim
               for r in recs for tr in r["transitions"]):
            out[j] = recs
    return out


def kill_a_follower_holding_runs(c: Any, ran: str, kill: Callable[[str], float]
                                 ) -> tuple[str, str, int, dict[str, list[dict[str, Any]]]]:
    """Start ``c``, put the every-second jobs (witnessed in ``ran``), then ``kill`` a
    follower 100 ms before an instant whose runs it had pre-started (retrying with the
    next instant until it held some): (leader, victim, instant ms, its held records)."""
    c.start_all()
    c.wait_leader(30)
    with c.client() as cl:
        cl.put_jobs([{"id": j, "schedule": {"every": "1s"}, "command": witness_command(ran),
                      "on_node_lost": "fail" if j in FAIL else "retry"}
                     for j in RETRY + FAIL], atomic=True)
        wait_until(lambda: all(cl.runs(j)["runs"] for j in RETRY + FAIL), 30,
                   "every job running")
    for _ in range(4):
        leader = c.wait_leader(30)
        victim = next(n for n in sorted(c.ids) if n != leader)
        time.sleep((0.9 - time.time() % 1.0) % 1.0)
        instant = math.ceil(kill(victim)) * 1000
        with c.client([leader]) as cl:
            # The records say what it held (they were committed before the kill).
            held = held_runs(cl, victim, instant)
        if held:
            return leader, victim, instant, held
        # Nothing of that instant was started there (the leader placed it all on the
        # other follower): restart it and try again.
        c.start(victim)
        wait_until(lambda v=victim: alive_in_status(c, v), 60, f"{victim} back")
    raise AssertionError("the killed follower never held a pre-started run")


def alive_in_status(c: Any, nid: str) -> bool:
    """Whether a running node that knows a leader reports ``nid`` alive."""
    for n in c.ids:
        if not c.alive(n):
            continue
        st = c.status(n)
        if st["leader"] is not None:
            return any(x["node_id"] == nid and x["alive"] for x in st["nodes"])
    return False
