"""Helpers shared by the state and planner tests."""

from __future__ import annotations

from typing import Any

from raftsched.core.codec import encode_state
from raftsched.core.state import ClusterState


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
        cmd.setdefault("term", st.leader["term"])
        cmd.setdefault("leader", st.leader["node"])
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
    reply = st.apply(cmd)
    assert reply["ok"], (cmd, reply)
    return reply
