"""The nemesis checker on hand-made histories: each violation class is found, and a
clean history gives no finding."""

from __future__ import annotations

from tests.nemesis import checker
from tests.nemesis.checker import Op, Read
from tests.support.histories import rec, wl

S = 1000
T0 = 1_800_000_000_000


def kinds(findings):
    return sorted(f["kind"] for f in findings)


# ---------------------------------------------------------------- fire times

def test_every_fire_time_with_one_record_is_clean() -> None:
    records = [rec("j", T0 + i * S) for i in range(5)]
    n, f = checker.check_fire_times("j", records, S, T0, T0 + 4 * S)
    assert (n, f) == (5, [])


def test_a_range_record_covers_its_fire_times_and_attempts_are_one_run() -> None:
    records = [rec("j", T0), rec("j", T0 + S, "missed", until_ms=T0 + 3 * S, count=3),
               rec("j", T0 + 4 * S, "lost", attempt=1, fence=5),
               rec("j", T0 + 4 * S, "succeeded", attempt=2, fence=7)]
    n, f = checker.check_fire_times("j", records, S, T0, T0 + 4 * S)
    assert (n, f) == (5, [])


def test_a_missing_fire_time_a_doubled_one_and_a_miscounted_range_are_found() -> None:
    records = [rec("j", T0), rec("j", T0 + 2 * S, "missed", until_ms=T0 + 3 * S, count=3),
               rec("j", T0 + 3 * S)]
    _, f = checker.check_fire_times("j", records, S, T0, T0 + 3 * S)
    assert kinds(f) == ["no_outcome", "range_count", "two_outcomes"]
    assert [x["fire_ms"] for x in f if x["kind"] == "no_outcome"] == [T0 + S]


def test_fire_times_outside_the_window_and_manual_runs_do_not_count() -> None:
    records = [rec("j", T0 - S), rec("j", T0), rec("j", T0, manual=True, run_id="j@x")]
    n, f = checker.check_fire_times("j", records, S, T0, T0)
    assert (n, f) == (1, [])


# ---------------------------------------------------------------- executions

def test_executions_pair_start_ticks_and_end_by_pid() -> None:
    ex = checker.executions([wl("j@1", 3, 10, "start", 1.0), wl("j@1", 3, 10, "tick", 1.2),
                             wl("j@1", 3, 10, "end", 1.5), wl("j@1", 4, 11, "start", 2.0),
                             wl("j@1", 4, 11, "tick", 2.2)])
    assert [(e.fence, e.start, e.last, e.ended) for e in ex] == [(3, 1.0, 1.5, True),
                                                                 (4, 2.0, 2.2, False)]


def started(run_id, fence, attempt=1):
    return {"run_id": run_id, "fence": fence, "attempt": attempt, "state": "succeeded",
            "started_ms": 1, "transitions": []}


def test_retry_attempts_one_after_the_other_are_clean() -> None:
    ex = checker.executions([wl("j@1", 3, 10, "start", 1.0), wl("j@1", 3, 10, "tick", 1.4),
                             wl("j@1", 5, 11, "start", 1.5, attempt=2)])
    f = checker.check_executions({"j": "retry"}, ex,
                                 {"j@1": [started("j@1", 3), started("j@1", 5, 2)]})
    assert f == []


def test_overlapping_attempts_and_a_fence_going_back_are_found() -> None:
    ex = checker.executions([wl("j@1", 5, 10, "start", 1.0), wl("j@1", 5, 10, "end", 2.0),
                             wl("j@1", 3, 11, "start", 1.5, attempt=2)])
    f = checker.check_executions({"j": "retry"}, ex,
                                 {"j@1": [started("j@1", 5), started("j@1", 3, 2)]})
    assert kinds(f) == ["fence_not_increasing", "overlapping_attempts"]
    assert f[1]["overlap_s"] == 0.5


def test_under_fail_a_second_execution_is_a_double_execution() -> None:
    ex = checker.executions([wl("j@1", 3, 10, "start", 1.0), wl("j@1", 3, 10, "end", 1.1),
                             wl("j@1", 4, 11, "start", 5.0)])
    f = checker.check_executions({"j": "fail"}, ex,
                                 {"j@1": [started("j@1", 3), started("j@1", 4)]})
    assert kinds(f) == ["double_execution"]


