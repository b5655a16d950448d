"""Executing one run: an argv process in its own process group, a Python callable, or
an HTTP request (raftsched/node/worker/httpjob.py).

The process gets the contract environment (``RAFTSCHED_JOB_ID``, ``RAFTSCHED_RUN_ID``,
``RAFTSCHED_SCHEDULED_AT``, ``RAFTSCHED_FENCE``, ``RAFTSCHED_ATTEMPT``,
``RAFTSCHED_NODE_ID``) on top of the node's environment minus the cluster secret,
plus the job's ``env``. No shell is involved unless the argv names one. A timeout
sends SIGTERM to the whole group, then SIGKILL after a grace. A bounded tail of the
output goes into the run record; all of it (up to the node's log limits) into the
run's log on this node (raftsched/node/worker/runlog.py), stdout and stderr apart, the job's
env values masked in both (raftsched/node/worker/output.py).
"""

from __future__ import annotations

import asyncio
import errno
import functools
import importlib
import inspect
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

from raftsched.core.claims import MAX_TAIL
from raftsched.core.model import ENV_MASK, JobSpec, RunState
from raftsched.node.worker import callpool, capture, httpjob
from raftsched.node.worker.guard import Guard
from raftsched.node.worker.output import ByteTail, Output
from raftsched.node.worker.runlog import RunLog, RunLogs
from raftsched.node.worker.runtypes import ExecutionResult, RunContext
from raftsched.node.worker.spawn import Process, spawn

#: Python callables run on this many threads per node at most (sync functions).
_CALL_THREADS = 64


def calls_waiting() -> int:
    """Sync callables handed to the thread pool and not yet started."""
    return callpool.queued()


