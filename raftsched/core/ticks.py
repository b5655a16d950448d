"""Wakeups that need not be exact land together (issue 31 item 3: an idle node's CPU is
its wakeups, ~0.3 ms each on the benchmark machine, mostly the kernel's).

An idle node's event loop had five loops of its own, each with a timer of its own: the
leader loop's housekeeping (0.5 s), the worker's safety-net poll (1 s), the liveness
loop's idle turn, the pause watcher (1 s), the secret file's poll (1 s) and the
notifier's idle round (2 s). Started at different moments, they woke the loop at
different moments: 5-7 wakeups a second. A sleep that is only a safety net or an idle
turn instead ends on a grid of the event loop's clock (:data:`GRID_S`), shared by every
loop of the process, so the loop wakes once for all the timers due at that point, as
the kernel rounds its own timers (``round_jiffies``).

Only for sleeps whose length is a bound, not a deadline: never for a run's instant,
a heartbeat that is due, a self-fence or a plan's lead time.

Pure: the loop's time is passed in.
"""

from __future__ import annotations

import math

#: The grid (seconds of the event loop's clock) coalesced sleeps end on.
GRID_S = 0.25
#: A coalesced sleep may end this much of a grid step early (rather than a whole step
#: late): a loop that sleeps half a second again right after a wakeup on the grid,
#: some microseconds past it, lands on the grid point half a second on, not the next.
EARLY = 0.1


def coalesced(now: float, delay: float, grid: float = GRID_S) -> float:
    """``delay`` (seconds) moved to end on the first point of the ``grid`` at or after
    ``now + delay - EARLY * grid``: at most ``EARLY * grid`` shorter, less than ``grid``
    longer, never negative. ``now``: the event loop's clock (``loop.time()``)."""
    if delay <= 0:
        return 0.0
    end = math.ceil((now + delay) / grid - EARLY) * grid
    return max(end - now, 0.0)


__all__ = ["EARLY", "GRID_S", "coalesced"]
