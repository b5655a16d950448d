"""The API's job operations: put, read, pause/resume, trigger, runs and previews.

Each validates its arguments where they enter (a clear error naming the field), reads
through ``raft.read`` with only copies leaving the lock (nothing slow under it), and
writes through :class:`~raftsched.node.replica.writes.ClientWrites` (exactly once through
elections). The node's router (node.py) dispatches to them.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from raftsched.core import members, queries
from raftsched.core.cmdbase import HELD_IDS_VERSION, RUN_IDS_FEATURE
from raftsched.core.codec import packb
from raftsched.core.commands import (
    COMMAND_VERSION,
    PAST_AT_VERSION,
    DeleteJob,
    Pause,
    PutJob,
    PutJobs,
    Resume,
    Trigger,
)
from raftsched.core.errors import InvalidArgument, InvalidSpec, LimitExceeded, UnknownJob
from raftsched.core.jobs import late_at
from raftsched.core.machine import MAX_PUT_BATCH, ClusterState
from raftsched.core.model import JobSpec
from raftsched.core.records import RunRecord
from raftsched.core.trigger import count_fires
from raftsched.node.leader import notifier
from raftsched.node.observe.clock import now_ms
from raftsched.node.replica.writes import check_rid
from raftsched.node.service import preview

if TYPE_CHECKING:
    from raftsched.node.config.config import Limits
    from raftsched.node.replica.port import ReplicaPort
    from raftsched.node.replica.reads import ReadBarrier
    from raftsched.node.replica.writes import ClientWrites

#: Specs per ``put_jobs`` command of a non-atomic bulk put. Applying a spec costs ~0.1 ms
#: (0.3-1 ms on a loaded 2-core host) under the Raft lock, on every node and again at
#: each journal replay; a long hold stalls pysyncobj's heartbeats and every reader, so
#: chunks keep each hold near the 20 ms budget (docs/architecture.md, bounded plans).
PUT_CHUNK = 25
#: Chunks of one bulk put in flight at once (committed in the order submitted; a put
#: naming one job twice goes one chunk at a time, so that the later spec wins).
PUT_PIPELINE = 8

Op = Callable[[dict[str, Any]], Awaitable[Any]]


def job_id_arg(args: dict[str, Any]) -> str:
    """The request's job ``id``."""
    job_id = args.get("id")
    if not isinstance(job_id, str) or not 0 < len(job_id) <= 128:
        raise InvalidArgument("id", "must be a job id")
    return job_id


def put_version(if_changed: bool) -> int:
    """A declaration put (``if_changed``) is written as version 3: an older node stops
    on it rather than making versions the other nodes do not."""
    return PAST_AT_VERSION if if_changed else COMMAND_VERSION


def chunk_request_id(rid: str, first: int) -> str:
    """The request id of the chunk of a bulk put starting at spec ``first``: derived
    from the caller's ``rid`` (at most 64 characters, like any request id)."""
    tail = f"~{first}"
    if len(rid) + len(tail) <= 64:
        return rid + tail
    return hashlib.sha256(rid.encode()).hexdigest()[:64 - len(tail)] + tail


def tag_warnings(specs: list[tuple[str, tuple[str, ...]]],
                 tagsets: tuple[frozenset[str], ...] | None) -> dict[str, list[str]]:
    """Job id -> the warnings of a put of it: a job whose tags no member has is put (a
    node with them may join later), but its runs cannot be placed until then."""
    out: dict[str, list[str]] = {}
    for job_id, tags in specs:
        why = members.unplaceable(tags, tagsets)
        if why is not None:
            text = why.partition(": ")[2]
            out[job_id] = [f"{text}: its runs cannot be placed until a node with them "
                           f"joins (they are recorded missed, unplaceable)"]
    return out


def _tags_of(specs: list[dict[str, Any]]) -> list[tuple[str, tuple[str, ...]]]:
    return [(s["id"], tuple(s.get("tags") or ())) for s in specs]


#: Views built per hold of the state lock (a job's or a run's, a few µs each).
READ_CHUNK = 500


def _resume_input(job_id: str, st: ClusterState) -> tuple[queries.PausedMark | None, bool]:
    """What a resume reads: the paused job's schedule and mark, and whether every member
    applies a version 6 resume."""
    return queries.paused_mark(job_id, st), members.all_have(st, RUN_IDS_FEATURE)


def _job_views(ids: list[str], st: ClusterState) -> list[dict[str, Any]]:
    return [st.jobs[j].to_dict() for j in ids if j in st.jobs]


def _run_views(records: list[RunRecord], st: ClusterState) -> list[dict[str, Any]]:
    return notifier.with_status(st, [r.view() for r in records])


