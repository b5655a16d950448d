"""The replicated state machine: jobs, runs, claims, nodes.

Pure and deterministic: :meth:`ClusterState.apply` takes one command dict (already
decoded from msgpack) and returns a reply dict; it reads no clock, does no I/O and
never raises — a command that cannot be applied is rejected and changes nothing.
Times come inside the command (epoch ms stamped by the sender).

Claims: every assignment takes a new value of the cluster-wide ``fence`` counter;
``start`` and ``finish`` are accepted only with the run's current fence and from the
node it is assigned to. The per-job high-water mark makes a second assignment of the
same fire time impossible, whichever leader proposes it.

Each accepted change appends an *effect* record (:mod:`raftsched.core.effects`) to
``self.effects``; the node drains
them after apply to wake its worker, write events and count metrics. Effects are
not state: they are never snapshotted.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict, deque
from collections.abc import Callable, Collection
from dataclasses import fields
from typing import Any

from raftsched.core import apply as declarative
from raftsched.core import claims, members, notify
from raftsched.core.claims import MAX_ACTIVE_PER_JOB
from raftsched.core.cmdbase import REFUSAL_REMEMBERED_VERSION
from raftsched.core.commands import (
    MAX_AT_MS,
    MAX_PUT_BATCH,
    PAST_AT_VERSION,
    Command,
    DeleteJob,
    Drain,
    Heartbeat,
    LeaderRecord,
    Pause,
    PutJob,
    PutJobs,
    Read,
    Resume,
    Transfer,
    Trigger,
    command_class,
)
from raftsched.core.durations import format_duration
from raftsched.core.effects import (
    Effect,
    HeartbeatSeen,
    JobPaused,
    JobPut,
    JobRemoved,
    JobResumed,
    LeaderChanged,
    NodeBack,
    NodeDraining,
    NodeJoined,
    TransferAsked,
)
from raftsched.core.errors import (
    Conflict,
    InvalidArgument,
    InvalidSpec,
    LimitExceeded,
    RaftschedError,
    UnknownJob,
)
from raftsched.core.model import ACTIVE_STATES, JobSpec, MissReason, Overlap, RunState, run_id_of
from raftsched.core.records import JobRecord, NodeRecord, RunRecord
from raftsched.core.runtable import RunTable
from raftsched.core.trigger import AtSchedule, latest_fire_at_or_before, next_fire

#: Replies to client commands are kept this long (by count) so a retried request id
#: gets the original answer instead of being applied twice.
DEDUPE_LIMIT = 8192
#: ... and at most this many reply items in all (bulk puts have one per spec).
DEDUPE_ITEMS_LIMIT = 50_000
#: Terminal runs kept per job; older ones are dropped (the history is bounded).
DEFAULT_HISTORY_LIMIT = 100

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
        #: The active runs, their indexes and the fence (changed only through its methods).
        self.table = RunTable()
        self.history: dict[str, deque[RunRecord]] = {}
        self.nodes: dict[str, NodeRecord] = {}
        #: The replicated membership (core/members.py); empty until the first leader
        #: seeds it from the config file.
        self.members: dict[str, members.MemberRecord] = {}
        self.applied = 0
        self.leader: dict[str, Any] = {"node": None, "term": 0, "since_ms": 0, "changes": 0,
                                       "last_ms": 0, "prev_ms": 0}
        self.totals: dict[str, int] = {}
        self.dedupe: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.notify = notify.NotifyState()
        # Derived index (rebuilt on restore, never snapshotted).
        self.due: list[tuple[int, str]] = []
        self.effects: list[Effect] = []
        self._intern: dict[Any, Any] = {}

    # The run table's parts, for readers (views, the planner, snapshots, tests).

    @property
    def runs(self) -> dict[str, RunRecord]:
        """Active runs by id (read; changed through ``self.table``)."""
        return self.table.runs

    @property
    def pending(self) -> dict[str, None]:
        """Ids of the pending runs (read only)."""
        return self.table.pending

    @property
    def by_node(self) -> dict[str, set[str]]:
        """Node id -> ids of the runs holding a claim on it (read only)."""
        return self.table.by_node

    @property
    def fence(self) -> int:
        """The last fence handed out."""
        return self.table.fence

    @fence.setter
    def fence(self, value: int) -> None:  # a snapshot restore only
        self.table.fence = value

    # ------------------------------------------------------------------ apply

    def apply(self, cmd: Any, entry_term: int | None = None, *,
              parsed: Command | RaftschedError | None = None) -> dict[str, Any]:
        """Apply one command (a :class:`~raftsched.core.commands.Command` or its decoded
        map); never raises. Returns ``{"ok": True, ...}`` or
        ``{"ok": False, "error": {code, message}}``.

        ``entry_term`` is the Raft term of the log entry holding the command (the same
        on every replica). A leader-only command is applied only if it was proposed in
        that very term: a log entry of term T is appended by T's leader alone, so a
        command a deposed leader proposed (and pysyncobj forwarded to the new leader,
        which appended it in its own term) is refused.

        ``parsed`` is ``commands.from_wire(cmd)`` (or the error it raised) computed by a
        caller outside the state lock: a plan of 20,000 items takes ~40 ms to read."""
        self.applied += 1
        try:
            if isinstance(cmd, Command):
                cmd, parsed = dict(cmd.to_wire(), v=cmd.v), cmd
            cls = command_class(cmd)
            op, handler = cls.OP, _HANDLERS[cls.OP]
            at = cmd.get("at")
            if isinstance(at, bool) or not isinstance(at, int) or not 0 <= at < MAX_AT_MS:
                raise InvalidArgument("at", "must be epoch milliseconds before year 10000")
            if op in LEADER_ONLY:
                _check_proposer(cmd, op, entry_term)
            rid = cmd.get("rid")
            if rid is not None:
                if not isinstance(rid, str) or len(rid) > 64:
                    raise InvalidArgument("rid", "must be a short string")
                seen = self.dedupe.get(rid)
                if seen is not None:
                    return dict(seen, duplicate=True)
            if parsed is None:
                parsed = cls.from_wire(cmd)
            elif isinstance(parsed, RaftschedError):
                raise parsed
            try:
                reply = handler(self, parsed)
            except RaftschedError as exc:
                reply = {"ok": False, "error": exc.to_wire()}
                if rid is not None and parsed.v >= REFUSAL_REMEMBERED_VERSION:
                    # A copy of this request still in flight (a node's retry, a forward
                    # over a slow link) may commit after the client heard this refusal
                    # and went on: it must get the same answer, not be applied against
                    # a state the client has changed since (a late ``delete`` of a job
                    # absent then would delete the job put since).
                    self._remember(rid, reply)
                return reply
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

    def _put_job(self, cmd: PutJob) -> dict[str, Any]:
        return self._put_one(cmd.spec, cmd.max_jobs, cmd.at, cmd.v)

    def _put_one(self, raw: Any, max_jobs: int | None, at: int, v: int,
                 if_changed: bool = False) -> dict[str, Any]:
        return self._put_spec(JobSpec.from_spec(raw, allowed_call_prefixes=None), max_jobs, at,
                              v, if_changed)

    def _put_spec(self, spec: JobSpec, max_jobs: int | None, at: int,
                  v: int, if_changed: bool = False) -> dict[str, Any]:
        """Put an already validated spec (``apply`` validated it while planning);
        ``if_changed``: a spec equal to the stored one (paused aside) is no new version."""
        spec = self._interned(spec)
        rec = self.jobs.get(spec.id)
        late_at = _late_one_shot(spec, rec, at, v)
        if rec is None:
            if max_jobs is not None and len(self.jobs) >= max_jobs:
                raise LimitExceeded("max_jobs", f"the cluster holds {len(self.jobs)} jobs")
            rec = JobRecord(spec, version=1, created_ms=at, updated_ms=at, hwm_ms=at,
                            next_ms=None)
            self.jobs[spec.id] = rec
            created = True
        else:
            if if_changed and _replace_paused(spec, rec.spec.paused) == rec.spec:
                # A declaration (each app instance declares its jobs at start): the same
                # definition again is not a new version, also when instances race.
                return {"ok": True, "job": spec.id, "version": rec.version, "created": False,
                        "changed": False}
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
        if late_at is not None:
            # An `at` up to its grace in the past fires now, late, as any late run does.
            rec.hwm_ms = late_at - 1
        self.set_next(rec, next_fire(spec.schedule, rec.hwm_ms))
        self.effects.append(JobPut(spec.id, rec.version, created))
        return {"ok": True, "job": spec.id, "version": rec.version, "created": created}

    def _put_jobs(self, cmd: PutJobs) -> dict[str, Any]:
        """Bulk import: each spec is put on its own (one bad spec refuses only itself),
        or with ``atomic`` all of them or none (a job file is one change)."""
        if cmd.atomic:
            self._check_all(cmd.specs, cmd.max_jobs, cmd.at, cmd.v)
        results: list[dict[str, Any]] = []
        for spec in cmd.specs:
            try:
                reply = self._put_one(spec, cmd.max_jobs, cmd.at, cmd.v, cmd.if_changed)
                results.append({"ok": True, "job": reply["job"], "version": reply["version"],
                                "created": reply["created"],
                                "changed": reply.get("changed", True)})
            except RaftschedError as exc:
                results.append({"ok": False, "error": exc.to_wire()})
        return {"ok": True, "results": results}

    def _check_all(self, specs: tuple[Any, ...], max_jobs: int | None, at: int,
                   v: int) -> None:
        """Raise (changing nothing) unless every spec of an atomic put would be accepted:
        each valid, no id twice, and the new ones within ``max_jobs``. What ``_put_job``
        can refuse is exactly this, so after it the puts cannot fail half-way."""
        seen: set[str] = set()
        new = 0
        for i, raw in enumerate(specs):
            try:
                spec = JobSpec.from_spec(raw, allowed_call_prefixes=None)
            except InvalidSpec as exc:
                raise InvalidSpec(f"specs[{i}].{exc.field}",
                                  exc.message.partition(": ")[2]) from None
            if spec.id in seen:
                raise InvalidSpec(f"specs[{i}].id", f"{spec.id!r} appears twice")
            try:
                _late_one_shot(spec, self.jobs.get(spec.id), at, v)
            except InvalidSpec as exc:
                raise InvalidSpec(f"specs[{i}].{exc.field}",
                                  exc.message.partition(": ")[2]) from None
            seen.add(spec.id)
            new += spec.id not in self.jobs
        if max_jobs is not None and new and len(self.jobs) + new > max_jobs:
            raise LimitExceeded("max_jobs", f"the cluster holds {len(self.jobs)} jobs; "
                                            f"{new} more would exceed {max_jobs}")

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

    def _delete_job(self, cmd: DeleteJob) -> dict[str, Any]:
        rec, at = self._job(cmd.job), cmd.at
        if cmd.if_done is not None and (rec.version != cmd.if_done or rec.next_ms is not None
                                        or rec.active):
            # The leader's retention of finished one-shot jobs removes only the very
            # version it saw done: a put since, or a run under way, keeps the job.
            raise Conflict(rec.spec.id, "no longer the finished version the leader saw")
        for run_id in list(rec.active):
            claims.end_run(self, self.runs[run_id], at, RunState.cancelled, "job removed",
                           keep_history=False)
        del self.jobs[rec.spec.id]
        self.history.pop(rec.spec.id, None)
        self.effects.append(JobRemoved(rec.spec.id))
        return {"ok": True, "job": rec.spec.id}

    def _pause(self, cmd: Pause) -> dict[str, Any]:
        rec, at = self._job(cmd.job), cmd.at
        if not rec.spec.paused:
            rec.spec = _replace_paused(rec.spec, True)
            rec.version += 1
            rec.updated_ms = at
            # Runs not yet started never start while paused; a started run finishes.
            for run_id in list(rec.active):
                run = self.runs[run_id]
                if run.state != RunState.started.value:
                    claims.end_run(self, run, at, RunState.cancelled, MissReason.paused.value)
            self.effects.append(JobPaused(rec.spec.id))
        return {"ok": True, "job": rec.spec.id, "version": rec.version}

    def _resume(self, cmd: Resume) -> dict[str, Any]:
        rec, at = self._job(cmd.job), cmd.at
        catch_up, count = cmd.catch_up, cmd.missed
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
            self.set_next(rec, next_fire(rec.spec.schedule, rec.hwm_ms))
            self.effects.append(JobResumed(rec.spec.id, catch_up))
        return {"ok": True, "job": rec.spec.id, "version": rec.version}

    def _trigger(self, cmd: Trigger) -> dict[str, Any]:
        rec, at, force = self._job(cmd.job), cmd.at, cmd.force
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

    def _job(self, job_id: str) -> JobRecord:
        rec = self.jobs.get(job_id)
        if rec is None:
            raise UnknownJob(job_id)
        return rec

    def set_next(self, rec: JobRecord, next_ms: int | None) -> None:
        """Set a job's next fire time (and index it for ``due_jobs``)."""
        rec.next_ms = next_ms
        if next_ms is not None:
            heapq.heappush(self.due, (next_ms, rec.spec.id))

    # ------------------------------------------------------------------ nodes

    def _heartbeat(self, cmd: Heartbeat) -> dict[str, Any]:
        node_id, boot, slots, queue, at = cmd.node, cmd.boot, cmd.slots, cmd.queue, cmd.at
        tags, api, pid = cmd.tags, cmd.api, cmd.pid
        if members.is_removed(self, node_id):
            raise Conflict(node_id, "was removed from the cluster; it takes no work")
        rec = self.nodes.get(node_id)
        if rec is None:
            rec = NodeRecord(node_id=node_id, boot_ms=boot, last_hb_ms=at, slots=slots,
                             queue=queue, tags=tuple(sorted(tags)), api=api, pid=pid,
                             features=cmd.features)
            self.nodes[node_id] = rec
            self.effects.append(NodeJoined(node_id))
        else:
            if boot != rec.boot_ms:
                # The node restarted: whatever it had started died with its old process.
                claims.release_node(self, node_id, at, "started", "restarted")
            if not rec.alive:
                self.effects.append(NodeBack(node_id))
            rec.boot_ms, rec.last_hb_ms, rec.slots, rec.queue = boot, at, slots, queue
            rec.tags, rec.api, rec.alive, rec.pid = tuple(sorted(tags)), api, True, pid
            rec.features = cmd.features
        self.effects.append(HeartbeatSeen(node_id, at))
        return {"ok": True}

    def _leader(self, cmd: LeaderRecord) -> dict[str, Any]:
        node_id, term, skew, at = cmd.node, cmd.term, cmd.skew, cmd.at
        lead = self.leader
        if term < lead["term"]:
            raise Conflict("leader", f"term {term} is older than {lead['term']}")
        if term == lead["term"] and lead["node"] not in (None, node_id):
            # One leader per term: a second record for it can only come from a node
            # that was not that term's leader.
            raise Conflict("leader", f"term {term} is led by {lead['node']}")
        if lead["node"] != node_id or lead["term"] != term:
            lead["changes"] += 1
            lead["since_ms"] = at
            # The last time the previous leadership did anything: fire times after it
            # fell due with no leader (the miss detector's reason).
            lead["prev_ms"] = lead["last_ms"]
            self.effects.append(LeaderChanged(node_id, term))
        lead["node"], lead["term"] = node_id, term
        for nid, value in skew.items():
            rec = self.nodes.get(nid)
            if rec is not None and isinstance(value, int) and not isinstance(value, bool):
                rec.skew_ms = value
        return {"ok": True}

    def _read(self, cmd: Read) -> dict[str, Any]:
        """A read barrier (raftsched/node/reads.py): its apply on a node proves that node
        has applied everything committed before it. Changes nothing."""
        return {"ok": True}

    def _drain(self, cmd: Drain) -> dict[str, Any]:
        """An operator drains (or undrains) a node: the leader places nothing new on a
        draining node and hands leadership away from it; its running runs finish."""
        node_id, draining = cmd.node, cmd.draining
        rec = self.nodes.get(node_id)
        if rec is None:
            raise InvalidArgument("node", f"no node {node_id!r} has joined the cluster")
        if rec.draining != draining:
            rec.draining = draining
            self.effects.append(NodeDraining(node_id, draining))
        return {"ok": True, "node": node_id, "draining": draining}

    def _transfer(self, cmd: Transfer) -> dict[str, Any]:
        """Ask the leader (whichever it is when this applies) to hand leadership to
        ``to`` (a node id) or, when ``to`` is None, to the most caught-up peer."""
        to = cmd.to
        if to is not None and to not in self.nodes:
            raise InvalidArgument("to", "must be the id of a node of the cluster, or null")
        if to is not None and (self.nodes[to].draining or members.is_removed(self, to)):
            raise Conflict(to, "the node is draining: it would hand leadership away again")
        self.effects.append(TransferAsked(to, self.leader["term"]))
        return {"ok": True, "from": self.leader["node"], "to": to, "term": self.leader["term"]}

    # ------------------------------------------------------------------ reads

    def job_view(self, job_id: str) -> dict[str, Any]:
        rec = self.jobs.get(job_id)
        if rec is None:
            raise UnknownJob(job_id)
        return rec.to_dict()

    def run_views(self, job_id: str, limit: int, before_ms: int | None = None
                  ) -> list[dict[str, Any]]:
        """Newest first: the job's active runs, then its history; with ``before_ms``
        only runs scheduled before it (the next page after a page's last run)."""
        rec = self.jobs.get(job_id)
        if rec is None:
            raise UnknownJob(job_id)
        runs = [self.runs[r] for r in reversed(rec.active)]
        runs.extend(reversed(self.history.get(job_id, ())))
        if before_ms is not None:
            runs = [r for r in runs if r.scheduled_ms < before_ms]
        return [r.to_dict() for r in runs[:limit]]

    def due_jobs(self, until_ms: int, limit: int,
                 skip: Collection[str] = ()) -> list[JobRecord]:
        """Jobs whose next fire time is ``<= until_ms`` (at most ``limit``), oldest first,
        leaving out the jobs in ``skip`` (the leader's, planned but not yet committed).
        Drops index entries made stale by later changes; keeps the valid ones. Costs
        O((limit + len(skip) + stale entries) log n): the caller bounds both."""
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
            if entry[1] not in skip:
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
        return self.table.active_on(node_id)

    def take_effects(self) -> list[Effect]:
        out, self.effects = self.effects, []
        return out

    def rebuild_indexes(self) -> None:
        """Recompute the derived indexes after a restore."""
        self.table.rebuild()
        self.due = [(r.next_ms, r.spec.id) for r in self.jobs.values() if r.next_ms is not None]
        heapq.heapify(self.due)


