"""A worker pool's slots: which runs execute, and the started runs waiting for one.

A start may be committed ahead of its instant beyond the free slots (a big instant,
planned early): such a run waits here, started, past its instant, and begins as soon
as a slot frees, with no commit between. Kept apart from the pool so that what holds a
slot is counted in one place (the pool's phases say where a run is; this says how
many execute).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping

from raftsched.node.worker.localrun import LocalRun, Phase


class Slots:
    """``count`` slots; a run holds one from its process's start to its end."""

    def __init__(self, count: int) -> None:
        self.count = count
        #: (run id, fence) of the runs executing: a newer attempt of a run id is
        #: another holder.
        self._running: set[tuple[str, int]] = set()
        self._waiting: deque[LocalRun] = deque()

    @property
    def free(self) -> int:
        """Slots no run holds."""
        return self.count - len(self._running)

    @property
    def waiting(self) -> int:
        """Started runs waiting for a slot (some may have been taken away meanwhile)."""
        return len(self._waiting)

    def take(self, loc: LocalRun) -> None:
        """``loc``'s process is starting: it holds a slot until :meth:`give_back`."""
        self._running.add((loc.run_id, loc.fence))

    def give_back(self, loc: LocalRun) -> None:
        """``loc`` ended (or never began): its slot is free (idempotent)."""
        self._running.discard((loc.run_id, loc.fence))

    def wait(self, loc: LocalRun) -> None:
        """``loc`` is started and due but no slot is free: it waits, in order."""
        self._waiting.append(loc)

    def next_batch(self, local: Mapping[str, LocalRun]) -> list[LocalRun]:
        """Up to :attr:`free` waiting runs, oldest first, skipping those the pool no
        longer holds as started (cancelled, replaced, ended)."""
        batch: list[LocalRun] = []
        while self._waiting and len(batch) < self.free:
            loc = self._waiting.popleft()
            if _current(loc, local):
                batch.append(loc)
        return batch

    def expire(self, now_ms: int, local: Mapping[str, LocalRun]) -> list[LocalRun]:
        """Remove and return the waiting runs past their grace (counted from the later
        of their start instant and their assignment); drop those no longer held."""
        keep: deque[LocalRun] = deque()
        late: list[LocalRun] = []
        for loc in self._waiting:
            if not _current(loc, local):
                continue
            if now_ms - max(loc.start_at_ms, loc.due_ms) > loc.grace_ms:
                late.append(loc)
            else:
                keep.append(loc)
        self._waiting = keep
        return late


def _current(loc: LocalRun, local: Mapping[str, LocalRun]) -> bool:
    return local.get(loc.run_id) is loc and loc.phase == Phase.STARTED


__all__ = ["Slots"]
