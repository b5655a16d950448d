"""The ``raftsched node`` process: its config, its stop signals, its metrics endpoint,
and one :class:`~raftsched.node.node.Node` on an event loop until it stops."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
from typing import Any

from raftsched.core.errors import RaftschedError
from raftsched.node import shutdown
from raftsched.node.node import GC_THRESHOLDS, Node, close_in_children
from raftsched.node.observe import events, gcwatch

log = logging.getLogger("raftsched.node")


def run_node(config_path: str | None, node_id: str | None, data_dir: str | None = None,
             join: bool = False) -> int:
    """``raftsched node``: run one node until SIGINT/SIGTERM/SIGHUP; returns the exit code."""
    from raftsched.core.errors import ConfigError
    from raftsched.node.config.config import embedded_default, load_config
    from raftsched.node.metrics import Metrics, Sources, serve_metrics

    early_stop: list[bool] = []
    stop_now: list[Any] = [lambda: early_stop.append(True)]
    try:
        if config_path is None:
            cfg = embedded_default(data_dir or "./raftsched-data")
            node_id = node_id or cfg.nodes[0].id
        else:
            cfg = load_config(config_path)
            if node_id is None:
                if len(cfg.nodes) != 1:
                    raise ConfigError("--id", "the config has several nodes; name one with --id")
                node_id = cfg.nodes[0].id
            if data_dir is not None:
                from dataclasses import replace
                cfg = replace(cfg, data_dir=data_dir)
        events.configure(cfg.log.level, cfg.log.format)
        # From here on a stop signal is ours: one during the boot stops the node as soon
        # as it runs (with node.stopped), never kills it half-built.
        # The watchdog's limit counts after the drain, which may take stop_timeout.
        shutdown.install(lambda: stop_now[0](), node_id,
                         shutdown.stop_limit_s(os.environ) + cfg.timing.stop_timeout_ms / 1000)
        gc.set_threshold(*GC_THRESHOLDS)
        gcwatch.install()
        metrics = Metrics(node_id)
        node = Node(cfg, node_id, metrics=metrics, join=join)
    except (RaftschedError, OSError) as exc:
        import sys
        sys.stderr.write(f"error: {getattr(exc, 'code', 'os_error')}: {exc}\n")
        return 1
    server = None
    if node.me.metrics:
        try:
            server = serve_metrics(node.me.metrics, metrics, Sources(
                raft=node.raft, leader=node.leader, worker_stats=node.worker_stats,
                configured_nodes=len(node.cfg.nodes)))
            close_in_children([server.socket.fileno()])
        except OSError as exc:
            log.error("metrics endpoint %s: %s", node.me.metrics, exc)
            node._release()
            return 1

    async def main() -> None:
        loop = asyncio.get_running_loop()
        stop_now[0] = lambda: loop.call_soon_threadsafe(node.stop)
        if early_stop:
            node.stop()
        await node.run()

    try:
        asyncio.run(main())
    except OSError as exc:
        log.error("node %s could not start: %s", node_id, exc)
        return 1
    finally:
        if server is not None:
            server.shutdown()
    return node.exit_code



__all__ = ["run_node"]
