"""``raftsched.Scheduler``: one node embedded in this process — no server to install.

It runs the same node as ``raftsched node`` (Raft journal, API, worker pool) on a
thread of its own, and registers Python callables as jobs::

    def tick(ctx):            # ctx is a raftsched.RunContext
        print("run", ctx.run_id, "fence", ctx.fence)

    with raftsched.Scheduler(data_dir="./raftsched-data") as sched:
        sched.add_job(tick, id="tick", schedule={"every": "1s"})
        ...
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import replace
from typing import Any

from raftsched.client import Client
from raftsched.config import embedded_default


class Scheduler:
    """An in-process single node. ``api`` is its loopback API address (``None`` keeps
    the default 127.0.0.1:7101); ``allow`` lists module prefixes callables may come
    from (the modules of functions given to :meth:`add_job` are added)."""

    def __init__(self, data_dir: str = "./raftsched-data", *, api: str | None = None,
                 raft: str | None = None, workers: int = 4, allow: tuple[str, ...] = ()) -> None:
        cfg = embedded_default(data_dir)
        node = replace(cfg.nodes[0], workers=workers, queue=workers * 4,
                       api=api or cfg.nodes[0].api, raft=raft or cfg.nodes[0].raft,
                       metrics=None)
        self.cfg = replace(cfg, nodes=(node,), allowed_call_prefixes=tuple(allow))
        self._thread: threading.Thread | None = None
        self._node: Any = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._client: Client | None = None

    def start(self, timeout: float = 15.0) -> Scheduler:
        self._thread = threading.Thread(target=self._main, name="raftsched", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError("the embedded node did not start")
        if self._error is not None:
            raise self._error
        self._client = Client([self.cfg.nodes[0].api], timeout=timeout)
        self._client.status()
        return self

    def _main(self) -> None:
        from raftsched.node import Node
        try:
            self._node = Node(self.cfg, self.cfg.nodes[0].id)
        except BaseException as exc:  # noqa: BLE001 - handed to the starting thread
            self._error = exc
            self._ready.set()
            return

        async def run() -> None:
            task = asyncio.create_task(self._node.run())
            await asyncio.sleep(0.05)
            self._ready.set()
            await task

        asyncio.run(run())

    @property
    def client(self) -> Client:
        if self._client is None:
            raise RuntimeError("start() the scheduler first")
        return self._client

    def add_job(self, func: Any, *, id: str, schedule: dict[str, Any], **spec: Any) -> Any:
        """Register ``func(ctx)`` (sync or async) as job ``id``; other spec fields as kwargs."""
        module = func.__module__
        prefixes = self.cfg.allowed_call_prefixes
        if module not in prefixes:
            self.cfg = replace(self.cfg, allowed_call_prefixes=prefixes + (module,))
            if self._node is not None:
                self._node.cfg = self.cfg
                self._node.worker.allowed = self.cfg.allowed_call_prefixes
        body = dict(spec, id=id, schedule=schedule, call=f"{module}:{func.__qualname__}")
        return self.client.put_job(body)

    def stop(self) -> None:
        node, loop = self._node, getattr(self._node, "loop", None)
        if node is not None and loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(node.stop)
        if self._thread is not None:
            self._thread.join(15)
        if self._client is not None:
            self._client.close()

    def __enter__(self) -> Scheduler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
