"""A bench-local loopback cluster of ``python -m raftsched node`` processes.

The shared launcher (:class:`raftsched.faces.launcher.LoopbackCluster`, also behind
``raftsched local`` and the integration tests) tuned for measuring: log level
``warning`` (event logging must not dominate), many worker slots, a large queue,
``allowed_call_prefixes = ["bench"]``, a stamp folder for :mod:`bench.noop`, and helpers
to read RSS/CPU of the node processes and their ``/metrics``. Every process started
here is tracked and killed by :meth:`close` (also from :func:`close_all`, which the
runner calls on Ctrl-C and on exceptions). Nothing else is ever signalled.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from typing import Any

from raftsched.faces.launcher import LoopbackCluster, free_ports, json_lines, wait_until

__all__ = ["ROOT", "BenchCluster", "close_all", "env_timing", "free_ports", "json_lines",
           "now_ms", "proc_cpu_s", "track", "wait_until"]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def proc_cpu_s(pid: int, tree: bool = True) -> float | None:
    """utime + stime of process ``pid`` (all its threads), seconds; ``tree``: also its
    reaped children's (``cutime`` + ``cstime``) and, recursively, its live descendants'.
    None if ``pid`` is gone; a descendant that goes meanwhile is left out."""
    ticks = _ticks(pid, tree)
    return None if ticks is None else ticks / os.sysconf("SC_CLK_TCK")


def _ticks(pid: int, tree: bool) -> int | None:
    # A child reaped between reading the parent and reading the child would be counted
    # twice or not at all: read again until the parent's reaped total did not move.
    for _ in range(5):
        fields = _stat(pid)
        if fields is None:
            return None
        ticks = int(fields[11]) + int(fields[12])
        if not tree:
            return ticks
        reaped = int(fields[13]) + int(fields[14])
        alive = sum(_ticks(child, True) or 0 for child in _children(pid))
        again = _stat(pid)
        if again is None:
            return None
        if int(again[13]) + int(again[14]) == reaped:
            break
    return ticks + reaped + alive


def _stat(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        for i in (1, 11, 12, 13, 14):
            int(fields[i])
        return fields
    except (OSError, IndexError, ValueError):
        return None


def _children(pid: int) -> list[int]:
    """The live children of ``pid`` (of every thread: a thread's fork is its child)."""
    found: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", encoding="ascii") as f:
                found.extend(int(x) for x in f.read().split())
        except (OSError, ValueError):
            continue
    # A pid freed and taken again by another process meanwhile is not a child.
    return [c for c in found if (st := _stat(c)) is not None and int(st[1]) == pid]


def env_timing() -> dict[str, str]:
    """``BENCH_TIMING="lookahead=1s,heartbeat=500ms"``: ``[timing]`` values every bench
    cluster of this invocation gets on top of its own (an experiment with a setting
    without editing a workload; the report's command line does not show it, so say so
    beside the figures)."""
    raw = os.environ.get("BENCH_TIMING", "").strip()
    pairs = [p.split("=", 1) for p in raw.split(",") if p.strip()]
    bad = [p for p in pairs if len(p) != 2 or not p[0].strip() or not p[1].strip()]
    if bad:
        raise SystemExit(f"BENCH_TIMING: expected key=value[,key=value...], got {raw!r}")
    return {k.strip(): v.strip() for k, v in pairs}


#: Every cluster not yet closed, so the runner can kill them all on Ctrl-C.
_LIVE: list[BenchCluster] = []
#: Extra processes (py-spy, baselines) to kill on the way out.
_EXTRA: list[subprocess.Popen[Any]] = []


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def track(proc: subprocess.Popen[Any]) -> subprocess.Popen[Any]:
    _EXTRA.append(proc)
    return proc


def close_all() -> None:
    for c in list(_LIVE):
        c.close()
    for proc in _EXTRA:
        if proc.poll() is None:
            try:
                proc.kill()
                proc.wait(5)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass


class BenchCluster(LoopbackCluster):
    """``n`` nodes under ``tmp``; see the module docstring."""

    status_timeout_s = 3.0
    leader_timeout_s = 30.0
    client_timeout_s = 15.0

    def __init__(self, tmp: str, n: int = 3, *, workers: int = 256, queue: int = 4096,
                 history_limit: int = 1000, timing: dict[str, str] | None = None,
                 log_level: str = "warning", max_jobs: int | None = None,
                 durability: str | None = None) -> None:
        self.stamp_dir = os.path.join(tmp, "stamps")
        os.makedirs(self.stamp_dir, exist_ok=True)
        limits: dict[str, int] = {"history_limit": history_limit}
        if max_jobs is not None:
            limits["max_jobs"] = max_jobs
        # PYTHONDONTWRITEBYTECODE empty: a node keeps its compiled modules, as an
        # installed one does (pip compiles them). A shell that sets it (this machine's
        # does) made every node start, and so every restart measured, compile raftsched
        # from source first: ~0.2 s more per start.
        super().__init__(tmp, n, secret_env="", pythonpath=ROOT, cwd=ROOT,
                         env={"BENCH_STAMP_DIR": self.stamp_dir,
                              "PYTHONDONTWRITEBYTECODE": ""},
                         allowed_call_prefixes=["bench"], limits=limits,
                         timing={**(timing or {}), **env_timing()},
                         log_level=log_level, workers=workers, queue=queue,
                         cluster_extra={"durability": durability} if durability else None)
        _LIVE.append(self)

    def start_tree(self, nid: str, tree: str, env: dict[str, str] | None = None) -> None:
        """Start ``nid`` from the source tree ``tree`` (one node's restart, A/B).

        The working directory is set as well as ``PYTHONPATH``: ``python -m raftsched``
        puts its working directory first on ``sys.path``, so a node started with only
        another tree's ``PYTHONPATH`` still ran this tree (two of the restart A/Bs in
        ``results/2026-12-06-restart-rows.md`` compared one tree with itself so)."""
        cwd, self.cwd = self.cwd, tree
        try:
            self.start(nid, {**(env or {}), "PYTHONPATH": tree})
        finally:
            self.cwd = cwd

    def kill(self, nid: str) -> int:  # type: ignore[override]
        """SIGKILL ``nid``; returns the kill time (epoch ms, taken just before the signal)."""
        return int(super().kill(nid) * 1000)

    def kill_host(self, nid: str) -> int:  # type: ignore[override]
        """SIGKILL ``nid``'s guard and then ``nid`` (a host loss: no death certificate);
        returns the kill time (epoch ms)."""
        return int(super().kill_host(nid) * 1000)

    def close(self) -> None:
        super().close()
        if self in _LIVE:
            _LIVE.remove(self)

    def __enter__(self) -> BenchCluster:
        return self

    def start_with_jobs(self, specs: list[dict[str, Any]]) -> None:
        """Start every node, wait for a leader and every node alive, put ``specs``."""
        self.start_all()
        self.wait_leader(60)
        self.wait_all_alive(60)
        with self.client(timeout=30) as cl:
            cl.call("put_jobs", specs=specs)

    def start_stamping(self, ids: list[str]) -> str:
        """Start every node, put every-second ``bench.noop:stamp`` jobs ``ids`` (1,000 a
        call) once every node is alive; returns the leader (the probes' setup)."""
        self.start_all()
        leader = self.wait_leader(60)
        self.wait_all_alive(60)
        with self.client(timeout=120) as cl:
            for k in range(0, len(ids), 1000):
                cl.call("put_jobs", specs=[{"id": j, "schedule": {"every": "1s"},
                                            "call": "bench.noop:stamp"}
                                           for j in ids[k:k + 1000]])
        return leader

    def wait_all_alive(self, timeout: float = 30.0) -> None:
        """Every running node is alive and connected in the leader's view."""
        def ok() -> bool:
            leader = self.wait_leader(timeout)
            st = self.status(leader)
            seen = {n["node_id"]: n for n in st["nodes"]}
            return all(n in seen and seen[n]["alive"] and seen[n]["connected"]
                       for n in self.ids if self.alive(n))
        wait_until(ok, timeout, "all nodes alive")

    # ---------------------------------------------------------------- measurements

    def rss_kb(self, nid: str, field: str = "VmRSS") -> int | None:
        """The node process's ``field`` of /proc/PID/status (kB): VmRSS, or RssFile (its
        file-backed pages: the journal's mmap) and RssAnon."""
        try:
            with open(f"/proc/{self.pid(nid)}/status", encoding="ascii") as f:
                for line in f:
                    if line.startswith(field + ":"):
                        return int(line.split()[1])
        except OSError:
            return None
        return None

    def cpu_s(self, nid: str, own: bool = False) -> float | None:
        """CPU seconds of the node's process tree: the node process (all its threads),
        the children it has reaped (its snapshot writers: pysyncobj forks one per log
        compaction and waits for it) and the descendants alive now (its guard, a
        writer at work, a job's process). ``own``: the node process alone.

        A writer is work the node does for its runs (at 5,000 runs/s one every ~20-30
        s per node, seconds of CPU each), and /proc counts it in the node only once
        reaped (``cutime``); a writer alive at the first reading and reaped by the
        second is counted live, then reaped, never twice."""
        return proc_cpu_s(self.pid(nid), tree=not own)

    def metrics(self, nid: str, timeout: float = 5.0) -> dict[str, float]:
        """``/metrics`` parsed as ``{"name{labels}": value}``."""
        return self.scrape(nid, timeout)

    def stamps(self) -> list[tuple[str, int, int, int, str]]:
        """Executions recorded by ``bench.noop:stamp``: (run_id, attempt, fence, call_ms, node)."""
        out = []
        for name in sorted(os.listdir(self.stamp_dir)):
            with open(os.path.join(self.stamp_dir, name), encoding="utf-8") as f:
                for line in f:
                    parts = line.split()
                    if len(parts) == 5:
                        out.append((parts[0], int(parts[1]), int(parts[2]), int(parts[3]),
                                    parts[4]))
        return out

    def log_problems(self, limit: int = 20) -> dict[str, list[str]]:
        """Warning/error lines of each node's log (the first ``limit`` distinct ones)."""
        out: dict[str, list[str]] = {}
        for nid, path in self.logs.items():
            if not os.path.exists(path):
                continue
            seen: list[str] = []
            with open(path, encoding="utf-8", errors="replace") as f:
                for line in f:
                    line = line.strip()
                    if not line:
                        continue
                    try:
                        ev = json.loads(line)
                        key = (f"{ev.get('level', '')} {ev.get('event') or ev.get('msg', '')}"
                               f" {ev.get('reason', '')}").strip()
                    except ValueError:
                        key = line[:200]
                    if key not in seen:
                        seen.append(key)
                    if len(seen) >= limit:
                        break
            if seen:
                out[nid] = seen
        return out

    def fetch_runs(self, job_ids: list[str], limit: int, nid: str | None = None,
                   threads: int = 4) -> dict[str, list[dict[str, Any]]]:
        """``runs`` of every job (newest first), fetched from ``nid`` (default: leader).

        One consistent read first (its barrier: the node has then applied every entry
        committed before the fetch), then stale reads of that same node, whose applied
        state only moves forward: each job sees at least everything committed before
        the fetch. A consistent read per job would commit a barrier per job, and under
        load each waits behind the storm's commands (10,000 jobs took minutes)."""
        from concurrent.futures import ThreadPoolExecutor

        target = nid or self.wait_leader()
        if job_ids:
            with self.client([target], timeout=60.0) as c:
                c.runs(job_ids[0], limit=1)
        chunks = [job_ids[i::threads] for i in range(threads)]

        def work(chunk: list[str]) -> dict[str, list[dict[str, Any]]]:
            got = {}
            with self.client([target], timeout=60.0) as c:
                for j in chunk:
                    got[j] = c.runs(j, limit=limit, stale=True)["runs"]
            return got

        out: dict[str, list[dict[str, Any]]] = {}
        with ThreadPoolExecutor(threads) as pool:
            for part in pool.map(work, chunks):
                out.update(part)
        return out
