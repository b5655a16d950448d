"""Cluster configuration: the TOML file every node and client reads.

``parse_config`` is pure (a dict in, frozen records out); only ``load_config`` reads
a file. Every problem is a ConfigError naming the full key (``nodes[1].raft``). The
secret is never in the config: ``cluster.secret_env`` names the variable holding it.
"""

from __future__ import annotations

import difflib
import ipaddress
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from raftsched.core.durations import format_duration, parse_duration
from raftsched.core.errors import ConfigError, InvalidSpec
from raftsched.node.notifyconfig import NotifyConfig, parse_notify

DEFAULT_DATA_DIR = "./raftsched-data"  # relative: a first run keeps its journal nearby, no root
DEFAULT_SECRET_ENV = "RAFTSCHED_SECRET"  # the one name the example file and docs use
DEFAULT_NODE_ID = "n1"  # the embedded default's node, the example file's first node
DEFAULT_RAFT_ADDR = "127.0.0.1:7001"  # loopback: the embedded default needs no secret
DEFAULT_API_ADDR = "127.0.0.1:7101"  # raft port + 100, as in the example file
DEFAULT_METRICS_ADDR = "127.0.0.1:7201"  # raft port + 200
DEFAULT_WORKERS = 4  # shows parallelism, still leaves a laptop responsive
#: queue = workers x 4 covers a few lookaheads of short jobs; a lost node strands little.
DEFAULT_QUEUE_PER_WORKER = 4
MAX_WORKERS = 1024  # past this a node is misconfigured, not big: each worker is a process
MAX_QUEUE = 100_000  # past this it is a backlog the leader should place elsewhere
MAX_NODES = 9  # commits wait on a majority; more nodes cost latency for no real gain
MAX_TAGS = 32  # placement matches tags per run; keep the per-node set small
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

#: Rides out a GC pause or slow disk, yet a dead node's runs move on within seconds.
DEFAULT_NODE_TIMEOUT_MS = 3000
DEFAULT_HEARTBEAT_MS = 500  # six per node_timeout: a lost one or two never lose a node
#: Runs are assigned this far ahead and their starts committed in the last 4/5 of it,
#: so commit latency under a burst (~150 ms p99 for 1000 starts at once on 2 cores)
#: does not become lag; a crashed holder's claim is still released before its instant.
DEFAULT_LOOKAHEAD_MS = 250
#: Far above LAN round trips; a dead leader is replaced in well under a second (W2 in
#: bench/ measured a 1.2 s median with 300-900 ms); the 3x spread keeps split votes rare.
DEFAULT_ELECTION_TIMEOUT_MIN_MS = 200
DEFAULT_ELECTION_TIMEOUT_MAX_MS = 600
DEFAULT_APPEND_PERIOD_MS = 50  # four appends per election_timeout_min: no false timeout
DEFAULT_CONNECTION_TIMEOUT_MS = 1500  # >= election max: a slow connect is not a dead leader
#: A partitioned leader stops taking writes soon after the majority elects a new one.
DEFAULT_LEADER_FALLBACK_MS = 1500
DEFAULT_STOP_TIMEOUT_MS = 30_000

DEFAULT_LOG_LEVEL = "info"  # what the cluster did, without per-frame noise
DEFAULT_LOG_FORMAT = "json"  # what log shippers ingest; "text" is for a terminal
LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("json", "text")

_NODE_ID_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_TAG_RE = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
_ENV_RE = re.compile(r"[A-Z_][A-Z0-9_]*")
_DOTTED_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")
_LABEL_RE = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeConfig:
    """One cluster member.

    id: unique name, also the name of its data subfolder.
    raft: host:port peers dial for Raft traffic (must be a concrete address).
    api: host:port clients dial for the API.
    metrics: host:port of the Prometheus endpoint, or None for no endpoint.
    http: host:port of the HTTP/JSON API and dashboard, or None (the default: off).
    workers: how many runs execute concurrently on this node.
    queue: assigned runs that may wait here beyond the busy slots before the leader
        stops placing on this node.
    tags: labels a job can require for placement.
    """

    id: str
    raft: str
    api: str
    metrics: str | None = None
    http: str | None = None
    workers: int = DEFAULT_WORKERS
    queue: int
    tags: tuple[str, ...] = ()


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


