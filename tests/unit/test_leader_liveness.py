"""Issue 13 item 5 / issue 14: the leader's liveness timing, step by step on a fake clock.

The real :class:`~raftsched.node.leader.leaderloop.LeaderLoop` runs against an in-process
replica (one :class:`ClusterState`; a submission applies at once, in the replica's
current Raft term, the way a committed log entry of that term would) and a
:class:`~raftsched.node.observe.clock.FakeClock`: no process, no sleep. What it pins: when a
silent or disconnected peer is declared lost (never a moment early), that a leader's
own pause is not its peers' silence, and that a deposed leader's verdicts change
nothing. The real-process versions of the same faults are in
``tests/faults/test_stale_views.py`` and ``test_killed_follower_lease.py``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest

from raftsched.core import lease
from raftsched.core.cmdbase import CONTACT_FEATURE
from raftsched.core.commands import LeaderRecord, Release
from raftsched.core.machine import ClusterState
from raftsched.node.config.addressbook import AddressBook
from raftsched.node.leader.leaderloop import (
    DISCONNECT_GRACE_S,
    HOUSEKEEPING_S,
    QUIET_HOUSEKEEPING_S,
    LeaderLoop,
)
from raftsched.node.observe.clock import FakeClock
from tests.support.stateutil import T0, S, finish, hb, ok, put, run_fire, start

pytestmark = pytest.mark.timeout(60)

TIMEOUT_MS = 3000
TIMEOUT_S = TIMEOUT_MS / 1000
ADDR = {"n1": "10.0.0.1:7001", "n2": "10.0.0.2:7001", "n3": "10.0.0.3:7001"}


class Replica:
    """The replica port over one in-process state, at Raft term ``term``."""

    def __init__(self, st: ClusterState, term: int, clock: FakeClock) -> None:
        self.st = st
        self.term = term
        self.clock = clock
        self.connected = {ADDR["n2"]: True, ADDR["n3"]: True}
        self.submitted: list[Any] = []
        #: Raft address -> when (the fake clock) that follower last answered an append;
        #: none: the leader's Raft thread reports nothing (as a follower's does).
        self.answered: dict[str, float] = {}

    def read(self, fn: Any) -> Any:
        return fn(self.st)

    #: Commands waiting in the Raft queue and the slowest follower's lag: admission
    #: control's signals (none here).
    pending = 0

    def follower_lag(self) -> int:
        return 0

    def take_tick_gap(self) -> float:
        return 0.0

    def connected_peers(self) -> dict[str, bool]:
        return dict(self.connected)

    def contact_ages(self) -> dict[str, float]:
        now = self.clock.monotonic()
        return {addr: now - at for addr, at in self.answered.items()}

    def submit(self, cmd: Any) -> concurrent.futures.Future[Any]:
        self.submitted.append(cmd)
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        fut.set_result(self.st.apply_map(cmd, self.term))
        self.st.take_effects()
        return fut

    def releases(self) -> list[Release]:
        return [c for c in self.submitted if isinstance(c, Release)]


class Leader:
    """n1, leading term 1 of a three-node cluster, on a fake clock."""

    def __init__(self, *, contact: bool = True) -> None:
        self.clock = FakeClock(wall_ms=T0)
        st = ClusterState()
        for n in ADDR:
            hb(st, n, at=T0 - 5 * S)
        self.raft = Replica(st, term=1, clock=self.clock)
        # ``contact``: every member lists the feature (else n3 lacks it).
        missing = (lambda _f: []) if contact else (
            lambda f: ["n3"] if f == CONTACT_FEATURE else [])
        nodes = [SimpleNamespace(id=n, raft=a, api=f"{a[:-4]}8001") for n, a in ADDR.items()]
        cfg: Any = SimpleNamespace(nodes=nodes, timing=SimpleNamespace(
            node_timeout_ms=TIMEOUT_MS, lookahead_ms=250, heartbeat_ms=500))
        raft: Any = self.raft
        self.loop = LeaderLoop(
            node_id="n1", raft=raft, raft_to_id=AddressBook.of(ADDR.items()),
            cfg=cfg, boot_ms=T0 - 60 * S, metrics=None, missing_feature=missing,
            clock=self.clock)
        assert asyncio.run(self.loop._establish(1))

    def heartbeat(self, node: str) -> None:
        """``node``'s heartbeat commits and the leader sees it applied."""
        at = self.clock.now_ms()
        hb(self.raft.st, node, at=at)
        self.loop.saw_heartbeat(node, at)

    def look(self) -> list[Release]:
        """One liveness check; the releases it committed (or tried to)."""
        before = len(self.raft.releases())
        asyncio.run(self.loop._liveness())
        return self.raft.releases()[before:]

    def alive(self, node: str) -> bool:
        return self.raft.st.nodes[node].alive

    def advance(self, seconds: float, beating: tuple[str, ...] = ()) -> None:
        """Let ``seconds`` pass in 0.1 s steps, the ``beating`` nodes heartbeating and
        the leader checking liveness at every step (as it does every 50 ms)."""
        for _ in range(round(seconds / 0.1)):
            self.clock.advance(0.1)
            for node in beating:
                self.heartbeat(node)
            assert not self.look(), f"released at +{self.clock.monotonic()}"