def test_an_execution_no_record_says_started_is_found() -> None:
    ex = checker.executions([wl("j@1", 3, 10, "start", 1.0), wl("j@2", 4, 11, "start", 1.0),
                             wl("j@3", 5, 12, "start", 1.0)])
    never = {"run_id": "j@2", "fence": 4, "state": "cancelled", "started_ms": None,
             "transitions": [[1, "assigned", "n1", 4, ""]]}
    by_transition = {"run_id": "j@3", "fence": 6, "state": "succeeded", "started_ms": 9,
                     "transitions": [[1, "started", "n1", 5, ""]]}
    f = checker.check_executions({"j": "retry"}, ex, {"j@2": [never], "j@3": [by_transition]})
    assert kinds(f) == ["execution_without_record", "execution_without_record"]
    assert {x["run_id"] for x in f} == {"j@1", "j@2"}


def test_transitions_in_the_api_shape_maps_count_like_rows() -> None:
    """``runs`` returns each transition as a map (records.TRANSITION_KEYS); a row
    history and a map history say the same."""
    from raftsched.core.records import TRANSITION_KEYS
    ex = checker.executions([wl("j@3", 5, 12, "start", 1.0), wl("j@4", 7, 13, "start", 1.0)])
    row = [1, "started", "n1", 5, ""]
    by_map = {"run_id": "j@3", "fence": 6, "state": "succeeded", "started_ms": 9,
              "transitions": [dict(zip(TRANSITION_KEYS, row, strict=True))]}
    never = {"run_id": "j@4", "fence": 7, "state": "cancelled", "started_ms": None,
             "transitions": [dict(zip(TRANSITION_KEYS, [1, "assigned", "n1", 7, ""],
                                      strict=True))]}
    f = checker.check_executions({"j": "retry"}, ex, {"j@3": [by_map], "j@4": [never]})
    assert [(x["kind"], x["run_id"]) for x in f] == [("execution_without_record", "j@4")]


def test_an_overlap_from_a_frozen_node_is_the_freeze_window_measured_after_the_thaw() -> None:
    ex = checker.executions([wl("j@1", 3, 10, "start", 1.0), wl("j@1", 3, 10, "end", 9.03),
                             wl("j@1", 5, 11, "start", 6.0, attempt=2, node="n2"),
                             wl("j@1", 5, 11, "end", 10.0, attempt=2, node="n2"),
                             wl("j@2", 6, 12, "start", 1.0, node="n3"),
                             wl("j@2", 6, 12, "end", 3.0, node="n3"),
                             wl("j@2", 7, 13, "start", 2.0, attempt=2, node="n2")])
    f = checker.check_executions({"j": "retry"}, ex, {
        "j@1": [started("j@1", 3), started("j@1", 5, 2)],
        "j@2": [started("j@2", 6), started("j@2", 7, 2)]})
    f = checker.attribute_freezes(f, [("n1", 1.5, 9.0), ("n2", 2.5, 3.0)])
    assert kinds(f) == ["freeze_window", "overlapping_attempts"]
    assert f[0]["after_thaw_s"] == 0.03


def _forked(line, forked):
    return dict(line, forked=forked)


def test_an_old_execution_forked_before_the_freeze_but_seen_after_the_thaw() -> None:
    """Seen in an in-suite run: a node spawned attempt 1 just before a freeze of the
    whole node (its job froze before writing its start line), attempt 2 started
    elsewhere during the freeze, and at the thaw attempt 1 wrote its start and was
    killed by the guard. Its fork time says it is the freeze window, not a stale start."""
    old = [_forked(wl("j@1", 540, 31908, "start", 9.04), 1.49)]
    new = [_forked(wl("j@1", 558, 32033, "start", 6.0, attempt=2, node="n2"), 5.99),
           wl("j@1", 558, 32033, "end", 9.5, attempt=2, node="n2")]
    ex = checker.executions(old + new)
    recs = {"j@1": [started("j@1", 540), started("j@1", 558, 2)]}
    f = checker.check_executions({"j": "retry"}, ex, recs)
    assert kinds(f) == ["overlapping_attempts"]  # fences do increase in spawn order
    f = checker.attribute_freezes(f, [("n1", 1.5, 9.0)])
    assert kinds(f) == ["freeze_window"] and f[0]["after_thaw_s"] == 0.04


