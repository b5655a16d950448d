"""A node removed from the cluster while it ran learns it soon after no leader reaches it
any more, not at its next once-a-minute recheck of a peer that had matched: whether it
has no leader, or (connected to no one, pysyncobj never campaigns) goes on naming its
old leader with that connection down."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import pytest

from raftsched.node.service import membercheck

pytestmark = pytest.mark.timeout(60)


class FakeRaft:
    self_addr = "127.0.0.1:3"

    def __init__(self) -> None:
        self.leader: str | None = "127.0.0.1:1"
        self.connected = True

    def leader_addr(self) -> str | None:
        return self.leader

    def connected_peers(self) -> dict[str, bool]:
        return {"127.0.0.1:1": self.connected, "127.0.0.1:2": self.connected}

    def joining(self) -> bool:
        return False


@pytest.mark.parametrize("lost", ["no leader", "leader connection down"])
def test_a_matched_node_that_loses_its_leader_asks_again_and_stops_when_removed(
        monkeypatch, lost):
    monkeypatch.setattr(membercheck, "RETRY_S", 0.05)
    monkeypatch.setattr(membercheck, "RECHECK_S", 60.0)
    peers = [SimpleNamespace(id=f"n{i}", raft=f"127.0.0.1:{i}", api=f"127.0.0.1:{i}0")
             for i in (1, 2, 3)]
    raft = FakeRaft()
    fatal: list[tuple[str, str]] = []
    mc = membercheck.MemberCheck(
        node_id="n3", cfg=SimpleNamespace(nodes=peers), raft=raft,
        secret=lambda: None, fatal=lambda problem, event: fatal.append((problem, event)))
    removed = asyncio.Event()
    asked: list[tuple[str, float]] = []

    async def check(_mc: Any, peer: Any, _mine: Any) -> dict[str, Any]:
        asked.append((peer.id, time.monotonic()))
        if removed.is_set():
            return {"removed": True, "problem": f"n3 was removed (says {peer.id})"}
        return {}

    monkeypatch.setattr(membercheck, "_check", check)

    async def scenario() -> float:
        task = asyncio.create_task(membercheck.watch(mc))
        while {p for p, _ in asked} != {"n1", "n2"}:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.5)
        assert len(asked) == 2, "both peers matched: not asked again before the recheck"
        removed.set()
        # The members dropped us: no leader reaches us any more.
        if lost == "no leader":
            raft.leader = None
        else:
            raft.connected = False
        t_lost = time.monotonic()
        await asyncio.wait_for(task, 20)
        return t_lost

    t_lost = asyncio.run(scenario())
    assert fatal and fatal[0][1] == "node.removed", fatal
    assert "was removed" in fatal[0][0]
    # Asked again within a few RETRY_S of losing the leader (not after RECHECK_S = 60 s).
    assert asked[-1][1] - t_lost < 5.0
