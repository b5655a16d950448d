"""``status``: the cluster as this node sees it, with a one-line health summary."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from raftsched.clock import now_ms

if TYPE_CHECKING:
    from raftsched.node import Node


def build_status(node: Node) -> dict[str, Any]:
    """The ``status`` reply (see the README for its fields)."""
    raft = node.raft
    raw = raft.status()
    connected = raft.connected_peers()
    now = now_ms()
    with raft.lock:
        st = raft.state
        nodes = []
        for node_id, rec in sorted(st.nodes.items()):
            addr = next((a for a, n in node.raft_to_id.items() if n == node_id), None)
            conn = True if node_id == node.node_id else bool(connected.get(addr, False))
            d = rec.to_dict()
            d.update(connected=conn, inflight=len(st.by_node.get(node_id, ())),
                     last_seen_ms=rec.last_hb_ms)
            nodes.append(d)
        leader = dict(st.leader)
        jobs = len(st.jobs)
        active = len(st.runs)
        totals = dict(st.totals)
        applied = st.applied
    leader_addr = raft.leader_addr()
    leader_id = node.raft_to_id.get(leader_addr) if leader_addr else None
    alive = sum(1 for n in nodes if n["alive"] and n["connected"])
    configured = len(node.cfg.nodes)
    has_quorum = raft.has_quorum() if configured > 1 else leader_id is not None
    if leader_id is None or not has_quorum:
        health = "down"
        summary = (f"cluster down: no leader seen by {node.node_id} "
                   f"({alive}/{configured} nodes reachable)")
    elif alive < configured:
        health = "degraded"
        summary = (f"cluster degraded: leader {leader_id} (term {raft.term()}), "
                   f"{alive}/{configured} nodes alive, {jobs} jobs, {active} runs active")
    else:
        health = "ok"
        summary = (f"cluster ok: leader {leader_id} (term {raft.term()}), "
                   f"{alive}/{configured} nodes alive, {jobs} jobs, {active} runs active")
    skews = [abs(n["skew_ms"]) for n in nodes if n.get("skew_ms") is not None]
    if skews and max(skews) > 1000:
        summary += f"; clock skew up to {max(skews)} ms"
    worker = node.worker.statistics()
    return {
        "node": node.node_id, "leader": leader_id, "leader_addr": leader_addr,
        "term": raft.term(), "health": health, "summary": summary, "nodes": nodes,
        "jobs": jobs, "active_runs": active, "commit_index": raw.get("commit_idx"),
        "applied": applied, "totals": totals, "now_ms": now,
        "leader_record": leader,
        "worker": {"slots": worker.slots, "busy": worker.busy, "waiting": worker.waiting,
                   "started": worker.started, "rejected_starts": worker.rejected_starts,
                   "shed": worker.shed, "self_fenced": worker.self_fenced},
    }