def test_a_silent_peer_is_lost_one_node_timeout_after_the_leader_started_never_before() -> None:
    ldr = Leader()
    # n3's last heartbeat is older than the leader: it still gets a full timeout.
    ldr.advance(TIMEOUT_S - 0.1, beating=("n2",))
    ldr.clock.advance(0.05)
    assert not ldr.look()
    ldr.clock.advance(0.1)
    [rel] = ldr.look()
    assert (rel.node, rel.scope, rel.term, rel.leader) == ("n3", "all", 1, "n1")
    assert not ldr.alive("n3") and ldr.alive("n2")
    ldr.clock.advance(1.0)
    assert not ldr.look(), "released twice"


def test_a_heartbeat_restarts_the_silence() -> None:
    ldr = Leader()
    ldr.advance(TIMEOUT_S - 0.5, beating=("n2",))
    ldr.heartbeat("n3")
    ldr.advance(TIMEOUT_S - 0.1, beating=("n2",))
    ldr.clock.advance(0.2)
    assert [r.node for r in ldr.look()] == ["n3"]


def test_after_its_own_pause_the_leader_releases_no_one_and_restarts_every_timer() -> None:
    ldr = Leader()
    ldr.advance(1.0, beating=("n2", "n3"))
    # SIGSTOPped for 4.5 s: nobody's heartbeat reached it meanwhile. The pause watcher
    # notices on waking, before the next liveness check.
    ldr.clock.advance(4.5)
    ldr.loop.note_pause(4.5)
    assert not ldr.look()
    # From the end of the pause n3 gets a whole node timeout again, n2 keeps beating.
    ldr.advance(TIMEOUT_S - 0.1, beating=("n2",))
    ldr.clock.advance(0.2)
    assert [r.node for r in ldr.look()] == ["n3"]
    assert ldr.alive("n2")


def test_a_pause_takes_only_its_own_time_out_of_a_silence_already_running() -> None:
    """Issue 27: a loaded leader whose loop stalls now and then still releases a dead
    peer about one node timeout after its last heartbeat, later only by the stalls (it
    restarted every timer at each stall, and under load released minutes late)."""
    ldr = Leader()
    ldr.advance(1.0, beating=("n2", "n3"))
    # n3 dies; the leader's loop stalls 0.4 s twice while n2 keeps beating.
    for _ in range(2):
        ldr.advance(0.5, beating=("n2",))
        ldr.clock.advance(0.4)
        ldr.heartbeat("n2")
        ldr.loop.note_pause(0.4)
        assert not ldr.look()
    # 1.8 s since n3's last heartbeat, 0.8 s of them stalls: 1.0 s of silence counted;
    # n3 is lost 3.9 s after its last heartbeat (restarting at each stall: 4.8 s).
    ldr.advance(TIMEOUT_S - 1.0 - 0.1, beating=("n2",))
    ldr.clock.advance(0.2)
    assert [r.node for r in ldr.look()] == ["n3"]
    assert ldr.alive("n2")


