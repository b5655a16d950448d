"""The Raft adapter: the only module that imports pysyncobj.

One ``SyncObjConsumer`` with a single ``@replicated apply(blob)``: the log carries our
own versioned msgpack bytes, never pickled raftsched objects. Snapshots are our
msgpack state; pysyncobj's outer envelope is still pickle, but the state is encoded
lazily through ``__reduce__`` so that the work happens in pysyncobj's forked dump
child, not in the Raft thread (a 1M-job state takes seconds to encode).

Tuning follows the measurements in ``shared/research/pysyncobj-notes.md``: no
append batching (1 ms commits instead of 100 ms), short election timeouts, a short
leader fallback, both journal and dump files in the node's data dir, an explicit
bind address and the cluster secret as pysyncobj's ``password``.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import struct
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, SyncObjConsumer, replicated
from pysyncobj.journal import FIRST_RECORD_OFFSET, FileJournal

from raftsched.codec import decode_command, decode_state, encode_command, encode_state
from raftsched.errors import LimitExceeded, NotReady, Overloaded
from raftsched.procs import die_with_parent
from raftsched.state import ClusterState

log = logging.getLogger("raftsched.raft")

#: Failures after which the command may still commit (pysyncobj notes §1.5).
_MAYBE_COMMITTED = {FAIL_REASON.LEADER_CHANGED, FAIL_REASON.DISCARDED,
                    FAIL_REASON.UNKNOWN_OUTCOME, FAIL_REASON.NOT_LEADER}
_FAIL_NAMES = {v: k for k, v in vars(FAIL_REASON).items() if isinstance(v, int)}


#: Largest append_entries message (one entry is never split below this size).
APPEND_BATCH_BYTES = 4 << 20
#: Largest command we submit: one log entry must never reach APPEND_BATCH_BYTES.
MAX_COMMAND_BYTES = 2 << 20
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
    read = cls._TcpConnection__processRead  # type: ignore[attr-defined]

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

    cls._TcpConnection__processRead = process_read  # type: ignore[attr-defined]
    cls._raftsched_capped = True  # type: ignore[attr-defined]


_cap_raft_messages(MAX_RAFT_MESSAGE)


#: Bytes a journal record adds to its command: size, index, term, size.
_RECORD_OVERHEAD = 4 + 16 + 4


def drop_journal_prefix(journal: Any, count: int) -> bool:
    """``FileJournal.deleteEntriesTo(count)`` with one ``mmap.move``; False (nothing
    done) if the file does not look as expected.

    After a snapshot pysyncobj rewrites every entry it keeps, one Python call each,
    in the Raft thread: the tens of thousands written during a 30 s dump stalled a
    leader past the election timeout (W4 saw the leader change just as the leader's
    own dump ended). Records do not depend on their position, so the kept ones move
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
    mm.move(FIRST_RECORD_OFFSET, start, end - start)
    new_end = FIRST_RECORD_OFFSET + end - start
    journal._FileJournal__currentOffset = new_end
    set_last(new_end)
    del entries[:count]
    return True


#: The name given to pysyncobj's tick thread, which forks the snapshot writer.
RAFT_THREAD_NAME = "raftsched-raft"
#: The snapshot writer's niceness: encoding a million jobs takes it ~20 s of CPU that
#: the live node (commits, heartbeats, runs) should get first.
SNAPSHOT_NICE = 10


def _in_forked_child() -> None:
    """pysyncobj forks a snapshot writer from its tick thread. If the node stops, the
    writer must not outlive it (and later rename a stale snapshot over a newer one);
    it is background work. Forks by other threads (an application embedding the
    scheduler) are not ours to change."""
    if threading.current_thread().name != RAFT_THREAD_NAME:
        return
    die_with_parent()
    with contextlib.suppress(OSError):
        os.nice(SNAPSHOT_NICE)


os.register_at_fork(after_in_child=_in_forked_child)


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


