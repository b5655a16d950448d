"""Named reads of the replicated state: what the node's parts ask of it.

A node reads the state only under its lock (``raft.read(query)``), so each query here
is a pure function of the state, quick (no scan grows with history), and returns
copies or immutable values, never a live record another thread may change. A query
that takes arguments takes them first and the state last, so a caller binds them with
``functools.partial(query, arg)``. Results of more than one value are named tuples.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from raftsched.core.records import ACTIVE, MemberRecord, stored_spec

if TYPE_CHECKING:
    from raftsched.core.model import JobSpec
    from raftsched.core.notifydata import NotifySpec
    from raftsched.core.records import RunRecord
    from raftsched.core.state import StateData
    from raftsched.core.trigger import Schedule


class JobVersion(NamedTuple):
    """A job id and the version it had when read."""

    job: str
    """The job id."""
    version: int
    """Its version then (a delete ``if_done`` of it refuses a job changed since)."""


class SpecVersion(NamedTuple):
    """A job's spec and its version, read together."""

    spec: JobSpec
    """The spec."""
    version: int
    """Its version."""


class JobCount(NamedTuple):
    """Whether a job exists, and how many there are (a put's limit check)."""

    exists: bool
    """The job exists."""
    jobs: int
    """Jobs in the cluster."""


class NodeHold(NamedTuple):
    """What a node holds and whether the cluster counts it alive (a drain waits on it)."""

    held: int
    """Active runs assigned to or started on it."""
    alive: bool
    """Its heartbeats are current."""


class MemberState(NamedTuple):
    """A member as a removal checks it."""

    record: MemberRecord | None
    """A copy of its member record (None: not a member)."""
    active_members: int
    """Members not removed, in the whole cluster."""
    alive: bool
    """Its heartbeats are current."""
    draining: bool
    """It is draining."""


class StatusView(NamedTuple):
    """What ``status`` reports of the replicated state, read in one hold of the lock."""

    nodes: list[dict[str, Any]]
    """Every node record as a map, by id, with ``inflight`` (its active runs),
    ``last_seen_ms`` and ``removed`` (no longer a member)."""
    leader: dict[str, Any]
    """The leadership record's map."""
    jobs: int
    """Jobs."""
    active: int
    """Active runs."""
    totals: dict[str, int]
    """Runs ended, by outcome, since the cluster began."""
    applied: int
    """Commands applied."""
    notify: dict[str, Any]
    """The default notification (``default``) and deliveries pending (``pending``)."""
    next_due_ms: int | None
    """The earliest next fire time of any job."""


class LoopView(NamedTuple):
    """What the leader loop needs to choose how long to sleep."""

    next_due_ms: int | None
    """The earliest next fire time of any unpaused job."""
    active: int
    """Runs not yet ended (pending, queued, assigned or started)."""
    instants: dict[int, int] | None = None
    """Fire time -> jobs due then and not yet planned, for the fire times by the time
    asked (None: not asked): how big the coming instants are."""


class PausedMark(NamedTuple):
    """A paused job's schedule and high-water mark (what resume's count needs)."""

    schedule: Schedule
    """Its schedule."""
    hwm_ms: int
    """The last fire time it accounted for."""


# ---------------------------------------------------------------- jobs

def job_ids(st: StateData) -> list[str]:
    """Every job id."""
    return list(st.jobs)


def job_count(st: StateData) -> int:
    """How many jobs there are."""
    return len(st.jobs)


def job_count_and(job_id: str, st: StateData) -> JobCount:
    """Whether ``job_id`` exists, and the job count."""
    return JobCount(job_id in st.jobs, len(st.jobs))


def job_spec(job_id: str, st: StateData) -> JobSpec | None:
    """``job_id``'s spec (None: no such job)."""
    rec = st.jobs.get(job_id)
    return None if rec is None else rec.spec


def job_specs(job_ids: Any, st: StateData) -> dict[str, JobSpec]:
    """The specs of those of ``job_ids`` that exist."""
    jobs = st.jobs
    return {j: jobs[j].spec for j in job_ids if j in jobs}


def spec_version(job_id: str, st: StateData) -> SpecVersion | None:
    """``job_id``'s spec and version (None: no such job)."""
    rec = st.jobs.get(job_id)
    return None if rec is None else SpecVersion(rec.spec, rec.version)


def spec_versions(job_ids: Any, st: StateData) -> dict[str, SpecVersion]:
    """Spec and version of those of ``job_ids`` that exist."""
    jobs = st.jobs
    return {j: SpecVersion(jobs[j].spec, jobs[j].version) for j in job_ids if j in jobs}


def job_view(job_id: str, st: StateData) -> dict[str, Any]:
    """``job_id`` as ``job show`` prints it (:class:`UnknownJob` if absent)."""
    return st.job_view(job_id)


def run_records(job_id: str, limit: int, before_ms: int | None,
                st: StateData) -> list[RunRecord]:
    """``job_id``'s runs, newest first (live records: view them under the same lock)."""
    return st.run_records(job_id, limit, before_ms)


def paused_mark(job_id: str, st: StateData) -> PausedMark | None:
    """A paused job's schedule and mark; None if it is absent or not paused."""
    rec = st.jobs.get(job_id)
    return None if rec is None or not rec.spec.paused else PausedMark(rec.spec.schedule,
                                                                       rec.hwm_ms)


