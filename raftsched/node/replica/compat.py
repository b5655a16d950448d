"""The pysyncobj internals raftsched uses, in one checked list, and its process-wide
patches.

raftsched patches pysyncobj 0.3.17 where upstream is unsafe or too slow for a
scheduler: a follower's log on append_entries (Raft §5.3), the journal compaction's
entry-by-entry rewrite, the size of a message a peer may announce, leadership
transfer under load. Each patch names private (often name-mangled) attributes; a
pysyncobj release that renames one would make an override silently never run — the
log-safety fix among them. So :func:`install` refuses any other pysyncobj version and
checks every attribute it relies on, loudly, before a node starts. The patched
``SyncObj`` itself is :mod:`raftsched.node.replica.raftsync` (pre-vote in
:mod:`raftsched.node.replica.prevote`, the journal in
:mod:`raftsched.node.replica.durable`); every internal they name is listed here.
"""

from __future__ import annotations

import logging
import struct
import threading
from typing import Any

from pysyncobj import SyncObj, tcp_connection
from pysyncobj import syncobj as _syncobj_module
from pysyncobj.encryptor import getEncryptor as _get_encryptor
from pysyncobj.journal import FIRST_RECORD_OFFSET, FileJournal, ResizableFile
from pysyncobj.monotonic import monotonic as _pysyncobj_clock
from pysyncobj.version import VERSION

log = logging.getLogger("raftsched.raft")

#: The one pysyncobj release these patches are written against (pinned in pyproject).
PYSYNCOBJ_VERSION = "0.3.17"

#: (owner, attribute) pairs the patches read, call or override. Instance attributes
#: are checked by name in the code of the method that sets them.
_CLASS_ATTRS = (
    (SyncObj, "_SyncObj__onMessageReceived"), (SyncObj, "_SyncObj__deleteEntriesFrom"),
    (SyncObj, "_SyncObj__deleteEntriesTo"), (SyncObj, "_SyncObj__getEntries"),
    (SyncObj, "_checkCommandsToApply"), (SyncObj, "raftLastApplied"),
    (SyncObj, "raftCurrentTerm"), (SyncObj, "transferLeadership"),
    (SyncObj, "addOnTickCallback"), (SyncObj, "_isLeader"), (SyncObj, "_getLeader"),
    (SyncObj, "_SyncObj__sendNextNodeIdx"), (SyncObj, "_SyncObj__applyLogEntries"),
    (SyncObj, "_doDestroy"), (SyncObj, "_SyncObj__tryLogCompaction"),
    (SyncObj, "forceLogCompaction"), (SyncObj, "_SyncObj__sendAppendEntries"),
    (SyncObj, "_SyncObj__doChangeCluster"), (SyncObj, "_onTick"), (SyncObj, "otherNodes"),
    (SyncObj, "addNodeToCluster"), (SyncObj, "removeNodeFromCluster"),
    (SyncObj, "_SyncObj__onNodeDisconnected"), (_syncobj_module, "_RAFT_STATE"),
    (SyncObj, "_SyncObj__getCurrentLogIndex"), (SyncObj, "_SyncObj__getCurrentLogTerm"),
    (SyncObj, "_SyncObj__generateRaftTimeout"), (SyncObj, "_SyncObj__connectedToAnyone"),
    (SyncObj, "_SyncObj__loadDumpFile"), (SyncObj, "isNodeConnected"),
    (tcp_connection.TcpConnection, "_TcpConnection__processRead"),
    (FileJournal, "clear"), (FileJournal, "_FileJournal__setLastRecordOffset"),
)
_INSTANCE_ATTRS = (
    (SyncObj.__init__, ("_SyncObj__raftCurrentTerm", "_SyncObj__leaderCommitIndex",
                        "_SyncObj__raftLog", "_SyncObj__thread", "_SyncObj__raftCommitIndex",
                        "_SyncObj__raftElectionDeadline", "_SyncObj__raftLeader", "getEncryptor",
                        "_SyncObj__raftState", "_SyncObj__transport",
                        "_SyncObj__connectedNodes", "_SyncObj__transferInProgress",
                        "_SyncObj__otherNodes", "_SyncObj__selfNode", "_SyncObj__conf",
                        "_SyncObj__raftMatchIndex", "_SyncObj__lastResponseTime",
                        "_SyncObj__newAppendEntriesTime",
                        "_poller", "_SyncObj__pipeNotifier",
                        "_SyncObj__forceLogCompaction", "_SyncObj__properies")),
    (tcp_connection.TcpConnection.__init__, ("_TcpConnection__readBuffer",)),
    (FileJournal.__init__, ("_FileJournal__journal", "_FileJournal__journalFile",
                            "_FileJournal__currentOffset", "_FileJournal__metaStorer",
                            "_FileJournal__meta", "_FileJournal__metaSaved")),
    (ResizableFile.__init__, ("_ResizableFile__f", "_ResizableFile__mm")),
)


