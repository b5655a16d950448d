"""The cyclic garbage collector, watched: every collection timed, the long ones logged.

A collection runs inside whatever thread allocates and stops every other thread of the
process meanwhile (it holds the GIL): a long one inside pysyncobj's thread delays its
heartbeats and costs elections, one anywhere else delays that thread's work. A slow
Raft-lock hold's log line cannot tell a collection from the holder's own work; this
module's line does (``gc gen 2 took 850 ms, 1,204,311 objects tracked``), and
:func:`statistics` gives the totals for the metrics and the benchmarks.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass

log = logging.getLogger("raftsched.gc")

#: A collection longer than this is logged (a warning: it is as long as an election's
#: tolerance, or close).
SLOW_GC_S = 0.05


@dataclass(frozen=True, slots=True, kw_only=True)
class GcStatistics:
    """Collections since :func:`install`, per generation (0, 1, 2).

    :var collections: how many ran.
    :var seconds: their total wall time.
    :var max_seconds: the longest one.
    """

    collections: tuple[int, int, int]
    seconds: tuple[float, float, float]
    max_seconds: tuple[float, float, float]


class _Watch:
    def __init__(self) -> None:
        self.started = 0.0
        self.count = [0, 0, 0]
        self.total = [0.0, 0.0, 0.0]
        self.longest = [0.0, 0.0, 0.0]

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self.started = time.perf_counter()
            return
        took = time.perf_counter() - self.started
        gen = min(max(int(info.get("generation", 0)), 0), 2)
        self.count[gen] += 1
        self.total[gen] += took
        if took > self.longest[gen]:
            self.longest[gen] = took
        if took > SLOW_GC_S:
            # The count is cheap to ask only for the generation that just ran.
            log.warning("gc gen %d took %.1f ms (%d collected, %d uncollectable)", gen,
                        took * 1000, info.get("collected", 0), info.get("uncollectable", 0))


_watch: _Watch | None = None


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """The collector off while a whole state snapshot is built or read back.

    Building or walking millions of small objects triggers full collections that find
    nothing (the state is acyclic) and cost more than the work itself. The switch is
    process-wide, so it lives here, in the node that owns its process (or was embedded
    on purpose), never in the pure core's codec, which a library caller may use."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def install() -> None:
    """Time every collection of this process from now on (once; a node's process)."""
    global _watch
    if _watch is None:
        _watch = _Watch()
        gc.callbacks.append(_watch)


def installed() -> bool:
    """Does this process watch its collections (a node's process: :func:`install`)?"""
    return _watch is not None


def statistics() -> GcStatistics:
    """What the watcher saw (zeros before :func:`install`)."""
    w = _watch or _Watch()
    return GcStatistics(collections=(w.count[0], w.count[1], w.count[2]),
                        seconds=(w.total[0], w.total[1], w.total[2]),
                        max_seconds=(w.longest[0], w.longest[1], w.longest[2]))
