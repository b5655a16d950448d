"""A known bug, pinned (found by tests/unit/test_state_machine.py in CI on 2026-12-06):
a manual run stamped ahead of the job's schedule (a trigger from a node whose clock is
ahead) takes ``job@<ms>``, an id that is no fire time of the schedule then. After a put
changes the schedule so that this ms is a fire time, the plan creates that fire with
the same id as the manual run's history record: two records, one run id. (While the
manual run is still active, the plan refuses the fire instead, in every plan until it
ends.) Strict xfail: fixing the bug makes this test fail until the mark is removed."""

from __future__ import annotations

from typing import Any

import pytest

from raftsched.core.effects import RunCreated
from raftsched.core.leader import Capacity, LeaderContext, plan
from raftsched.core.machine import ClusterState

S = 1000
T0 = 20_000 * 86_400 * S


def _apply(st: ClusterState, cmd: Any) -> dict[str, Any]:
    reply = st.apply_map(cmd)
    if not reply["ok"]:  # not the bug's AssertionError: the xfail must not swallow it
        raise RuntimeError((cmd, reply))
    return reply


@pytest.mark.xfail(strict=True, raises=AssertionError,
                   reason="a fire time can reuse a manual run's id (open bug)")
def test_a_fire_time_never_reuses_the_id_of_a_manual_run_stamped_ahead() -> None:
    st = ClusterState(history_limit=20)
    now = T0
    _apply(st, {"op": "leader", "at": now, "node": "n1", "term": 1})
    for node in ("n1", "n2"):
        _apply(st, {"op": "heartbeat", "at": now, "node": node, "boot": 1, "slots": 2,
                    "queue": 1, "tags": [], "api": ""})

    def put(every: str, overlap: str) -> None:
        _apply(st, {"op": "put_job", "at": now, "spec": {
            "id": "j1", "schedule": {"every": every}, "command": ["true"],
            "overlap": overlap}})

    put("2s", "replace")
    ahead = _apply(st, {"op": "trigger", "at": now + 5 * S,
                        "job": "j1", "force": False})["run_id"]
    _apply(st, {"op": "trigger", "at": now, "job": "j1", "force": False})  # replaces it
    if ahead not in {r.run_id for r in st.history["j1"]}:
        return  # a fix that keeps such a run out of the history ends the bug: XPASS
    put("1s", "allow")
    st.take_effects()
    live = tuple(Capacity(node_id=n, tags=frozenset(), slots=2, limit=3, load=0)
                 for n in ("n1", "n2"))
    cmd = plan(st, LeaderContext(node_id="n1", term=1, now_ms=now + 5 * S, lookahead_ms=0,
                                 since_ms=st.leader.since_ms, boot_ms=T0, live=live))
    assert cmd is not None
    _apply(st, cmd)
    created = [e.run_id for e in st.take_effects() if isinstance(e, RunCreated)]
    history = {r.run_id for r in st.history["j1"]}
    assert not set(created) & history, (created, ahead)
