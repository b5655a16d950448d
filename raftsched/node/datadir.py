"""A node's data directory: one process at a time, and no corrupt journal replayed.

Two processes on one journal (``raftsched node`` and an embedded ``Scheduler`` both
defaulted to ``./raftsched-data``) both led term 1 of it; the journal became a 2.7 GB
sparse file and a restarted node replayed garbage. :class:`DataDirLock` takes an
exclusive ``flock`` on ``<dir>/lock`` before pysyncobj opens anything and holds it for
the node's lifetime; the file names the holder's pid for the refusal message.

:func:`check_journal` reads pysyncobj 0.3.17's ``FileJournal`` layout before pysyncobj
does (which would replay whatever it finds)::

    name (24 B) | version (8 B) | format version (u32 LE) | end of last record (u32 LE)
    then records: size (u32 LE) | index (u64 LE) | term (u64 LE) | command | size again

``size`` counts index + term + command. Records must tile the file up to the recorded
end, indexes must follow each other by one, terms must never decrease and never exceed
the current term stored in ``<journal>.meta`` (a pickled dict, read here with an
unpickler that builds nothing but plain data).
"""

from __future__ import annotations

import contextlib
import fcntl
import gzip
import io
import logging
import mmap
import os
import pickle
import struct
import time
import zlib
from typing import TYPE_CHECKING, Any

from raftsched.core.errors import CorruptJournal, DataDirLocked
from raftsched.node import ports
from raftsched.wire.secretfile import register

if TYPE_CHECKING:
    from raftsched.node.config.config import ClusterConfig

log = logging.getLogger("raftsched.node")

LOCK_FILE = "lock"

_APP_NAME = b"PYSYNCOBJ"
_NAME_SIZE = 24
_VERSION_SIZE = 8
_FORMAT_VERSION = 1
_LAST_OFFSET_AT = _NAME_SIZE + _VERSION_SIZE + 4
FIRST_RECORD_OFFSET = _LAST_OFFSET_AT + 4
#: No real term comes near this (one per election); garbage usually does.
MAX_SANE_TERM = 1 << 40


#: A lock held by a process that is just dying (SIGKILLed a moment ago) is waited for
#: this long before the start is refused.
LOCK_WAIT_S = 1.0
#: Descriptors of the locks this process holds: closed in forked children, so that a
#: child (pysyncobj's snapshot writer) never keeps a directory locked after the node.
_HELD: set[int] = set()


class DataDirLock:
    """An exclusive ``flock`` on ``<path>/lock``; DataDirLocked if another holds it."""

    def __init__(self, path: str, wait_s: float = LOCK_WAIT_S) -> None:
        self.path = os.path.abspath(path)
        lock_path = os.path.join(self.path, LOCK_FILE)
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        deadline = time.monotonic() + wait_s
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise DataDirLocked(self.path, _read_pid(fd)) from None
                    time.sleep(0.05)
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
        self._fd: int | None = fd
        _HELD.add(fd)

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            _HELD.discard(fd)
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
            os.close(fd)  # closing the last descriptor drops the flock


def _close_locks_in_child() -> None:
    # The flock belongs to the open file, shared with the parent: closing the child's
    # copy leaves the parent's lock in place.
    for fd in _HELD:
        with contextlib.suppress(OSError):
            os.close(fd)
    _HELD.clear()


os.register_at_fork(after_in_child=_close_locks_in_child)


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


class _PlainUnpickler(pickle.Unpickler):
    """Builds dicts, lists, strings and numbers only: never calls anything."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"{module}.{name} is not plain data")


def _meta_term(path: str) -> int | None:
    """The current term stored in ``<journal>.meta``; None if there is no meta file."""
    meta_path = path + ".meta"
    try:
        with open(meta_path, "rb") as f:
            raw = f.read(1 << 20)
    except FileNotFoundError:
        return None
    try:
        meta = _PlainUnpickler(io.BytesIO(raw)).load()
    except Exception as exc:  # noqa: BLE001 - any decoding failure is corruption
        raise CorruptJournal(meta_path, 0, f"unreadable meta ({type(exc).__name__})") from None
    term = meta.get("currentTerm", 0) if isinstance(meta, dict) else None
    if isinstance(term, bool) or not isinstance(term, int) or not 0 <= term < MAX_SANE_TERM:
        raise CorruptJournal(meta_path, 0, f"current term {term!r:.40} is not a sane term")
    return term


def check_node_files(node_dir: str, journal_file: str, dump_file: str) -> None:
    """The boot check of a node's Raft files: the journal (:func:`check_journal`) and the
    snapshot it relies on. pysyncobj logs a snapshot it cannot load and replays the
    journal onto an empty state: after a compaction that is a silently partial state."""
    path = os.path.join(node_dir, journal_file)
    check_journal(path)
    dump = os.path.join(node_dir, dump_file)
    first = _first_index(path)
    if not os.path.exists(dump):
        if first is not None and first > 1:
            raise CorruptJournal(path, FIRST_RECORD_OFFSET,
                                 f"the journal starts at entry {first} (compacted) but the "
                                 f"snapshot {dump} holding what came before is missing")
        return
    _check_gzip(dump)


def _first_index(path: str) -> int | None:
    try:
        with open(path, "rb") as f:
            head = f.read(FIRST_RECORD_OFFSET + 12)
    except FileNotFoundError:
        return None
    if len(head) < FIRST_RECORD_OFFSET + 12:
        return None
    (end,) = struct.unpack_from("<I", head, _LAST_OFFSET_AT)
    if end <= FIRST_RECORD_OFFSET:
        return None
    return int(struct.unpack_from("<Q", head, FIRST_RECORD_OFFSET + 4)[0])


def _check_gzip(path: str) -> None:
    """Read the whole gzip stream: its CRC and length catch a torn or damaged snapshot."""
    done = 0
    try:
        with gzip.open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                done += len(chunk)
    except (OSError, EOFError, zlib.error) as exc:
        raise CorruptJournal(path, done, f"damaged snapshot ({type(exc).__name__}: "
                                         f"{str(exc)[:80]}), at {done} bytes of its "
                                         f"uncompressed data") from None
    if done == 0:
        raise CorruptJournal(path, 0, "empty snapshot")


def check_journal(path: str) -> int:
    """Raise CorruptJournal (naming file and byte offset) unless the journal at ``path``
    is well formed; returns its record count. A missing journal is a new node's: fine."""
    if not os.path.exists(path):
        return 0
    max_term = _meta_term(path)
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < FIRST_RECORD_OFFSET:
            raise CorruptJournal(path, 0, f"{size} bytes is shorter than the header")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            return _check_records(path, mm, size, max_term)


