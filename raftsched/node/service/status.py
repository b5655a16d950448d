"""``status``: the cluster as this node sees it, with a one-line health summary."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from raftsched.core import backfill, conc, queries
from raftsched.node.config.addressbook import AddressBook
from raftsched.node.observe.clock import now_ms
from raftsched.node.service import membership

if TYPE_CHECKING:
    from raftsched.node.config.config import ClusterConfig
    from raftsched.node.leader.admission import AdmissionStatistics
    from raftsched.node.replica.raft import RaftNode
    from raftsched.node.worker.worker import WorkerStatistics


@dataclass(frozen=True, kw_only=True)
class StatusView:
    """What ``status`` and the quorum check read: built by the node (node.py), which
    passes :meth:`build` to the cluster operations and :meth:`quorum_problem` to the
    client writes."""

    #: The replica read from (the state, and pysyncobj's view of leader and peers).
    raft: RaftNode
    #: This node's cluster config (the member count before the membership is seeded,
    #: and each member's HTTP address).
    cfg: ClusterConfig
    #: This node's id.
    node_id: str
    #: Raft address -> node id; the node updates it in place as members are added.
    raft_to_id: AddressBook
    #: The cluster id of the secret in use now (it changes with a secret rotation).
    cluster_id: Callable[[], str]
    #: This node's worker pool's statistics (called on the event loop).
    worker_statistics: Callable[[], WorkerStatistics]
    #: The leader loop's admission control (None when this node does not lead).
    admission_statistics: Callable[[], AdmissionStatistics | None] = lambda: None

    def build(self) -> dict[str, Any]:
        """The ``status`` reply (see the README for its fields)."""
        raft = self.raft
        raw = raft.status()
        connected = raft.connected_peers()
        now = now_ms()

        nodes, leader, jobs, active, totals, applied, notify, next_due = raft.read(
            queries.status_view)
        heard = self._heard(now)
        for n in nodes:
            addr = self.raft_to_id.raft_of(n["node_id"])
            n["connected"] = True if n["node_id"] == self.node_id else \
                addr is not None and bool(connected.get(addr, False))
            at = heard.get(n["node_id"])
            if at is not None and at > (n.get("last_seen_ms") or 0):
                n["last_seen_ms"] = at
        # Backfills (running and the last finished) and concurrency keys (bounded lists).
        backfills, keys = raft.read(backfill.views), raft.read(conc.key_view)
        commit, applied_index = raw.get("commit_idx"), raw.get("last_applied")
        leader_addr = raft.leader_addr()
        leader_id = self.raft_to_id.get(leader_addr) if leader_addr else None
        alive = sum(1 for n in nodes if n["alive"] and n["connected"] and not n["removed"])
        configured = membership.member_count(raft, self.cfg)
        members = membership.view(raft, self.cfg)
        has_quorum = raft.has_quorum() if configured > 1 else leader_id is not None
        if leader_id is None or not has_quorum:
            # "alive" is the leader's verdict, and without a leader nobody gives one: the
            # replicated one stays as it was when the quorum went (a stopped node "alive"
            # for good). Say what this node sees instead: whom it is connected to.
            for n in nodes:
                n["alive"] = n["connected"]
            health = "down"
            summary = (f"cluster down: no leader seen by {self.node_id} "
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
        if members["joining"]:
            summary += "; this node waits to be added (started with --join)"
        if members["problems"]:
            summary += (f"; membership: {len(members['problems'])} difference(s) to resolve "
                        f"(see below)")
        worker = self.worker_statistics()
        admission = self.admission_statistics()
        return {
            "node": self.node_id, "pid": os.getpid(), "cluster_id": self.cluster_id(),
            "leader": leader_id, "leader_addr": leader_addr,
            "term": raft.term(), "health": health, "summary": summary, "nodes": nodes,
            "jobs": jobs, "active_runs": active, "commit_index": commit,
            # The log index of the last entry applied here (no-op and membership entries
            # count, as in the commit index; ``applied`` counts commands only).
            "applied_index": applied_index,
            "apply_lag": (max(commit - applied_index, 0)
                          if isinstance(commit, int) and isinstance(applied_index, int)
                          else None),
            "applied": applied, "totals": totals, "now_ms": now,
            # The oldest fire time no plan has reached yet (None: no job is due), and
            # how far behind the clock it is: a leader held back by admission control
            # reaches its jobs late; their fire times have no record until it does.
            "next_due_ms": next_due,
            "due_behind_ms": max(now - next_due, 0) if next_due is not None else 0,
            # The leader's admission control (admission.py); None on other nodes.
            "admission": admission.to_dict() if admission is not None else None,
            # Group commit on this node (durable.py): syncs made and what they cost.
            "durability": _durability(self.raft),
            # How this node seals its Raft messages: "aead" once every member opens the
            # AEAD, "fernet" before (raftkeys.py); None without a secret.
            "raft_seal": self.raft.seal(),
            "leader_record": leader, "notify": notify, "membership": members,
            "backfills": backfills, "concurrency": keys,
            # Each member's HTTP API/dashboard address (config; absent: that node serves
            # none).
            "http": {n.id: n.http for n in self.cfg.nodes if n.http is not None},
            # How to reach them: every node serves HTTPS when the cluster has TLS.
            "http_scheme": "https" if self.cfg.tls_cert else "http",
            "worker": {"slots": worker.slots, "busy": worker.busy, "waiting": worker.waiting,
                       "started": worker.started, "rejected_starts": worker.rejected_starts,
                       "shed": worker.shed, "self_fenced": worker.self_fenced},
        }

    def _heard(self, now: int) -> dict[str, int]:
        """Node id -> when this node last heard it (wall ms, its clock): itself now;
        leading, each follower's newest Raft answer; following, its leader's newest
        append. An idle node commits a heartbeat only every ten node timeouts once
        every member reads its Raft contact (leader/contact.py), so its last heartbeat
        alone would look stale."""
        raft = self.raft
        out = {self.node_id: now}
        for addr, age in raft.contact_ages().items():
            node_id = self.raft_to_id.get(addr)
            if node_id is not None:
                out[node_id] = now - int(age * 1000)
        leader_addr = raft.leader_addr()
        leader_id = self.raft_to_id.get(leader_addr) if leader_addr else None
        leader_age = raft.quorum_contact_age()
        if leader_id is not None and leader_id != self.node_id and leader_age is not None:
            out[leader_id] = now - int(leader_age * 1000)
        return out

    def quorum_problem(self) -> str | None:
        """None while this node reaches a quorum (always for a single node); otherwise
        why not, in words an operator can act on (the ``not_ready`` message of reads and
        writes)."""
        configured = membership.member_count(self.raft, self.cfg)
        if configured <= 1 or self.raft.has_quorum():
            return None
        reached = sum(1 for up in self.raft.connected_peers().values() if up)
        return (f"no quorum: node {self.node_id} reaches {reached} of the {configured - 1} "
                f"other nodes; the cluster answers only while {configured // 2 + 1} of its "
                f"{configured} nodes are up and connected")


__all__ = ["StatusView"]


def _durability(raft: Any) -> dict[str, Any]:
    stats = raft.durability_stats()
    return {"mode": stats.mode, "syncs": stats.syncs,
            "sync_ms_total": round(stats.sync_seconds * 1000, 1),
            "sync_ms_max": round(stats.max_sync_seconds * 1000, 3),
            "synced_index": stats.synced_index}
