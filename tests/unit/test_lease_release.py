"""Issue 14, a follower killed just before an instant: the leader releases a
disconnected node's started (pre-started) runs once the node's lease has provably ended,
not after the whole node timeout. The decision on a fake clock, the arithmetic behind
it, and the state machine's condition on the release (no newer heartbeat)."""

from __future__ import annotations

from typing import Any

import pytest

from raftsched.core import lease
from raftsched.core.commands import Release, from_wire
from raftsched.core.errors import InvalidArgument
from raftsched.node.leader.leaderloop import DISCONNECT_GRACE_S
from tests.support.stateutil import T0, S, base, err, hb, hist, ok, put, run_fire, start

# --------------------------------------------------------------------- the arithmetic


@pytest.mark.parametrize("timeout_ms", [1000, 3000, 6000, 60_000])
def test_the_leader_waits_past_everything_the_node_may_still_do(timeout_ms: int) -> None:
    lease_ms = lease.lease_ms(timeout_ms)
    # The self-fence's SIGKILL (lease, a loop tick, the grace) and the guard's poll
    # come before the lease's end; the leader's wait covers that on a faster clock.
    assert lease.guard_after_ms(timeout_ms) >= (lease_ms + lease.FENCE_TICK_MS
                                                + lease.kill_grace_ms(timeout_ms))
    assert lease.lease_end_ms(timeout_ms) >= lease.guard_after_ms(timeout_ms) + lease.GUARD_POLL_MS
    wait = lease.release_after_ms(timeout_ms)
    assert wait >= min(lease.lease_end_ms(timeout_ms) * (1 + lease.DRIFT), timeout_ms)
    assert wait <= timeout_ms


def test_default_timing_releases_three_quarters_into_the_node_timeout() -> None:
    assert lease.lease_ms(3000) == 1500
    assert lease.release_after_ms(3000) == 2296


# --------------------------------------------------------------------- the decision


class FakeNode:
    """One peer as the leader sees it, on a fake monotonic clock (seconds)."""

    def __init__(self, *, timeout_ms: int = 6000, holds_assigned: bool = True) -> None:
        self.now = 100.0
        self.last = self.now       # when the leader applied its newest heartbeat
        self.down_since: float | None = None
        self.lost = False
        self.assigned_released = False
        self.holds = holds_assigned
        self.known = True
        self.timeout_s = timeout_ms / 1000
        self.wait_s = lease.release_after_ms(timeout_ms) / 1000

    def verdict(self) -> str | None:
        v = lease.release_verdict(
            silent_s=self.now - self.last, connected=self.down_since is None,
            disconnected_s=0.0 if self.down_since is None else self.now - self.down_since,
            disconnect_grace_s=DISCONNECT_GRACE_S,
            timeout_s=self.timeout_s, lease_wait_s=self.wait_s, lost=self.lost,
            assigned_released=self.assigned_released, holds_assigned=lambda: self.holds,
            lease_known=lambda: self.known)
        if v in ("silent", "lease"):
            self.lost = True
        elif v == "assigned":
            self.assigned_released = True
        return v

    def run_until(self, seconds: float, step: float = 0.01) -> list[tuple[float, str]]:
        """Tick the leader's housekeeping; the (time since the kill, verdict) pairs."""
        out = []
        t0 = self.now
        while self.now - t0 < seconds:
            self.now += step
            v = self.verdict()
            if v is not None:
                out.append((round(self.now - t0, 2), v))
        return out


def test_a_killed_follower_is_released_at_its_lease_end_not_the_node_timeout() -> None:
    node = FakeNode(timeout_ms=6000)
    node.now += 0.3          # its last heartbeat was applied 0.3 s before the SIGKILL
    node.down_since = node.now
    seen = node.run_until(10)
    # Its assigned runs at once (after the grace), its started ones at the lease's end.
    assert [v for _, v in seen] == ["assigned", "lease"]
    assert seen[0][0] <= DISCONNECT_GRACE_S + 0.02
    released_after_hb = seen[1][0] + 0.3
    assert released_after_hb == pytest.approx(lease.release_after_ms(6000) / 1000, abs=0.02)
    assert released_after_hb < 6.0 - 1.5  # the old rule: the whole node timeout


def test_a_connected_but_silent_node_waits_for_the_node_timeout() -> None:
    # A node frozen with its TCP connection up (SIGSTOP): its lease ended just as well,
    # but node_timeout is what the documentation promises for silence; nothing sooner.
    node = FakeNode(timeout_ms=6000)
    seen = node.run_until(10)
    assert seen == [(pytest.approx(6.0, abs=0.02), "silent")]


