"""A forged death certificate is refused and submits nothing (issue 28's regression
list): a proof not made with a secret of this cluster, for this node and this
incarnation, is ``Unauthenticated``; only a genuine proof reaches the log."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from raftsched.core.commands import Certify
from raftsched.core.errors import Unauthenticated
from raftsched.node.worker.certify import CertifyOps
from raftsched.node.worker.guard import proof


class _Writes:
    def __init__(self) -> None:
        self.submitted: list[Any] = []

    async def submit(self, cmd: Any, rid: Any) -> dict[str, Any]:
        self.submitted.append(cmd)
        return {"released": 2, "already": False}


def _ops(writes: _Writes) -> CertifyOps:
    return CertifyOps(raft=None, writes=writes, node_id="n1", boot=5,  # type: ignore[arg-type]
                      secrets=lambda: ["the-cluster-secret-0123456789", "the-old-one-0123456"],
                      cluster_id=lambda: "c-1", missing_feature=lambda _f: [])


@pytest.mark.parametrize("forged", [
    "0" * 64,                                                  # made up
    proof("another-clusters-secret-012345", "c-1", "n3", 1700),  # another secret
    proof("the-cluster-secret-0123456789", "c-2", "n3", 1700),  # another cluster
    proof("the-cluster-secret-0123456789", "c-1", "n2", 1700),  # another node
    proof("the-cluster-secret-0123456789", "c-1", "n3", 1699),  # another incarnation
    None,
])
def test_a_forged_certificate_is_refused_and_submits_nothing(forged: Any) -> None:
    writes = _Writes()
    with pytest.raises(Unauthenticated):
        asyncio.run(_ops(writes).certify({"node": "n3", "boot": 1700, "proof": forged}))
    assert writes.submitted == []


def test_a_genuine_certificate_made_with_either_secret_of_a_rotation_is_submitted() -> None:
    for secret in ("the-cluster-secret-0123456789", "the-old-one-0123456"):
        writes = _Writes()
        reply = asyncio.run(_ops(writes).certify(
            {"node": "n3", "boot": 1700, "proof": proof(secret, "c-1", "n3", 1700)}))
        assert reply == {"released": 2, "already": False}
        assert writes.submitted == [Certify(node="n3", boot=1700, by="guard", at=0)]
