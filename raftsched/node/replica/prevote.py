"""Pre-vote (Raft thesis §9.6, as etcd does) on pysyncobj, which has none.

A follower whose election deadline has passed first asks its peers whether they would
vote for it, and campaigns only once a majority said yes; a node back from a pause or
a partition never deposes a working leader with a higher term. This class holds the
pre-vote rounds, the gated election deadline pysyncobj's tick reads, and the rule a
peer grants by; :class:`raftsched.node.replica.raftsync.RaftSyncObj` builds on it.
Every pysyncobj internal named here is in :mod:`raftsched.node.replica.compat`'s
checked list.
"""

from __future__ import annotations

import logging
import random
from typing import Any

from pysyncobj import SyncObj
from pysyncobj import syncobj as _syncobj_module

from raftsched.node.replica import stalls
from raftsched.node.replica.compat import raft_now

log = logging.getLogger("raftsched.raft")

#: Pre-vote (Raft thesis §9.6): the ask, and the answer.
PREVOTE = "rs_prevote"
PREVOTE_REPLY = "rs_prevote_reply"
#: Pre-vote rounds refused in a row, while a leader of an older term appends to us,
#: after which a node campaigns without asking (it would never be granted).
PREVOTE_STUCK_ROUNDS = 3
#: How long a dropped connection may take to come back after a wake-up (below): the
#: reconnect period it was sized for (0.5 s). The node now redials every 0.1 s
#: (raft.RECONNECT_S); the window is kept, on the side of not deposing a leader.
RECONNECT_WINDOW_S = 0.5


class PreVoteSyncObj(SyncObj):
    """SyncObj whose elections wait for a pre-vote majority (see the module docstring
    and :meth:`_rs_before_election`). A base of
    :class:`~raftsched.node.replica.raftsync.RaftSyncObj` only: that class's tick calls
    :meth:`_rs_before_election`, routes the pre-vote messages here, and keeps the
    times and stalls this class reads (``_rs_leader_seen``, ``_rs_last_tick``...)."""

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
    #: Real elections this node began (statistics; tests read it).
    rs_elections = 0
    #: The longest recent stall our current leader reported, and how many times this
    #: node waited out a silence of that leader longer than its election timeout.
    rs_leader_stall = 0.0
    rs_silences_waited = 0
    #: raftsched.node.replica.stalls.FACTOR; 0 tolerates only the election timeout.
    _rs_stall_factor = stalls.FACTOR

    def _rs_silence_tolerated(self) -> float:
        """Seconds of our leader's silence to wait out (0.0: the election timeout)."""
        conf = self._SyncObj__conf
        return stalls.tolerated_silence(
            self.rs_leader_stall, factor=self._rs_stall_factor,
            cap_s=max(conf.raftMaxTimeout, conf.leaderFallbackTimeout))

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
        if (now - woke_at < conf.raftMaxTimeout + RECONNECT_WINDOW_S
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
