"""raftsched: a Raft-replicated job scheduler — each scheduled run happens once, also
while nodes crash, pause, lose the network or fail over.

Public API: :class:`Client` (talks to any node), :class:`Scheduler` (an embedded
node in this process), :class:`AsyncScheduler` (the same for asyncio apps),
:class:`JobSpec`, :class:`RunContext`, the enums and the
errors. Names are imported on first use, so ``import raftsched`` stays cheap for a
client and pulls in no node runtime.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: Public name -> the module that defines it.
_EXPORTS = {
    "Client": "raftsched.wire.client",
    "Scheduler": "raftsched.faces.embedded",
    "AsyncScheduler": "raftsched.faces.asyncsched",
    "ReconcileReport": "raftsched.faces.declare",
    "RunContext": "raftsched.node.worker.executor",
    "JobSpec": "raftsched.core.model",
    "Overlap": "raftsched.core.model",
    "MisfirePolicy": "raftsched.core.model",
    "OnNodeLost": "raftsched.core.model",
    "RunState": "raftsched.core.model",
    **{name: "raftsched.core.errors" for name in (
        "RaftschedError", "InvalidSpec", "UnknownJob", "Conflict", "LimitExceeded",
        "NotReady", "StaleFence", "Unauthenticated", "Unavailable")},
}

__all__ = [
    "Client", "Scheduler", "AsyncScheduler", "ReconcileReport", "JobSpec", "RunContext",
    "Overlap", "MisfirePolicy", "OnNodeLost",
    "RunState", "RaftschedError", "InvalidSpec", "UnknownJob", "Conflict", "LimitExceeded",
    "NotReady", "StaleFence", "Unauthenticated", "Unavailable",
]

if TYPE_CHECKING:
    from raftsched.core.errors import (
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
    from raftsched.core.model import JobSpec, MisfirePolicy, OnNodeLost, Overlap, RunState
    from raftsched.faces.asyncsched import AsyncScheduler
    from raftsched.faces.declare import ReconcileReport
    from raftsched.faces.embedded import Scheduler
    from raftsched.node.worker.runtypes import RunContext
    from raftsched.wire.client import Client


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'raftsched' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
