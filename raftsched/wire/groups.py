"""Several independent raftsched clusters ("groups") behind one client, jobs partitioned
by id: what a user does who outgrows one Raft group (``docs/scaling.md``).

Each group is an ordinary raftsched cluster — its own Raft log, leader, fences and
history — and knows nothing of the others; there is no new consensus. A job lives in
exactly one group, chosen from its id by rendezvous (highest-random-weight) hashing over
the groups' names: every client computes the same owner, and adding a group moves only
the jobs the new group now wins (about 1/N of them), never jobs between old groups.

Every guarantee stays per job, hence per group: a fire time runs once in its job's
group, fences are that group's. Nothing spans groups: a dependency (``after``) or a
concurrency key must stay within one group (give such jobs ids that hash together, or
one group). :meth:`GroupedClient.misplaced` lists jobs found in a group that no longer
owns them (after a group was added), to be moved by the operator: ``docs/scaling.md``
gives the recipe (pause, export, put in the owner, delete, resume).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from raftsched.core.errors import InvalidArgument
from raftsched.wire.client import Client


def owner(job_id: str, groups: Sequence[str]) -> str:
    """The group that owns ``job_id``: the name with the highest hash of (name, id)."""
    if not groups:
        raise InvalidArgument("groups", "needs at least one group")
    return max(groups, key=lambda g: hashlib.sha256(
        f"{g}\0{job_id}".encode()).digest())


class GroupedClient:
    """:class:`~raftsched.wire.client.Client`'s job operations over several groups.

    :param groups: group name -> the addresses of that cluster's nodes.
    :param client_kwargs: passed to each group's :class:`Client` (``secret``,
        ``timeout``, ``tls_ca``, ...).
    """

    def __init__(self, groups: Mapping[str, str | Sequence[str]], *,
                 connect: Callable[..., Any] = Client, **client_kwargs: Any) -> None:
        if not groups:
            raise InvalidArgument("groups", "needs at least one group")
        self.names = sorted(groups)
        self.clients = {name: connect(addrs, **client_kwargs)
                        for name, addrs in groups.items()}

    def group_of(self, job_id: str) -> str:
        return owner(job_id, self.names)

    def _for(self, job_id: str) -> Any:
        return self.clients[self.group_of(job_id)]

    # ------------------------------------------------------------------ one job

    def put_job(self, spec: dict[str, Any]) -> Any:
        return self._for(str(spec.get("id"))).put_job(spec)

    def get_job(self, job_id: str, **kw: Any) -> Any:
        return self._for(job_id).get_job(job_id, **kw)

    def delete_job(self, job_id: str) -> Any:
        return self._for(job_id).delete_job(job_id)

    def pause(self, job_id: str) -> Any:
        return self._for(job_id).pause(job_id)

    def resume(self, job_id: str, catch_up: bool = False) -> Any:
        return self._for(job_id).resume(job_id, catch_up)

    def trigger(self, job_id: str, force: bool = False) -> Any:
        return self._for(job_id).trigger(job_id, force)

    def runs(self, job_id: str, limit: int = 100, **kw: Any) -> Any:
        return self._for(job_id).runs(job_id, limit, **kw)

    # ------------------------------------------------------------------ many jobs

    def put_jobs(self, specs: list[dict[str, Any]]) -> Any:
        """Each group gets its share in one call; the results in the order given."""
        by_group: dict[str, list[int]] = {}
        for i, spec in enumerate(specs):
            by_group.setdefault(self.group_of(str(spec.get("id"))), []).append(i)
        results: list[Any] = [None] * len(specs)
        for name, idx in by_group.items():
            reply = self.clients[name].put_jobs([specs[i] for i in idx])
            for i, res in zip(idx, reply["results"], strict=True):
                results[i] = res
        return {"results": results}

    def list_jobs(self, prefix: str | None = None, limit: int = 1000, **kw: Any) -> Any:
        """Every group's jobs, by id; ``total`` counts them all."""
        jobs: list[dict[str, Any]] = []
        total = 0
        for name in self.names:
            reply = self.clients[name].list_jobs(prefix, limit, **kw)
            jobs += [dict(j, group=name) for j in reply["jobs"]]
            total += reply["total"]
        return {"jobs": sorted(jobs, key=lambda j: j["id"])[:limit], "total": total}

    def status(self, **kw: Any) -> dict[str, Any]:
        """Each group's status, by name."""
        return {name: self.clients[name].status(**kw) for name in self.names}

    def misplaced(self) -> dict[str, list[str]]:
        """Group -> ids of jobs it holds but does not own (after groups changed)."""
        out: dict[str, list[str]] = {}
        for name in self.names:
            ids = [j["id"] for j in self.clients[name].list_jobs(limit=100_000)["jobs"]]
            wrong = [j for j in ids if self.group_of(j) != name]
            if wrong:
                out[name] = wrong
        return out

    def close(self) -> None:
        for cl in self.clients.values():
            cl.close()

    def __enter__(self) -> GroupedClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["GroupedClient", "owner"]
