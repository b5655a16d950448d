"""Jobs partitioned over several raftsched groups by rendezvous hashing (docs/scaling.md):
every client agrees on a job's group, the groups share the jobs about evenly, and adding
a group moves only the jobs it wins."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raftsched.core.errors import InvalidArgument
from raftsched.wire.groups import GroupedClient, owner

IDS = [f"job-{i:05d}" for i in range(6000)]


def test_the_groups_share_the_jobs_about_evenly() -> None:
    counts = Counter(owner(j, ["a", "b", "c"]) for j in IDS)
    assert set(counts) == {"a", "b", "c"}
    assert all(abs(n - 2000) < 200 for n in counts.values()), counts


def test_adding_a_group_moves_only_the_jobs_it_wins() -> None:
    before = {j: owner(j, ["a", "b", "c"]) for j in IDS}
    after = {j: owner(j, ["a", "b", "c", "d"]) for j in IDS}
    moved = [j for j in IDS if before[j] != after[j]]
    assert all(after[j] == "d" for j in moved)  # never from one old group to another
    assert 1200 < len(moved) < 1800  # about a quarter


@given(st.text(min_size=1, max_size=40), st.permutations(["g1", "g2", "g3", "g4"]))
def test_every_client_computes_the_same_owner(job_id: str, order: list[str]) -> None:
    assert owner(job_id, order) == owner(job_id, sorted(order))


def test_no_groups_is_refused() -> None:
    with pytest.raises(InvalidArgument):
        owner("x", [])
    with pytest.raises(InvalidArgument):
        GroupedClient({})


class _Group:
    """One group's client, over a dict of jobs (what a cluster holds)."""

    def __init__(self, addrs: Any, **_: Any) -> None:
        self.addrs = addrs
        self.jobs: dict[str, dict[str, Any]] = {}

    def put_job(self, spec: dict[str, Any]) -> Any:
        self.jobs[spec["id"]] = spec
        return {"job": spec["id"]}

    def put_jobs(self, specs: list[dict[str, Any]]) -> Any:
        return {"results": [dict(self.put_job(s), ok=True) for s in specs]}

    def get_job(self, job_id: str, **_: Any) -> Any:
        return self.jobs[job_id]

    def list_jobs(self, prefix: str | None = None, limit: int = 1000, **_: Any) -> Any:
        ids = sorted(j for j in self.jobs if j.startswith(prefix or ""))
        return {"jobs": [{"id": j} for j in ids[:limit]], "total": len(ids)}

    def close(self) -> None:
        pass


def test_the_client_routes_each_job_to_its_group_and_lists_them_all() -> None:
    gc = GroupedClient({"a": "h1:1", "b": "h2:1"}, connect=_Group)
    specs = [{"id": f"j{i}"} for i in range(40)]
    results = gc.put_jobs(specs)["results"]
    assert [r["job"] for r in results] == [s["id"] for s in specs]  # in the order given
    for s in specs:
        assert s["id"] in gc.clients[gc.group_of(s["id"])].jobs
        assert gc.get_job(s["id"]) == s
    listed = gc.list_jobs(limit=1000)
    assert [j["id"] for j in listed["jobs"]] == sorted(s["id"] for s in specs)
    assert listed["total"] == 40 and gc.misplaced() == {}
    # A job put into the wrong group (before a group was added) is found.
    wrong = next(n for n in gc.names if n != gc.group_of("stray"))
    gc.clients[wrong].put_job({"id": "stray"})
    assert gc.misplaced() == {wrong: ["stray"]}
