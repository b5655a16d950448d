"""Prometheus metrics per node, and the ``/metrics``, ``/healthz``, ``/readyz`` endpoint.

Node-local counters (runs started here, lag, commit latency) are fed by the node;
cluster-wide figures (runs by outcome, jobs, term, skew) are read from the replicated
state when scraped, so every node reports the same cluster totals.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from raftsched.core.effects import Effect, FireCovered, NodeCertified, RangeMissed, RunEnded
from raftsched.node.config.config import split_addr
from raftsched.node.observe import gcwatch

if TYPE_CHECKING:
    from raftsched.core.machine import ClusterState
    from raftsched.node.observe.loopsnapshot import LoopSnapshot
    from raftsched.node.replica.raft import RaftNode
    from raftsched.node.worker.worker import WorkerStatistics

#: Raft lock holds: the target is none over 20 ms (docs/architecture.md, the lock budget).
_HOLD_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25,
                 0.5, 1, 2.5, 5)
_LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class LeaderFigures(Protocol):
    """The leader loop's counters a scrape reads (``LeaderLoop``)."""

    #: Plans this node committed.
    plans: int
    #: Time this node spent building plans, in seconds.
    plan_seconds: float


@dataclass(frozen=True, kw_only=True)
class Sources:
    """What a scrape and the health endpoints read, built by the node (node.py). A
    scrape runs in the HTTP server's thread: every source is safe to read from there."""

    #: The replica (the state, read under its lock, and Raft's figures).
    raft: RaftNode
    #: The leader loop's plan counters.
    leader: LeaderFigures
    #: The worker pool's statistics as last built on the event loop.
    worker_stats: LoopSnapshot[WorkerStatistics]
    #: The nodes of the config file: with one, ready needs no quorum.
    configured_nodes: int


class Metrics:
    """The node's metric objects, in a registry of their own."""

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        r.register(_GcCollector())
        self.lag = Histogram("raftsched_schedule_lag_seconds",
                             "Actual start minus scheduled time of runs started on this node",
                             buckets=_LAG_BUCKETS, registry=r)
        self.commit = Histogram("raftsched_commit_latency_seconds",
                                "Submit-to-apply latency of the leader's commands",
                                buckets=_LAG_BUCKETS, registry=r)
        self.released = Counter("raftsched_claims_released",
                                "Claims released because their node was lost or disconnected",
                                registry=r)
        self.ended = Counter("raftsched_node_runs_ended", "Runs ended, as applied on this node",
                             ["outcome"], registry=r)
        #: outcome -> its child of ``ended`` (``labels()`` checks and locks on every
        #: call: 2 % of a follower's CPU in a storm, where every run's end is counted).
        self._ended_by: dict[str, Any] = {}
        self.certified = Counter("raftsched_nodes_certified",
                                 "Death certificates applied (an incarnation proved dead)",
                                 ["by"], registry=r)
        self.covered = Counter("raftsched_fire_times_covered",
                               "Fire times accounted for by a kept record that already held "
                               "their run id (no second run), as applied on this node",
                               registry=r)
        self.lock_hold = Histogram("raftsched_raft_lock_hold_seconds",
                                   "How long each hold of the Raft state lock lasted",
                                   buckets=_HOLD_BUCKETS, registry=r)
        self.sources: Sources | None = None

    def run_started(self, lag_s: float) -> None:
        self.lag.observe(max(lag_s, 0.0))

    def commit_latency(self, seconds: float) -> None:
        self.commit.observe(seconds)

    def claims_released(self, n: int) -> None:
        if n:
            self.released.inc(n)

    def effect(self, eff: Effect) -> None:
        if isinstance(eff, RunEnded):
            self._ended(eff.state).inc()
        elif isinstance(eff, RangeMissed):
            self._ended(eff.state).inc(eff.fire_count)
        elif isinstance(eff, NodeCertified):
            self.certified.labels(eff.by).inc()
        elif isinstance(eff, FireCovered):
            self.covered.inc()

    def _ended(self, outcome: str) -> Any:
        child = self._ended_by.get(outcome)
        if child is None:
            child = self._ended_by[outcome] = self.ended.labels(outcome)
        return child

    def attach(self, sources: Sources) -> None:
        """Read cluster and Raft figures from ``sources`` at scrape time."""
        self.sources = sources
        sources.raft.observe_lock_holds(self.lock_hold.observe)
        self.registry.register(_StateCollector(sources))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _GcCollector:
    """The process's garbage collections (:mod:`raftsched.node.observe.gcwatch`), once a
    node's process watches them; an app embedding a node keeps its own collector, and
    nothing is reported then. A collection stops every thread of the process: at a
    storm's rate of runs they cost ~10 % of a node's CPU (``python -m bench.gc_share``)."""

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Any:
        if not gcwatch.installed():
            return
        gs = gcwatch.statistics()
        count = CounterMetricFamily("raftsched_gc_collections",
                                    "Garbage collections of this node's process",
                                    labels=["generation"])
        seconds = CounterMetricFamily("raftsched_gc_seconds",
                                      "Wall time of those collections (every thread waits)",
                                      labels=["generation"])
        longest = GaugeMetricFamily("raftsched_gc_longest_seconds",
                                    "The longest collection since the node started",
                                    labels=["generation"])
        for gen in range(3):
            label = [str(gen)]
            count.add_metric(label, gs.collections[gen])
            seconds.add_metric(label, gs.seconds[gen])
            longest.add_metric(label, gs.max_seconds[gen])
        yield count
        yield seconds
        yield longest


