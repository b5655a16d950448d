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

from raftsched.executor import Execution, ExecutionResult, RunContext
from raftsched.model import JobSpec

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]

PREFIX = ("tests.integration.test_executor",)
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
    """Start one execution; collect every on_done call until ``linger_s`` after the first."""
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
        await asyncio.sleep(linger_s)  # a late thread return must not call again
        return results, elapsed

    return asyncio.run(main())


def test_a_sync_callable_succeeds_with_its_return_value_as_tail():
    results, _ = _run(_spec(call="tests.integration.test_executor:returns"))
    assert [(r.outcome, r.tail, r.reason) for r in results] == \
        [("succeeded", "hello x@1000", "returned")]


def test_a_raising_callable_fails_naming_the_exception():
    results, _ = _run(_spec(call="tests.integration.test_executor:raises"))
    assert len(results) == 1 and results[0].outcome == "failed"
    assert results[0].reason == "raised ValueError" and "bad input 42" in results[0].tail


def test_a_callable_past_its_timeout_is_timed_out_once_even_when_it_returns_later():
    RELEASE.clear()
    try:
        results, elapsed = _run(_spec(call="tests.integration.test_executor:blocks",
                                      timeout="1s"), linger_s=0.0)
        RELEASE.set()
        time.sleep(0.2)
    finally:
        RELEASE.set()
    assert [(r.outcome, r.reason) for r in results] == [("timed_out", "timeout 1s")]
    assert 0.9 <= elapsed < 3, f"timed out after {elapsed:.2f}s"


def test_stopping_a_running_callable_ends_it_lost_once():
    RELEASE.clear()
    try:
        results, _ = _run(_spec(call="tests.integration.test_executor:blocks"),
                          stop_after_s=0.2, linger_s=0.0)
    finally:
        RELEASE.set()
    time.sleep(0.2)
    assert [(r.outcome, r.reason) for r in results] == [("lost", "self-fenced: test")]


def test_an_async_callable_runs_on_the_loop():
    results, _ = _run(_spec(call="tests.integration.test_executor:coroutine"))
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