class _RaftSyncObj(SyncObj):  # type: ignore[misc]
    """SyncObj with Raft's rule for a follower's log on append_entries (§5.3).

    pysyncobj 0.3.17 deletes every entry after ``prevLogIdx`` whenever the follower holds
    more, then appends what came, even when what came is entries the follower already
    holds (a leader re-sending from a stale next index, which happens under load: the
    ``truncating already-applied log entries`` CRITICAL line). Entries it had
    acknowledged are gone: if the leader dies before re-sending them, a committed and
    applied entry may be on no majority any more and the state machines can diverge.
    Here the entries the follower holds are dropped from the message first; what is
    left is truncated only from a real conflict. When nothing is left the log is kept
    as is, and the commit index may not pass the last entry the leader vouched for.
    """

    _rs_keep_log = False

    def _SyncObj__onMessageReceived(self, node: Any, message: Any) -> None:
        entries = message.get("entries") if isinstance(message, dict) else None
        if (entries and message.get("type") == "append_entries" and "prevLogIdx" in message
                and "transmission" not in message):
            held = self._SyncObj__getEntries(message["prevLogIdx"], len(entries) + 1)
            n = known_prefix(message["prevLogTerm"], entries, held)
            if n:
                last = entries[n - 1]
                message = dict(message, prevLogIdx=last[1], prevLogTerm=last[2],
                               entries=entries[n:])
                if n == len(entries):
                    leader_commit = message["commit_index"]
                    message["commit_index"] = min(leader_commit, last[1])
                    current = message["term"] >= self._SyncObj__raftCurrentTerm
                    self._rs_keep_log = _KEEPING.active = True
                    try:
                        return super()._SyncObj__onMessageReceived(node, message)  # type: ignore[no-any-return]
                    finally:
                        self._rs_keep_log = _KEEPING.active = False
                        if current:
                            # The cap is for this node's commit index only; readiness
                            # (caught up with the leader) must see the leader's own.
                            self._SyncObj__leaderCommitIndex = leader_commit
        return super()._SyncObj__onMessageReceived(node, message)  # type: ignore[no-any-return]

    def _SyncObj__deleteEntriesFrom(self, from_idx: int) -> None:
        if not self._rs_keep_log:
            super()._SyncObj__deleteEntriesFrom(from_idx)

    def _SyncObj__deleteEntriesTo(self, to_idx: int) -> None:
        raft_log = self._SyncObj__raftLog
        if isinstance(raft_log, FileJournal) and len(raft_log) \
                and drop_journal_prefix(raft_log, to_idx - raft_log[0][1]):
            return
        super()._SyncObj__deleteEntriesTo(to_idx)


