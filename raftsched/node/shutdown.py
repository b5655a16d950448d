"""How ``raftsched node`` ends: SIGTERM, SIGINT and SIGHUP stop it cleanly, and always.

The first signal asks the node to stop (drain, ``node.stopped``, exit 0) and starts a
watchdog: a shutdown still running ``limit_s`` later is stuck (a node was seen
ignoring SIGTERM at 90 % CPU), and the process exits with status 1 and one line
saying so. A second signal (a second or more later) exits at once. The handlers are
Python-level (not the event loop's), so they run even while the loop is blocked.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

#: Stopping drains the worker and closes Raft; this is far beyond a healthy stop.
DEFAULT_STOP_LIMIT_S = 30.0
#: Test-only override of the limit (seconds).
STOP_LIMIT_ENV = "RAFTSCHED_STOP_LIMIT_S"
#: A repeated stop signal this long after the first exits at once.
REPEAT_AFTER_S = 1.0
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def stop_limit_s(environ: Mapping[str, str]) -> float:
    try:
        value = float(environ.get(STOP_LIMIT_ENV, ""))
    except ValueError:
        return DEFAULT_STOP_LIMIT_S
    return value if value > 0 else DEFAULT_STOP_LIMIT_S


def _hard_exit(node_id: str, why: str) -> None:
    try:
        os.write(sys.stderr.fileno(), f"raftsched node {node_id}: {why}; exiting now\n"
                 .encode("utf-8", "replace"))
    finally:
        os._exit(1)


def install(stop: Callable[[], None], node_id: str, limit_s: float) -> None:
    """Call ``stop`` (thread-safe: it hands over to the loop) on the first stop signal."""
    signals: list[float] = []

    def watchdog() -> None:
        time.sleep(limit_s)
        _hard_exit(node_id, f"shutdown did not finish within {limit_s:g}s")

    def handler(signum: int, _frame: Any) -> None:
        now = time.monotonic()
        if signals:
            # One signal can arrive twice (to the process and to its group, as
            # `timeout` does): only a repeat a second later means "now".
            if now - signals[0] > REPEAT_AFTER_S:
                _hard_exit(node_id, f"second stop signal ({signal.Signals(signum).name})")
            return
        signals.append(now)
        threading.Thread(target=watchdog, name="raftsched-stop-watchdog", daemon=True).start()
        stop()

    for sig in STOP_SIGNALS:
        signal.signal(sig, handler)
