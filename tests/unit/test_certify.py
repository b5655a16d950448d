"""Death certificates in the state machine (issue 28): an incarnation proved dead has its
claims released at once; a certificate never touches another incarnation or node, and a
dead incarnation's late heartbeat cannot bring the node back."""

from __future__ import annotations

from raftsched.core.codec import decode_state, encode_state
from raftsched.core.effects import NodeCertified, NodeLost
from raftsched.core.nodes import CERTIFIED
from tests.support.stateutil import (
    T0,
    S,
    base,
    check_indexes,
    err,
    finish,
    hb,
    hist,
    ok,
    place,
    two_runs,
)


def certify(st, node: str, boot: int, at: int = T0 + 20 * S, by: str = "guard"):
    return st.apply_map({"op": "certify", "at": at, "node": node, "boot": boot, "by": by})


def test_a_certificate_releases_the_incarnations_runs_at_once() -> None:
    st = base()
    a, b = two_runs(st, "retry")  # a started, b assigned, both on n1 (boot 1)
    fence_a = st.runs[a].fence
    st.take_effects()
    reply = certify(st, "n1", 1)
    assert reply["ok"] and sorted(reply["released"]) == sorted([a, b])
    # retry: a new attempt, due now (no lease to wait out), placed anew with a new fence.
    assert st.runs[a].state == "pending" and st.runs[a].attempt == 2
    assert st.runs[a].not_before_ms == T0 + 20 * S
    assert hist(st, "j")[-1].state == "lost" and hist(st, "j")[-1].reason == CERTIFIED
    assert st.runs[b].state == "pending"
    node = st.nodes["n1"]
    assert not node.alive and node.dead == (1,)
    effects = st.take_effects()
    assert NodeLost("n1", CERTIFIED) in effects
    assert NodeCertified("n1", 1, "guard", 2) in effects
    # The dead incarnation's reports are refused; the node takes no new work.
    assert finish(st, "n1", a, fence_a, T0 + 21 * S) == [(False, fence_a)]
    assert place(st, b, "n1", T0 + 22 * S)["rejected"] == [["place", b]]
    check_indexes(st)


def test_fail_jobs_record_lost_node_crashed_certified() -> None:
    st = base()
    a, b = two_runs(st, "fail")
    ok(st, {"op": "certify", "at": T0 + 20 * S, "node": "n1", "boot": 1})
    assert a not in st.runs
    assert (hist(st, "j")[-1].state, hist(st, "j")[-1].reason) == ("lost", CERTIFIED)
    assert st.runs[b].state == "pending"


def test_a_certificate_for_an_old_incarnation_releases_nothing_of_the_new_one() -> None:
    st = base()
    a, b = two_runs(st, "retry")
    hb(st, "n1", at=T0 + 10 * S, boot=2)  # restarted: a (started by boot 1) released
    assert st.runs[a].state == "pending"
    place(st, a, "n1", T0 + 11 * S)
    fence = st.runs[a].fence
    assert ok(st, {"op": "start", "at": T0 + 12 * S, "node": "n1",
                   "items": [[a, fence]]})["results"] == [(True, fence)]
    # The old guard's certificate arrives late: boot 1 is no longer n1's incarnation.
    reply = err(st, {"op": "certify", "at": T0 + 13 * S, "node": "n1", "boot": 1},
                "conflict")
    assert "not the node's current one" in reply["error"]["message"]
    assert st.runs[a].state == "started" and st.runs[b].state == "assigned"
    assert st.nodes["n1"].alive and st.nodes["n1"].dead == ()


def test_a_certificate_never_touches_another_node() -> None:
    st = base()
    a, _ = two_runs(st, "retry")
    ok(st, {"op": "certify", "at": T0 + 20 * S, "node": "n2", "boot": 1})
    assert st.runs[a].state == "started" and st.nodes["n1"].alive
    assert not st.nodes["n2"].alive
    err(st, {"op": "certify", "at": T0 + 20 * S, "node": "ghost", "boot": 1},
        "invalid_argument")


def test_a_dead_incarnations_late_heartbeat_is_refused_and_a_new_one_is_welcome() -> None:
    st = base()
    two_runs(st)
    ok(st, {"op": "certify", "at": T0 + 20 * S, "node": "n1", "boot": 1})
    # Sent before it died, committed after its certificate.
    reply = err(st, {"op": "heartbeat", "at": T0 + 21 * S, "node": "n1", "boot": 1,
                     "slots": 4, "queue": 0, "tags": [], "api": "n1:1"}, "conflict")
    assert "certified dead" in reply["error"]["message"]
    assert not st.nodes["n1"].alive
    hb(st, "n1", at=T0 + 22 * S, boot=2)  # the restarted process
    assert st.nodes["n1"].alive and st.nodes["n1"].boot_ms == 2


def test_a_second_certificate_for_the_same_incarnation_changes_nothing() -> None:
    st = base()
    two_runs(st)
    ok(st, {"op": "certify", "at": T0 + 20 * S, "node": "n1", "boot": 1})
    before = encode_state(st)
    reply = ok(st, {"op": "certify", "at": T0 + 21 * S, "node": "n1", "boot": 1,
                    "by": "restart"})
    assert reply == {"ok": True, "released": [], "already": True}
    st.applied -= 1
    assert encode_state(st) == before


def test_bad_certificates_are_refused_naming_the_field() -> None:
    st = base()
    for cmd, field in [
            ({"op": "certify", "at": T0, "boot": 1}, "node"),
            ({"op": "certify", "at": T0, "node": "n1"}, "boot"),
            ({"op": "certify", "at": T0, "node": "n1", "boot": -1}, "boot"),
            ({"op": "certify", "at": T0, "node": "n1", "boot": 1, "by": "gossip"}, "by")]:
        reply = err(st, cmd, "invalid_argument")
        assert field in reply["error"]["message"], (cmd, reply)


def test_dead_incarnations_survive_a_snapshot_and_are_bounded() -> None:
    st = base()
    for boot in range(1, 8):
        hb(st, "n1", at=T0 + boot * S, boot=boot)
        ok(st, {"op": "certify", "at": T0 + boot * S + 1, "node": "n1", "boot": boot})
    assert st.nodes["n1"].dead == (4, 5, 6, 7)
    again = decode_state(encode_state(st))
    assert again.nodes["n1"].dead == (4, 5, 6, 7)
    # A node record never certified keeps the snapshot row it always had.
    assert again.nodes["n2"].to_row() == st.nodes["n2"].to_row()
    assert len(st.nodes["n2"].to_row()) == len(base().nodes["n2"].to_row())


def test_a_restarts_certificate_keeps_the_node_and_its_assigned_runs() -> None:
    """The restarted incarnation proves the old one dead and heartbeats next: the node
    stays alive (a plan in between must still find it) and keeps its assigned runs."""
    st = base()
    a, b = two_runs(st, "retry")
    st.take_effects()
    reply = certify(st, "n1", 1, by="restart")
    assert reply["ok"] and reply["released"] == [a]
    assert st.runs[a].state == "pending" and st.runs[a].attempt == 2
    assert st.runs[b].state == "assigned" and st.runs[b].node == "n1"
    assert st.nodes["n1"].alive and st.nodes["n1"].dead == (1,)
    assert not any(isinstance(e, NodeLost) for e in st.take_effects())
