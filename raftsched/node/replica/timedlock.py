"""The Raft lock, timed: every hold is measured (nothing slow may run under it).

pysyncobj's own thread takes ``raft.lock`` to apply commands; a long hold anywhere else
delays heartbeats and costs elections. Each hold's length goes to an optional observer
(the ``raftsched_raft_lock_hold_seconds`` histogram) and to the running maximum.

A slow hold's log line also gives the holder thread's CPU time during it: on a loaded
host a hold of a millisecond's work can last tens of milliseconds when the OS (or
another thread, for the GIL) preempts the holder, and the two have different cures.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable
from types import TracebackType

log = logging.getLogger("raftsched.raft")

#: A hold longer than this is logged (warning) with where it was taken (the lock budget:
#: docs/architecture.md).
SLOW_HOLD_S = 0.02


class TimedLock:
    """A non-reentrant lock usable as ``with lock:`` that times each hold.

    :ivar observer: called with each hold's length in seconds, after the release.
    :ivar max_hold_s: the longest hold seen.
    :ivar holds: how many holds ended.
    :ivar max_hold_site: where the longest hold was taken (``module:function:line``).
    :ivar what: set by a holder to say what it does, or a function that says it (called
        only for a slow hold's log line; cleared at each release).
    """

    def __init__(self, observer: Callable[[float], None] | None = None) -> None:
        self._lock = threading.Lock()
        self._since = 0.0
        self._cpu_since = 0.0
        self.observer = observer
        self.max_hold_s = 0.0
        self.max_hold_site = ""
        self.holds = 0
        self.what: str | Callable[[], str] = ""

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        got = self._lock.acquire(blocking, timeout)
        if got:
            self._since = time.perf_counter()  # only the holder writes or reads these
            self._cpu_since = time.thread_time()
        return got

    def release(self) -> None:
        held = time.perf_counter() - self._since
        # The holder's CPU only for a slow hold's log line: thread_time() is a system
        # call (~1 us), and the Raft thread takes this lock for every command it applies.
        cpu = time.thread_time() - self._cpu_since if held > SLOW_HOLD_S else 0.0
        self.holds += 1
        what, self.what = self.what, ""
        site = ""
        if held > SLOW_HOLD_S or held > self.max_hold_s:
            site = _site()
        if held > self.max_hold_s:
            self.max_hold_s = held
            self.max_hold_site = site
        self._lock.release()
        observer = self.observer
        if observer is not None:
            observer(held)
        if held > SLOW_HOLD_S:
            if callable(what):
                what = what()
            log.warning("raft lock held %.1f ms (cpu %.1f ms) at %s%s", held * 1000,
                        cpu * 1000, site, f" ({what})" if what else "")

    def locked(self) -> bool:
        return self._lock.locked()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()


def _site() -> str:
    """The first frame outside this module: where the ``with lock:`` is."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename == __file__:
        frame = frame.f_back  # type: ignore[assignment]
    if frame is None:
        return "?"
    mod = frame.f_globals.get("__name__", "?")
    return f"{mod}:{frame.f_code.co_name}:{frame.f_lineno}"
