"""The nemesis checks of dependent jobs and concurrency keys (issue 32 items 1, 4) on
hand-made histories: each violation is found, and a clean history gives no finding."""

from __future__ import annotations

from typing import Any

from tests.nemesis import checker, promises
from tests.nemesis.checker import Execution

S = 1000
T0 = 1_800_000_000_000


def rec(job: str, t: int, state: str = "succeeded", **kw: Any) -> dict[str, Any]:
    r = {"run_id": f"{job}@{t}", "job_id": job, "scheduled_ms": t, "state": state,
         "attempt": 1, "fence": 1, "until_ms": None, "count": 1, "transitions": []}
    r.update(kw)
    return r


def ex(job: str, start: float, last: float, node: str = "n1", fence: int = 1) -> Execution:
    return Execution(run_id=f"{job}@{int(start * 1000)}", job_id=job, fence=fence, attempt=1,
                     node=node, pid=int(start * 10), start=start, last=last, ended=True)


def kinds(findings: list[dict[str, Any]]) -> list[str]:
    return sorted(f["kind"] for f in findings)


DEPS = {"c": (["p"], "success"), "f": (["a", "b"], "always")}


def clean_runs() -> dict[str, list[dict[str, Any]]]:
    return {
        # Newest first, as the API answers.
        "p": [rec("p", T0 + 2 * S, "failed"), rec("p", T0 + S), rec("p", T0)],
        "c": [rec("c", T0 + S), rec("c", T0)],
        "a": [rec("a", T0 + S, "failed"), rec("a", T0)],
        "b": [rec("b", T0 + S), rec("b", T0, "timed_out")],
        "f": [rec("f", T0 + S), rec("f", T0)],
    }


def test_a_child_run_once_per_matching_parent_run_is_clean() -> None:
    assert promises.check_children(clean_runs(), DEPS, T0 + 10 * S) == []


def test_a_missing_child_is_found() -> None:
    runs = clean_runs()
    runs["c"] = [rec("c", T0)]  # p@T0+1s succeeded: its child is missing
    found = promises.check_children(runs, DEPS, T0 + 10 * S)
    assert kinds(found) == ["child_missing"] and found[0]["fire_ms"] == T0 + S


def test_a_doubled_child_is_found_but_a_retried_attempt_is_one_run() -> None:
    runs = clean_runs()
    runs["c"] = [rec("c", T0 + S), rec("c", T0 + S, attempt=2), rec("c", T0)]
    assert kinds(promises.check_children(runs, DEPS, T0 + 10 * S)) == ["child_doubled"]
    runs["c"] = [rec("c", T0 + S, attempt=2),
                 rec("c", T0 + S, "failed", transitions=[{"note": "retrying"}]), rec("c", T0)]
    assert promises.check_children(runs, DEPS, T0 + 10 * S) == []


def test_a_child_for_a_parent_that_did_not_match_is_found() -> None:
    runs = clean_runs()
    runs["c"].insert(0, rec("c", T0 + 2 * S))  # p@T0+2s failed; on = success
    found = promises.check_children(runs, DEPS, T0 + 10 * S)
    assert kinds(found) == ["child_unexpected"] and found[0]["parents"] == {"p": "failed"}


def test_fan_in_needs_every_parent() -> None:
    runs = clean_runs()
    runs["b"] = [rec("b", T0, "timed_out")]  # b@T0+1s has no outcome: no child due
    found = promises.check_children(runs, DEPS, T0 + 10 * S)
    assert kinds(found) == ["child_unexpected"] and found[0]["job"] == "f"


def test_fire_times_beyond_the_kept_history_are_not_judged() -> None:
    runs = clean_runs()
    runs["c"] = [rec("c", T0 + S)]  # c's history starts later: p@T0's child not judged
    assert promises.check_children(runs, DEPS, T0 + 10 * S) == []


KEYS = {"x": ("wh", 2), "y": ("wh", 2), "z": ("wh", 2)}


def test_never_more_than_max_of_a_key_is_clean_and_touching_ends_do_not_overlap() -> None:
    execs = [ex("x", 0.0, 1.0), ex("y", 0.0, 1.0), ex("z", 1.0, 2.0), ex("x", 1.0, 2.0),
             ex("other", 0.0, 5.0)]
    assert checker.check_concurrency(KEYS, execs) == []
    assert checker.max_concurrent([e for e in execs if e.job_id in KEYS]) == 2


def test_more_than_max_of_a_key_at_once_is_found() -> None:
    execs = [ex("x", 0.0, 1.0), ex("y", 0.5, 1.5), ex("z", 0.9, 2.0)]
    found = checker.check_concurrency(KEYS, execs)
    assert kinds(found) == ["concurrency_exceeded"]
    assert found[0]["at"] == 0.9 and len(found[0]["executions"]) == 3
    # The smallest max of the jobs sharing a key holds.
    assert kinds(checker.check_concurrency(dict(KEYS, z=("wh", 1)),
                                           [ex("x", 0.0, 1.0), ex("y", 0.5, 1.5)])) \
        == ["concurrency_exceeded"]


def test_an_excess_a_frozen_node_explains_is_a_freeze_window() -> None:
    # x's node froze at 1.0 with x running; its run was released and y, z took the
    # places; thawed at 5.2, x was stopped 0.1 s later.
    execs = [ex("x", 0.0, 5.3, node="n3"), ex("y", 4.0, 6.0), ex("z", 4.5, 7.0)]
    found = checker.check_concurrency(KEYS, execs)
    assert kinds(found) == ["concurrency_exceeded"]
    assert kinds(checker.attribute_key_freezes(found, [("n3", 1.0, 5.2)])) == \
        ["freeze_window"]
    # Another node's freeze explains nothing, nor one x outlived by more than the bound.
    assert kinds(checker.attribute_key_freezes(found, [("n2", 1.0, 5.2)])) == \
        ["concurrency_exceeded"]
    assert kinds(checker.attribute_key_freezes(found, [("n3", 1.0, 4.6)])) == \
        ["concurrency_exceeded"]


def test_an_execution_forked_before_a_freeze_began_before_it_whatever_its_start_line() -> None:
    """Seen in a 500-fault run: x forked 70 ms before the nemesis noted the freeze of its
    node and wrote its start line at that very millisecond (before the cgroup stopped
    it); thawed 6 s later, it ran 7 ms beside the two runs that had taken the places."""
    execs = [ex("x", 1.0, 7.007, node="n3"), ex("y", 6.5, 6.9), ex("z", 6.8, 7.5)]
    found = checker.check_concurrency(KEYS, execs)
    assert kinds(found) == ["concurrency_exceeded"]
    forked = [dict(f, executions=[dict(e, forked=0.93 if e["node"] == "n3" else None)
                                  for e in f["executions"]]) for f in found]
    assert kinds(checker.attribute_key_freezes(forked, [("n3", 0.999, 7.0)])) == \
        ["freeze_window"]
    # Without the fork time, or with one not surely before the freeze, it stays.
    assert kinds(checker.attribute_key_freezes(found, [("n3", 0.999, 7.0)])) == \
        ["concurrency_exceeded"]
    late = [dict(f, executions=[dict(e, forked=0.995) for e in f["executions"]])
            for f in found]
    assert kinds(checker.attribute_key_freezes(late, [("n3", 0.999, 7.0)])) == \
        ["concurrency_exceeded"]