def raft_now() -> float:
    """pysyncobj's clock (seconds): every time compared with one of its deadlines or
    stamps must be read from it. It is CLOCK_MONOTONIC_RAW, not ``time.monotonic``'s
    CLOCK_MONOTONIC: the two drift apart as the latter is slewed (0.25 s apart on our test
    host), and a deadline of one read against the other expired that much early or late:
    followers asked for elections right after their leader's append."""
    return float(_pysyncobj_clock())


class IncompatiblePysyncobj(ImportError):
    """The installed pysyncobj is not the release raftsched's patches were written for."""


def verify() -> None:
    """Raise :class:`IncompatiblePysyncobj` unless every patched internal exists."""
    if VERSION != PYSYNCOBJ_VERSION:
        raise IncompatiblePysyncobj(
            f"raftsched needs pysyncobj {PYSYNCOBJ_VERSION} exactly (found {VERSION}): its "
            "Raft log-safety and journal patches name that release's internals "
            "(pip install -c constraints.txt ...)")
    missing = [f"{getattr(owner, '__name__', owner)}.{name}" for owner, name in _CLASS_ATTRS
               if not hasattr(owner, name)]
    for func, names in _INSTANCE_ATTRS:
        code_names = set(func.__code__.co_names)
        missing += [f"{func.__qualname__} sets no {name}" for name in names
                    if name not in code_names]
    if missing:
        raise IncompatiblePysyncobj(
            "pysyncobj internals raftsched patches are gone: " + ", ".join(missing))


_installed = False


def install() -> None:
    """Check, then apply the process-wide patches once (called by ``RaftNode``)."""
    global _installed
    if _installed:
        return
    verify()
    _cap_raft_messages(MAX_RAFT_MESSAGE)
    _keyring_encryptors()
    logging.getLogger("pysyncobj.syncobj").addFilter(_KeptLogFilter())
    _installed = True


def derive_fernet(password: str) -> Any:
    """pysyncobj's own ``password -> Fernet`` (PBKDF2-SHA256, 100k rounds, fixed salt)."""
    return _get_encryptor(password)


