"""Durable acknowledgement: group commit of pysyncobj's journal.

pysyncobj 0.3.17 writes its journal through a shared ``mmap`` and never syncs it, and
stores ``currentTerm``/``votedFor`` with a rename that is never synced either: a power
loss or a kernel crash on a majority loses entries the cluster acknowledged, and a
node may vote twice in one term. Raft's safety argument assumes both are on stable
storage before any message that reflects them leaves the node (Raft §5, figure 2:
"updated on stable storage before responding to RPCs").

With ``durability = "sync"`` nothing counts before the journal bytes holding it are
synced, and the Raft thread never waits on the disk: a :class:`SyncWorker` thread
syncs (``fdatasync``) everything written up to the moment it was asked, one sync in
flight at a time, so one sync covers every entry appended meanwhile (group commit,
never one sync per command). Then:

* a follower's acknowledgement of an append (``next_node_idx``) waits until a sync
  covers what it acknowledges (:class:`DurableSender`), so no leader ever counts an
  entry its follower has not synced;
* a leader counts its own copy toward a commit only up to its synced index
  (``RaftSyncObj``); its appends go out before its own sync (Raft thesis §10.2.1), so
  the two overlap. A lone node commits on its own synced copy alone.

Replies to clients and state-machine effects come after commit, so after a majority
synced the entry.

Snapshots (pysyncobj's dump file, written by a forked child or received from the
leader) are written to a temporary file, synced, renamed, and the directory synced;
the meta file the same way. A journal compaction syncs around its in-place move so a
power cut leaves either the old records or an empty journal beside the new snapshot.

``durability = "none"`` is pysyncobj's own behaviour: a node that crashes loses
nothing (the kernel still holds its writes), a machine that loses power may.
"""

from __future__ import annotations

import contextlib
import gzip
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pysyncobj import serializer as _serializer_module
from pysyncobj.journal import FIRST_RECORD_OFFSET, FileJournal
from pysyncobj.pickle import dumps as _pickle_dumps

from raftsched.node.config.config import DEFAULT_DURABILITY, DURABILITY_MODES
from raftsched.node.replica.journalpages import JournalPages

__all__ = ["DEFAULT_DURABILITY", "DURABILITY_MODES", "DurableJournal", "DurableSender",
           "SyncStats", "SyncWorker", "adopt", "durable_replace", "install_durable_snapshots",
           "set_tracer"]

log = logging.getLogger("raftsched.raft")
#: No truncation since the sync in flight was asked for.
_NO_FLOOR = 1 << 62

#: A test's witness of what the journal layer did, in order: ("add", index, end offset),
#: ("sync", last synced index, 0), ("ack", last acknowledged index, 0), ("commit", the
#: index a leader commits up to counting its own copy, 0), ("apply", index of the
#: command the state machine applies, 0). None in production.
Tracer = Callable[[str, int, int], None]
_tracer: Tracer | None = None


def set_tracer(tracer: Tracer | None) -> None:
    """Install (or remove) the process's journal tracer (tests/durability)."""
    global _tracer
    _tracer = tracer


@dataclass(frozen=True, slots=True, kw_only=True)
class SyncStats:
    """What group commit has cost this node since it started."""

    mode: str
    """``"sync"`` or ``"none"`` (``[cluster] durability``)."""
    syncs: int
    """Journal syncs made (each covers every entry appended before it)."""
    sync_seconds: float
    """Time spent in them (in the sync thread, beside the Raft thread's work)."""
    max_sync_seconds: float
    """The longest one."""
    synced_index: int
    """The last log index on stable storage (0: none yet)."""


