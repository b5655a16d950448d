"""The composition root: one raftsched node (Raft replica, API, leader loop, workers).

Its base :class:`~raftsched.node.assembly.NodeAssembly` builds the parts; this module
wires them and routes between them: Raft's effects to the worker, the
leader loop, the notifier, the metrics and the event lines (eventpolicy.py); API
requests to the operations (jobops.py, clusterops.py, membership.py, backup.py,
applyops.py), which commit through writes.py. Heartbeats and the self-fence live in
liveness.py. Everything node-local lives here or below: the wall clock is read at the
edges and stamped into commands; the pure core (state, trigger, misses, leader.plan)
never sees a clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from raftsched.core import queries
from raftsched.core.cmdbase import SEAL_FEATURE
from raftsched.core.effects import (
    ClaimsReleased,
    Effect,
    HeartbeatSeen,
    JobPut,
    JobResumed,
    LeaderChanged,
    MemberRemoved,
    MembersChanged,
    NodeBack,
    NodeCertified,
    NodeDraining,
    NodeJoined,
    NotifyPending,
    Restored,
    RunAssigned,
    RunCreated,
    RunEnded,
    StopRun,
    TransferAsked,
)
from raftsched.core.errors import Conflict, InvalidArgument, RaftschedError
from raftsched.node import datadir
from raftsched.node.assembly import NodeAssembly
from raftsched.node.config.addressbook import AddressBook
from raftsched.node.config.config import (
    ClusterConfig,
    check_bind_safety,
    resolve_secret,
)
from raftsched.node.datadir import announce_secret
from raftsched.node.observe import eventpolicy, events
from raftsched.node.observe.clock import (
    SYSTEM_CLOCK,
    Clock,
    now_ms,
    set_offset_file,
    set_offset_ms,
)
from raftsched.node.service import audit, membercheck, membership
from raftsched.node.worker import certify
from raftsched.node.worker.claimsync import CLAIM_NEWS
from raftsched.wire.certs import server_context
from raftsched.wire.secretfile import unregister

if TYPE_CHECKING:
    pass

log = logging.getLogger("raftsched.node")

#: The cyclic GC's thresholds. A collection runs inside whatever allocated last, often
#: an apply under the Raft lock, and costs ~1 us per object of the generations it
#: collects; the state is long-lived and every run record survives the young ones. So
#: young collections stay small and short, a middle one comes every 10 young, and a
#: full one (which walks the whole state and stalls every thread, pysyncobj's
#: heartbeats included) only every 1,000 middle ones. The measurements behind the
#: numbers: docs/architecture.md, the garbage collector's thresholds.
GC_THRESHOLDS = (5_000, 10, 1_000)
#: How long a stopping leader tries to hand leadership over before it just leaves.
SHUTDOWN_TRANSFER_S = 2.0
#: Reads refused with not_ready while this node reaches no quorum (unless ``stale``).
_QUORUM_READS = frozenset({"get_job", "list_jobs", "runs"})
#: Effects that may give the leader something new to plan.
_LEADER_WAKERS = frozenset({JobPut, JobResumed, RunEnded, ClaimsReleased, NodeJoined, NodeBack,
                            Restored, RunCreated, NodeDraining})
#: Effects that may give this node's worker something to do (or free a slot).
_WORKER_WAKERS = frozenset({ClaimsReleased, Restored, RunEnded})
#: Effects the node itself acts on (``Node._act_on``): a run's own effects, three or
#: four per run on every node, are not among them and skip its match.
_NODE_ACTS = frozenset({RunAssigned, StopRun, TransferAsked, NotifyPending, MembersChanged,
                        Restored, NodeCertified, MemberRemoved})


class Node(NodeAssembly):
    """One node. Build it in the thread that will live as long as the node (pysyncobj's
    tick thread stops when its creating thread exits), then ``await run()``."""

    def __init__(self, cfg: ClusterConfig, node_id: str, *, environ: dict[str, str] | None = None,
                 metrics: Any = None, join: bool = False) -> None:
        env = dict(os.environ if environ is None else environ)
        self.cfg = cfg
        self.node_id = node_id
        self.me = cfg.node(node_id)
        tls = cfg.tls_paths(node_id)
        ssl_ctx = server_context(*tls) if tls is not None else None
        self._pointer: str | None = None
        self.boot_ms = now_ms()
        if env.get("RAFTSCHED_CLOCK_OFFSET_MS"):
            set_offset_ms(int(env["RAFTSCHED_CLOCK_OFFSET_MS"]))
        if env.get("RAFTSCHED_CLOCK_FILE"):
            set_offset_file(env["RAFTSCHED_CLOCK_FILE"])
        self.metrics = metrics
        #: The clock every timed part reads (the wall clock with the test offsets).
        self.clock: Clock = SYSTEM_CLOCK
        self.loop: asyncio.AbstractEventLoop | None = None
        self.raft_to_id = AddressBook.of((p.id, p.raft) for p in cfg.nodes)
        self._stop = asyncio.Event()
        #: ``node.stopped`` was said: the node's last line. An effect batch its Raft thread
        #: queued to the loop before it stopped runs as the loop closes, after it.
        self._said_stopped = False
        #: The process exit code ``run_node`` returns (1 after a refused format).
        self.exit_code = 0
        node_dir = cfg.node_data_dir(node_id)
        # The checks that can refuse the start come before anything is written (the data
        # dir, its secret): a refused node leaves nothing behind. First the one that is
        # about the config alone: a non-loopback address needs a configured secret.
        if resolve_secret(cfg, env) is None and cfg.secret_file is None:
            check_bind_safety(cfg, node_id, None)
        self.dir_lock = datadir.refuse_early(cfg, node_id, node_dir,
                                              serves_metrics=metrics is not None)
        try:
            self._open(cfg, node_id, env, node_dir, join)
        except BaseException:
            self.dir_lock.release()
            raise
        try:
            self._build_worker(cfg, env, node_dir)
            self._build_leader(cfg)
            self.ops = self._build_ops(cfg)
            self._build_servers(cfg, ssl_ctx)
        except BaseException:
            # The Raft replica runs (its thread, its port) and the data dir is locked:
            # an app that catches this and starts again in the same process must find
            # both free, not its own leftovers.
            self._release()
            raise

    # ------------------------------------------------------------ effects

    def _effects_from_raft(self, effects: list[Effect]) -> None:
        """Raft thread: hand the effects to the event loop, do nothing else here."""
        loop = self.loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._on_effects, effects)

    def _role_from_raft(self, old: int, new: int) -> None:
        """Raft thread: a role change wakes the leader loop (a follower's sleeps long)."""
        loop = self.loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(lambda: self.leader.wake())

    def _fatal_from_raft(self, problem: str) -> None:
        """Raft thread: this replica met a format it cannot read (see RaftNode._refuse)."""
        loop = self.loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._fatal, problem)

    def _fatal(self, problem: str, event: str = "node.refused") -> None:
        """Stop with exit status 1, saying why (an event and a line on stderr)."""
        if self.exit_code:
            return
        self.exit_code = 1
        events.emit(event, node=self.node_id, problem=problem, level=logging.ERROR)
        import sys
        sys.stderr.write(f"error: {self.node_id}: {problem}\n")
        self.stop()

    def _choose_seal(self) -> None:
        """Raft messages are sealed with the AEAD once every member's heartbeats say it
        opens them (raftkeys.py); with Fernet until then (a rolling upgrade)."""
        keyring = self.raft.keyring
        if keyring is not None and not keyring.aead:
            # Once on, it stays on: a member may not go back to an older release then
            # (docs/operations.md), and the check is a read of the state per heartbeat.
            keyring.aead = not self.features.missing(SEAL_FEATURE)

    def _on_effects(self, effects: list[Effect]) -> None:
        if self._said_stopped:
            return  # news from after the node's last line is nobody's: not logged, not fed
        wake_worker = wake_leader = False
        me = self.node_id
        try:
            for eff in effects:
                if isinstance(eff, HeartbeatSeen):
                    self.leader.saw_heartbeat(eff.node_id, eff.at_ms)
                    self._choose_seal()
                    continue
                kind = type(eff)
                wake_leader = wake_leader or kind in _LEADER_WAKERS
                wake_worker = wake_worker or kind in _WORKER_WAKERS
                if kind in CLAIM_NEWS:
                    self.worker.claims.note(eff, self.worker.local)
                if kind in _NODE_ACTS:
                    wake_worker = self._act_on(eff) or wake_worker
                if self.metrics is not None:
                    self.metrics.effect(eff)
                if isinstance(eff, LeaderChanged) and eff.term < self.raft.term():
                    # A leadership of a past term: history this node replays from its
                    # journal as it starts (every leader since the last snapshot, all in the
                    # same millisecond), not news for the log or the feed.
                    continue
                eventpolicy.emit_for(eff, me=me, leads=self.leader.active)
                if self.feed:
                    self.feed.effect(eff)
        except BaseException:
            # The effects after the one that failed were not handled: the worker looks
            # at every claim, and both loops look now, not at their next poll.
            self.worker.claims.look_at_all()
            wake_worker = wake_leader = True
            raise
        finally:
            # Also when one effect's handling failed: a wake lost would leave a claim
            # waiting for the worker's safety-net poll.
            if wake_worker:
                self.worker.notify()
            if wake_leader:
                self.leader.wake()

    def _act_on(self, eff: Effect) -> bool:
        """What this node does itself for one of the ``_NODE_ACTS`` effects; True when
        its worker has a new claim to look at."""
        me = self.node_id
        match eff:
            case RunAssigned(node=node):
                return node == me
            case StopRun(run_id=run_id, node=node, fence=fence) if node == me:
                self.worker.cancel(run_id, fence)
            case TransferAsked(to=to, term=term):
                self.leader.request_transfer(to, term)
            case NotifyPending():
                self.notifier.wake()
            case MembersChanged() | Restored():
                membership.refresh_ids(self.raft, self.raft_to_id)
                self._guard_hello()
            case NodeCertified(node=node, boot=boot) if node == me and boot == self.boot_ms:
                # The cluster holds this very process dead and has moved its runs on (a
                # certificate proved by mistake): it must not run anything more.
                self.worker.self_fence("this incarnation was certified dead")
                self._fatal(f"this node's incarnation ({boot}) was certified dead; "
                            "its runs were moved on", "node.certified_dead")
            case MemberRemoved(node_id=node_id) if node_id == me:
                self._fatal(f"this node ({me}) was removed from the cluster; it will not "
                            f"rejoin. To bring the machine back, wipe its data dir and add "
                            f"it under a new id with `raftsched cluster add-node`",
                            "node.removed")
        return False

    # ------------------------------------------------------------ lifecycle

    async def run(self, on_started: Any = None) -> None:
        """Serve until :meth:`stop`; ``on_started()`` once the API listens. A failed
        start (the API address is taken) raises after releasing everything."""
        self.loop = asyncio.get_running_loop()
        if self.guard is not None:
            self.guard.attach(self.loop)
            self.guard.on_lost = lambda: self.worker.self_fence("the guard process died")
            self._guard_hello()
        try:
            await self.api.start()
            if self.http is not None:
                await self.http.start()
        except BaseException:
            await self.api.close()
            self._release()
            raise
        close_in_children(self.api.listening_fds())
        if self.http is not None:
            close_in_children(self.http.listening_fds())
        if self.secret_path is not None:
            self._pointer = announce_secret(self.me.api, self.secret_path)
        events.emit("node.started", node=self.node_id, api=self.me.api, raft=self.me.raft,
                    workers=self.me.workers, cluster_id=self.cluster_id)
        if on_started is not None:
            on_started()
        if self.raft.fatal is not None:  # met before the loop ran (a snapshot at boot)
            self._fatal(self.raft.fatal)
        # The parts' tasks live in one group: leaving it (a stop, or run() cancelled)
        # waits for every one of them to end.
        try:
            async with asyncio.TaskGroup() as group:
                tasks = [group.create_task(_logged(name, coro), name=name)
                         for name, coro in self._parts()]
                try:
                    await self._stop.wait()
                finally:
                    await self._shut_down(tasks)
        finally:
            self._release()
            self._said_stopped = True
            events.emit("node.stopped", node=self.node_id)

    def _parts(self) -> list[tuple[str, Coroutine[Any, Any, None]]]:
        """What runs while the node serves, by name."""
        return [("worker", self.worker.run()), ("leader", self.leader.run()),
                ("notifier", self.notifier.run()), ("heartbeat", self._live()),
                ("logs", self.log_ops.adopt()),
                ("membercheck", membercheck.watch(membercheck.MemberCheck(
                    cfg=self.cfg, node_id=self.node_id, raft=self.raft,
                    secret=lambda: self.secret, fatal=self._fatal))),
                ("secrets", self.secrets.watch(self._secrets_changed))]

    async def _shut_down(self, tasks: list[asyncio.Task[None]]) -> None:
        """Hand leadership over, close the servers, drain the worker, stop the parts."""
        if self.raft.leader_term() is not None:
            # A clean stop of the leader hands leadership over first: the cluster
            # plans on without waiting out an election timeout.
            with contextlib.suppress(Exception):
                await self.leader.transfer(wait_s=SHUTDOWN_TRANSFER_S)
        await self.api.close()
        if self.http is not None:
            await self.http.close()
        # Drain while heartbeats (the lease) and the leader loop still run.
        try:
            await self.worker.drain(self.cfg.timing.stop_timeout_ms / 1000)
        except Exception:  # noqa: BLE001 - stopping must go on
            log.exception("drain failed")
        self.leader.stop()
        await self.worker.stop()
        for task in tasks:
            task.cancel()

    def _guard_hello(self) -> None:
        """Tell the guard what it needs to certify this incarnation's death (again after
        a membership change or a secret rotation)."""
        if self.guard is None:
            return
        members = self.raft.read(queries.active_member_apis)
        self.guard.hello(node=self.node_id, boot=self.boot_ms, api=self.me.api,
                         members=members or [n.api for n in self.cfg.nodes],
                         secrets=list(self.secrets.current), cluster_id=self.cluster_id,
                         tls_ca=self.cfg.tls_ca,
                         give_up_s=self.cfg.timing.node_timeout_ms / 1000)

    async def _live(self) -> None:
        """Heartbeats, after the previous incarnation's certificate: the first heartbeat
        of a new incarnation must not precede it, or a heartbeat the old one sent just
        before it died could still commit after it and pass for the node's."""
        try:
            await asyncio.wait_for(self._certify_previous(),
                                   self.cfg.timing.node_timeout_ms / 1000)
        except TimeoutError:
            log.warning("could not certify this node's previous incarnation dead in time; "
                        "its runs are released by this incarnation's first heartbeat")
        await self.liveness.run()

    async def _certify_previous(self) -> None:
        """Once a quorum is reached, certify this node's previous incarnation dead (this
        process holds its data dir: the old one is gone); retried until it commits."""
        while True:
            try:
                await self.writes.await_quorum()
                await certify.certify_previous(
                    raft=self.raft, writes=self.writes, reads=self.reads, node_id=self.node_id,
                    boot=self.boot_ms, missing_feature=self.features.missing)
                return
            except RaftschedError as exc:
                log.debug("certifying the previous incarnation: %s", exc)
                if isinstance(exc, (Conflict, InvalidArgument)):
                    return  # not its current incarnation any more: a heartbeat won
            await asyncio.sleep(0.2)

    def _secrets_changed(self, secrets: list[str]) -> None:
        """The secret file changed (a rotation step): Raft and the API use it at once."""
        self.raft.set_secrets(secrets)
        self.api.set_credentials(self.secrets.keyring(), self.secrets.cluster_ids())
        if self.http is not None:
            self.http.set_secrets(secrets)
        self.secret = secrets[0]
        self.cluster_id = self.secrets.cluster_id
        self._guard_hello()
        events.emit("secret.reloaded", node=self.node_id, credentials=len(secrets),
                    used=self.secrets.names()[0], accepted=",".join(self.secrets.names()))

    def _release(self) -> None:
        """Stop Raft, the guard and the address pointer; then free the data dir."""
        self.raft.destroy(wait_s=5.0)
        guard = getattr(self, "guard", None)  # None: the build failed before the guard
        if guard is not None:
            guard.close()
        if self._pointer is not None and self.secret_path is not None:
            unregister(self._pointer, self.secret_path)
        self.dir_lock.release()

    def stop(self) -> None:
        """Stop, draining first (see ``WorkerPool.drain``); called again, stop at once."""
        if self._stop.is_set():
            self.worker.hurry()
        self._stop.set()

    # ------------------------------------------------------------ API handler

    async def handle(self, op: str, args: dict[str, Any]) -> Any:
        fn = self.ops.get(op)
        if fn is None:
            raise InvalidArgument("op", f"unknown operation {op[:40]!r}")
        if not isinstance(args, dict):
            raise InvalidArgument("args", "must be a map")
        self.features.check(op, args)
        if op in _QUORUM_READS and args.get("stale") is not True:
            # A node cut off from the quorum would answer from a state that may be behind
            # (an empty list after a restart): say there is no quorum instead.
            await self.writes.await_quorum()
        return await audit.audited(self.node_id, op, args, lambda: fn(args))



_LISTENING_FDS: list[int] = []


async def _logged(name: str, part: Coroutine[Any, Any, None]) -> None:
    """Run one part of the node. A part that fails is logged and the node goes on
    without it, as before the group: its failure must not cancel the worker's runs."""
    try:
        await part
    except Exception:  # noqa: BLE001 - logged; the node serves on
        log.exception("node part %r failed", name)


def close_in_children(fds: list[int]) -> None:
    """Close ``fds`` (listening sockets) in every process forked from this one: a job
    must not hold the node's ports after the node is gone."""
    _LISTENING_FDS.extend(fds)


def _close_listeners_in_child() -> None:
    for fd in _LISTENING_FDS:
        try:
            os.close(fd)
        except OSError:
            pass


os.register_at_fork(after_in_child=_close_listeners_in_child)


__all__ = ["Node", "close_in_children"]
