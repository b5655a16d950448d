"""When the leader begins to plan a big instant, ahead of the lookahead.

Thousands of cron jobs share a minute boundary; planning, committing and starting them
takes longer than the 250 ms lookahead (W5's 5,208-run instant was assigned and started
half a second after its time). So the leader counts the jobs due at each fire time of
the next ``max_lead + QUIET`` ms (a bounded walk of the due heap, at most every
COUNT_EVERY_S) and begins planning an instant :func:`~raftsched.core.leader.lead_ms`
ahead of it; from then on its plans reach up to that instant (:meth:`horizon`). A small
instant is planned at the lookahead, as before. The loop owns one of these per term.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from raftsched.core.leader import lead_ms, max_lead_ms, runs_worth_counting

#: The instants are counted again at most this often (the walk is O(their size) under
#: the state lock); the count reaches this much further than the longest lead, so an
#: instant is counted before its planning is due to begin.
COUNT_EVERY_S = 0.5


@dataclass(slots=True)
class EarlyPlanning:
    """The leader's view of the coming instants, and the one being planned early.

    :var lookahead_ms: the configured lookahead.
    :var early_ms: the latest instant whose planning began early (0: none); plans
        reach up to it until it is planned.
    :var instants: fire time -> jobs due then, as last counted.
    :var counted_at: when they were counted (monotonic s; None: never).
    """

    lookahead_ms: int
    early_ms: int = 0
    instants: dict[int, int] = field(default_factory=dict)
    counted_at: float | None = None

    def count_by(self, mono: float, now_ms: int) -> int | None:
        """Up to when to count the instants now, or None: counted recently enough."""
        if not self.lookahead_ms or (self.counted_at is not None
                                     and mono - self.counted_at < COUNT_EVERY_S):
            return None
        return now_ms + max_lead_ms(self.lookahead_ms) + int(COUNT_EVERY_S * 1000)

    @property
    def cap(self) -> int:
        """How many due jobs a count looks at, at most."""
        return runs_worth_counting(self.lookahead_ms)

    def counted(self, instants: dict[int, int] | None, mono: float) -> None:
        """Take a count made at ``mono`` (None: not made)."""
        if instants is not None:
            self.instants, self.counted_at = instants, mono

    def begin(self, now_ms: int) -> tuple[bool, int | None]:
        """Does the early planning of an instant begin now (True once per instant), and
        in how many ms the next one's does (None: none counted)."""
        look = self.lookahead_ms
        began = False
        wait: int | None = None
        for at, runs in self.instants.items():
            if at <= self.early_ms or at <= now_ms + look:
                continue  # begun already, or the lookahead reaches it anyway
            start = at - lead_ms(look, runs)
            if start <= now_ms:
                self.early_ms, began = max(self.early_ms, at), True
            elif at - start > look:
                wait = start - now_ms if wait is None else min(wait, start - now_ms)
        return began, wait

    def horizon(self, now_ms: int) -> int:
        """How far a plan made now reaches: the lookahead, or up to an instant planned
        early (never past the longest lead: a wall clock stepped back does not widen it)."""
        look = self.lookahead_ms
        return max(now_ms + look, min(self.early_ms, now_ms + max_lead_ms(look)))


__all__ = ["COUNT_EVERY_S", "EarlyPlanning"]
