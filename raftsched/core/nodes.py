"""The node and cluster commands of the state machine: heartbeats, the leader record,
read barriers, drain and leadership transfer.

Handlers the dispatcher (:mod:`raftsched.core.machine`) routes commands to. Every
function here runs inside ``StateData.apply`` — pure, deterministic, time from the
command — and raises :class:`~raftsched.core.errors.RaftschedError` to refuse.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from raftsched.core import claims, members
from raftsched.core.commands import Certify, Drain, Heartbeat, LeaderRecord, Read, Transfer
from raftsched.core.effects import (
    HeartbeatSeen,
    LeaderChanged,
    NodeBack,
    NodeCertified,
    NodeDraining,
    NodeJoined,
    NodeLost,
    TransferAsked,
)
from raftsched.core.errors import Conflict, InvalidArgument
from raftsched.core.items import ReleaseScope
from raftsched.core.records import DEAD_KEPT, NodeRecord

#: The reason every run released by a death certificate records (a contract).
CERTIFIED = "node crashed (certified)"

if TYPE_CHECKING:
    from raftsched.core.state import StateData


def apply_heartbeat(st: StateData, cmd: Heartbeat) -> dict[str, Any]:
    node_id, boot, slots, queue, at = cmd.node, cmd.boot, cmd.slots, cmd.queue, cmd.at
    tags, api, pid = cmd.tags, cmd.api, cmd.pid
    if members.is_removed(st, node_id):
        raise Conflict(node_id, "was removed from the cluster; it takes no work")
    rec = st.nodes.get(node_id)
    if rec is not None and boot in rec.dead:
        # Sent by an incarnation before it died and committed after its certificate:
        # it must not make the node look alive (runs would be placed on a dead process).
        raise Conflict(node_id, f"incarnation {boot} was certified dead")
    if rec is None:
        rec = NodeRecord(node_id=node_id, boot_ms=boot, last_hb_ms=at, slots=slots,
                         queue=queue, tags=tuple(sorted(tags)), api=api, pid=pid,
                         features=cmd.features)
        st.nodes[node_id] = rec
        st.effects.append(NodeJoined(node_id))
    else:
        if boot != rec.boot_ms:
            # The node restarted: whatever it had started died with its old process.
            claims.release_node(st, node_id, at, ReleaseScope.started, "restarted",
                                seen_ms=rec.last_hb_ms)
        if not rec.alive:
            st.effects.append(NodeBack(node_id))
        rec.boot_ms, rec.last_hb_ms, rec.slots, rec.queue = boot, at, slots, queue
        rec.tags, rec.api, rec.alive, rec.pid = tuple(sorted(tags)), api, True, pid
        rec.features = cmd.features
    st.effects.append(HeartbeatSeen(node_id, at))
    return {"ok": True}


def apply_certify(st: StateData, cmd: Certify) -> dict[str, Any]:
    """A death certificate (:class:`~raftsched.core.commands.Certify`): the named
    incarnation is dead and nothing of it runs, so its claims are released now, not
    when its lease has provably ended. Its started runs follow ``on_node_lost`` (a new
    attempt with a new fence, or ``lost`` with :data:`CERTIFIED`), its assigned ones
    are placed again, and the node is lost until a new incarnation heartbeats.

    Only the node's current incarnation (the ``boot`` of its newest committed
    heartbeat) can be certified: a certificate for an older one may never touch the
    runs of the newer. A certificate for an incarnation already certified changes
    nothing (the guard and a restart may both send one)."""
    rec = st.nodes.get(cmd.node)
    if rec is None:
        raise InvalidArgument("node", f"no node {cmd.node!r} has joined the cluster")
    if cmd.boot in rec.dead:
        return {"ok": True, "released": [], "already": True}
    if cmd.boot != rec.boot_ms:
        raise Conflict(cmd.node, f"incarnation {cmd.boot} is not the node's current one "
                                 f"({rec.boot_ms}); a certificate releases nothing of another")
    rec.dead = (*rec.dead, cmd.boot)[-DEAD_KEPT:]
    if cmd.by == "restart":
        # Proved by the node's next incarnation, which lives and heartbeats next: its
        # assigned runs are its to start, and the node is not lost (a leader planning in
        # between would record runs it could place as missed for want of a node).
        released = claims.release_node(st, cmd.node, cmd.at, ReleaseScope.started, CERTIFIED,
                                       text=CERTIFIED)
    else:
        released = claims.release_node(st, cmd.node, cmd.at, ReleaseScope.all, CERTIFIED,
                                       text=CERTIFIED)
        if rec.alive:
            rec.alive = False
            rec.lost_ms = cmd.at
            st.effects.append(NodeLost(cmd.node, CERTIFIED))
    st.effects.append(NodeCertified(cmd.node, cmd.boot, cmd.by, len(released)))
    return {"ok": True, "released": released, "already": False}


def apply_leader(st: StateData, cmd: LeaderRecord) -> dict[str, Any]:
    node_id, term, skew, at = cmd.node, cmd.term, cmd.skew, cmd.at
    lead = st.leader
    if term < lead.term:
        raise Conflict("leader", f"term {term} is older than {lead.term}")
    if term == lead.term and lead.node not in (None, node_id):
        # One leader per term: a second record for it can only come from a node
        # that was not that term's leader.
        raise Conflict("leader", f"term {term} is led by {lead.node}")
    if lead.node != node_id or lead.term != term:
        lead.changes += 1
        lead.since_ms = at
        lead.prev_ms = lead.last_ms
        st.effects.append(LeaderChanged(node_id, term))
    lead.node, lead.term = node_id, term
    for nid, value in skew.items():
        rec = st.nodes.get(nid)
        if rec is not None and isinstance(value, int) and not isinstance(value, bool):
            rec.skew_ms = value
    return {"ok": True}


def apply_read(st: StateData, cmd: Read) -> dict[str, Any]:
    """A read barrier (raftsched/node/replica/reads.py): its apply on a node proves that node
    has applied everything committed before it. Changes nothing."""
    return {"ok": True}


def apply_drain(st: StateData, cmd: Drain) -> dict[str, Any]:
    """An operator drains (or undrains) a node: the leader places nothing new on a
    draining node and hands leadership away from it; its running runs finish."""
    node_id, draining = cmd.node, cmd.draining
    rec = st.nodes.get(node_id)
    if rec is None:
        raise InvalidArgument("node", f"no node {node_id!r} has joined the cluster")
    if rec.draining != draining:
        rec.draining = draining
        st.effects.append(NodeDraining(node_id, draining))
    return {"ok": True, "node": node_id, "draining": draining}


def apply_transfer(st: StateData, cmd: Transfer) -> dict[str, Any]:
    """Ask the leader (whichever it is when this applies) to hand leadership to
    ``to`` (a node id) or, when ``to`` is None, to the most caught-up peer."""
    to = cmd.to
    # An active member counts before its first heartbeat has committed: right after a
    # cluster starts, an operator's transfer to a configured node was refused as unknown.
    if to is not None and not members.is_known(st, to):
        raise InvalidArgument("to", "must be the id of a node of the cluster, or null")
    node = st.nodes.get(to) if to is not None else None
    if to is not None and ((node is not None and node.draining) or members.is_removed(st, to)):
        raise Conflict(to, "the node is draining: it would hand leadership away again")
    st.effects.append(TransferAsked(to, st.leader.term))
    return {"ok": True, "from": st.leader.node, "to": to, "term": st.leader.term}

