"""The finish hold after a big instant (worker.QUIET_*) is bounded whatever happens:
calls that never get a thread, or a wall clock stepped back or forward."""

from __future__ import annotations

import asyncio
import time

import pytest

from raftsched import worker
from raftsched.clock import now_ms

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]


def _pool() -> worker.WorkerPool:
    return worker.WorkerPool(node_id="n1", raft=None, slots=4,  # type: ignore[arg-type]
                             output_tail_bytes=1024, allowed_call_prefixes=(), base_env={})


def _held(pool: worker.WorkerPool) -> float:
    async def main() -> float:
        t0 = time.monotonic()
        await pool._quiet()
        return time.monotonic() - t0
    return asyncio.run(main())


def test_finishes_are_held_while_calls_queue_but_never_past_the_cap(monkeypatch):
    monkeypatch.setattr(worker, "calls_waiting", lambda: 7)  # a thread never comes
    pool = _pool()
    pool._quiet_at = now_ms()
    held = _held(pool)
    assert worker.QUIET_MAX_MS / 1000 - 0.05 <= held <= worker.QUIET_MAX_MS / 1000 + 0.2, held


def test_finishes_are_held_quiet_ms_after_the_instant_when_nothing_queues(monkeypatch):
    monkeypatch.setattr(worker, "calls_waiting", lambda: 0)
    pool = _pool()
    pool._quiet_at = now_ms()
    held = _held(pool)
    assert worker.QUIET_MS / 1000 - 0.01 <= held <= worker.QUIET_MS / 1000 + 0.1, held


@pytest.mark.parametrize("step_ms", [-3_600_000, 3_600_000])
def test_a_stepped_wall_clock_does_not_hold_finishes(monkeypatch, step_ms):
    monkeypatch.setattr(worker, "calls_waiting", lambda: 7)
    pool = _pool()
    pool._quiet_at = now_ms() - step_ms  # the clock moved by step_ms since the instant
    assert _held(pool) < 0.05


def test_no_hold_without_a_big_instant(monkeypatch):
    monkeypatch.setattr(worker, "calls_waiting", lambda: 7)
    assert _held(_pool()) < 0.05
