"""Tests for raftsched.core.misses: classify (per misfire policy, grace boundary, long
outages, DST), overlap_decision and late_reason."""

from __future__ import annotations

import time
from datetime import datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftsched.core.misses import (
    MAX_DUE_PER_JOB,
    MissRange,
    OverlapDecision,
    classify,
    late_reason,
    overlap_decision,
)
from raftsched.core.model import MisfirePolicy, MisfireSpec, Overlap
from raftsched.core.trigger import Schedule, count_fires, fire_times, schedule_from_spec
from tests.support.budget import examples

pytestmark = pytest.mark.timeout(60)

S = 1000
EVERY_10S = schedule_from_spec({"every": "10s"})
EVERY_1S = schedule_from_spec({"every": "1s"})


def mis(policy: str, grace_ms: int = 60 * S, max_catchup: int = 10) -> MisfireSpec:
    return MisfireSpec(policy=MisfirePolicy(policy), grace_ms=grace_ms, max_catchup=max_catchup)


def run_classify(schedule: Schedule, hwm: int, now: int, misfire: MisfireSpec,
                 lookahead: int = 0, reason: str = "no_leader"):
    return classify(schedule=schedule, hwm_ms=hwm, now_ms=now, lookahead_ms=lookahead,
                    misfire=misfire, reason=reason)


def ms(text: str) -> int:
    return int(datetime.fromisoformat(text).timestamp() * 1000)


def accounted(res, schedule: Schedule, hwm: int) -> None:
    """Every fire time in (hwm, res.hwm_ms] is either run or inside exactly one miss range,
    and the counts add up."""
    if res.hwm_ms is None:
        assert res.run == () and res.missed == ()
        return
    total = count_fires(schedule, hwm, res.hwm_ms)
    assert len(res.run) + sum(m.count for m in res.missed) == total
    assert list(res.run) == sorted(set(res.run))
    spans = sorted([(m.first_ms, m.last_ms) for m in res.missed] + [(r, r) for r in res.run])
    for (_a0, a1), (b0, _b1) in zip(spans, spans[1:], strict=False):
        assert a1 < b0, "ranges and runs must not overlap"
    assert spans[0][0] > hwm
    assert max(a1 for _, a1 in spans) == res.hwm_ms


# --------------------------------------------------------------------- no outage

@pytest.mark.parametrize("policy", ["skip", "once", "all"])
def test_one_fire_due_runs(policy: str) -> None:
    res = run_classify(EVERY_10S, 0, 10 * S, mis(policy))
    assert res.run == (10 * S,)
    assert res.missed == ()
    assert res.hwm_ms == 10 * S


@pytest.mark.parametrize("policy", ["skip", "once", "all"])
def test_nothing_due(policy: str) -> None:
    res = run_classify(EVERY_10S, 10 * S, 19_999, mis(policy))
    assert res.run == () and res.missed == () and res.hwm_ms is None


def test_late_by_less_than_grace_runs() -> None:
    res = run_classify(EVERY_10S, 0, 10 * S + 59_999, mis("skip"))
    assert 10 * S in res.run and res.missed == ()


# --------------------------------------------------------------------- short outage

@pytest.mark.parametrize("policy", ["skip", "all"])
def test_outage_shorter_than_grace_all_run(policy: str) -> None:
    res = run_classify(EVERY_10S, 0, 35 * S, mis(policy))
    assert res.run == (10 * S, 20 * S, 30 * S)
    assert res.missed == ()
    assert res.hwm_ms == 30 * S


def test_outage_shorter_than_grace_once_runs_latest() -> None:
    res = run_classify(EVERY_10S, 0, 35 * S, mis("once"))
    assert res.run == (30 * S,)
    assert res.missed == (MissRange(first_ms=10 * S, last_ms=20 * S, count=2,
                                    reason="coalesced"),)
    assert res.hwm_ms == 30 * S
    accounted(res, EVERY_10S, 0)


def test_once_with_lookahead_keeps_future_fires() -> None:
    res = run_classify(EVERY_10S, 0, 35 * S, mis("once"), lookahead=15 * S)
    assert res.run == (30 * S, 40 * S, 50 * S)
    assert res.missed[0].count == 2
    assert res.hwm_ms == 50 * S