#: Commands only the leader proposes; each carries the proposer's ``term``.
LEADER_ONLY = frozenset({"leader", "plan", "release", "notify_default"})


def _check_proposer(cmd: dict[str, Any], op: str, entry_term: int | None) -> None:
    """A leader-only command must come from the leader of the log entry's term.

    Commands written before version 2 (``v`` 1) predate the check and keep their
    meaning when a journal is replayed."""
    term = cmd.get("term")
    if cmd.get("v") == 1 and term is None:
        return
    if isinstance(term, bool) or not isinstance(term, int) or term < 0:
        raise InvalidArgument("term", "a leader-only command must carry its proposer's term")
    if entry_term is not None and term != entry_term:
        raise Conflict("term", f"{op} proposed in term {term} but appended in term "
                               f"{entry_term}: the proposer no longer leads")


def _late_one_shot(spec: JobSpec, rec: JobRecord | None, at: int, v: int) -> int | None:
    """The instant of a new or changed ``at`` schedule that has already passed at the
    put (it fires at once, late), None otherwise; raise :class:`InvalidSpec` when it
    passed more than ``misfire.grace`` ago (it could never run, so nothing would ever
    record it: every fire time ends in exactly one recorded outcome). Commands before
    ``PAST_AT_VERSION`` keep their meaning on replay (such a job never fired)."""
    sched = spec.schedule
    if (v < PAST_AT_VERSION or not isinstance(sched, AtSchedule)
            or sched.at_ms > at or (rec is not None and rec.spec.schedule == sched)):
        return None
    late_ms = at - sched.at_ms
    if late_ms > spec.misfire.grace_ms:
        raise InvalidSpec("schedule.at", f"is {format_duration(late_ms)} in the past, beyond "
                                         f"misfire.grace ({format_duration(spec.misfire.grace_ms)}"
                                         "): it would never run")
    return sched.at_ms


def _replace_paused(spec: JobSpec, paused: bool) -> JobSpec:
    from dataclasses import replace
    return replace(spec, paused=paused)


_HANDLERS: dict[str, Callable[[ClusterState, Any], dict[str, Any]]] = {
    "put_job": ClusterState._put_job,
    "put_jobs": ClusterState._put_jobs,
    "delete_job": ClusterState._delete_job,
    "pause": ClusterState._pause,
    "resume": ClusterState._resume,
    "trigger": ClusterState._trigger,
    "heartbeat": ClusterState._heartbeat,
    "leader": ClusterState._leader,
    "read": ClusterState._read,
    "drain": ClusterState._drain,
    "transfer": ClusterState._transfer,
    "apply": declarative.apply_apply,
    "notified": notify.apply_notified,
    "notify_default": notify.apply_default,
    "member": members.apply_member,
    "plan": claims.apply_plan,
    "start": claims.apply_start,
    "finish": claims.apply_finish,
    "release": claims.apply_release,
}

__all__ = ["MAX_AT_MS", "MAX_PUT_BATCH", "ClusterState", "InvalidSpec"]
