"""``Execution.start``: each way a run can end reaches ``on_done`` exactly once.

Real threads, real processes, a real event loop; no node. The worker relies on the
single call: a second one would commit a second finish for the same run.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from typing import Any

import pytest

from raftsched.core.model import JobSpec
from raftsched.node.worker.callpool import CallPool
from raftsched.node.worker.executor import Execution
from raftsched.node.worker.runtypes import ExecutionResult, RunContext
from tests.support.harness import await_until

pytestmark = pytest.mark.timeout(30)

PREFIX = ("tests.inprocess.test_executor",)
RELEASE = threading.Event()


def returns(ctx: RunContext) -> str:
    return f"hello {ctx.run_id}"


def raises(ctx: RunContext) -> None:
    raise ValueError("bad input 42")


def blocks(ctx: RunContext) -> str:
    RELEASE.wait(10)
    return "released"


async def coroutine(ctx: RunContext) -> str:
    await asyncio.sleep(0.01)
    return f"async {ctx.attempt}"


def _spec(**kw: Any) -> JobSpec:
    return JobSpec.from_spec({"id": "x", "schedule": {"every": "1s"}, **kw},
                             allowed_call_prefixes=PREFIX)


def _execution(spec: JobSpec) -> Execution:
    ctx = RunContext(job_id="x", run_id="x@1000", scheduled_ms=1000, fence=7, attempt=2,
                     node_id="n1")
    return Execution(spec=spec, ctx=ctx, base_env={}, tail_bytes=64, allowed=PREFIX,
                     kill_grace_s=0.5)


def _run(spec: JobSpec, *, stop_after_s: float | None = None, linger_s: float = 0.2
         ) -> tuple[list[ExecutionResult], float]:
    """Start one execution; collect every on_done call until ``linger_s`` after the first
    (``RELEASE`` is set then, so a blocked callable returns while the loop still runs)."""
    async def main() -> tuple[list[ExecutionResult], float]:
        results: list[ExecutionResult] = []
        done = asyncio.Event()
        ex = _execution(spec)
        t0 = time.monotonic()

        def on_done(result: ExecutionResult) -> None:
            results.append(result)
            done.set()

        ex.start(on_done)
        if stop_after_s is not None:
            await asyncio.sleep(stop_after_s)
            ex.stop(0.5, "self-fenced: test")
        await asyncio.wait_for(done.wait(), 15)
        elapsed = time.monotonic() - t0
        RELEASE.set()
        await asyncio.sleep(linger_s)  # a late thread return must not call again
        return results, elapsed

    return asyncio.run(main())


def test_a_sync_callable_succeeds_with_its_return_value_as_tail():
    results, _ = _run(_spec(call="tests.inprocess.test_executor:returns"))
    assert [(r.outcome, r.tail, r.reason) for r in results] == \
        [("succeeded", "hello x@1000", "returned")]


def test_a_raising_callable_fails_naming_the_exception():
    results, _ = _run(_spec(call="tests.inprocess.test_executor:raises"))
    assert len(results) == 1 and results[0].outcome == "failed"
    assert results[0].reason == "raised ValueError" and "bad input 42" in results[0].tail


def test_a_callable_past_its_timeout_is_timed_out_once_even_when_it_returns_later():
    RELEASE.clear()
    try:
        results, elapsed = _run(_spec(call="tests.inprocess.test_executor:blocks",
                                      timeout="1s"), linger_s=0.3)
    finally:
        RELEASE.set()
    assert [(r.outcome, r.reason) for r in results] == [("timed_out", "timeout 1s")]
    # (The callable blocks until the test ends: the upper bound only needs to be far
    # below forever; 8 s leaves a loaded machine room.)
    assert 0.9 <= elapsed < 8, f"timed out after {elapsed:.2f}s"


def test_stopping_a_running_callable_ends_it_lost_once():
    RELEASE.clear()
    try:
        results, _ = _run(_spec(call="tests.inprocess.test_executor:blocks"),
                          stop_after_s=0.2, linger_s=0.3)
    finally:
        RELEASE.set()
    assert [(r.outcome, r.reason) for r in results] == [("lost", "self-fenced: test")]


def test_an_async_callable_runs_on_the_loop():
    results, _ = _run(_spec(call="tests.inprocess.test_executor:coroutine"))
    assert [(r.outcome, r.tail) for r in results] == [("succeeded", "async 2")]


def test_a_call_outside_the_allowed_prefixes_fails_without_running():
    spec = JobSpec.from_spec({"id": "x", "schedule": {"every": "1s"}, "call": "os:getpid"},
                             allowed_call_prefixes=None)
    results, _ = _run(spec)
    assert len(results) == 1 and results[0].outcome == "failed"
    assert results[0].reason == "raised PermissionError"


def test_an_argv_run_reports_its_exit_code_and_output_tail():
    results, _ = _run(_spec(command=[sys.executable, "-c",
                                     "print('out', flush=True); raise SystemExit(3)"]))
    assert [(r.outcome, r.exit_code, r.reason) for r in results] == [("failed", 3, "exit 3")]
    assert results[0].tail.strip() == "out"


def test_an_async_callable_raising_system_exit_fails_and_the_loop_survives():
    results, _ = _run(_spec(call="tests.inprocess.test_executor:exits"))
    assert [(r.outcome, r.reason) for r in results] == [("failed", "raised SystemExit")]


async def exits(ctx: RunContext) -> None:
    raise SystemExit(3)


def test_a_call_that_waited_for_a_thread_is_skipped_once_its_run_has_ended():
    """All threads busy: a run that ends (stop, timeout) while its call waits in the
    queue must never be called afterwards — its retry may be running elsewhere."""
    pool = CallPool(1, name="t-pool")
    gate = threading.Event()
    called: list[str] = []

    async def main() -> list[tuple[Any, Any]]:
        loop = asyncio.get_running_loop()
        got: list[tuple[Any, Any]] = []
        ended = {"b": False}
        pool.submit(loop, lambda a: (gate.wait(10), called.append(a))[1], "a",
                    lambda v, e: got.append(("a", e)))
        pool.submit(loop, called.append, "b", lambda v, e: got.append(("b", e)),
                    skip=lambda: ended["b"])
        pool.submit(loop, called.append, "c", lambda v, e: got.append(("c", e)))
        ended["b"] = True  # b's run ended while a held the only thread
        gate.set()
        await await_until(lambda: len(got) >= 2, 5, "a's and c's results")
        await asyncio.sleep(0.1)  # b's result, if any, would have come by now
        return got

    got = asyncio.run(main())
    assert called == ["a", "c"], called
    assert [name for name, _ in got] == ["a", "c"]


def test_the_pool_starts_a_thread_when_every_thread_is_busy():
    pool = CallPool(4, name="t-pool2")
    gate = threading.Event()

    async def main() -> float:
        loop = asyncio.get_running_loop()
        done = asyncio.Event()
        for _ in range(3):
            pool.submit(loop, lambda a: gate.wait(10), None, lambda v, e: None)
        t0 = time.monotonic()
        pool.submit(loop, lambda a: None, None, lambda v, e: done.set())
        await asyncio.wait_for(done.wait(), 5)
        gate.set()
        return time.monotonic() - t0

    # Behind the busy threads it would wait for the gate (set only after): the 5 s
    # wait_for would fail. Under 4 s is "at once" with room for a loaded machine.
    assert asyncio.run(main()) < 4.0, "a call waited behind busy threads"


def test_blocking_calls_fan_out_to_every_thread_up_to_the_bound():
    pool = CallPool(8, name="t-pool3")
    gate = threading.Event()
    entered: list[int] = []

    def hold(i: int) -> int:
        entered.append(i)
        gate.wait(10)
        return i

    async def main() -> tuple[int, list[int]]:
        loop = asyncio.get_running_loop()
        got: list[int] = []
        for i in range(12):
            pool.submit(loop, hold, i, lambda v, e: got.append(v))
        await await_until(lambda: len(entered) >= 8, 5, "8 calls running at once")
        await asyncio.sleep(0.1)  # a ninth thread would have entered by now
        running = len(entered)
        gate.set()
        await await_until(lambda: len(got) == 12, 5, "all 12 results")
        return running, got

    running, got = asyncio.run(main())
    assert running == 8, f"{running} calls ran at once, want the bound of 8"
    assert sorted(got) == list(range(12))


def test_a_result_reaches_the_loop_while_other_calls_still_wait_for_a_thread():
    pool = CallPool(1, name="t-pool4")
    gate = threading.Event()

    async def main() -> float:
        loop = asyncio.get_running_loop()
        first = asyncio.Event()
        t0 = time.monotonic()
        pool.submit(loop, lambda a: a, "quick", lambda v, e: first.set())
        pool.submit(loop, lambda a: gate.wait(10), None, lambda v, e: None)
        pool.submit(loop, lambda a: None, None, lambda v, e: None)  # queued behind it
        try:
            await asyncio.wait_for(first.wait(), 8)
        finally:
            gate.set()
        return time.monotonic() - t0

    took = asyncio.run(main())
    # Behind the queued calls it would wait for the gate (set only after the 8 s
    # wait_for): under 5 s is "not behind them", with room for a loaded machine.
    assert took < 5.0, f"the quick call's result waited {took:.2f}s behind queued calls"


def test_a_thread_that_cannot_start_drops_the_call_only_when_no_thread_exists(monkeypatch):
    pool = CallPool(2, name="t-pool5")
    real_start = threading.Thread.start
    gate = threading.Event()
    fail = {"on": True}

    def start(self: threading.Thread) -> None:
        if fail["on"] and self.name.startswith("t-pool5"):
            raise RuntimeError("can't start new thread")
        real_start(self)

    monkeypatch.setattr(threading.Thread, "start", start)

    async def main() -> list[str]:
        loop = asyncio.get_running_loop()
        got: list[str] = []
        # No thread at all: the submitter learns at once and nothing stays queued.
        with pytest.raises(RuntimeError):
            pool.submit(loop, lambda a: a, "lost", lambda v, e: got.append(v))
        assert pool.queued() == 0
        # One thread (busy); a second cannot start: the call waits for the first.
        fail["on"] = False
        pool.submit(loop, lambda a: (gate.wait(10), a)[1], "first", lambda v, e: got.append(v))
        fail["on"] = True
        pool.submit(loop, lambda a: a, "second", lambda v, e: got.append(v))
        gate.set()
        await await_until(lambda: len(got) >= 2, 5, "both results")
        return got

    assert asyncio.run(main()) == ["first", "second"]
    assert (pool._threads, pool._waking) == (1, 0)


def test_a_command_that_cannot_be_found_names_the_program():
    results, _ = _run(_spec(command=["no-such-program-rs29", "arg"]))
    assert len(results) == 1 and results[0].outcome == "failed"
    reason = results[0].reason
    assert reason.startswith("cannot execute 'no-such-program-rs29': No such file or directory"
                             " (not found on PATH="), reason
    # A path is not looked up on PATH: the reason says only what the system said.
    results, _ = _run(_spec(command=["/nonexistent/rs29"]))
    assert results[0].reason == \
        "cannot execute '/nonexistent/rs29': No such file or directory", results


def test_an_output_tail_cut_inside_a_line_is_marked():
    script = "print('start of the run'); print('e' * 200 + ' the error'); print('bye')"
    results, _ = _run(_spec(command=[sys.executable, "-c", script]))
    [result] = results
    assert result.outcome == "succeeded"
    assert result.tail.startswith("[earlier output not kept]\n...eee"), result.tail
    assert result.tail.endswith("eee the error\nbye\n") and len(result.tail) <= 64
