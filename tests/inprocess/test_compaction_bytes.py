"""The Raft log is compacted by its bytes as well as by its entry count.

pysyncobj keeps every entry since the last snapshot in memory and compacts after a
number of entries (5,000 here). A million jobs put in batches of 1,000 are 1,000
entries of ~100 KB: ~100 MB of commands held until the 5,000th entry. A real replica
(its forked dump writer, a real data dir) with a low byte bound must compact after a
few big entries, and must not go on snapshotting once the log is under the bound.
"""

from __future__ import annotations

import os

import pytest

from raftsched.core.clientcmds import PutJobs
from raftsched.core.commands import Heartbeat
from raftsched.faces.launcher import free_ports
from raftsched.node.replica import procs
from raftsched.node.replica.raft import DUMP_FILE, LOG_COMPACTION_ENTRIES
from tests.inprocess.test_snapshots import DEADLINE_S, T0, _await, _node

pytestmark = pytest.mark.timeout(120)

#: The byte bound of this test's replica: a few of the entries below pass it.
BOUND = 256 * 1024


def _big_put(i: int) -> PutJobs:
    """~100 KB of command: 100 specs carrying a 1 KB env value each."""
    return PutJobs(specs=tuple({"id": f"j{i}-{k}", "schedule": {"every": "1h"},
                                "command": ["true"], "env": {"PAD": "x" * 1000}}
                               for k in range(100)), at=T0 + i, rid=f"put-{i}")


def test_a_log_over_its_byte_bound_is_compacted_long_before_its_entry_count(
        tmp_path, monkeypatch):
    trims = []
    monkeypatch.setattr(procs, "release_free_heap", lambda: trims.append(1))
    data_dir, addr = str(tmp_path / "n1"), f"127.0.0.1:{free_ports(1)[0]}"
    node = _node(data_dir, addr)
    dump = os.path.join(data_dir, DUMP_FILE)
    try:
        _await(node.ready, "a ready replica")
        _await(lambda: node.sync.rs_journal is not None, "the durable journal adopted")
        sync = node.sync
        sync.rs_compaction_bytes = BOUND
        for i in range(6):  # ~600 KB in 6 entries: over the bound, far under 5,000
            assert node.submit(_big_put(i)).result(DEADLINE_S)["ok"]
        assert len(sync._SyncObj__raftLog) < LOG_COMPACTION_ENTRIES
        _await(lambda: os.path.exists(dump), "a snapshot, by the log's bytes")
        _await(lambda: sync.rs_journal.rs_log_bytes() < BOUND, "the log compacted")
        assert node.read(lambda st: len(st.jobs)) == 600
        # The dropped entries' heap pages are given back, off the Raft thread.
        _await(lambda: trims, "the heap trimmed after the compaction")
        # Under the bound again: the flag the bound set is withdrawn, and no other
        # snapshot starts however many ticks pass with small entries.
        serialized = sync._SyncObj__lastSerializedEntry
        for i in range(20):
            node.submit(Heartbeat(node="w", boot=1, slots=1, queue=0,
                                  at=T0 + 100 + i)).result(DEADLINE_S)
        assert sync._SyncObj__forceLogCompaction is False
        assert sync._SyncObj__lastSerializedEntry == serialized
    finally:
        node.destroy(wait_s=5.0)


def test_a_caller_forcing_a_compaction_under_the_bound_still_gets_it(tmp_path):
    """The bound withdraws only its own flag: a forced compaction (backups, tests)
    is not cancelled by a log under the bound."""
    data_dir, addr = str(tmp_path / "n1"), f"127.0.0.1:{free_ports(1)[0]}"
    node = _node(data_dir, addr)
    dump = os.path.join(data_dir, DUMP_FILE)
    try:
        _await(node.ready, "a ready replica")
        _await(lambda: node.sync.rs_journal is not None, "the durable journal adopted")
        for i in range(3):
            node.submit(Heartbeat(node="w", boot=1, slots=1, queue=0,
                                  at=T0 + i)).result(DEADLINE_S)
        assert node.sync.rs_journal.rs_log_bytes() < node.sync.rs_compaction_bytes
        node.sync.forceLogCompaction()
        _await(lambda: os.path.exists(dump), "the forced snapshot")
    finally:
        node.destroy(wait_s=5.0)
