"""Replica agreement: the same terminal run records on every node.

The state machine is deterministic, so every node that applied the same log prefix
holds the same finished runs. :func:`snapshot_runs` reads the runs of some jobs from
one node; :func:`diff_runs` compares two such reads over terminal records old enough
to be applied everywhere (``finished_ms < cut_ms``) and inside both nodes' history
windows. A difference means the replicas (or a replica before and after a journal
replay) diverged.
"""

from __future__ import annotations

from typing import Any

from bench.cluster import BenchCluster

FIELDS = ("state", "reason", "node", "fence", "started_ms", "finished_ms", "until_ms", "count")
TERMINAL = {"succeeded", "failed", "timed_out", "lost", "missed", "skipped", "shed",
            "cancelled"}


def snapshot_runs(c: BenchCluster, nid: str, job_ids: list[str],
                  limit: int = 10_000) -> dict[str, list[dict[str, Any]]]:
    return c.fetch_runs(job_ids, limit, nid=nid, threads=2)


def _index(runs: list[dict[str, Any]], cut_ms: int) -> dict[tuple[str, int], dict[str, Any]]:
    return {(r["run_id"], r["attempt"]): r for r in runs
            if r["state"] in TERMINAL and r.get("finished_ms") is not None
            and r["finished_ms"] < cut_ms}


def diff_runs(a: dict[str, list[dict[str, Any]]], b: dict[str, list[dict[str, Any]]],
              cut_ms: int) -> dict[str, Any]:
    """Compare two reads; returns counts and up to 10 examples."""
    compared = 0
    mismatched: list[str] = []
    only: list[str] = []
    for job in sorted(set(a) & set(b)):
        ia, ib = _index(a[job], cut_ms), _index(b[job], cut_ms)
        if not ia or not ib:
            continue
        # Only the span both histories still hold (history_limit trims the oldest).
        lo = max(min(r["scheduled_ms"] for r in ia.values()),
                 min(r["scheduled_ms"] for r in ib.values()))
        for key in sorted(set(ia) | set(ib)):
            ra, rb = ia.get(key), ib.get(key)
            sched = (ra or rb)["scheduled_ms"]  # type: ignore[index]
            if sched < lo:
                continue
            compared += 1
            if ra is None or rb is None:
                only.append(f"{key[0]}#{key[1]} only on {'first' if rb is None else 'second'}")
                continue
            diff = [f for f in FIELDS if ra.get(f) != rb.get(f)]
            if diff:
                mismatched.append(f"{key[0]}#{key[1]}: " + ", ".join(
                    f"{f} {ra.get(f)!r}≠{rb.get(f)!r}" for f in diff))
    return {"compared": compared, "mismatched": len(mismatched), "only_one_side": len(only),
            "examples": (mismatched + only)[:10]}