def test_once_many_on_time_fires_runs_only_newest() -> None:
    """More overdue on-time fires than MAX_DUE_PER_JOB (long grace, fast schedule):
    still only the newest one runs (regression: it used to run the 64th oldest)."""
    now = 200 * S
    res = run_classify(EVERY_1S, 0, now, mis("once", grace_ms=300 * S), lookahead=2 * S)
    assert res.run == (now, now + S, now + 2 * S)
    assert res.missed == (MissRange(first_ms=S, last_ms=now - S, count=199,
                                    reason="coalesced"),)
    accounted(res, EVERY_1S, 0)
    assert MAX_DUE_PER_JOB < 199


# --------------------------------------------------------------------- long outage

HWM, NOW = 0, 200 * S  # every 10s, grace 60s: late 10..130 s (13), on time 140..200 s (7)


def test_long_outage_skip() -> None:
    res = run_classify(EVERY_10S, HWM, NOW, mis("skip"), reason="cluster_down")
    assert res.missed == (MissRange(first_ms=10 * S, last_ms=130 * S, count=13,
                                    reason="cluster_down"),)
    assert res.run == tuple(range(140 * S, 201 * S, 10 * S))
    assert res.hwm_ms == NOW
    accounted(res, EVERY_10S, HWM)


def test_long_outage_once() -> None:
    res = run_classify(EVERY_10S, HWM, NOW, mis("once"))
    assert res.run == (NOW,)
    assert [m.reason for m in res.missed] == ["coalesced", "coalesced"]
    assert sum(m.count for m in res.missed) == 19
    assert res.missed[0] == MissRange(first_ms=10 * S, last_ms=130 * S, count=13,
                                      reason="coalesced")
    assert res.hwm_ms == NOW
    accounted(res, EVERY_10S, HWM)


def test_long_outage_once_no_on_time_fire_runs_latest_late() -> None:
    # every 100 s, grace 60 s: fires 100..1000 s; at now = 1050 s the newest (1000 s) is
    # still on time... at now = 1070 s it is late, and it is the one that runs.
    sched = schedule_from_spec({"every": "100s"})
    res = run_classify(sched, 0, 1070 * S, mis("once"))
    assert res.run == (1000 * S,)
    assert res.missed == (MissRange(first_ms=100 * S, last_ms=900 * S, count=9,
                                    reason="coalesced"),)
    accounted(res, sched, 0)
    single = run_classify(sched, 900 * S, 1070 * S, mis("once"))
    assert single.run == (1000 * S,) and single.missed == ()


@pytest.mark.parametrize("max_catchup,runs_late", [(5, 5), (13, 13), (20, 13), (1, 1)])
def test_long_outage_all(max_catchup: int, runs_late: int) -> None:
    res = run_classify(EVERY_10S, HWM, NOW, mis("all", max_catchup=max_catchup))
    late_run = [f for f in res.run if f < 140 * S]
    assert late_run == list(range((130 - 10 * (runs_late - 1)) * S, 131 * S, 10 * S))
    assert [f for f in res.run if f >= 140 * S] == list(range(140 * S, 201 * S, 10 * S))
    if runs_late < 13:
        assert res.missed == (MissRange(first_ms=10 * S,
                                        last_ms=late_run[0] - 10 * S, count=13 - runs_late,
                                        reason="catchup_limit"),)
    else:
        assert res.missed == ()
    accounted(res, EVERY_10S, HWM)


# --------------------------------------------------------------------- grace boundary

@pytest.mark.parametrize("policy", ["skip", "once", "all"])
def test_grace_boundary_exact_is_not_late(policy: str) -> None:
    grace = 60 * S
    f = 10 * S
    res = run_classify(EVERY_10S, 0, f + grace, mis(policy, grace_ms=grace))
    # Every fire time up to now is on time: none is missed for lateness.
    assert all(m.reason == "coalesced" for m in res.missed)
    if policy != "once":
        assert res.run[0] == f and res.missed == ()


def test_grace_boundary_plus_one_is_late() -> None:
    grace = 60 * S
    f = 10 * S
    res = run_classify(EVERY_10S, 0, f + grace + 1, mis("skip", grace_ms=grace))
    assert res.missed == (MissRange(first_ms=f, last_ms=f, count=1, reason="no_leader"),)
    assert res.run[0] == 20 * S


