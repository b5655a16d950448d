"""raftsched: a Raft-replicated job scheduler — each scheduled run happens once, also
while nodes crash, pause, lose the network or fail over.

Public API: :class:`Client` (talks to any node), :class:`Scheduler` (an embedded
single node in this process), :class:`JobSpec`, the enums and the errors.
"""

from __future__ import annotations

from raftsched.client import Client
from raftsched.embedded import Scheduler
from raftsched.errors import (
    Conflict,
    InvalidSpec,
    LimitExceeded,
    NotReady,
    RaftschedError,
    StaleFence,
    Unauthenticated,
    Unavailable,
    UnknownJob,
)
from raftsched.executor import RunContext
from raftsched.model import JobSpec, MisfirePolicy, OnNodeLost, Overlap, RunState

__all__ = [
    "Client", "Scheduler", "JobSpec", "RunContext", "Overlap", "MisfirePolicy", "OnNodeLost",
    "RunState", "RaftschedError", "InvalidSpec", "UnknownJob", "Conflict", "LimitExceeded",
    "NotReady", "StaleFence", "Unauthenticated", "Unavailable",
]
