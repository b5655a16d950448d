"""Starting a job process and reading its output: through the guard, or by the node.

The process gets two pipes, one for stdout and one for stderr, so the run's log keeps
them apart (``raftsched logs RUN --stderr``); the node reads both into the run's
:class:`~raftsched.node.worker.output.Output`. Through the guard
(raftsched/node/worker/guard.py) the pipes' write ends travel over the private socket
as SCM_RIGHTS: the guard forks the job
with them as fds 1 and 2. Without a guard the node spawns the process itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from raftsched.node.worker.guard import Guard
    from raftsched.node.worker.output import Output

#: Bytes read from a pipe at once.
_CHUNK = 65536


def signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


class Process:
    """A job process, spawned by the guard (the node's child subreaper, see guard.py) or,
    without a guard, by the node itself."""

    def __init__(self, pid: int, *, guard: Guard | None,
                 local: asyncio.subprocess.Process | None = None) -> None:
        self.pid = pid
        self.returncode: int | None = None
        #: The guard's reason when the guard killed it (this node was frozen).
        self.killed: str | None = None
        self._guard = guard
        self._local = local
        self._exit = guard.exited(pid) if guard is not None else None

    async def wait(self) -> int:
        if self._exit is not None:
            ex = await asyncio.shield(self._exit)
            self.returncode, self.killed = ex.code, ex.killed
            return ex.code
        assert self._local is not None
        code = await self._local.wait()
        self.returncode = code
        return code

    def signal_group(self, sig: int) -> None:
        """Signal its process group; through the guard, which knows when it was reaped
        (after that its id may be someone else's)."""
        if self._guard is not None:
            self._guard.kill(self.pid, sig)
        else:
            signal_group(self.pid, sig)

    def done(self) -> None:
        if self._guard is not None:
            self._guard.forget(self.pid)


async def spawn(argv: list[str], env: dict[str, str], guard: Guard | None, *, fence: int,
                run_id: str, output: Output) -> tuple[Process, asyncio.Future[None]]:
    """Start ``argv`` in its own session, its stdout and stderr read into ``output``;
    the process and the task reading both streams (done when both reached their end)."""
    if guard is None or not guard.alive:
        local = await asyncio.create_subprocess_exec(
            *argv, env=env, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            # No preexec_fn: Python code between fork and exec in a threaded process can
            # deadlock on a lock another thread held at the fork (seen under libfaketime).
            start_new_session=True)
        assert local.stdout is not None and local.stderr is not None
        return (Process(local.pid, guard=None, local=local),
                asyncio.ensure_future(_read_both(local.stdout, local.stderr, output)))
    out_r, out_w = os.pipe()
    try:
        err_r, err_w = os.pipe()
    except BaseException:
        os.close(out_r)
        os.close(out_w)
        raise
    try:
        try:
            pid = await guard.spawn(argv, env, out_w, err_fd=err_w, fence=fence,
                                    run_id=run_id)
        finally:
            # The guard holds its own copies now (passed over the socket).
            os.close(out_w)
            os.close(err_w)
    except BaseException:
        os.close(out_r)
        os.close(err_r)
        raise
    proc = Process(pid, guard=guard)
    loop = asyncio.get_running_loop()
    ended = loop.create_future()
    sink = _Sink(output, ended)
    transports: list[asyncio.BaseTransport] = []
    try:
        for fd, err in ((out_r, False), (err_r, True)):
            pipe = os.fdopen(fd, "rb", buffering=0)
            try:
                transport, _ = await loop.connect_read_pipe(
                    lambda e=err: _PipeProtocol(sink, e), pipe)  # type: ignore[misc]
            except BaseException:
                pipe.close()
                raise
            transports.append(transport)
    except BaseException:
        for opened in transports:
            opened.close()
        if not transports:
            os.close(err_r)
        raise

    async def read() -> None:
        try:
            await ended
        finally:
            for opened in transports:
                opened.close()

    return proc, asyncio.ensure_future(read())


class _Sink:
    """Both pipes of one process: their bytes into ``output``; ``ended`` is set when both
    reached their end (plain protocol callbacks: no reader task per pipe, as thousands
    of runs may start in the same second)."""

    def __init__(self, output: Output, ended: asyncio.Future[None]) -> None:
        self.output = output
        self.ended = ended
        self.open = 2

    def closed(self) -> None:
        self.open -= 1
        if self.open == 0 and not self.ended.done():
            self.ended.set_result(None)


class _PipeProtocol(asyncio.Protocol):
    def __init__(self, sink: _Sink, err: bool) -> None:
        self.sink = sink
        self.err = err

    def data_received(self, data: bytes) -> None:
        self.sink.output.add(data, self.err)

    def eof_received(self) -> bool | None:
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.sink.closed()


async def _read_both(out: asyncio.StreamReader, err: asyncio.StreamReader,
                     output: Output) -> None:
    """The fallback path's (asyncio's subprocess) two streams into ``output``."""
    await asyncio.gather(_read(out, output, False), _read(err, output, True))


async def _read(stream: asyncio.StreamReader, output: Output, err: bool) -> None:
    while True:
        chunk = await stream.read(_CHUNK)
        if not chunk:
            return
        output.add(chunk, err)


__all__ = ["Process", "signal_group", "spawn"]
