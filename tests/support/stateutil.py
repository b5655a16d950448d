"""Helpers shared by the state and planner tests: applying commands that must be
accepted (:func:`ok`) or refused whole (:func:`err`), and the commands as the state
tests write them (a job, a heartbeat, a plan, a start, a finish)."""

from __future__ import annotations

from typing import Any

from raftsched.core.codec import encode_state
from raftsched.core.machine import ClusterState


def state_bytes(st: ClusterState) -> bytes:
    """The state's snapshot bytes, without the applied-command counter (which every
    command, also a refused one, advances)."""
    applied, st.applied = st.applied, 0
    try:
        return encode_state(st)
    finally:
        st.applied = applied


def hist(st: ClusterState, job: str) -> list[Any]:
    """The job's history (the state creates it on first use)."""
    return list(st.history.get(job, ()))


def from_leader(st: ClusterState, cmd: Any) -> Any:
    """A plan or release as the current leader proposes it: its term and node filled in
    from the state's leadership record where the test did not set them (a typed command
    has them)."""
    if isinstance(cmd, dict) and cmd.get("op") in ("plan", "release"):
        cmd = dict(cmd)
        cmd.setdefault("term", st.leader.term)
        cmd.setdefault("leader", st.leader.node)
    return cmd


def forget_refusal(st: ClusterState, cmd: Any, reply: dict[str, Any]) -> None:
    """Drop the refusal ``st`` remembered under ``cmd``'s request id (a v2+ refusal is
    remembered so a late copy of the request changes nothing; apart from that reply a
    refused command changes nothing, which the caller then checks)."""
    rid = cmd.get("rid") if isinstance(cmd, dict) else getattr(cmd, "rid", None)
    if isinstance(rid, str) and st.dedupe.get(rid) == reply:
        del st.dedupe[rid]


def ok(st: ClusterState, cmd: Any) -> dict[str, Any]:
    """Apply ``cmd`` (a plan or release from the current leader unless it says
    otherwise), which must be accepted."""
    cmd = from_leader(st, cmd)
    reply = st.apply_map(cmd)
    assert reply["ok"], (cmd, reply)
    return reply


# ------------------------------------------------- commands as the state tests write them

S = 1000
T0 = 20_000 * 86_400 * S  # midnight UTC: a fire time of every schedule used here


def err(st: ClusterState, cmd: Any, code: str | None = None) -> dict[str, Any]:
    """Apply a command that must be rejected whole, and check it changed nothing."""
    before = encode_state(st)
    applied = st.applied
    reply = st.apply_map(cmd)
    assert reply["ok"] is False, (cmd, reply)
    assert set(reply["error"]) == {"code", "message"}
    if code is not None:
        assert reply["error"]["code"] == code, reply
    assert st.applied == applied + 1
    remembered = dict(st.dedupe)
    forget_refusal(st, cmd, reply)
    st.applied = applied
    assert encode_state(st) == before, cmd
    st.applied = applied + 1
    st.dedupe.clear()
    st.dedupe.update(remembered)
    return reply


def spec(job: str = "j", **over: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"id": job, "schedule": {"every": "10s"}, "command": ["true"]}
    out.update(over)
    return out


def put(st: ClusterState, job: str = "j", at: int = T0 - 5 * S, **over: Any) -> dict[str, Any]:
    return ok(st, {"op": "put_job", "at": at, "spec": spec(job, **over)})


def hb(st: ClusterState, node: str, at: int = T0 - 5 * S, boot: int = 1, slots: int = 4,
       queue: int = 0, tags: list[str] | None = None) -> None:
    ok(st, {"op": "heartbeat", "at": at, "node": node, "boot": boot, "slots": slots,
            "queue": queue, "tags": tags or [], "api": f"{node}:1"})


def run_fire(st: ClusterState, job: str, sched: int, node: str | None = "n1",
             term: int = 1, at: int | None = None, queued: bool = False) -> dict[str, Any]:
    return ok(st, {"op": "plan", "at": sched if at is None else at, "term": term,
                   "fires": [["run", job, sched, node, queued]]})


def place(st: ClusterState, run_id: str, node: str, at: int, term: int = 1) -> dict[str, Any]:
    return ok(st, {"op": "plan", "at": at, "term": term, "place": [[run_id, node]]})


def start(st: ClusterState, node: str, run_id: str, fence: int, at: int) -> list[Any]:
    return ok(st, {"op": "start", "at": at, "node": node, "items": [[run_id, fence]]})[
        "results"]


def finish(st: ClusterState, node: str, run_id: str, fence: int, at: int,
           outcome: str = "succeeded", code: int | None = 0, tail: str = "",
           reason: str = "") -> list[Any]:
    return ok(st, {"op": "finish", "at": at, "node": node,
                   "items": [[run_id, fence, outcome, code, tail, reason]]})["results"]


def base(nodes: tuple[str, ...] = ("n1", "n2")) -> ClusterState:
    st = ClusterState()
    ok(st, {"op": "leader", "at": T0 - 10 * S, "node": "n1", "term": 1})
    for n in nodes:
        hb(st, n)
    return st


def check_indexes(st: ClusterState) -> None:
    by_node: dict[str, set[str]] = {}
    for rid, run in st.runs.items():
        assert run.run_id == rid
        assert run.state in ("pending", "queued", "assigned", "started")
        if run.state in ("assigned", "started"):
            by_node.setdefault(run.node, set()).add(rid)
        assert rid in st.jobs[run.job_id].active
    assert {n: s for n, s in st.by_node.items() if s} == by_node
    assert set(st.pending) == {r for r, run in st.runs.items() if run.state == "pending"}
    for job, rec in st.jobs.items():
        assert len(rec.active) == len(set(rec.active))
        assert all(st.runs[r].job_id == job for r in rec.active)


def two_runs(st: ClusterState, lost: str = "retry") -> tuple[str, str]:
    """Job ``j`` with two runs on n1: the first started, the second assigned."""
    put(st, "j", overlap="allow", on_node_lost=lost)
    run_fire(st, "j", T0)
    run_fire(st, "j", T0 + 10 * S)
    a, b = f"j@{T0}", f"j@{T0 + 10 * S}"
    start(st, "n1", a, st.runs[a].fence, T0 + 1)
    return a, b  # a started, b assigned, both on n1
