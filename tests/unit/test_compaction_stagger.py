"""Each node draws its own snapshot threshold (raftsched.node.replica.raft.compaction_entries):
with one threshold every member of a cluster, whose logs have the same length, wrote
its snapshot at the same moment, and a 5,000 runs/s storm lost every node's spare CPU
at once for ~5 s (bench/results/2026-12-04-snapshot-storm.md)."""

from __future__ import annotations

import random

from raftsched.node.replica.raft import LOG_COMPACTION_ENTRIES, compaction_entries


def test_thresholds_lie_between_the_base_and_half_as_much_again_and_differ() -> None:
    random.seed(7)
    drawn = [compaction_entries() for _ in range(200)]
    assert min(drawn) >= LOG_COMPACTION_ENTRIES
    assert max(drawn) <= LOG_COMPACTION_ENTRIES * 3 // 2
    # Three members rarely draw thresholds close together.
    assert len(set(drawn)) > 150
    assert compaction_entries(10) in range(10, 16)
