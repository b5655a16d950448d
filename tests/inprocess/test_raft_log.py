"""A follower's log under append_entries: Raft's §5.3 rule, on a real pysyncobj object.

pysyncobj 0.3.17 truncates a follower's log after ``prevLogIdx`` whenever it holds
more, even when the leader re-sends entries the follower already holds; acknowledged,
committed, applied entries disappear (and the commit index goes back). raftsched's
``RaftSyncObj`` keeps them and truncates only from a real conflict. The messages are
fed straight to the follower's handler (no leader process: the exact re-send order is
what is under test, and a real cluster produces it only under load, by chance).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from pysyncobj import SyncObj, SyncObjConf

from raftsched.node.replica.compat import install, known_prefix
from raftsched.node.replica.raftsync import RaftSyncObj
from tests.support.harness import free_ports

pytestmark = pytest.mark.timeout(30)


def _follower(cls: type[SyncObj]) -> Iterator[SyncObj]:
    me, peer = free_ports(2)
    f = cls(f"127.0.0.1:{me}", [f"127.0.0.1:{peer}"], conf=SyncObjConf(autoTick=False))
    try:
        yield f
    finally:
        f.destroy()


@pytest.fixture
def follower() -> Iterator[SyncObj]:
    install()  # as a node does: also the filter of pysyncobj's false truncation line
    yield from _follower(RaftSyncObj)


@pytest.fixture
def stock_follower() -> Iterator[SyncObj]:
    yield from _follower(SyncObj)


def _log(f: SyncObj) -> list[tuple[int, int]]:
    return [(e[1], e[2]) for e in f._SyncObj__raftLog]


def _send(f: SyncObj, *, term: int, prev: tuple[int, int], entries: list[tuple[int, int]],
          commit: int) -> None:
    leader = next(iter(f.otherNodes))
    f._SyncObj__onMessageReceived(leader, {
        "type": "append_entries", "term": term, "commit_index": commit,
        "entries": [(b"\x00c%d.%d" % (i, t), i, t) for i, t in entries],
        "prevLogIdx": prev[0], "prevLogTerm": prev[1]})


def _five(f: SyncObj) -> None:
    """Entries 2..6 of term 1, all committed and applied (the initial entry is (1, 0))."""
    _send(f, term=1, prev=(1, 0), entries=[(i, 1) for i in range(2, 7)], commit=6)
    assert _log(f)[-1] == (6, 1) and f.raftCommitIndex == 6
    # As if applied (these byte strings are no commands a consumer could apply).
    f._SyncObj__raftLastApplied = 6


TRUNCATING = "truncating already-applied"


def test_stock_pysyncobj_drops_committed_entries_on_a_stale_resend(stock_follower, caplog):
    _five(stock_follower)
    with caplog.at_level(logging.CRITICAL, logger="pysyncobj.syncobj"):
        _send(stock_follower, term=1, prev=(2, 1), entries=[(3, 1), (4, 1)], commit=6)
    assert _log(stock_follower)[-1] == (4, 1), "upstream fixed it: RaftSyncObj may go"
    assert stock_follower.raftCommitIndex == 4
    assert any(TRUNCATING in r.getMessage() for r in caplog.records)


def test_a_stale_resend_keeps_acknowledged_entries_and_the_commit_index(follower, caplog):
    _five(follower)
    with caplog.at_level(logging.CRITICAL, logger="pysyncobj.syncobj"):
        _send(follower, term=1, prev=(2, 1), entries=[(3, 1), (4, 1)], commit=6)
    assert _log(follower) == [(1, 0)] + [(i, 1) for i in range(2, 7)]
    assert follower.raftCommitIndex == 6
    assert not [r for r in caplog.records if TRUNCATING in r.getMessage()], \
        "nothing was truncated: no CRITICAL line saying so"


def test_readiness_still_sees_the_leaders_commit_index(follower):
    """The cap on a re-send's commit index is for this node's commit only: readiness
    (caught up with the leader, which gates the worker) must not come early."""
    _five(follower)
    _send(follower, term=1, prev=(2, 1), entries=[(3, 1), (4, 1)], commit=10)
    assert follower._SyncObj__leaderCommitIndex == 10
    assert follower.raftCommitIndex == 6


def test_a_resend_that_also_carries_new_entries_appends_them(follower):
    _five(follower)
    _send(follower, term=1, prev=(4, 1), entries=[(5, 1), (6, 1), (7, 1), (8, 1)], commit=8)
    assert _log(follower)[-3:] == [(6, 1), (7, 1), (8, 1)] and len(_log(follower)) == 8
    assert follower.raftCommitIndex == 8


def test_a_conflicting_entry_truncates_from_the_conflict(follower):
    _send(follower, term=1, prev=(1, 0), entries=[(i, 1) for i in range(2, 7)], commit=3)
    # A new leader of term 2 holds entries 2..3 of term 1 and its own 4..5.
    _send(follower, term=2, prev=(2, 1), entries=[(3, 1), (4, 2), (5, 2)], commit=3)
    assert _log(follower) == [(1, 0), (2, 1), (3, 1), (4, 2), (5, 2)]
    assert follower.raftCommitIndex == 3


def test_the_commit_index_never_covers_entries_the_leader_did_not_vouch_for(follower):
    # Uncommitted entries 2..6 of term 1; a term-2 leader re-sends 2..3 only (it holds
    # something else at 4..): the follower keeps 4..6 for now, but may not commit them.
    _send(follower, term=1, prev=(1, 0), entries=[(i, 1) for i in range(2, 7)], commit=1)
    _send(follower, term=2, prev=(1, 0), entries=[(2, 1), (3, 1)], commit=5)
    assert follower.raftCommitIndex == 3


def _answers(f: SyncObj, monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The next_node_idx messages the follower sends from now on."""
    sent: list[dict[str, Any]] = []
    transport = f._SyncObj__transport
    monkeypatch.setattr(transport, "send", lambda node, msg: sent.append(msg) or True)
    return sent


