"""What every workload gets: the run context, logging, and the result shape."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from bench.cluster import BenchCluster, json_lines


@dataclass
class Ctx:
    """One ``python -m bench`` invocation.

    :var quick: the ``--quick`` sizes.
    :var tmp: scratch folder (clusters, data dirs, logs); removed at the end.
    :var out: the results folder (markdown, PNGs, profile files).
    :var stamp: the results' file stem (``YYYY-MM-DD``).
    :var shared: figures one workload leaves for another (baselines for ratios).
    """

    quick: bool
    tmp: str
    out: str
    stamp: str
    shared: dict[str, Any] = field(default_factory=dict)
    t0: float = field(default_factory=time.monotonic)

    def log(self, msg: str) -> None:
        sys.stderr.write(f"[bench {time.monotonic() - self.t0:6.1f}s] {msg}\n")
        sys.stderr.flush()

    def dir(self, name: str) -> str:
        path = os.path.join(self.tmp, name)
        os.makedirs(path, exist_ok=True)
        return path


@dataclass
class Result:
    """One workload's output: markdown tables (``title``, headers, rows), notes
    (markdown lines), plots (paths) and raw figures (kept in the JSON dump)."""

    name: str
    title: str
    tables: list[tuple[str, list[str], list[list[Any]]]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    plots: list[str] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    seconds: float = 0.0


def bulk_batch() -> int:
    """Specs per ``put_jobs`` call: the node's cap (``raftsched.state.MAX_PUT_BATCH``)
    when it has one, else the 5000 the API allowed when this suite was written."""
    try:
        from raftsched import state
        return int(getattr(state, "MAX_PUT_BATCH", 5000))
    except Exception:  # noqa: BLE001 - the bench must not break on a refactor
        return 5000


def pysyncobj_problems(c: BenchCluster) -> dict[str, dict[str, int]]:
    """Counts of the pysyncobj/raftsched warning+ lines in each node's log, by kind."""
    out: dict[str, dict[str, int]] = {}
    for nid, path in c.logs.items():
        counts: dict[str, int] = {}
        for ev in json_lines(path):
            msg = str(ev.get("event") or ev.get("msg") or "")
            if msg.startswith("truncating already-applied"):
                msg = "truncating already-applied log entries"
            elif msg.startswith("raftCommitIndex"):
                msg = "raftCommitIndex exceeds journal end"
            exc = str(ev.get("exc") or "")
            if exc:
                msg += " / " + exc.strip().splitlines()[-1][:80]
            key = f"{ev.get('level', '?')} {msg[:140]}"
            counts[key] = counts.get(key, 0) + 1
        if counts:
            out[nid] = counts
    return out


def fmt(v: Any, digits: int = 1) -> str:
    """A table cell: None -> '—', floats rounded, ints with thousands separators."""
    if v is None:
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        if abs(v) >= 100:
            return f"{v:,.0f}"
        return f"{v:.{digits}f}" if abs(v) >= 1 or v == 0 else f"{v:.{max(digits, 3)}f}"
    return str(v)
