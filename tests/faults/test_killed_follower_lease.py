"""Issue 14, W3': a follower lost with its host just before an instant whose runs it had
already started (pre-started: start committed, waiting for the instant). The stand-in
for a host loss SIGKILLs the node's guard and then the node, so nothing is left to prove
the node dead (with the guard alive, its certificate releases the runs at once:
test_killed_follower_certified.py). The leader cannot tell
a dead node from a cut-off one whose runs may run, so it waits until the node's lease
has provably ended (core/lease.py: ~0.65 of the node timeout after its newest
heartbeat) — not the whole node timeout, as before. Under ``retry`` the runs then start
elsewhere as attempt 2; under ``fail`` they are recorded ``lost``.

The node timeout is long (12 s) so the two rules are seconds apart on a loaded
machine: the lease release lands ~8 s after the instant, the old one at >= 11 s."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.integration.harness import read_witness, wait_until, witness_command

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

NODE_TIMEOUT_S = 12
#: Starts elsewhere (or ``lost`` records) must come this soon after the instant. The
#: lease release comes 8.0 s after the victim's newest heartbeat (sent before the
#: kill), plus a plan and a start; the old rule's release alone came >= 11.3 s after.
BOUND_S = 9.8
RETRY = [f"r{i}" for i in range(6)]
FAIL = [f"f{i}" for i in range(3)]


def _held(cl: Any, victim: str, instant: int) -> dict[str, list[dict[str, Any]]]:
    """The records of ``instant`` of each job whose run ``victim`` had started."""
    out = {}
    for j in RETRY + FAIL:
        recs = [r for r in cl.runs(j, limit=50)["runs"] if r["scheduled_ms"] == instant]
        if any(tr["state"] == "started" and tr["node"] == victim
               for r in recs for tr in r["transitions"]):
            out[j] = recs
    return out


def _moved_on(recs: list[dict[str, Any]], victim: str, job: str) -> dict[str, Any] | None:
    """The record that ends the victim's claim: under retry, the next attempt started
    on another node; under fail, the run recorded lost."""
    if job in FAIL:
        return next((r for r in recs if r["state"] == "lost"), None)
    return next((r for r in recs if r["attempt"] >= 2 and r["started_ms"] is not None
                 and r["node"] not in (None, victim)), None)


def test_a_killed_followers_prestarted_runs_move_on_at_its_lease_end(cluster_factory,
                                                                       tmp_path):
    # A long lookahead: the runs of the next instant are assigned and their starts
    # committed well before the kill, also on a loaded machine.
    c = cluster_factory(3, workers=8, timing={"node_timeout": f"{NODE_TIMEOUT_S}s",
                                              "lookahead": "1s"})
    ran = str(tmp_path / "ran.jsonl")
    leader, victim, instant, held = kill_a_follower_holding_runs(c, ran, c.kill_host)

    def settled() -> dict[str, dict[str, Any]] | None:
        with c.client([leader]) as cl:
            now = _held(cl, victim, instant)
        moved = {j: _moved_on(recs, victim, j) for j, recs in now.items()}
        return moved if all(moved.values()) and set(moved) == set(held) else None

    moved = wait_until(settled, 60, "the killed follower's runs to move on", 0.2)
    late, delays = {}, {}
    for j, rec in moved.items():
        at = rec["started_ms"] if j in RETRY else rec["finished_ms"]
        delays[j] = (at - instant) / 1000
        if at - instant > BOUND_S * 1000:
            late[j] = (at - instant) / 1000
    print(f"\nmoved on, seconds after the instant: {delays}")  # noqa: T201 - report only
    assert not late, f"moved on later than {BOUND_S}s after the instant: {late}"
    for j in held:
        if j in FAIL:
            assert "lease" in (moved[j]["reason"] or ""), moved[j]
    # Each such run executed once at most per attempt, never on the dead node.
    runs = [w for w in read_witness(ran) if w["RUN_ID"] in {f"{j}@{instant}" for j in held}]
    assert all(w["NODE_ID"] != victim for w in runs), runs
    assert len({(w["RUN_ID"], w["ATTEMPT"]) for w in runs}) == len(runs), runs
    assert not any(w["RUN_ID"].startswith("f") for w in runs), runs


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
            held = _held(cl, victim, instant)
        if held:
            return leader, victim, instant, held
        # Nothing of that instant was started there (the leader placed it all on the
        # other follower): restart it and try again.
        c.start(victim)
        wait_until(lambda v=victim: _alive_in_status(c, v), 60, f"{victim} back")
    raise AssertionError("the killed follower never held a pre-started run")


def _alive_in_status(c: Any, nid: str) -> bool:
    for n in c.ids:
        if not c.alive(n):
            continue
        st = c.status(n)
        if st["leader"] is not None:
            return any(x["node_id"] == nid and x["alive"] for x in st["nodes"])
    return False
