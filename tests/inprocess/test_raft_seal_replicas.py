"""Issue 31 item 3: real replicas (pysyncobj, loopback TCP, journals) agree with every
message sealed by the AEAD, and while only some of them seal with it (a rolling
upgrade between its steps: every node opens both forms)."""

from __future__ import annotations

from typing import Any

import pytest

from raftsched.node.replica.raftkeys import AEAD_VERSION
from tests.support.raftcluster import T0, Cluster, establish, heartbeat

pytestmark = pytest.mark.timeout(120)


def _sealed_forms(c: Cluster, nid: str) -> list[bytes]:
    """The first byte of every message ``nid`` seals from now on."""
    keyring = c.nodes[nid].keyring
    assert keyring is not None
    forms: list[bytes] = []
    seal = keyring.encrypt_at_time

    def recording(data: bytes, at: int) -> Any:
        token = seal(data, at)
        forms.append(token[:1])
        return token

    keyring.encrypt_at_time = recording  # type: ignore[method-assign]
    return forms


@pytest.mark.parametrize("aead", [("n1", "n2", "n3"), ("n2",)], ids=["all", "one"])
def test_replicas_commit_with_messages_sealed_by_the_aead(tmp_path, aead) -> None:
    c = Cluster(tmp_path)
    try:
        for nid in aead:
            keyring = c.nodes[nid].keyring
            assert keyring is not None
            keyring.aead = True
        forms = {nid: _sealed_forms(c, nid) for nid in c.nodes}
        establish(c)
        for i, nid in enumerate(c.nodes):
            assert c.commit(nid, heartbeat(nid, T0 + i))["ok"]
        c.until(c.converged, "replicas with identical states")
        for nid, seen in forms.items():
            assert seen, f"{nid} sent nothing"
            want = AEAD_VERSION if nid in aead else b"g"  # b"g": a Fernet token
            assert set(seen) == {want}, (nid, set(seen))
    finally:
        c.close()
