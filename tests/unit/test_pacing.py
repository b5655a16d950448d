"""An idle Raft thread's pacing (raftsched.node.replica.pacing): a follower's poll waits
for its leader's appends instead of racing them, and a follower repeats an answer that
acknowledges nothing new only every few periods. Neither may delay what Raft decides:
the election deadline, or an answer that moves the leader's match index."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raftsched.node.replica.pacing import (
    ANSWER_EVERY_PERIODS,
    FOLLOWER_WAIT_PERIODS,
    IDLE_APPEND_PERIODS,
    AnswerPacer,
    answer_every,
    answered_within,
    beyond_period,
    follower_wait,
    leader_wait,
    next_append_in,
)

_left = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False) | st.just(float("inf"))


@given(left=_left, period=st.floats(min_value=1e-4, max_value=10.0))
def test_a_threads_wait_never_spins_never_overshoots_its_deadline_and_is_not_a_stall(
        left: float, period: float) -> None:
    for wait, longest in ((follower_wait(left, period), FOLLOWER_WAIT_PERIODS),
                          (leader_wait(left, period), IDLE_APPEND_PERIODS)):
        assert wait >= period  # a deadline long past, nobody to campaign with: no busy loop
        assert wait <= max(left, 0.0) + period  # read no later than before
        assert wait <= longest * period
        # The stall window is given the gap less what was chosen beyond a period: an
        # idle thread's cadence stays under its floor (two periods).
        assert wait - beyond_period(wait, period) == pytest.approx(period)


def test_a_follower_with_time_left_sleeps_until_its_leaders_next_append_can_come() -> None:
    assert follower_wait(0.5, 0.05) == pytest.approx(FOLLOWER_WAIT_PERIODS * 0.05)
    # Past a calm leader's idle appends (two periods), so they alone wake it.
    assert FOLLOWER_WAIT_PERIODS > IDLE_APPEND_PERIODS
    assert follower_wait(0.06, 0.05) == 0.06  # wakes at the deadline itself
    assert follower_wait(0.01, 0.05) == 0.05  # as before: one period
    assert follower_wait(float("inf"), 0.05) == pytest.approx(FOLLOWER_WAIT_PERIODS * 0.05)


def test_only_a_calm_caught_up_leader_spaces_its_empty_appends() -> None:
    assert next_append_in(0.05, caught_up=True, calm=True) == IDLE_APPEND_PERIODS * 0.05
    assert next_append_in(0.05, caught_up=False, calm=True) == 0.05
    assert next_append_in(0.05, caught_up=True, calm=False) == 0.05
    assert leader_wait(0.1, 0.05) == 0.1  # its appends are due in two periods: one wakeup
    assert leader_wait(0.0, 0.05) == 0.05  # as before


def _ok(index: int) -> dict[str, object]:
    return {"type": "next_node_idx", "next_node_idx": index, "success": True, "reset": False}


def test_an_answer_acknowledging_nothing_new_is_repeated_only_every_few_periods() -> None:
    p = AnswerPacer(0.2)
    assert p.due("L", _ok(10), 3, 0.00)
    sent = [t for t in (0.05, 0.10, 0.15, 0.21, 0.25, 0.30, 0.45) if p.due("L", _ok(10), 3, t)]
    assert sent == [0.21, 0.45]


def test_every_answer_that_moves_the_leader_or_is_not_a_plain_success_goes_out() -> None:
    p = AnswerPacer(10.0)
    assert p.due("L", _ok(10), 3, 0.0)
    assert p.due("L", _ok(11), 3, 0.01)  # a new index: the match index moves
    assert p.due("L", _ok(11), 4, 0.02)  # a new term: a new leader knows nothing yet
    assert p.due("M", _ok(11), 4, 0.03)  # another peer
    assert p.due("L", dict(_ok(11), success=False), 4, 0.04)  # a refusal
    assert p.due("L", dict(_ok(11), reset=True), 4, 0.05)  # a leader told to back up
    assert p.due("L", {"type": "next_node_idx", "success": True}, 4, 0.06)  # malformed
    assert not p.due("L", _ok(11), 4, 0.07)  # only now: the same answer again, soon


def test_a_leader_hears_from_its_followers_several_times_per_fallback_whatever_the_timing(
        ) -> None:
    assert answer_every(0.05, 1.5, connection_s=1.5) == ANSWER_EVERY_PERIODS * 0.05
    assert answer_every(0.5, 1.0, connection_s=1.5) == 0.25  # a short fallback
    # A short connection timeout: pysyncobj would drop a connection it read nothing on.
    assert answer_every(0.05, 1.5, connection_s=0.3) == pytest.approx(0.1)
    # An answer leaves with an append: up to IDLE_APPEND_PERIODS periods after it is due.
    assert answered_within(0.05, 1.5, connection_s=1.5) == pytest.approx(
        (ANSWER_EVERY_PERIODS + IDLE_APPEND_PERIODS) * 0.05)


def test_appends_are_spaced_only_where_the_timing_leaves_room() -> None:
    from raftsched.node.replica.pacing import may_space

    assert may_space(0.05, 0.2, 1.5)  # the defaults: two spaced appends per 200 ms
    assert not may_space(0.06, 0.2, 1.5)  # an append period near election_min / 3
    assert not may_space(0.05, 0.2, 0.3)  # a fallback of under four spaced rounds


def test_a_dropped_connection_lets_the_next_answer_out() -> None:
    p = AnswerPacer(10.0)
    assert p.due("L", _ok(10), 3, 0.0)
    assert not p.due("L", _ok(10), 3, 0.1)
    p.forget("L")  # the one answer it had may have been lost with the connection
    assert p.due("L", _ok(10), 3, 0.2)
