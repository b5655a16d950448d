"""Issue 31 item 4: the journal's written pages leave the node's resident memory
(raftsched/node/replica/journalpages.py), and nothing written is lost: the file holds
every record, read back by a fresh journal, and a compaction's move still works."""

from __future__ import annotations

import mmap
import os
from typing import Any

import pytest
from pysyncobj.journal import FileJournal

from raftsched.node.replica.compat import drop_journal_prefix
from raftsched.node.replica.durable import adopt
from raftsched.node.replica.journalpages import AVAILABLE, CHUNK, PAGE, JournalPages

pytestmark = [pytest.mark.timeout(60),
              pytest.mark.skipif(not AVAILABLE or not os.path.exists("/proc/self/smaps"),
                                 reason="no madvise, or no /proc/self/smaps, here")]

#: Entries of 4 KiB: 8 MiB of records in all.
ENTRY = 4096
COUNT = 2048


def _mapped_kb(path: str) -> int:
    """This process's resident kB of its mappings of ``path`` (/proc/self/smaps); the
    journal must be mapped (a path that matched nothing would measure nothing)."""
    total, inside, found = 0, False, False
    real = os.path.realpath(path)
    with open("/proc/self/smaps", encoding="ascii", errors="replace") as f:
        for line in f:
            head = line.split()
            if head and "-" in head[0] and len(head) >= 5:
                inside = line.rstrip().endswith(real)
                found = found or inside
            elif inside and line.startswith("Rss:"):
                total += int(head[1])
    assert found, f"{real} is not mapped"
    return total


def _entries() -> list[tuple[bytes, int, int]]:
    return [(os.urandom(ENTRY - 16), i + 1, 1) for i in range(COUNT)]


def _filled(path: str, sync: bool, entries: list[tuple[bytes, int, int]]) -> Any:
    """A durable journal at ``path`` holding ``entries``."""
    journal = adopt(FileJournal(path), sync=sync)
    assert journal is not None
    for e in entries:
        journal.add(*e)
    return journal


def _close(journal: Any) -> None:
    if journal.rs_worker is not None:
        journal.rs_worker.close()
    journal._destroy()


def _on_disk(path: str) -> list[Any]:
    """Every record a fresh journal reads back from ``path``."""
    again = FileJournal(path)
    try:
        return [again[i] for i in range(len(again))]
    finally:
        again._destroy()


@pytest.mark.parametrize("sync", [True, False])
def test_written_pages_leave_the_resident_memory_and_every_record_is_kept(
        tmp_path: Any, sync: bool) -> None:
    path = str(tmp_path / "raft.journal")
    entries = _entries()
    journal = _filled(path, sync, entries)
    try:
        # At most the chunk not yet dropped, the header page and the page written last
        # (8 MiB were written).
        resident = _mapped_kb(path)
        assert resident <= CHUNK // 1024 + 16, resident
        if sync:
            journal.rs_sync()
    finally:
        _close(journal)
    assert _on_disk(path) == entries


def test_a_compaction_unmaps_the_tail_and_its_move_keeps_the_records(tmp_path: Any) -> None:
    """(Without the tail's unmapping the move leaves twice the kept records mapped.)"""
    path = str(tmp_path / "raft.journal")
    entries = _entries()
    journal = _filled(path, True, entries)
    try:
        journal.rs_sync()
        # The move reads the kept records back through the map (from the page cache)
        # and writes them at the front: the pages it read, beyond them now, leave.
        assert drop_journal_prefix(journal, COUNT - 100)
        kept_kb = journal.rs_log_bytes() // 1024
        assert _mapped_kb(path) <= kept_kb + 16, kept_kb
        assert [journal[i] for i in range(len(journal))] == entries[-100:]
    finally:
        _close(journal)
    assert _on_disk(path) == entries[-100:]


def test_after_a_compaction_the_rewritten_pages_are_dropped_again_after_a_cut_back_not() -> None:
    """A compaction moved the kept records to the front (their pages mapped again: the
    next chunk drops them); a follower's log cut back rewrote nothing (the pages
    before the cut stay counted as dropped)."""
    mm = mmap.mmap(-1, 64 * PAGE)
    try:
        pages = JournalPages()
        pages.written(mm, 40 * PAGE + 5)  # under a chunk (256 pages of 4 KiB): kept
        pages.dropped_to = 30 * PAGE
        pages.truncated(mm, 10 * PAGE + 5, rewritten=False)
        assert pages.dropped_to == 10 * PAGE
        pages.dropped_to = 30 * PAGE
        pages.truncated(mm, 10 * PAGE + 5, rewritten=True)
        assert pages.dropped_to == PAGE
    finally:
        mm.close()
