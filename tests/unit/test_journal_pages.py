"""Issue 31 item 4: the journal's written pages leave the node's resident memory
(raftsched/node/replica/journalpages.py), and nothing written is lost: the file holds
every record, read back by a fresh journal, and a compaction's move still works."""

from __future__ import annotations

import os
from typing import Any

import pytest
from pysyncobj.journal import FileJournal

from raftsched.node.replica.compat import drop_journal_prefix
from raftsched.node.replica.durable import adopt
from raftsched.node.replica.journalpages import AVAILABLE, CHUNK

pytestmark = [pytest.mark.timeout(60),
              pytest.mark.skipif(not AVAILABLE, reason="no madvise on this platform")]

#: Entries of 4 KiB: 8 MiB of records in all.
ENTRY = 4096
COUNT = 2048


def _mapped_kb(path: str) -> int:
    """This process's resident kB of its mappings of ``path`` (/proc/self/smaps)."""
    total, inside = 0, False
    with open("/proc/self/smaps", encoding="ascii", errors="replace") as f:
        for line in f:
            head = line.split()
            if head and "-" in head[0] and len(head) >= 5:
                inside = line.rstrip().endswith(path)
            elif inside and line.startswith("Rss:"):
                total += int(head[1])
    return total


def _entries() -> list[tuple[bytes, int, int]]:
    return [(os.urandom(ENTRY - 16), i + 1, 1) for i in range(COUNT)]


@pytest.mark.parametrize("sync", [True, False])
def test_written_pages_leave_the_resident_memory_and_every_record_is_kept(
        tmp_path: Any, sync: bool) -> None:
    path = str(tmp_path / "raft.journal")
    journal = adopt(FileJournal(path), sync=sync)
    assert journal is not None
    entries = _entries()
    try:
        for e in entries:
            journal.add(*e)
        written_kb = COUNT * (ENTRY + 8) // 1024
        resident = _mapped_kb(path)
        # At most the chunk not yet dropped, the header page and the page written last.
        assert resident <= CHUNK // 1024 + 16, (resident, written_kb)
        if sync:
            journal.rs_sync()
    finally:
        if journal.rs_worker is not None:
            journal.rs_worker.close()
        journal._destroy()
    again = FileJournal(path)
    try:
        assert [again[i] for i in range(len(again))] == entries
    finally:
        again._destroy()


def test_a_compaction_unmaps_the_tail_and_its_move_keeps_the_records(tmp_path: Any) -> None:
    path = str(tmp_path / "raft.journal")
    journal = adopt(FileJournal(path), sync=True)
    assert journal is not None
    entries = _entries()
    try:
        for e in entries:
            journal.add(*e)
        journal.rs_sync()
        # The move reads the kept records back through the map (from the page cache).
        assert drop_journal_prefix(journal, COUNT - 100)
        assert _mapped_kb(path) <= CHUNK // 1024 + 16
        assert [journal[i] for i in range(len(journal))] == entries[-100:]
    finally:
        journal.rs_worker.close()
        journal._destroy()
    again = FileJournal(path)
    try:
        assert [again[i] for i in range(len(again))] == entries[-100:]
    finally:
        again._destroy()
