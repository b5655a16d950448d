"""Coalesced idle timers (core/ticks.py): they end on a shared grid, never much sooner
than asked and less than a grid step later, so that timers started at different
moments wake the event loop together."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raftsched.core.ticks import EARLY, GRID_S, coalesced

pytestmark = pytest.mark.timeout(60)

times = st.floats(min_value=0.0, max_value=1e7, allow_nan=False, allow_infinity=False)
delays = st.floats(min_value=1e-3, max_value=60.0, allow_nan=False, allow_infinity=False)


@given(now=times, delay=delays)
def test_a_coalesced_sleep_ends_on_the_grid_within_its_bounds(now: float, delay: float) -> None:
    got = coalesced(now, delay)
    assert got >= 0.0
    # Never more than EARLY of a step sooner, always less than a step later.
    assert got >= delay - EARLY * GRID_S - 1e-6
    assert got < delay + GRID_S + 1e-6
    end = (now + got) / GRID_S
    assert abs(end - round(end)) < 1e-6 or got == 0.0


@given(a=times, b=st.floats(min_value=0.0, max_value=0.2), delay=delays)
def test_timers_started_apart_within_a_step_wake_together(a: float, b: float,
                                                          delay: float) -> None:
    """Two loops that began their sleeps of the same length b seconds apart (less than
    a grid step, minus the early margin) wake at one point of the grid, or at
    neighbouring points."""
    first = a + coalesced(a, delay)
    second = a + b + coalesced(a + b, delay)
    assert 0.0 <= second - first <= GRID_S + 1e-6


def test_a_loop_that_sleeps_again_just_after_a_grid_point_keeps_its_period() -> None:
    """Woken on the grid and some milliseconds of work later asleep again for half a
    second: the next wakeup is half a second after the last, not a step later."""
    now = 1000.0
    for _ in range(20):
        woke = now + coalesced(now + 0.004, 0.5) + 0.004
        assert math.isclose(woke - now, 0.5, abs_tol=1e-6)
        now = woke


def test_nothing_to_wait_for_is_not_lengthened() -> None:
    assert coalesced(123.4, 0.0) == 0.0
    assert coalesced(123.4, -1.0) == 0.0
