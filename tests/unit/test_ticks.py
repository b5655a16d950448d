"""Coalesced idle timers (core/ticks.py): they end on a shared grid, never much sooner
than asked and less than a grid step later, so that timers started at different
moments wake the event loop together."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raftsched.core.ticks import EARLY_S, GRID_S, coalesced

pytestmark = pytest.mark.timeout(60)

times = st.floats(min_value=0.0, max_value=1e7, allow_nan=False, allow_infinity=False)
delays = st.floats(min_value=GRID_S, max_value=60.0, allow_nan=False, allow_infinity=False)


def _on_grid(t: float) -> bool:
    return abs(t / GRID_S - round(t / GRID_S)) < 1e-6


@given(now=times, delay=delays)
def test_a_coalesced_sleep_ends_on_the_grid_within_its_bounds(now: float, delay: float) -> None:
    got = coalesced(now, delay)
    # Never more than EARLY_S sooner, always less than a step later.
    assert delay - EARLY_S - 1e-6 <= got < delay + GRID_S + 1e-6
    assert _on_grid(now + got)


@given(a=times, b=st.floats(min_value=0.0, max_value=0.9 * GRID_S), delay=delays)
def test_timers_started_apart_wake_together(a: float, b: float, delay: float) -> None:
    """Two loops that began sleeps of one length up to 0.9 of a step apart wake at one
    point of the grid, or at neighbouring ones: never in between."""
    first = a + coalesced(a, delay)
    second = a + b + coalesced(a + b, delay)
    gap = second - first
    assert math.isclose(gap, 0.0, abs_tol=1e-6) or math.isclose(gap, GRID_S, abs_tol=1e-6)


def test_timers_started_at_four_moments_of_a_second_wake_once() -> None:
    """The worker's poll, the pause watcher, the secret poll and the leader's quiet
    look, begun at different moments of one second, all end on the same second."""
    ends = {round(t + coalesced(t, 1.0), 6) for t in (100.15, 100.3, 100.55, 100.85)}
    assert ends == {102.0}


def test_a_loop_that_sleeps_again_just_after_a_grid_point_keeps_its_period() -> None:
    """Woken on the grid and some milliseconds of work later asleep again for a second:
    the next wakeup is a second after the last, not two."""
    now = 1000.0
    for _ in range(20):
        woke = now + 0.004 + coalesced(now + 0.004, 1.0)
        assert math.isclose(woke - now, 1.0, abs_tol=1e-6)
        now = woke


@given(now=times, delay=st.floats(min_value=-5.0, max_value=GRID_S, exclude_max=True,
                                  allow_nan=False))
def test_a_sleep_shorter_than_a_step_is_not_moved(now: float, delay: float) -> None:
    assert coalesced(now, delay) == max(delay, 0.0)
