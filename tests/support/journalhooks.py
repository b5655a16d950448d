"""What the durability tests put into real node processes, through a ``sitecustomize``
on the node's ``PYTHONPATH`` (:func:`hook_dir`), so production code carries no test
switch:

* ``RS_TEST_JOURNAL_TRACE=<file>``: every journal event of the node (append, sync,
  acknowledgement of an append, a leader's commit, apply), one line each, in the Raft thread's
  order (:func:`raftsched.node.replica.durable.set_tracer`), read back by :func:`violations`.
* ``RS_TEST_LOSSY_JOURNAL=1``: the journal's file is a :class:`LossyFile`, whose writes
  reach the disk only when the journal syncs; a SIGKILL then loses exactly what a power
  cut loses of a file in the page cache. (Whole pages at sync granularity: the kernel
  may also write some unsynced pages back early, which this layer never does, so it
  checks that no acknowledgement depends on unsynced bytes, not how a torn tail is
  read back.)
"""

from __future__ import annotations

import os
import threading
from typing import Any

PAGE = 4096

_SITE = """\
from tests.support import journalhooks
journalhooks.install_from_env()
"""


def hook_dir(tmp: str) -> str:
    """A directory holding the ``sitecustomize`` that installs these hooks; put it
    first on a node's ``PYTHONPATH`` (with the source root after it)."""
    path = os.path.join(tmp, "journalhooks-site")
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "sitecustomize.py"), "w", encoding="utf-8") as f:
        f.write(_SITE)
    return path


class _View:
    """The two things compat.drop_journal_prefix does to pysyncobj's mmap."""

    def __init__(self, file: LossyFile) -> None:
        self._file = file

    def __getitem__(self, key: slice) -> bytes:
        return self._file.read(key.start, key.stop - key.start)

    def move(self, dest: int, src: int, count: int) -> None:
        self._file.write(dest, bytes(self._file.buf[src:src + count]))


class LossyFile:
    """pysyncobj's ``ResizableFile`` interface over a private copy of the file: writes
    stay in memory (a page cache that a power cut loses) until ``flush``, which writes
    the pages dirtied before it was called and ``fdatasync``s; a process killed
    between two syncs leaves the file as the last sync left it. ``flush`` runs in the
    node's sync thread while the Raft thread writes on."""

    def __init__(self, path: str, old: Any) -> None:
        old._destroy()  # pysyncobj's mapping; nothing was written through it yet
        with open(path, "rb") as f:
            self.buf = bytearray(f.read())
        self._fd = os.open(path, os.O_RDWR)
        self._dirty: set[int] = set()
        self._lock = threading.Lock()
        self._ResizableFile__mm = _View(self)

    def write(self, offset: int, values: bytes) -> None:
        end = offset + len(values)
        with self._lock:
            if end > len(self.buf):
                self.buf.extend(bytes(max(end, len(self.buf) * 2) - len(self.buf)))
            self.buf[offset:end] = values
            self._dirty.update(range(offset // PAGE, (end - 1) // PAGE + 1))

    def read(self, offset: int, size: int) -> bytes:
        with self._lock:
            return bytes(self.buf[offset:offset + size])

    def flush(self) -> None:
        with self._lock:
            pages = {p: bytes(self.buf[p * PAGE:(p + 1) * PAGE]) for p in self._dirty}
            size = len(self.buf)
            self._dirty.clear()
        for page in sorted(pages):
            os.pwrite(self._fd, pages[page], page * PAGE)
        if os.fstat(self._fd).st_size < size:
            os.ftruncate(self._fd, size)
        os.fdatasync(self._fd)

    def _destroy(self) -> None:
        self.flush()
        os.close(self._fd)


def install_from_env() -> None:
    trace = os.environ.get("RS_TEST_JOURNAL_TRACE")
    lossy = os.environ.get("RS_TEST_LOSSY_JOURNAL") == "1"
    if not (trace or lossy):
        return
    from pysyncobj.journal import FileJournal

    from raftsched.node.replica import durable

    if trace:
        fd = os.open(trace, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

        def tracer(kind: str, a: int, b: int) -> None:
            os.write(fd, f"{kind} {a} {b}\n".encode())

        durable.set_tracer(tracer)
    if lossy:
        adopt = durable.adopt

        def lossy_adopt(journal: Any, **kw: Any) -> Any:
            if isinstance(journal, FileJournal):
                old = journal._FileJournal__journalFile  # type: ignore[attr-defined]
                path = old._ResizableFile__fileName
                journal._FileJournal__journalFile = LossyFile(path, old)  # type: ignore[attr-defined]
                # The test's evidence that this node's journal is the lossy one.
                with open(path + ".lossy", "w", encoding="ascii") as f:
                    f.write(f"{os.getpid()}\n")
            return adopt(journal, **kw)

        durable.adopt = lossy_adopt  # type: ignore[assignment]


def violations(trace_path: str) -> tuple[list[str], dict[str, int]]:
    """Read one node's trace: every acknowledgement of an append (``ack n``: "I hold
    entries up to n") and every commit a leader makes counting its own copy (``commit
    n``) must be covered by a sync that finished before it. Returns (violations,
    counts of each event kind)."""
    synced = 0
    found: list[str] = []
    counts: dict[str, int] = {}
    with open(trace_path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            kind, a_s, _ = line.split()
            a = int(a_s)
            counts[kind] = counts.get(kind, 0) + 1
            if kind == "sync":
                synced = a
            elif kind == "add" and a <= synced:
                synced = a - 1  # a truncated tail replaced: the new entry is unsynced
            elif kind in ("ack", "commit") and a > synced:
                found.append(f"line {n}: {kind} {a} before a sync covered it (synced {synced})")
    return found, counts
