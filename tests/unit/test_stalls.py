"""raftsched.node.replica.stalls: the window's longest gap against a brute force, and what a
follower makes of a leader's report (the wire value is untrusted)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raftsched.node.replica import stalls

gaps = st.lists(st.tuples(st.floats(0.0, 5.0), st.floats(0.0, 3.0)), max_size=60)


@given(gaps)
def test_longest_is_the_longest_unexpired_gap_over_the_floor(steps) -> None:
    w = stalls.StallWindow(floor_s=0.1, window_s=10.0)
    now, seen = 0.0, []
    for advance, gap in steps:
        now += advance
        w.note(now, gap)
        seen.append((now, gap))
        want = max((g for t, g in seen if g > 0.1 and t >= now - 10.0), default=0.0)
        assert w.longest(now) == want


def test_an_idle_thread_keeps_nothing_and_a_stall_expires() -> None:
    w = stalls.StallWindow(floor_s=0.1, window_s=30.0)
    for i in range(100):
        w.note(i * 0.05, 0.05)
    assert w.longest(5.0) == 0.0
    w.note(6.0, 0.7)
    assert w.longest(35.9) == 0.7
    assert w.longest(36.1) == 0.0


def test_a_report_that_is_not_a_finite_positive_number_counts_as_none() -> None:
    for bad in (None, "0.5", True, -1.0, math.nan, math.inf, [0.5], {"s": 1}):
        assert stalls.reported(bad) == 0.0
    assert stalls.reported(0.25) == 0.25
    assert stalls.reported(1) == 1.0


def test_the_tolerated_silence_is_a_multiple_of_the_stall_under_a_cap() -> None:
    assert stalls.tolerated_silence(0.0, factor=3.0, cap_s=1.5) == 0.0
    assert stalls.tolerated_silence(0.2, factor=3.0, cap_s=1.5) == pytest.approx(0.6)
    assert stalls.tolerated_silence(0.9, factor=3.0, cap_s=1.5) == 1.5
    assert stalls.tolerated_silence(0.2, factor=0.0, cap_s=1.5) == 0.0
