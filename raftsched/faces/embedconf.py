"""Which node an embedded Scheduler runs: arguments first, then the environment.

1. ``config="cluster.toml"`` (or ``$RAFTSCHED_CONFIG``) and ``node_id`` (or
   ``$RAFTSCHED_NODE_ID``): member ``node_id`` of that file's cluster.
2. ``peers="n1=RAFT/API,..."`` (or ``$RAFTSCHED_PEERS``) and ``node_id``: the same,
   from one line (see :mod:`raftsched.node.config.peers`), so one image serves every replica.
3. Neither: the single-node default (./raftsched-embedded, 127.0.0.1:7091/7191).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from raftsched.core.errors import ConfigError
from raftsched.node.config.config import ClusterConfig, embedded_default, load_config
from raftsched.node.config.peers import PEERS_ENV, parse_peers

CONFIG_ENV = "RAFTSCHED_CONFIG"
NODE_ID_ENV = "RAFTSCHED_NODE_ID"

#: The embedded node's defaults: apart from ``raftsched node``'s (./raftsched-data,
#: 7001/7101/7201) and from ``raftsched local``'s (7001.., 7101.., 7201..).
DEFAULT_DATA_DIR = "./raftsched-embedded"
DEFAULT_RAFT_ADDR = "127.0.0.1:7091"
DEFAULT_API_ADDR = "127.0.0.1:7191"


def resolve(*, config: str | None, node_id: str | None, peers: str | None,
            data_dir: str | None, api: str | None, raft: str | None, workers: int,
            allow: tuple[str, ...], environ: Mapping[str, str]) -> tuple[ClusterConfig, str]:
    """The cluster config and this member's id; ConfigError naming what is wrong."""
    config = config or environ.get(CONFIG_ENV) or None
    id_key = "node_id" if node_id else NODE_ID_ENV
    node_id = node_id or environ.get(NODE_ID_ENV) or None
    if config is None and peers is None:
        peers = environ.get(PEERS_ENV) or None
    if config is not None and peers is not None:
        raise ConfigError("peers", "give a config file or peers, not both")
    if config is None and peers is None:
        cfg = embedded_default(data_dir or DEFAULT_DATA_DIR)
        node = replace(cfg.nodes[0], workers=workers, queue=workers * 4,
                       api=api or DEFAULT_API_ADDR, raft=raft or DEFAULT_RAFT_ADDR, metrics=None)
        return replace(cfg, nodes=(node,), allowed_call_prefixes=tuple(allow)), node.id
    if api is not None or raft is not None:
        raise ConfigError("api", "api= and raft= are for the single-node default; a member's "
                                 "addresses come from its config or peers")
    if config is not None:
        cfg = load_config(config)
        if data_dir is not None:
            cfg = replace(cfg, data_dir=data_dir)
    else:
        assert peers is not None
        cfg = parse_peers(peers, data_dir=data_dir or DEFAULT_DATA_DIR, workers=workers)
    if node_id is None:
        if len(cfg.nodes) != 1:
            raise ConfigError("node_id", f"the cluster has {len(cfg.nodes)} members; name this "
                                         f"one (node_id= or ${NODE_ID_ENV})")
        node_id = cfg.nodes[0].id
    if node_id not in {n.id for n in cfg.nodes}:
        known = ", ".join(n.id for n in cfg.nodes)
        raise ConfigError(id_key, f"{node_id!r} is not a member (known: {known})")
    return replace(cfg, allowed_call_prefixes=cfg.allowed_call_prefixes + tuple(allow)), node_id