def test_without_the_pause_watcher_the_same_pause_would_release_both_peers() -> None:
    # The control: what the watcher prevents (a woken leader calling healthy nodes lost).
    ldr = Leader()
    ldr.advance(1.0, beating=("n2", "n3"))
    ldr.clock.advance(4.5)
    assert sorted(r.node for r in ldr.look()) == ["n2", "n3"]


def test_a_deposed_leaders_release_is_refused_and_looked_at_again() -> None:
    ldr = Leader()
    # n2 was elected in term 2 and committed its record; n1 has not heard yet.
    ldr.raft.term = 2
    ok(ldr.raft.st, LeaderRecord(node="n2", term=2, at=ldr.clock.now_ms(), skew={}))
    ldr.clock.advance(TIMEOUT_S + 0.5)
    tried = ldr.look()
    assert sorted(r.node for r in tried) == ["n2", "n3"]
    assert all(r.term == 1 for r in tried)
    assert ldr.alive("n2") and ldr.alive("n3"), "a release of an old term took effect"
    assert not ldr.loop.lost, "a refused release must be looked at again, not assumed"


def test_a_disconnected_peer_loses_unstarted_runs_after_the_grace_all_at_its_lease_end() -> None:
    ldr = Leader()
    st = ldr.raft.st
    put(st, "j", at=T0 - 5 * S)
    run_fire(st, "j", T0, node="n3", at=T0)
    [run_id] = st.by_node["n3"]
    ldr.heartbeat("n3")
    ldr.raft.connected[ADDR["n3"]] = False
    first = ldr.look()  # the disconnect is noticed now
    assert not first
    ldr.clock.advance(DISCONNECT_GRACE_S * 0.8)
    assert not ldr.look()
    ldr.clock.advance(DISCONNECT_GRACE_S * 0.4)
    [rel] = ldr.look()
    assert (rel.node, rel.scope) == ("n3", "assigned")
    assert run_id not in st.by_node.get("n3", ()) and ldr.alive("n3")
    # Its lease (counted from its newest heartbeat) ends before the node timeout.
    wait_s = lease.release_after_ms(TIMEOUT_MS) / 1000
    assert wait_s < TIMEOUT_S
    ldr.advance(wait_s - 0.2, beating=("n2",))
    ldr.clock.advance(0.2)
    [rel] = ldr.look()
    assert (rel.node, rel.scope, rel.hb) == ("n3", "all", T0)
    assert not ldr.alive("n3")


def test_the_leader_plans_only_on_live_nodes_it_reaches_that_are_not_draining() -> None:
    ldr = Leader()

    def live() -> list[str]:
        connected = ldr.raft.connected_peers()
        caps = ldr.raft.read(lambda st: ldr.loop._capacities(st, connected))
        return [c.node_id for c in caps]

    assert live() == ["n1", "n2", "n3"]
    ldr.raft.connected[ADDR["n3"]] = False  # its Raft connection to the leader is down
    assert live() == ["n1", "n2"]
    ldr.raft.connected[ADDR["n3"]] = True
    ldr.loop.lost.add("n2")  # lost to the leader (its runs are being released)
    assert live() == ["n1", "n3"]
    ldr.loop.lost.clear()
    ok(ldr.raft.st, {"op": "drain", "at": T0, "node": "n3", "draining": True})
    assert live() == ["n1", "n2"]


