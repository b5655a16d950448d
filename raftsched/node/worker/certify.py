"""Death certificates on the node's side (the argument is in guard.py and in
docs/concepts.md, "The death certificate"): the API operation a dead node's guard calls, and the
certificate a restarted node writes for its own previous incarnation.

Both end in one committed :class:`~raftsched.core.commands.Certify`; the state machine
honours it only for the node's current incarnation (``core/nodes.py``). A certificate is
proposed only once every member's release knows the command (``FEATURE``): an older
member would refuse it and its state would part from the others'.
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import os
import signal
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from raftsched.core.commands import Certify
from raftsched.core.errors import Conflict, InvalidArgument, Unauthenticated
from raftsched.node.worker.guard import proof

if TYPE_CHECKING:
    from raftsched.node.replica.port import ReplicaPort
    from raftsched.node.replica.reads import ReadBarrier
    from raftsched.node.replica.writes import ClientWrites

log = logging.getLogger("raftsched.node")

#: The feature every member's heartbeat must list before a certificate is proposed.
FEATURE = "certify"

Op = Callable[[dict[str, Any]], Awaitable[Any]]


class CertifyOps:
    """The ``certify`` API operation: a guard reports its node's death.

    :param raft: the replica.
    :param writes: commits client commands.
    :param node_id: this node (it is alive: it never accepts a certificate of itself).
    :param boot: this node's incarnation.
    :param secrets: the secrets a certificate's proof may be made with (a rotation).
    :param cluster_id: this cluster's id (the proof names it).
    :param missing_feature: members whose release does not know a feature yet.
    """

    def __init__(self, *, raft: ReplicaPort, writes: ClientWrites, node_id: str, boot: int,
                 secrets: Callable[[], list[str]], cluster_id: Callable[[], str],
                 missing_feature: Callable[[str], list[str]]) -> None:
        self.raft = raft
        self.writes = writes
        self.node_id = node_id
        self.boot = boot
        self.secrets = secrets
        self.cluster_id = cluster_id
        self.missing_feature = missing_feature

    def ops(self) -> dict[str, Op]:
        return {"certify": self.certify}

    async def certify(self, args: dict[str, Any]) -> Any:
        node, boot, given = args.get("node"), args.get("boot"), args.get("proof")
        if not isinstance(node, str):
            raise InvalidArgument("node", "must be a node id")
        if isinstance(boot, bool) or not isinstance(boot, int) or boot < 0:
            raise InvalidArgument("boot", "must be the dead incarnation's boot time (ms)")
        if not isinstance(given, str) or not any(
                hmac.compare_digest(given, proof(s, self.cluster_id(), node, boot))
                for s in self.secrets()):
            raise Unauthenticated("the certificate's proof is not made with the cluster "
                                  "secret")
        if node == self.node_id and boot == self.boot:
            raise Conflict(node, "this incarnation is alive: it is answering this request")
        missing = self.missing_feature(FEATURE)
        if missing:
            raise Conflict("certify", f"members {', '.join(missing)} run a release without "
                                      "death certificates; the node's runs wait for its lease")
        reply = await self.writes.submit(Certify(node=node, boot=boot, by="guard", at=0),
                                         args.get("rid"))
        return {"released": reply["released"], "already": reply["already"]}


async def certify_previous(*, raft: ReplicaPort, writes: ClientWrites, reads: ReadBarrier,
                           node_id: str, boot: int,
                           missing_feature: Callable[[str], list[str]]) -> int | None:
    """A restarted node's certificate for its previous incarnation (call once this node
    reaches a quorum, before its first heartbeat). Holding the data dir's lock proves the
    previous node process is gone; a job of it that outlived both it and its guard is
    found by its environment (each run's id and fence, which the cluster says that
    incarnation started) and killed first. Returns the incarnation certified, if any."""
    def previous(st: Any) -> tuple[int | None, list[tuple[str, int]]]:
        rec = st.nodes.get(node_id)
        if rec is None or rec.boot_ms == boot or rec.boot_ms in rec.dead:
            return None, []
        return rec.boot_ms, [(r.run_id, r.fence) for r in st.active_on(node_id)
                             if r.state == "started"]

    await reads.wait()  # the replay is done: what it reads is what the cluster says
    prev, started = raft.read(previous)
    if prev is None or missing_feature(FEATURE):
        return None
    if started:
        kill_leftovers(started)
    await writes.submit(Certify(node=node_id, boot=prev, by="restart", at=0), None)
    log.info("certified this node's previous incarnation %d dead (%d runs it had started)",
             prev, len(started))
    return prev


def kill_leftovers(runs: list[tuple[str, int]]) -> int:
    """SIGKILL the process group of every process whose environment names one of
    ``runs`` (run id and fencing token: unique to one attempt in this cluster) and that
    leads its own session, as a job process does. Returns how many it killed."""
    wanted = {(b"RAFTSCHED_RUN_ID=" + r.encode(), b"RAFTSCHED_FENCE=%d" % f) for r, f in runs}
    killed = 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = set(f.read().split(b"\0"))
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if not int(fields[2]) == int(fields[3]) == pid:
            continue
        if any(run in env and fence in env for run, fence in wanted):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
                killed += 1
    return killed


__all__ = ["FEATURE", "CertifyOps", "certify_previous", "kill_leftovers"]
