"""Cluster configuration: the TOML file every node and client reads, and its
cluster-level settings ([cluster], [limits], [timing], [log]; the [[nodes]] table is
:mod:`raftsched.node.config.confignodes`', [notify] :mod:`raftsched.node.config.notifyconfig`').

``parse_config`` is pure (a dict in, frozen records out); only ``load_config`` reads
a file. Every problem is a ConfigError naming the full key (``nodes[1].raft``). The
secret is never in the config: ``cluster.secret_env`` names the variable holding it.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from raftsched.core.durations import format_duration
from raftsched.core.errors import ConfigError
from raftsched.node.config.confignodes import (
    DEFAULT_QUEUE_PER_WORKER,
    DEFAULT_WORKERS,
    MAX_NODES,
    MAX_QUEUE,
    MAX_TAGS,
    MAX_WORKERS,
    NODE_ID_RE,
    ROLES,
    NodeConfig,
    is_loopback,
    parse_nodes,
    split_addr,
)
from raftsched.node.config.configvalues import read_duration, read_int, read_str, read_strs, section
from raftsched.node.config.notifyconfig import NotifyConfig, parse_notify

DEFAULT_DATA_DIR = "./raftsched-data"  # relative: a first run keeps its journal nearby, no root
DEFAULT_SECRET_ENV = "RAFTSCHED_SECRET"  # the one name the example file and docs use
DEFAULT_NODE_ID = "n1"  # the embedded default's node, the example file's first node
DEFAULT_RAFT_ADDR = "127.0.0.1:7001"  # loopback: the embedded default needs no secret
DEFAULT_API_ADDR = "127.0.0.1:7101"  # raft port + 100, as in the example file
DEFAULT_METRICS_ADDR = "127.0.0.1:7201"  # raft port + 200
MIN_SECRET_LEN = 16  # the secret keys Raft encryption and client auth; shorter is guessable

#: A million jobs: a few hundred MB of replicated state, a snapshot that loads in seconds.
DEFAULT_MAX_JOBS = 1_000_000
#: Fits the largest spec or output tail with room; bounds what a peer makes us buffer.
DEFAULT_MAX_FRAME_BYTES = 1024 * 1024
#: Specs are replicated everywhere and kept; 64 KiB is generous for argv plus environment.
DEFAULT_MAX_SPEC_BYTES = 64 * 1024
DEFAULT_MAX_CONNECTIONS = 256  # plenty for clients and dashboards; each holds buffers
DEFAULT_IDLE_TIMEOUT_MS = 300_000  # 5 min: leaked clients free their slots
DEFAULT_MAX_PENDING_COMMANDS = 10_000  # beyond this answer "overloaded" rather than grow
DEFAULT_OUTPUT_TAIL_BYTES = 4096  # the end of the output usually holds the error
DEFAULT_HISTORY_LIMIT = 100  # a day of a 15-minute job, without unbounded growth
#: Full run logs on the disk of the node that ran them (raftsched/node/worker/runlog.py). A
#: run's log is cut at 16 MiB (its tail still holds the end); a job keeps 64 MiB and
#: at most as many runs' logs as the history shows; a node 1 GiB. Oldest removed first.
DEFAULT_LOG_BYTES_PER_RUN = 16 * 1024 * 1024
DEFAULT_LOG_BYTES_PER_JOB = 64 * 1024 * 1024
DEFAULT_LOG_RUNS_PER_JOB = DEFAULT_HISTORY_LIMIT
DEFAULT_LOG_BYTES_PER_NODE = 1024 * 1024 * 1024

#: Rides out a GC pause or slow disk, yet a dead node's runs move on within seconds.
DEFAULT_NODE_TIMEOUT_MS = 3000
DEFAULT_HEARTBEAT_MS = 500  # six per node_timeout: a lost one or two never lose a node
#: Runs are assigned this far ahead and their starts committed in the last 4/5 of it,
#: so commit latency under a burst (~150 ms p99 for 1000 starts at once on 2 cores)
#: does not become lag; a crashed holder's claim is still released before its instant.
#: An instant of more runs than that plans in time is planned further ahead, in
#: proportion (core.leader.lead_ms: up to 8 lookaheads).
DEFAULT_LOOKAHEAD_MS = 250
#: Far above LAN round trips, so a dead leader is replaced in well under a second; the
#: 3x spread keeps split votes rare (docs/architecture.md, election timing).
DEFAULT_ELECTION_TIMEOUT_MIN_MS = 200
DEFAULT_ELECTION_TIMEOUT_MAX_MS = 600
DEFAULT_APPEND_PERIOD_MS = 50  # four appends per election_timeout_min: no false timeout
DEFAULT_CONNECTION_TIMEOUT_MS = 1500  # >= election max: a slow connect is not a dead leader
#: A partitioned leader stops taking writes soon after the majority elects a new one.
DEFAULT_LEADER_FALLBACK_MS = 1500
DEFAULT_STOP_TIMEOUT_MS = 30_000

DEFAULT_LOG_LEVEL = "info"  # what the cluster did, without per-frame noise
DEFAULT_LOG_FORMAT = "json"  # what log shippers ingest; "text" is for a terminal
#: ``[cluster] durability`` values (raftsched.node.replica.durable does the syncing).
DURABILITY_MODES = ("sync", "none")
DEFAULT_DURABILITY = "sync"
LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("json", "text")

_ENV_RE = re.compile(r"[A-Z_][A-Z0-9_]*")
_DOTTED_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    """Resource bounds (see the DEFAULT_* constants for why each default).

    max_jobs: jobs the cluster will hold; creating more is refused.
    max_frame_bytes: largest wire frame accepted; larger ones are refused unread.
    max_spec_bytes: largest encoded job spec.
    max_connections: concurrent API connections per node.
    idle_timeout_ms: an API connection silent this long is closed.
    max_pending_commands: proposed-but-uncommitted commands before "overloaded".
    output_tail_bytes: bytes of a run's output kept (the end of it).
    history_limit: finished runs kept per job.
    done_retention_ms: a finished one-shot (``at``) job is removed this long after its
        run's outcome; 0 (the default) keeps it, shown as done.
    log_bytes_per_run: bytes of one run's full log (stdout and stderr) a node keeps on
        disk; beyond, the rest is dropped (counted, and said at the log's end).
    log_bytes_per_job / log_runs_per_job: a job's logs on one node; the oldest go first.
    log_bytes_per_node: all logs on one node; the oldest go first. 0: no full logs
        (only the tail in the run record).
    """

    max_jobs: int = DEFAULT_MAX_JOBS
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    max_spec_bytes: int = DEFAULT_MAX_SPEC_BYTES
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    idle_timeout_ms: int = DEFAULT_IDLE_TIMEOUT_MS
    max_pending_commands: int = DEFAULT_MAX_PENDING_COMMANDS
    output_tail_bytes: int = DEFAULT_OUTPUT_TAIL_BYTES
    history_limit: int = DEFAULT_HISTORY_LIMIT
    done_retention_ms: int = 0
    log_bytes_per_run: int = DEFAULT_LOG_BYTES_PER_RUN
    log_bytes_per_job: int = DEFAULT_LOG_BYTES_PER_JOB
    log_runs_per_job: int = DEFAULT_LOG_RUNS_PER_JOB
    log_bytes_per_node: int = DEFAULT_LOG_BYTES_PER_NODE


@dataclass(frozen=True, slots=True, kw_only=True)
class Timing:
    """Failure detection and Raft timing, all in milliseconds.

    node_timeout_ms: a node silent this long is lost; its started runs are released.
    heartbeat_ms: how often a node holding a run (or draining) reports liveness
        (< node_timeout / 2); one holding none, every 10 node timeouts, its Raft
        answers saying it lives meanwhile (core.lease.contact_heartbeat_ms;
        node_timeout / 3 until every member lists ``contact``).
    lookahead_ms: how far ahead of the due time the leader assigns a run (a big instant:
        further, in proportion to its size, up to 8 lookaheads; core.leader.lead_ms).
    election_timeout_min_ms / election_timeout_max_ms: randomised election window.
    append_period_ms: leader append/heartbeat period (< election_timeout_min / 3).
    connection_timeout_ms: Raft connect timeout (>= election_timeout_max).
    leader_fallback_ms: a leader without a majority this long steps down.
    stop_timeout_ms: a stopping node (SIGTERM, Scheduler.stop) lets its running runs
        finish for up to this long (each also bounded by its job's timeout) before it
        stops them; 0 stops them at once.
    """

    node_timeout_ms: int = DEFAULT_NODE_TIMEOUT_MS
    heartbeat_ms: int = DEFAULT_HEARTBEAT_MS
    lookahead_ms: int = DEFAULT_LOOKAHEAD_MS
    election_timeout_min_ms: int = DEFAULT_ELECTION_TIMEOUT_MIN_MS
    election_timeout_max_ms: int = DEFAULT_ELECTION_TIMEOUT_MAX_MS
    append_period_ms: int = DEFAULT_APPEND_PERIOD_MS
    connection_timeout_ms: int = DEFAULT_CONNECTION_TIMEOUT_MS
    leader_fallback_ms: int = DEFAULT_LEADER_FALLBACK_MS
    stop_timeout_ms: int = DEFAULT_STOP_TIMEOUT_MS


@dataclass(frozen=True, slots=True, kw_only=True)
class LogConfig:
    """Logging.

    level: "debug", "info", "warning" or "error".
    format: "json" (one object per line) or "text".
    """

    level: str = DEFAULT_LOG_LEVEL
    format: str = DEFAULT_LOG_FORMAT


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterConfig:
    """The whole validated config.

    data_dir: parent of the per-node folders (journal + snapshots); relative to the cwd.
    secret_env: the environment variable holding the secret; None: loopback only.
    secret_file: a file of secrets (one per line: the used one first, then ones still
        accepted during a rotation), re-read while the node runs; None: the generated
        ``data_dir/secret``. ``$secret_env``, when set, wins (and cannot rotate).
    tls_cert, tls_key: the node's certificate and key (PEM) for TLS on the API port;
        ``{id}`` in a path is the node's id. None: no TLS (frames are sealed instead).
    tls_ca: the CA certificate clients and peers verify nodes with.
    allowed_call_prefixes: modules whose functions may be ``call = "pkg.mod:func"`` jobs.
    durability: "sync" (an entry counts, and a command is acknowledged, only once the
        journal bytes holding it are synced, in batches) or "none" (never synced: a
        power cut on a majority may lose what was acknowledged).
    nodes: the members, in file order.
    limits, timing, log, notify: the [limits], [timing], [log] and [notify] tables.
    source: the file path, "<embedded>" or "<dict>".
    """

    data_dir: str
    secret_env: str | None = DEFAULT_SECRET_ENV
    secret_file: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_ca: str | None = None
    allowed_call_prefixes: tuple[str, ...] = ()
    durability: str = DEFAULT_DURABILITY
    nodes: tuple[NodeConfig, ...]
    limits: Limits = field(default_factory=Limits)
    timing: Timing = field(default_factory=Timing)
    log: LogConfig = field(default_factory=LogConfig)
    notify: NotifyConfig = field(default_factory=NotifyConfig)
    source: str = "<dict>"

    def node(self, node_id: str) -> NodeConfig:
        """The node with this id; ConfigError("nodes", ...) if there is none."""
        for n in self.nodes:
            if n.id == node_id:
                return n
        known = ", ".join(n.id for n in self.nodes)
        raise ConfigError("nodes", f"no node with id {node_id!r} (known: {known})")

    def peers_of(self, node_id: str) -> tuple[NodeConfig, ...]:
        """Every other node, in file order; raises like :meth:`node` if unknown."""
        self.node(node_id)
        return tuple(n for n in self.nodes if n.id != node_id)

    def tls_paths(self, node_id: str) -> tuple[str, str] | None:
        """(cert, key) of ``node_id`` with ``{id}`` filled in, or None without TLS."""
        if self.tls_cert is None or self.tls_key is None:
            return None
        nid = self.node(node_id).id
        return self.tls_cert.replace("{id}", nid), self.tls_key.replace("{id}", nid)

    def node_data_dir(self, node_id: str) -> str:
        """``data_dir/<id>``; ids are validated, so this never escapes data_dir."""
        return os.path.join(self.data_dir, self.node(node_id).id)


_HOUR_MS = 3_600_000
#: [limits] integer key -> (min, max); the maxima catch typos, they are not advice.
_LIMIT_INTS: dict[str, tuple[int, int]] = {
    "max_jobs": (1, 100_000_000), "max_frame_bytes": (4096, 256 * 1024 * 1024),
    "max_spec_bytes": (256, 64 * 1024 * 1024), "max_connections": (1, 65_536),
    "max_pending_commands": (1, 1_000_000), "output_tail_bytes": (1, 16 * 1024 * 1024),
    "history_limit": (1, 100_000),
    "log_bytes_per_run": (1024, 1 << 40), "log_bytes_per_job": (1024, 1 << 40),
    "log_runs_per_job": (1, 100_000), "log_bytes_per_node": (0, 1 << 44),
}
#: [timing] key -> (min ms, max ms); the record field is key + "_ms". See _parse_timing.
_TIMING_KEYS: dict[str, tuple[int, int]] = {
    "node_timeout": (1000, _HOUR_MS), "heartbeat": (10, _HOUR_MS), "lookahead": (0, 60_000),
    "election_timeout_min": (10, 60_000), "election_timeout_max": (10, 60_000),
    "append_period": (1, 20_000), "connection_timeout": (10, 300_000),
    "leader_fallback": (10, _HOUR_MS), "stop_timeout": (0, _HOUR_MS),
}


_CLUSTER_PATHS = ("secret_file", "tls_cert", "tls_key", "tls_ca")


def _parse_cluster_paths(raw: Any) -> dict[str, str | None]:
    """The optional file paths of [cluster]; TLS needs cert, key and CA together."""
    tbl = {} if not isinstance(raw, Mapping) else raw
    out: dict[str, str | None] = {}
    for key in _CLUSTER_PATHS:
        value = read_str(tbl, key, f"cluster.{key}", "") or None
        if value is not None and "\0" in value:
            raise ConfigError(f"cluster.{key}", "must be a path")
        out[key] = value
    tls = [k for k in ("tls_cert", "tls_key", "tls_ca") if out[k]]
    if tls and len(tls) != 3:
        missing = [k for k in ("tls_cert", "tls_key", "tls_ca") if not out[k]]
        raise ConfigError(f"cluster.{missing[0]}", "TLS needs tls_cert, tls_key and tls_ca "
                                                   "together (raftsched certs makes them)")
    return out


def _parse_durability(raw: Any) -> str:
    tbl = {} if not isinstance(raw, Mapping) else raw
    mode = read_str(tbl, "durability", "cluster.durability", DEFAULT_DURABILITY).lower()
    if mode not in DURABILITY_MODES:
        raise ConfigError("cluster.durability",
                          f"{mode!r} is not one of {', '.join(DURABILITY_MODES)}")
    return mode


def _parse_cluster(raw: Any) -> tuple[str, str | None, tuple[str, ...]]:
    tbl = section(raw, "cluster", ("data_dir", "secret_env", "allowed_call_prefixes",
                                   "durability", *_CLUSTER_PATHS))
    data_dir = read_str(tbl, "data_dir", "cluster.data_dir")
    if not data_dir.strip() or "\0" in data_dir:
        raise ConfigError("cluster.data_dir", "must be a non-empty path")
    # "" (TOML has no null) or None says "no secret": a loopback-only cluster.
    env_tbl = {"secret_env": ""} if tbl.get("secret_env", "") is None else tbl
    secret_env = read_str(env_tbl, "secret_env", "cluster.secret_env", DEFAULT_SECRET_ENV) or None
    if secret_env is not None and not _ENV_RE.fullmatch(secret_env):
        raise ConfigError("cluster.secret_env", f"{secret_env!r} is not an env variable name")
    prefixes = read_strs(tbl, "allowed_call_prefixes", "cluster.allowed_call_prefixes", _DOTTED_RE,
                         'a dotted module name like "pkg.mod"')
    return data_dir, secret_env, prefixes


def _parse_limits(raw: Any) -> Limits:
    tbl = section(raw, "limits", (*_LIMIT_INTS, "idle_timeout", "done_retention"))
    d = Limits()
    ints = {k: read_int(tbl, k, f"limits.{k}", getattr(d, k), *b) for k, b in _LIMIT_INTS.items()}
    idle = read_duration(tbl, "idle_timeout", "limits.idle_timeout", d.idle_timeout_ms, 1000,
                         86_400_000)
    done = read_duration(tbl, "done_retention", "limits.done_retention", d.done_retention_ms, 0,
                         3650 * 86_400_000)
    lim = Limits(**ints, idle_timeout_ms=idle, done_retention_ms=done)
    # A spec, like an output tail, travels inside one frame with an envelope around it.
    for key in ("max_spec_bytes", "output_tail_bytes"):
        if getattr(lim, key) >= lim.max_frame_bytes:
            raise ConfigError(f"limits.{key}",
                              f"must be below limits.max_frame_bytes ({lim.max_frame_bytes})")
    # A run's log fits in its job's share, and a job's in the node's (0: no logs at all).
    for key, bound in (("log_bytes_per_run", "log_bytes_per_job"),
                       ("log_bytes_per_job", "log_bytes_per_node")):
        if lim.log_bytes_per_node and getattr(lim, key) > getattr(lim, bound):
            raise ConfigError(f"limits.{key}",
                              f"must be at most limits.{bound} ({getattr(lim, bound)})")
    return lim


def _parse_timing(raw: Any) -> Timing:
    tbl = section(raw, "timing", tuple(_TIMING_KEYS))
    d = Timing()
    t = Timing(**{f"{k}_ms": read_duration(tbl, k, f"timing.{k}", getattr(d, f"{k}_ms"), lo, hi)
                  for k, (lo, hi) in _TIMING_KEYS.items()})
    fd = format_duration
    rules = (
        # Two heartbeats fit in node_timeout, so one lost heartbeat never loses a node.
        ("heartbeat", t.heartbeat_ms * 2 < t.node_timeout_ms,
         f"must be under half of timing.node_timeout ({fd(t.node_timeout_ms)})"),
        ("election_timeout_max", t.election_timeout_min_ms < t.election_timeout_max_ms,
         f"must be above timing.election_timeout_min ({fd(t.election_timeout_min_ms)})"),
        # Followers must see several appends per election timeout or a healthy leader is deposed.
        ("append_period", t.append_period_ms * 3 < t.election_timeout_min_ms,
         f"must be under a third of timing.election_timeout_min ({fd(t.election_timeout_min_ms)})"),
        # A connect slower than an election would make a live leader look dead.
        ("connection_timeout", t.connection_timeout_ms >= t.election_timeout_max_ms,
         f"must be at least timing.election_timeout_max ({fd(t.election_timeout_max_ms)})"),
        # A leader needs a few append rounds to hear from a majority before giving up.
        ("leader_fallback", t.leader_fallback_ms >= t.append_period_ms * 3,
         f"must be at least 3 x timing.append_period ({fd(t.append_period_ms * 3)})"),
    )
    for key, ok, problem in rules:
        if not ok:
            raise ConfigError(f"timing.{key}", problem)
    return t


def _parse_log(raw: Any) -> LogConfig:
    tbl = section(raw, "log", ("level", "format"))
    out = {}
    for key, default, choices in (("level", DEFAULT_LOG_LEVEL, LOG_LEVELS),
                                  ("format", DEFAULT_LOG_FORMAT, LOG_FORMATS)):
        out[key] = read_str(tbl, key, f"log.{key}", default).lower()
        if out[key] not in choices:
            raise ConfigError(f"log.{key}", f"{out[key]!r} is not one of {', '.join(choices)}")
    return LogConfig(**out)


def parse_config(data: Mapping[str, Any], *, source: str = "<dict>") -> ClusterConfig:
    """Validate a TOML-shaped dict into a ClusterConfig; pure, raises ConfigError."""
    root = section(data, "", ("cluster", "nodes", "limits", "timing", "log", "notify"))
    data_dir, secret_env, prefixes = _parse_cluster(root.get("cluster"))
    paths = _parse_cluster_paths(root.get("cluster"))
    return ClusterConfig(
        data_dir=data_dir, secret_env=secret_env, allowed_call_prefixes=prefixes, **paths,
        durability=_parse_durability(root.get("cluster")),
        nodes=parse_nodes(root.get("nodes")), limits=_parse_limits(root.get("limits")),
        timing=_parse_timing(root.get("timing")), log=_parse_log(root.get("log")),
        notify=parse_notify(root.get("notify"), section, read_int, read_duration), source=source,
    )


def load_config(path: str | os.PathLike[str]) -> ClusterConfig:
    """Read and validate a TOML file; unreadable or malformed -> ConfigError("file", ...)."""
    p = os.fspath(path)
    try:
        with open(p, "rb") as f:
            data = tomllib.load(f)
    except OSError as exc:
        raise ConfigError("file", f"{p}: cannot read: {exc.strerror or exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        # TOMLDecodeError's message carries "(at line N, column M)".
        raise ConfigError("file", f"{p}: invalid TOML: {exc}") from None
    return parse_config(data, source=p)


def embedded_default(data_dir: str = DEFAULT_DATA_DIR) -> ClusterConfig:
    """A one-node loopback cluster with every default, for running without a file."""
    node = {"id": DEFAULT_NODE_ID, "raft": DEFAULT_RAFT_ADDR, "api": DEFAULT_API_ADDR,
            "metrics": DEFAULT_METRICS_ADDR, "workers": DEFAULT_WORKERS}
    cluster = {"data_dir": data_dir, "secret_env": DEFAULT_SECRET_ENV}
    return parse_config({"cluster": cluster, "nodes": [node]}, source="<embedded>")


def resolve_secret(cfg: ClusterConfig, environ: Mapping[str, str]) -> str | None:
    """The secret from the variable named by secret_env (None if unset or empty); too short
    is ConfigError("cluster.secret_env"). Only returned: never logged, never in a message."""
    secret = environ.get(cfg.secret_env) if cfg.secret_env else None
    _check_secret_len(cfg, secret)
    return secret or None


def _check_secret_len(cfg: ClusterConfig, secret: str | None) -> None:
    if secret and len(secret) < MIN_SECRET_LEN:
        where = f"${cfg.secret_env}" if cfg.secret_env else "the cluster secret"
        raise ConfigError("cluster.secret_env",
                          f"{where} is too short (need {MIN_SECRET_LEN}+ chars)")


def check_bind_safety(cfg: ClusterConfig, node_id: str, secret: str | None) -> None:
    """Refuse to run ``node_id`` on a non-loopback address without a secret: without
    one Raft traffic is plaintext and the API open, fine only if nothing remote can reach it."""
    node = cfg.node(node_id)
    _check_secret_len(cfg, secret)  # callers may pass a secret from elsewhere than resolve_secret
    i = cfg.nodes.index(node)
    for role in ROLES:
        key, addr = f"nodes[{i}].{role}", getattr(node, role)
        if secret is None and addr is not None and not is_loopback(split_addr(addr, key)[0]):
            how = (f"set the {cfg.secret_env} environment variable" if cfg.secret_env
                   else "set cluster.secret_env and export that variable")
            raise ConfigError(key, f"{addr} is not a loopback address; refusing to bind a "
                                   f"non-loopback address without a cluster secret: {how} "
                                   f"(at least {MIN_SECRET_LEN} characters)")


#: Kept importable from here (the [[nodes]] table moved to confignodes).
_NODE_ID_RE = NODE_ID_RE
__all__ = [
    "DEFAULT_API_ADDR", "DEFAULT_DATA_DIR", "DEFAULT_METRICS_ADDR", "DEFAULT_NODE_ID",
    "DEFAULT_QUEUE_PER_WORKER", "DEFAULT_RAFT_ADDR", "DEFAULT_SECRET_ENV", "DEFAULT_WORKERS",
    "MAX_NODES", "MAX_QUEUE", "MAX_TAGS", "MAX_WORKERS", "MIN_SECRET_LEN", "ClusterConfig",
    "Limits", "LogConfig", "NodeConfig", "Timing", "check_bind_safety", "embedded_default",
    "is_loopback", "load_config", "parse_config", "resolve_secret", "split_addr",
]
