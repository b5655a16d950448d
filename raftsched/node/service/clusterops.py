"""The API's cluster operations: status, drain, leadership transfer and the member list.

(Membership changes, backups and declarative apply have modules of their own:
membership.py, backup.py, applyops.py.)
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any

from raftsched.core import members, queries
from raftsched.core.commands import Drain, Transfer
from raftsched.core.errors import InvalidArgument, NotReady
from raftsched.node.service import membercheck

if TYPE_CHECKING:
    from raftsched.node.config.config import ClusterConfig
    from raftsched.node.replica.raft import RaftNode
    from raftsched.node.replica.reads import ReadBarrier
    from raftsched.node.replica.writes import ClientWrites

#: How long ``status`` waits to be caught up before it answers with what it has.
STATUS_WAIT_S = 2.0

Op = Callable[[dict[str, Any]], Awaitable[Any]]


class ClusterOps:
    """See the module docstring. Every method runs on the node's event loop.

    :param raft: the replica read from.
    :param writes: commits client commands.
    :param reads: the read barrier (``status`` waits a little to be caught up).
    :param cfg: this node's cluster config (the members it lists).
    :param node_ids: the ids of the cluster's nodes (config and replicated membership).
    :param build_status: the ``status`` reply as this node sees the cluster now.
    """

    def __init__(self, *, raft: RaftNode, writes: ClientWrites, reads: ReadBarrier,
                 cfg: ClusterConfig, node_ids: Callable[[], Iterable[str]],
                 build_status: Callable[[], dict[str, Any]]) -> None:
        self.raft = raft
        self.writes = writes
        self.reads = reads
        self.cfg = cfg
        self.node_ids = node_ids
        self.build_status = build_status

    def ops(self) -> dict[str, Op]:
        """The API operations served here, by name."""
        return {"status": self.status, "drain": self.drain,
                "transfer_leader": self.transfer_leader, "members": self.members}

    def _node_arg(self, args: dict[str, Any], key: str = "node") -> str:
        node_id = args.get(key)
        if not isinstance(node_id, str) or node_id not in self.node_ids():
            raise InvalidArgument(key, "must be the id of a node of the cluster")
        return node_id

    async def drain(self, args: dict[str, Any]) -> Any:
        draining = args.get("draining", True)
        if not isinstance(draining, bool):
            raise InvalidArgument("draining", "must be a boolean")
        reply = await self.writes.submit(Drain(node=self._node_arg(args), draining=draining,
                                               at=0), args.get("rid"))
        return {"node": reply["node"], "draining": reply["draining"]}

    async def transfer_leader(self, args: dict[str, Any]) -> Any:
        to = None if args.get("to") is None else self._node_arg(args, "to")
        if to is not None and not self.raft.read(lambda st: members.is_known(st, to)):
            # A configured node the state does not know yet: the first leader has not
            # committed the membership (nor the node a heartbeat). Retried, not refused.
            raise NotReady(f"node {to} is not in the cluster's state yet (the first leader "
                           "commits the membership); try again in a moment")
        reply = await self.writes.submit(Transfer(to=to, at=0), args.get("rid"))
        return {"from": reply["from"], "to": reply["to"], "term": reply["term"]}

    async def status(self, args: dict[str, Any]) -> Any:
        """Always answers (it is how an operator sees a cluster that is down);
        ``consistent`` says whether its counts are caught up with the cluster."""
        stale = args.get("stale", False)
        if not isinstance(stale, bool):
            raise InvalidArgument("stale", "must be a boolean")
        consistent = False
        if not stale and self.raft.leader_addr() is not None:
            try:
                await self.reads.wait(STATUS_WAIT_S)
                consistent = True
            except NotReady:
                pass
        status = self.build_status()
        if not consistent:
            status["summary"] += ("; read from this node's state as it is (--stale)" if stale
                                  else "; this node has not caught up: counts may be behind")
        return dict(status, consistent=consistent)

    async def members(self, args: dict[str, Any]) -> Any:
        """The members this node's config lists (peers compare it with theirs), and the
        ids the replicated membership says were removed (a removed node asks)."""
        removed = self.raft.read(queries.removed_members)
        return {"members": membercheck.member_list(self.cfg), "removed": removed}


__all__ = ["ClusterOps"]