def test_zero_grace() -> None:
    res = run_classify(EVERY_10S, 0, 10 * S, mis("skip", grace_ms=0))
    assert res.run == (10 * S,)
    res = run_classify(EVERY_10S, 0, 10 * S + 1, mis("skip", grace_ms=0))
    assert res.run == () and res.missed[0].count == 1


# --------------------------------------------------------------------- performance

@pytest.mark.parametrize("policy", ["skip", "once", "all"])
def test_thirty_day_outage_every_second_is_fast_and_exact(policy: str) -> None:
    now = 30 * 86_400 * S
    grace = 60 * S
    # CPU time of this process (a loaded machine's other processes do not count); one
    # step per fire time would be 2.6 M steps, seconds of CPU.
    t0 = time.process_time()
    res = run_classify(EVERY_1S, 0, now, mis(policy, grace_ms=grace, max_catchup=1000))
    elapsed = time.process_time() - t0
    assert elapsed < 0.5, elapsed
    late = (now - grace - S) // S  # fire times 1 s .. now - grace - 1 s
    assert late == 2_591_939
    on_time = 61
    if policy == "skip":
        assert res.missed[0].count == late
        assert len(res.run) == on_time
    elif policy == "once":
        assert res.run == (now,)
        assert sum(m.count for m in res.missed) == late + on_time - 1
    else:
        assert res.missed[0].count == late - 1000
        assert res.missed[0].reason == "catchup_limit"
        assert len(res.run) == min(1000 + on_time, 1000 + MAX_DUE_PER_JOB)
    assert res.hwm_ms == max(res.run)


# --------------------------------------------------------------------- DST (cron)

def test_cron_spring_forward_fixed_hour_fires_once() -> None:
    sched = schedule_from_spec({"cron": "30 2 * * *", "tz": "Europe/Berlin"})
    hwm = ms("2026-03-28T12:00:00+00:00")
    # 02:30 does not exist on 2026-03-29: it fires at 03:00+02:00 (01:00Z).
    due = ms("2026-03-29T01:00:00+00:00")
    assert run_classify(sched, hwm, due - 1, mis("skip")).run == ()
    res = run_classify(sched, hwm, due, mis("skip"))
    assert res.run == (due,) and res.hwm_ms == due


def test_cron_fall_back_fixed_hour_fires_once() -> None:
    sched = schedule_from_spec({"cron": "30 2 * * *", "tz": "Europe/Berlin"})
    hwm = ms("2026-10-24T12:00:00+00:00")
    now = ms("2026-10-25T12:00:00+00:00")
    res = run_classify(sched, hwm, now, mis("all", grace_ms=86_400 * S))
    assert res.run == (ms("2026-10-25T00:30:00+00:00"),)  # the first 02:30 (+02:00)


def test_cron_wildcard_hour_across_dst_days() -> None:
    sched = schedule_from_spec({"cron": "0 * * * *", "tz": "Europe/Berlin"})
    day = 86_400 * S
    # Berlin's 2026-03-29 has 23 hours, 2026-10-25 has 25: every one fires once.
    spring_start = ms("2026-03-28T23:00:00+00:00")  # 00:00+01:00
    res = run_classify(sched, spring_start - 1, spring_start + day - 3600 * S - 1,
                       mis("all", grace_ms=2 * day, max_catchup=1000))
    assert len(res.run) == 23 and res.missed == ()
    assert ms("2026-03-29T01:00:00+00:00") in res.run  # 03:00+02:00 right after 01:00+01:00
    assert res.run[1:3] == (ms("2026-03-29T00:00:00+00:00"), ms("2026-03-29T01:00:00+00:00"))
    fall_start = ms("2026-10-24T22:00:00+00:00")  # 00:00+02:00
    res = run_classify(sched, fall_start - 1, fall_start + day + 3600 * S - 1,
                       mis("skip", grace_ms=2 * day))
    assert len(res.run) == 25
    # 02:00 shows twice: 00:00Z (+02:00) and 01:00Z (+01:00).
    assert ms("2026-10-25T00:00:00+00:00") in res.run
    assert ms("2026-10-25T01:00:00+00:00") in res.run
    late = run_classify(sched, fall_start - 1, fall_start + day + 3600 * S - 1 + 3 * day,
                        mis("skip", grace_ms=day))
    accounted(late, sched, fall_start - 1)


# --------------------------------------------------------------------- properties

