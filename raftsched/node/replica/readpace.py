"""Bulk reads on a busy leader are paced, never refused.

A read builds its views (runs, jobs) under the Raft lock, on the event loop the leader
plans from. A client fetching every job's history from a leader in a fire storm
(20,000 every-second jobs: docs/architecture.md) kept that lock and the
GIL busy back to back: the Raft thread missed its heartbeats and the cluster changed
leader, which costs more than any read is worth. So while the leader's admission
control says it has no spare capacity (its last period was congested, or it held
planning back), reads draw from a token bucket of views per second and wait for
their turn; a leader with room, and every follower, serves them at once.

Pure apart from the time passed in, so it is tested on a fake clock.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Views per second a busy leader serves (runs of a ``runs`` page, jobs of a
#: ``list_jobs`` page): a few percent of its time at ~5 µs per view.
BUSY_VIEWS_PER_S = 20_000.0
#: Views it serves at once before pacing starts.
BURST_VIEWS = 2_000.0
#: The longest one read is made to wait (its client's timeout is longer).
MAX_WAIT_S = 5.0


@dataclass(frozen=True, slots=True, kw_only=True)
class PaceStatistics:
    """The pacer as ``status`` reports it."""

    paced: int
    """Reads that waited for their turn."""
    waited_s: float
    """Their waits, summed."""


class ReadPacer:
    """A token bucket of views that only counts while the leader is busy."""

    def __init__(self, now_s: float, *, rate: float = BUSY_VIEWS_PER_S,
                 burst: float = BURST_VIEWS) -> None:
        self.rate, self.burst = rate, burst
        self._tokens = burst
        self._last = now_s
        self.paced = 0
        self.waited_s = 0.0

    def delay_s(self, cost: int, now_s: float, *, busy: bool) -> float:
        """How long a read of ``cost`` views waits before it is served (0: at once).
        Reads that arrive together queue behind each other: each one's cost is taken
        from the bucket as it arrives, and it waits until the bucket had it."""
        self._tokens = min(self.burst, self._tokens + (now_s - self._last) * self.rate)
        self._last = now_s
        if not busy:
            self._tokens = self.burst
            return 0.0
        # Never owed more than the longest wait: a burst of reads does not starve later
        # ones for longer than that.
        self._tokens = max(self._tokens - max(cost, 1), -self.rate * MAX_WAIT_S)
        if self._tokens >= 0:
            return 0.0
        wait = min(-self._tokens / self.rate, MAX_WAIT_S)
        self.paced += 1
        self.waited_s += wait
        return wait

    def statistics(self) -> PaceStatistics:
        return PaceStatistics(paced=self.paced, waited_s=round(self.waited_s, 3))


__all__ = ["BURST_VIEWS", "BUSY_VIEWS_PER_S", "PaceStatistics", "ReadPacer"]
