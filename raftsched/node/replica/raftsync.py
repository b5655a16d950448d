"""The SyncObj every raftsched node runs: pysyncobj 0.3.17 with Raft's rule for a
follower's log, group commit, paced idle ticks, stall reports, a quick campaign when
a leader's connection closes, and pre-vote (:mod:`raftsched.node.replica.prevote`).

Every pysyncobj internal named here is in :mod:`raftsched.node.replica.compat`'s
checked list; ``compat.install()`` runs before one is made.
"""

from __future__ import annotations

import contextlib
import random
import threading
from typing import Any

from pysyncobj import SyncObj
from pysyncobj import syncobj as _syncobj_module
from pysyncobj.journal import FileJournal

from raftsched.node.replica import pacing, procs, stalls
from raftsched.node.replica.compat import (
    KEEPING_LOG,
    byte_bound,
    drop_journal_prefix,
    known_prefix,
    raft_now,
)
from raftsched.node.replica.prevote import PREVOTE, PREVOTE_REPLY, PreVoteSyncObj

#: What a follower sends the peers it otherwise never talks to (RaftSyncObj._rs_ping).
_PING = {"type": "rs_ping"}


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


class RaftSyncObj(PreVoteSyncObj):
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
    #: The log's last index as this tick began (what the tick itself appends is after).
    _rs_tick_index = 0
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
            conf.appendEntriesPeriod, conf.leaderFallbackTimeout,
            connection_s=conf.connectionTimeout))

        def stamped(node: Any, message: Any) -> Any:
            if node not in self._SyncObj__connectedNodes:
                # Not yet, or no longer: with a secret, an outgoing connection is open
                # before its key exchange ends, and pysyncobj sends on it. A message
                # sent then (a pre-vote ask or a vote request of a restarted node) has
                # no key, and the peer drops the connection for it: a reconnect later
                # (connectionRetryTime; seen at a 1M restart).
                return False
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
                    self._rs_keep_log = KEEPING_LOG.active = True
                    try:
                        return super()._SyncObj__onMessageReceived(node, message)
                    finally:
                        self._rs_keep_log = KEEPING_LOG.active = False
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
