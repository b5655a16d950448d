"""Wakeups that need not be exact land together (issue 31 item 3: an idle node's CPU is
its wakeups, ~0.3 ms each on the benchmark machine, mostly the kernel's).

An idle node's event loop had several loops of its own, each with a timer of its own:
the leader loop's quiet look, the worker's safety-net poll, the pause watcher, the
secret file's poll (each about a second) and the notifier's idle round (2 s). Started
at different moments, they woke the loop at different moments: 5-8 wakeups a second.
A sleep that is only a bound (a safety net, a look with nothing due) instead ends on a
whole second of the node's monotonic clock (:data:`GRID_S`), which every loop of the
process shares, so the loop wakes once for all of them, as the kernel rounds its own
timers to whole seconds (``round_jiffies``).

Only for sleeps of a grid step or more whose length is a bound, not a deadline: never a
run's instant, a heartbeat that is due, a self-fence or a plan's lead time (a caller
with a deadline within a grid step past its sleep does not coalesce it).

Pure: the clock's reading is passed in.
"""

from __future__ import annotations

import math

#: The grid (seconds of the monotonic clock) coalesced sleeps end on.
GRID_S = 1.0
#: A coalesced sleep may end this many seconds early rather than a whole step late: a
#: loop that sleeps a second again right after a wakeup on the grid, some milliseconds
#: past it, lands on the next second, not the one after.
EARLY_S = 0.1


def coalesced(now: float, delay: float, grid: float = GRID_S) -> float:
    """``delay`` (seconds) moved to end on the first point of the ``grid`` at or after
    ``now + delay - EARLY_S``: at most ``EARLY_S`` shorter, less than ``grid`` longer.
    A delay shorter than a grid step is returned as it is (never negative).
    ``now``: the monotonic clock the sleep is measured on."""
    if delay < grid:
        return max(delay, 0.0)
    end = math.ceil((now + delay - EARLY_S) / grid) * grid
    return max(end - now, 0.0)


__all__ = ["EARLY_S", "GRID_S", "coalesced"]
