"""Issue 29 item 6: a retry obeys the job's misfire grace.

A run lost with its node (here: the whole cluster stopped, its node restarted six
minutes later) is retried by ``on_node_lost = retry``. That retry fell due when the run
was lost; started minutes later it ran beside, and for ``overlap = skip`` instead of,
the on-time fire. Past the grace it is recorded as a late fire time is, and the on-time
fire runs. Pure state and plans, with the leader's clock passed in.
"""

from __future__ import annotations

from typing import Any

import pytest

from raftsched.core import leader
from raftsched.core.leader import Capacity, LeaderContext
from raftsched.core.machine import ClusterState
from tests.support.stateutil import hist, ok

pytestmark = pytest.mark.timeout(60)

S = 1000
M = 60 * S
T0 = 20_000 * 86_400 * S  # midnight UTC: a fire time of every schedule here


def hb(st: ClusterState, node: str, at: int, boot: int = 1) -> None:
    ok(st, {"op": "heartbeat", "at": at, "node": node, "boot": boot, "slots": 2,
            "queue": 0, "tags": [], "api": ""})


def caps(st: ClusterState) -> tuple[Capacity, ...]:
    return leader.capacities(st)


def plan(st: ClusterState, now: int, *, since: int, boot: int) -> dict[str, Any] | None:
    c = LeaderContext(node_id="n1", term=st.leader.term, now_ms=now, lookahead_ms=0,
                      since_ms=since, boot_ms=boot, live=caps(st))
    cmd = leader.plan(st, c)
    return None if cmd is None else cmd.to_wire()


def started_then_outage(grace: str) -> tuple[ClusterState, str, int]:
    """Job ``j`` (every 10 min, grace ``grace``) with its T0 run started on n2 when the
    cluster stopped at T0 + 5 s; it comes back at T0 + 6 min, n2 with a new boot and a
    new leadership (term 2). Returns the state, the run id and the restart time."""
    st = ClusterState()
    ok(st, {"op": "leader", "at": T0 - 60 * S, "node": "n1", "term": 1})
    for n in ("n1", "n2"):
        hb(st, n, T0 - 50 * S)
    ok(st, {"op": "put_job", "at": T0 - 40 * S,
            "spec": {"id": "j", "schedule": {"every": "10m"}, "command": ["sleep", "60"],
                     "misfire": {"grace": grace}}})
    ok(st, plan(st, T0, since=T0 - 60 * S, boot=T0 - 70 * S))
    run_id = f"j@{T0}"
    run = st.runs[run_id]
    assert run.node == "n2"
    ok(st, {"op": "start", "at": T0 + 10, "node": "n2", "items": [[run_id, run.fence]]})
    hb(st, "n2", T0 + 5 * S)  # its last heartbeat before the stop
    back = T0 + 6 * M
    ok(st, {"op": "leader", "at": back, "node": "n1", "term": 2})
    hb(st, "n1", back, boot=2)
    hb(st, "n2", back + 200, boot=2)  # a new process: its run died with the old one
    assert st.runs[run_id].state == "pending" and st.runs[run_id].attempt == 2
    return st, run_id, back


def test_a_retry_due_during_an_outage_beyond_its_grace_is_recorded_missed_not_run() -> None:
    st, run_id, back = started_then_outage("1m")
    # Due when its node was last known to run it, not when the restart was noticed.
    assert st.runs[run_id].not_before_ms == T0 + 5 * S
    cmd = plan(st, back + 2 * S, since=back, boot=back - S)
    assert cmd is not None
    assert cmd["place"] == []
    assert cmd["drop"] == [[run_id, "missed", "cluster_down"]]
    ok(st, cmd)
    assert run_id not in st.runs
    attempts = [(h.attempt, h.state, h.reason) for h in hist(st, "j") if h.run_id == run_id]
    # Both attempts stay in the history: the first lost with its node, the retry late.
    assert attempts == [(1, "lost", "node n2 restarted"), (2, "missed", "cluster_down")]


def test_the_on_time_fire_after_a_late_retry_is_not_skipped_for_overlap() -> None:
    st, run_id, back = started_then_outage("1m")
    # Settled (past SETTLE_MS of the new term) when the next on-time fire is due.
    fire = T0 + 10 * M
    cmd = plan(st, fire, since=back, boot=back - S)
    assert cmd is not None
    assert [run_id, "missed", "cluster_down"] in cmd["drop"]
    assert not [f for f in cmd["fires"] if f[0] == "miss" and f[5] == "skipped"], cmd["fires"]
    ok(st, cmd)
    assert st.runs[f"j@{fire}"].state == "assigned"


def test_a_retry_within_its_grace_still_runs() -> None:
    st, run_id, back = started_then_outage("10m")
    cmd = plan(st, back + 2 * S, since=back, boot=back - S)
    assert cmd is not None and cmd["drop"] == []
    assert [p[0] for p in cmd["place"]] == [run_id]


def test_a_failed_attempts_retry_is_due_after_its_backoff() -> None:
    st = ClusterState()
    ok(st, {"op": "leader", "at": T0 - 60 * S, "node": "n1", "term": 1})
    hb(st, "n1", T0 - 50 * S)
    ok(st, {"op": "put_job", "at": T0 - 40 * S,
            "spec": {"id": "j", "schedule": {"every": "1h"}, "command": ["false"],
                     "misfire": {"grace": "30s"}, "retries": {"max": 2, "backoff": "1m"}}})
    ok(st, plan(st, T0, since=T0 - 60 * S, boot=T0 - 70 * S))
    run_id = f"j@{T0}"
    fence = st.runs[run_id].fence
    ok(st, {"op": "start", "at": T0 + 10, "node": "n1", "items": [[run_id, fence]]})
    ok(st, {"op": "finish", "at": T0 + S, "node": "n1",
            "items": [[run_id, fence, "failed", 1, "", "exit 1"]]})
    due = st.runs[run_id].not_before_ms
    assert due == T0 + S + M
    # Within the grace of its backoff's end it is placed...
    cmd = plan(st, due + 29 * S, since=T0 - 60 * S, boot=T0 - 70 * S)
    assert cmd is not None and [p[0] for p in cmd["place"]] == [run_id]
    # ...past it (the leader could not get to it: overload) it is shed, not run.
    cmd = plan(st, due + 31 * S, since=T0 - 60 * S, boot=T0 - 70 * S)
    assert cmd is not None and cmd["place"] == []
    assert cmd["drop"] == [[run_id, "shed", "overload"]]
