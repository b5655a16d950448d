"""How the benchmark reads one fire time's records (``bench.stats.outcome_of``): W1's
accounting and the overload probe's per-phase outcomes use it."""

from __future__ import annotations

from typing import Any

from bench.stats import outcome_of


def _rec(state: str, attempt: int = 1, reason: str = "") -> dict[str, Any]:
    return {"state": state, "attempt": attempt, "reason": reason}


def test_any_attempt_that_succeeded_makes_the_fire_time_succeeded() -> None:
    assert outcome_of([_rec("failed", 1, "exit 1"), _rec("succeeded", 2)]) == "succeeded"


def test_the_last_attempt_decides_otherwise() -> None:
    assert outcome_of([_rec("failed", 1, "exit 1"), _rec("timed_out", 2, "t")]) == "timed_out:t"


def test_a_run_still_active_is_named_active() -> None:
    assert outcome_of([_rec("failed", 1, "x"), _rec("started", 2)]) == "active:started"


def test_a_recorded_miss_carries_its_reason() -> None:
    assert outcome_of([_rec("missed", 1, "coalesced")]) == "missed:coalesced"
