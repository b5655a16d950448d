"""A cluster's members from one line (``RAFTSCHED_PEERS``), so one image serves every replica.

Format (**contract**, docs/embedded.md "A cluster inside your app")::

    ID=RAFT_HOST:PORT/API_HOST:PORT[/METRICS_HOST:PORT],ID=...

for example ``n1=127.0.0.1:7001/127.0.0.1:7101,n2=127.0.0.1:7002/127.0.0.1:7102``.
Spaces around items are ignored. Everything else takes the config file's defaults;
``parse_config`` validates the result, so errors name ``RAFTSCHED_PEERS[i]``.
"""

from __future__ import annotations

import re
from typing import Any

from raftsched.core.errors import ConfigError
from raftsched.node.config.config import (
    DEFAULT_SECRET_ENV,
    DEFAULT_WORKERS,
    ClusterConfig,
    parse_config,
)

PEERS_ENV = "RAFTSCHED_PEERS"
_ITEM_RE = re.compile(r"(?P<id>[^=\s]+)\s*=\s*(?P<addrs>\S+)")


def parse_peers(text: str, *, data_dir: str, workers: int = DEFAULT_WORKERS,
                secret_env: str | None = DEFAULT_SECRET_ENV,
                allowed_call_prefixes: tuple[str, ...] = (),
                key: str = PEERS_ENV) -> ClusterConfig:
    """The cluster config that ``text`` describes; ConfigError naming ``key[i]``."""
    if not isinstance(text, str) or not text.strip():
        raise ConfigError(key, "must list the members: ID=RAFT_HOST:PORT/API_HOST:PORT,...")
    nodes: list[dict[str, Any]] = []
    for i, item in enumerate(p.strip() for p in text.split(",")):
        m = _ITEM_RE.fullmatch(item)
        parts = m.group("addrs").split("/") if m else []
        if m is None or len(parts) not in (2, 3):
            raise ConfigError(f"{key}[{i}]", f"{item!r} is not ID=RAFT_HOST:PORT/API_HOST:PORT"
                                             "[/METRICS_HOST:PORT]")
        node: dict[str, Any] = {"id": m.group("id"), "raft": parts[0], "api": parts[1],
                                "workers": workers}
        if len(parts) == 3:
            node["metrics"] = parts[2]
        nodes.append(node)
    cluster = {"data_dir": data_dir, "secret_env": secret_env or "",
               "allowed_call_prefixes": list(allowed_call_prefixes)}
    try:
        return parse_config({"cluster": cluster, "nodes": nodes}, source=key)
    except ConfigError as exc:
        field = exc.key.replace("nodes", key, 1) if exc.key.startswith("nodes") else exc.key
        raise ConfigError(field, exc.message.partition(": ")[2] or exc.message) from None
