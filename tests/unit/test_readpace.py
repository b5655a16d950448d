"""Reads on a busy leader wait their turn (raftsched.node.replica.readpace), on a fake clock."""

from __future__ import annotations

import pytest

from raftsched.node.replica.readpace import MAX_WAIT_S, ReadPacer

pytestmark = pytest.mark.timeout(10)


def test_a_leader_with_room_serves_every_read_at_once() -> None:
    p = ReadPacer(0.0, rate=1000, burst=100)
    assert all(p.delay_s(500, t * 0.001, busy=False) == 0.0 for t in range(100))
    assert p.statistics().paced == 0


def test_a_busy_leader_serves_its_rate_of_views_and_queues_the_rest() -> None:
    p = ReadPacer(0.0, rate=1000, burst=100)
    assert p.delay_s(100, 0.0, busy=True) == 0.0  # the burst
    # Four more reads of 100 views at the same instant: 0.1 s, 0.2 s, ... behind.
    waits = [p.delay_s(100, 0.0, busy=True) for _ in range(4)]
    assert waits == pytest.approx([0.1, 0.2, 0.3, 0.4])
    # Time refills the bucket: a second later the queue is gone and a read waits 0.
    assert p.delay_s(100, 1.5, busy=True) == 0.0
    assert p.statistics().paced == 4


def test_no_read_waits_longer_than_the_bound_and_a_flood_owes_no_more() -> None:
    p = ReadPacer(0.0, rate=1000, burst=100)
    waits = [p.delay_s(10_000, 0.0, busy=True) for _ in range(20)]
    assert max(waits) == MAX_WAIT_S
    # Once the flood is over and the bucket has had MAX_WAIT_S to refill, reads flow.
    assert p.delay_s(10, MAX_WAIT_S + 0.2, busy=True) == 0.0


def test_room_again_ends_the_queue_at_once() -> None:
    p = ReadPacer(0.0, rate=1000, burst=100)
    for _ in range(10):
        p.delay_s(100, 0.0, busy=True)
    assert p.delay_s(100, 0.01, busy=False) == 0.0
    assert p.delay_s(100, 0.02, busy=True) == 0.0  # a full burst again
