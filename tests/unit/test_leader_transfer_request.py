"""An operator's leadership transfer is carried out even when it applies before the new
leader's loop has seen its own leadership record commit (CI, loaded: the request applied
in that gap was dropped, while the operator had been answered ``from``/``to``; the
transfer never happened and the drain test waited 20 s for it)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from raftsched.core.machine import ClusterState
from raftsched.node.config.addressbook import AddressBook
from raftsched.node.leader.leaderloop import LeaderLoop
from raftsched.node.observe.clock import FakeClock
from tests.support.stateutil import T0, S, hb
from tests.unit.test_leader_liveness import ADDR, Replica

pytestmark = pytest.mark.timeout(60)


def _loop() -> tuple[LeaderLoop, list[Any]]:
    st = ClusterState()
    for n in ADDR:
        hb(st, n, at=T0 - 5 * S)
    nodes = [SimpleNamespace(id=n, raft=a, api=f"{a[:-4]}8001") for n, a in ADDR.items()]
    cfg: Any = SimpleNamespace(nodes=nodes, timing=SimpleNamespace(
        node_timeout_ms=3000, lookahead_ms=250, heartbeat_ms=500))
    clock = FakeClock(wall_ms=T0)
    raft: Any = Replica(st, term=2, clock=clock)
    loop = LeaderLoop(node_id="n1", raft=raft, raft_to_id=AddressBook.of(ADDR.items()),
                      cfg=cfg, boot_ms=T0 - 60 * S, metrics=None,
                      missing_feature=lambda _f: [], clock=clock)
    asked: list[Any] = []

    async def transfer(to: str | None = None, wait_s: float = 2.0) -> bool:
        asked.append(to)
        return True

    loop.transfer = transfer  # type: ignore[method-assign]
    return loop, asked


def test_a_request_applied_before_the_loop_is_active_is_carried_out_once_it_is() -> None:
    loop, asked = _loop()
    assert not loop.active
    loop.request_transfer("n2", 2)  # applied in the gap: our record in, loop not yet told
    assert asyncio.run(loop._establish(2))
    asyncio.run(loop._hand_over_if_draining())
    assert asked == ["n2"]
    asyncio.run(loop._hand_over_if_draining())
    assert asked == ["n2"], "carried out twice"


def test_a_request_to_another_terms_leader_is_not_carried_out() -> None:
    loop, asked = _loop()
    loop.request_transfer("n3", 1)  # asked of term 1's leader; we lead term 2
    assert asyncio.run(loop._establish(2))
    asyncio.run(loop._hand_over_if_draining())
    assert asked == []


def test_a_request_that_does_not_move_is_tried_again_a_bounded_number_of_times() -> None:
    loop, asked = _loop()

    async def refused(to: str | None = None, wait_s: float = 2.0) -> bool:
        asked.append(to)
        return False  # e.g. the target lags and refuses TimeoutNow

    loop.transfer = refused  # type: ignore[method-assign]
    assert asyncio.run(loop._establish(2))
    loop.request_transfer("n2", 2)
    for _ in range(6):
        asyncio.run(loop._hand_over_if_draining())
    assert asked == ["n2"] * 3


def test_a_followers_loop_sleeps_until_its_role_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    """An idle follower's loop does not poll every 50 ms (20 wake-ups a second for
    nothing): it sleeps until the node's role change wakes it, and then leads."""
    from raftsched.node.leader import leaderloop

    monkeypatch.setattr(leaderloop, "FOLLOWER_S", 60.0)  # only the wake can end the sleep
    loop, _ = _loop()
    looks: list[int | None] = []
    term: list[int | None] = [None]
    loop.raft.ready = lambda: True
    loop.raft.leader_term = lambda: looks.append(term[0]) or term[0]
    established: list[int] = []

    async def establish(t: int) -> bool:
        established.append(t)
        loop.stop()
        return False

    loop._establish = establish  # type: ignore[method-assign]

    async def scenario() -> None:
        task = asyncio.create_task(loop._run())
        for _ in range(1000):  # its first look, however loaded the host
            if looks:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.5)  # ten housekeeping periods
        assert looks == [None], "a follower's loop polled"
        term[0] = 2
        loop.wake()  # what Node does when pysyncobj reports the role change
        await asyncio.wait_for(task, 10)

    asyncio.run(scenario())
    assert established == [2]
