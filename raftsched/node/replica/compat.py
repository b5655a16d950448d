"""Every use of pysyncobj's private internals, in one place, checked at start.

raftsched patches pysyncobj 0.3.17 where upstream is unsafe or too slow for a
scheduler: a follower's log on append_entries (Raft §5.3), the journal compaction's
entry-by-entry rewrite, the size of a message a peer may announce, leadership
transfer under load. Each patch names private (often name-mangled) attributes; a
pysyncobj release that renames one would make an override silently never run — the
log-safety fix among them. So :func:`install` refuses any other pysyncobj version and
checks every attribute it relies on, loudly, before a node starts.
"""

from __future__ import annotations

import contextlib
import logging
import random
import struct
import threading
from typing import Any

from pysyncobj import SyncObj, tcp_connection
from pysyncobj import syncobj as _syncobj_module
from pysyncobj.encryptor import getEncryptor as _get_encryptor
from pysyncobj.journal import FIRST_RECORD_OFFSET, FileJournal, ResizableFile
from pysyncobj.monotonic import monotonic as _pysyncobj_clock
from pysyncobj.version import VERSION

from raftsched.node.replica import pacing, procs, stalls

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
                        "_SyncObj__forceLogCompaction")),
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


#: What a follower sends the peers it otherwise never talks to (RaftSyncObj._rs_ping).
_PING = {"type": "rs_ping"}
#: Pre-vote (Raft thesis §9.6): the ask, and the answer.
PREVOTE = "rs_prevote"
PREVOTE_REPLY = "rs_prevote_reply"
#: Pre-vote rounds refused in a row, while a leader of an older term appends to us,
#: after which a node campaigns without asking (it would never be granted).
PREVOTE_STUCK_ROUNDS = 3


def _node_local(name: str) -> bool:
    """An attribute of this process's replica (``_rs_*``, ``rs_*``): open files, clocks
    of this process, counters. pysyncobj's snapshot holds every attribute of the
    SyncObj it did not have at the end of its ``__init__``; ours must stay out of it."""
    return name.startswith(("_rs_", "rs_"))


class _NotInSnapshot(set[str]):
    """pysyncobj's set of attributes it leaves out of a snapshot
    (``SyncObj.__properies``), which also holds every node-local attribute, whenever
    it was set: a snapshot that pickled the durable journal's open file failed in its
    forked writer at every tick (no snapshot was ever written with ``durability =
    "sync"``: the log grew without bound, and so did a restart's replay)."""

    def __contains__(self, name: object) -> bool:
        return (isinstance(name, str) and _node_local(name)) or set.__contains__(self, name)


