"""Small statistics and run-record accounting helpers shared by the workloads."""

from __future__ import annotations

import collections
import math
from collections.abc import Iterable, Sequence
from typing import Any


def pct(values: Sequence[float], p: float) -> float | None:
    """The ``p``-th percentile (nearest rank) of ``values``; None when empty."""
    if not values:
        return None
    s = sorted(values)
    k = max(0, min(len(s) - 1, math.ceil(p / 100 * len(s)) - 1))
    return float(s[k])


def summary(values: Sequence[float]) -> dict[str, Any]:
    s = sorted(values)
    return {"n": len(s), "p50": pct(s, 50), "p99": pct(s, 99),
            "max": float(s[-1]) if s else None,
            "mean": sum(s) / len(s) if s else None}


def median(values: Sequence[float]) -> float | None:
    return pct(values, 50)


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


def downsample(sorted_values: Sequence[float], n: int = 2000) -> list[float]:
    """At most ``n`` evenly spaced points of a sorted list (for CDF plots)."""
    if len(sorted_values) <= n:
        return list(sorted_values)
    step = (len(sorted_values) - 1) / (n - 1)
    return [sorted_values[round(i * step)] for i in range(n)]


def covered_fire_times(rec: dict[str, Any], period_ms: int) -> list[int]:
    """The fire times one run record stands for (a folded miss range covers several)."""
    first = rec["scheduled_ms"]
    last = rec.get("until_ms") or first
    if rec.get("manual"):
        return []
    return list(range(first, last + 1, period_ms))


def account(runs_by_job: dict[str, list[dict[str, Any]]], lo_ms: int, hi_ms: int,
            period_ms: int = 1000) -> dict[str, Any]:
    """Every fire time in ``[lo_ms, hi_ms)`` of every (aligned, every-``period``) job and
    the records covering it.

    Returns ``outcomes`` (Counter of the final outcome per fire time: ``succeeded``,
    ``missed:<reason>`` ..., ``none`` when no record covers it, ``active:<state>`` when
    the run was still active when fetched), ``multi`` (fire times covered by two
    different final outcomes: records that are not attempts of the same run),
    ``dup_records`` ((run_id, attempt) pairs with two started records), and the
    per-fire-time record map for further analysis, and ``noncontig``: folded miss
    ranges whose ``count`` is smaller than the fire times they span.
    """
    first_fire = -(-lo_ms // period_ms) * period_ms
    fires = range(first_fire, hi_ms, period_ms)
    outcomes: collections.Counter[str] = collections.Counter()
    multi: list[tuple[str, int, list[str]]] = []
    dup_records: list[tuple[str, int]] = []
    by_fire: dict[tuple[str, int], list[dict[str, Any]]] = {}
    noncontig: list[tuple[str, int, int, int]] = []
    for job, runs in runs_by_job.items():
        cover: dict[int, list[dict[str, Any]]] = collections.defaultdict(list)
        started: collections.Counter[tuple[str, int]] = collections.Counter()
        exact = {r["scheduled_ms"] for r in runs if not r.get("until_ms")}
        for rec in runs:
            times = covered_fire_times(rec, period_ms)
            folded = len(times) > 1 and rec.get("count", len(times)) < len(times)
            if folded:
                # A miss range whose count is smaller than its span was folded over a
                # fire time that had its own record (claims.record_miss): it does not
                # stand for the fire times in between that have one.
                noncontig.append((job, rec["scheduled_ms"], rec["until_ms"], rec["count"]))
            for t in times:
                if folded and t in exact and t != rec["scheduled_ms"]:
                    continue
                if lo_ms <= t < hi_ms:
                    cover[t].append(rec)
            if rec.get("started_ms") is not None and lo_ms <= rec["scheduled_ms"] < hi_ms:
                started[(rec["run_id"], rec["attempt"])] += 1
        dup_records.extend(k for k, v in started.items() if v > 1)
        for t in fires:
            recs = cover.get(t, [])
            by_fire[(job, t)] = recs
            if not recs:
                outcomes["none"] += 1
                continue
            # Attempts of one run share the run id; distinct run ids = distinct outcomes.
            ids = {r["run_id"] for r in recs}
            if len(ids) > 1:
                multi.append((job, t, sorted(f"{r['state']}:{r['reason']}" for r in recs)))
            outcomes[outcome_of(recs)] += 1
    return {"fires": len(fires) * len(runs_by_job), "outcomes": outcomes, "multi": multi,
            "dup_records": dup_records, "by_fire": by_fire, "noncontig": noncontig}


def outcome_of(recs: list[dict[str, Any]]) -> str:
    """The final outcome of one fire time from the records covering it (not empty):
    ``succeeded`` if any attempt did, ``active:<state>`` while its last attempt is
    active, else ``<state>:<reason>`` of its last attempt."""
    final = max(recs, key=lambda r: r["attempt"])
    if any(r["state"] == "succeeded" for r in recs):
        return "succeeded"
    if final["state"] in ("pending", "queued", "assigned", "started"):
        return f"active:{final['state']}"
    return f"{final['state']}:{final['reason']}"


def stamp_executions(stamps: Iterable[tuple[str, int, int, int, str]], lo_ms: int,
                     hi_ms: int) -> dict[str, Any]:
    """Executions seen by ``bench.noop:stamp`` for fire times in ``[lo_ms, hi_ms)``."""
    per_attempt: collections.Counter[tuple[str, int]] = collections.Counter()
    per_run: dict[str, set[int]] = collections.defaultdict(set)
    first_call: dict[str, int] = {}
    for run_id, attempt, _fence, call_ms, _node in stamps:
        sched = int(run_id.rpartition("@")[2])
        if not lo_ms <= sched < hi_ms:
            continue
        per_attempt[(run_id, attempt)] += 1
        per_run[run_id].add(attempt)
        if run_id not in first_call or call_ms < first_call[run_id]:
            first_call[run_id] = call_ms
    return {"executions": sum(per_attempt.values()),
            "same_attempt_twice": sorted(k for k, v in per_attempt.items() if v > 1),
            "retried": sorted(r for r, a in per_run.items() if len(a) > 1),
            "first_call": first_call}