class JobOps:
    """See the module docstring. Every method runs on the node's event loop.

    :param raft: the replica read from.
    :param writes: commits client commands.
    :param reads: the read barrier (a read waits until this node caught up).
    :param limits: the cluster's size limits.
    :param allowed_call_prefixes: the ``call`` targets a spec may name (None: any), read
        at each request: an embedded app adds its own module while the node runs.
    """

    def __init__(self, *, raft: ReplicaPort, writes: ClientWrites, reads: ReadBarrier,
                 limits: Limits,
                 allowed_call_prefixes: Callable[[], tuple[str, ...] | None],
                 read_delay: Callable[[int], float] | None = None) -> None:
        self.raft = raft
        #: How long a read of so many views waits first (readpace.py: a busy leader
        #: paces bulk reads); None: never.
        self.read_delay = read_delay
        self.writes = writes
        self.reads = reads
        self.limits = limits
        self.allowed = allowed_call_prefixes

    def ops(self) -> dict[str, Op]:
        """The API operations served here, by name."""
        return {"put_job": self.put_job, "put_jobs": self.put_jobs, "get_job": self.get_job,
                "list_jobs": self.list_jobs, "delete_job": self.delete_job,
                "pause": self.pause, "resume": self.resume, "trigger": self.trigger,
                "runs": self.runs, "next_fires": self.next_fires,
                "preview_put": self.preview_put}

    async def caught_up(self, args: dict[str, Any], cost: int = 1) -> bool:
        """Wait until a read of about ``cost`` views may be served (its turn on a busy
        leader, readpace.py; then the barrier, reads.py); True when the caller asked for
        a ``stale`` read instead, which the reply then says."""
        stale = args.get("stale", False)
        if not isinstance(stale, bool):
            raise InvalidArgument("stale", "must be a boolean")
        delay = self.read_delay(cost) if self.read_delay is not None else 0.0
        if delay > 0:
            await asyncio.sleep(delay)
        if not stale:
            await self.reads.wait()
        return stale

    def _validated(self, specs: list[Any]) -> list[JobSpec]:
        """Each spec validated; an error names the spec."""
        out = []
        for i, spec in enumerate(specs):
            try:
                out.append(JobSpec.from_spec(spec, allowed_call_prefixes=self.allowed()))
            except InvalidSpec as exc:
                raise InvalidSpec(f"specs[{i}].{exc.field}",
                                  exc.message.partition(": ")[2]) from None
        return out

    def _check_sizes(self, specs: list[Any]) -> None:
        # Per spec, as put_job does: a batch total would let one oversized spec through.
        limit = self.limits.max_spec_bytes
        for i, spec in enumerate(specs):
            if (size := len(packb(spec))) > limit:
                raise LimitExceeded("max_spec_bytes",
                                    f"specs[{i}] is {size} bytes, limit {limit}")

    def _normalized(self, specs: list[Any]) -> list[dict[str, Any]]:
        """Each spec validated and in its canonical form; an error names the spec."""
        return [job.to_spec() for job in self._validated(specs)]

    async def put_job(self, args: dict[str, Any]) -> Any:
        spec = args.get("spec")
        size = len(packb(spec))
        if size > self.limits.max_spec_bytes:
            raise LimitExceeded("max_spec_bytes",
                                f"spec is {size} bytes, limit {self.limits.max_spec_bytes}")
        job = JobSpec.from_spec(spec, allowed_call_prefixes=self.allowed())
        exists, count = self.raft.read(partial(queries.job_count_and, job.id))
        if not exists and count >= self.limits.max_jobs:
            raise LimitExceeded("max_jobs", f"the cluster holds {count} jobs")
        reply = await self.writes.submit(PutJob(spec=job.to_spec(),
                                                max_jobs=self.limits.max_jobs, at=0),
                                         args.get("rid"))
        out = {"job": reply["job"], "version": reply["version"], "created": reply["created"]}
        return self._warned([out], [(job.id, job.tags)])[0]

    def _warned(self, results: list[Any], specs: list[tuple[str, tuple[str, ...]]]) -> Any:
        """``results`` (put replies), each with ``warnings`` when its job has any (a
        copy: a reply may be the one the state machine remembers for its request id)."""
        warned = tag_warnings(specs, self.raft.read(members.member_tags))
        if not warned:
            return results
        return [dict(r, warnings=warned[r["job"]])
                if isinstance(r, dict) and r.get("job") in warned else r for r in results]

    async def put_jobs(self, args: dict[str, Any]) -> Any:
        """Bulk import of up to MAX_PUT_BATCH specs (validated here first): an atomic one
        in one command, else in commands of PUT_CHUNK specs."""
        specs = args.get("specs")
        if not isinstance(specs, list) or not 0 < len(specs) <= MAX_PUT_BATCH:
            raise InvalidArgument("specs", f"must be a list of 1..{MAX_PUT_BATCH} specs")
        self._check_sizes(specs)
        atomic = args.get("atomic", False)
        if not isinstance(atomic, bool):
            raise InvalidArgument("atomic", "must be a boolean")
        normalized = self._normalized(specs)
        if_changed = args.get("if_changed", False)
        if not isinstance(if_changed, bool):
            raise InvalidArgument("if_changed", "must be a boolean")
        max_jobs = self.limits.max_jobs
        if atomic:  # one change, all or nothing: one command whatever its size
            reply = await self.writes.submit(
                PutJobs(specs=tuple(normalized), max_jobs=max_jobs, atomic=True,
                        if_changed=if_changed, at=0, v=put_version(if_changed)),
                args.get("rid"))
            return {"results": self._warned(list(reply["results"]), _tags_of(normalized))}
        # Each spec is put on its own anyway: commit them PUT_CHUNK at a time,
        # PUT_PIPELINE chunks in flight; each chunk's request id derives from the
        # caller's, so a retried bulk put re-applies no chunk.
        rid = check_rid(args.get("rid"))
        starts = list(range(0, len(normalized), PUT_CHUNK))
        twice = len({s["id"] for s in normalized}) < len(normalized)
        window = 1 if twice else PUT_PIPELINE
        results: list[Any] = []
        for w in range(0, len(starts), window):
            replies = await asyncio.gather(*(self.writes.submit(
                PutJobs(specs=tuple(normalized[k:k + PUT_CHUNK]), max_jobs=max_jobs,
                        if_changed=if_changed, at=0, v=put_version(if_changed)),
                rid if len(starts) == 1 else chunk_request_id(rid, k))
                for k in starts[w:w + window]))
            for reply in replies:
                results += reply["results"]
        return {"results": self._warned(results, _tags_of(normalized))}

    async def get_job(self, args: dict[str, Any]) -> Any:
        job_id = job_id_arg(args)
        stale = await self.caught_up(args)
        view = self.raft.read(partial(queries.job_view, job_id))
        return dict(view, stale=True) if stale else view

    async def list_jobs(self, args: dict[str, Any]) -> Any:
        prefix = args.get("prefix") or ""
        limit = args.get("limit", 1000)
        if not isinstance(prefix, str) or isinstance(limit, bool) or not isinstance(limit, int) \
                or not 0 < limit <= 100_000:
            raise InvalidArgument("limit", "prefix must be a string, limit 1..100000")
        stale = await self.caught_up(args, cost=limit)
        # Sorting a million ids takes ~0.3 s: never while holding the lock the Raft
        # thread needs to apply (that would cost an election).
        ids = self.raft.read(queries.job_ids)
        ids = sorted(j for j in ids if j.startswith(prefix))
        page = ids[:limit]
        out: list[dict[str, Any]] = []
        for k in range(0, len(page), READ_CHUNK):
            # A chunk per hold: a page of 100,000 views under one hold would stop the Raft
            # thread for most of a second. Each view is its job as of its own hold.
            out += self.raft.read(functools.partial(_job_views, page[k:k + READ_CHUNK]))
        reply = {"jobs": out, "total": len(ids)}
        return dict(reply, stale=True) if stale else reply

    async def delete_job(self, args: dict[str, Any]) -> Any:
        reply = await self.writes.submit(DeleteJob(job=job_id_arg(args), at=0),
                                         args.get("rid"))
        return {"job": reply["job"], "deleted": True}

    async def pause(self, args: dict[str, Any]) -> Any:
        reply = await self.writes.submit(Pause(job=job_id_arg(args), at=0), args.get("rid"))
        return {"job": reply["job"], "version": reply["version"], "paused": True}

    async def resume(self, args: dict[str, Any]) -> Any:
        job_id = job_id_arg(args)
        catch_up = args.get("catch_up", False)
        if not isinstance(catch_up, bool):
            raise InvalidArgument("catch_up", "must be a boolean")
        # Copy out what the count needs (one hold); count outside the lock. Version 6 (a
        # missed range never starts on a fire time whose run id a kept record holds)
        # once every member applies it.
        paused, v6 = self.raft.read(partial(_resume_input, job_id))
        missed = 0
        if paused is not None:
            # The count is this node's estimate; a v6 resume records its own.
            missed = count_fires(paused[0], paused[1], now_ms())
        v = HELD_IDS_VERSION if v6 else COMMAND_VERSION
        reply = await self.writes.submit(Resume(job=job_id, catch_up=catch_up, missed=missed,
                                                at=0, v=v), args.get("rid"))
        # A v6 resume says what it recorded (none: the job was no longer paused).
        skipped = 0 if catch_up else reply.get("missed", 0 if v6 else missed)
        return {"job": reply["job"], "version": reply["version"], "paused": False,
                "skipped_fire_times": skipped}

    async def trigger(self, args: dict[str, Any]) -> Any:
        force = args.get("force", False)
        if not isinstance(force, bool):
            raise InvalidArgument("force", "must be a boolean")
        reply = await self.writes.submit(Trigger(job=job_id_arg(args), force=force, at=0),
                                         args.get("rid"))
        return {"run_id": reply["run_id"], "state": reply["state"]}

    async def runs(self, args: dict[str, Any]) -> Any:
        job_id = job_id_arg(args)
        limit = args.get("limit", 100)
        if isinstance(limit, bool) or not isinstance(limit, int) or not 0 < limit <= 10_000:
            raise InvalidArgument("limit", "must be 1..10000")
        before = args.get("before")
        if before is not None and (isinstance(before, bool) or not isinstance(before, int)):
            raise InvalidArgument("before", "must be a scheduled time in epoch ms (a page's "
                                            "last scheduled_ms)")
        stale = await self.caught_up(args, cost=limit)
        # Which runs, in one hold (references, no views yet); their views a chunk per
        # hold, so the work under the lock is bounded by size, not by the page asked for.
        records = self.raft.read(partial(queries.run_records, job_id, limit, before))
        views: list[dict[str, Any]] = []
        for k in range(0, len(records), READ_CHUNK):
            views += self.raft.read(functools.partial(_run_views, records[k:k + READ_CHUNK]))
        reply = {"job": job_id, "runs": views}
        return dict(reply, stale=True) if stale else reply

    async def next_fires(self, args: dict[str, Any]) -> Any:
        """The next ``count`` fire times of job ``id`` or of a ``spec`` (not stored)."""
        count = args.get("count", 5)
        if isinstance(count, bool) or not isinstance(count, int) \
                or not 0 < count <= preview.MAX_COUNT:
            raise InvalidArgument("count", f"must be 1..{preview.MAX_COUNT}")
        spec: JobSpec | None
        if args.get("spec") is not None:
            spec = JobSpec.from_spec(args["spec"], allowed_call_prefixes=self.allowed())
        else:
            job_id = job_id_arg(args)
            await self.caught_up(args)
            spec = self.raft.read(partial(queries.job_spec, job_id))
            if spec is None:
                raise UnknownJob(job_id)
        return dict(preview.next_fires(spec.schedule, now_ms(), count, parents=spec.after,
                                       on=spec.on.value), id=spec.id, paused=spec.paused)

    async def preview_put(self, args: dict[str, Any]) -> Any:
        """``job put --dry-run``: validate like put_jobs (an atomic one, a job file's),
        commit nothing, and say per job whether it would be created, updated (which
        fields) or unchanged."""
        specs = args.get("specs")
        if not isinstance(specs, list) or not 0 < len(specs) <= MAX_PUT_BATCH:
            raise InvalidArgument("specs", f"must be a list of 1..{MAX_PUT_BATCH} specs")
        self._check_sizes(specs)
        jobs = self._validated(specs)
        seen: set[str] = set()
        for i, job in enumerate(jobs):
            if job.id in seen:
                raise InvalidSpec(f"specs[{i}].id", f"{job.id!r} appears twice")
            seen.add(job.id)
        await self.caught_up(args)
        specs_now = self.raft.read(partial(queries.job_specs, seen))
        now = now_ms()
        for i, job in enumerate(jobs):
            # The put's own check of a past `at`, against this node's clock and the
            # stored job (its unchanged `at` is no refusal): a put's stamp is the
            # leader's clock, a dry run's the answering node's.
            stored = specs_now.get(job.id)
            try:
                late_at(job, None if stored is None else stored.schedule, now, PAST_AT_VERSION)
            except InvalidSpec as exc:
                raise InvalidSpec(f"specs[{i}].{exc.field}",
                                  exc.message.partition(": ")[2]) from None
        normalized = [job.to_spec() for job in jobs]
        old = {i: spec.to_spec() for i, spec in specs_now.items()}
        return {"results": [preview.diff_specs(old.get(s["id"]), s) for s in normalized],
                "dry_run": True}


__all__ = ["PUT_CHUNK", "PUT_PIPELINE", "JobOps", "chunk_request_id", "job_id_arg",
           "put_version"]