@dataclass(frozen=True, slots=True, kw_only=True)
class Timing:
    """Failure detection and Raft timing, all in milliseconds.

    node_timeout_ms: a node silent this long is lost; its started runs are released.
    heartbeat_ms: how often a node reports liveness (< node_timeout / 2).
    lookahead_ms: how far ahead of the due time the leader assigns a run.
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


_WILDCARDS = ("0.0.0.0", "::")
_ROLES = ("raft", "api", "metrics", "http")
#: Roles that are optional (off unless set).
_OPTIONAL_ROLES = ("metrics", "http")
_TYPE_NAMES = {bool: "a boolean", int: "an integer", float: "a float", str: "a string",
               list: "an array", tuple: "an array", dict: "a table"}
_HOUR_MS = 3_600_000
#: [limits] integer key -> (min, max); the maxima catch typos, they are not advice.
_LIMIT_INTS: dict[str, tuple[int, int]] = {
    "max_jobs": (1, 100_000_000), "max_frame_bytes": (4096, 256 * 1024 * 1024),
    "max_spec_bytes": (256, 64 * 1024 * 1024), "max_connections": (1, 65_536),
    "max_pending_commands": (1, 1_000_000), "output_tail_bytes": (1, 16 * 1024 * 1024),
    "history_limit": (1, 100_000),
}
#: [timing] key -> (min ms, max ms); the record field is key + "_ms". See _parse_timing.
_TIMING_KEYS: dict[str, tuple[int, int]] = {
    "node_timeout": (1000, _HOUR_MS), "heartbeat": (10, _HOUR_MS), "lookahead": (0, 60_000),
    "election_timeout_min": (10, 60_000), "election_timeout_max": (10, 60_000),
    "append_period": (1, 20_000), "connection_timeout": (10, 300_000),
    "leader_fallback": (10, _HOUR_MS), "stop_timeout": (0, _HOUR_MS),
}


def is_loopback(host: str) -> bool:
    """True for "localhost", 127.0.0.0/8 and ::1 (brackets allowed); never resolves DNS."""
    h = host.strip("[]").lower().rstrip(".")
    try:
        return h == "localhost" or ipaddress.ip_address(h.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def split_addr(addr: Any, key: str) -> tuple[str, int]:
    """(host, port) of "host:port": host an IPv4 literal, a hostname or "[ipv6]" (returned
    without brackets), port 1..65535; ConfigError(key, ...) otherwise."""
    if not isinstance(addr, str):
        raise ConfigError(key, f'must be a "host:port" string, got {_tname(addr)}')
    if addr.startswith("["):
        host, sep, port_s = addr[1:].partition("]:")
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ConfigError(key, f'{addr!r} is not "[ipv6]:port"') from None
    else:
        host, sep, port_s = addr.rpartition(":")
        if not sep or not host:
            raise ConfigError(key, f'{addr!r} is not "host:port"')
        if ":" in host:
            raise ConfigError(key, f'{addr!r}: write IPv6 in brackets, e.g. "[::1]:7001"')
        labels = host.removesuffix(".").split(".")
        # No TLD is all digits, so this is an IPv4 attempt: rejects "300.1.1.1", "10.0.1".
        if labels[-1].isdigit():
            try:
                ipaddress.IPv4Address(host)
            except ValueError:
                raise ConfigError(key, f"{addr!r}: {host!r} is not a valid IPv4 address") from None
        elif len(host) > 253 or not all(_LABEL_RE.fullmatch(lb) for lb in labels):
            raise ConfigError(key, f"{addr!r}: {host!r} is not a valid hostname or IPv4 address")
    if not (port_s.isascii() and port_s.isdigit() and 1 <= int(port_s) <= 65535):
        raise ConfigError(key, f"{addr!r}: port must be a number 1..65535")
    return host, int(port_s)


def _addrs_clash(a: tuple[str, int], b: tuple[str, int], same_node: bool) -> bool:
    (ha, pa), (hb, pb) = (a[0].lower().rstrip("."), a[1]), (b[0].lower().rstrip("."), b[1])
    if pa != pb:
        return False
    # A wildcard takes the port on every local interface, but other nodes may be
    # other machines, so it only provably clashes within one node.
    if ha in _WILDCARDS or hb in _WILDCARDS:
        return same_node
    # Loopback is always this machine, and "localhost" may be 127.0.0.1 or ::1.
    return ha == hb or ("localhost" in (ha, hb) and is_loopback(ha) and is_loopback(hb))


def _tname(v: Any) -> str:
    return _TYPE_NAMES.get(type(v), type(v).__name__)


def _section(tbl: Any, path: str, allowed: tuple[str, ...]) -> Mapping[str, Any]:
    if not isinstance(tbl := {} if tbl is None else tbl, Mapping):
        raise ConfigError(path or "(root)", f"must be a table, got {_tname(tbl)}")
    for k in tbl:
        if k not in allowed:
            hint = difflib.get_close_matches(str(k), allowed, n=1)
            hint_s = f" (did you mean {hint[0]!r}?)" if hint else ""
            raise ConfigError(f"{path}.{k}" if path else str(k), f"unknown key{hint_s}")
    return tbl


def _int(tbl: Mapping[str, Any], key: str, path: str, default: int, lo: int, hi: int) -> int:
    v = tbl.get(key, default)
    # bool is an int subclass, but `workers = true` is a mistake, never a count.
    if isinstance(v, bool) or not isinstance(v, int):
        raise ConfigError(path, f"must be an integer, got {_tname(v)}")
    if not lo <= v <= hi:
        raise ConfigError(path, f"must be between {lo} and {hi}, got {v}")
    return v


def _str(tbl: Mapping[str, Any], key: str, path: str, default: str | None = None) -> str:
    # default None means the key is required.
    if key not in tbl and default is None:
        raise ConfigError(path, "required key is missing")
    if not isinstance(v := tbl.get(key, default), str):
        raise ConfigError(path, f"must be a string, got {_tname(v)}")
    return v


def _strs(tbl: Mapping[str, Any], key: str, path: str, pat: re.Pattern[str],
          what: str) -> tuple[str, ...]:
    v = tbl.get(key, ())
    if not isinstance(v, (list, tuple)):
        raise ConfigError(path, f"must be an array of strings, got {_tname(v)}")
    for i, item in enumerate(v):
        if not isinstance(item, str) or not pat.fullmatch(item):
            raise ConfigError(f"{path}[{i}]", f"{item!r} is not {what}")
        if item in v[:i]:
            raise ConfigError(f"{path}[{i}]", f"{item!r} is listed twice")
    return tuple(v)


def _duration(tbl: Mapping[str, Any], key: str, path: str, default: int, lo: int, hi: int) -> int:
    if key not in tbl:
        return default
    try:
        return parse_duration(tbl[key], path, minimum_ms=lo, maximum_ms=hi)
    except InvalidSpec as exc:
        raise ConfigError(path, exc.message.removeprefix(f"{exc.field}: ")) from exc


_CLUSTER_PATHS = ("secret_file", "tls_cert", "tls_key", "tls_ca")


def _parse_cluster_paths(raw: Any) -> dict[str, str | None]:
    """The optional file paths of [cluster]; TLS needs cert, key and CA together."""
    tbl = {} if not isinstance(raw, Mapping) else raw
    out: dict[str, str | None] = {}
    for key in _CLUSTER_PATHS:
        value = _str(tbl, key, f"cluster.{key}", "") or None
        if value is not None and "\0" in value:
            raise ConfigError(f"cluster.{key}", "must be a path")
        out[key] = value
    tls = [k for k in ("tls_cert", "tls_key", "tls_ca") if out[k]]
    if tls and len(tls) != 3:
        missing = [k for k in ("tls_cert", "tls_key", "tls_ca") if not out[k]]
        raise ConfigError(f"cluster.{missing[0]}", "TLS needs tls_cert, tls_key and tls_ca "
                                                   "together (raftsched certs makes them)")
    return out


def _parse_cluster(raw: Any) -> tuple[str, str | None, tuple[str, ...]]:
    tbl = _section(raw, "cluster", ("data_dir", "secret_env", "allowed_call_prefixes",
                                    *_CLUSTER_PATHS))
    data_dir = _str(tbl, "data_dir", "cluster.data_dir")
    if not data_dir.strip() or "\0" in data_dir:
        raise ConfigError("cluster.data_dir", "must be a non-empty path")
    # "" (TOML has no null) or None says "no secret": a loopback-only cluster.
    env_tbl = {"secret_env": ""} if tbl.get("secret_env", "") is None else tbl
    secret_env = _str(env_tbl, "secret_env", "cluster.secret_env", DEFAULT_SECRET_ENV) or None
    if secret_env is not None and not _ENV_RE.fullmatch(secret_env):
        raise ConfigError("cluster.secret_env", f"{secret_env!r} is not an env variable name")
    prefixes = _strs(tbl, "allowed_call_prefixes", "cluster.allowed_call_prefixes", _DOTTED_RE,
                     'a dotted module name like "pkg.mod"')
    return data_dir, secret_env, prefixes


def _parse_node(raw: Any, i: int) -> NodeConfig:
    p = f"nodes[{i}]"
    raw = _section(raw, p, ("id", *_ROLES, "workers", "queue", "tags"))
    node_id = _str(raw, "id", f"{p}.id")
    # "." and ".." pass the character class but would make node_data_dir escape data_dir.
    if not _NODE_ID_RE.fullmatch(node_id) or node_id in (".", ".."):
        raise ConfigError(f"{p}.id", f"{node_id!r} is not 1-64 of [A-Za-z0-9_.-]")
    addrs = {r: _str(raw, r, f"{p}.{r}", "" if r in _OPTIONAL_ROLES else None) or None
             for r in _ROLES}
    for role, addr in addrs.items():
        host = split_addr(addr, f"{p}.{role}")[0] if addr is not None else None
        # Peers dial the raft address exactly as written, and 0.0.0.0 is not dialable.
        if role == "raft" and host in _WILDCARDS:
            raise ConfigError(f"{p}.raft", f"{addr!r}: peers dial it; use a reachable address")
    workers = _int(raw, "workers", f"{p}.workers", DEFAULT_WORKERS, 1, MAX_WORKERS)
    queue = _int(raw, "queue", f"{p}.queue", workers * DEFAULT_QUEUE_PER_WORKER, 0, MAX_QUEUE)
    tags = _strs(raw, "tags", f"{p}.tags", _TAG_RE, "1-64 of [A-Za-z0-9_.:-]")
    if len(tags) > MAX_TAGS:
        raise ConfigError(f"{p}.tags", f"at most {MAX_TAGS} tags, got {len(tags)}")
    return NodeConfig(id=node_id, raft=addrs["raft"], api=addrs["api"], metrics=addrs["metrics"],
                      http=addrs["http"], workers=workers, queue=queue, tags=tags)


def _parse_nodes(raw: Any) -> tuple[NodeConfig, ...]:
    if not isinstance(raw, (list, tuple)):
        raise ConfigError("nodes", "required key is missing: add [[nodes]] tables" if raw is None
                          else f"must be an array of tables ([[nodes]]), got {_tname(raw)}")
    if not 1 <= len(raw) <= MAX_NODES:
        raise ConfigError("nodes", f"need 1..{MAX_NODES} nodes, got {len(raw)}")
    nodes = tuple(_parse_node(r, i) for i, r in enumerate(raw))
    ids: dict[str, int] = {}
    bound: list[tuple[tuple[str, int], int, str, str]] = []  # (host, port), node, key, addr
    for i, n in enumerate(nodes):
        if n.id in ids:
            raise ConfigError(f"nodes[{i}].id", f"duplicate id {n.id!r} (also nodes[{ids[n.id]}])")
        ids[n.id] = i
        for role in _ROLES:
            if (addr := getattr(n, role)) is None:
                continue
            hp = split_addr(addr, key := f"nodes[{i}].{role}")
            for other_hp, other_i, other_key, other_addr in bound:
                if _addrs_clash(hp, other_hp, other_i == i):
                    raise ConfigError(key, f"{addr} collides with {other_key} ({other_addr}): "
                                           "every address and port must be unique")
            bound.append((hp, i, key, addr))
    return nodes


def _parse_limits(raw: Any) -> Limits:
    tbl = _section(raw, "limits", (*_LIMIT_INTS, "idle_timeout", "done_retention"))
    d = Limits()
    ints = {k: _int(tbl, k, f"limits.{k}", getattr(d, k), *b) for k, b in _LIMIT_INTS.items()}
    idle = _duration(tbl, "idle_timeout", "limits.idle_timeout", d.idle_timeout_ms, 1000,
                     86_400_000)
    done = _duration(tbl, "done_retention", "limits.done_retention", d.done_retention_ms, 0,
                     3650 * 86_400_000)
    lim = Limits(**ints, idle_timeout_ms=idle, done_retention_ms=done)
    # A spec, like an output tail, travels inside one frame with an envelope around it.
    for key in ("max_spec_bytes", "output_tail_bytes"):
        if getattr(lim, key) >= lim.max_frame_bytes:
            raise ConfigError(f"limits.{key}",
                              f"must be below limits.max_frame_bytes ({lim.max_frame_bytes})")
    return lim


def _parse_timing(raw: Any) -> Timing:
    tbl = _section(raw, "timing", tuple(_TIMING_KEYS))
    d = Timing()
    t = Timing(**{f"{k}_ms": _duration(tbl, k, f"timing.{k}", getattr(d, f"{k}_ms"), lo, hi)
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
    tbl = _section(raw, "log", ("level", "format"))
    out = {}
    for key, default, choices in (("level", DEFAULT_LOG_LEVEL, LOG_LEVELS),
                                  ("format", DEFAULT_LOG_FORMAT, LOG_FORMATS)):
        out[key] = _str(tbl, key, f"log.{key}", default).lower()
        if out[key] not in choices:
            raise ConfigError(f"log.{key}", f"{out[key]!r} is not one of {', '.join(choices)}")
    return LogConfig(**out)


def parse_config(data: Mapping[str, Any], *, source: str = "<dict>") -> ClusterConfig:
    """Validate a TOML-shaped dict into a ClusterConfig; pure, raises ConfigError."""
    root = _section(data, "", ("cluster", "nodes", "limits", "timing", "log", "notify"))
    data_dir, secret_env, prefixes = _parse_cluster(root.get("cluster"))
    paths = _parse_cluster_paths(root.get("cluster"))
    return ClusterConfig(
        data_dir=data_dir, secret_env=secret_env, allowed_call_prefixes=prefixes, **paths,
        nodes=_parse_nodes(root.get("nodes")), limits=_parse_limits(root.get("limits")),
        timing=_parse_timing(root.get("timing")), log=_parse_log(root.get("log")),
        notify=parse_notify(root.get("notify"), _section, _int, _duration), source=source,
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
    for role in _ROLES:
        key, addr = f"nodes[{i}].{role}", getattr(node, role)
        if secret is None and addr is not None and not is_loopback(split_addr(addr, key)[0]):
            how = (f"set the {cfg.secret_env} environment variable" if cfg.secret_env
                   else "set cluster.secret_env and export that variable")
            raise ConfigError(key, f"{addr} is not a loopback address; refusing to bind a "
                                   f"non-loopback address without a cluster secret: {how} "
                                   f"(at least {MIN_SECRET_LEN} characters)")
