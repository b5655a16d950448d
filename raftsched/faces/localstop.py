"""How ``raftsched local`` stops its cluster so that the runs drain.

A node stopped on its own drains: it starts nothing new and lets its runs finish. But
``local`` stopped every node at once: the idle ones left at once, and the last node
with a run lost its quorum, stopped the run itself (``lost (self-fenced)``) and could not
even commit that; the run came back as attempt 2 at the next start. So the stop is:

1. drain every node through the cluster (``drain`` commands: the leader places nothing
   anywhere, and the quorum stays up);
2. wait (up to the nodes' ``stop_timeout``) until no node holds a run, every outcome
   committed;
3. SIGTERM the nodes that still hold runs first, while the others keep the quorum their
   outcomes need; then the rest.

The drain is replicated, so it outlives the processes: the nodes ``local`` drained are
listed in a file of the data dir and undrained at its next start. A second Ctrl-C skips
the waiting (each node still drains on its own, as a SIGTERM makes it).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from raftsched.wire.client import Client

#: The nodes the last stop drained (undrained at the next start).
MARKER = "drained-by-local.json"
#: A call during the stop: short, the cluster may be half down.
CALL_TIMEOUT_S = 5.0
#: How often the wait asks whether runs are left.
POLL_S = 0.25

Say = Callable[[str], None]


def _marker(data_dir: str) -> str:
    return os.path.join(data_dir, MARKER)


def drain_all(client: Client, data_dir: str, say: Say) -> bool:
    """Drain every node not draining yet (recording which in the marker); False when the
    cluster could not be asked (no quorum): then there is nothing to wait for."""
    try:
        st = client.status()
        # The leader last: a drained leader hands its leadership to a node not draining,
        # so drained first it would go round the cluster, one election per node.
        todo = sorted((n["node_id"] for n in st["nodes"]
                       if not n.get("draining") and not n.get("removed")),
                      key=lambda node_id: (node_id == st.get("leader"), node_id))
        ours = sorted(set(todo) | set(read_marker(data_dir)))
        # Written first: a drain that commits but whose reply is lost is still undone.
        _write_marker(data_dir, ours)
        for node_id in todo:
            client.drain(node_id)
    except Exception as exc:  # noqa: BLE001 - stopping goes on without the drain
        say(f"raftsched local: could not drain the nodes ({exc}); stopping them as they are")
        return False
    return True


def busy_nodes(client: Client) -> dict[str, int] | None:
    """Node -> runs it holds (assigned or started), from a caught-up node; None when no
    such answer came."""
    try:
        st = client.status()
    except Exception:  # noqa: BLE001 - asked again until the deadline
        return None
    if not st.get("consistent") or st.get("leader") is None:
        return None
    return {n["node_id"]: int(n.get("inflight") or 0) for n in st["nodes"]
            if n.get("inflight")}


def wait_idle(client: Client, deadline: float, hurry: threading.Event,
              say: Say) -> dict[str, int] | None:
    """Wait until no node holds a run (or the deadline, or ``hurry``); returns the nodes
    that still hold runs at the end ({}: none; None: the cluster never answered)."""
    busy = busy_nodes(client)
    if busy:
        say(f"raftsched local: draining: waiting for {sum(busy.values())} run(s) on "
            f"{', '.join(sorted(busy))} (Ctrl-C again to stop now)")
    while busy != {} and not hurry.is_set() and time.monotonic() < deadline:
        hurry.wait(POLL_S)
        busy = busy_nodes(client) if not hurry.is_set() else busy
    return busy


def stop_order(procs: Mapping[str, Any], busy: dict[str, int] | None) -> list[list[str]]:
    """The waves nodes are stopped in: those holding runs first (the others keep the
    quorum their outcomes need), then the rest; one wave when none holds any."""
    first = sorted(n for n in procs if busy and n in busy)
    rest = sorted(n for n in procs if n not in first)
    return [wave for wave in (first, rest) if wave]


def read_marker(data_dir: str) -> list[str]:
    try:
        with open(_marker(data_dir), encoding="utf-8") as f:
            nodes = json.load(f).get("nodes", [])
    except (OSError, ValueError, AttributeError):
        return []
    return [n for n in nodes if isinstance(n, str)]


def _write_marker(data_dir: str, nodes: list[str]) -> None:
    tmp = _marker(data_dir) + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"nodes": nodes}, f)
    os.replace(tmp, _marker(data_dir))


def undrain_marked(client_for: Callable[[], Client], data_dir: str, stopping: threading.Event,
                   say: Say) -> None:
    """Undrain the nodes the last stop drained, once the cluster answers (retried until
    it does or ``local`` stops); then forget them."""
    nodes = read_marker(data_dir)
    if not nodes:
        return
    while not stopping.is_set():
        try:
            with client_for() as client:
                for node_id in nodes:
                    client.undrain(node_id)
        except Exception:  # noqa: BLE001 - the cluster is still starting: again
            stopping.wait(1.0)
            continue
        with contextlib.suppress(FileNotFoundError):
            os.unlink(_marker(data_dir))
        say(f"raftsched local: undrained {', '.join(nodes)} (drained by the last stop)")
        return


__all__ = ["MARKER", "busy_nodes", "drain_all", "read_marker", "stop_order",
           "undrain_marked", "wait_idle"]
