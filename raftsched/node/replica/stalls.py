"""How long a follower waits out its leader's silence before asking for an election.

A Raft follower that hears nothing from its leader for one election timeout (0.2-0.6 s
at the defaults) asks to replace it. That is right for a leader that died or was cut
off, and wrong for one that is alive but whose Raft thread did not run for a while: a
long garbage collection, the interpreter lock held by the scheduler's other threads, a
host with more runnable threads than cores (an overload, the very moment an election
costs most). Such a leader comes back, sends its appends and is deposed anyway.

So the leader measures its own stalls (the gaps between the starts of consecutive
ticks of its Raft thread) and tells its followers, in every append, the longest of the
last :data:`WINDOW_S` seconds. A follower then tolerates a silence up to
:data:`FACTOR` times that (never less than its election timeout, never more than the
leader's own fallback timeout, after which the leader steps down by itself), as an
adaptive failure detector does (phi accrual, Hayashibara et al.): a silence is
suspicious only when it is long against the silences this leader has recently had
while alive. A leader whose process dies has its connections closed by its kernel and
is replaced at once, whatever the tolerance (``RaftSyncObj``'s disconnect path); only
a frozen or cut-off leader of a loaded cluster is replaced later, by at most the cap.
Safety is untouched: this only delays asking for an election.

Pure: times are passed in (seconds, monotonic).
"""

from __future__ import annotations

from collections import deque

#: Stalls older than this no longer predict the next (seconds).
WINDOW_S = 30.0
#: A follower tolerates a silence this many times its leader's longest recent stall.
FACTOR = 3.0


class StallWindow:
    """The longest gap noted within the last ``window_s`` seconds.

    Gaps at or under ``floor_s`` are the thread's ordinary cadence and are not kept,
    so an idle node keeps nothing and its followers the configured timeouts."""

    def __init__(self, *, floor_s: float, window_s: float = WINDOW_S) -> None:
        self.floor_s = floor_s
        self.window_s = window_s
        #: (when, gap), gaps strictly decreasing from the left: the left one is the
        #: longest not yet expired (a later longer gap makes earlier shorter ones moot).
        self._gaps: deque[tuple[float, float]] = deque()

    def note(self, now: float, gap: float) -> None:
        """The thread ran again at ``now`` after ``gap`` seconds."""
        if gap <= self.floor_s:
            return
        gaps = self._gaps
        while gaps and gaps[-1][1] <= gap:
            gaps.pop()
        gaps.append((now, gap))

    def longest(self, now: float) -> float:
        """The longest gap of the last ``window_s`` seconds (0.0 if none)."""
        gaps = self._gaps
        while gaps and gaps[0][0] < now - self.window_s:
            gaps.popleft()
        return gaps[0][1] if gaps else 0.0


def reported(value: object) -> float:
    """A leader's ``rs_stall`` as read off the wire: seconds, or 0.0 for no report (a
    peer of an older version sends none; anything but a finite non-negative number,
    a damaged or hostile message, counts as none)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return 0.0
    stall = float(value)
    return stall if 0.0 < stall < float("inf") else 0.0


def tolerated_silence(stall_s: float, *, factor: float, cap_s: float) -> float:
    """How long (seconds) a follower waits out a leader whose longest recent stall was
    ``stall_s`` (0.0: only the configured election timeout applies)."""
    return min(cap_s, factor * stall_s) if stall_s > 0.0 else 0.0
