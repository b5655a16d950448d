"""The node's view of Raft answers before its journal is adopted (and when adopting it
failed for good: the node is then unavailable, and `status` is what an operator runs)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from raftsched.node.replica.durable import SyncStats
from raftsched.node.replica.raftview import RaftView

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("sync_journal, mode", [(True, "sync"), (False, "none")])
def test_durability_stats_without_a_journal(sync_journal: bool, mode: str) -> None:
    view = RaftView()
    view.sync = SimpleNamespace(rs_journal=None, _rs_sync_journal=sync_journal)  # type: ignore[assignment]
    assert view.durability_stats() == SyncStats(mode=mode, syncs=0, sync_seconds=0.0,
                                                max_sync_seconds=0.0, synced_index=0)