def derive_key(password: str) -> bytes:
    """The 32 bytes pysyncobj's Fernet key for ``password`` is made of: its own
    PBKDF2-SHA256 (100k rounds, its fixed salt), so a node sealing with a keyring and a
    node given only ``password`` use one key."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.pbkdf2 import PBKDF2HMAC
    from pysyncobj.encryptor import SALT

    kdf = PBKDF2HMAC(algorithm=hashes.SHA256(), length=32, salt=SALT, iterations=100_000)
    return kdf.derive(password.encode())


def _keyring_encryptors() -> None:
    """``SyncObj.__init__`` builds its one encryptor by calling the module's
    ``getEncryptor(password)``: a :class:`~raftsched.node.replica.raftkeys.RaftKeyring` given
    as the password is used as it is (secret rotation, see raftkeys)."""
    from raftsched.node.replica.raftkeys import RaftKeyring

    def get_encryptor(password: Any) -> Any:
        return password if isinstance(password, RaftKeyring) else _get_encryptor(password)

    _syncobj_module.getEncryptor = get_encryptor


#: No Raft message of ours comes near this (entries and snapshots travel in 64 KiB
#: chunks); a peer announcing more is disconnected before it is buffered.
MAX_RAFT_MESSAGE = 16 << 20


def _cap_raft_messages(limit: int) -> None:
    """pysyncobj buffers whatever length a peer announces (up to 2 GiB) before it
    decrypts anything, so a stranger on the Raft port could fill the node's memory.
    Check the announced length as soon as the 4-byte header has arrived."""
    from pysyncobj import tcp_connection

    cls = tcp_connection.TcpConnection
    if getattr(cls, "_raftsched_capped", False):
        return
    read = cls._TcpConnection__processRead

    def process_read(self: Any) -> bool:
        more = read(self)
        buf = self._TcpConnection__readBuffer
        if len(buf) >= 4:
            (size,) = struct.unpack("i", buf[:4])
            if size < 0 or size > limit:
                log.warning("raft peer announced a %d-byte message: disconnected", size)
                self.disconnect()
                return False
        return more

    cls._TcpConnection__processRead = process_read
    cls._raftsched_capped = True





#: Bytes a journal record adds to its command: size, index, term, size.
_RECORD_OVERHEAD = 4 + 16 + 4


def drop_journal_prefix(journal: Any, count: int) -> bool:
    """``FileJournal.deleteEntriesTo(count)`` with one ``mmap.move``; False (nothing
    done) if the file does not look as expected.

    After a snapshot pysyncobj rewrites every entry it keeps, one Python call each,
    in the Raft thread: the tens of thousands written during a 30 s dump stalled a
    leader past the election timeout (docs/architecture.md). Records do not depend on
    their position, so the kept ones move
    to the front in one copy. The journal is marked empty first: a crash during the
    move leaves an empty journal (the new snapshot holds what came before; a
    follower fetches the rest again), never a torn one."""
    entries = journal._FileJournal__journal
    if count <= 0:
        return True
    if count >= len(entries):
        journal.clear()
        return True
    mm = journal._FileJournal__journalFile._ResizableFile__mm
    end = journal._FileJournal__currentOffset
    start = FIRST_RECORD_OFFSET + sum(len(cmd) for cmd, _, _ in entries[:count]) \
        + count * _RECORD_OVERHEAD
    last = entries[count - 1]
    if not (isinstance(last[0], bytes) and FIRST_RECORD_OFFSET < start < end
            and struct.unpack("<I", mm[start - 4:start])[0] == len(last[0]) + 16
            and struct.unpack("<QQ", mm[start - 4 - len(last[0]) - 16:
                                        start - 4 - len(last[0])]) == (last[1], last[2])):
        return False
    set_last = journal._FileJournal__setLastRecordOffset
    set_last(FIRST_RECORD_OFFSET)
    # A durable journal has "empty" on disk before the move, and the moved records
    # before the header that names them: a power cut leaves old or empty, not torn.
    sync = getattr(journal, "rs_sync", None)
    if sync is not None:
        sync()
    mm.move(FIRST_RECORD_OFFSET, start, end - start)
    if sync is not None:
        journal.rs_dirty = True
        sync()
    new_end = FIRST_RECORD_OFFSET + end - start
    journal._FileJournal__currentOffset = new_end
    set_last(new_end)
    if sync is not None:
        # And the header that names them, before the Raft thread goes on: until then
        # the disk says "empty", and a power cut would lose every kept entry (those
        # after the snapshot, committed and acknowledged) while the synced index
        # still counted them.
        sync()
    del entries[:count]
    unmap = getattr(journal, "rs_unmap_tail", None)
    if unmap is not None:
        unmap()
    return True



def known_prefix(prev_term: int, entries: list[Any], held: list[Any]) -> int:
    """How many leading ``entries`` (``(command, index, term)``) a follower already holds.

    ``held`` is the follower's log from the entry at the message's ``prevLogIdx`` on;
    an entry is held when the follower has the same index with the same term (Raft's
    log matching: then it is the same entry). 0 when the previous entry itself does not
    match (pysyncobj then refuses the message anyway)."""
    if not held or held[0][2] != prev_term:
        return 0
    n = 0
    for k, entry in enumerate(entries):
        if k + 1 >= len(held) or held[k + 1][1] != entry[1] or held[k + 1][2] != entry[2]:
            break
        n += 1
    return n


def byte_bound(forced: bool, ours: bool, grown: int, bound: int) -> tuple[bool, bool]:
    """pysyncobj's force-compaction flag and whether it is the byte bound's, for a log
    grown by ``grown`` bytes since the last compaction. Withdrawn once under the bound
    again (a flag left set by a compaction that has since run would start another),
    but only if it was the bound's own: a caller's request stands."""
    if grown > bound:
        return True, True
    if ours:
        return False, False
    return forced, False


class _KeptLogFilter(logging.Filter):
    """pysyncobj logs its truncation CRITICAL before deleting; when RaftSyncObj keeps
    the log, nothing is truncated and the line would be false."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith("truncating already-applied"):
            return True
        return not getattr(KEEPING_LOG, "active", False)


KEEPING_LOG = threading.local()
