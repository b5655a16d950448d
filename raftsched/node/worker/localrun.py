"""A claimed run as this node's worker pool tracks it.

Its own module so that the pool (``worker``) and its commit half (``workercommits``)
share it without importing each other.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from raftsched.node.worker.executor import Execution


class Phase(enum.Enum):
    """Where a claimed run is on this node."""

    #: Claimed, waiting for its start instant (or for a free slot).
    WAITING = "waiting"
    #: Its start is being committed (the spawn gate passed, the process not yet up).
    STARTING = "starting"
    #: Started in the cluster; waiting for its instant (a start committed ahead) or,
    #: past it, for a free slot (an instant bigger than the slots).
    STARTED = "started"
    #: Executing (it holds a slot).
    RUNNING = "running"
    #: Ended here; its finish is being committed (or it was taken away).
    FINISHING = "finishing"


@dataclass(slots=True, kw_only=True)
class LocalRun:
    """A run this node holds a claim on, as its worker pool tracks it (its phase moves
    waiting -> starting -> started -> running -> finishing; ``execution`` from started)."""

    run_id: str
    fence: int
    job_id: str
    scheduled_ms: int
    attempt: int
    start_at_ms: int
    grace_ms: int
    #: Grace counts from the later of the start instant and the assignment: a catch-up
    #: run is late by design, a run its node reaches seconds after assignment is not.
    due_ms: int = 0
    phase: Phase = Phase.WAITING
    execution: Execution | None = None


__all__ = ["LocalRun", "Phase"]
