"""Snapshots of a real replica (pysyncobj's forked dump writer, a real data dir): with
group commit on, a snapshot is written and the log behind it dropped, a restart loads
it, and neither the snapshot nor a load carries the replica's node-local attributes.

With ``durability = "sync"`` every snapshot used to fail in its forked writer
(pysyncobj pickles every attribute its SyncObj gained after ``__init__``, and the
durable journal's open file cannot be pickled): the log grew without bound, a restart
replayed all of it, and a failing writer was forked again at every tick.
"""

from __future__ import annotations

import gzip
import os
import time
from collections.abc import Callable
from typing import Any

import pytest
from pysyncobj import pickle as raft_pickle

from raftsched.core.codec import encode_state
from raftsched.core.commands import Heartbeat
from raftsched.core.machine import ClusterState
from raftsched.faces.launcher import free_ports
from raftsched.node.config.config import Timing
from raftsched.node.replica.compat import raft_now
from raftsched.node.replica.raft import DUMP_FILE, RaftNode, write_seed_dump

pytestmark = pytest.mark.timeout(120)

#: Generous bound on each wait (a loaded machine ticks slowly).
DEADLINE_S = 40.0
T0 = 20_000 * 86_400 * 1000


def _await(cond: Callable[[], Any], what: str) -> Any:
    end = time.monotonic() + DEADLINE_S
    while time.monotonic() < end:
        got = cond()
        if got:
            return got
        time.sleep(0.02)
    raise AssertionError(f"not within {DEADLINE_S} s: {what}")


def _node(data_dir: str, addr: str) -> RaftNode:
    return RaftNode(self_addr=addr, peers=[], data_dir=data_dir,
                    secret="in-process-test-secret-0123456789", timing=Timing(),
                    on_effects=lambda _effects: None)


def _dump_attrs(path: str) -> dict[str, Any]:
    """The SyncObj attributes a dump file holds (pysyncobj's own format)."""
    with open(path, "rb") as f, gzip.GzipFile(fileobj=f, mode="rb") as g:
        data = raft_pickle.load(g)
    return dict(data[0][0])


def test_a_durable_replica_writes_its_snapshot_drops_the_log_and_restarts_from_it(tmp_path):
    data_dir, addr = str(tmp_path / "n1"), f"127.0.0.1:{free_ports(1)[0]}"
    node = _node(data_dir, addr)
    try:
        _await(node.ready, "a ready replica")
        assert node.sync._rs_sync_journal
        for i in range(40):
            node.submit(Heartbeat(node=f"w{i}", boot=1, slots=4, queue=0,
                                  at=T0 + i)).result(DEADLINE_S)
        _await(lambda: node.sync.rs_journal is not None, "the durable journal adopted")
        log_before = len(node.sync._SyncObj__raftLog)
        node.sync.forceLogCompaction()
        dump = os.path.join(data_dir, DUMP_FILE)
        _await(lambda: os.path.exists(dump), "a snapshot file")
        # The compacted prefix is dropped once the writer reports success.
        _await(lambda: len(node.sync._SyncObj__raftLog) < log_before, "the log compacted")
        want = node.read(encode_state)
    finally:
        node.destroy(wait_s=5.0)
    attrs = _dump_attrs(dump)
    assert not [k for k in attrs if k.startswith(("_rs_", "rs_"))], sorted(attrs)
    again = _node(data_dir, addr)
    try:
        _await(again.ready, "the restarted replica ready")
        _await(lambda: again.read(encode_state) == want, "the state restored")
        assert again.read(lambda st: len(st.nodes)) == 40
    finally:
        again.destroy(wait_s=5.0)


def test_loading_a_snapshot_keeps_this_replicas_own_attributes(tmp_path):
    """A snapshot written before node-local attributes were left out (or sent by a
    leader) must not set them here: ``_rs_adopted`` would skip making the journal
    durable, ``_rs_hold_until`` (another process's clock) would stop all appends."""
    data_dir, addr = str(tmp_path / "n1"), f"127.0.0.1:{free_ports(1)[0]}"
    os.makedirs(data_dir)
    state = ClusterState()
    path = write_seed_dump(data_dir, encode_state(state), 5, [addr])
    with open(path, "rb") as f, gzip.GzipFile(fileobj=f, mode="rb") as g:
        data = raft_pickle.load(g)
    data[0][0].update({"_rs_adopted": True, "_rs_hold_until": 1e18, "rs_elections": 99})
    with open(path, "wb") as f, gzip.GzipFile(fileobj=f, mode="wb") as g:
        raft_pickle.dump(data, g)
    node = _node(data_dir, addr)
    try:
        _await(node.ready, "a ready replica")
        assert node.sync._rs_hold_until < 1e18 and node.sync.rs_elections < 99
        _await(lambda: node.sync.rs_journal is not None, "the durable journal adopted")
        # Appends are not held: a command commits.
        node.submit(Heartbeat(node="w", boot=1, slots=4, queue=0, at=T0)).result(DEADLINE_S)
    finally:
        node.destroy(wait_s=5.0)


def test_a_follower_behind_the_compacted_log_catches_up_from_the_leaders_snapshot(tmp_path):
    """Group commit on everywhere: a follower that lost its data dir comes back after
    the leader committed more and compacted its log (the entries it lacks are gone from
    the leader's journal): it is sent the leader's snapshot, loads it, writes it as its
    own, and ends with the same state as the others."""
    import shutil

    from tests.support.raftcluster import Cluster, establish, heartbeat

    c = Cluster(tmp_path)
    try:
        leader, _term = establish(c)
        lagging = next(n for n in c.nodes if n != leader)
        template = c.nodes[lagging]
        peers = list(template.peers)
        timing = Timing(election_timeout_min_ms=2000, election_timeout_max_ms=4000,
                        connection_timeout_ms=8000, leader_fallback_ms=8000)  # as Cluster's
        template.destroy(wait_s=5.0)
        shutil.rmtree(str(tmp_path / lagging))
        c.paused.add(lagging)
        for i in range(30):
            assert c.commit(leader, heartbeat(f"w{i}", T0 + i))["ok"]
        lead = c.nodes[leader].sync
        before = len(lead._SyncObj__raftLog)
        lead.forceLogCompaction()
        c.until(lambda: len(lead._SyncObj__raftLog) < before, "the leader's log compacted")
        assert lead._SyncObj__raftLog[0][1] > 2  # the entries a new follower needs: gone
        c.nodes[lagging] = RaftNode(
            self_addr=c.addr[lagging], peers=peers, data_dir=str(tmp_path / lagging),
            secret="in-process-test-secret-0123456789", timing=timing,
            on_effects=lambda _effects: None, auto_tick=False)
        c.paused.clear()
        c.until(c.converged, "the follower caught up")
        assert c.nodes[lagging].read(lambda st: len(st.nodes)) >= 30
        assert os.path.exists(os.path.join(str(tmp_path / lagging), DUMP_FILE))
        assert c.nodes[lagging].sync._rs_hold_until <= raft_now()
    finally:
        c.close()
