"""The Raft adapter: with ``compat`` (the checked list of pysyncobj's internals it
patches), ``raftsync`` and ``prevote`` (the patched SyncObj) and ``durable`` (its
journal) the only modules that import pysyncobj.

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
import errno
import logging
import os
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from pysyncobj import (
    FAIL_REASON,
    SyncObjConf,
    SyncObjConsumer,
    SyncObjException,
    replicated,
)

from raftsched.core.codec import encode_command, encode_state
from raftsched.core.commands import Command
from raftsched.core.effects import Effect
from raftsched.core.errors import LimitExceeded, NotReady, Overloaded
from raftsched.core.machine import ClusterState
from raftsched.node.observe import gcwatch
from raftsched.node.replica.compat import derive_key, install, raft_now
from raftsched.node.replica.durable import (
    DEFAULT_DURABILITY,
    DURABILITY_MODES,
    install_durable_snapshots,
)
from raftsched.node.replica.procs import die_with_parent
from raftsched.node.replica.raftkeys import RaftKeyring
from raftsched.node.replica.raftsync import RaftSyncObj
from raftsched.node.replica.raftview import RaftView
from raftsched.node.replica.replica import Replica

log = logging.getLogger("raftsched.raft")
T = TypeVar("T")

#: Failures after which the command may still commit (pysyncobj notes §1.5).
_MAYBE_COMMITTED = {FAIL_REASON.LEADER_CHANGED, FAIL_REASON.DISCARDED,
                    FAIL_REASON.UNKNOWN_OUTCOME, FAIL_REASON.NOT_LEADER}
_FAIL_NAMES = {v: k for k, v in vars(FAIL_REASON).items() if isinstance(v, int)}
#: pysyncobj's leader role (``_RAFT_STATE.LEADER``) as passed to ``onStateChanged``.
_LEADER = 2


#: Largest append_entries message (one entry is never split below this size).
APPEND_BATCH_BYTES = 4 << 20
#: Largest command we submit: one log entry must never reach APPEND_BATCH_BYTES.
MAX_COMMAND_BYTES = 2 << 20
#: The journal's file name in the node's data dir (checked at boot by node.datadir).
JOURNAL_FILE = "raft.journal"
#: The snapshot's file name beside it.
DUMP_FILE = "raft.dump"
#: How long a leader holds new commands back while it hands leadership over.
TRANSFER_HOLD_S = 0.3

#: The name given to pysyncobj's tick thread, which forks the snapshot writer.
RAFT_THREAD_NAME = "raftsched-raft"
#: How soon a node dials a peer again after a connection to it failed or dropped.
#: pysyncobj dials from the higher address only, so a restarted node with the lower
#: one waits for its peers' next attempt: at pysyncobj's 0.5 s that was most of an
#: empty node's restart (named its leader 0.51-0.59 s after start, its port open at
#: 0.27-0.40 s). A refused attempt costs a socket; an unanswered one waits out the
#: connection timeout before the next, so a partition makes no storm of them.
RECONNECT_S = 0.1
#: Entries after which a snapshot is written. A restarted node replays the entries
#: since its last snapshot before it answers a vote: measured with three nodes restarted
#: at once on 2 cores, a leader with a quorum came back 3.6-4.0 s after the start with
#: 10,700 entries to replay (no snapshot), 2.0-2.15 s with snapshots every 5,000, and
#: 0.8-1.0 s with almost no log. A snapshot is a forked child's work (SNAPSHOT_NICE).
#: Each node draws its own threshold once, between this and 1.5 times it
#: (:func:`compaction_entries`): every node's log has the same length, so with one
#: threshold all three wrote their snapshots at the same moment, and a storm of 5,000
#: runs/s (~280 entries/s: a snapshot every ~18 s) lost its leader's and both
#: followers' spare CPU together for ~5 s - the fire times of those seconds were late,
#: coalesced or skipped for overlap (bench/results/2026-12-04-snapshot-storm.md).
LOG_COMPACTION_ENTRIES = 5_000
#: The snapshot writer's niceness: encoding a million jobs takes it ~20 s of CPU that
#: the live node (commits, heartbeats, runs) should get first. (Not SCHED_IDLE: on a
#: host kept busy a writer that never ran would let the log grow without bound.)
SNAPSHOT_NICE = 19


#: The log's growth in bytes since the last snapshot that makes one due however few
#: its entries (raftsync.RaftSyncObj.rs_compaction_bytes): a million jobs put in batches
#: of 1,000 are 1,000 entries of ~100 KB, all held in memory until the snapshot.
LOG_COMPACTION_BYTES = 32 << 20


def compaction_bytes(base: int = LOG_COMPACTION_BYTES) -> int:
    """This process's byte bound, ``base`` to ``1.5 * base``, drawn once: every node's
    log has the same bytes, and with one bound all would dump at the same entry."""
    return base + random.randrange(base // 2 + 1)


def compaction_entries(base: int = LOG_COMPACTION_ENTRIES) -> int:
    """This process's snapshot threshold: ``base`` to ``1.5 * base`` entries, drawn once,
    so that the members of a cluster write their snapshots at different moments."""
    return base + random.randrange(base // 2 + 1)


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


class _Snapshot:
    """Pickled by pysyncobj in its dump child; reduces to plain msgpack bytes."""

    def __init__(self, state: ClusterState) -> None:
        self.state = state

    def __reduce__(self) -> tuple[Any, ...]:
        with gcwatch.paused():
            return (bytes, (encode_state(self.state),))


class _Consumer(SyncObjConsumer):
    def __init__(self, replica: Replica) -> None:
        super().__init__()
        self.replica = replica

    @replicated
    def apply(self, blob: bytes) -> Any:
        return self.replica.apply(blob)

    def _serialize(self) -> Any:
        return _Snapshot(self.replica.state)

    def _deserialize(self, data: Any) -> None:
        self.replica.restore(data)


def _op_of(cmd: Command | dict[str, Any]) -> Any:
    return cmd.OP if isinstance(cmd, Command) else cmd.get("op")


class RaftNode(RaftView):
    """A node's replica of the cluster state and its door to the log: pysyncobj, the
    submit side and the node's view of Raft (roles, terms, peers), around the
    :class:`~raftsched.node.replica.replica.Replica` that applies and serves reads.

    :param self_addr: this node's Raft ``host:port`` (also the bind address).
    :param peers: the other members' Raft addresses.
    :param data_dir: where the journal and dump files live.
    :param secret: the cluster secret (pysyncobj password), or None on loopback; or the
        keyring (the used secret first) of a rotation, see :mod:`raftkeys`.
    :param timing: the config's ``Timing`` record.
    :param on_effects: called in the Raft thread with each apply's effects; keep it short.
    :param history_limit: runs kept per job.
    :param max_pending: commands in flight from this node before ``Overloaded``.
    :param join: this node was started to be added to a running cluster: it starts no
        election before a leader has reached it (only a member is reached).
    :param on_fatal: called (Raft thread) once when this replica meets a log entry or a
        snapshot in a format it cannot read; the node must stop (see :meth:`_refuse`).
    :param auto_tick: False: no Raft thread; the caller drives the replica with
        :meth:`tick` (the in-process test cluster does).
    :param durability: ``"sync"`` (group commit: nothing counts before it is on disk,
        see :mod:`raftsched.node.replica.durable`) or ``"none"`` (pysyncobj's own behaviour).
    """

    def __init__(self, *, self_addr: str, peers: list[str], data_dir: str,
                 secret: str | list[str] | None,
                 timing: Any, on_effects: Callable[[list[Effect]], None],
                 history_limit: int = 100, max_pending: int = 10000,
                 on_state_changed: Callable[[int, int], None] | None = None,
                 on_fatal: Callable[[str], None] | None = None, join: bool = False,
                 auto_tick: bool = True, durability: str = DEFAULT_DURABILITY) -> None:
        install()  # refuses a pysyncobj whose internals the patches do not match
        if durability not in DURABILITY_MODES:
            raise ValueError(f"durability {durability!r} is not one of {DURABILITY_MODES}")
        install_durable_snapshots()
        os.makedirs(data_dir, exist_ok=True)
        self.max_pending = max_pending
        self._pending = 0
        #: The Raft thread's last tick (monotonic) and the longest gap between two
        #: ticks since :meth:`take_tick_gap` last read it: a thread starved of the GIL
        #: or the CPU sends no heartbeats meanwhile (admission control's signal).
        self._last_tick = time.monotonic()
        self._tick_gap = 0.0
        self._pending_lock = threading.Lock()
        self.self_addr = self_addr
        self.peers = list(peers)
        self._on_state_changed = on_state_changed
        self._tick_actions: deque[Callable[[], None]] = deque()
        #: The term in which this node became leader, None while it is not leader; set
        #: in the Raft thread at the transition, so (leader, term) is never torn.
        self._lead_term: int | None = None
        secrets = [secret] if isinstance(secret, str) else list(secret or [])
        #: pysyncobj's encryptor (None without a secret); ``set_secrets`` rotates it.
        self.keyring = RaftKeyring(secrets, derive_key) if secrets else None
        conf = SyncObjConf(
            bindAddress=self_addr,
            password=self.keyring,
            journalFile=os.path.join(data_dir, JOURNAL_FILE),
            fullDumpFile=os.path.join(data_dir, DUMP_FILE),
            appendEntriesUseBatch=False,
            appendEntriesPeriod=timing.append_period_ms / 1000,
            raftMinTimeout=timing.election_timeout_min_ms / 1000,
            raftMaxTimeout=timing.election_timeout_max_ms / 1000,
            connectionTimeout=timing.connection_timeout_ms / 1000,
            leaderFallbackTimeout=timing.leader_fallback_ms / 1000,
            connectionRetryTime=RECONNECT_S,
            # pysyncobj 0.3.17 chunks an entry of at least this size and marks the last
            # chunk by the raw command length, not the pickled one (longer for bytes
            # >= 0x80): followers then fail to unpickle it (bench/repro_big_entry.py).
            # Our entries stay far below this, so the chunked path is never taken.
            appendEntriesBatchSizeBytes=APPEND_BATCH_BYTES,
            # Restart replays the log since the last snapshot before this node can vote
            # (~0.3 ms per entry with three nodes starting on 2 cores): the cluster's
            # recovery from a restart grows with it (see LOG_COMPACTION_ENTRIES).
            logCompactionMinEntries=compaction_entries(),
            logCompactionMinTime=600,
            commandsWaitLeader=True,
            # Members are added and removed through the log (cluster add-node/remove-node);
            # after the first boot the membership in the snapshot and the log wins over
            # the peers given here (pysyncobj issue #133).
            dynamicMembershipChange=True,
            maxBindRetries=30,
            bindRetryTime=0.2,
            onStateChanged=self._state_changed,
            # A message, a submitted command, a finished sync or a lone leader's own
            # append (raftsync.RaftSyncObj._checkCommandsToApply) wakes the poller at
            # once; what the tick itself does (the leader's appends, a follower's
            # election deadline) is paced by the append period: ticking faster than it
            # only burns an idle node's CPU.
            autoTickPeriod=timing.append_period_ms / 1000,
            # False: no Raft thread; whoever made the replica calls tick() (several
            # replicas in one test thread, each paused by not being ticked).
            autoTick=auto_tick,
        )
        # Made before pysyncobj's thread can tick (it starts inside __init__, and the
        # journal's replay applies through the replica).
        self.sync = RaftSyncObj.__new__(RaftSyncObj)
        self.replica = Replica(sync=self.sync, history_limit=history_limit,
                               on_effects=on_effects, on_fatal=on_fatal)
        self._consumer = _Consumer(self.replica)
        self.sync._rs_joining = join
        self.sync._rs_sync_journal = durability == "sync"
        self.sync.rs_compaction_bytes = compaction_bytes()
        self.sync._rs_quick_spread_s = timing.election_timeout_min_ms / 2000
        # Well inside the connection timeout: an idle connection is never dropped.
        self.sync._rs_ping_every_s = timing.connection_timeout_ms / 4000
        # Pre-vote: a node back from a pause, a partition or a stall of its own Raft
        # thread (a loaded host) never deposes a working leader (prevote.PreVoteSyncObj).
        self.sync._rs_prevote = os.environ.get("RAFTSCHED_PREVOTE", "1") != "0"
        self.sync.__init__(self_addr, self.peers, conf=conf,  # type: ignore[misc]
                           consumers=[self._consumer])
        self.sync.addOnTickCallback(self._run_tick_actions)
        tick_thread = getattr(self.sync, "_SyncObj__thread", None)
        if tick_thread is not None:
            tick_thread.name = RAFT_THREAD_NAME
        try:
            # pysyncobj binds in its thread and would only log a busy port; say it here.
            self.sync.waitBinded()
        except SyncObjException:
            self.destroy(wait_s=5.0)
            raise OSError(errno.EADDRINUSE, f"raft address {self_addr} cannot be bound "
                                            f"(in use by another process?)") from None

    def seal(self) -> str | None:
        """How this node seals its Raft messages now: "aead", "fernet", or None (no
        secret: nothing sealed)."""
        if self.keyring is None:
            return None
        return "aead" if self.keyring.aead else "fernet"

    def set_secrets(self, secrets: list[str]) -> None:
        """A new keyring (the used secret first): every connection, open or new, seals
        with the first and opens what any of them sealed from now on."""
        if self.keyring is not None:
            self.keyring.set(secrets)

    # ---------------------------------------------------------------- apply side

    def _state_changed(self, old: int, new: int) -> None:
        """Raft thread, at each role change (0 follower, 1 candidate, 2 leader)."""
        self._lead_term = int(self.sync.raftCurrentTerm) if new == _LEADER else None
        if new != _LEADER:
            self.sync._rs_hold_until = 0.0  # a follower forwards at once
        if old == _LEADER and new != _LEADER:
            # Rare in a healthy cluster, and the first thing to read after a term change.
            log.warning("stepped down as leader in term %d (now %s)",
                        int(self.sync.raftCurrentTerm), "candidate" if new == 1 else "follower")
            self.sync.rs_stepped_down()
        if self._on_state_changed is not None:
            try:
                self._on_state_changed(old, new)
            except Exception:  # noqa: BLE001 - a listener bug must not stop the Raft thread
                log.exception("state change listener failed")

    # ---------------------------------------------------------------- submit side

    def submit(self, cmd: Command | dict[str, Any]) -> Future[Any]:
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
                                f"a {_op_of(cmd)} command of {len(blob)} bytes is over "
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

    # ---------------------------------------------------------------- leadership, membership

    def transfer_leadership(self, target: str | None = None) -> Future[bool]:
        """Ask pysyncobj to hand leadership to ``target`` (a Raft address) or, if None,
        to the most caught-up connected peer (Raft's TimeoutNow). Runs in the Raft
        thread (pysyncobj's transport is not thread-safe); the future says whether the
        request was sent, not that the transfer completed."""
        fut: Future[bool] = Future()

        def answered(_res: Any, err: int) -> None:
            if not fut.done():
                fut.set_result(err == FAIL_REASON.SUCCESS)

        def action() -> None:
            self.sync._rs_hold_until = raft_now() + TRANSFER_HOLD_S
            try:
                self.sync.transferLeadership(target, callback=answered)
            except Exception as exc:  # noqa: BLE001 - best effort, reported to the caller
                if not fut.done():
                    fut.set_exception(exc)
            if not fut.done():
                fut.set_result(False)

        self._tick_actions.append(action)
        return fut

    def _run_tick_actions(self) -> None:
        """Raft thread, every tick: run what other threads asked to run there. (One
        permanent tick callback: pysyncobj holds a non-reentrant lock around them, so a
        callback that unregistered itself deadlocked the Raft thread.)"""
        now = time.monotonic()
        # Less what the last poll chose to wait beyond a period (a calm idle leader
        # sleeps until its spaced appends: replica/pacing.py), as the stall window does.
        gap = now - self._last_tick - self.sync._rs_waited_beyond
        self._last_tick = now
        if gap > self._tick_gap:
            self._tick_gap = gap
        while self._tick_actions:
            try:
                self._tick_actions.popleft()()
            except Exception:  # noqa: BLE001 - never let one action stop the Raft thread
                log.exception("raft tick action failed")

    def change_membership(self, action: str, addr: str) -> Future[int]:
        """Propose pysyncobj's own membership entry (``add`` or ``remove`` the member at
        Raft address ``addr``); the future gets pysyncobj's FAIL_REASON (0 = committed).
        One change at a time: the leader refuses (REQUEST_DENIED) while another is not
        yet applied, or before its own first entry of the term is."""
        fut: Future[int] = Future()

        def done(_result: Any, error: int) -> None:
            if not fut.done():
                fut.set_result(int(error))

        try:
            if action == "add":
                self.sync.addNodeToCluster(addr, callback=done)
            else:
                self.sync.removeNodeFromCluster(addr, callback=done)
        except Exception as exc:  # noqa: BLE001 - reported to the caller
            fut.set_exception(exc)
        return fut

    def tick(self, wait_s: float = 0.0) -> None:
        """One step of the Raft thread's work (socket events, timers, applies, tick
        actions), waiting up to ``wait_s`` for a socket event: only for a replica made
        with ``auto_tick=False``, which has no Raft thread of its own."""
        self.sync.doTick(wait_s)

    # ---------------------------------------------------------------- lifecycle

    def destroy(self, wait_s: float = 0.0) -> None:
        """Stop the Raft thread; wait up to ``wait_s`` for it to end (the journal is
        closed then, and another node may open it)."""
        try:
            self.sync.destroy()
        except Exception:  # noqa: BLE001
            log.debug("destroy failed", exc_info=True)
        thread = getattr(self.sync, "_SyncObj__thread", None)
        if wait_s > 0 and thread is not None and thread is not threading.current_thread():
            thread.join(wait_s)


def write_seed_dump(node_dir: str, state_blob: bytes, index: int, members: list[str]) -> str:
    """Write ``state_blob`` (``encode_state`` bytes) as the snapshot a new node starts
    from (``raftsched restore``): pysyncobj's dump file, at log ``index`` (term 0) with
    ``members`` (Raft addresses) as its voting set. Every node seeded from the same
    backup holds the same log; a node started empty gets the snapshot from the leader."""
    import gzip

    from pysyncobj import pickle as raft_pickle
    from pysyncobj.node import TCPNode

    noop = bytes([1])  # pysyncobj's _COMMAND_TYPE.NO_OP
    data = ([{}, state_blob], (noop, index, 0), (noop, index - 1, 0),
            {TCPNode(addr) for addr in members})
    path = os.path.join(node_dir, DUMP_FILE)
    with open(path + ".tmp", "wb") as f:
        with gzip.GzipFile(fileobj=f, mode="wb") as g:
            raft_pickle.dump(data, g)
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + ".tmp", path)
    return path
