"""The Raft log is compacted by its bytes as well as by its entry count.

pysyncobj keeps every entry since the last snapshot in memory and compacts after a
number of entries (5,000 here). A million jobs put in batches of 1,000 are 1,000
entries of ~100 KB: ~100 MB of commands held until the 5,000th entry. A real replica
(its forked dump writer, a real data dir) with a low byte bound must compact after a
few big entries, and must not go on snapshotting once the log is under the bound.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from raftsched.core.clientcmds import PutJobs
from raftsched.core.commands import Heartbeat
from raftsched.faces.launcher import free_ports
from raftsched.node.replica import procs
from raftsched.node.replica.compat import byte_bound
from raftsched.node.replica.raft import DUMP_FILE, LOG_COMPACTION_ENTRIES, RaftNode
from tests.inprocess.test_snapshots import DEADLINE_S, T0, _await, _node

pytestmark = pytest.mark.timeout(120)

#: The byte bound of this test's replica: four or five of the ~108 KB entries below
#: pass it, and what is left after that one compaction never does (exactly one dump).
BOUND = 450 * 1024


@pytest.fixture
def replica(tmp_path: Any) -> Iterator[tuple[RaftNode, str]]:
    """A ready lone replica whose durable journal is adopted, and its dump file's path."""
    data_dir = str(tmp_path / "n1")
    node = _node(data_dir, f"127.0.0.1:{free_ports(1)[0]}")
    try:
        _await(node.ready, "a ready replica")
        _await(lambda: node.sync.rs_journal is not None, "the durable journal adopted")
        yield node, os.path.join(data_dir, DUMP_FILE)
    finally:
        node.destroy(wait_s=5.0)


def _big_put(i: int) -> PutJobs:
    """~100 KB of command: 100 specs carrying a 1 KB env value each."""
    return PutJobs(specs=tuple({"id": f"j{i}-{k}", "schedule": {"every": "1h"},
                                "command": ["true"], "env": {"PAD": "x" * 1000}}
                               for k in range(100)), at=T0 + i, rid=f"put-{i}")


def test_a_log_over_its_byte_bound_is_compacted_long_before_its_entry_count(
        replica, monkeypatch):
    trims = []
    monkeypatch.setattr(procs, "release_free_heap", lambda: trims.append(1))
    node, dump = replica
    sync = node.sync
    sync.rs_compaction_bytes = BOUND
    serializer = sync._SyncObj__serializer
    started: list[int] = []
    serialize = serializer.serialize

    def counted(data: Any, last_index: int) -> Any:
        started.append(last_index)
        return serialize(data, last_index)
    serializer.serialize = counted
    first = sync._SyncObj__raftLog[0][1]
    for i in range(6):  # ~600 KB in 6 entries: over the bound, far under 5,000
        assert node.submit(_big_put(i)).result(DEADLINE_S)["ok"]
    assert len(sync._SyncObj__raftLog) < LOG_COMPACTION_ENTRIES
    _await(lambda: os.path.exists(dump), "a snapshot, by the log's bytes")
    # The entries the snapshot covers are dropped from the log (those appended while
    # it was written stay, up to the next bound's worth of growth).
    _await(lambda: sync._SyncObj__raftLog[0][1] > first, "the log compacted")
    assert node.read(lambda st: len(st.jobs)) == 600
    # The dropped entries' heap pages are given back, off the Raft thread.
    _await(lambda: trims, "the heap trimmed after the compaction")
    # Under the bound again: the flag the bound set is withdrawn, and no other
    # snapshot starts however many ticks pass with small entries.
    dumps = len(started)
    assert dumps >= 1
    for i in range(20):
        node.submit(Heartbeat(node="w", boot=1, slots=1, queue=0,
                              at=T0 + 100 + i)).result(DEADLINE_S)
    assert sync._SyncObj__forceLogCompaction is False
    assert len(started) == dumps, started


@pytest.mark.parametrize(("forced", "ours", "grown", "want"), [
    (False, False, 11, (True, True)),    # over the bound: forced, by the bound
    (True, False, 11, (True, True)),     # over it with a caller's request: one dump
    (True, True, 10, (False, False)),    # back under: the bound's own flag withdrawn
    (True, False, 10, (True, False)),    # under, a caller's request: it stands
    (False, False, 10, (False, False)),  # under, nothing asked
])
def test_the_byte_bound_sets_and_withdraws_only_its_own_flag(forced, ours, grown, want):
    assert byte_bound(forced, ours, grown, 10) == want


def test_a_caller_forcing_while_the_bound_dumps_keeps_its_request(replica):
    """The caller forces while the bound's dump runs: the flag is the caller's now, and
    the next look, under the bound, leaves it set (another dump follows)."""
    sync = replica[0].sync
    sync._rs_forced_by_bytes = True  # as if the bound had started the running dump
    sync.forceLogCompaction()
    assert sync._rs_forced_by_bytes is False
    assert byte_bound(True, sync._rs_forced_by_bytes, 0, 10) == (True, False)


def test_a_caller_forcing_a_compaction_under_the_bound_still_gets_it(replica):
    """The bound withdraws only its own flag: a forced compaction (backups, tests)
    is not cancelled by a log under the bound."""
    node, dump = replica
    for i in range(3):
        node.submit(Heartbeat(node="w", boot=1, slots=1, queue=0,
                              at=T0 + i)).result(DEADLINE_S)
    assert node.sync.rs_journal.rs_log_bytes() < node.sync.rs_compaction_bytes
    node.sync.forceLogCompaction()
    _await(lambda: os.path.exists(dump), "the forced snapshot")