def _fsync_dir(path: str) -> None:
    fd = os.open(os.path.dirname(os.path.abspath(path)) or ".", os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def durable_replace(tmp: str, path: str) -> None:
    """``os.replace(tmp, path)`` that survives a power cut: the new file's bytes are on
    disk before the rename, and the rename is on disk before this returns."""
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    _fsync_dir(path)


def store_meta_durably(path: str, meta: dict[str, Any]) -> None:
    """pysyncobj's meta file (term, vote, commit index) written to a temporary file,
    synced and renamed: a node that restarts after a power cut never forgets a vote."""
    with open(path + ".tmp", "wb") as f:
        f.write(_pickle_dumps(meta))
        f.flush()
    durable_replace(path + ".tmp", path)


class DurableJournal(FileJournal):
    """pysyncobj's ``FileJournal`` that knows which of its bytes are unsynced.

    Not constructed: :func:`adopt` turns the journal pysyncobj opened into one (its
    records were read by then, and only the Raft thread touches it afterwards). Every
    change of the journal ends by rewriting the end-of-records offset in the header, so
    overriding that one method sees appends, truncations, clears and compactions: each
    is a new write generation. A sync covers the generation it was asked for."""

    rs_sync_enabled = True
    rs_dirty = False
    #: Writes so far (generation), and the last generation on stable storage.
    rs_write_gen = 0
    rs_synced_gen = 0
    #: The last log index on stable storage (0: none yet).
    rs_synced_index = 0
    #: The lowest last index a truncation left while a sync was in flight: that sync
    #: covers no entry past it (an entry it covered may have been replaced since).
    rs_floor = _NO_FLOOR
    rs_worker: Any = None
    #: How far its map's written pages were unmapped (journalpages.py); set by adopt().
    rs_pages: JournalPages

    def _FileJournal__setLastRecordOffset(self, offset: int) -> None:
        super()._FileJournal__setLastRecordOffset(offset)
        self.rs_write_gen += 1
        self.rs_dirty = True

    def add(self, command: Any, idx: int, term: int) -> None:
        super().add(command, idx, term)
        self.rs_pages.written(self._rs_map(), self._FileJournal__currentOffset)
        if _tracer is not None:
            _tracer("add", idx, self._FileJournal__currentOffset)

    def setCurrentTerm(self, term: int, votedForNodeId: Any) -> None:  # noqa: N802,N803
        """Term and vote on stable storage before any message reflecting them leaves
        (pysyncobj sends the vote right after this returns). The commit index pysyncobj
        stores once a second needs no sync: a restarted node learns it again."""
        if not self.rs_sync_enabled:
            super().setCurrentTerm(term, votedForNodeId)
            return
        meta = self._FileJournal__meta
        meta["currentTerm"] = term
        meta["votedForNodeId"] = votedForNodeId
        store_meta_durably(self._FileJournal__metaStorer.getPath(), meta)
        self._FileJournal__metaSaved = True

    def deleteEntriesFrom(self, entryFrom: int) -> None:  # noqa: N802,N803
        super().deleteEntriesFrom(entryFrom)
        self._rs_truncated()

    def clear(self) -> None:
        super().clear()
        self._rs_truncated()

    def _rs_truncated(self) -> None:
        last = self.rs_last_index()
        self.rs_floor = min(self.rs_floor, last)
        self.rs_synced_index = min(self.rs_synced_index, last)
        self.rs_unmap_tail(rewritten=False)

    def rs_unmap_tail(self, *, rewritten: bool = True) -> None:
        """The records were cut back, or moved to the front (a compaction:
        ``rewritten``): the map's pages beyond them leave the resident memory
        (journalpages.py)."""
        self.rs_pages.truncated(self._rs_map(), self._FileJournal__currentOffset,
                                   rewritten=rewritten)

    def _rs_map(self) -> Any:
        return self._FileJournal__journalFile._ResizableFile__mm


    def rs_note_apply(self, idx: int) -> None:
        """The state machine applies entry ``idx`` now (its effects and its reply)."""
        if _tracer is not None:
            _tracer("apply", idx, 0)

    def rs_note_commit(self, idx: int) -> None:
        """This leader counts its own copy toward the commit of entries up to ``idx``."""
        if _tracer is not None:
            _tracer("commit", idx, 0)

    def rs_log_bytes(self) -> int:
        """The bytes of the records the journal holds: the entries a compaction kept
        and those written since (pysyncobj holds each in memory too)."""
        return int(self._FileJournal__currentOffset) - FIRST_RECORD_OFFSET

    def rs_last_index(self) -> int:
        entries = self._FileJournal__journal
        return int(entries[-1][1]) if entries else 0

    def rs_poll(self) -> None:
        """Raft thread: take in a finished sync, and ask for the next one if anything
        was written since the last request (one sync in flight at a time)."""
        worker = self.rs_worker
        if worker is None or not self.rs_sync_enabled:
            return
        done = worker.take()
        if done is not None:
            gen, idx = done
            self.rs_synced_gen = max(self.rs_synced_gen, gen)
            self.rs_synced_index = max(self.rs_synced_index, min(idx, self.rs_floor))
            if _tracer is not None:
                _tracer("sync", self.rs_synced_index, 0)
        if self.rs_dirty and not worker.busy():
            self.rs_dirty = False
            self.rs_floor = _NO_FLOOR
            worker.ask(self.rs_write_gen, self.rs_last_index())

    def rs_sync(self) -> None:
        """Raft thread: sync everything written so far, now, and wait for it (a
        compaction's ordering, a node's start)."""
        if not self.rs_sync_enabled:
            return
        if self.rs_worker is not None:
            self.rs_worker.wait_idle()
            self.rs_poll()  # takes in the sync that was in flight, if one was
            self.rs_worker.wait_idle()
            self.rs_worker.take()
        gen, idx = self.rs_write_gen, self.rs_last_index()
        self.rs_dirty = False
        _sync_file(self._FileJournal__journalFile)
        self.rs_synced_gen, self.rs_synced_index = gen, idx
        self.rs_floor = _NO_FLOOR
        if _tracer is not None:
            _tracer("sync", idx, 0)

    def rs_stats(self) -> SyncStats:
        w = self.rs_worker
        return SyncStats(mode="sync" if self.rs_sync_enabled else "none",
                         syncs=w.syncs if w else 0, sync_seconds=w.seconds if w else 0.0,
                         max_sync_seconds=w.max_seconds if w else 0.0,
                         synced_index=self.rs_synced_index)


def _sync_file(journal_file: Any) -> None:
    raw = getattr(journal_file, "_ResizableFile__f", None)
    if raw is not None:
        # fdatasync writes the pages the mapping dirtied (and the file's size) as msync
        # would, but releases the GIL: msync (mmap.flush) holds it for the whole sync.
        os.fdatasync(raw.fileno())
    else:
        journal_file.flush()


class SyncWorker:
    """The thread that syncs the journal, so the Raft thread never waits on the disk:
    it asks for a sync of the generation written so far (:meth:`ask`), goes on with
    its work, and takes the result in at a later tick (:meth:`take`). A finished sync
    wakes the Raft thread's poll (``wake``)."""

    def __init__(self, journal_file: Any, wake: Callable[[], None]) -> None:
        raw = getattr(journal_file, "_ResizableFile__f", None)
        # A descriptor of its own: pysyncobj reopens its file when it cannot resize the
        # mapping in place, and must not close one this thread is syncing on.
        self._fd = os.dup(raw.fileno()) if raw is not None else None
        self._file = journal_file
        self._wake = wake
        self._cv = threading.Condition()
        self._asked: tuple[int, int] | None = None
        self._done: tuple[int, int] | None = None
        self._busy = False
        self._stop = False
        self.syncs = 0
        self.seconds = 0.0
        self.max_seconds = 0.0
        self._thread = threading.Thread(target=self._run, name="raftsched-journal-sync",
                                        daemon=True)
        self._thread.start()

    def busy(self) -> bool:
        with self._cv:
            return self._busy or self._asked is not None or self._done is not None

    def ask(self, gen: int, idx: int) -> None:
        with self._cv:
            self._asked = (gen, idx)
            self._cv.notify_all()

    def take(self) -> tuple[int, int] | None:
        with self._cv:
            done, self._done = self._done, None
            return done

    def wait_idle(self, timeout: float = 30.0) -> None:
        with self._cv:
            self._cv.wait_for(lambda: not self._busy and self._asked is None, timeout)

    def close(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify_all()

    def _run(self) -> None:
        try:
            while self._one():
                pass
        finally:
            if self._fd is not None:
                os.close(self._fd)

    def _one(self) -> bool:
        with self._cv:
            self._cv.wait_for(lambda: self._asked is not None or self._stop)
            if self._stop:
                return False
            asked, self._asked = self._asked, None
            self._busy = True
        t0 = time.perf_counter()
        try:
            if self._fd is not None:
                os.fdatasync(self._fd)
            else:
                self._file.flush()
        except OSError:
            # Nothing more is acknowledged (the answers wait for a sync that never
            # comes): the leader sees this node as down, not as holding entries.
            log.exception("journal sync failed; this node acknowledges no more entries")
            with self._cv:
                self._busy = False
                self._cv.notify_all()
            return False
        took = time.perf_counter() - t0
        with self._cv:
            self._busy = False
            self._done = asked
            self.syncs += 1
            self.seconds += took
            self.max_seconds = max(self.max_seconds, took)
            self._cv.notify_all()
        with contextlib.suppress(OSError, ValueError):
            self._wake()  # the poller is gone when the node stops
        return True


def adopt(journal: Any, *, sync: bool, wake: Callable[[], None] | None = None
          ) -> DurableJournal | None:
    """Make pysyncobj's open journal a :class:`DurableJournal` (None: an in-memory
    journal, nothing to sync). With ``sync`` it is synced at once (a process that
    restarts after a crash reads records the kernel may still hold unsynced), and a
    :class:`SyncWorker` syncs it from then on, waking the Raft thread with ``wake``."""
    if not isinstance(journal, FileJournal):
        return None
    journal.__class__ = DurableJournal
    assert isinstance(journal, DurableJournal)
    journal.rs_pages = JournalPages()
    journal.rs_sync_enabled = sync
    if sync:
        journal.rs_sync()
        journal.rs_worker = SyncWorker(journal._FileJournal__journalFile,
                                       wake or (lambda: None))
    else:
        journal.rs_synced_index = journal.rs_last_index()
    return journal


class DurableSender:
    """Wraps ``transport.send``: a follower's answer to an append leaves only once the
    entries it acknowledges are synced.

    An answer ``next_node_idx = n`` (success) says "I hold your entries up to n - 1":
    it waits until this node's synced index reaches n - 1, and leaves at the first tick
    after that (:meth:`flush`); every append one poll read is covered by one sync. An
    answer that acknowledges nothing unsynced (a heartbeat's, a refusal) leaves at
    once, so a slow disk never makes a live follower look silent to its leader.
    Every other message goes out at once too: a leader's appends need not wait for its
    own sync (Raft thesis §10.2.1: the leader writes its log in parallel with
    replicating it; it counts its own copy toward a commit only up to its synced index,
    see ``RaftSyncObj``), and a vote waits for the meta file, which is synced when the
    vote is stored."""

    def __init__(self, transport: Any, journal: DurableJournal) -> None:
        self.journal = journal
        self._send = transport.send
        self._held: deque[tuple[int, Any, Any]] = deque()
        transport.send = self.send

    def send(self, node: Any, message: Any) -> Any:
        journal = self.journal
        if journal.rs_sync_enabled and isinstance(message, dict) \
                and message.get("type") == "next_node_idx" and message.get("success"):
            acked = int(message["next_node_idx"]) - 1
            if acked > journal.rs_synced_index:
                self._held.append((acked, node, message))
                return True
        return self._out(node, message)

    def flush(self) -> None:
        """Take in a finished sync, ask for the next, send the answers it covers."""
        journal = self.journal
        journal.rs_poll()
        held = self._held
        while held and held[0][0] <= journal.rs_synced_index:
            _, node, message = held.popleft()
            self._out(node, message)

    def _out(self, node: Any, message: Any) -> Any:
        if _tracer is not None and isinstance(message, dict) \
                and message.get("type") == "next_node_idx" and message.get("success"):
            _tracer("ack", int(message["next_node_idx"]) - 1, 0)
        return self._send(node, message)


_snapshots_durable = False


#: The gzip level of the snapshots pysyncobj writes (its default is 9). A W1 storm's
#: 23 MB state took 1.0 s of CPU to compress at 9 and 0.07 s at 1 (3.5 MB instead of
#: 2.1 MB), CPU taken from a busy host at the very moment of the snapshot. Any level
#: reads back the same.
SNAPSHOT_GZIP_LEVEL = 1


class _FastGzip:
    """pysyncobj's serializer module's view of :mod:`gzip`: its writes at
    :data:`SNAPSHOT_GZIP_LEVEL` (the level is ignored when reading)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(gzip, name)

    @staticmethod
    def GzipFile(*args: Any, **kwargs: Any) -> gzip.GzipFile:  # noqa: N802 - gzip's name
        kwargs.setdefault("compresslevel", SNAPSHOT_GZIP_LEVEL)
        return gzip.GzipFile(*args, **kwargs)


def install_durable_snapshots() -> None:
    """pysyncobj renames a written or received snapshot into place without a sync;
    make that rename :func:`durable_replace` (process-wide; only ever safer), and
    compress its snapshots at :data:`SNAPSHOT_GZIP_LEVEL`."""
    global _snapshots_durable
    if not _snapshots_durable:
        _serializer_module.atomicReplace = durable_replace
        _serializer_module.gzip = _FastGzip()
        _snapshots_durable = True
