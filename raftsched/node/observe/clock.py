"""The node's wall clock: the one place the edges read the time of day.

Everything a node stamps into a command (``at``, fire decisions, heartbeats) comes from
:func:`now_ms`. Offsets for the fault tests, off by default:
``RAFTSCHED_CLOCK_OFFSET_MS`` shifts a node's clock once at start (a leader whose clock
is behind can never assign a fire time twice; the skew shows in ``status``), and
``RAFTSCHED_CLOCK_FILE`` names a file holding an offset in milliseconds that is re-read
while the node runs, so a test can step one node's wall clock forward and back (the
nemesis does). Only the wall clock moves; monotonic deadlines do not, as on a host whose
time is stepped.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol

#: The clock file is read again at most this often (seconds, monotonic): ``now_ms`` is
#: on every hot path and must not stat a file each call.
FILE_REREAD_S = 0.1

_offset_ms = 0
_file: str | None = None
_file_offset_ms = 0
_file_next_read = 0.0
_file_lock = threading.Lock()


def set_offset_ms(offset: int) -> None:
    """Shift this process's clock (test-only fault injection)."""
    global _offset_ms
    _offset_ms = int(offset)


def set_offset_file(path: str | None) -> None:
    """Add the integer (ms) in ``path`` to the clock, re-read at most every
    :data:`FILE_REREAD_S` (test-only fault injection; None turns it off)."""
    global _file, _file_offset_ms, _file_next_read
    with _file_lock:
        _file, _file_offset_ms, _file_next_read = path, 0, 0.0


def _file_offset() -> int:
    global _file_offset_ms, _file_next_read
    path = _file
    if path is None:
        return 0
    now = time.monotonic()
    if now < _file_next_read:
        return _file_offset_ms
    with _file_lock:
        if now >= _file_next_read:
            try:
                with open(path, encoding="ascii") as f:
                    _file_offset_ms = int(f.read().strip() or 0)
            except (OSError, ValueError):
                pass  # missing or half-written: keep the last offset
            _file_next_read = now + FILE_REREAD_S
    return _file_offset_ms


def now_ms() -> int:
    """Epoch milliseconds, as this node sees them."""
    return time.time_ns() // 1_000_000 + _offset_ms + _file_offset()


class Clock(Protocol):
    """Where a clocked shell (the leader loop) reads time: the wall clock for what it
    stamps into commands and compares with fire times, the monotonic one for its own
    deadlines and silences. Passed in, so its timing can be stepped by a test."""

    def now_ms(self) -> int:
        """Epoch milliseconds, as this node sees them."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never steps (only differences mean anything)."""
        ...


class SystemClock:
    """This process's clocks: :func:`now_ms` (with the test-only offsets above) and
    :func:`time.monotonic`."""

    def now_ms(self) -> int:
        return now_ms()

    def monotonic(self) -> float:
        return time.monotonic()


#: The clock every node runs on.
SYSTEM_CLOCK: Clock = SystemClock()


class FakeClock:
    """A clock that moves only when told: :meth:`advance` moves both readings, as time
    passing does; :meth:`step_wall` moves only the wall clock, as an operator (or NTP)
    stepping the host's time does. Not thread-safe: one test drives it."""

    def __init__(self, wall_ms: int, mono: float = 1000.0) -> None:
        self._wall_ms = int(wall_ms)
        self._mono = float(mono)

    def now_ms(self) -> int:
        return self._wall_ms

    def monotonic(self) -> float:
        return self._mono

    def advance(self, seconds: float) -> None:
        """Let ``seconds`` pass (>= 0: monotonic time never goes back)."""
        if seconds < 0:
            raise ValueError(f"seconds: a clock cannot go back ({seconds})")
        self._mono += seconds
        self._wall_ms += round(seconds * 1000)

    def step_wall(self, ms: int) -> None:
        """Step the wall clock by ``ms`` (either way); monotonic time does not move."""
        self._wall_ms += int(ms)
