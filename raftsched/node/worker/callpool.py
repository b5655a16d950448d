"""The threads that run sync Python-callable jobs, handing results back to the loop.

``concurrent.futures.ThreadPoolExecutor`` costs a ``Future`` (and its ``Condition``)
per call and one loop wake-up per result; with a thousand runs due in the same
instant that per-run work is what shows as scheduling lag. Here a call is one tuple
on a deque; results go back to their event loop in batches, one
``call_soon_threadsafe`` per batch. Threads are started on demand up to a bound, and
are daemons: a callable that never returns must not keep the node from exiting (a
thread cannot be killed; its run is recorded timed out or lost and abandoned).

In a burst the GIL is the scarce thing, so the pool spends it on starting calls:
a submit wakes one thread only if none is already on its way to the queue, and a
thread that takes a call and leaves others queued wakes the next (blocking calls
still fan out to every thread, one wake-up apart, while quick ones are drained by
the few threads already awake); and while calls are queued, results wait until the
queue is empty (at most 50 ms) and reach the loop as one batch, instead of the loop
taking them one by one in between the calls.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("raftsched.callpool")

#: While calls are queued, results wait for the queue to empty (checked this often)...
DRAIN_DEFER_S = 0.002
#: ...but never longer than this after the first of them.
DRAIN_DEFER_MAX_S = 0.05

#: Callback given the callable's return value and the exception it raised (or None).
Done = Callable[[Any, BaseException | None], None]


class CallPool:
    """Up to ``size`` threads calling ``func(arg)``; see the module docstring."""

    def __init__(self, size: int, name: str = "rs-call") -> None:
        self.size = size
        self.name = name
        # One lock for the queue and the idle count: a thread taking an item and
        # ceasing to be idle is one step, so submit never counts a busy thread as idle.
        self._cond = threading.Condition(threading.Lock())
        self._items: collections.deque[tuple[Any, ...]] = collections.deque()
        self._threads = 0
        self._idle = 0
        # Threads notified (or started) that have not reached the queue yet.
        self._waking = 0
        # Per loop: results not yet delivered (a drain is scheduled while non-empty).
        self._results: dict[asyncio.AbstractEventLoop, list[tuple[Done, Any, Any]]] = {}

    def submit(self, loop: asyncio.AbstractEventLoop, func: Callable[[Any], Any], arg: Any,
               done: Done, skip: Callable[[], bool] | None = None) -> None:
        """Call ``func(arg)`` on a pool thread; ``done(value, exc)`` runs on ``loop``.
        ``skip()`` is asked when a thread takes the call: true (the run ended while it
        waited for a thread: stopped, timed out) drops it uncalled and unreported.
        Raises (and drops the call) only if no thread exists and none can be started."""
        item = (loop, func, arg, done, skip)
        with self._cond:
            self._items.append(item)
            n = self._reserve()
        if n:
            self._start(n, item)

    def queued(self) -> int:
        """Calls waiting for a thread."""
        return len(self._items)

    def _reserve(self, new: bool = True) -> int:
        """With the lock held, for the calls queued: wake an idle thread, or (``new``)
        reserve a new one and return its number (0: one is on its way already, or none
        may be added). One at a time: the one woken wakes the next if calls remain."""
        if self._waking:
            return 0
        if self._idle:
            self._waking += 1
            self._cond.notify()
            return 0
        if not new or self._threads >= self.size:
            return 0  # every thread is busy: the calls wait for one
        self._threads += 1
        self._waking += 1
        return self._threads

    def _start(self, n: int, item: tuple[Any, ...] | None) -> None:
        """Start reserved thread ``n`` (outside the lock: a start waits for the new
        thread to run). If it cannot start and no thread exists, ``item`` is dropped
        and the error raised to its submitter; otherwise the queued calls wait for the
        threads there are."""
        try:
            threading.Thread(target=self._work, name=f"{self.name}-{n}", daemon=True).start()
        except BaseException as exc:
            with self._cond:
                self._threads -= 1
                self._waking -= 1
                dropped = self._threads == 0 and item is not None and self._drop(item)
                if self._items:
                    self._reserve(new=False)
            if dropped or not isinstance(exc, Exception):
                raise
            log.exception("could not start a call thread; %d running", self._threads)

    def _drop(self, item: tuple[Any, ...]) -> bool:
        for i, queued in enumerate(self._items):
            if queued is item:
                del self._items[i]
                return True
        return False

    def _work(self) -> None:
        waking = True  # a new thread counts as woken until it reaches the queue
        while True:
            with self._cond:
                if waking:
                    self._waking -= 1
                    waking = False
                while not self._items:
                    self._idle += 1
                    self._cond.wait()
                    self._idle -= 1
                    self._waking -= 1  # only notify() wakes a waiter: it was for us
                loop, func, arg, done, skip = self._items.popleft()
                n = self._reserve() if self._items else 0
            if n:
                self._start(n, None)
            if skip is not None and skip():
                continue
            try:
                value, exc = func(arg), None
            except BaseException as e:  # noqa: BLE001 - reported as the run's failure
                value, exc = None, e
            del func, arg
            self._deliver(loop, done, value, exc)

    def _deliver(self, loop: asyncio.AbstractEventLoop, done: Done, value: Any,
                 exc: BaseException | None) -> None:
        with self._cond:
            pending = self._results.get(loop)
            if pending is not None and loop.is_closed():
                self._results.pop(loop, None)  # its deferred drain will never run
                return
            first = pending is None
            if pending is None:
                pending = self._results[loop] = []
            pending.append((done, value, exc))
        if first:
            try:
                loop.call_soon_threadsafe(self._drain, loop, time.monotonic())
            except RuntimeError:
                # The loop is closed (its node shut down): the result has no reader.
                with self._cond:
                    self._results.pop(loop, None)

    def _drain(self, loop: asyncio.AbstractEventLoop, since: float) -> None:
        with self._cond:
            # While calls still wait for a thread (an instant's burst), starting them
            # comes first: the loop handling results would take the GIL from them.
            defer = bool(self._items) and time.monotonic() - since < DRAIN_DEFER_MAX_S
            batch = [] if defer else self._results.pop(loop, [])
        if defer:
            loop.call_later(DRAIN_DEFER_S, self._drain, loop, since)
            return
        for done, value, exc in batch:
            try:
                done(value, exc)
            except Exception:  # noqa: BLE001 - one bad callback must not drop the others
                log.exception("call result callback failed")


_POOL: CallPool | None = None
_POOL_LOCK = threading.Lock()


def queued() -> int:
    """Calls waiting for a thread in the process-wide pool."""
    pool = _POOL
    return 0 if pool is None else pool.queued()


def shared(size: int) -> CallPool:
    """The process-wide pool (created on first use)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = CallPool(size)
        return _POOL