def test_an_old_attempt_forked_after_the_thaw_is_a_stale_start() -> None:
    old = [_forked(wl("j@1", 540, 31908, "start", 9.04), 9.02)]
    new = [_forked(wl("j@1", 558, 32033, "start", 6.0, attempt=2, node="n2"), 5.99),
           wl("j@1", 558, 32033, "end", 9.5, attempt=2, node="n2")]
    ex = checker.executions(old + new)
    f = checker.check_executions({"j": "retry"}, ex,
                                 {"j@1": [started("j@1", 540), started("j@1", 558, 2)]})
    f = checker.attribute_freezes(f, [("n1", 1.5, 9.0)])
    assert kinds(f) == ["fence_not_increasing", "overlapping_attempts"]


def test_an_old_execution_running_long_after_the_thaw_stays_an_overlap() -> None:
    """The guard kills a thawed node's old jobs at once: one still running a second
    and more beside the new attempt is a failed guard, not the freeze window."""
    ex = checker.executions([wl("j@1", 3, 10, "start", 1.0), wl("j@1", 3, 10, "end", 10.5),
                             wl("j@1", 5, 11, "start", 6.0, attempt=2, node="n2"),
                             wl("j@1", 5, 11, "end", 12.0, attempt=2, node="n2")])
    f = checker.check_executions({"j": "retry"}, ex,
                                 {"j@1": [started("j@1", 3), started("j@1", 5, 2)]})
    f = checker.attribute_freezes(f, [("n1", 1.5, 9.0)])
    assert kinds(f) == ["overlapping_attempts"]
    assert f[0]["after_thaw_s"] == 1.5


# ---------------------------------------------------------------- writes and reads

def test_reads_of_acknowledged_or_in_flight_writes_are_clean() -> None:
    ops = [Op(key="k", seq=1, kind="put", start=1, end=2, ok=True),
           Op(key="k", seq=2, kind="put", start=3, end=None, ok=False),  # unknown outcome
           Op(key="k", seq=3, kind="delete", start=5, end=6, ok=True)]
    reads = [Read(key="k", seq=None, start=0, end=0.5),       # before anything
             Read(key="k", seq=1, start=2.5, end=2.6),
             Read(key="k", seq=2, start=3.5, end=3.6),         # the in-flight put
             Read(key="k", seq=1, start=3.5, end=3.6),         # ... or not yet
             Read(key="k", seq=None, start=7, end=8, final=True)]
    assert checker.check_reads(ops, reads) == []


def test_a_stale_read_a_lost_write_a_phantom_and_a_partial_read_are_found() -> None:
    ops = [Op(key="k", seq=1, kind="put", start=1, end=2, ok=True),
           Op(key="k", seq=2, kind="put", start=3, end=4, ok=True)]
    reads = [Read(key="k", seq=1, start=5, end=6),
             Read(key="k", seq=None, start=2.5, end=2.7),
             Read(key="k", seq=9, start=5, end=6),
             Read(key="k", seq=2, start=5, end=6, partial=True),
             Read(key="k", seq=1, start=9, end=10, final=True)]
    f = checker.check_reads(ops, reads)
    assert kinds(f) == ["lost_write", "partial_read", "phantom_read", "stale_read",
                        "stale_read"]


def test_a_read_of_a_write_invoked_after_it_ended_is_stale() -> None:
    ops = [Op(key="k", seq=1, kind="put", start=5, end=6, ok=True)]
    f = checker.check_reads(ops, [Read(key="k", seq=1, start=1, end=2)])
    assert kinds(f) == ["stale_read"]


# ---------------------------------------------------------------- logs, availability

def test_a_traceback_in_a_node_log_is_found_with_its_error() -> None:
    lines = ['{"event":"x"}\n', "Traceback (most recent call last):\n",
             '  File "x.py", line 1\n', "KeyError: 'a'\n"]
    assert checker.check_logs("n1", lines) == [
        {"kind": "traceback", "node": "n1", "line": 2, "error": "KeyError: 'a'"}]


def test_unavailability_windows_are_gaps_between_leader_answers() -> None:
    up = [0.1, 0.3, 0.5, 3.0, 3.2, 9.0]
    w = checker.unavailability(up, 0.0, 10.0, min_gap_s=1.0)
    assert w == [(0.5, 2.5), (3.2, 5.8)]
    assert checker.summarize_windows(w) == {"count": 2, "p50_s": 4.15, "max_s": 5.8,
                                            "total_s": 8.3}


