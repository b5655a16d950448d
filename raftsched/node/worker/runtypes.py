"""What a run is to the node that executes it, as data: the context a job receives
(:class:`RunContext`) and how its execution ended (:class:`ExecutionResult`).

Apart from the executor so that the kinds of job (argv, Python callable, HTTP request)
and the worker can name them without importing each other.
"""

from __future__ import annotations

import datetime as dt
import threading
from dataclasses import dataclass, field

from raftsched.core.model import RunState


@dataclass(frozen=True, slots=True, kw_only=True)
class RunContext:
    """What a run knows about itself; a Python callable receives it as its argument.

    :var job_id: the job.
    :var run_id: ``<job_id>@<scheduled_ms>``.
    :var scheduled_ms: the fire time (epoch ms).
    :var fence: the fencing token; give it to downstream systems to reject stale writers.
    :var attempt: 1 for the first attempt.
    :var node_id: the node executing it.
    :var cancelled: set when the run has timed out, was replaced or cancelled, or its
        node stops it: a callable that can, should return soon after (a thread cannot
        be killed; its late result is not recorded).
    """

    job_id: str
    run_id: str
    scheduled_ms: int
    fence: int
    attempt: int
    node_id: str
    cancelled: threading.Event = field(default_factory=threading.Event, compare=False,
                                       repr=False)

    @property
    def scheduled_at(self) -> str:
        """The fire time in RFC 3339, UTC."""
        t = dt.datetime.fromtimestamp(self.scheduled_ms / 1000, tz=dt.UTC)
        return t.isoformat(timespec="milliseconds").replace("+00:00", "Z")

    def environ(self) -> dict[str, str]:
        return {
            "RAFTSCHED_JOB_ID": self.job_id,
            "RAFTSCHED_RUN_ID": self.run_id,
            "RAFTSCHED_SCHEDULED_AT": self.scheduled_at,
            "RAFTSCHED_FENCE": str(self.fence),
            "RAFTSCHED_ATTEMPT": str(self.attempt),
            "RAFTSCHED_NODE_ID": self.node_id,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class ExecutionResult:
    """How a run ended on this node.

    :var outcome: ``succeeded``, ``failed``, ``timed_out``, ``lost`` (stopped by its own
        node: shutdown or lost quorum), ``shed`` or ``cancelled``.
    :var exit_code: the process exit code (negative: killed by that signal), if any.
    :var tail: the last bytes of stdout+stderr, decoded leniently; it begins with
        :data:`capture.CUT_MARK` when earlier output was not kept.
    :var reason: a short human reason (``exit 3``, ``timeout 30s``, an exception).
    """

    outcome: RunState
    exit_code: int | None
    tail: str
    reason: str


__all__ = ["ExecutionResult", "RunContext"]
