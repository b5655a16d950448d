"""Bulk reads build their views a chunk per hold of the state lock (issue 26: every unit
of work under the lock bounded by size): a page of 100,000 jobs or 10,000 runs must not
hold the lock the Raft thread applies under for most of a second."""

from __future__ import annotations

import asyncio
from typing import Any

from raftsched.core.machine import ClusterState
from raftsched.node.config.config import Limits
from raftsched.node.service.jobops import READ_CHUNK, JobOps
from tests.support.stateutil import T0, S, finish, hb, ok, run_fire, start


class _Replica:
    """The replica port over a plain state: counts the holds and what each one built."""

    def __init__(self, st: ClusterState) -> None:
        self.st = st
        self.holds: list[int] = []

    def read(self, fn: Any) -> Any:
        out = fn(self.st)
        self.holds.append(len(out) if isinstance(out, list) else 1)
        return out


class _Caught:
    async def wait(self, timeout: float = 0.0) -> None:
        return None


def _ops(st: ClusterState) -> tuple[JobOps, _Replica]:
    rep = _Replica(st)
    return JobOps(raft=rep, writes=None, reads=_Caught(), limits=Limits(),  # type: ignore[arg-type]
                  allowed_call_prefixes=lambda: None), rep


def test_a_big_page_of_jobs_is_built_a_chunk_per_hold() -> None:
    st = ClusterState()
    ok(st, {"op": "put_jobs", "at": T0, "specs": [
        {"id": f"j{i:05d}", "schedule": {"every": "1h"}, "command": ["true"]}
        for i in range(1000)]})
    ok(st, {"op": "put_jobs", "at": T0, "specs": [
        {"id": f"k{i:05d}", "schedule": {"every": "1h"}, "command": ["true"]}
        for i in range(1000, 2 * READ_CHUNK + 300)]})
    ops, rep = _ops(st)
    reply = asyncio.run(ops.list_jobs({"limit": 100_000}))
    assert reply["total"] == len(st.jobs) and len(reply["jobs"]) == len(st.jobs)
    assert [j["id"] for j in reply["jobs"]] == sorted(st.jobs)
    views = rep.holds[1:]  # the first hold copies the ids
    assert len(views) >= 3 and max(views) <= READ_CHUNK, rep.holds


def test_a_big_page_of_runs_is_built_a_chunk_per_hold() -> None:
    st = ClusterState(history_limit=5000)
    ok(st, {"op": "leader", "at": T0 - 10 * S, "node": "n1", "term": 1})
    hb(st, "n1")
    ok(st, {"op": "put_job", "at": T0 - S, "spec": {
        "id": "j", "schedule": {"every": "1s"}, "command": ["true"], "overlap": "allow"}})
    n = 2 * READ_CHUNK + 100
    for i in range(n):
        t = T0 + i * S
        run_fire(st, "j", t)
        fence = st.runs[f"j@{t}"].fence
        start(st, "n1", f"j@{t}", fence, t)
        finish(st, "n1", f"j@{t}", fence, t + 1)
    ops, rep = _ops(st)
    reply = asyncio.run(ops.runs({"id": "j", "limit": 10_000}))
    assert [r["scheduled_ms"] for r in reply["runs"]] == [T0 + i * S for i in reversed(range(n))]
    assert reply["runs"] == st.run_views("j", 10_000)
    views = rep.holds[1:]
    assert len(views) >= 3 and max(views) <= READ_CHUNK, rep.holds
