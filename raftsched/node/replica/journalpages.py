"""The journal's written pages leave the node's resident memory (issue 31 item 4).

pysyncobj's ``FileJournal`` writes each entry twice: into its in-memory list, which is
what it reads, and through a shared ``mmap`` of the journal file, which it reads only
at start (and a few record sizes when a follower's log is cut back). Every page written
through the map stays mapped, so it counts in the process's RSS beside the list's own
copy: up to the whole log since the last compaction (32-48 MiB) and the file's tail
from before it (a compaction rewrites the records from the start and never shrinks the
map). Right after a million jobs' puts that was ~50 of a node's 537 bytes per job.

So the pages behind the write position are unmapped once a chunk of them has gathered
(``MADV_DONTNEED``), and the tail beyond the records after a compaction. Nothing is
lost: in a shared file mapping a dirty page stays in the page cache and is written
back, and the journal's sync (durable.py) syncs the file, not the map. A page read
again faults back in from the page cache. The header page (its end-of-records offset
is rewritten by every append) stays mapped.
"""

from __future__ import annotations

import logging
import mmap
from typing import Any

log = logging.getLogger("raftsched.raft")

PAGE = mmap.PAGESIZE
#: Written bytes gathered behind the write position before they are unmapped: one
#: madvise per this much log, ~100 for a million jobs' puts.
CHUNK = 1 << 20
#: mmap objects lack ``madvise`` on some platforms: then nothing is dropped.
AVAILABLE = hasattr(mmap.mmap, "madvise") and hasattr(mmap, "MADV_DONTNEED")


def _down(offset: int) -> int:
    return offset - offset % PAGE


def _drop(mm: Any, start: int, end: int) -> bool:
    """Unmap ``[start, end)`` (page-aligned) of ``mm``; False if it could not."""
    if end <= start:
        return True
    if not isinstance(mm, mmap.mmap):  # a test's stand-in for the file: nothing mapped
        return False
    try:
        mm.madvise(mmap.MADV_DONTNEED, start, end - start)
    except (ValueError, OSError) as exc:  # closed or remapped meanwhile: next time
        log.debug("journal pages not dropped: %s", exc)
        return False
    return True


class JournalPages:
    """Where this journal's map was last unmapped up to. Raft thread only."""

    def __init__(self) -> None:
        #: Every page below this (but the header's) is unmapped.
        self.dropped_to = PAGE

    def written(self, mm: Any, offset: int) -> None:
        """The journal's records now end at ``offset``: unmap the whole pages behind it
        once a chunk of them has gathered."""
        end = _down(offset)
        if AVAILABLE and end - self.dropped_to >= CHUNK and _drop(mm, self.dropped_to, end):
            self.dropped_to = end

    def truncated(self, mm: Any, offset: int, *, rewritten: bool) -> None:
        """The records now end at ``offset`` (a compaction's move, a follower's log cut
        back, a clear): unmap the file's tail beyond them. ``rewritten``: the records
        before ``offset`` were written again (a compaction moved them to the front), so
        their pages are mapped again and are dropped with the next chunk."""
        if not (AVAILABLE and isinstance(mm, mmap.mmap)):
            return
        tail = _down(offset) + PAGE
        try:
            size = len(mm)
        except (ValueError, OSError):  # closed meanwhile
            return
        _drop(mm, tail, _down(size))
        self.dropped_to = PAGE if rewritten else max(PAGE, min(self.dropped_to,
                                                               _down(offset)))


__all__ = ["AVAILABLE", "CHUNK", "JournalPages"]
