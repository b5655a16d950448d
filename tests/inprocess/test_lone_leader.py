"""A lone node (the embedded default) commits without waiting for its tick timer.

Its Raft thread ticks at the append period (50 ms) like any node's; it used to tick
every 2 ms instead, because no peer's answer wakes a lone leader's poll: its own next
tick asks for the journal's sync (or, unsynced, commits), and would have come only at
the timer. That cost an idle embedded node 1.4 % of a core (~480 empty ticks a second)
and each commit ~2 ms. Now the leader asks for its sync in the very tick that appends,
and an unsynced lone leader wakes its own poll. A real ``RaftNode`` (real pysyncobj,
real journal), ticked by the test: each step below is one tick, no timer involved.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from raftsched.faces.launcher import free_ports
from raftsched.node.config.config import Timing
from raftsched.node.replica.raft import RaftNode
from tests.support.raftcluster import DEADLINE_S, T0, heartbeat

pytestmark = pytest.mark.timeout(90)
#: A tick's wait that only a missing wake-up would use up.
WAIT_S = 20.0


def _lone(tmp_path, durability: str) -> RaftNode:
    node = RaftNode(self_addr=f"127.0.0.1:{free_ports(1)[0]}", peers=[],
                    data_dir=str(tmp_path / "n1"), secret="lone-leader-test-secret-0123456789",
                    timing=Timing(), on_effects=lambda _effects: None, auto_tick=False,
                    durability=durability)
    try:
        _tick_until(node, lambda: node.leader_term() is not None, "a lone leader")
    except BaseException:
        node.destroy()
        raise
    return node


def _tick_until(node: RaftNode, cond: Callable[[], object], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not cond():
        assert time.monotonic() < deadline, f"no {what} within {DEADLINE_S}s"
        node.tick(0.01)


def _appended(node: RaftNode, before: int) -> bool:
    return node.sync._SyncObj__getCurrentLogIndex() > before


def test_a_lone_leader_asks_for_its_sync_in_the_tick_that_appends(tmp_path) -> None:
    node = _lone(tmp_path, "sync")
    try:
        journal = node.sync.rs_journal
        worker = journal.rs_worker
        _tick_until(node, lambda: not worker.busy() and not journal.rs_dirty
                    and journal.rs_synced_index == journal.rs_last_index(),
                    "a journal synced to its end, no sync in flight")
        before = node.sync._SyncObj__getCurrentLogIndex()
        fut = node.submit(heartbeat("n1", T0))
        node.tick(0)  # takes the command from the queue and appends it
        assert _appended(node, before)
        # The sync was asked in that tick: once it is done, the next tick commits and
        # applies. (Asked only at the next tick's start, the sync would still be to
        # come when that tick commits, and the command would wait another tick.)
        worker.wait_idle()
        node.tick(0)
        assert fut.done() and fut.result()["ok"]
    finally:
        node.destroy()


def test_a_lone_node_asks_for_the_sync_of_its_first_entry_as_it_becomes_leader(
        tmp_path) -> None:
    # pysyncobj appends a new leader's no-op in the tick's election step, before the
    # tick takes commands: that append asks for its sync too (a node starting up
    # applies its replayed journal, and says it is ready, once the no-op commits).
    node = _lone(tmp_path, "sync")  # ticked until the tick that made it leader
    try:
        last = node.sync._SyncObj__getCurrentLogIndex()
        assert node.sync._SyncObj__raftLastApplied < last  # the no-op, not yet applied
        node.sync.rs_journal.rs_worker.wait_idle()
        node.tick(0)
        assert node.sync._SyncObj__raftLastApplied == last
    finally:
        node.destroy()


def test_an_unsynced_lone_leader_wakes_its_own_poll_after_it_appends(tmp_path) -> None:
    node = _lone(tmp_path, "none")
    try:
        before = node.sync._SyncObj__getCurrentLogIndex()
        fut = node.submit(heartbeat("n1", T0))
        node.sync._poller.poll(0)  # the submission's own wake-up, read (as a busy tick would)
        # The tick that appends it: its poll has nothing else to wake it, and the next
        # tick (which commits) must not wait for the timer; the leader woke it itself.
        t0 = time.monotonic()
        node.tick(WAIT_S)
        assert _appended(node, before)
        assert time.monotonic() - t0 < WAIT_S / 2, "the appending tick waited for its timer"
        node.tick(0)
        assert fut.done() and fut.result()["ok"]
    finally:
        node.destroy()