class Execution:
    """One execution; :meth:`start` once, :meth:`stop` from anywhere on the loop."""

    def __init__(self, *, spec: JobSpec, ctx: RunContext, base_env: dict[str, str],
                 tail_bytes: int, allowed: tuple[str, ...] | None, kill_grace_s: float,
                 guard: Guard | None = None, logs: RunLogs | None = None) -> None:
        self.spec = spec
        self.ctx = ctx
        self.base_env = base_env
        # The state machine keeps at most MAX_TAIL characters of a tail, from its end: a
        # longer one would lose its cut mark there.
        self.tail_bytes = min(tail_bytes, MAX_TAIL)
        self.allowed = allowed
        self.kill_grace_s = kill_grace_s
        self.guard = guard
        self.logs = logs
        #: The run's full log on this node, opened by start() (None: logs are off).
        self.log: RunLog | None = None
        self.proc: Process | None = None
        self.task: asyncio.Task[Any] | None = None
        self.stopped = False
        self.stop_reason = ""
        # The callback path of start(): a sync callable on the shared thread pool.
        self._on_done: Callable[[ExecutionResult], None] | None = None
        self._calling = False
        self._timer: asyncio.TimerHandle | None = None
        self._runner: asyncio.Future[ExecutionResult] | None = None
        #: What a Python callable printed or logged (and its traceback), kept as the tail.
        self.output = capture.Tail(tail_bytes)

    def start(self, on_done: Callable[[ExecutionResult], None]) -> asyncio.Future[Any] | None:
        """Begin executing now; ``on_done(result)`` is called once on the loop. Returns
        the task of an argv or async run (None for a sync callable on the pool).

        A sync callable is handed to the thread pool with a done-callback and a timer
        instead of a task awaiting futures: at thousands of runs starting in the same
        instant, the per-run event-loop work is what shows as scheduling lag."""
        if self.logs is not None:
            self.log = self.output.log = self.logs.open(self.ctx.run_id, self.ctx.attempt)
        if self.log is not None:
            on_done = functools.partial(_closing, self.log, on_done)
        try:
            func = resolve_callable(self.spec.call, self.allowed) if self.spec.call else None
        except Exception as exc:  # noqa: BLE001 - a bad call is the run's failure
            on_done(_raised(exc, self.tail_bytes))
            return None
        if func is not None:
            capture.install()
        if func is None or inspect.iscoroutinefunction(func):
            runner = asyncio.ensure_future(self.run())
            runner.add_done_callback(lambda t: on_done(_task_result(t, self.tail_bytes)))
            self._runner = runner  # the loop keeps only a weak reference to tasks
            return runner
        loop = asyncio.get_running_loop()
        self._on_done = on_done
        self._timer = loop.call_later(self.spec.timeout_ms / 1000, self._timed_out)
        self._calling = True
        try:
            # Skipped if the run ends (stop, timeout) while the call waits for a thread.
            callpool.shared(_CALL_THREADS).submit(loop, functools.partial(
                capture.call, func, self.output), self.ctx, self._called,
                skip=lambda: self._on_done is None)
        except RuntimeError as exc:  # no thread could be started (a pids limit)
            self._settle(_raised(exc, self.tail_bytes))
        return None

    def _timed_out(self) -> None:
        self.ctx.cancelled.set()
        self._settle(ExecutionResult(outcome=RunState.timed_out, exit_code=None,
                                     tail=self.output.text(),
                                     reason=f"timeout {self.spec.timeout_ms // 1000}s"))

    def _called(self, value: Any, exc: BaseException | None) -> None:
        if exc is not None:
            self._settle(_raised(exc, self.tail_bytes, self.output.text()))
            return
        self._settle(ExecutionResult(outcome=RunState.succeeded, exit_code=None, reason="returned",
                                     tail=_with_value(self.output, value)))

    def _settle(self, result: ExecutionResult) -> None:
        on_done, self._on_done = self._on_done, None
        if on_done is None:
            return  # already settled (a timeout, a stop, then the thread's return)
        if self._timer is not None:
            self._timer.cancel()
        on_done(result)

    async def run(self) -> ExecutionResult:
        try:
            if self.spec.command is not None:
                return await self._run_argv()
            if self.spec.http is not None:
                return await self._run_http()
            return await self._run_call()
        except Exception as exc:  # noqa: BLE001 - a job's failure must not hurt the node
            return ExecutionResult(outcome=RunState.failed, exit_code=None, tail="",
                                   reason=f"{type(exc).__name__}: {exc}"[:200])

    def stop(self, grace_s: float, reason: str = "stopped by the node") -> None:
        """Terminate (SIGTERM the group, SIGKILL after ``grace_s``); the run then ends
        ``lost`` with ``reason`` (the job's ``on_node_lost`` decides what follows)."""
        self.stopped = True
        self.stop_reason = reason
        self.ctx.cancelled.set()
        if self.proc is not None and self.proc.returncode is None:
            self._terminate(grace_s)
        elif self._calling:
            # A thread cannot be killed: the run ends lost now and its thread is abandoned.
            self._settle(ExecutionResult(outcome=RunState.lost, exit_code=None,
                                         tail=self.output.text(), reason=reason))
        elif self.task is not None:
            self.task.cancel()

    def _terminate(self, grace_s: float) -> None:
        """SIGTERM the group now, SIGKILL it after ``grace_s`` unless it has ended by
        then (its process group id may belong to someone else once it is reaped)."""
        proc = self.proc
        assert proc is not None
        proc.signal_group(signal.SIGTERM)

        def kill() -> None:
            if proc.returncode is None:
                proc.signal_group(signal.SIGKILL)

        asyncio.get_running_loop().call_later(grace_s, kill)

    async def _run_argv(self) -> ExecutionResult:
        masked = sorted(k for k, v in self.spec.env.items() if v == ENV_MASK)
        if masked:
            # Accepted before puts refused the mask (an older journal): never run with it.
            return ExecutionResult(outcome=RunState.failed, exit_code=None, tail="",
                                   reason=f"env.{masked[0]} holds the display mask "
                                          f"{ENV_MASK!r}; put the job with its real value")
        env = dict(self.base_env)
        env.update(self.spec.env)
        env.update(self.ctx.environ())
        assert self.spec.command is not None
        output = Output(ByteTail(self.tail_bytes), self.log, self.spec.env.values())
        try:
            self.proc, reader = await spawn(list(self.spec.command), env, self.guard,
                                            fence=self.ctx.fence, run_id=self.ctx.run_id,
                                            output=output)
        except OSError as exc:
            return ExecutionResult(outcome=RunState.failed, exit_code=None, tail="",
                                   reason=_cannot_execute(self.spec.command[0], exc, env))
        proc = self.proc
        if self.stopped:
            self._terminate(self.kill_grace_s)  # stopped while it was being spawned
        timed_out = False
        try:
            await asyncio.wait_for(proc.wait(), self.spec.timeout_ms / 1000)
        except TimeoutError:
            timed_out = True
            proc.signal_group(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), self.kill_grace_s)
            except TimeoutError:
                proc.signal_group(signal.SIGKILL)
                await proc.wait()
        if timed_out:
            # Children that kept the pipe open must not hold the run.
            proc.signal_group(signal.SIGKILL)
        try:
            await asyncio.wait_for(reader, 1.0)
        except (TimeoutError, asyncio.CancelledError):
            reader.cancel()
        proc.done()
        output.finish()
        code = proc.returncode
        text = output.text()
        if proc.killed is not None and code == -signal.SIGKILL and not timed_out:
            # Killed by the guard while this node was frozen (before any self-fence that
            # followed once it ran again): the cluster may have moved the run.
            return ExecutionResult(outcome=RunState.lost, exit_code=code, tail=text,
                                   reason=proc.killed)
        if timed_out:
            return ExecutionResult(outcome=RunState.timed_out, exit_code=code, tail=text,
                                   reason=f"timeout {self.spec.timeout_ms // 1000}s")
        if self.stopped:
            return ExecutionResult(outcome=RunState.lost, exit_code=code, tail=text,
                                   reason=self.stop_reason)
        if code == 0:
            return ExecutionResult(outcome=RunState.succeeded, exit_code=0, tail=text,
                                   reason="exit 0")
        return ExecutionResult(outcome=RunState.failed, exit_code=code, tail=text,
                               reason=f"exit {code}" if code is not None and code >= 0
                               else f"killed by signal {-(code or 0)}")

    async def _run_http(self) -> ExecutionResult:
        """An HTTP job: the request as a task on the node's loop (stop() cancels it).
        Like a callable, it lives and dies with the node process; the fence it sends
        lets its receiver refuse a stale attempt."""
        http = self.spec.http
        assert http is not None
        if self.stopped:
            return ExecutionResult(outcome=RunState.lost, exit_code=None, tail="",
                                   reason=self.stop_reason)
        output = Output(ByteTail(self.tail_bytes), self.log, self.spec.env.values())
        timeout_ms = min(self.spec.timeout_ms, http.timeout_ms or self.spec.timeout_ms)
        self.task = asyncio.ensure_future(httpjob.request(http, self.ctx, self.spec.env,
                                                          output))
        try:
            status, reason = await asyncio.wait_for(asyncio.shield(self.task),
                                                    timeout_ms / 1000)
        except TimeoutError:
            self.task.cancel()
            output.finish()
            return ExecutionResult(outcome=RunState.timed_out, exit_code=None, tail=output.text(),
                                   reason=f"timeout {timeout_ms / 1000:g}s")
        except asyncio.CancelledError:
            if not self.stopped:
                raise
            output.finish()
            return ExecutionResult(outcome=RunState.lost, exit_code=None, tail=output.text(),
                                   reason=self.stop_reason)
        except httpjob.RequestFailed as exc:
            output.finish()
            return ExecutionResult(outcome=RunState.failed, exit_code=None, tail=output.text(),
                                   reason=exc.reason)
        output.finish()
        ok = http.succeeded(status)
        return ExecutionResult(outcome=RunState.succeeded if ok else RunState.failed,
                               exit_code=None, tail=output.text(), reason=reason)

    async def _run_call(self) -> ExecutionResult:
        """An ``async def`` callable, as a task on the node's loop (sync ones go to the
        call pool from :meth:`start`)."""
        func = resolve_callable(self.spec.call or "", self.allowed)
        if self.stopped:
            return ExecutionResult(outcome=RunState.lost, exit_code=None, tail="",
                                   reason=self.stop_reason)
        self.task = asyncio.ensure_future(_contained(func, self.ctx, self.output))
        try:
            value = await asyncio.wait_for(asyncio.shield(self.task), self.spec.timeout_ms / 1000)
        except TimeoutError:
            self.ctx.cancelled.set()
            self.task.cancel()
            return ExecutionResult(outcome=RunState.timed_out, exit_code=None,
                                   tail=self.output.text(),
                                   reason=f"timeout {self.spec.timeout_ms // 1000}s")
        except asyncio.CancelledError:
            if not self.stopped:
                raise
            return ExecutionResult(outcome=RunState.lost, exit_code=None, tail=self.output.text(),
                                   reason=self.stop_reason)
        except Exception as exc:  # noqa: BLE001 - the callable's failure is the run's
            return _raised(exc, self.tail_bytes, self.output.text())
        return ExecutionResult(outcome=RunState.succeeded, exit_code=None, reason="returned",
                               tail=_with_value(self.output, value))


