"""What every workload gets: the run context, logging, and the result shape."""

from __future__ import annotations

import os
import re
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from bench.cluster import BenchCluster, json_lines
from raftsched.faces.launcher import LOCK_HOLD_MAX


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
    (markdown lines), plots (paths), raw figures (kept in the JSON dump) and the Raft
    lock reports of its clusters (``label``, :func:`lock_report`), shown as one table."""

    name: str
    title: str
    tables: list[tuple[str, list[str], list[list[Any]]]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    plots: list[str] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    seconds: float = 0.0
    locks: list[tuple[str, dict[str, Any]]] = field(default_factory=list)


def bulk_batch() -> int:
    """Specs per ``put_jobs`` call: the node's cap (``MAX_PUT_BATCH`` of the tree's
    ``raftsched.core.machine``, or of ``core.state`` in older trees) when it has one, else
    the 5000 the API allowed when this suite was written."""
    import importlib
    for name in ("raftsched.core.machine", "raftsched.core.state"):
        try:
            cap = getattr(importlib.import_module(name), "MAX_PUT_BATCH", None)
        except Exception:  # noqa: BLE001 - the bench must not break on a refactor
            continue
        if cap is not None:
            return int(cap)
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
            elif msg.startswith("raft lock held"):
                msg = "raft lock held over 20 ms (see the lock table)"
            elif msg.startswith("leader silent for"):
                msg = "leader silent past the election timeout: waited out"
            elif msg.startswith(("campaigning in term", "pre-vote granted to",
                                 "stepped down as leader")):
                msg = msg.split(" (")[0]
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


#: A slow-hold line; nodes since issue 13 item 1 also give the holder's CPU time.
_SLOW_HOLD = re.compile(
    r"raft lock held ([\d.]+) ms(?: \(cpu ([\d.]+) ms\))? at (\S+)(?: \((.*)\))?")


def lock_snapshot(c: BenchCluster) -> dict[str, dict[str, float]]:
    """Each running node's Raft lock figures now: ``max_ms`` (the longest hold since
    the node started), ``holds`` and ``over_20ms`` (from the hold histogram)."""
    out: dict[str, dict[str, float]] = {}
    for nid in c.ids:
        try:
            m = c.metrics(nid)
        except OSError:
            continue
        holds = m.get("raftsched_raft_lock_hold_seconds_count", 0.0)
        under = m.get('raftsched_raft_lock_hold_seconds_bucket{le="0.02"}', holds)
        out[nid] = {"max_ms": m.get(LOCK_HOLD_MAX, 0.0) * 1000, "holds": holds,
                    "over_20ms": holds - under}
    return out


def lock_report(c: BenchCluster, before: dict[str, dict[str, float]] | None = None,
                window: tuple[int, int] | None = None) -> dict[str, Any]:
    """The Raft lock figures of a run (call before the cluster closes): the longest hold
    on any node since it started (``max_ms``, by node), the holds over 20 ms since the
    nodes started (``over_20ms``) and since ``before`` (a :func:`lock_snapshot`;
    ``over_20ms_since``), and from the nodes' logs every hold over 20 ms by where it was
    taken (what applied, for an apply), with the longest in ``window`` (wall epoch ms),
    and the longest CPU time the holding thread spent in a slow hold (``cpu_max_ms``;
    the rest of a slow hold is waiting for a core or the GIL)."""
    now = lock_snapshot(c)
    sites: dict[str, dict[str, Any]] = {}
    window_max = 0.0
    for nid, path in c.logs.items():
        for ev in json_lines(path):
            hit = _SLOW_HOLD.match(str(ev.get("msg") or ""))
            if not hit:
                continue
            ms = float(hit.group(1))
            cpu = float(hit.group(2)) if hit.group(2) is not None else None
            what = (hit.group(4) or "").split(" ")
            key = hit.group(3).rsplit(":", 1)[0] + (f" {what[1]}" if len(what) > 1 else "")
            site = sites.setdefault(key, {"n": 0, "max_ms": 0.0, "cpu_max_ms": None,
                                          "nodes": set()})
            site["n"] += 1
            site["max_ms"] = max(site["max_ms"], ms)
            if cpu is not None:
                site["cpu_max_ms"] = max(site["cpu_max_ms"] or 0.0, cpu)
            site["nodes"].add(nid)
            ts = ev.get("ts_ms", 0)
            if window is not None and window[0] <= ts <= window[1]:
                window_max = max(window_max, ms)
    since = {n: v["over_20ms"] - (before or {}).get(n, {}).get("over_20ms", 0.0)
             for n, v in now.items()}
    return {"max_ms": {n: round(v["max_ms"], 1) for n, v in now.items()},
            "max_ms_all": round(max((v["max_ms"] for v in now.values()), default=0.0), 1),
            "over_20ms": {n: int(v["over_20ms"]) for n, v in now.items()},
            "over_20ms_since": {n: int(v) for n, v in since.items()},
            "window_max_ms": round(window_max, 1) if window is not None else None,
            "holds": int(sum(v["holds"] for v in now.values())),
            "cpu_max_ms": max((v["cpu_max_ms"] for v in sites.values()
                               if v["cpu_max_ms"] is not None), default=None),
            "sites": {k: {"n": v["n"], "max_ms": v["max_ms"], "cpu_max_ms": v["cpu_max_ms"],
                          "nodes": sorted(v["nodes"])}
                      for k, v in sorted(sites.items(), key=lambda kv: -kv[1]["max_ms"])}}


def lock_cpu_note(rep: dict[str, Any]) -> str:
    """A note: all holds, and the holding thread's longest CPU time in a slow one."""
    cpu = rep.get("cpu_max_ms")
    return (f"Raft lock holds in all (3 nodes): {fmt(rep.get('holds'))}; the longest CPU "
            "time the holding thread spent in any hold over 20 ms: "
            + (f"{cpu:.1f} ms (the rest of such a hold is waiting for a core, or for the "
               "GIL held by another thread of the node)" if cpu is not None
               else "not reported by these nodes") + ".")


def lock_cells(rep: dict[str, Any]) -> list[str]:
    """Table cells: lock hold max (ms, any node), holds over 20 ms (all nodes), the
    longest holds' sites."""
    top = "; ".join(f"{k} ×{v['n']} ≤{v['max_ms']:.0f}"
                    + (f" (cpu ≤{v['cpu_max_ms']:.1f})" if v.get("cpu_max_ms") is not None
                       else "")
                    for k, v in list(rep["sites"].items())[:3]) or "none over 20 ms"
    return [fmt(rep["max_ms_all"]), fmt(sum(rep["over_20ms"].values())), top]
