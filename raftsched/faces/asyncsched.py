"""``raftsched.AsyncScheduler``: the embedded member for asyncio apps (FastAPI and
Starlette lifespans, aiohttp ``on_startup``/``on_cleanup``)::

    sched = raftsched.AsyncScheduler()     # same arguments as raftsched.Scheduler

    @sched.job(every="30s")
    async def refresh(ctx):
        ...

    @contextlib.asynccontextmanager
    async def lifespan(app):
        async with sched:                  # start(); stop() drains on the way out
            yield

Blocking work (starting the node, waiting for its drain, client calls) runs in a
thread, so the app's event loop never stalls. ``async def`` callables run on the
node's own event loop, sync ones on its worker threads — never on the app's loop.
The app server handles SIGTERM and runs the lifespan's exit, which drains.
"""

from __future__ import annotations

import asyncio
from typing import Any

from raftsched.faces.declare import ReconcileReport
from raftsched.faces.embedded import Scheduler


class AsyncScheduler:
    """See the module docstring; ``AsyncScheduler(...)`` takes ``Scheduler``'s arguments."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        #: The blocking scheduler underneath (its ``client``, ``role``, ``cfg``).
        self.sync = Scheduler(*args, **kwargs)

    def job(self, *args: Any, **kwargs: Any) -> Any:
        """Decorator, as :meth:`Scheduler.job` (declaring is local until started)."""
        return self.sync.job(*args, **kwargs)

    async def add_job(self, func: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(self.sync.add_job, func, **kwargs)

    @property
    def role(self) -> str | None:
        return self.sync.role

    async def start(self, timeout: float = 30.0) -> AsyncScheduler:
        await asyncio.to_thread(self.sync.start, timeout)
        return self

    async def stop(self) -> None:
        await asyncio.to_thread(self.sync.stop)

    async def wait_declared(self, timeout: float = 30.0) -> ReconcileReport:
        return await asyncio.to_thread(self.sync.wait_declared, timeout)

    async def reconcile(self, *, prune: bool = False) -> ReconcileReport:
        return await asyncio.to_thread(self.sync.reconcile, prune=prune)

    async def trigger(self, job_id: str, force: bool = False) -> Any:
        return await asyncio.to_thread(self.sync.trigger, job_id, force)

    async def runs(self, job_id: str, limit: int = 100) -> Any:
        return await asyncio.to_thread(self.sync.runs, job_id, limit)

    async def __aenter__(self) -> AsyncScheduler:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
