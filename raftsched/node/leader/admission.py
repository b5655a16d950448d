"""Admission control: the leader creates runs no faster than the cluster absorbs them.

Every run costs the whole cluster: a plan item applied on every node, a start and a
finish committed through the leader, an execution on a worker. Offered more fire times
than that can carry (10,000 every-second jobs on two cores), a leader that
planned as fast as it could filled pysyncobj's queue and the followers' Raft threads
with work, reads waited behind it, and every fire time it had not reached yet was
*unaccounted for* rather than late. This controller gives the leader a rate, in runs
per second, found the way TCP finds a window (additive increase, multiplicative
decrease), from signals the leader sees without asking anyone:

* how long its own plans take to commit (the Raft queue and the quorum's round trip);
* how many entries its slowest connected follower lags behind its log;
* how many commands wait in its Raft queue;
* the longest gap between two ticks of its Raft thread: a thread starved of the GIL
  or of the CPU sends no heartbeats meanwhile, and a gap near the election timeout
  is an election (the cluster's own load must never cause one);
* how late the nodes' heartbeats land: a node whose heartbeats stop being
  acknowledged for half the node timeout stops its runs (the self-fence), so a
  heartbeat later than its period by HEARTBEAT_LATE_HIGH_S means one is near.

While any of them is over its bound the rate falls by ``DECREASE`` (at most once per
period, so one slow commit is not counted twice); while planning is held back by the
rate and none is, it grows. A job the leader does not get to stays due: when it is
reached its older fire times fold into one record (``misfire.policy = once``,
``coalesced``) or are recorded by its policy, so shedding costs one record per job,
not one per fire time, and the leader's work per second is bounded by the rate.

Pure apart from the time passed in (the leader loop's clock), so it is tested on a
fake clock; runs on the node's event loop.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Runs per second a new leader starts from (it grows within a second when there is
#: room: ``SLOW_START`` per period until the first congestion).
START_RATE = 2_000.0
#: The rate never falls below this (a cluster at its knees still runs something) nor
#: rises above this.
MIN_RATE = 50.0
MAX_RATE = 200_000.0
#: The bucket holds this many seconds of the rate: every-second jobs fire together, and
#: a second's worth may be planned at once.
BURST_S = 1.0
#: The controller decides once per period.
PERIOD_S = 0.25
#: Growth per period while the rate holds planning back: ×SLOW_START until the first
#: congestion of this term, then ×(1 + INCREASE).
SLOW_START = 1.5
INCREASE = 0.05
#: A congested period multiplies the rate by this.
DECREASE = 0.7
#: Congestion bounds. A plan's commit on an unloaded 2-core host takes 1-5 ms and
#: 30 ms on average in a storm of 5,000 runs/s (p99 ~250 ms); a
#: follower then lags a few dozen entries, and pysyncobj's queue holds a few dozen
#: commands.
COMMIT_HIGH_S = 0.6
FOLLOWER_LAG_HIGH = 2_000
QUEUE_HIGH = 2_000
#: An idle Raft thread ticks every 50 ms (pysyncobj's poll period); appends go out
#: every 50 ms and followers campaign after 200-600 ms of silence.
TICK_GAP_HIGH_S = 0.15
#: A node heartbeats every 0.5 s and fences itself 1.5 s after the send of its newest
#: acknowledged one.
HEARTBEAT_LATE_HIGH_S = 0.4


@dataclass(frozen=True, slots=True, kw_only=True)
class AdmissionStatistics:
    """The controller as ``status`` reports it.

    :var rate: runs per second the leader may create or place now.
    :var tokens: runs it may create or place at once now.
    :var congested: periods that cut the rate (this term).
    :var held: plans that found no tokens and waited (this term).
    :var granted: runs granted (this term).
    :var commit_max_ms: the slowest plan commit of the last full period.
    :var follower_lag: the largest follower lag (entries) of the last full period.
    :var queue: the largest Raft queue of the last full period.
    :var tick_gap_ms: the longest gap between two Raft ticks of the last full period.
    :var heartbeat_late_ms: how much later than its period the latest heartbeat of the
        last full period landed.
    :var cause: what cut the rate last (``commit``, ``follower_lag``, ``queue``,
        ``tick_gap``, ``heartbeat``), or ``""`` if nothing has.
    """

    rate: float
    tokens: float
    congested: int
    held: int
    granted: int
    commit_max_ms: float
    follower_lag: int
    queue: int
    tick_gap_ms: float
    heartbeat_late_ms: float
    cause: str

    def to_dict(self) -> dict[str, object]:
        return {"rate": round(self.rate, 1), "tokens": round(self.tokens, 1),
                "congested": self.congested, "held": self.held, "granted": self.granted,
                "commit_max_ms": round(self.commit_max_ms, 1),
                "follower_lag": self.follower_lag, "queue": self.queue,
                "tick_gap_ms": round(self.tick_gap_ms, 1),
                "heartbeat_late_ms": round(self.heartbeat_late_ms, 1), "cause": self.cause}


class Admission:
    """The rate and its token bucket (see the module docstring).

    :param now_s: the leader loop's monotonic time when it started leading.
    """

    def __init__(self, now_s: float, *, start_rate: float = START_RATE) -> None:
        self.rate = start_rate
        self.tokens = start_rate * BURST_S
        self._last_fill = now_s
        self._period_end = now_s + PERIOD_S
        self._slow_start = True
        self._limited = False
        self._commit_max = 0.0
        self._lag_max = 0
        self._queue_max = 0
        self._gap_max = 0.0
        self._hb_max = 0.0
        self._last = (0.0, 0, 0, 0.0, 0.0)
        self._cause = ""
        self.busy = False
        self.congested = 0
        self.held = 0
        self.granted = 0

    def grant(self, want: int, now_s: float) -> int:
        """How many of ``want`` runs a plan may create or place now (0: none)."""
        self._advance(now_s)
        got = min(want, int(self.tokens))
        if got < want:
            self._limited = True
        if got <= 0:
            self.held += 1
            return 0
        self.tokens -= got
        self.granted += got
        return got

    def refund(self, unused: int) -> None:
        """A plan used fewer runs than it was granted."""
        if unused > 0:
            self.tokens = min(self.tokens + unused, self.rate * BURST_S)
            self.granted -= unused

    def wait_s(self, now_s: float) -> float:
        """Seconds until one run may be granted (0 if one may now)."""
        self._advance(now_s)
        return 0.0 if self.tokens >= 1 else (1 - self.tokens) / self.rate

    def observe(self, *, commit_s: float | None = None, follower_lag: int | None = None,
                queue: int | None = None, tick_gap_s: float | None = None,
                heartbeat_late_s: float | None = None) -> None:
        """A signal: a plan's commit time, the slowest follower's lag, the Raft queue,
        the Raft thread's longest gap between ticks, a heartbeat's lateness."""
        if commit_s is not None and commit_s > self._commit_max:
            self._commit_max = commit_s
        if follower_lag is not None and follower_lag > self._lag_max:
            self._lag_max = follower_lag
        if queue is not None and queue > self._queue_max:
            self._queue_max = queue
        if tick_gap_s is not None and tick_gap_s > self._gap_max:
            self._gap_max = tick_gap_s
        if heartbeat_late_s is not None and heartbeat_late_s > self._hb_max:
            self._hb_max = heartbeat_late_s

    def statistics(self) -> AdmissionStatistics:
        commit, lag, queue, gap, hb = self._last
        return AdmissionStatistics(rate=self.rate, tokens=max(self.tokens, 0.0),
                                   congested=self.congested, held=self.held,
                                   granted=self.granted, commit_max_ms=commit * 1000,
                                   follower_lag=lag, queue=queue, tick_gap_ms=gap * 1000,
                                   heartbeat_late_ms=hb * 1000, cause=self._cause)

    # ------------------------------------------------------------------ internals

    def _advance(self, now_s: float) -> None:
        while now_s >= self._period_end:
            self._decide()
            self._period_end += PERIOD_S
            if now_s - self._period_end > 10 * PERIOD_S:
                self._period_end = now_s + PERIOD_S  # a pause: no catching up of periods
        dt = now_s - self._last_fill
        if dt > 0:
            self.tokens = min(self.tokens + dt * self.rate, self.rate * BURST_S)
            self._last_fill = now_s

    def _decide(self) -> None:
        cause = ("commit" if self._commit_max > COMMIT_HIGH_S else
                 "follower_lag" if self._lag_max > FOLLOWER_LAG_HIGH else
                 "queue" if self._queue_max > QUEUE_HIGH else
                 "tick_gap" if self._gap_max > TICK_GAP_HIGH_S else
                 "heartbeat" if self._hb_max > HEARTBEAT_LATE_HIGH_S else "")
        self._last = (self._commit_max, self._lag_max, self._queue_max, self._gap_max,
                      self._hb_max)
        self._commit_max, self._lag_max, self._queue_max = 0.0, 0, 0
        self._gap_max = self._hb_max = 0.0
        #: The period just ended was congested or held planning back: the leader has no
        #: spare capacity, and bulk reads on it are paced (readpace.py).
        self.busy = bool(cause) or self._limited
        if cause:
            self.congested += 1
            self._cause = cause
            self._slow_start = False
            self.rate = max(MIN_RATE, self.rate * DECREASE)
            self.tokens = min(self.tokens, self.rate * BURST_S)
        elif self._limited:
            grow = SLOW_START if self._slow_start else 1 + INCREASE
            self.rate = min(MAX_RATE, self.rate * grow)
        self._limited = False


__all__ = ["Admission", "AdmissionStatistics"]
