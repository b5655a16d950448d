"""How often an idle Raft thread wakes and speaks: the wakeups an idle cluster pays for.

An idle node's CPU is mostly its Raft thread's wakeups, ~0.2 ms each (pysyncobj's
message handling in Python, a Fernet seal or open, a syscall or two;
``bench/results/2026-12-05-idle-floor.md``). A leader sends an append to each follower
every append period (50 ms), which Raft needs: a follower that hears nothing for an
election timeout campaigns. Two more wakeups per period and follower were not needed:

- a follower also woke for its own poll timeout, which pysyncobj sets to one append
  period, the same period as its leader's appends but out of phase with them, so it
  expired just before each append came (:func:`follower_wait`);
- a follower answered every append, and the leader woke for each answer. An answer
  that acknowledges nothing new tells the leader only that the follower lives, which
  its check-quorum (``leader_fallback``, 1.5 s) needs a few times per fallback, not
  twenty times a second (:class:`AnswerPacer`).

And a calm leader whose whole log every follower holds, acknowledged and committed,
sends its empty appends every :data:`IDLE_APPEND_PERIODS` periods
(:func:`next_append_in`): a follower's election timeout (200-600 ms) still hears two or
more of them, pre-vote keeps one follower's early deadline from deposing anyone (its
peer has heard the leader), and an entry is sent the moment it is appended, as before.
"Calm": the leader reported no stall of its own Raft thread in the last 30 s
(``stalls.StallWindow``), so a loaded host keeps the full rate.

None of this changes what Raft decides: a follower's deadline is read no later than
before, every entry and every answer that moves the leader's match index leaves at
once, and a thread's deliberate wait beyond an append period is not counted as a stall.

Pure: times are passed in (seconds, monotonic).
"""

from __future__ import annotations

from typing import Any

#: A calm, caught-up leader's empty appends come this many append periods apart.
IDLE_APPEND_PERIODS = 2
#: A follower's longest poll, in append periods: long enough that its leader's next
#: append (up to IDLE_APPEND_PERIODS after the last, give or take the leader's jitter)
#: comes first.
FOLLOWER_WAIT_PERIODS = IDLE_APPEND_PERIODS + 0.6
#: A follower repeats an answer that acknowledges nothing new at most once per this
#: many append periods (each leader's check-quorum still hears from it several times
#: per fallback timeout). At 4, an idle leader woke 3-4 more times a second for them,
#: 0.05-0.1 % of a core: bench/results/2026-12-06-idle-answers.md. Not more than 6: an
#: idle node's liveness read from these answers (node/leader/contact.py) must still fit
#: three readings in the tests' 2 s node timeout (:func:`answered_within`).
ANSWER_EVERY_PERIODS = 6


def follower_wait(left_s: float, period_s: float) -> float:
    """How long (seconds) a follower's Raft thread may sleep in its poll when nothing
    arrives, ``left_s`` before its election deadline (``period_s``: the append period).

    Up to :data:`FOLLOWER_WAIT_PERIODS` periods while the deadline is further away, so
    the leader's appends alone wake it; never past the deadline by more than a period,
    as before; never less than a period (a deadline long passed with no election to
    start, a node cut off from everyone, must not spin)."""
    return min(FOLLOWER_WAIT_PERIODS * period_s, max(period_s, left_s))


def next_append_in(period_s: float, *, caught_up: bool, calm: bool) -> float:
    """Seconds from a leader's appends to its next empty ones: one period, or
    :data:`IDLE_APPEND_PERIODS` while every follower holds, has acknowledged and knows
    committed its whole log (``caught_up``) and its Raft thread has not stalled
    lately (``calm``)."""
    return IDLE_APPEND_PERIODS * period_s if caught_up and calm else period_s


def may_space(period_s: float, election_min_s: float, fallback_s: float) -> bool:
    """Whether the timing leaves room to space a leader's empty appends: a follower's
    shortest election timeout still hears two spaced appends, and the leader's fallback
    four rounds of them (a timing set near the config's limits keeps one period)."""
    spaced = IDLE_APPEND_PERIODS * period_s
    return election_min_s >= 2 * spaced - 1e-9 and fallback_s >= 4 * spaced - 1e-9


def leader_wait(left_s: float, period_s: float) -> float:
    """How long (seconds) a leader's Raft thread may sleep in its poll, ``left_s`` before
    its next appends are due: until then (not a period, then another), between one
    period (as before) and :data:`IDLE_APPEND_PERIODS`."""
    return min(IDLE_APPEND_PERIODS * period_s, max(period_s, left_s))


def beyond_period(wait_s: float, period_s: float) -> float:
    """The part of a poll's wait beyond one append period: the thread chose it, so the
    gap to its next tick is that much longer without being a stall."""
    return max(0.0, wait_s - period_s)


def answer_every(period_s: float, fallback_s: float, *, connection_s: float) -> float:
    """How often (seconds) a follower's repeat of an answer that acknowledges nothing
    new falls due: every :data:`ANSWER_EVERY_PERIODS` append periods, and at least four
    times per leader fallback timeout whatever the timing (a leader that hears from no
    majority for that long steps down) and three times per connection timeout
    (``connection_s``: pysyncobj drops a connection that has read nothing for that long,
    and an idle leader reads nothing else from a follower). It leaves with the next
    append: :func:`answered_within` is the longest gap."""
    return min(ANSWER_EVERY_PERIODS * period_s, fallback_s / 4, connection_s / 3)


def answered_within(period_s: float, fallback_s: float, *, connection_s: float) -> float:
    """The longest gap (seconds) between two answers of an idle, live follower: an answer
    goes out with an append, and an idle leader's appends come up to
    :data:`IDLE_APPEND_PERIODS` periods apart, so a repeat due at :func:`answer_every`
    leaves with the first append after it."""
    return answer_every(period_s, fallback_s, connection_s=connection_s) \
        + IDLE_APPEND_PERIODS * period_s


class AnswerPacer:
    """Which of a follower's answers to append_entries go out (see the module
    docstring). An answer goes out unless it is a success that acknowledges the same
    index as this node's last answer to the same peer, in the same term, less than
    ``every_s`` ago. A failure, a reset, a new index, another term or another leader
    always goes out."""

    def __init__(self, every_s: float) -> None:
        self.every_s = every_s
        #: peer -> (term, acknowledged next index, when) of the last answer sent to it.
        self._last: dict[Any, tuple[int, int, float]] = {}

    def due(self, peer: Any, message: dict[str, Any], term: int, now: float) -> bool:
        """Whether ``message`` (a ``next_node_idx`` answer to ``peer``) goes out now."""
        index = message.get("next_node_idx")
        if not message.get("success") or message.get("reset") or not isinstance(index, int):
            return True
        last = self._last.get(peer)
        if last is not None and last[0] == term and last[1] == index \
                and now - last[2] < self.every_s:
            return False
        self._last[peer] = (term, index, now)
        return True

    def forget(self, peer: Any) -> None:
        """``peer``'s connection dropped: its next answer goes out, whatever it says."""
        self._last.pop(peer, None)