def done_jobs(cutoff_ms: int, st: StateData) -> list[JobVersion]:
    """Jobs with nothing left to run (no next fire time, no active run, no dependency)
    whose last activity is at or before ``cutoff_ms``: the leader removes them."""
    # The stored spec: a scan of the whole table makes no job's own copy.
    return [JobVersion(rec.job_id, rec.version) for rec in st.jobs.values()
            if rec.next_ms is None and not rec.active
            and (rec.last[3] if rec.last else rec.updated_ms) <= cutoff_ms
            and not stored_spec(rec).after]


# ---------------------------------------------------------------- nodes and members

def alive_nodes(st: StateData) -> list[str]:
    """The nodes whose heartbeats are current."""
    return [n for n, rec in st.nodes.items() if rec.alive]


def node_beat(node_id: str, st: StateData) -> tuple[int, bool]:
    """(runs ``node_id`` holds, whether the cluster knows it and counts it dead): what
    the leader reads as it sees a heartbeat of the node applied."""
    rec = st.nodes.get(node_id)
    return len(st.by_node.get(node_id, ())), rec is not None and not rec.alive


def node_incarnation(node_id: str, st: StateData) -> tuple[int, bool] | None:
    """(boot of ``node_id``'s newest committed heartbeat, whether the cluster counts it
    alive); None: an unknown node."""
    rec = st.nodes.get(node_id)
    return None if rec is None else (rec.boot_ms, bool(rec.alive))


def node_hold(node_id: str, st: StateData) -> NodeHold:
    """What ``node_id`` holds and whether it is alive."""
    rec = st.nodes.get(node_id)
    return NodeHold(len(st.by_node.get(node_id, ())), rec is not None and rec.alive)


def node_api(node_id: str, st: StateData) -> str | None:
    """``node_id``'s API address as its heartbeats give it (None: unknown node)."""
    rec = st.nodes.get(node_id)
    return None if rec is None else rec.api


def seeded(st: StateData) -> bool:
    """The replicated membership exists (a first leader seeded it)."""
    return bool(st.members)


def members(st: StateData) -> list[MemberRecord]:
    """Copies of every member record (removed ones too)."""
    return [MemberRecord.from_row(m.to_row()) for m in st.members.values()]


def member_rows(st: StateData) -> list[dict[str, Any]]:
    """Every member as a map, by node id."""
    return [m.to_dict() for _, m in sorted(st.members.items())]


def member_ids_by_raft(st: StateData) -> dict[str, str]:
    """Raft address -> node id of every member."""
    return {m.raft: m.node_id for m in st.members.values()}


def active_member_count(st: StateData) -> int:
    """Members not removed."""
    return sum(m.status == ACTIVE for m in st.members.values())


def active_member_apis(st: StateData) -> list[str]:
    """The API addresses of the members not removed."""
    return [m.api for m in st.members.values() if m.status == ACTIVE]


def member_state(node_id: str, st: StateData) -> MemberState:
    """``node_id`` as a removal checks it."""
    m, rec = st.members.get(node_id), st.nodes.get(node_id)
    return MemberState(None if m is None else MemberRecord.from_row(m.to_row()),
                       active_member_count(st), rec is not None and rec.alive,
                       rec is not None and rec.draining)


def removed_members(st: StateData) -> list[str]:
    """The ids of removed members, sorted."""
    return sorted(m.node_id for m in st.members.values() if m.status != ACTIVE)


def loop_view(st: StateData, count_by_ms: int | None = None, cap: int = 0) -> LoopView:
    """The next fire time and the active runs, in one read; and, when ``count_by_ms``
    is given, how many jobs are due at each fire time by then (``cap`` at most)."""
    nxt = st.next_due_ms()
    instants = None if count_by_ms is None or nxt is None or nxt > count_by_ms \
        else st.due_counts(count_by_ms, cap)
    return LoopView(nxt, len(st.runs), instants)


def status_view(st: StateData) -> StatusView:
    """The replicated half of ``status``."""
    nodes = []
    for node_id, rec in sorted(st.nodes.items()):
        d = rec.to_dict()
        member = st.members.get(node_id)
        d.update(inflight=len(st.by_node.get(node_id, ())), last_seen_ms=rec.last_hb_ms,
                 removed=member is not None and member.status != ACTIVE)
        nodes.append(d)
    default = st.notify.default
    notify = {"default": default.to_spec() if default else None,
              "pending": len(st.notify.pending)}
    return StatusView(nodes, st.leader.to_row(), len(st.jobs), len(st.runs), dict(st.totals),
                      st.applied, notify, st.next_due_ms())


# ---------------------------------------------------------------- notifications

def notify_default(st: StateData) -> NotifySpec | None:
    """The cluster's default notification (None: none set)."""
    return st.notify.default


__all__ = [
    "JobCount", "JobVersion", "LoopView", "MemberState", "NodeHold", "PausedMark",
    "SpecVersion", "StatusView", "loop_view", "status_view",
    "active_member_apis", "active_member_count", "alive_nodes", "done_jobs", "job_count",
    "job_count_and", "job_ids", "job_spec", "job_specs", "job_view", "member_ids_by_raft",
    "member_rows", "member_state", "members", "node_api", "node_beat", "node_hold",
    "node_incarnation",
    "notify_default", "paused_mark", "removed_members", "run_records", "seeded",
    "spec_version", "spec_versions",
]
