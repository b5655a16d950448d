"""The cluster operations of the API (node/service/clusterops.py): a transfer of
leadership asked right after a cluster starts, before the state knows the target."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from raftsched.core.errors import InvalidArgument, NotReady
from raftsched.core.machine import ClusterState
from raftsched.node.service.clusterops import ClusterOps

SEED = [{"node": f"n{i}", "raft": f"127.0.0.1:700{i}", "api": f"127.0.0.1:710{i}"}
        for i in (1, 2, 3)]


class _Replica:
    """The replicated state as the service reads it (no Raft: what ClusterOps asks)."""

    def __init__(self, st: ClusterState) -> None:
        self.st = st

    def read(self, fn: Any) -> Any:
        return fn(self.st)


class _Writes:
    def __init__(self) -> None:
        self.submitted: list[Any] = []

    async def submit(self, cmd: Any, rid: Any) -> dict[str, Any]:
        self.submitted.append(cmd)
        return {"from": "n1", "to": cmd.to, "term": 1}


def _ops(st: ClusterState, writes: _Writes) -> ClusterOps:
    return ClusterOps(raft=_Replica(st), writes=writes, reads=None, cfg=None,  # type: ignore[arg-type]
                      node_ids=lambda: ["n1", "n2", "n3"], build_status=dict)


def test_a_transfer_to_a_configured_node_the_state_does_not_know_yet_is_retried_not_refused():
    st, writes = ClusterState(), _Writes()
    ops = _ops(st, writes)
    # Before the first leader's membership commits: NotReady (the client tries again).
    with pytest.raises(NotReady, match="n2 is not in the cluster's state yet"):
        asyncio.run(ops.transfer_leader({"to": "n2"}))
    assert writes.submitted == []
    with pytest.raises(InvalidArgument, match="to"):
        asyncio.run(ops.transfer_leader({"to": "n9"}))  # not in the config at all
    assert st.apply_map({"op": "member", "action": "seed", "members": SEED, "at": 1})["ok"]
    assert asyncio.run(ops.transfer_leader({"to": "n2"}))["to"] == "n2"
    assert asyncio.run(ops.transfer_leader({}))["to"] is None  # anywhere: nothing to know
    assert [c.to for c in writes.submitted] == ["n2", None]
