"""Adding and removing members of a running cluster.

Two memberships are kept in step, one change at a time:

- pysyncobj's own (its membership log entries): which Raft addresses vote and count
  for the quorum. pysyncobj applies a change when the entry is *appended* and refuses
  (REQUEST_DENIED) a second one before the first is applied;
- the replicated ``members`` of the state (``core/members.py``): which node id has
  which addresses, and which ids were removed.

``add``: our record first (so every node can name the new member as soon as it
votes), then pysyncobj's entry. ``remove``: the node is drained and its runs end
first (a removed node cannot commit a finish), leadership moves off it, then
pysyncobj's entry, then our record. A step that fails leaves a difference that
``status`` names, and running the same command again completes it.

The config file only seeds the membership of a new cluster; :func:`view` compares
the two for ``status`` and says what to do about each difference.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from raftsched.core import members as core_members
from raftsched.core import queries
from raftsched.core.commands import Drain, Member
from raftsched.core.errors import (
    ConfigError,
    Conflict,
    InvalidArgument,
    NotReady,
    RaftschedError,
)
from raftsched.core.records import MemberRecord
from raftsched.node.config.addressbook import AddressBook
from raftsched.node.config.config import _NODE_ID_RE, split_addr
from raftsched.node.observe import events

if TYPE_CHECKING:
    from collections.abc import Mapping

    from raftsched.core.machine import ClusterState
    from raftsched.node.config.config import ClusterConfig
    from raftsched.node.replica.raft import RaftNode
    from raftsched.node.replica.reads import ReadBarrier
    from raftsched.node.replica.writes import ClientWrites

#: How long one pysyncobj membership change may take (the new node catching up on the
#: log or a snapshot counts: the entry commits once a majority of the new set has it).
RAFT_CHANGE_S = 60.0
#: pysyncobj's FAIL_REASON.SUCCESS / REQUEST_DENIED.
_SUCCESS, _DENIED = 0, 6
#: How long add-node looks again for enough reachable members before refusing.
REACH_RECHECK_S = 3.0
#: Default wait for a removed node's runs to end (``remove-node --wait``).
DRAIN_WAIT_S = 60.0

Op = Callable[[dict[str, Any]], Awaitable[Any]]


def refresh_ids(raft: RaftNode, raft_to_id: AddressBook) -> None:
    """Raft address -> node id for every member the state knows (removed ones too, so
    they keep their names), over the config file's: updates ``raft_to_id`` in place
    (the node's one map, which the other parts hold)."""
    extra = raft.read(queries.member_ids_by_raft)
    raft_to_id.update(extra)


def member_copies(st: ClusterState) -> list[MemberRecord]:
    """Copies of the replicated member records (call through ``raft.read``)."""
    return [MemberRecord.from_row(m.to_row()) for m in st.members.values()]


def member_count(raft: RaftNode, cfg: ClusterConfig) -> int:
    """Voting members: the replicated membership once seeded, else the config's."""
    n = raft.read(queries.active_member_count)
    return n or len(cfg.nodes)


def _args(args: dict[str, Any]) -> tuple[str, str, str]:
    node_id, raft, api = args.get("node"), args.get("raft"), args.get("api")
    if not isinstance(node_id, str) or not _NODE_ID_RE.fullmatch(node_id):
        raise InvalidArgument("node", "must be 1-64 of [A-Za-z0-9_.-]")
    for key, value in (("raft", raft), ("api", api)):
        try:
            host, _ = split_addr(value, key)
        except ConfigError as exc:
            raise InvalidArgument(key, str(exc).partition(": ")[2] or str(exc)) from None
        if host in ("0.0.0.0", "::"):
            raise InvalidArgument(key, f"{value!r}: peers dial it; use a reachable address")
    return node_id, raft, api  # type: ignore[return-value]


async def _raft_change(raft: RaftNode, action: str, addr: str) -> None:
    """Commit pysyncobj's membership entry for ``action`` (add/remove) of ``addr``,
    retrying while another change or the leader's first entry is pending."""
    deadline = time.monotonic() + RAFT_CHANGE_S
    last = "no answer"
    # This replica's view has the change once the leader's entry reached it (done by
    # an earlier run of this command, or by a retry of ours whose answer was lost).
    while (action == "add") != (addr in raft.raft_members()):
        left = deadline - time.monotonic()
        if left <= 0:
            break
        try:
            err = await asyncio.wait_for(asyncio.wrap_future(
                raft.change_membership(action, addr)), left)
        except TimeoutError:
            break
        if err == _SUCCESS:
            return
        last = "refused while another change is pending" if err == _DENIED else f"error {err}"
        await asyncio.sleep(0.2)
    else:
        return
    raise NotReady(f"the Raft membership change ({action} {addr}) did not commit within "
                   f"{RAFT_CHANGE_S:.0f}s ({last}); `status` shows where it stands — run "
                   f"the same command again", maybe_committed=True)


class MembershipOps:
    """``add_node`` and ``remove_node`` (see the module docstring). Every method runs on
    the node's event loop.

    :param raft: the replica: the state read, and pysyncobj's membership changed.
    :param writes: commits the ``member`` and ``drain`` commands.
    :param reads: the read barrier (a change starts from a caught-up state).
    :param cfg: this node's cluster config (the member count before the seed, the CA).
    :param node_id: this node's id (it cannot remove itself).
    :param raft_to_id: Raft address -> node id: the node's one map, updated here in
        place when a member is added.
    :param secret: the cluster secret in use now (a rotation changes it): add-node asks
        the new node's API with it.
    """

    def __init__(self, *, raft: RaftNode, writes: ClientWrites, reads: ReadBarrier,
                 cfg: ClusterConfig, node_id: str, raft_to_id: AddressBook,
                 secret: Callable[[], str]) -> None:
        self.raft = raft
        self.writes = writes
        self.reads = reads
        self.cfg = cfg
        self.node_id = node_id
        self.raft_to_id = raft_to_id
        self.secret = secret

    def ops(self) -> dict[str, Op]:
        """The API operations served here, by name."""
        return {"add_node": self.add_node, "remove_node": self.remove_node}

    async def _api_answers(self, api: str) -> bool:
        """Does a raftsched node with our secret answer at ``api`` (the new node, started
        with ``--join``)?"""
        from raftsched.wire.client import Client

        def ask() -> bool:
            with Client([api], secret=self.secret(), timeout=2.0,
                        tls_ca=self.cfg.tls_ca or "") as client:
                client.status(stale=True)
            return True

        try:
            return await asyncio.to_thread(ask)
        except (RaftschedError, OSError):
            return False


    async def add_node(self, args: dict[str, Any]) -> dict[str, Any]:
        node_id, raft_addr, api = _args(args)
        force = args.get("force", False)
        if not isinstance(force, bool):
            raise InvalidArgument("force", "must be a boolean")
        await self.reads.wait()
        raft = self.raft
        seeded = raft.read(queries.seeded)
        if not seeded:
            raise NotReady("the membership is not seeded yet (the first leader does it); "
                           "try again in a moment")
        voters = raft.raft_members()
        if raft_addr not in voters and not force:
            total = len(voters) + 1
            need = total // 2 + 1
            # A peer connection that drops for a moment (a loaded host, a reconnect) must
            # not refuse the change: look again for a few seconds before saying no.
            look_until = time.monotonic() + REACH_RECHECK_S
            while True:
                up = 1 + sum(1 for a, ok in raft.connected_peers().items()
                             if ok and a in voters)
                new_up = await self._api_answers(api)
                if up + new_up >= need or time.monotonic() >= look_until:
                    break
                await asyncio.sleep(0.25)
            if up + new_up < need:
                raise Conflict(node_id, (
                    f"with it the cluster has {total} voting members and needs {need} up to "
                    f"commit, but only {up} are reachable" + ("" if new_up else
                                                              f" and nothing answers at {api}")
                    + f": start the new node first (`raftsched node --config FILE --id {node_id} "
                      f"--join`) or remove dead members first (`raftsched cluster remove-node "
                      f"ID`); --force adds it anyway"))
        reply = await self.writes.submit(Member(action="add", node=node_id, raft=raft_addr,
                                                api=api, at=0), args.get("rid"))
        refresh_ids(self.raft, self.raft_to_id)
        await _raft_change(self.raft, "add", raft_addr)
        events.emit("member.added", node=self.node_id, member=node_id, raft=raft_addr, api=api)
        return {"node": node_id, "raft": raft_addr, "api": api, "status": reply["status"],
                "members": member_count(self.raft, self.cfg)}


    async def remove_node(self, args: dict[str, Any]) -> dict[str, Any]:
        node_id = args.get("node")
        if not isinstance(node_id, str) or not _NODE_ID_RE.fullmatch(node_id):
            raise InvalidArgument("node", "must be 1-64 of [A-Za-z0-9_.-]")
        wait_s = args.get("wait", DRAIN_WAIT_S)
        if isinstance(wait_s, bool) or not isinstance(wait_s, (int, float)) or \
                not 0 <= wait_s <= 3600:
            raise InvalidArgument("wait", "must be 0..3600 seconds")
        if node_id == self.node_id:
            raise Conflict(node_id, "a node cannot remove itself (once removed it reaches no "
                                    "quorum): send remove-node to another member (--addr)")
        await self.reads.wait()
        raft = self.raft

        rec, active, alive, draining = raft.read(partial(queries.member_state, node_id))
        if rec is None or (rec.status == core_members.REMOVED and rec.raft not in
                           raft.raft_members()):
            what = "was already removed" if rec is not None else "is not a member"
            raise Conflict(node_id, what)
        if rec.status == core_members.ACTIVE and active <= 1:
            raise Conflict(node_id, "is the last member; a cluster keeps at least one")
        if alive:
            if not draining:
                await self.writes.submit(Drain(node=node_id, draining=True, at=0), None)
            await _runs_ended(self.raft, node_id, float(wait_s))
        await _leadership_off(self.raft, self.raft_to_id, node_id)
        await _raft_change(self.raft, "remove", rec.raft)
        if rec.status == core_members.ACTIVE:
            await self.writes.submit(Member(action="remove", node=node_id, raft=rec.raft,
                                            api=rec.api, at=0), args.get("rid"))
        events.emit("member.removed", node=self.node_id, member=node_id, raft=rec.raft)
        return {"node": node_id, "raft": rec.raft, "status": core_members.REMOVED,
                "members": member_count(self.raft, self.cfg)}


async def _runs_ended(raft: RaftNode, node_id: str, wait_s: float) -> None:
    """Wait until ``node_id`` (draining) holds no run, or is no longer alive."""
    deadline = time.monotonic() + wait_s
    while True:
        held, alive = raft.read(partial(queries.node_hold, node_id))
        if not held or not alive:
            return
        if time.monotonic() >= deadline:
            raise Conflict(node_id, f"is draining but still holds {held} runs after "
                                    f"{wait_s:.0f}s; removing it now would run them again "
                                    f"elsewhere. Wait, or pass a longer --wait")
        await asyncio.sleep(0.1)


async def _leadership_off(raft: RaftNode, raft_to_id: Mapping[str, str], node_id: str) -> None:
    """pysyncobj's leader cannot remove itself: wait until another node leads (a
    draining leader hands leadership away by itself)."""
    deadline = time.monotonic() + 20.0
    while raft_to_id.get(raft.leader_addr() or "") == node_id:
        if time.monotonic() >= deadline:
            raise NotReady(f"{node_id} still leads; try `raftsched cluster transfer-leader` "
                           f"then remove it")
        await asyncio.sleep(0.05)


def view(raft: RaftNode, config: ClusterConfig) -> dict[str, Any]:
    """``status``'s membership: the replicated one, the config file's, pysyncobj's
    voting set, and one sentence per difference saying what to do."""
    recs = raft.read(queries.member_rows)
    voting = sorted(raft.raft_members())
    cfg = {n.id: n for n in config.nodes}
    source = config.source
    problems: list[str] = []
    if recs:
        by_id = {m["node_id"]: m for m in recs}
        for m in recs:
            nid, active = m["node_id"], m["status"] == core_members.ACTIVE
            conf = cfg.get(nid)
            if active and conf is None:
                problems.append(f"{nid} is a member (raft {m['raft']}, api {m['api']}) but not "
                                f"in {source}: add a [[nodes]] table for it there (the file "
                                f"only seeds a new cluster; the cluster's membership counts)")
            elif active and conf is not None and (conf.raft, conf.api) != (m["raft"], m["api"]):
                problems.append(f"{nid} is a member at raft {m['raft']}, api {m['api']}, but "
                                f"{source} says {conf.raft}, {conf.api}: fix the file")
            elif not active and conf is not None:
                problems.append(f"{nid} was removed from the cluster but is still in {source}: "
                                f"delete its [[nodes]] table")
            if active and m["raft"] not in voting:
                problems.append(f"{nid} is a member but does not vote yet: run `raftsched "
                                f"cluster add-node {nid} --raft {m['raft']} --api {m['api']}` "
                                f"again")
            if not active and m["raft"] in voting:
                problems.append(f"{nid} was removed but still votes: run `raftsched cluster "
                                f"remove-node {nid}` again")
        for nid, conf in cfg.items():
            if nid not in by_id:
                problems.append(f"{nid} is in {source} but not a member: add it with "
                                f"`raftsched cluster add-node {nid} --raft {conf.raft} --api "
                                f"{conf.api}`, or delete its [[nodes]] table")
    return {"members": recs, "config": sorted(cfg), "voting": voting,
            "joining": raft.joining(), "problems": problems}
