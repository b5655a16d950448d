"""Callables the benchmark jobs run inside raftsched nodes (``allowed_call_prefixes = ["bench"]``).

``noop`` does nothing. ``stamp`` does nothing but append one line
``<run_id> <attempt> <fence> <call_ms> <node>`` to ``$BENCH_STAMP_DIR/<node>.stamps`` at
the moment the worker thread calls it, so the benchmark can measure the *call* time
(what APScheduler's lag is measured against) and count real executions (doubles),
independently of the replicated run records. The line is written with one unbuffered
``write`` so it survives a SIGKILL of the node right after.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

_lock = threading.Lock()
_fds: dict[str, int] = {}


def noop(ctx: Any) -> None:
    return None


def sleep_half(ctx: Any) -> None:
    """Half a second of a running run (W3's node killed mid-run)."""
    time.sleep(0.5)


def stamp(ctx: Any) -> None:
    call_ms = time.time_ns() // 1_000_000
    folder = os.environ.get("BENCH_STAMP_DIR")
    if not folder:
        return None
    line = f"{ctx.run_id} {ctx.attempt} {ctx.fence} {call_ms} {ctx.node_id}\n".encode()
    with _lock:
        fd = _fds.get(ctx.node_id)
        if fd is None:
            fd = os.open(os.path.join(folder, f"{ctx.node_id}.stamps"),
                         os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            _fds[ctx.node_id] = fd
        os.write(fd, line)
    return None