def test_an_idle_leader_looks_less_often_until_a_run_is_active_or_a_peer_is_cut_off() -> None:
    """Issue 31 item 3: with no run active, nothing needs a 50 ms look (no claim to
    release); an active run, or a peer cut off and not yet lost, brings it back."""
    ldr = Leader()
    st = ldr.raft.st
    assert ldr.loop._idle_delay() == QUIET_HOUSEKEEPING_S
    put(st, "j", at=T0 - 5 * S, schedule={"at": "2099-01-01T00:00:00Z"})
    assert ldr.loop._idle_delay() == QUIET_HOUSEKEEPING_S  # nothing due soon
    run_fire(st, "j", T0, node="n3", at=T0)
    assert ldr.loop._idle_delay() == HOUSEKEEPING_S  # a claim is held
    [run_id] = st.by_node["n3"]
    fence = st.runs[run_id].fence
    start(st, "n3", run_id, fence, T0)
    assert ldr.loop._idle_delay() == HOUSEKEEPING_S  # a run is running
    finish(st, "n3", run_id, fence, T0 + S)
    assert not st.runs
    assert ldr.loop._idle_delay() == QUIET_HOUSEKEEPING_S
    ldr.raft.connected[ADDR["n3"]] = False
    ldr.look()
    assert ldr.loop._idle_delay() == HOUSEKEEPING_S  # cut off, not yet lost
    ldr.clock.advance(TIMEOUT_S + 0.1)
    ldr.heartbeat("n2")
    assert [r.node for r in ldr.look()] == ["n3"]
    assert ldr.loop._idle_delay() == QUIET_HOUSEKEEPING_S  # lost: nothing left to release


