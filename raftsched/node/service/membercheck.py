"""Members compare their configs, and say so loudly when they differ.

A node whose config lists a member the others do not know loops elections silently:
pysyncobj drops connections from addresses it does not know, and nothing is logged
(the term reached 21 in 10 s). So each node asks every peer of its config, over the
API with the cluster secret, for the member list it runs with (op ``members``), and
logs an error event ``config.mismatch`` naming the differing members, once per
distinct difference. A peer that refuses our secret is a mismatch too (its secret
differs); a peer that cannot be reached says nothing about configs and is asked again.

Once the replicated membership exists (``cluster add-node``/``remove-node``), files
may differ on purpose: ``status`` compares them with it instead, and this check only
listens for one answer — that the cluster removed this node (pysyncobj drops a removed
node's connections without a word). The node then stops and says so.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from raftsched.core import queries
from raftsched.core.errors import RaftschedError, Unauthenticated
from raftsched.node.observe import events
from raftsched.wire.client import Client

if TYPE_CHECKING:
    from raftsched.node.config.config import ClusterConfig
    from raftsched.node.replica.raft import RaftNode

log = logging.getLogger("raftsched.node")

#: First checks come soon after start; once a peer matched, it is asked again rarely.
RETRY_S = 2.0
RECHECK_S = 60.0
_TIMEOUT_S = 2.0


@dataclass(frozen=True, kw_only=True)
class MemberCheck:
    """What the check reads and whom it tells, built by the node (node.py)."""

    #: This node's cluster config: the members compared, their API addresses, the CA.
    cfg: ClusterConfig
    #: This node's id (not asked; named when a peer says it was removed).
    node_id: str
    #: The replica: whether a leader reaches us, and the replicated membership.
    raft: RaftNode
    #: The cluster secret in use now, read at each check (a rotation changes it).
    secret: Callable[[], str | None]
    #: Stops the node with an error event and exit status 1: ``fatal(problem, event)``.
    fatal: Callable[[str, str], None]


def member_list(cfg: Any) -> list[dict[str, str]]:
    """What the ``members`` op answers: id and Raft address of each configured node."""
    return [{"id": n.id, "raft": n.raft} for n in cfg.nodes]


def compare(mine: list[dict[str, str]], theirs: Any) -> dict[str, Any] | None:
    """None when both lists name the same members at the same Raft addresses; else what
    differs: ``only_here``/``only_there`` (ids) and ``moved`` (id: here -> there)."""
    if not isinstance(theirs, list):
        return {"problem": "malformed member list"}
    here = {m["id"]: m["raft"] for m in mine}
    there = {str(m.get("id")): str(m.get("raft")) for m in theirs if isinstance(m, dict)}
    diff = {
        "only_here": sorted(set(here) - set(there)),
        "only_there": sorted(set(there) - set(here)),
        "moved": sorted(f"{k}: {here[k]} -> {there[k]}" for k in set(here) & set(there)
                        if here[k] != there[k]),
    }
    return diff if any(diff.values()) else None


def _ask(addr: str, secret: str | None, tls_ca: str | None = None) -> Any:
    with Client([addr], secret=secret, timeout=_TIMEOUT_S, tls_ca=tls_ca) as client:
        return client.call("members"), client.node


async def watch(mc: MemberCheck) -> None:
    """Runs for the node's life: check each peer until it matched, then now and then."""
    mine = member_list(mc.cfg)
    peers = [p for p in mc.cfg.nodes if p.id != mc.node_id]
    reported: dict[str, Any] = {}
    due = {p.id: 0.0 for p in peers}
    loop = asyncio.get_running_loop()
    while peers:
        now = loop.time()
        if not _leader_reaches_us(mc.raft):
            # Perhaps we were removed (the members drop a removed node's connections
            # silently). Ask every peer again soon, however recently it matched, not at
            # its next recheck a minute away.
            for pid in due:
                due[pid] = min(due[pid], now + RETRY_S)
        for peer in peers:
            if due[peer.id] > now:
                continue
            found = await _check(mc, peer, mine)
            if found is None:  # unreachable: nothing learned
                due[peer.id] = now + RETRY_S
                continue
            if found.get("removed"):
                mc.fatal(found["problem"], "node.removed")
                return
            found = _unexplained(mc.raft, found)
            due[peer.id] = now + (RECHECK_S if not found else RETRY_S * 5)
            if not _leader_reaches_us(mc.raft):
                # No leader reaches us: perhaps we were removed (the members drop a
                # removed node's connections silently); ask again soon.
                due[peer.id] = now + RETRY_S
            if found and reported.get(peer.id) != found:
                events.emit("config.mismatch", node=mc.node_id, peer=peer.id,
                            level=logging.ERROR, **found)
            elif not found and reported.get(peer.id) != found:
                log.info("config matches peer %s", peer.id)
            reported[peer.id] = found
        # Wake at least every RETRY_S to see whether a leader still reaches us.
        await asyncio.sleep(min(max(min(due.values()) - loop.time(), 0.2), RETRY_S))


def _leader_reaches_us(raft: RaftNode) -> bool:
    """A leader is known and we lead or are connected to it. A removed node may go on
    naming its old leader for good: connected to no one, pysyncobj never campaigns."""
    leader = raft.leader_addr()
    if leader is None:
        return False
    return bool(leader == raft.self_addr or raft.connected_peers().get(leader))


def _unexplained(raft: RaftNode, found: dict[str, Any]) -> dict[str, Any]:
    """The differences left once those the cluster made on purpose are set aside: files
    differ about members added or removed after the seed until the operator edits them
    (``status`` names those), and a joining node's file lists itself already."""
    if not found or raft.joining():
        return {} if found and raft.joining() else found
    recs = raft.read(queries.members)
    if not recs or "only_here" not in found:
        return found
    seed_ms = min(m.since_ms for m in recs)
    changed = {m.node_id for m in recs if m.status != "active" or m.since_ms > seed_ms}
    left = {key: [x for x in found.get(key, []) if x.partition(":")[0] not in changed]
            for key in ("only_here", "only_there", "moved")}
    return dict(found, **left) if any(left.values()) else {}


async def _check(mc: MemberCheck, peer: Any, mine: list[dict[str, str]]
                 ) -> dict[str, Any] | None:
    """{} when ``peer`` runs our config; the differences; None when it did not answer."""
    try:
        reply, answered_by = await asyncio.to_thread(_ask, peer.api, mc.secret(),
                                                     mc.cfg.tls_ca or "")
    except Unauthenticated:
        return {"problem": f"{peer.id} at {peer.api} refuses this node's cluster secret: "
                           f"the secrets differ"}
    except (RaftschedError, OSError):
        return None
    if answered_by is not None and answered_by != peer.id:
        return {"problem": f"{peer.api} is node {answered_by!r:.70}, not {peer.id!r}"}
    removed = reply.get("removed") if isinstance(reply, dict) else None
    if isinstance(removed, list) and mc.node_id in removed:
        return {"removed": True,
                "problem": f"this node ({mc.node_id}) was removed from the cluster (says "
                           f"{peer.id}); the members refuse it and it will not rejoin. To "
                           f"bring the machine back, wipe its data dir and add it under a "
                           f"new id with `raftsched cluster add-node`"}
    diff = compare(mine, reply.get("members") if isinstance(reply, dict) else None)
    if diff is None:
        return {}
    names = diff.get("only_here", []) + diff.get("only_there", [])
    diff["problem"] = (f"{peer.id} runs with other members than this node"
                       + (f" (differing: {', '.join(names)})" if names else ""))
    return diff
