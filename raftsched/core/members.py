"""Cluster membership as the replicated state knows it.

The cluster TOML only seeds it: the first leader of a new cluster commits the TOML's
members (``member`` op, action ``seed``, applied only while there are none). After
that, ``add`` and ``remove`` commands change it, one node at a time, beside
pysyncobj's own membership entries (which decide the Raft quorum; see
``raftsched/node/service/membership.py`` for the order of the two). A removed id stays
recorded as removed, so a node that comes back under it is told so and is never
given work; ids are not reused.

Pure like the rest of core: no clock, no I/O; every time comes in the command.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from raftsched.core import claims
from raftsched.core.effects import MemberRemoved, MembersChanged
from raftsched.core.errors import Conflict, InvalidArgument
from raftsched.core.items import ReleaseScope
from raftsched.core.model import MissReason
from raftsched.core.records import ACTIVE, REMOVED, MemberRecord

if TYPE_CHECKING:
    from raftsched.core.commands import Member
    from raftsched.core.state import StateData

_ID_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_ADDR_RE = re.compile(r"\S{3,300}")


def _member_fields(item: Any, where: str) -> tuple[str, str, str]:
    if not isinstance(item, dict):
        raise InvalidArgument(where, "must be a map with node, raft and api")
    node_id, raft, api = item.get("node"), item.get("raft"), item.get("api")
    if not isinstance(node_id, str) or not _ID_RE.fullmatch(node_id):
        raise InvalidArgument(f"{where}.node", "must be 1-64 of [A-Za-z0-9_.-]")
    for key, value in (("raft", raft), ("api", api)):
        if not isinstance(value, str) or not _ADDR_RE.fullmatch(value):
            raise InvalidArgument(f"{where}.{key}", 'must be a "host:port" string')
    return node_id, raft, api  # type: ignore[return-value]


def active(st: StateData) -> list[MemberRecord]:
    return [m for _, m in sorted(st.members.items()) if m.status == ACTIVE]


def is_known(st: StateData, node_id: str) -> bool:
    """Whether the state knows ``node_id`` as a node of the cluster: it has sent a
    heartbeat, or it is an active member whose first heartbeat has not committed yet
    (right after a cluster starts)."""
    member = st.members.get(node_id)
    return node_id in st.nodes or (member is not None and member.status == ACTIVE)


def is_removed(st: StateData, node_id: str) -> bool:
    rec = st.members.get(node_id)
    return rec is not None and rec.status == REMOVED


def all_have(st: StateData, feature: str) -> bool:
    """Whether every member's last heartbeat listed ``feature`` (its release knows it).
    The members are the replicated membership's, else every node that has sent a
    heartbeat; a member that has sent none yet is not waited for."""
    nodes = st.nodes
    ids = [m.node_id for m in st.members.values() if m.status != REMOVED] \
        if st.members else list(nodes)
    return all(feature in (nodes[n].features or ()) for n in ids if n in nodes)


def member_tags(st: StateData) -> tuple[frozenset[str], ...] | None:
    """The tags of every member, as its heartbeats declared them; None while an active
    member has sent none yet: its tags are unknown, so nothing may be called
    unplaceable for want of them."""
    known = {n: frozenset(rec.tags) for n, rec in st.nodes.items() if not is_removed(st, n)}
    if any(m.node_id not in known for m in active(st)):
        return None
    return tuple(known[n] for n in sorted(known))


def unplaceable(tags: tuple[str, ...], tagsets: tuple[frozenset[str], ...] | None) -> str | None:
    """``unplaceable: no member has tags [gpu]`` when no member (of ``tagsets``, from
    :func:`member_tags`) has all of ``tags``: no run of such a job can be placed until a
    node with them joins. None when one has them, or when that is not known."""
    if not tags or tagsets is None or any(t.issuperset(tags) for t in tagsets):
        return None
    return f"{MissReason.unplaceable.value}: no member has tags [{', '.join(tags)}]"


def apply_member(st: StateData, cmd: Member) -> dict[str, Any]:
    action, at = cmd.action, cmd.at
    if action == "seed":
        items = list(cmd.members)
        if not items:
            raise InvalidArgument("members", "must be a non-empty list")
        seeds = [_member_fields(m, f"members[{i}]") for i, m in enumerate(items)]
        if st.members:
            return {"ok": True, "seeded": False, "members": len(st.members)}
        for node_id, raft, api in seeds:
            st.members[node_id] = MemberRecord(node_id=node_id, raft=raft, api=api,
                                               status=ACTIVE, since_ms=at)
        st.effects.append(MembersChanged())
        return {"ok": True, "seeded": True, "members": len(st.members)}
    if action not in ("add", "remove"):
        raise InvalidArgument("action", "must be seed, add or remove")
    node_id, raft, api = _member_fields({"node": cmd.node, "raft": cmd.raft, "api": cmd.api},
                                        "member")
    if not st.members:
        raise Conflict("membership", "not seeded yet (a new cluster's first leader seeds "
                                     "it from the config file); try again")
    rec = st.members.get(node_id)
    if action == "add":
        return _add(st, rec, node_id, raft, api, at)
    if rec is None or rec.status != ACTIVE:
        what = "was already removed" if rec is not None else "is not a member"
        raise Conflict(node_id, f"{what}; members: {', '.join(m.node_id for m in active(st))}")
    if len(active(st)) == 1:
        raise Conflict(node_id, "is the last member; a cluster keeps at least one")
    rec.status, rec.since_ms = REMOVED, at
    node = st.nodes.get(node_id)
    if node is not None:
        node.alive, node.draining = False, True
    claims.release_node(st, node_id, at, ReleaseScope.all, "removed from the cluster")
    st.effects.append(MembersChanged())
    st.effects.append(MemberRemoved(node_id))
    return {"ok": True, "node": node_id, "status": REMOVED, "raft": rec.raft, "api": rec.api}


def _add(st: StateData, rec: MemberRecord | None, node_id: str, raft: str, api: str,
         at: int) -> dict[str, Any]:
    if rec is not None:
        if rec.status == REMOVED:
            raise Conflict(node_id, "was removed from this cluster; ids are not reused "
                                    "(give the new node another id)")
        if (rec.raft, rec.api) != (raft, api):
            raise Conflict(node_id, f"is already a member at raft {rec.raft}, api {rec.api}")
        return {"ok": True, "node": node_id, "status": ACTIVE, "raft": raft, "api": api}
    for other in st.members.values():
        if other.status == ACTIVE and raft == other.raft:
            raise Conflict(node_id, f"raft address {raft} is member {other.node_id}'s")
        if other.status == ACTIVE and api == other.api:
            raise Conflict(node_id, f"api address {api} is member {other.node_id}'s")
    st.members[node_id] = MemberRecord(node_id=node_id, raft=raft, api=api, status=ACTIVE,
                                       since_ms=at)
    st.effects.append(MembersChanged())
    return {"ok": True, "node": node_id, "status": ACTIVE, "raft": raft, "api": api}
