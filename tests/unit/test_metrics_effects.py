"""The node's counters that applied effects feed (raftsched/node/metrics.py)."""

from __future__ import annotations

from raftsched.core.effects import FireCovered
from raftsched.node.metrics import Metrics


def _sample(metrics: Metrics, name: str) -> float | None:
    for line in metrics.render().decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def test_a_covered_fire_time_is_counted_once_per_effect() -> None:
    metrics = Metrics("n1")
    assert _sample(metrics, "raftsched_fire_times_covered_total") == 0.0
    metrics.effect(FireCovered(run_id="j@1000"))
    metrics.effect(FireCovered(run_id="j@2000"))
    assert _sample(metrics, "raftsched_fire_times_covered_total") == 2.0


def test_ended_runs_are_counted_by_outcome() -> None:
    from raftsched.core.effects import RangeMissed, RunEnded

    metrics = Metrics("n1")
    fields = {f: None for f in RunEnded._fields}
    metrics.effect(RunEnded(**{**fields, "state": "succeeded"}))
    metrics.effect(RunEnded(**{**fields, "state": "succeeded"}))
    metrics.effect(RunEnded(**{**fields, "state": "failed"}))
    missed = {f: None for f in RangeMissed._fields}
    metrics.effect(RangeMissed(**{**missed, "state": "missed", "fire_count": 3}))
    ended = 'raftsched_node_runs_ended_total{outcome="%s"}'
    assert _sample(metrics, ended % "succeeded") == 2.0
    assert _sample(metrics, ended % "failed") == 1.0
    assert _sample(metrics, ended % "missed") == 3.0


def test_the_process_s_collections_are_reported_once_watched(monkeypatch) -> None:
    from raftsched.node.observe import gcwatch

    monkeypatch.setattr(gcwatch, "_watch", None)
    metrics = Metrics("n1")
    # Not watched (an app embedding a node keeps its collector): nothing reported.
    assert _sample(metrics, 'raftsched_gc_collections_total{generation="0"}') is None
    watch = gcwatch._Watch()
    monkeypatch.setattr(gcwatch, "_watch", watch)
    for gen in (0, 0, 1):
        watch("start", {"generation": gen})
        watch("stop", {"generation": gen, "collected": 0, "uncollectable": 0})
    assert _sample(metrics, 'raftsched_gc_collections_total{generation="0"}') == 2.0
    assert _sample(metrics, 'raftsched_gc_collections_total{generation="1"}') == 1.0
    assert _sample(metrics, 'raftsched_gc_collections_total{generation="2"}') == 0.0
    total = _sample(metrics, 'raftsched_gc_seconds_total{generation="0"}')
    longest = _sample(metrics, 'raftsched_gc_longest_seconds{generation="0"}')
    assert total is not None and longest is not None and 0 <= longest <= total