def _conflicting_tail(f: SyncObj) -> None:
    """Entries 2..3 of term 1 committed, then 4..200 of term 2 from a leader that never
    committed them (cut off, it went on appending what was forwarded to it)."""
    _send(f, term=1, prev=(1, 0), entries=[(2, 1), (3, 1)], commit=3)
    _send(f, term=2, prev=(3, 1), entries=[(i, 2) for i in range(4, 201)], commit=3)


def test_stock_pysyncobj_backs_a_leader_up_one_entry_per_round_trip(stock_follower,
                                                                    monkeypatch):
    _conflicting_tail(stock_follower)
    sent = _answers(stock_follower, monkeypatch)
    # The term-3 leader holds 2..3 and its own entries of term 3 from 4 on.
    _send(stock_follower, term=3, prev=(200, 3), entries=[], commit=3)
    assert [(m["next_node_idx"], m["reset"]) for m in sent] == [(200, True)], \
        "upstream backs up faster now: RaftSyncObj's extra answer may go"


def test_a_conflicting_tail_backs_the_leader_up_to_the_commit_index_at_once(follower,
                                                                            monkeypatch):
    """Issue 14 nemesis, 3 nodes: tails conflicting over hundreds of entries took a new
    leader one 50 ms round trip per entry to walk back; with faults every few seconds
    no leader committed anything for minutes. The follower now also names the entry
    after its commit index, which the leader holds for certain."""
    _conflicting_tail(follower)
    sent = _answers(follower, monkeypatch)
    _send(follower, term=3, prev=(200, 3), entries=[], commit=3)
    assert [(m["next_node_idx"], m["reset"], m["success"]) for m in sent][-1] == \
        (4, True, False)
    # The leader's next append from there matches and replaces the tail.
    sent.clear()
    _send(follower, term=3, prev=(3, 1), entries=[(4, 3), (5, 3)], commit=5)
    assert _log(follower) == [(1, 0), (2, 1), (3, 1), (4, 3), (5, 3)]
    assert follower.raftCommitIndex == 5
    assert [(m["next_node_idx"], m["success"]) for m in sent] == [(6, True)]


def test_no_extra_answer_without_a_conflict_or_from_a_stale_leader(follower, monkeypatch):
    _conflicting_tail(follower)
    sent = _answers(follower, monkeypatch)
    _send(follower, term=2, prev=(200, 2), entries=[], commit=3)  # matches: success
    _send(follower, term=1, prev=(200, 1), entries=[], commit=3)  # an older term
    assert [(m["next_node_idx"], m["success"]) for m in sent] == [(201, True)]


@pytest.mark.parametrize(("prev_term", "entries", "held", "n"), [
    (1, [(b"", 3, 1)], [(b"", 2, 1), (b"", 3, 1)], 1),
    (1, [(b"", 3, 1), (b"", 4, 1)], [(b"", 2, 1), (b"", 3, 1)], 1),
    (1, [(b"", 3, 2)], [(b"", 2, 1), (b"", 3, 1)], 0),
    (2, [(b"", 3, 1)], [(b"", 2, 1), (b"", 3, 1)], 0),
    (1, [(b"", 3, 1)], [], 0),
    (1, [], [(b"", 2, 1)], 0),
])
def test_known_prefix(prev_term: int, entries: list[Any], held: list[Any], n: int):
    assert known_prefix(prev_term, entries, held) == n
