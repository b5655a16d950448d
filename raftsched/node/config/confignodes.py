"""The ``[[nodes]]`` table of the cluster config: each member's id, addresses,
capacity and tags, validated, and no two of the cluster's addresses colliding.

Part of :mod:`raftsched.node.config.config` (which re-exports these names), apart because
addresses have rules of their own (dialable, loopback, clashes) that the cluster-level
settings never need.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Any

from raftsched.core.errors import ConfigError
from raftsched.node.config.configvalues import read_int, read_str, read_strs, section, tname

DEFAULT_WORKERS = 4  # shows parallelism, still leaves a laptop responsive
#: queue = workers x 4 covers a few lookaheads of short jobs; a lost node strands little.
DEFAULT_QUEUE_PER_WORKER = 4
MAX_WORKERS = 1024  # past this a node is misconfigured, not big: each worker is a process
MAX_QUEUE = 100_000  # past this it is a backlog the leader should place elsewhere
MAX_NODES = 9  # commits wait on a majority; more nodes cost latency for no real gain
MAX_TAGS = 32  # placement matches tags per run; keep the per-node set small

NODE_ID_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_TAG_RE = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
_LABEL_RE = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeConfig:
    """One cluster member.

    id: unique name, also the name of its data subfolder.
    raft: host:port peers dial for Raft traffic (must be a concrete address).
    api: host:port clients dial for the API.
    metrics: host:port of the Prometheus endpoint, or None for no endpoint.
    http: host:port of the HTTP/JSON API and dashboard, or None (the default: off); it
        speaks HTTPS (the node's tls_cert) whenever the cluster has TLS configured.
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


_WILDCARDS = ("0.0.0.0", "::")
ROLES = ("raft", "api", "metrics", "http")
#: Roles that are optional (off unless set).
_OPTIONAL_ROLES = ("metrics", "http")


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
        raise ConfigError(key, f'must be a "host:port" string, got {tname(addr)}')
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


def _parse_node(raw: Any, i: int) -> NodeConfig:
    p = f"nodes[{i}]"
    raw = section(raw, p, ("id", *ROLES, "workers", "queue", "tags"))
    node_id = read_str(raw, "id", f"{p}.id")
    # "." and ".." pass the character class but would make node_data_dir escape data_dir.
    if not NODE_ID_RE.fullmatch(node_id) or node_id in (".", ".."):
        raise ConfigError(f"{p}.id", f"{node_id!r} is not 1-64 of [A-Za-z0-9_.-]")
    addrs = {r: read_str(raw, r, f"{p}.{r}", "" if r in _OPTIONAL_ROLES else None) or None
             for r in ROLES}
    for role, addr in addrs.items():
        host = split_addr(addr, f"{p}.{role}")[0] if addr is not None else None
        # Peers dial the raft address exactly as written, and 0.0.0.0 is not dialable.
        if role == "raft" and host in _WILDCARDS:
            raise ConfigError(f"{p}.raft", f"{addr!r}: peers dial it; use a reachable address")
    workers = read_int(raw, "workers", f"{p}.workers", DEFAULT_WORKERS, 1, MAX_WORKERS)
    queue = read_int(raw, "queue", f"{p}.queue", workers * DEFAULT_QUEUE_PER_WORKER, 0, MAX_QUEUE)
    tags = read_strs(raw, "tags", f"{p}.tags", _TAG_RE, "1-64 of [A-Za-z0-9_.:-]")
    if len(tags) > MAX_TAGS:
        raise ConfigError(f"{p}.tags", f"at most {MAX_TAGS} tags, got {len(tags)}")
    # raft and api are required (read_str raised without them): never None here.
    return NodeConfig(id=node_id, raft=addrs["raft"] or "", api=addrs["api"] or "",
                      metrics=addrs["metrics"],
                      http=addrs["http"], workers=workers, queue=queue, tags=tags)


def parse_nodes(raw: Any) -> tuple[NodeConfig, ...]:
    if not isinstance(raw, (list, tuple)):
        raise ConfigError("nodes", "required key is missing: add [[nodes]] tables" if raw is None
                          else f"must be an array of tables ([[nodes]]), got {tname(raw)}")
    if not 1 <= len(raw) <= MAX_NODES:
        raise ConfigError("nodes", f"need 1..{MAX_NODES} nodes, got {len(raw)}")
    nodes = tuple(_parse_node(r, i) for i, r in enumerate(raw))
    ids: dict[str, int] = {}
    bound: list[tuple[tuple[str, int], int, str, str]] = []  # (host, port), node, key, addr
    for i, n in enumerate(nodes):
        if n.id in ids:
            raise ConfigError(f"nodes[{i}].id", f"duplicate id {n.id!r} (also nodes[{ids[n.id]}])")
        ids[n.id] = i
        for role in ROLES:
            if (addr := getattr(n, role)) is None:
                continue
            hp = split_addr(addr, key := f"nodes[{i}].{role}")
            for other_hp, other_i, other_key, other_addr in bound:
                if _addrs_clash(hp, other_hp, other_i == i):
                    raise ConfigError(key, f"{addr} collides with {other_key} ({other_addr}): "
                                           "every address and port must be unique")
            bound.append((hp, i, key, addr))
    return nodes


