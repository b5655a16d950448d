"""The replicated state machine: jobs, runs, claims, nodes.

Pure and deterministic: :meth:`ClusterState.apply` takes one command dict (already
decoded from msgpack) and returns a reply dict; it reads no clock, does no I/O and
never raises — a command that cannot be applied is rejected and changes nothing.
Times come inside the command (epoch ms stamped by the sender).

Claims: every assignment takes a new value of the cluster-wide ``fence`` counter;
``start`` and ``finish`` are accepted only with the run's current fence and from the
node it is assigned to. The per-job high-water mark makes a second assignment of the
same fire time impossible, whichever leader proposes it.

Each accepted change appends an *effect* tuple to ``self.effects``; the node drains
them after apply to wake its worker, write events and count metrics. Effects are
not state: they are never snapshotted.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict, deque
from dataclasses import fields
from typing import Any

from raftsched import claims
from raftsched.errors import (
    Conflict,
    InvalidArgument,
    InvalidSpec,
    LimitExceeded,
    RaftschedError,
    UnknownJob,
)
from raftsched.model import ACTIVE_STATES, JobSpec, MissReason, Overlap, RunState, run_id_of
from raftsched.records import JobRecord, NodeRecord, RunRecord
from raftsched.trigger import latest_fire_at_or_before, next_fire

#: Replies to client commands are kept this long (by count) so a retried request id
#: gets the original answer instead of being applied twice.
DEDUPE_LIMIT = 8192
#: ... and at most this many reply items in all (bulk puts have one per spec).
DEDUPE_ITEMS_LIMIT = 50_000
#: Terminal runs kept per job; older ones are dropped (the history is bounded).
DEFAULT_HISTORY_LIMIT = 100
#: Specs per put_jobs command: applying one costs ~45 us per spec on every node, and an
#: apply must stay far below the election timeout (300 ms).
MAX_PUT_BATCH = 1000
#: Times beyond year 9999 are refused: derived times (next fire, backoff) must stay
#: far inside msgpack's 64-bit integers, or snapshots could not be written.
MAX_AT_MS = 253_402_300_800_000
#: A job never has more active runs than this (``overlap = allow`` with slow runs).
MAX_ACTIVE_PER_JOB = 64

_ACTIVE = frozenset(s.value for s in ACTIVE_STATES)
#: The JobSpec fields that ``_interned`` shares between jobs (all hashable, immutable).
_SHARED_SPEC_FIELDS = ("schedule", "command", "call", "timeout_ms", "misfire", "retries",
                       "tags")
_SPEC_DEFAULTS = {f.name: f.default for f in fields(JobSpec) if f.name in _SHARED_SPEC_FIELDS}


class ClusterState:
    """Everything the cluster agrees on. See the module docstring."""

    def __init__(self, *, history_limit: int = DEFAULT_HISTORY_LIMIT) -> None:
        self.history_limit = history_limit
        self.jobs: dict[str, JobRecord] = {}
        self.runs: dict[str, RunRecord] = {}
        self.history: dict[str, deque[RunRecord]] = {}
        self.nodes: dict[str, NodeRecord] = {}
        self.fence = 0
        self.applied = 0
        self.leader: dict[str, Any] = {"node": None, "term": 0, "since_ms": 0, "changes": 0,
                                       "last_ms": 0, "prev_ms": 0}
        self.totals: dict[str, int] = {}
        self.dedupe: OrderedDict[str, dict[str, Any]] = OrderedDict()
        # Derived indexes (rebuilt on restore, never snapshotted).
        self.by_node: dict[str, set[str]] = {}
        self.pending: dict[str, None] = {}
        self.due: list[tuple[int, str]] = []
        self.effects: list[tuple[Any, ...]] = []
        self._intern: dict[Any, Any] = {}

    # ------------------------------------------------------------------ apply

    def apply(self, cmd: Any) -> dict[str, Any]:
        """Apply one command; never raises. Returns ``{"ok": True, ...}`` or
        ``{"ok": False, "error": {code, message}}``."""
        self.applied += 1
        try:
            if not isinstance(cmd, dict):
                raise InvalidArgument("command", "must be a map")
            op = cmd.get("op")
            handler = _HANDLERS.get(op) if isinstance(op, str) else None
            if handler is None:
                raise InvalidArgument("op", f"unknown operation {op!r:.40}")
            at = cmd.get("at")
            if isinstance(at, bool) or not isinstance(at, int) or not 0 <= at < MAX_AT_MS:
                raise InvalidArgument("at", "must be epoch milliseconds before year 10000")
            rid = cmd.get("rid")
            if rid is not None:
                if not isinstance(rid, str) or len(rid) > 64:
                    raise InvalidArgument("rid", "must be a short string")
                seen = self.dedupe.get(rid)
                if seen is not None:
                    return dict(seen, duplicate=True)
            reply = handler(self, cmd, at)
            if rid is not None:
                self._remember(rid, reply)
            return reply
        except RaftschedError as exc:
            return {"ok": False, "error": exc.to_wire()}
        except Exception as exc:  # noqa: BLE001 - apply must never raise (pysyncobj wedges)
            return {"ok": False, "error": {"code": "internal",
                                           "message": f"{type(exc).__name__}: {exc}"[:300]}}

    def _remember(self, rid: str, reply: dict[str, Any]) -> None:
        self.dedupe[rid] = reply
        # Bounded by replies and by their items (a put_jobs reply holds one per spec).
        weight = sum(1 + len(r.get("results", ())) for r in self.dedupe.values()) \
            if len(reply.get("results", ())) else None
        while len(self.dedupe) > DEDUPE_LIMIT or (weight is not None
                                                  and weight > DEDUPE_ITEMS_LIMIT):
            _, old = self.dedupe.popitem(last=False)
            if weight is not None:
                weight -= 1 + len(old.get("results", ()))

    # ------------------------------------------------------------------ jobs

    def _put_job(self, cmd: dict[str, Any], at: int) -> dict[str, Any]:
        spec = self._interned(JobSpec.from_spec(cmd.get("spec"), allowed_call_prefixes=None))
        max_jobs = cmd.get("max_jobs")
        rec = self.jobs.get(spec.id)
        if rec is None:
            if isinstance(max_jobs, int) and len(self.jobs) >= max_jobs:
                raise LimitExceeded("max_jobs", f"the cluster holds {len(self.jobs)} jobs")
            rec = JobRecord(spec, version=1, created_ms=at, updated_ms=at, hwm_ms=at,
                            next_ms=None)
            self.jobs[spec.id] = rec
            created = True
        else:
            if spec.schedule != rec.spec.schedule:
                # A new schedule never fires its own past: start accounting from now.
                rec.hwm_ms = max(rec.hwm_ms, at)
            if spec.paused != rec.spec.paused:
                # Pausing and resuming have their own accounting (cancelled runs, the
                # missed range): an update keeps the current state; use pause/resume.
                spec = _replace_paused(spec, rec.spec.paused)
            rec.spec = spec
            rec.version += 1
            rec.updated_ms = at
            created = False
        self._set_next(rec, next_fire(spec.schedule, rec.hwm_ms))
        self.effects.append(("job_put", spec.id, rec.version, created))
        return {"ok": True, "job": spec.id, "version": rec.version, "created": created}

    def _put_jobs(self, cmd: dict[str, Any], at: int) -> dict[str, Any]:
        """Bulk import: each spec is put on its own (one bad spec refuses only itself)."""
        specs = cmd.get("specs")
        if not isinstance(specs, list) or not 0 < len(specs) <= MAX_PUT_BATCH:
            raise InvalidArgument("specs", f"must be a list of 1..{MAX_PUT_BATCH} specs")
        results: list[dict[str, Any]] = []
        for spec in specs:
            try:
                reply = self._put_job(dict(cmd, spec=spec), at)
                results.append({"ok": True, "job": reply["job"], "version": reply["version"]})
            except RaftschedError as exc:
                results.append({"ok": False, "error": exc.to_wire()})
        return {"ok": True, "results": results}

    def _interned(self, spec: JobSpec) -> JobSpec:
        """Share equal sub-values between jobs: a decoded command holds a fresh copy of
        each (the call string alone is 64 bytes), so a million jobs made from one
        template would hold a million copies. Everything shared here is immutable (or,
        for ``env``, never mutated). Keys are tagged so that values of different
        fields never meet in the cache (a command ``("call", "x")`` is not a call)."""
        from dataclasses import replace
        cache = self._intern
        if len(cache) > 100_000:
            cache.clear()
        changed: dict[str, Any] = {}
        for name in _SHARED_SPEC_FIELDS:
            value = getattr(spec, name)
            if value is None or value is _SPEC_DEFAULTS[name]:
                continue  # already shared (the default objects, (), None)
            found = cache.setdefault((name, value), value)
            if found is not value:
                changed[name] = found
        if spec.env:
            env = cache.setdefault(("env", tuple(spec.env.items())), spec.env)
            if env is not spec.env:
                changed["env"] = env
        return replace(spec, **changed) if changed else spec

    def _delete_job(self, cmd: dict[str, Any], at: int) -> dict[str, Any]:
        rec = self._job(cmd.get("job"))
        for run_id in list(rec.active):
            claims.end_run(self, self.runs[run_id], at, RunState.cancelled, "job removed",
                           keep_history=False)
        del self.jobs[rec.spec.id]
        self.history.pop(rec.spec.id, None)
        self.effects.append(("job_removed", rec.spec.id))
        return {"ok": True, "job": rec.spec.id}

    def _pause(self, cmd: dict[str, Any], at: int) -> dict[str, Any]:
        rec = self._job(cmd.get("job"))
        if not rec.spec.paused:
            rec.spec = _replace_paused(rec.spec, True)
            rec.version += 1
            rec.updated_ms = at
            # Runs not yet started never start while paused; a started run finishes.
            for run_id in list(rec.active):
                run = self.runs[run_id]
                if run.state != RunState.started.value:
                    claims.end_run(self, run, at, RunState.cancelled, MissReason.paused.value)
            self.effects.append(("job_paused", rec.spec.id))
        return {"ok": True, "job": rec.spec.id, "version": rec.version}

    def _resume(self, cmd: dict[str, Any], at: int) -> dict[str, Any]:
        rec = self._job(cmd.get("job"))
        catch_up = cmd.get("catch_up", False)
        count = cmd.get("missed", 0)
        if not isinstance(catch_up, bool):
            raise InvalidArgument("catch_up", "must be a boolean")
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise InvalidArgument("missed", "must be a count")
        if rec.spec.paused:
            rec.spec = _replace_paused(rec.spec, False)
            rec.version += 1
            rec.updated_ms = at
            if not catch_up:
                first = next_fire(rec.spec.schedule, rec.hwm_ms)
                if first is not None and first <= at and count > 0:
                    last = latest_fire_at_or_before(rec.spec.schedule, rec.hwm_ms, at)
                    claims.record_miss(self, rec, first, last or first, count, RunState.missed,
                                       MissReason.paused.value, at)
                rec.hwm_ms = max(rec.hwm_ms, at)
            self._set_next(rec, next_fire(rec.spec.schedule, rec.hwm_ms))
            self.effects.append(("job_resumed", rec.spec.id, catch_up))
        return {"ok": True, "job": rec.spec.id, "version": rec.version}

    def _trigger(self, cmd: dict[str, Any], at: int) -> dict[str, Any]:
        rec = self._job(cmd.get("job"))
        force = cmd.get("force", False)
        if not isinstance(force, bool):
            raise InvalidArgument("force", "must be a boolean")
        if rec.spec.paused and not force:
            raise Conflict(rec.spec.id, "job is paused (use --force to run it anyway)")
        sched = at
        # A manual run id must be new, and must not take the id of a future fire time
        # (the plan creating that fire would overwrite it).
        used = {r.run_id for r in self.history.get(rec.spec.id, ())}
        while (run_id_of(rec.spec.id, sched) in self.runs
               or run_id_of(rec.spec.id, sched) in used
               or (sched > rec.hwm_ms and next_fire(rec.spec.schedule, sched - 1) == sched)):
            sched += 1
        run_id = run_id_of(rec.spec.id, sched)
        running = [self.runs[r] for r in rec.active]
        if running and not force:
            overlap = rec.spec.overlap
            if overlap is Overlap.skip:
                raise Conflict(rec.spec.id, "previous run still active (overlap = skip; "
                                            "use --force)")
            if overlap is Overlap.queue:
                if any(r.state == RunState.queued.value for r in running):
                    raise Conflict(rec.spec.id, "a run is already queued (overlap = queue)")
                run = claims.new_run(self, rec, sched, at, manual=True,
                                     state=RunState.queued)
                return {"ok": True, "run_id": run.run_id, "state": run.state}
            if overlap is Overlap.replace:
                for r in running:
                    claims.end_run(self, r, at, RunState.cancelled, "replaced by trigger")
        if len(rec.active) >= MAX_ACTIVE_PER_JOB:
            raise LimitExceeded("max_active_runs", f"{rec.spec.id} has {len(rec.active)}")
        run = claims.new_run(self, rec, sched, at, manual=True)
        return {"ok": True, "run_id": run_id, "state": run.state}

    def _job(self, job_id: Any) -> JobRecord:
        if not isinstance(job_id, str):
            raise InvalidArgument("job", "must be a job id string")
        rec = self.jobs.get(job_id)
        if rec is None:
            raise UnknownJob(job_id)
        return rec

    def _set_next(self, rec: JobRecord, next_ms: int | None) -> None:
        rec.next_ms = next_ms
        if next_ms is not None:
            heapq.heappush(self.due, (next_ms, rec.spec.id))

    # ------------------------------------------------------------------ nodes

    def _heartbeat(self, cmd: dict[str, Any], at: int) -> dict[str, Any]:
        node_id = _str(cmd, "node")
        boot = _int(cmd, "boot")
        slots = _int(cmd, "slots")
        queue = _int(cmd, "queue")
        tags = cmd.get("tags", [])
        api = cmd.get("api", "")
        if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
            raise InvalidArgument("tags", "must be a list of strings")
        if not isinstance(api, str):
            raise InvalidArgument("api", "must be a string")
        rec = self.nodes.get(node_id)
        if rec is None:
            rec = NodeRecord(node_id=node_id, boot_ms=boot, last_hb_ms=at, slots=slots,
                             queue=queue, tags=tuple(sorted(tags)), api=api)
            self.nodes[node_id] = rec
            self.effects.append(("node_joined", node_id))
        else:
            if boot != rec.boot_ms:
                # The node restarted: whatever it had started died with its old process.
                claims.release_node(self, node_id, at, "started", "restarted")
            if not rec.alive:
                self.effects.append(("node_back", node_id))
            rec.boot_ms, rec.last_hb_ms, rec.slots, rec.queue = boot, at, slots, queue
            rec.tags, rec.api, rec.alive = tuple(sorted(tags)), api, True
        self.effects.append(("hb", node_id, at))
        return {"ok": True}

    def _leader(self, cmd: dict[str, Any], at: int) -> dict[str, Any]:
        node_id = _str(cmd, "node")
        term = _int(cmd, "term")
        skew = cmd.get("skew", {})
        if not isinstance(skew, dict):
            raise InvalidArgument("skew", "must be a map")
        lead = self.leader
        if term < lead["term"]:
            raise Conflict("leader", f"term {term} is older than {lead['term']}")
        if lead["node"] != node_id or lead["term"] != term:
            lead["changes"] += 1
            lead["since_ms"] = at
            # The last time the previous leadership did anything: fire times after it
            # fell due with no leader (the miss detector's reason).
            lead["prev_ms"] = lead["last_ms"]
            self.effects.append(("leader_changed", node_id, term))
        lead["node"], lead["term"] = node_id, term
        for nid, value in skew.items():
            rec = self.nodes.get(nid)
            if rec is not None and isinstance(value, int) and not isinstance(value, bool):
                rec.skew_ms = value
        return {"ok": True}

    # ------------------------------------------------------------------ reads

    def job_view(self, job_id: str) -> dict[str, Any]:
        rec = self.jobs.get(job_id)
        if rec is None:
            raise UnknownJob(job_id)
        return rec.to_dict()

    def run_views(self, job_id: str, limit: int) -> list[dict[str, Any]]:
        """Newest first: the job's active runs, then its history."""
        rec = self.jobs.get(job_id)
        if rec is None:
            raise UnknownJob(job_id)
        out = [self.runs[r].to_dict() for r in reversed(rec.active)]
        out.extend(r.to_dict() for r in reversed(self.history.get(job_id, ())))
        return out[:limit]

    def due_jobs(self, until_ms: int, limit: int) -> list[JobRecord]:
        """Jobs whose next fire time is ``<= until_ms`` (at most ``limit``), oldest first.
        Drops index entries made stale by later changes; keeps the valid ones."""
        out: list[JobRecord] = []
        keep: list[tuple[int, str]] = []
        due = self.due
        while due and due[0][0] <= until_ms and len(out) < limit:
            entry = heapq.heappop(due)
            rec = self.jobs.get(entry[1])
            if rec is None or rec.next_ms != entry[0] or rec.spec.paused:
                continue
            if keep and keep[-1] == entry:
                continue
            keep.append(entry)
            out.append(rec)
        for entry in keep:
            heapq.heappush(due, entry)
        return out

    def next_due_ms(self) -> int | None:
        """The earliest next fire time of any unpaused job (cleaning stale entries)."""
        due = self.due
        while due:
            when, job_id = due[0]
            rec = self.jobs.get(job_id)
            if rec is not None and rec.next_ms == when and not rec.spec.paused:
                return when
            heapq.heappop(due)
        return None

    def active_on(self, node_id: str) -> list[RunRecord]:
        return [self.runs[r] for r in sorted(self.by_node.get(node_id, ()))]

    def take_effects(self) -> list[tuple[Any, ...]]:
        out, self.effects = self.effects, []
        return out

    def rebuild_indexes(self) -> None:
        """Recompute the derived indexes after a restore."""
        self.by_node = {}
        self.pending = {r: None for r, run in self.runs.items() if run.state == "pending"}
        for run in self.runs.values():
            if run.node is not None and run.state in (RunState.assigned.value,
                                                      RunState.started.value):
                self.by_node.setdefault(run.node, set()).add(run.run_id)
        self.due = [(r.next_ms, r.spec.id) for r in self.jobs.values() if r.next_ms is not None]
        heapq.heapify(self.due)


def _replace_paused(spec: JobSpec, paused: bool) -> JobSpec:
    from dataclasses import replace
    return replace(spec, paused=paused)


def _str(cmd: dict[str, Any], key: str) -> str:
    value = cmd.get(key)
    if not isinstance(value, str) or not value or len(value) > 256:
        raise InvalidArgument(key, "must be a non-empty string")
    return value


def _int(cmd: dict[str, Any], key: str) -> int:
    value = cmd.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidArgument(key, "must be a non-negative integer")
    return value


_HANDLERS = {
    "put_job": ClusterState._put_job,
    "put_jobs": ClusterState._put_jobs,
    "delete_job": ClusterState._delete_job,
    "pause": ClusterState._pause,
    "resume": ClusterState._resume,
    "trigger": ClusterState._trigger,
    "heartbeat": ClusterState._heartbeat,
    "leader": ClusterState._leader,
    "plan": claims.apply_plan,
    "start": claims.apply_start,
    "finish": claims.apply_finish,
    "release": claims.apply_release,
}

__all__ = ["ClusterState", "InvalidSpec"]