@settings(max_examples=examples(200), deadline=None)
@given(every=st.sampled_from([1, 7, 10, 60, 3600]),
       hwm=st.integers(0, 10_000),
       gap=st.integers(0, 20_000),
       grace=st.integers(0, 3_000),
       lookahead=st.integers(0, 100),
       policy=st.sampled_from(["skip", "once", "all"]),
       max_catchup=st.integers(1, 30))
def test_classify_accounts_for_every_fire(every: int, hwm: int, gap: int, grace: int,
                                          lookahead: int, policy: str,
                                          max_catchup: int) -> None:
    sched = schedule_from_spec({"every": f"{every}s"})
    hwm *= S
    now = hwm + gap * S // 7
    res = run_classify(sched, hwm, now, mis(policy, grace_ms=grace * S,
                                             max_catchup=max_catchup), lookahead=lookahead * S)
    accounted(res, sched, hwm)
    due = fire_times(sched, hwm, now + lookahead * S, 1)
    assert (res.hwm_ms is None) == (not due)
    if res.hwm_ms is not None:
        assert res.hwm_ms <= now + lookahead * S
    late_runs = [f for f in res.run if now - f > grace * S]
    overdue = [f for f in res.run if f <= now]
    if policy == "skip":
        assert late_runs == []
    if policy == "once":
        assert len(overdue) <= 1
        if overdue:
            newest = fire_times(sched, now - every * S, now, 1)
            assert overdue == newest
    if policy == "all":
        assert len(late_runs) <= max_catchup
    # Miss ranges always start and end on fire times.
    for m in res.missed:
        assert fire_times(sched, m.first_ms - 1, m.first_ms, 1) == [m.first_ms]
        assert fire_times(sched, m.last_ms - 1, m.last_ms, 1) == [m.last_ms]


# --------------------------------------------------------------------- overlap / late

@pytest.mark.parametrize("overlap,active,expected", [
    (Overlap.skip, [], OverlapDecision(action="run")),
    (Overlap.allow, [], OverlapDecision(action="run")),
    (Overlap.queue, [], OverlapDecision(action="run")),
    (Overlap.replace, [], OverlapDecision(action="run")),
    (Overlap.skip, [("j@1", "started")], OverlapDecision(action="skip")),
    (Overlap.skip, [("j@1", "pending")], OverlapDecision(action="skip")),
    (Overlap.allow, [("j@1", "started"), ("j@2", "assigned")], OverlapDecision(action="run")),
    (Overlap.queue, [("j@1", "started")], OverlapDecision(action="queue")),
    (Overlap.queue, [("j@1", "assigned")], OverlapDecision(action="queue")),
    (Overlap.queue, [("j@1", "started"), ("j@2", "queued")], OverlapDecision(action="skip")),
    (Overlap.replace, [("j@1", "started")], OverlapDecision(action="run", cancel=("j@1",))),
    (Overlap.replace, [("j@1", "started"), ("j@2", "pending")],
     OverlapDecision(action="run", cancel=("j@1", "j@2"))),
    (Overlap.replace, [("j@1", "started"), ("j@2", "queued")],
     OverlapDecision(action="run", cancel=("j@1",))),
])
def test_overlap_decision(overlap: Overlap, active: list[tuple[str, str]],
                          expected: OverlapDecision) -> None:
    assert overlap_decision(overlap, active) == expected


@pytest.mark.parametrize("fire,since,boot,last,expected", [
    (1000, 1000, 0, 0, ("shed", "overload")),          # leading at fire time (boundary)
    (5000, 1000, 0, 0, ("shed", "overload")),
    (500, 1000, 800, 100, ("missed", "cluster_down")),  # before boot, after last leader
    (500, 1000, 800, 500, ("missed", "no_leader")),     # last leader saw it (boundary)
    (500, 1000, 800, 900, ("missed", "no_leader")),
    (500, 1000, 500, 100, ("missed", "no_leader")),     # this node was up (boundary)
    (900, 1000, 800, 100, ("missed", "no_leader")),     # up but not leading
])
def test_late_reason(fire: int, since: int, boot: int, last: int,
                     expected: tuple[str, str]) -> None:
    assert late_reason(fire_ms=fire, leader_since_ms=since, leader_boot_ms=boot,
                       last_leader_ms=last) == expected
