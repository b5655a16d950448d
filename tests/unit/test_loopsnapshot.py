"""Issue 13 item 4: the metrics thread no longer iterates the worker pool's dict while
the event loop mutates it; the statistics are built on the loop and handed over."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest

from raftsched.node.observe.loopsnapshot import LoopSnapshot

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    loop.close()


def test_the_snapshot_is_built_on_the_loop_while_the_loop_mutates_the_state(loop):
    state: dict[int, int] = {}
    built_on: set[int] = set()
    stop = threading.Event()

    def churn(i: int = 0) -> None:  # the loop adds and removes entries all the time
        state[i] = i
        state.pop(i - 50, None)
        if not stop.is_set():
            loop.call_soon(churn, i + 1)

    def compute() -> tuple[int, int]:
        built_on.add(threading.get_ident())
        return len(state), sum(v for v in state.values())

    snap = LoopSnapshot(compute, lambda: loop)
    built_on.clear()  # the first one is built at construction, before the loop matters
    loop.call_soon_threadsafe(churn)
    try:
        values = [snap.get() for _ in range(300)]
    finally:
        stop.set()
    assert built_on == {loop._thread_id}  # type: ignore[attr-defined]
    assert all(n <= 50 for n, _ in values)


def test_a_busy_loop_gets_the_previous_snapshot_not_a_hang(loop):
    counter = [0]

    def compute() -> int:
        counter[0] += 1
        return counter[0]

    snap = LoopSnapshot(compute, lambda: loop, wait_s=0.2)
    assert snap.get() == 2  # built on the loop
    release = threading.Event()
    blocked = threading.Event()

    def block() -> None:
        blocked.set()
        release.wait(30)

    loop.call_soon_threadsafe(block)
    assert blocked.wait(30)
    try:
        assert snap.get() == 2  # the loop is stuck: the previous one
    finally:
        release.set()
    # The request cancelled while the loop was stuck never runs later.
    assert asyncio.run_coroutine_threadsafe(asyncio.sleep(0), loop).result(30) is None
    assert counter[0] == 2
    assert snap.get() == 3


def test_without_a_running_loop_the_caller_builds_it():
    snap = LoopSnapshot(lambda: threading.get_ident(), lambda: None)
    assert snap.get() == threading.get_ident()
    closed = asyncio.new_event_loop()
    closed.close()
    snap = LoopSnapshot(lambda: threading.get_ident(), lambda: closed)
    assert snap.get() == threading.get_ident()
