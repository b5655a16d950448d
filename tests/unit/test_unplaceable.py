"""Issue 29 item 7: a job whose tags no member has is recorded as that, not as overload.

Its runs used to end ``shed (overload)``: the leader judged them as if they had waited
for a free slot. No member has the tags: the reason says so (``unplaceable: no member
has tags [gpu]``); when only a member that is down has them, ``no_node``.
"""

from __future__ import annotations

from typing import Any

import pytest

from raftsched.core import leader, members
from raftsched.core.leader import Capacity, LeaderContext
from raftsched.core.machine import ClusterState
from tests.support.stateutil import hist, ok

pytestmark = pytest.mark.timeout(60)

S = 1000
T0 = 20_000 * 86_400 * S
GPU = "unplaceable: no member has tags [gpu]"


def hb(st: ClusterState, node: str, tags: tuple[str, ...] = (), at: int = T0 - 50 * S) -> None:
    ok(st, {"op": "heartbeat", "at": at, "node": node, "boot": 1, "slots": 2, "queue": 0,
            "tags": list(tags), "api": ""})


def cluster(*nodes: tuple[str, tuple[str, ...]]) -> ClusterState:
    st = ClusterState()
    ok(st, {"op": "leader", "at": T0 - 60 * S, "node": "n1", "term": 1})
    ok(st, {"op": "member", "action": "seed", "at": T0 - 60 * S,
            "members": [{"node": n, "raft": f"h:{i}", "api": f"h:{i + 100}"}
                        for i, (n, _) in enumerate(nodes)]})
    for n, tags in nodes:
        hb(st, n, tags)
    return st


def put(st: ClusterState, job: str, **spec: Any) -> None:
    body: dict[str, Any] = {"id": job, "schedule": {"every": "1h"}, "command": ["true"],
                            "tags": ["gpu"], "misfire": {"grace": "30s"}}
    body.update(spec)
    ok(st, {"op": "put_job", "at": T0 - 40 * S, "spec": body})


def plan(st: ClusterState, now: int, live: tuple[str, ...] | None = None) -> dict[str, Any]:
    caps = tuple(Capacity(node_id=n, tags=frozenset(r.tags), slots=r.slots,
                          limit=r.slots + r.queue, load=len(st.by_node.get(n, ())))
                 for n, r in sorted(st.nodes.items()) if live is None or n in live)
    cmd = leader.plan(st, LeaderContext(node_id="n1", term=1, now_ms=now, lookahead_ms=0,
                                        since_ms=T0 - 60 * S, boot_ms=T0 - 70 * S,
                                        live=caps))
    assert cmd is not None
    return cmd.to_wire()


def test_the_reason_names_the_tags_no_member_has() -> None:
    assert members.unplaceable(("gpu",), (frozenset({"linux"}), frozenset())) == GPU
    assert members.unplaceable(("gpu", "x"), (frozenset({"gpu"}),)) == \
        "unplaceable: no member has tags [gpu, x]"
    assert members.unplaceable(("gpu",), (frozenset({"gpu", "linux"}),)) is None
    assert members.unplaceable((), (frozenset(),)) is None
    assert members.unplaceable(("gpu",), None) is None  # a member's tags not known yet


def test_member_tags_are_unknown_until_every_member_has_sent_its_own() -> None:
    st = cluster(("n1", ()), ("n2", ("gpu",)))
    assert members.member_tags(st) == (frozenset(), frozenset({"gpu"}))
    ok(st, {"op": "member", "action": "add", "node": "n3", "raft": "h:9", "api": "h:10",
            "at": T0})
    assert members.member_tags(st) is None
    hb(st, "n3", ("gpu", "big"))
    assert members.member_tags(st) == (frozenset(), frozenset({"gpu"}),
                                       frozenset({"gpu", "big"}))


def test_a_late_fire_of_a_job_no_member_can_run_is_unplaceable_not_shed() -> None:
    st = cluster(("n1", ()), ("n2", ("linux",)))
    put(st, "gpu", misfire={"policy": "skip", "grace": "30s"})
    cmd = plan(st, T0 + 31 * S)
    assert cmd["fires"] == [["miss", "gpu", T0, T0, 1, "missed", GPU]]
    ok(st, cmd)
    assert [(h.state, h.reason) for h in hist(st, "gpu")] == [("missed", GPU)]


def test_a_triggered_run_no_member_can_take_is_unplaceable_not_shed() -> None:
    st = cluster(("n1", ()), ("n2", ()))
    put(st, "gpu")
    ok(st, {"op": "trigger", "at": T0, "job": "gpu"})
    (run_id,) = st.runs
    cmd = plan(st, T0 + 10 * S)
    assert cmd["drop"] == []  # within its grace it waits for a node
    cmd = plan(st, T0 + 31 * S)
    assert cmd["drop"] == [[run_id, "missed", GPU]]
    ok(st, cmd)
    assert (hist(st, "gpu")[-1].state, hist(st, "gpu")[-1].reason) == ("missed", GPU)


def test_tags_only_a_member_that_is_down_has_are_no_node() -> None:
    st = cluster(("n1", ()), ("n2", ()), ("g", ("gpu",)))
    put(st, "gpu", misfire={"policy": "skip", "grace": "30s"})
    ok(st, {"op": "trigger", "at": T0, "job": "gpu"})
    manual = next(r for r in st.runs if st.runs[r].manual)
    cmd = plan(st, T0 + 31 * S, live=("n1", "n2"))
    assert cmd["fires"] == [["miss", "gpu", T0, T0, 1, "missed", "no_node"]]
    assert cmd["drop"] == [[manual, "missed", "no_node"]]