def _check_records(path: str, mm: mmap.mmap, size: int, max_term: int | None) -> int:
    if mm[:_NAME_SIZE].rstrip(b"\0") != _APP_NAME:
        raise CorruptJournal(path, 0, "not a pysyncobj journal (bad header name)")
    version, end = struct.unpack_from("<II", mm, _NAME_SIZE + _VERSION_SIZE)
    if version != _FORMAT_VERSION:
        raise CorruptJournal(path, _NAME_SIZE + _VERSION_SIZE,
                             f"format version {version}, expected {_FORMAT_VERSION}")
    if not FIRST_RECORD_OFFSET <= end <= size:
        raise CorruptJournal(path, _LAST_OFFSET_AT,
                             f"records end at {end}, outside {FIRST_RECORD_OFFSET}..{size}")
    offset, count, prev_idx, prev_term = FIRST_RECORD_OFFSET, 0, None, 0
    while offset < end:
        if offset + 4 + 16 + 4 > end:
            raise CorruptJournal(path, offset, "a record is cut off")
        (rec,) = struct.unpack_from("<I", mm, offset)
        if rec < 16 or offset + 4 + rec + 4 > end:
            raise CorruptJournal(path, offset, f"record size {rec} does not fit")
        (trailer,) = struct.unpack_from("<I", mm, offset + 4 + rec)
        if trailer != rec:
            raise CorruptJournal(path, offset, f"record size {rec} and trailer {trailer} differ")
        idx, term = struct.unpack_from("<QQ", mm, offset + 4)
        if prev_idx is not None and idx != prev_idx + 1:
            raise CorruptJournal(path, offset, f"entry index {idx} follows {prev_idx}")
        if idx < 1:
            raise CorruptJournal(path, offset, f"entry index {idx}")
        if term < prev_term or term >= MAX_SANE_TERM:
            raise CorruptJournal(path, offset, f"entry {idx} has term {term} after {prev_term}")
        if max_term is not None and term > max_term:
            raise CorruptJournal(path, offset, f"entry {idx} has term {term}, beyond the "
                                               f"current term {max_term} in the meta file")
        prev_idx, prev_term = idx, term
        offset += rec + 8
        count += 1
    return count


def announce_secret(api_addr: str, secret_path: str) -> str | None:
    """Say where the generated secret is, and leave the pointer local clients follow;
    the pointer's path, or None if it could not be written (clients then need
    $RAFTSCHED_SECRET_FILE)."""
    try:
        pointer = register(api_addr, secret_path)
    except OSError as exc:
        log.warning("no cluster secret configured: Raft and the API use the secret generated "
                    "in %s; local clients cannot find it (%s): export RAFTSCHED_SECRET_FILE=%s",
                    secret_path, exc, secret_path)
        return None
    log.info("no cluster secret configured: Raft and the API use the secret generated in %s "
             "(mode 0600); clients of this user on this host find it", secret_path)
    return pointer


class NoLock:
    """The lock of a data dir not made yet (taken once the dir is made)."""

    def release(self) -> None:
        pass


def refuse_early(cfg: ClusterConfig, node_id: str, node_dir: str, *,
                 serves_metrics: bool) -> DataDirLock | NoLock:
    """What can refuse a node's start, checked before anything is written (a node
    started in the wrong directory left a stray ``./raftsched-data`` behind when its
    bind failed): DataDirLocked when the data dir exists and another process runs this
    node in it, then PortsTaken when another process holds one of the node's ports.
    Returns the data dir's lock, held (NoLock when there is no dir yet)."""
    lock: DataDirLock | NoLock = DataDirLock(node_dir) if os.path.isdir(node_dir) \
        else NoLock()
    me = cfg.node(node_id)
    try:
        try:
            ports.refuse_taken(node_id, ports.node_ports(
                me.raft, me.api, me.metrics if serves_metrics else None, me.http, node_id))
        except ports.PortsTaken:
            if isinstance(lock, NoLock) and os.path.isdir(node_dir):
                # Made meanwhile: another process is starting this node right now, and
                # its lock says so more plainly than its ports (DataDirLocked if held).
                DataDirLock(node_dir).release()
            raise
    except BaseException:
        lock.release()
        raise
    return lock
