"""The finish hold after a big instant (worker.QUIET_*) is bounded whatever happens:
calls that never get a thread, or a wall clock stepped back or forward."""

from __future__ import annotations

import asyncio

import pytest

from raftsched import worker
from raftsched.clock import now_ms

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]


def _pool() -> worker.WorkerPool:
    return worker.WorkerPool(node_id="n1", raft=None, slots=4,  # type: ignore[arg-type]
                             output_tail_bytes=1024, allowed_call_prefixes=(), base_env={})


def _held(pool: worker.WorkerPool, instant_ago_ms: int | None = 0) -> float:
    """Seconds from the instant (``instant_ago_ms`` before the call; None: no instant)
    until ``_quiet`` lets the finishes go."""
    async def main() -> float:
        start = now_ms()
        if instant_ago_ms is not None:
            pool._quiet_at = start - instant_ago_ms
        await pool._quiet()
        return (now_ms() - start + (instant_ago_ms or 0)) / 1000
    return asyncio.run(main())


def test_finishes_are_held_while_calls_queue_but_never_past_the_cap(monkeypatch):
    monkeypatch.setattr(worker, "calls_waiting", lambda: 7)  # a thread never comes
    held = _held(_pool())
    assert worker.QUIET_MAX_MS / 1000 - 0.01 <= held <= worker.QUIET_MAX_MS / 1000 + 0.2, held


def test_finishes_are_held_quiet_ms_after_the_instant_when_nothing_queues(monkeypatch):
    monkeypatch.setattr(worker, "calls_waiting", lambda: 0)
    held = _held(_pool())
    assert worker.QUIET_MS / 1000 - 0.01 <= held <= worker.QUIET_MS / 1000 + 0.1, held


@pytest.mark.parametrize("step_ms", [-3_600_000, 3_600_000])
def test_a_stepped_wall_clock_does_not_hold_finishes(monkeypatch, step_ms):
    monkeypatch.setattr(worker, "calls_waiting", lambda: 7)
    # The wall clock moved by step_ms since the instant: no hold at all.
    assert _held(_pool(), instant_ago_ms=step_ms) - step_ms / 1000 < 0.05


def test_no_hold_without_a_big_instant(monkeypatch):
    monkeypatch.setattr(worker, "calls_waiting", lambda: 7)
    assert _held(_pool(), instant_ago_ms=None) < 0.05
