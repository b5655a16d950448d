"""How a node is put together: its secret, data dir and Raft replica, then its worker,
leader loop, service operations and servers, in that order (each later part reads the
earlier ones).

A base of :class:`~raftsched.node.node.Node`, the composition root: ``Node.__init__``
calls these builders once; the routing between the parts (effects, requests, the
lifecycle) stays in ``node.py``.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from typing import TYPE_CHECKING, Any

from raftsched.core import lease
from raftsched.core.cmdbase import CONTACT_FEATURE, FEATURES, IDLE_BEAT_FEATURE, SEAL_FEATURE
from raftsched.core.leader import max_lead_ms
from raftsched.node import datadir
from raftsched.node.config.config import check_bind_safety, split_addr
from raftsched.node.config.secrets import SecretSource
from raftsched.node.datadir import DataDirLock, check_node_files
from raftsched.node.leader import contact, notifier
from raftsched.node.leader.leaderloop import LeaderLoop
from raftsched.node.observe.feed import LiveFeed
from raftsched.node.observe.loopsnapshot import LoopSnapshot
from raftsched.node.replica import raftkeys
from raftsched.node.replica.raft import DUMP_FILE, JOURNAL_FILE, RaftNode
from raftsched.node.replica.readpace import ReadPacer
from raftsched.node.replica.reads import ReadBarrier
from raftsched.node.replica.writes import ClientWrites
from raftsched.node.service import applyops, membership
from raftsched.node.service.backfillops import BackfillOps
from raftsched.node.service.backup import Backups
from raftsched.node.service.clusterops import ClusterOps
from raftsched.node.service.jobops import JobOps, Op
from raftsched.node.service.logops import LogOps
from raftsched.node.service.status import StatusView
from raftsched.node.worker import certify
from raftsched.node.worker.guard import Guard
from raftsched.node.worker.liveness import Liveness
from raftsched.node.worker.runlog import LogLimits, RunLogs
from raftsched.node.worker.worker import WorkerPool, WorkerStatistics
from raftsched.wire.api import ApiServer

if TYPE_CHECKING:
    import asyncio

    from raftsched.core.effects import Effect
    from raftsched.node.config.addressbook import AddressBook
    from raftsched.node.config.config import ClusterConfig
    from raftsched.node.config.confignodes import NodeConfig
    from raftsched.node.observe.clock import Clock
    from raftsched.wire.http import HttpServer

log = logging.getLogger("raftsched.node")

#: What this node's heartbeats announce: its release's features, less the AEAD seal
#: where cryptography's OpenSSL lacks AES-GCM-SIV (its peers then keep Fernet).
HEARTBEAT_FEATURES = FEATURES if raftkeys.AEAD_AVAILABLE else tuple(
    f for f in FEATURES if f != SEAL_FEATURE)


class NodeAssembly:
    """The building half of :class:`~raftsched.node.node.Node`."""

    # Set by Node.__init__ before the builders run.
    cfg: ClusterConfig
    node_id: str
    me: NodeConfig
    boot_ms: int
    metrics: Any
    clock: Clock
    loop: asyncio.AbstractEventLoop | None
    raft_to_id: AddressBook
    dir_lock: DataDirLock | datadir.NoLock

    if TYPE_CHECKING:  # Node's routing, handed to the parts built here
        async def handle(self, op: str, args: dict[str, Any]) -> Any: ...

        def _effects_from_raft(self, effects: list[Effect]) -> None: ...

        def _fatal_from_raft(self, problem: str) -> None: ...

        def _role_from_raft(self, old: int, new: int) -> None: ...

    def _build_worker(self, cfg: ClusterConfig, env: dict[str, str], node_dir: str) -> None:
        """The guard, the run logs, the worker pool and the liveness that fences it."""
        node_id, metrics = self.node_id, self.metrics
        # The job processes inherit the node's environment, never the cluster secret.
        base_env = {k: v for k, v in env.items()
                    if not k.startswith("RAFTSCHED_") and k != (cfg.secret_env or "")}
        fence_after_s = lease.lease_ms(cfg.timing.node_timeout_ms) / 1000
        fits = contact.timing_fits(cfg.timing)
        try:
            # Spawns this node's jobs, kills them if the node freezes, and certifies this
            # incarnation dead if it dies (see guard.py).
            self.guard: Guard | None = Guard()
        except OSError as exc:
            log.warning("no guard process (%s): a frozen node's jobs keep running", exc)
            self.guard = None
        #: The full logs of the runs this node executes (runlog.py).
        self.logs = RunLogs(os.path.join(node_dir, "logs"), LogLimits.of(cfg.limits))
        self.worker = WorkerPool(
            node_id=node_id, raft=self.raft, slots=self.me.workers,
            output_tail_bytes=cfg.limits.output_tail_bytes,
            allowed_call_prefixes=cfg.allowed_call_prefixes, base_env=base_env,
            on_started=metrics.run_started if metrics is not None else None,
            prestart_ms=cfg.timing.lookahead_ms * 4 // 5,
            max_prestart_ms=max_lead_ms(cfg.timing.lookahead_ms) * 4 // 5,
            start_limit=self.me.workers + self.me.queue,
            fence_grace_s=lease.kill_grace_ms(cfg.timing.node_timeout_ms) / 1000,
            guard=self.guard, logs=self.logs,
            lease=lambda: self.liveness.spawn_lease(), lease_s=fence_after_s, clock=self.clock)
        # The node hands it every apply's claim news (Node._on_effects): its steps look
        # at the runs they name, not at every claim (claimsync.py).
        self.worker.claims.incremental = True
        #: The live feed of the HTTP event streams (feed.py).
        self.feed = LiveFeed(node_id)
        #: Heartbeats, the lease and the self-fence (liveness.py).
        self.liveness = Liveness(raft=self.raft, worker=self.worker, guard=self.guard,
                                 me=self.me, timing=cfg.timing, boot_ms=self.boot_ms,
                                 features=HEARTBEAT_FEATURES,
                                 on_event=self.feed.own, clock=self.clock,
                                 idle_ok=lambda: not self.features.missing(IDLE_BEAT_FEATURE),
                                 contact_ok=lambda: fits and not self.features.missing(
                                     CONTACT_FEATURE))
        self.worker.on_busy = self.liveness.nudge
        #: The worker's statistics for other threads (the metrics endpoint), built on
        #: the loop that mutates the pool.
        self.worker_stats: LoopSnapshot[WorkerStatistics] = LoopSnapshot(
            self.worker.statistics, lambda: self.loop)

    def _build_leader(self, cfg: ClusterConfig) -> None:
        """The leader loop (idle unless this node leads) and the notifier it drives."""
        node_id, metrics = self.node_id, self.metrics
        #: Which members announce this release's commands (a rolling upgrade).
        self.features = applyops.Features(raft=self.raft,
                                          config_ids=tuple(p.id for p in cfg.nodes))
        self.leader = LeaderLoop(raft=self.raft, node_id=node_id, cfg=cfg,
                                 raft_to_id=self.raft_to_id, boot_ms=self.boot_ms,
                                 metrics=metrics, missing_feature=self.features.missing,
                                 clock=self.clock, contact_fits=contact.timing_fits(cfg.timing))
        # The webhook signing key is derived once, from the secret in use at start: a
        # secret rotation does not re-key it.
        self.notifier = notifier.Notifier(
            raft=self.raft, leader=self.leader, cfg=cfg.notify, secret=self.secret,
            node_id=node_id, missing_feature=self.features.missing, clock=self.clock)
        self.leader.on_lead = self.notifier.wake

    def _build_ops(self, cfg: ClusterConfig) -> dict[str, Op]:
        """The service operations, and the table the API router dispatches on."""
        node_id = self.node_id
        self.reads = ReadBarrier(self.raft, node_id)
        self.backups = Backups(raft=self.raft, reads=self.reads, node_id=node_id,
                               cluster_id=lambda: self.cluster_id)
        # The cluster id is read at each request: a secret rotation changes it.
        status = StatusView(raft=self.raft, cfg=cfg, node_id=node_id,
                            raft_to_id=self.raft_to_id, cluster_id=lambda: self.cluster_id,
                            worker_statistics=self.worker.statistics,
                            admission_statistics=self.leader.admission_statistics)
        self.writes = ClientWrites(
            raft=self.raft, quorum_problem=status.quorum_problem,
            quorum_grace_s=max(cfg.timing.election_timeout_max_ms / 1000, 0.5))
        pacer = ReadPacer(time.monotonic())
        leader = self.leader

        def read_delay(cost: int) -> float:
            busy = leader.active and leader.admission.busy
            return pacer.delay_s(cost, time.monotonic(), busy=busy)

        self.jobs = JobOps(raft=self.raft, writes=self.writes, reads=self.reads,
                           limits=cfg.limits,
                           allowed_call_prefixes=lambda: self.cfg.allowed_call_prefixes,
                           read_delay=read_delay)
        cluster = ClusterOps(raft=self.raft, writes=self.writes, reads=self.reads, cfg=cfg,
                             node_ids=self.raft_to_id.values,
                             build_status=status.build)
        #: ``run_log``, served here or asked of the node that ran the attempt (logops.py).
        self.log_ops = LogOps(raft=self.raft, reads=self.reads, logs=self.logs,
                              node_id=node_id, secret=lambda: self.secret,
                              tls_ca=cfg.tls_ca, cluster_id=lambda: self.cluster_id)
        #: The API operations, by name: one explicit table (the API router is handle()).
        return {
            **self.jobs.ops(), **cluster.ops(),
            "backup": self.backups.handle,
            **BackfillOps(raft=self.raft, writes=self.writes, reads=self.reads).ops(),
            **membership.MembershipOps(
                raft=self.raft, writes=self.writes, reads=self.reads, cfg=cfg, node_id=node_id,
                raft_to_id=self.raft_to_id, secret=lambda: self.secret).ops(),
            **applyops.ApplyOps(
                raft=self.raft, writes=self.writes, reads=self.reads, limits=cfg.limits,
                allowed_call_prefixes=lambda: self.cfg.allowed_call_prefixes).ops(),
            **certify.CertifyOps(
                raft=self.raft, writes=self.writes, node_id=node_id, boot=self.boot_ms,
                secrets=lambda: list(self.secrets.current), cluster_id=lambda: self.cluster_id,
                missing_feature=self.features.missing).ops(),
            **self.log_ops.ops(),
        }

    def _build_servers(self, cfg: ClusterConfig, ssl_ctx: Any) -> None:
        """The client API (with /metrics) and the optional HTTP API and dashboard."""
        node_id = self.node_id
        host, port = split_addr(self.me.api, "api")
        self.api = ApiServer(handler=self.handle, host=host, port=port, secret=None,
                             credentials=self.secrets.keyring(), ssl_context=ssl_ctx,
                             node_id=node_id, max_frame_bytes=cfg.limits.max_frame_bytes,
                             max_connections=cfg.limits.max_connections,
                             idle_timeout_s=cfg.limits.idle_timeout_ms / 1000,
                             http_addr=self.me.metrics, cluster_id=self.cluster_id,
                             json_http_addr=self.me.http)
        self.api.set_credentials(self.secrets.keyring(), self.secrets.cluster_ids())
        self.http: HttpServer | None = None
        if self.me.http is not None:
            # Imported only here: aiohttp costs a node without an HTTP API ~0.4 s of
            # CPU at every start.
            from raftsched.wire.http import HttpServer
            host, port = split_addr(self.me.http, "http")
            # HTTPS whenever the cluster has TLS (the API's certificate): the bearer
            # tokens and job specs must not cross the network in the clear.
            self.http = HttpServer(handler=self.handle, subscribe=self.feed.subscribe, host=host,
                                   port=port, secret=self.secret, node_id=node_id,
                                   max_body_bytes=cfg.limits.max_frame_bytes,
                                   ssl_context=ssl_ctx)
            self.http.set_secrets(list(self.secrets.current))

    def _open(self, cfg: ClusterConfig, node_id: str, env: dict[str, str], node_dir: str,
              join: bool) -> None:
        """The secret, the data dir and its lock, the Raft replica: each undone by
        releasing the lock when a later one fails."""
        #: Where the secrets come from ($secret_env, secret_file or the generated file),
        #: re-read while the node runs when it is a file (a rotation).
        self.secrets = SecretSource(
            cfg, env, check=functools.partial(check_bind_safety, cfg, node_id))
        #: The used secret (the first of the keyring); never logged.
        self.secret = self.secrets.current[0]
        #: The generated secret's file when none is configured (never listen without one).
        self.secret_path: str | None = self.secrets.generated_path
        self.cluster_id = self.secrets.cluster_id
        # The journal and snapshots hold job env values in the clear: owner only.
        os.makedirs(node_dir, mode=0o700, exist_ok=True)
        try:
            os.chmod(node_dir, 0o700)
        except PermissionError:  # not ours (a mounted volume): say so, still run
            log.warning("cannot restrict %s to its owner; job env values in its journal "
                        "may be readable by others", node_dir)
        # Before pysyncobj opens the journal: one process per data dir, no corrupt replay.
        if isinstance(self.dir_lock, datadir.NoLock):
            self.dir_lock = DataDirLock(node_dir)
        check_node_files(node_dir, JOURNAL_FILE, DUMP_FILE)
        # --join matters to a fresh node only: one with a journal is a member already.
        join = join and not os.path.exists(os.path.join(node_dir, JOURNAL_FILE))
        self.raft = RaftNode(
            self_addr=self.me.raft, peers=[p.raft for p in cfg.peers_of(node_id)],
            data_dir=node_dir, secret=list(self.secrets.current), timing=cfg.timing,
            on_effects=self._effects_from_raft, history_limit=cfg.limits.history_limit,
            max_pending=cfg.limits.max_pending_commands, on_fatal=self._fatal_from_raft,
            join=join, durability=cfg.durability, on_state_changed=self._role_from_raft)