class RaftSyncObj(SyncObj):
    """SyncObj with Raft's rule for a follower's log on append_entries (§5.3), and a
    follower that backs a leader up past its conflicting entries in one step.

    pysyncobj 0.3.17 deletes every entry after ``prevLogIdx`` whenever the follower holds
    more, then appends what came, even when what came is entries the follower already
    holds (a leader re-sending from a stale next index, which happens under load: the
    ``truncating already-applied log entries`` CRITICAL line). Entries it had
    acknowledged are gone: if the leader dies before re-sending them, a committed and
    applied entry may be on no majority any more and the state machines can diverge.
    Here the entries the follower holds are dropped from the message first; what is
    left is truncated only from a real conflict. When nothing is left the log is kept
    as is, and the commit index may not pass the last entry the leader vouched for.

    When the entry at ``prevLogIdx`` conflicts, pysyncobj's follower answers "try
    ``prevLogIdx``", so a leader backs up one entry per round trip (one append period,
    50 ms). Under partitions a minority leader appends for up to the fallback timeout
    what is forwarded to it (heartbeats, read barriers, plans) and never commits it;
    every leader that fails so adds its own such tail. The nemesis met followers whose
    tails conflicted over 485 and more entries: a new leader needed ~25 s of calm to
    walk back to them, the next fault came first, the tails grew, and the cluster had no
    committing leader for minutes (three nodes up, a leader elected every few seconds,
    the commit index frozen). Here the follower also answers "try after my commit
    index": every entry up to it is committed, so the leader holds it too (Raft's
    leader completeness) and the next append matches; backing up further than needed is
    always safe (the matching entries are re-sent and kept, see above).
    """

    _rs_keep_log = False
    #: Until then (monotonic) the leader appends no new command: a leadership transfer
    #: is under way (Raft §3.10), and a newer entry would make the target's election
    #: fail (voters refuse a candidate whose log is behind theirs).
    _rs_hold_until = 0.0
    #: A node started to join a running cluster (``raftsched node --join``) holds its
    #: elections until a leader has reached it, which a leader does only once the node
    #: is a member. pysyncobj has no pre-vote: a non-member campaigning meanwhile (its
    #: outgoing connections count as "connected" until the peer drops them) would
    #: come in with a term far ahead and depose the leader the moment it is added.
    _rs_joining = False
    #: A follower whose connection to its leader closes campaigns within this many
    #: seconds (uniformly drawn), not after a whole election timeout; 0 turns it off.
    _rs_quick_spread_s = 0.0
    #: Seconds between the pings a follower sends the peers it otherwise never talks
    #: to (see :meth:`_rs_ping`); 0 turns them off.
    _rs_ping_every_s = 0.0
    _rs_next_ping = 0.0
    #: Pre-vote on (see :meth:`_rs_before_election`).
    _rs_prevote = False
    #: pysyncobj's election deadline (its clock), stored here: see the property
    #: ``_SyncObj__raftElectionDeadline`` below, which is what its tick reads.
    _rs_deadline = 0.0
    #: A majority answered our pre-vote: the next expired deadline campaigns for real.
    _rs_prevote_won = False
    #: The term we were in when that majority answered.
    _rs_won_in_term = -1
    #: The round in flight: the term asked for, and who granted it.
    _rs_prevote_term = -1
    #: The round's number (answers echo it: a grant of an earlier round asking for the
    #: same term, read late by a peer back from a pause, is not this round's) and when
    #: (monotonic) it asked: a leader heard from since then makes its answers moot.
    _rs_prevote_round = 0
    _rs_prevote_asked_at = float("inf")
    _rs_prevote_grants: frozenset[Any] = frozenset()
    #: When (monotonic) the current leader's last append reached us.
    _rs_leader_seen = 0.0
    #: When a leader of an older term last sent us an append (we are ahead of it).
    _rs_older_leader_seen = 0.0
    #: Rounds in a row that ended without a majority (reset by a current leader).
    _rs_prevote_failures = 0
    #: When (monotonic) this node's Raft thread last ticked (None before its first).
    _rs_last_tick: float | None = None
    #: When it last came back from not running for an election timeout (a SIGSTOP, a VM
    #: pause, a starved host): see :meth:`_rs_prevote_grant`.
    _rs_woke_at = float("-inf")
    #: The log's last index as this tick began (what the tick itself appends is after).
    _rs_tick_index = 0
    #: Real elections this node began (statistics; tests read it).
    rs_elections = 0
    #: This node's Raft-thread stalls (raftsched.node.replica.stalls), from its first tick; a
    #: leader reports the longest recent one in every append (``rs_stall``).
    _rs_stalls: stalls.StallWindow | None = None
    _rs_stall_report = 0.0
    #: What this thread's last poll chose to wait beyond an append period (pacing.py).
    _rs_waited_beyond = 0.0
    #: Which answers to appends go out (pacing.AnswerPacer; made in the first tick).
    _rs_answers: pacing.AnswerPacer | None = None
    #: Whether the poll's wait is paced (_rs_pace_polls has run).
    _rs_pacing = False
    #: Whether the timing leaves room to space empty appends (pacing.may_space; read
    #: from the conf in the first tick).
    _rs_may_space = False
    _rs_stamping = False
    #: The longest recent stall our current leader reported, and how many times this
    #: node waited out a silence of that leader longer than its election timeout.
    rs_leader_stall = 0.0
    rs_silences_waited = 0
    #: raftsched.node.replica.stalls.FACTOR; 0 tolerates only the election timeout.
    _rs_stall_factor = stalls.FACTOR
    #: ``[cluster] durability == "sync"``: group commit (raftsched.node.replica.durable).
    _rs_sync_journal = True
    #: The journal as raftsched.node.replica.durable's DurableJournal, from the first tick on
    #: (None before it, or with an in-memory journal).
    rs_journal: Any = None
    #: A snapshot is due once the log has grown by this many bytes since the last
    #: compaction, however few its entries (pysyncobj counts entries only, and keeps
    #: them all in memory). The node draws its own (raft.compaction_bytes).
    rs_compaction_bytes = 32 << 20
    #: The log's bytes right after the last compaction: a kept tail over the bound (a
    #: leader's uncommitted entries) must not start a dump at every applied entry.
    _rs_bytes_kept = 0
    #: Whether the pending forced compaction is ours (the byte bound's), not a caller's.
    _rs_forced_by_bytes = False
    _rs_sender: Any = None
    _rs_adopted = False
    #: The commit index this node may not go below (a leader's last commit that its
    #: own synced copy covered, or the commit a follower learned from its leader).
    _rs_commit_floor = 0

    def rs_follower_lag(self) -> int:
        """Leader only: how many entries the slowest connected follower lacks of this
        log (0 elsewhere, or alone). Read from another thread: a dict copy and ints,
        consistent enough for a congestion signal (admission control)."""
        if self._SyncObj__raftState != _syncobj_module._RAFT_STATE.LEADER:
            return 0
        last = self._SyncObj__getCurrentLogIndex()
        lag = 0
        for node, idx in list(self._SyncObj__raftMatchIndex.items()):
            if self.isNodeConnected(node):
                lag = max(lag, last - idx)
        return lag

    def _SyncObj__onNodeDisconnected(self, node: Any) -> None:
        """A leader's process that dies (SIGKILL, a crash, an OOM kill) has its sockets
        closed by its kernel at once: its followers read the close. pysyncobj only
        notes it and waits out the election timeout from the leader's last message
        (0.2-0.6 s at the default, most of a failover's cost). Here a follower whose
        connection to its leader closes campaigns after a random part of half the
        minimum timeout: the survivors rarely campaign at once (a split vote falls back
        to the normal timeouts). Only liveness changes: an election is always safe, and
        a leader that is alive but whose connection dropped is deposed by one election,
        as a timeout would have done after its next silence."""
        super()._SyncObj__onNodeDisconnected(node)
        if self._rs_answers is not None:
            # An answer held back may have been the one a dropped connection lost.
            self._rs_answers.forget(node)
        if (self._rs_quick_spread_s > 0 and not self._rs_joining
                and node == self._SyncObj__raftLeader
                and self._SyncObj__raftState == _syncobj_module._RAFT_STATE.FOLLOWER):
            now = raft_now()
            # Once: the reconnect attempts that fail next call this again.
            if self._rs_deadline > now + self._rs_quick_spread_s:
                self._SyncObj__raftElectionDeadline = now + random.uniform(
                    0.0, self._rs_quick_spread_s)

    def _onTick(self, timeToWait: float = 0.0) -> None:
        now = raft_now()
        conf = self._SyncObj__conf
        if self._rs_last_tick is not None:
            # Less what the last poll chose to wait beyond a period (pacing.py).
            gap = now - self._rs_last_tick - self._rs_waited_beyond
            if gap > conf.raftMinTimeout:
                self._rs_woke_at = now
            if self._rs_stalls is None:
                # A tick waits up to an append period when idle: not a stall.
                self._rs_stalls = stalls.StallWindow(
                    floor_s=max(conf.raftMinTimeout / 2, 2 * conf.appendEntriesPeriod))
            self._rs_stalls.note(now, gap)
            self._rs_stall_report = self._rs_stalls.longest(now)
            if gap > conf.raftMinTimeout \
                    and self._SyncObj__raftState == _syncobj_module._RAFT_STATE.LEADER:
                # While this thread did not run, its followers' answers could not be
                # read (and its appends that would have asked for them never left):
                # their silence is our own stall, not their absence. Check-quorum
                # (leader fallback) would step a leader down at the first tick after a
                # stall longer than the fallback (a paused VM, a frozen host); credit
                # the stall, as the node's liveness timers do.
                answered = self._SyncObj__lastResponseTime
                for node in list(answered):
                    answered[node] = min(now, answered[node] + gap)
        self._rs_last_tick = now
        if not self._rs_adopted:
            self._rs_adopt_journal()
        if self._rs_joining:
            if self._SyncObj__raftLeader is not None:
                self._rs_joining = False
            else:
                self._SyncObj__raftElectionDeadline = float("inf")
        if self._rs_prevote:
            self._rs_before_election()  # may read (and append) what waits in the socket
        if self._rs_sender is not None:
            # Before this tick applies anything or the leader counts itself toward a
            # commit (a lone node commits on its own vote alone), what was appended is
            # on disk; a follower's answers to the appends it read leave now, after
            # one sync for all of them.
            self._rs_sender.flush()
        self._rs_tick_index = self._SyncObj__getCurrentLogIndex()
        super()._onTick(timeToWait)
        if self._rs_prevote_won and self._SyncObj__raftCurrentTerm != self._rs_won_in_term:
            # The election it allowed has begun (the term moved): the next one asks
            # again. (Not "no longer a follower": a candidate of a split vote asks too,
            # and must keep its win until it campaigns.)
            self._rs_prevote_won = False
        if self._rs_ping_every_s > 0:
            now = raft_now()
            if now >= self._rs_next_ping:
                self._rs_next_ping = now + self._rs_ping_every_s
                self._rs_ping()

    def _rs_adopt_journal(self) -> None:
        """In the Raft thread's first tick, before it appends or sends anything: the
        journal syncs in batches, in its own thread, and nothing counts before it is
        on disk (raftsched.node.replica.durable)."""
        from pysyncobj.pipe_notifier import PipeNotifier

        from raftsched.node.replica import durable

        self._rs_stamp_appends()
        self._rs_pace_polls()
        wake = PipeNotifier(self._poller).notify if self._rs_sync_journal else None
        journal = durable.adopt(self._SyncObj__raftLog, sync=self._rs_sync_journal,
                                wake=wake)
        if journal is not None:
            self._rs_sender = durable.DurableSender(self._SyncObj__transport, journal)
            self.rs_journal = journal
        # Only now: a journal that cannot be made durable raises here at every tick, and
        # the node never ticks (unavailable, loudly) rather than acknowledging unsynced.
        self._rs_adopted = True

    def _rs_stamp_appends(self) -> None:
        """Every append this node sends as leader says how long its Raft thread has
        recently stalled (raftsched.node.replica.stalls); peers of an older version ignore the
        key, as pysyncobj reads only the keys it knows. An answer to an append that
        acknowledges nothing new is repeated only every few periods (raftsched.node.
        replica.pacing)."""
        if self._rs_stamping:
            return  # once (the journal's adoption that calls this may be retried)
        self._rs_stamping = True
        transport = self._SyncObj__transport
        send = transport.send
        conf = self._SyncObj__conf
        answers = self._rs_answers = pacing.AnswerPacer(pacing.answer_every(
            conf.appendEntriesPeriod, conf.leaderFallbackTimeout))

        def stamped(node: Any, message: Any) -> Any:
            if type(message) is dict:
                kind = message.get("type")
                if kind == "append_entries":
                    message["rs_stall"] = self._rs_stall_report
                elif kind == "next_node_idx" and not answers.due(
                        node, message, self._SyncObj__raftCurrentTerm, raft_now()):
                    return True  # acknowledges nothing new (pacing.AnswerPacer)
            return send(node, message)

        transport.send = stamped

    def _rs_pace_polls(self) -> None:
        """The tick's poll waits until this node next has something to do, read as it
        begins (after the tick's appends went out): a leader until its next appends
        are due, a follower until its leader's next append can come (pacing.py). Once:
        the journal's adoption that calls this is retried while it fails, and a second
        wrapper would take the first one's wait for the period."""
        if self._rs_pacing:
            return
        self._rs_pacing = True
        poller = self._poller
        inner = poller.poll

        def paced(timeout: float) -> Any:
            if timeout > 0:
                period, now = timeout, raft_now()
                if self._SyncObj__raftState == _syncobj_module._RAFT_STATE.LEADER:
                    timeout = pacing.leader_wait(
                        self._SyncObj__newAppendEntriesTime - now, period)
                else:
                    timeout = pacing.follower_wait(self._rs_deadline - now, period)
                self._rs_waited_beyond = pacing.beyond_period(timeout, period)
            else:
                self._rs_waited_beyond = 0.0
            return inner(timeout)

        poller.poll = paced
        conf = self._SyncObj__conf
        self._rs_may_space = pacing.may_space(conf.appendEntriesPeriod, conf.raftMinTimeout,
                                              conf.leaderFallbackTimeout)

    def _rs_silence_tolerated(self) -> float:
        """Seconds of our leader's silence to wait out (0.0: the election timeout)."""
        conf = self._SyncObj__conf
        return stalls.tolerated_silence(
            self.rs_leader_stall, factor=self._rs_stall_factor,
            cap_s=max(conf.raftMaxTimeout, conf.leaderFallbackTimeout))

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        kept: set[str] = self.__dict__["_SyncObj__properies"]
        self.__dict__["_SyncObj__properies"] = _NotInSnapshot(kept)

    def _SyncObj__loadDumpFile(self, clearJournal: bool) -> None:  # noqa: N802,N803
        """Load a snapshot (ours at boot, or a leader's sent to us) without taking its
        node-local attributes: a snapshot written before they were left out carries
        another process's (or node's) clocks, counters and flags (``_rs_adopted`` would
        skip making the journal durable)."""
        mine = {k: v for k, v in self.__dict__.items() if _node_local(k)}
        SyncObj._SyncObj__loadDumpFile(self, clearJournal)
        for k in [k for k in self.__dict__ if _node_local(k) and k not in mine]:
            del self.__dict__[k]
        self.__dict__.update(mine)

    def _SyncObj__applyLogEntries(self) -> Any:
        """A leader commits only what its own synced copy covers, and only up to an
        entry of its own term (Raft's rule for counting replicas, §5.4.2): with its
        copy unsynced, the followers alone may be no majority of stable storage, and
        an older term's entry counted by replicas could still be overwritten."""
        journal = self.rs_journal
        if journal is not None and journal.rs_sync_enabled:
            commit = self._SyncObj__raftCommitIndex  # type: ignore[has-type]
            if self._SyncObj__raftState == _syncobj_module._RAFT_STATE.LEADER:
                allowed = min(commit, journal.rs_synced_index)
                if allowed > self._rs_commit_floor:
                    entry = self._SyncObj__getEntries(allowed, 1)
                    if not entry or entry[0][2] != self._SyncObj__raftCurrentTerm:
                        allowed = self._rs_commit_floor
                allowed = max(allowed, self._rs_commit_floor)
                if allowed < commit:
                    self._SyncObj__raftCommitIndex = allowed
                if allowed != self._rs_commit_floor:
                    journal.rs_note_commit(allowed)
                self._rs_commit_floor = allowed
            else:
                self._rs_commit_floor = commit
        return super()._SyncObj__applyLogEntries()

    def _doDestroy(self) -> None:
        super()._doDestroy()
        worker = getattr(self.rs_journal, "rs_worker", None)
        if worker is not None:
            worker.close()

    def _rs_ping(self) -> None:
        """Followers exchange nothing in Raft, so the connection between two of them
        reads nothing for seconds, and pysyncobj drops a connection that has read
        nothing for its connection timeout the moment it next sends on it. That moment
        is an election: a candidate's vote request to the other follower was dropped
        with the connection, and the vote waited for a reconnect (0.5 s) and one more
        election timeout: 0.5-1.1 s of failover after a leader's SIGKILL, 0.25 s with
        the connection kept read. A leader's appends and their answers keep its own
        connections read; a follower pings every other peer. A ping is a message type
        pysyncobj ignores (every branch of its handler checks the type)."""
        if self._SyncObj__raftState == _syncobj_module._RAFT_STATE.LEADER:
            return
        leader = self._SyncObj__raftLeader
        transport = self._SyncObj__transport
        for node in list(self._SyncObj__connectedNodes):
            if node != leader:
                transport.send(node, _PING)

    def _SyncObj__doChangeCluster(self, request: Any, reverse: bool = False) -> Any:
        """pysyncobj applies a membership entry when it is appended and reverses it when
        the entry is truncated; the entries the log-keeping rule below keeps are not
        truncated, so their membership changes must stay too (pysyncobj reverses the
        changes of every entry after ``prevLogIdx`` before it deletes them)."""
        if reverse and self._rs_keep_log:
            return False
        return super()._SyncObj__doChangeCluster(request, reverse)

    def _checkCommandsToApply(self) -> None:
        if not (self._rs_hold_until and raft_now() < self._rs_hold_until):
            super()._checkCommandsToApply()
        # Appended in this tick: the commands just taken, or a lone node's no-op as it
        # became leader (pysyncobj appends it in the tick's election step).
        if self._SyncObj__getCurrentLogIndex() == self._rs_tick_index:
            return
        journal = self.rs_journal
        if journal is not None and journal.rs_sync_enabled:
            # A leader's own sync, asked now: at the next tick's start it would wait
            # for the first follower's answer (or, alone, for the tick period), and
            # only then begin, in series with the followers' syncs.
            journal.rs_poll()
        elif not self._SyncObj__otherNodes:
            # A lone leader, unsynced: no peer's answer wakes this tick's poll, and
            # the next tick commits; start it at once.
            self._SyncObj__pipeNotifier.notify()

    def _rs_before_election(self) -> None:
        """Pre-vote (Raft thesis §9.6, as etcd does), before pysyncobj's tick would
        campaign: a follower whose election deadline has passed first reads what
        already arrived (a node that did not run for a while — a stall, a pause, a
        loaded host — finds its leader's appends waiting in the socket and stays a
        follower), then asks its peers whether they would vote for it, at the term it
        would campaign in, without raising its own. Only once a majority said yes
        does the next tick campaign for real. A peer says yes only when its log is not
        ahead and it has not heard from a live leader within the minimum election
        timeout, so a node coming back from a pause or a partition never deposes a
        working leader with a higher term.

        Exceptions, as etcd's: a leadership transfer's target campaigns at once (its
        leader asked it to), and a node refused ``PREVOTE_STUCK_ROUNDS`` rounds in a
        row while a leader of an older term appends to it (it raised its term in a
        campaign that failed) campaigns without asking: nobody would grant it, and it
        could never rejoin otherwise.
        Safety is Raft's: a real election is unchanged; pre-vote only delays one."""
        st = _syncobj_module._RAFT_STATE
        if (self._SyncObj__raftState not in (st.FOLLOWER, st.CANDIDATE)
                or self._SyncObj__selfNode is None or self._rs_prevote_won
                or self._SyncObj__transferInProgress):
            return
        now = raft_now()
        if self._rs_deadline >= now:
            return
        self._poller.poll(0)  # a leader's waiting append resets the deadline
        if (self._rs_deadline >= now
                or self._SyncObj__raftState not in (st.FOLLOWER, st.CANDIDATE)):
            return
        if not self._SyncObj__connectedToAnyone():
            return  # pysyncobj would not campaign either
        leader = self._SyncObj__raftLeader
        tolerated = self._rs_silence_tolerated()
        if (tolerated > 0 and leader is not None and leader in self._SyncObj__connectedNodes
                and now - self._rs_leader_seen < tolerated):
            # This leader has recently been silent this long while alive (its own
            # stalls, raftsched.node.replica.stalls): its silence is no evidence yet. A leader
            # whose process died closed its connections and is not waited for.
            self.rs_silences_waited += 1
            log.warning("leader silent for %.0f ms: waited out (it reported stalls of %.0f ms)",
                        (now - self._rs_leader_seen) * 1000, self.rs_leader_stall * 1000)
            self._SyncObj__raftElectionDeadline = (
                self._rs_leader_seen + tolerated
                + random.uniform(0.0, self._SyncObj__conf.raftMinTimeout / 2))
            return
        if not self._SyncObj__otherNodes:
            self._rs_allow_election("alone")
            return
        if (self._rs_prevote_failures >= PREVOTE_STUCK_ROUNDS
                and now - self._rs_older_leader_seen < self._SyncObj__conf.raftMaxTimeout):
            # Stuck ahead: our term is above the leader's (a campaign of ours that
            # failed), its appends are refused by us and our asks by everyone.
            self._rs_prevote_failures = 0
            self._rs_allow_election("a leader of an older term keeps appending to us")
            return
        if self._rs_prevote_term == self._SyncObj__raftCurrentTerm + 1:
            self._rs_prevote_failures += 1  # the last round asked for this term too
        self._rs_prevote_term = self._SyncObj__raftCurrentTerm + 1
        self._rs_prevote_grants = frozenset()
        self._rs_prevote_round += 1
        self._rs_prevote_asked_at = now
        # The round lasts one election timeout; then the next round asks again.
        self._SyncObj__raftElectionDeadline = now + self._SyncObj__generateRaftTimeout()
        ask = {"type": PREVOTE, "term": self._rs_prevote_term,
               "round": self._rs_prevote_round,
               "last_log_index": self._SyncObj__getCurrentLogIndex(),
               "last_log_term": self._SyncObj__getCurrentLogTerm()}
        for node in list(self._SyncObj__otherNodes):
            self._SyncObj__transport.send(node, ask)

    def rs_stepped_down(self) -> None:
        """We stopped leading (a higher term reached us, or check-quorum): a whole
        election timeout from now before we ask to campaign, as etcd's becomeFollower.
        A leader never moves its own deadline, so it is long past: a leader deposed by
        a vote request it refused (its log ahead) would ask at its next tick, and a
        follower that has not yet heard of the new leader says yes to the leader it
        knows."""
        self._SyncObj__raftElectionDeadline = (raft_now()
                                               + self._SyncObj__generateRaftTimeout())

    def _rs_allow_election(self, why: str = "") -> None:
        # Replacing a leader this node knew is rare in a healthy cluster and explains a
        # term change: a warning. A start (no leader heard yet, or alone) is not.
        seen = self._rs_leader_seen
        log.log(logging.WARNING if seen and why != "alone" else logging.INFO,
                "campaigning in term %d: %s (%s)", self._SyncObj__raftCurrentTerm + 1, why,
                f"leader last heard {(raft_now() - seen) * 1000:.0f} ms ago" if seen
                else "no leader heard yet")
        self._rs_prevote_won = True
        self._rs_won_in_term = self._SyncObj__raftCurrentTerm
        self.rs_elections += 1
        self._SyncObj__raftElectionDeadline = 0  # pysyncobj's tick campaigns now

    def _rs_read_deadline(self) -> float:
        """The election deadline as pysyncobj's tick reads it (its one read, just before
        it campaigns): with pre-vote on, never while no pre-vote round (or one of its
        exceptions: a transfer's target, a lone node, one stuck ahead) allowed the
        election. Gating the read, not only the step before the tick, closes a window:
        a node paused (SIGSTOP, a VM, a starved host) after that step and before
        pysyncobj's own check would wake with its deadline long past and campaign for
        real (a CI run saw term 1 -> 3 after a follower's 5 s pause). Our own code reads
        ``_rs_deadline``."""
        if (self._rs_prevote and not self._rs_prevote_won
                and not getattr(self, "_SyncObj__transferInProgress", False)):
            return float("inf")
        return self._rs_deadline

    def _rs_write_deadline(self, value: float) -> None:
        self._rs_deadline = value

    _SyncObj__raftElectionDeadline = property(_rs_read_deadline, _rs_write_deadline)

    def _rs_prevote_grant(self, node: Any, message: dict[str, Any]) -> bool:
        """Would we vote for ``node`` in ``message['term']``? (No state changes.)"""
        st = _syncobj_module._RAFT_STATE
        if self._SyncObj__selfNode is None:
            return False
        term = message.get("term")
        last_term, last_idx = message.get("last_log_term"), message.get("last_log_index")
        if not (isinstance(term, int) and isinstance(last_term, int)
                and isinstance(last_idx, int)):
            return False
        if term < self._SyncObj__raftCurrentTerm:
            return False
        my_term, my_idx = self._SyncObj__getCurrentLogTerm(), self._SyncObj__getCurrentLogIndex()
        if last_term < my_term or (last_term == my_term and last_idx < my_idx):
            return False
        if self._SyncObj__raftState == st.LEADER:
            return False  # we lead: check-quorum steps us down if we cannot
        now = raft_now()
        conf = self._SyncObj__conf
        woke_at = self._rs_woke_at
        if self._rs_last_tick is not None and now - self._rs_last_tick > conf.raftMinTimeout:
            # Back from a pause its tick has not noticed yet: the thread stopped inside
            # the tick's poll, and the poll that returns reads what queued meanwhile
            # (this very ask, maybe sent seconds ago) before the next tick.
            woke_at = now
        if (now - woke_at < conf.raftMaxTimeout + conf.connectionRetryTime
                and self._rs_leader_seen < woke_at):
            # We did not run for a while and have heard from no leader since: our
            # silence says nothing about the leader's. Its connection to us may have
            # been dropped meanwhile and takes up to a retry period and an append to
            # come back; a peer whose timer expired in that window (its own stall, a
            # leader busy catching us up) would otherwise win with our yes and depose
            # a working leader. If the leader really is gone, we say yes a moment later.
            return False
        leader = self._SyncObj__raftLeader
        recent = now - self._rs_leader_seen < max(conf.raftMinTimeout,
                                                  self._rs_silence_tolerated())
        return not (leader is not None and leader != node and recent
                    and leader in self._SyncObj__connectedNodes)

    def _rs_prevote_message(self, node: Any, message: dict[str, Any]) -> None:
        if message["type"] == PREVOTE:
            granted = self._rs_prevote_grant(node, message)
            if granted and self._rs_leader_seen:
                log.warning("pre-vote granted to %s for term %s (leader last heard %.0f ms ago)",
                            getattr(node, "address", node), message.get("term"),
                            (raft_now() - self._rs_leader_seen) * 1000)
            self._SyncObj__transport.send(node, {
                "type": PREVOTE_REPLY, "term": message.get("term"),
                "round": message.get("round"), "granted": granted})
            return
        st = _syncobj_module._RAFT_STATE
        if (message.get("term") != self._rs_prevote_term or self._rs_prevote_won
                or message.get("round", self._rs_prevote_round) != self._rs_prevote_round
                or self._rs_leader_seen >= self._rs_prevote_asked_at
                or self._SyncObj__raftState not in (st.FOLLOWER, st.CANDIDATE)
                or self._SyncObj__raftCurrentTerm + 1 != self._rs_prevote_term):
            # An old round's answer, or one made moot: a leader of our term reached us
            # after we asked (a stale yes would depose it; a CI run saw term 1 -> 2).
            return
        if message.get("granted") is True:
            self._rs_prevote_grants |= {node}
            if len(self._rs_prevote_grants) + 1 > (len(self._SyncObj__otherNodes) + 1) / 2:
                self._rs_allow_election(
                    "pre-vote granted by " + ", ".join(sorted(str(getattr(n, "address", n))
                                                              for n in self._rs_prevote_grants)))

    def _SyncObj__onMessageReceived(self, node: Any, message: Any) -> None:
        if message == _PING:  # its read has kept the connection alive; nothing else
            return
        if isinstance(message, dict):
            kind = message.get("type")
            if kind in (PREVOTE, PREVOTE_REPLY):
                if not self._rs_joining:
                    self._rs_prevote_message(node, message)
                return
            if kind == "append_entries":
                term = message.get("term", -1)
                if term >= self._SyncObj__raftCurrentTerm:
                    self._rs_leader_seen = raft_now()
                    # A leader of an older version sends none: the timeouts apply.
                    self.rs_leader_stall = stalls.reported(message.get("rs_stall"))
                    self._rs_prevote_won = False
                    self._rs_prevote_failures = 0
                elif isinstance(term, int):
                    self._rs_older_leader_seen = raft_now()
        if self._rs_joining and isinstance(message, dict) \
                and message.get("type") in ("request_vote", "timeout_now"):
            # A joining node's file may still list a member that was removed meanwhile;
            # that node campaigns (it was cut off) and, voted for, its term would depose
            # the real leader. Until a leader has reached us (we are a member and have
            # its log, removals included), we take part in no election.
            return
        conflict = self._rs_conflict(message)
        self._rs_on_message(node, message)
        commit = self._SyncObj__raftCommitIndex
        if conflict is not None and commit + 1 < conflict \
                and message["term"] >= self._SyncObj__raftCurrentTerm:
            self._SyncObj__sendNextNodeIdx(node, nextNodeIdx=commit + 1, success=False,
                                           reset=True)

    def _rs_conflict(self, message: Any) -> int | None:
        """``prevLogIdx`` of an append_entries whose entry there conflicts with ours."""
        if not (isinstance(message, dict) and message.get("type") == "append_entries"
                and "prevLogIdx" in message and "transmission" not in message
                and message.get("term", -1) >= self._SyncObj__raftCurrentTerm):
            return None
        held = self._SyncObj__getEntries(message["prevLogIdx"], 1)
        if held and held[0][2] != message.get("prevLogTerm"):
            return int(message["prevLogIdx"])
        return None

    def _rs_on_message(self, node: Any, message: Any) -> None:
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
                        return super()._SyncObj__onMessageReceived(node, message)
                    finally:
                        self._rs_keep_log = _KEEPING.active = False
                        if current:
                            # The cap is for this node's commit index only; readiness
                            # (caught up with the leader) must see the leader's own.
                            self._SyncObj__leaderCommitIndex = leader_commit
        return super()._SyncObj__onMessageReceived(node, message)

    def applying_term(self) -> int | None:
        """The Raft term of the log entry being applied (call from an apply only).

        pysyncobj applies entry ``lastApplied + 1`` and counts it applied afterwards;
        the entry's term is what the state machine checks leader-only commands
        against (see ``ClusterState.apply``)."""
        idx = self.raftLastApplied + 1
        if self.rs_journal is not None:
            self.rs_journal.rs_note_apply(idx)
        entries = self._SyncObj__getEntries(idx, 1)
        return int(entries[0][2]) if entries else None

    def _SyncObj__deleteEntriesFrom(self, from_idx: int) -> None:
        if not self._rs_keep_log:
            super()._SyncObj__deleteEntriesFrom(from_idx)

    def _SyncObj__sendAppendEntries(self) -> None:  # noqa: N802 - pysyncobj's name
        super()._SyncObj__sendAppendEntries()
        # Called once per appended command under load: the cheap reads decide first.
        if self._rs_stall_report != 0.0 or not self._rs_may_space:
            return
        index = self._SyncObj__getCurrentLogIndex()
        if self._SyncObj__raftCommitIndex != index:
            return
        match = self._SyncObj__raftMatchIndex
        if any(match.get(node, 0) < index for node in self._SyncObj__otherNodes):
            return
        period = self._SyncObj__conf.appendEntriesPeriod
        # pysyncobj set the next ones one period from the start of these.
        self._SyncObj__newAppendEntriesTime += pacing.next_append_in(
            period, caught_up=True, calm=True) - period

    def forceLogCompaction(self) -> None:  # noqa: N802 - pysyncobj's name
        # A caller's request (a test, an operation): the byte bound must not withdraw it.
        self._rs_forced_by_bytes = False
        super().forceLogCompaction()

    def _SyncObj__tryLogCompaction(self) -> None:
        # The log's bytes bound it too: a million jobs put in 1,000 entries held ~100 MB
        # of commands in memory until the 5,000th entry (W4: 576 B of RSS per job
        # after the puts, 452 of them the state).
        journal = self.rs_journal
        if journal is not None:
            forced = bool(getattr(self, "_SyncObj__forceLogCompaction", False))
            self._SyncObj__forceLogCompaction, self._rs_forced_by_bytes = byte_bound(
                forced, self._rs_forced_by_bytes,
                journal.rs_log_bytes() - self._rs_bytes_kept, self.rs_compaction_bytes)
        super()._SyncObj__tryLogCompaction()

    def _SyncObj__deleteEntriesTo(self, to_idx: int) -> None:
        raft_log = self._SyncObj__raftLog
        if not (isinstance(raft_log, FileJournal) and len(raft_log)
                and drop_journal_prefix(raft_log, to_idx - raft_log[0][1])):
            super()._SyncObj__deleteEntriesTo(to_idx)
        journal = self.rs_journal
        self._rs_bytes_kept = journal.rs_log_bytes() if journal is not None else 0
        # The dropped entries' pages back to the system (W4, a million jobs: 525-547 B
        # of RSS per job after the puts instead of 543-620). In a thread of its own: a
        # trim took 0.1-39 ms here (this thread may still wait for a heap lock it takes).
        with contextlib.suppress(RuntimeError):  # no thread to be had: keep the pages
            threading.Thread(target=procs.release_free_heap, name="raftsched-trim",
                             daemon=True).start()


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
        return not getattr(_KEEPING, "active", False)


_KEEPING = threading.local()


