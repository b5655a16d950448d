"""Helpers shared by the state and planner tests."""

from __future__ import annotations

from typing import Any

from raftsched.state import ClusterState


def hist(st: ClusterState, job: str) -> list[Any]:
    """The job's history (the state creates it on first use)."""
    return list(st.history.get(job, ()))


def ok(st: ClusterState, cmd: dict[str, Any]) -> dict[str, Any]:
    """Apply ``cmd``, which must be accepted."""
    reply = st.apply(cmd)
    assert reply["ok"], (cmd, reply)
    return reply