def test_a_quiet_look_is_stretched_onto_the_grid_only_with_nothing_due_soon() -> None:
    """Issue 31 item 3: the quiet look's sleep ends on the node's shared grid of idle
    timers (core/ticks.py), which may lengthen it by up to a grid step; never when a
    job falls due within that step, so a plan is never made late by it."""
    ldr = Leader()
    st = ldr.raft.st
    ldr.loop._idle_delay()
    assert ldr.loop.quiet and ldr.loop.look_is_bound  # no job at all
    fire_ms = T0 + 60 * S
    when = datetime.fromtimestamp(fire_ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    put(st, "later", at=T0 - 5 * S, schedule={"at": when})
    assert ldr.loop._idle_delay() == QUIET_HOUSEKEEPING_S
    assert ldr.loop.look_is_bound  # its plan is a minute away
    lead_ms = fire_ms - ldr.loop.cfg.timing.lookahead_ms - T0
    ldr.clock.advance((lead_ms - 1100) / 1000)  # its plan is due 1.1 s from now
    assert ldr.loop._idle_delay() == QUIET_HOUSEKEEPING_S
    assert not ldr.loop.look_is_bound  # slept as asked: the plan comes 0.1 s after it
    ldr.clock.advance(0.5)
    assert ldr.loop._idle_delay() == pytest.approx(0.6)
    assert not ldr.loop.look_is_bound


def test_heartbeat_lateness_counts_from_the_period_the_node_was_in() -> None:
    """Issue 31 item 3: a node holding no run heartbeats at the idle period (a third of
    the node timeout), so its heartbeats a second apart are on time; a node holding a
    run heartbeats every 0.5 s, so the same gap is 0.5 s late (admission control's
    sign that a self-fence is near). (Before every member reads Raft contact.)"""
    ldr = Leader(contact=False)
    late: list[float] = []
    ldr.loop.admission.observe = (  # type: ignore[method-assign]
        lambda **kw: late.append(round(kw["heartbeat_late_s"], 3)))
    idle_s = lease.idle_heartbeat_ms(TIMEOUT_MS, 500) / 1000
    ldr.heartbeat("n3")  # the first seen: nothing to measure from
    for _ in range(3):
        ldr.clock.advance(idle_s)
        ldr.heartbeat("n3")
    assert late == [0.0, 0.0, 0.0]
    st = ldr.raft.st
    put(st, "j", at=T0 - 5 * S)
    run_fire(st, "j", T0, node="n3", at=T0)
    ldr.clock.advance(idle_s)
    ldr.heartbeat("n3")  # held nothing when the last applied: still the idle period
    ldr.clock.advance(idle_s)
    ldr.heartbeat("n3")
    assert late == [0.0, 0.0, 0.0, 0.0, idle_s - 0.5]


def _answering(ldr: Leader, seconds: float, *, answering: tuple[str, ...] = ("n3",),
               beating: tuple[str, ...] = ("n2",)) -> list[Release]:
    """``seconds`` in 0.1 s steps: the ``answering`` followers' Raft threads answer the
    leader's appends, the ``beating`` ones heartbeat; the releases committed."""
    out: list[Release] = []
    for _ in range(round(seconds / 0.1)):
        ldr.clock.advance(0.1)
        for node in answering:
            ldr.raft.answered[ADDR[node]] = ldr.clock.monotonic()
        for node in beating:
            ldr.heartbeat(node)
        out += ldr.look()
    return out


def test_an_idle_follower_answering_the_leader_lives_without_heartbeats_until_it_stops() -> None:
    """Issue 31 item 3: once every member lists ``contact``, a node holding no run is
    alive while its Raft thread answers the leader's appends (it heartbeats only every
    ten node timeouts); when its answers stop it is lost one node timeout after the
    last, never before."""
    ldr = Leader()
    assert not _answering(ldr, 4 * TIMEOUT_S), "an idle node answering was counted lost"
    last = ldr.clock.monotonic()
    assert not _answering(ldr, TIMEOUT_S - 0.1, answering=())
    [rel] = _answering(ldr, 0.2, answering=())
    assert (rel.node, rel.scope) == ("n3", "all")
    assert ldr.clock.monotonic() - last > TIMEOUT_S
    assert not ldr.alive("n3") and ldr.alive("n2")


def test_a_follower_holding_a_run_lives_by_its_heartbeats_alone() -> None:
    """Its Raft thread answering says nothing of the loop that starts and watches its
    runs: a node holding a run is lost one node timeout after its last heartbeat,
    answers or not."""
    ldr = Leader()
    st = ldr.raft.st
    put(st, "j", at=T0 - 5 * S)
    run_fire(st, "j", T0, node="n3", at=T0)
    ldr.heartbeat("n3")
    assert not _answering(ldr, TIMEOUT_S - 0.1)
    [rel] = _answering(ldr, 0.2)
    assert (rel.node, rel.scope, rel.reason.startswith("silent")) == ("n3", "all", True)


def test_until_every_member_lists_contact_an_idle_node_lives_by_its_heartbeats() -> None:
    """A rolling upgrade: an older member's leader would count a node heartbeating
    every ten node timeouts lost, so no node relies on contact until all list it."""
    ldr = Leader(contact=False)
    assert not _answering(ldr, TIMEOUT_S - 0.1)
    [rel] = _answering(ldr, 0.2)
    assert rel.node == "n3"


def test_an_idle_nodes_rare_heartbeats_are_not_late_once_contact_counts() -> None:
    """Its heartbeats are refreshes ten node timeouts apart: admission control does not
    read them as late."""
    ldr = Leader()
    late: list[float] = []
    ldr.loop.admission.observe = (  # type: ignore[method-assign]
        lambda **kw: late.append(kw["heartbeat_late_s"]))
    ldr.heartbeat("n3")
    ldr.clock.advance(lease.contact_heartbeat_ms(TIMEOUT_MS) / 1000)
    ldr.heartbeat("n3")
    assert late == []  # (once contact counts, no heartbeat is weighed for lateness)


def test_once_contact_counts_no_heartbeat_is_read_as_late() -> None:
    """A node that held a run at its last heartbeat, then held nothing here (its worker
    empty: it stopped heartbeating, living by its Raft answers), heartbeats again when
    new runs come: the leader cannot know it was idle between, and read that heartbeat
    as seconds late, throttling admission at every big instant (W5, 2026-12-06)."""
    ldr = Leader()
    late: list[float] = []
    ldr.loop.admission.observe = (  # type: ignore[method-assign]
        lambda **kw: late.append(kw["heartbeat_late_s"]))
    st = ldr.raft.st
    put(st, "j", at=T0 - 5 * S)
    run_fire(st, "j", T0, node="n3", at=T0)
    ldr.heartbeat("n3")  # holding: the busy period is expected next
    ldr.clock.advance(5.0)
    ldr.heartbeat("n3")
    assert late == []
