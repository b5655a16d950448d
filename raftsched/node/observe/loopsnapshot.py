"""Frozen snapshots of event-loop state for other threads (the metrics endpoint).

The node's loop objects (the worker pool's runs, its counters) are mutated by the loop
without locks. A thread that iterated them itself (the metrics HTTP thread once did)
could meet ``dictionary changed size during iteration`` under load. Instead the snapshot
is built on the loop, between two of its callbacks, and handed over frozen.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")

#: How long a reader waits for a busy loop before it takes the previous snapshot.
WAIT_S = 1.0


class LoopSnapshot(Generic[T]):
    """``get()`` from any thread returns ``compute()`` as run on the loop.

    :param compute: builds the (frozen) snapshot; called once here (before the loop
        runs: the first fallback), then on the loop only while it runs.
    :param loop: the loop that owns the state, or None while it does not run yet (then
        nothing mutates the state and ``compute`` runs in the caller's thread).
    :param wait_s: how long a reader waits for the loop before it answers with the
        previous snapshot (a scrape must not hang on a busy loop).
    """

    def __init__(self, compute: Callable[[], T],
                 loop: Callable[[], asyncio.AbstractEventLoop | None],
                 wait_s: float = WAIT_S) -> None:
        self.compute = compute
        self.loop = loop
        self.wait_s = wait_s
        self._last: T = compute()

    def get(self) -> T:
        loop = self.loop()
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if loop is None or running is loop or loop.is_closed():
            value = self.compute()
        else:
            fut: concurrent.futures.Future[T] = concurrent.futures.Future()

            def build() -> None:
                if fut.set_running_or_notify_cancel():
                    try:
                        fut.set_result(self.compute())
                    except BaseException as exc:  # noqa: BLE001 - handed to the reader
                        fut.set_exception(exc)

            try:
                loop.call_soon_threadsafe(build)
            except RuntimeError:  # closed meanwhile: nothing mutates the state any more
                value = self.compute()
            else:
                try:
                    value = fut.result(self.wait_s)
                except concurrent.futures.TimeoutError:
                    fut.cancel()  # the loop is busy: the previous snapshot
                    return self._last
        self._last = value
        return value


__all__ = ["LoopSnapshot"]