@functools.lru_cache(maxsize=4096)
def resolve_callable(call: str, allowed: tuple[str, ...] | None) -> Any:
    """Import ``package.module:function``, only under an allowed module prefix (cached:
    it is on the path of every run; a failed import is not cached). ``allowed`` None:
    the prefix was checked where the job entered (the embedded Scheduler's node)."""
    module_name, _, attr = call.partition(":")
    if allowed is not None and not any(module_name == p or module_name.startswith(p + ".")
                                       for p in allowed):
        raise PermissionError(f"module {module_name!r} is not under an allowed prefix")
    module = sys.modules.get(module_name)
    if module is not None and getattr(getattr(module, "__spec__", None), "_initializing", False):
        # Being imported (another thread): an app whose module starts the embedded
        # Scheduler at import waits in start() for the node's loop; importing it here,
        # on that loop, would wait for the import to end: a deadlock until start()
        # times out. Its functions defined above start() are there already.
        func = getattr(module, attr, None)
        if func is None:
            raise ImportError(f"module {module_name!r} is still being imported and has no "
                              f"{attr!r} yet (is it defined after Scheduler.start()?)")
    else:
        func = getattr(importlib.import_module(module_name), attr)
    if not callable(func):
        raise TypeError(f"{call} is not callable")
    return func