class _StateCollector:
    def __init__(self, sources: Sources) -> None:
        self.sources = sources

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Any:
        src = self.sources
        raft = src.raft
        raw = raft.status()
        runs = GaugeMetricFamily("raftsched_runs", "Runs by outcome (cluster-wide, replicated)",
                                 labels=["outcome"])
        skew = GaugeMetricFamily("raftsched_clock_skew_ms",
                                 "Node clock minus the leader's, as the leader observed it",
                                 labels=["node"])

        def copy(st: ClusterState) -> tuple[dict[str, int], list[tuple[str, int]], int, int,
                                             int]:
            skews = [(n, r.skew_ms) for n, r in st.nodes.items() if r.skew_ms is not None]
            return (dict(st.totals), skews, len(st.jobs), len(st.runs),
                    st.leader.changes)

        totals, skews, jobs, active, changes = raft.read(copy)
        for outcome, n in sorted(totals.items()):
            runs.add_metric([outcome], n)
        for node_id, value in sorted(skews):
            skew.add_metric([node_id], value)
        yield runs
        yield skew
        yield GaugeMetricFamily("raftsched_jobs", "Jobs in the cluster", value=jobs)
        yield GaugeMetricFamily("raftsched_active_runs", "Runs pending, assigned or started",
                                value=active)
        yield CounterMetricFamily("raftsched_leader_changes", "Leader changes recorded",
                                  value=changes)
        yield GaugeMetricFamily("raftsched_raft_term", "Raft term", value=raft.term())
        yield GaugeMetricFamily("raftsched_raft_commit_index", "Raft commit index",
                                value=raw.get("commit_idx") or 0)
        yield GaugeMetricFamily("raftsched_is_leader", "1 if Raft says this node leads",
                                value=1 if src.raft.leader_term() is not None else 0)
        yield CounterMetricFamily("raftsched_apply_seconds", "Time spent applying commands",
                                  value=raft.apply_seconds)
        yield CounterMetricFamily("raftsched_applied_commands", "Commands applied",
                                  value=raft.apply_count)
        yield CounterMetricFamily("raftsched_leader_plans", "Plans this node committed",
                                  value=src.leader.plans)
        yield CounterMetricFamily("raftsched_leader_plan_seconds",
                                  "Time this node spent building plans",
                                  value=src.leader.plan_seconds)
        # This runs in the HTTP thread: the pool's statistics as built on its loop.
        ws = src.worker_stats.get()
        yield GaugeMetricFamily("raftsched_worker_slots_busy", "Busy worker slots", value=ws.busy)
        yield GaugeMetricFamily("raftsched_worker_slots_free", "Free worker slots",
                                value=max(ws.slots - ws.busy, 0))
        yield GaugeMetricFamily("raftsched_worker_queue_depth",
                                "Runs assigned here and waiting", value=ws.waiting)
        yield CounterMetricFamily("raftsched_worker_started", "Runs started on this node",
                                  value=ws.started)
        yield CounterMetricFamily("raftsched_worker_shed", "Runs shed on this node",
                                  value=ws.shed)
        yield CounterMetricFamily("raftsched_worker_rejected_starts",
                                  "Starts refused for a stale fence", value=ws.rejected_starts)
        yield GaugeMetricFamily("raftsched_raft_lock_hold_max_seconds",
                                "Longest hold of the Raft state lock since the node started",
                                value=raft.lock_max_hold_s)
        own_stall, leader_stall, waited = raft.stalls()
        yield GaugeMetricFamily("raftsched_raft_stall_seconds",
                                "Longest stall of this node's Raft thread in the last 30 s",
                                value=own_stall)
        yield GaugeMetricFamily("raftsched_leader_stall_seconds",
                                "Longest recent stall its leader reported to this node",
                                value=leader_stall)
        yield CounterMetricFamily("raftsched_leader_silences_waited",
                                  "Leader silences waited out past the election timeout",
                                  value=waited)
        yield GaugeMetricFamily("raftsched_pending_commands", "Commands in flight from here",
                                value=raft.pending)


def health(sources: Sources) -> tuple[bool, bool]:
    """``(healthy, ready)``: the Raft thread runs; and a leader with a quorum is known."""
    raft = sources.raft
    alive = raft.tick_alive()
    ready = alive and raft.leader_addr() is not None and (
        sources.configured_nodes == 1 or raft.has_quorum())
    return alive, ready


def serve_metrics(addr: str, metrics: Metrics, sources: Sources) -> ThreadingHTTPServer:
    """Serve ``/metrics``, ``/healthz`` and ``/readyz`` on ``addr`` in a daemon thread."""
    metrics.attach(sources)
    host, port = split_addr(addr, "metrics")

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                body, code, ctype = metrics.render(), 200, "text/plain; version=0.0.4"
            elif path in ("/healthz", "/readyz"):
                ok = health(sources)[0 if path == "/healthz" else 1]
                body, code, ctype = (b"ok\n" if ok else b"not ready\n"), (200 if ok else 503), \
                    "text/plain"
            else:
                body, code, ctype = b"not found\n", 404, "text/plain"
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, fmt: str, *args: Any) -> None:
            return

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server
