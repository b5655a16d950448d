"""The journal after a snapshot: raftsched drops the compacted prefix of pysyncobj's
FileJournal with one move, and the result is what pysyncobj's own entry-by-entry
rewrite gives (in memory and read back from the file), on real FileJournal objects."""

from __future__ import annotations

import os
import random
from typing import Any

import pytest
from pysyncobj.journal import FileJournal

from raftsched.node.replica.compat import drop_journal_prefix
from raftsched.node.replica.durable import adopt
from tests.support.journalhooks import LossyFile

pytestmark = pytest.mark.timeout(60)


def _journal(path: str, entries: list[tuple[bytes, int, int]]) -> Any:
    j = FileJournal(path)
    for e in entries:
        j.add(*e)
    return j


def _entries(n: int, seed: int) -> list[tuple[bytes, int, int]]:
    rnd = random.Random(seed)
    return [(os.urandom(rnd.choice([0, 1, 7, 250, 4000])), i + 1, 1 + i // 100)
            for i in range(n)]


def _on_disk(path: str) -> list[tuple[bytes, int, int]]:
    j = FileJournal(path)
    try:
        return [j[i] for i in range(len(j))]
    finally:
        j._destroy()


@pytest.mark.parametrize("count", [0, 1, 137, 499, 500, 900])
def test_dropping_a_prefix_matches_pysyncobj_in_memory_and_on_disk(tmp_path, count):
    entries = _entries(500, seed=count)
    ours, stock = str(tmp_path / "ours.journal"), str(tmp_path / "stock.journal")
    a, b = _journal(ours, entries), _journal(stock, entries)
    assert drop_journal_prefix(a, count)
    b.deleteEntriesTo(count)
    want = entries[count:]
    assert [a[i] for i in range(len(a))] == want == [b[i] for i in range(len(b))]
    # Appending after the move lands where a reader expects it.
    a.add(b"after", 501, 9)
    a._destroy()
    b._destroy()
    assert _on_disk(ours) == want + [(b"after", 501, 9)]


def test_a_journal_that_does_not_match_its_entries_is_left_to_pysyncobj(tmp_path):
    entries = _entries(50, seed=7)
    j = _journal(str(tmp_path / "j.journal"), entries)
    # A command that is not bytes (an older pysyncobj wrote str): its size on disk is
    # not len(command), so the computed offset cannot be trusted.
    j._FileJournal__journal[9] = ("not bytes", 10, 1)
    assert not drop_journal_prefix(j, 10)
    assert len(j) == 50
    j._destroy()


def test_a_power_cut_right_after_the_drop_keeps_every_entry_after_the_snapshot(tmp_path):
    # The journal's file is a LossyFile: what reaches the disk is what the syncs wrote.
    # Cut right after the drop (no sync since), the disk must name the kept entries:
    # they were committed and acknowledged, and the snapshot holds only those before.
    path = str(tmp_path / "raft.journal")
    plain = FileJournal(path)
    plain._FileJournal__journalFile = LossyFile(path, plain._FileJournal__journalFile)
    journal = adopt(plain, sync=True)
    assert journal is not None
    entries = _entries(200, seed=3)
    for e in entries:
        journal.add(*e)
    journal.rs_sync()
    try:
        assert drop_journal_prefix(journal, 150)
        assert _on_disk(path) == entries[150:]
    finally:
        journal.rs_worker.close()