class _Escaped(Exception):
    """A job's SystemExit/KeyboardInterrupt, carried as an ordinary exception: raised
    raw inside a task it would propagate out of the node's event loop."""

    def __init__(self, inner: BaseException) -> None:
        super().__init__(str(inner))
        self.inner = inner


async def _contained(func: Any, ctx: RunContext, tail: capture.Tail) -> Any:
    # Inside the task: its output and traceback land in the run's tail.
    with capture.running(tail):
        try:
            return await func(ctx)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            tail.write(capture.format_exception(exc))
            if isinstance(exc, (SystemExit, KeyboardInterrupt)):
                raise _Escaped(exc) from None
            raise


def _closing(log: RunLog, on_done: Callable[[ExecutionResult], None],
             result: ExecutionResult) -> None:
    """The run ended: its log is complete (a callable's abandoned thread writes no more
    into it), then the worker hears of the outcome."""
    log.close()
    on_done(result)


#: Kept importable from here (it moved to output.py with the output it keeps).
_ByteTail = ByteTail


def _with_value(output: capture.Tail, value: Any) -> str:
    """The output tail, then what the callable returned (if anything)."""
    return output.text("" if value is None else str(value))


def _task_result(task: asyncio.Future[ExecutionResult], tail_bytes: int) -> ExecutionResult:
    if task.cancelled():
        return ExecutionResult(outcome=RunState.lost, exit_code=None, tail="", reason="cancelled")
    try:
        return task.result()
    except BaseException as exc:  # noqa: BLE001 - e.g. SystemExit from an async job
        return _raised(exc, tail_bytes)


def _raised(exc: BaseException, tail_bytes: int, output: str = "") -> ExecutionResult:
    """A failed run; ``output`` (a callable's output, ending with its traceback) is the
    tail when there is one."""
    if isinstance(exc, _Escaped):
        exc = exc.inner
    return ExecutionResult(outcome=RunState.failed, exit_code=None,
                           tail=(output or f"{type(exc).__name__}: {exc}")[-tail_bytes:],
                           reason=f"raised {type(exc).__name__}")


def _cannot_execute(program: str, exc: OSError, env: dict[str, str]) -> str:
    """The reason of a run whose program could not be started, naming the program (the
    system's words alone, ``No such file or directory``, leave the reader guessing
    which file)."""
    reason = f"cannot execute {program!r}: {exc.strerror or exc}"
    if exc.errno == errno.ENOENT and "/" not in program:
        # Looked up on the PATH the job gets (the node's, unless the job sets its own).
        reason += f" (not found on PATH={env.get('PATH', os.defpath)})"
    return reason if len(reason) <= 200 else reason[:197] + "..."