def test_no_lease_release_without_the_heartbeat_it_counts_from() -> None:
    # A member of an older release (no lease feature), or no heartbeat known: the node
    # timeout, as before.
    node = FakeNode(timeout_ms=6000, holds_assigned=False)
    node.known = False
    node.down_since = node.now
    assert node.run_until(10) == [(pytest.approx(6.0, abs=0.02), "silent")]


def test_a_heartbeat_or_a_reconnect_before_the_lease_end_releases_nothing() -> None:
    node = FakeNode(timeout_ms=6000, holds_assigned=False)
    node.down_since = node.now
    assert node.run_until(lease.release_after_ms(6000) / 1000 - 0.1) == []
    node.last, node.down_since = node.now, None     # it came back
    assert node.run_until(5.9) == []


def test_released_once() -> None:
    node = FakeNode(timeout_ms=3000)
    node.down_since = node.now
    seen = node.run_until(20)
    assert [v for _, v in seen] == ["assigned", "lease"]


# --------------------------------------------------------------------- the state machine


def _prestarted(lost: str) -> tuple[Any, str]:
    """n2 holds a run whose start it committed before the instant (pre-started)."""
    st = base(("n1", "n2"))
    hb(st, "n2", at=T0 - 300)
    put(st, "j", on_node_lost=lost)
    run_fire(st, "j", T0, node="n2", at=T0 - 250)
    run_id = f"j@{T0}"
    assert start(st, "n2", run_id, st.runs[run_id].fence, T0) == [(True, st.runs[run_id].fence)]
    return st, run_id


def test_a_lease_release_hands_a_prestarted_run_on_under_retry() -> None:
    st, run_id = _prestarted("retry")
    fence = st.runs[run_id].fence
    reply = ok(st, {"op": "release", "at": T0 + 2 * S, "node": "n2", "scope": "all",
                    "reason": "disconnected, lease over", "hb": T0 - 300})
    assert reply["released"] == [run_id]
    run = st.runs[run_id]
    assert (run.state, run.attempt, run.node) == ("pending", 2, None)
    assert hist(st, "j")[-1].state == "lost"
    assert not st.nodes["n2"].alive
    # The dead node's late reports are refused: the claim is no longer its.
    assert ok(st, {"op": "finish", "at": T0 + 3 * S, "node": "n2",
                   "items": [[run_id, fence, "succeeded", 0, "", ""]]})["results"] == \
        [(False, fence)]


def test_a_lease_release_records_a_prestarted_run_lost_under_fail() -> None:
    # The leader cannot tell a run that never spawned from one that ran and was killed
    # at the lease's end: at most once means it is not run again.
    st, run_id = _prestarted("fail")
    ok(st, {"op": "release", "at": T0 + 2 * S, "node": "n2", "scope": "all",
            "reason": "disconnected, lease over", "hb": T0 - 300})
    assert run_id not in st.runs
    assert hist(st, "j")[-1].state == "lost"


def test_a_lease_release_is_refused_after_a_newer_heartbeat() -> None:
    # The node's heartbeat committed after the leader looked (not yet seen by its loop)
    # renewed the lease: the release, ordered after it, must change nothing.
    st, run_id = _prestarted("retry")
    hb(st, "n2", at=T0 + 100)
    cmd = {"op": "release", "at": T0 + 2 * S, "node": "n2", "scope": "all",
           "reason": "disconnected, lease over", "hb": T0 - 300,
           "term": st.leader.term, "leader": st.leader.node}
    reply = err(st, cmd, "conflict")
    assert "heartbeat" in reply["error"]["message"]
    assert st.runs[run_id].state == "started" and st.nodes["n2"].alive


def test_release_hb_on_the_wire() -> None:
    plain = Release(node="n2", scope="all", reason="x", term=3, leader="n1", at=T0)
    assert "hb" not in plain.to_wire()  # a release without it: the bytes it always had
    with_hb = Release(node="n2", scope="all", reason="x", term=3, leader="n1", at=T0, hb=T0 - 1)
    assert with_hb.to_wire()["hb"] == T0 - 1
    assert from_wire(with_hb.to_wire()) == with_hb
    for bad in ("1", True, 1.5):
        with pytest.raises(InvalidArgument) as exc:
            from_wire(dict(with_hb.to_wire(), hb=bad))
        assert exc.value.field == "hb"