class _KeptLogFilter(logging.Filter):
    """pysyncobj logs its truncation CRITICAL before deleting; when _RaftSyncObj keeps
    the log, nothing is truncated and the line would be false."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith("truncating already-applied"):
            return True
        return not getattr(_KEEPING, "active", False)


_KEEPING = threading.local()
logging.getLogger("pysyncobj.syncobj").addFilter(_KeptLogFilter())


class _Snapshot:
    """Pickled by pysyncobj in its dump child; reduces to plain msgpack bytes."""

    def __init__(self, state: ClusterState) -> None:
        self.state = state

    def __reduce__(self) -> tuple[Any, ...]:
        return (bytes, (encode_state(self.state),))


class _Consumer(SyncObjConsumer):
    def __init__(self, owner: RaftNode) -> None:
        super().__init__()
        self.owner = owner

    @replicated
    def apply(self, blob: bytes) -> Any:
        return self.owner._apply(blob)

    def _serialize(self) -> Any:
        return _Snapshot(self.owner.state)

    def _deserialize(self, data: Any) -> None:
        self.owner._restore(data)


class RaftNode:
    """A node's replica of the cluster state and its door to the log.

    :param self_addr: this node's Raft ``host:port`` (also the bind address).
    :param peers: the other members' Raft addresses.
    :param data_dir: where the journal and dump files live.
    :param secret: the cluster secret (pysyncobj password), or None on loopback.
    :param timing: the config's ``Timing`` record.
    :param on_effects: called in the Raft thread with each apply's effects; keep it short.
    :param history_limit: runs kept per job.
    :param max_pending: commands in flight from this node before ``Overloaded``.
    """

    def __init__(self, *, self_addr: str, peers: list[str], data_dir: str, secret: str | None,
                 timing: Any, on_effects: Callable[[list[tuple[Any, ...]]], None],
                 history_limit: int = 100, max_pending: int = 10000,
                 on_state_changed: Callable[[int, int], None] | None = None) -> None:
        os.makedirs(data_dir, exist_ok=True)
        self.lock = threading.Lock()
        self.state = ClusterState(history_limit=history_limit)
        self.on_effects = on_effects
        self.max_pending = max_pending
        self._pending = 0
        self._pending_lock = threading.Lock()
        self.apply_seconds = 0.0
        self.apply_count = 0
        self.restored = 0
        self.self_addr = self_addr
        self.peers = list(peers)
        conf = SyncObjConf(
            bindAddress=self_addr,
            password=secret,
            journalFile=os.path.join(data_dir, "raft.journal"),
            fullDumpFile=os.path.join(data_dir, "raft.dump"),
            appendEntriesUseBatch=False,
            appendEntriesPeriod=timing.append_period_ms / 1000,
            raftMinTimeout=timing.election_timeout_min_ms / 1000,
            raftMaxTimeout=timing.election_timeout_max_ms / 1000,
            connectionTimeout=timing.connection_timeout_ms / 1000,
            leaderFallbackTimeout=timing.leader_fallback_ms / 1000,
            connectionRetryTime=0.5,
            # pysyncobj 0.3.17 chunks an entry of at least this size and marks the last
            # chunk by the raw command length, not the pickled one (longer for bytes
            # >= 0x80): followers then fail to unpickle it (bench/repro_big_entry.py).
            # Our entries stay far below this, so the chunked path is never taken.
            appendEntriesBatchSizeBytes=APPEND_BATCH_BYTES,
            # Restart replays the log since the last snapshot (~0.35 ms per entry here):
            # 20k entries keep that near 7 s; a snapshot is a forked child's work.
            logCompactionMinEntries=20_000,
            logCompactionMinTime=600,
            commandsWaitLeader=True,
            maxBindRetries=30,
            bindRetryTime=0.2,
            onStateChanged=on_state_changed,
            # A lone node has no peer replies to wake its poller, so an entry would wait
            # a whole tick (50 ms) to commit; tick faster instead.
            autoTickPeriod=0.002 if not peers else 0.05,
        )
        self._consumer = _Consumer(self)
        self.sync = _RaftSyncObj(self_addr, self.peers, conf=conf, consumers=[self._consumer])
        tick_thread = getattr(self.sync, "_SyncObj__thread", None)
        if tick_thread is not None:
            tick_thread.name = RAFT_THREAD_NAME
        self.self_node = self.sync.selfNode
        self.peer_nodes = {str(n.address if hasattr(n, "address") else n): n
                           for n in self.sync.otherNodes}

    # ---------------------------------------------------------------- apply side

    def _apply(self, blob: bytes) -> Any:
        t0 = time.perf_counter()
        cmd = decode_command(blob)
        with self.lock:
            if cmd is None:
                self.state.applied += 1
                reply: Any = {"ok": False, "error": {"code": "protocol_error",
                                                     "message": "undecodable command"}}
            else:
                reply = self.state.apply(cmd)
            effects = self.state.take_effects()
        self.apply_seconds += time.perf_counter() - t0
        self.apply_count += 1
        if effects:
            try:
                self.on_effects(effects)
            except Exception:  # noqa: BLE001 - a listener bug must not wedge the Raft thread
                log.exception("effect listener failed")
        return reply

    def _restore(self, data: Any) -> None:
        try:
            state = decode_state(bytes(data))
        except Exception:  # noqa: BLE001 - keep the node up; it will catch up from peers
            log.exception("could not restore the state snapshot")
            return
        with self.lock:
            self.state = state
            self.restored += 1
        # The restored state lives as long as the process: keep the collector off it.
        gc.freeze()
        try:
            self.on_effects([("restored",)])
        except Exception:  # noqa: BLE001
            log.exception("effect listener failed")

    # ---------------------------------------------------------------- submit side

    def submit(self, cmd: dict[str, Any]) -> Future[Any]:
        """Propose a command; the future resolves with the apply reply on this node, or
        fails with :class:`NotReady` (``maybe_committed`` tells if it may still land)."""
        fut: Future[Any] = Future()
        with self._pending_lock:
            if self._pending >= self.max_pending:
                raise Overloaded("max_pending_commands",
                                 f"{self._pending} commands already in flight on this node")
            self._pending += 1
        blob = encode_command(cmd)
        if len(blob) > MAX_COMMAND_BYTES:
            with self._pending_lock:
                self._pending -= 1
            raise LimitExceeded("max_command_bytes",
                                f"a {cmd.get('op')} command of {len(blob)} bytes is over "
                                f"{MAX_COMMAND_BYTES}; send fewer items at once")

        def done(result: Any, error: int) -> None:
            with self._pending_lock:
                self._pending -= 1
            if fut.done():
                return
            if error == FAIL_REASON.SUCCESS:
                fut.set_result(result)
            else:
                name = _FAIL_NAMES.get(error, str(error))
                fut.set_exception(NotReady(f"command not committed: {name}",
                                           maybe_committed=error in _MAYBE_COMMITTED))

        try:
            self._consumer.apply(blob, callback=done)
        except Exception as exc:  # noqa: BLE001 - e.g. the queue is full
            done(None, FAIL_REASON.QUEUE_FULL)
            log.debug("submit failed: %s", exc)
        return fut

    @property
    def pending(self) -> int:
        return self._pending

    # ---------------------------------------------------------------- views

    def is_leader(self) -> bool:
        return bool(self.sync._isLeader())

    def leader_addr(self) -> str | None:
        leader = self.sync._getLeader()
        return None if leader is None else str(getattr(leader, "address", leader))

    def term(self) -> int:
        return int(self.sync.raftCurrentTerm)

    def connected_peers(self) -> dict[str, bool]:
        """Raft address -> is the TCP connection to it up (a SIGKILL shows in ~5 ms)."""
        return {addr: bool(self.sync.isNodeConnected(node))
                for addr, node in self.peer_nodes.items()}

    def ready(self) -> bool:
        """True once this replica has applied the log up to the leader's commit index
        after start (before that its state may be a half-replayed past)."""
        return bool(self.sync.isReady())

    def has_quorum(self) -> bool:
        return bool(self.sync.hasQuorum)

    def status(self) -> dict[str, Any]:
        try:
            return dict(self.sync.getStatus())
        except Exception:  # noqa: BLE001 - status is best effort
            return {}

    def tick_alive(self) -> bool:
        return bool(self.sync.tick_thread_alive())

    def destroy(self) -> None:
        try:
            self.sync.destroy()
        except Exception:  # noqa: BLE001
            log.debug("destroy failed", exc_info=True)
