"""The node's wall clock: the one place the edges read the time of day.

Everything a node stamps into a command (``at``, fire decisions, heartbeats) comes from
:func:`now_ms`. Tests shift a node's clock with ``RAFTSCHED_CLOCK_OFFSET_MS`` (test-only,
like ``RAFTSCHED_FAULT``) to check that a leader whose clock is behind can never assign
a fire time twice and that the skew shows in ``status``.
"""

from __future__ import annotations

import time

_offset_ms = 0


def set_offset_ms(offset: int) -> None:
    """Shift this process's clock (test-only fault injection)."""
    global _offset_ms
    _offset_ms = int(offset)


def now_ms() -> int:
    """Epoch milliseconds, as this node sees them."""
    return time.time_ns() // 1_000_000 + _offset_ms
