"""Admission control on a fake clock: the leader's rate of new runs grows while the
cluster keeps up and falls when it does not (raftsched/node/leader/admission.py)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftsched.node.leader import admission
from raftsched.node.leader.admission import Admission
from tests.support.budget import examples

P = admission.PERIOD_S


def test_a_new_leader_grants_a_bucket_of_its_start_rate_then_waits_for_tokens() -> None:
    a = Admission(0.0, start_rate=100.0)
    assert a.grant(64, 0.0) == 64
    assert a.grant(64, 0.0) == 36  # the bucket holds BURST_S seconds of the rate
    assert a.grant(64, 0.0) == 0
    assert a.wait_s(0.0) == pytest.approx(1 / 100)
    assert a.grant(64, 0.1) == 10  # 0.1 s of 100 runs/s
    assert a.statistics().held == 1 and a.statistics().granted == 110


def test_unused_tokens_come_back() -> None:
    a = Admission(0.0, start_rate=100.0)
    got = a.grant(64, 0.0)
    a.refund(got - 5)
    assert a.statistics().tokens == pytest.approx(95)
    assert a.statistics().granted == 5


def test_while_the_rate_holds_planning_back_and_nothing_is_congested_it_grows() -> None:
    a = Admission(0.0, start_rate=100.0)
    a.grant(1000, 0.0)  # limited in the first period
    a.grant(1, P)  # the period ends: slow start
    assert a.rate == pytest.approx(100 * admission.SLOW_START)
    a.grant(1, 2 * P)  # not limited in the second period: no growth
    assert a.rate == pytest.approx(100 * admission.SLOW_START)


@pytest.mark.parametrize("signal,cause", [
    ({"commit_s": admission.COMMIT_HIGH_S + 0.1}, "commit"),
    ({"follower_lag": admission.FOLLOWER_LAG_HIGH + 1}, "follower_lag"),
    ({"queue": admission.QUEUE_HIGH + 1}, "queue"),
    ({"tick_gap_s": admission.TICK_GAP_HIGH_S + 0.01}, "tick_gap"),
    ({"heartbeat_late_s": admission.HEARTBEAT_LATE_HIGH_S + 0.01}, "heartbeat"),
])
def test_a_congested_period_cuts_the_rate_once_and_names_its_cause(
        signal: dict[str, float], cause: str) -> None:
    a = Admission(0.0, start_rate=1000.0)
    a.grant(5000, 0.0)
    a.observe(**signal)  # type: ignore[arg-type]
    a.observe(**signal)  # twice in one period: still one cut
    a.grant(1, P)
    assert a.rate == pytest.approx(1000 * admission.DECREASE)
    s = a.statistics()
    assert (s.congested, s.cause) == (1, cause)
    assert s.tokens <= a.rate * admission.BURST_S
    # After a congestion the growth is additive-like, not slow start.
    a.grant(5000, P)
    a.grant(1, 2 * P)
    assert a.rate == pytest.approx(1000 * admission.DECREASE * (1 + admission.INCREASE))


def test_signals_under_their_bounds_do_not_cut() -> None:
    a = Admission(0.0, start_rate=1000.0)
    a.observe(commit_s=admission.COMMIT_HIGH_S / 2, follower_lag=10, queue=10)
    a.grant(1, P)
    assert a.rate == 1000.0 and a.statistics().congested == 0
    assert a.statistics().commit_max_ms == pytest.approx(admission.COMMIT_HIGH_S / 2 * 1000)


def test_the_rate_stays_within_its_bounds() -> None:
    a = Admission(0.0, start_rate=admission.MIN_RATE)
    for k in range(1, 20):
        a.observe(commit_s=10.0)
        a.grant(1, k * P)
    assert a.rate == admission.MIN_RATE
    b = Admission(0.0, start_rate=admission.MAX_RATE)
    for k in range(1, 20):
        b.grant(10**9, k * P)
    assert b.rate == admission.MAX_RATE


def test_a_long_pause_is_not_replayed_period_by_period() -> None:
    a = Admission(0.0, start_rate=100.0)
    a.grant(1000, 0.0)
    a.grant(1, 3600.0)  # an hour later (a SIGSTOP, a frozen VM): one decision
    assert a.rate == pytest.approx(100 * admission.SLOW_START)
    assert a.grant(10**6, 3600.0) <= int(a.rate * admission.BURST_S)


@settings(max_examples=examples(200), deadline=None)
@given(steps=st.lists(st.tuples(st.floats(0, 0.6), st.integers(0, 500),
                                st.floats(0, 2.0)), min_size=1, max_size=60))
def test_what_is_granted_never_exceeds_the_bucket_plus_the_rate_over_time(
        steps: list[tuple[float, int, float]]) -> None:
    """Over any run of requests, runs granted <= the first bucket plus the integral of
    the rate (the rate only changes at period ends, so bound it by its maximum)."""
    a = Admission(0.0, start_rate=200.0)
    now, granted, top = 0.0, 0, a.rate
    for dt, want, commit in steps:
        now += dt
        a.observe(commit_s=commit)
        granted += a.grant(want, now)
        top = max(top, a.rate)
        assert a.tokens >= 0
    assert granted <= 200.0 * admission.BURST_S + top * now + 1
