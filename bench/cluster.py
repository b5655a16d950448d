"""A bench-local loopback cluster of ``python -m raftsched node`` processes.

Like ``tests/integration/harness.Cluster`` but tuned for measuring: log level
``warning`` (event logging must not dominate), many worker slots, a large queue,
``allowed_call_prefixes = ["bench"]``, a stamp folder for :mod:`bench.noop`, and helpers
to read RSS/CPU of the node processes and their ``/metrics``. Every process started
here is tracked and killed by :meth:`close` (also from :func:`close_all`, which the
runner calls on Ctrl-C and on exceptions). Nothing else is ever signalled.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from typing import Any

from raftsched.client import Client

# The test harness's loopback helpers (stdlib only): one copy for tests and benchmarks.
from tests.integration.harness import free_ports, json_lines, wait_until  # noqa: F401

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

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


class BenchCluster:
    """``n`` nodes under ``tmp``; see the module docstring."""

    def __init__(self, tmp: str, n: int = 3, *, workers: int = 256, queue: int = 4096,
                 history_limit: int = 1000, timing: dict[str, str] | None = None,
                 log_level: str = "warning", max_jobs: int | None = None) -> None:
        self.tmp = tmp
        os.makedirs(tmp, exist_ok=True)
        self.ids = [f"n{i}" for i in range(1, n + 1)]
        ports = free_ports(3 * n)
        self.raft = {nid: f"127.0.0.1:{ports[i]}" for i, nid in enumerate(self.ids)}
        self.api = {nid: f"127.0.0.1:{ports[n + i]}" for i, nid in enumerate(self.ids)}
        self.metrics_addr = {nid: f"127.0.0.1:{ports[2 * n + i]}"
                             for i, nid in enumerate(self.ids)}
        self.data_dir = os.path.join(tmp, "data")
        self.stamp_dir = os.path.join(tmp, "stamps")
        os.makedirs(self.stamp_dir, exist_ok=True)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.logs = {nid: os.path.join(tmp, f"{nid}.log") for nid in self.ids}
        self.config = os.path.join(tmp, "cluster.toml")
        lines = ["[cluster]", f"data_dir = {json.dumps(self.data_dir)}",
                 'secret_env = ""', 'allowed_call_prefixes = ["bench"]', "",
                 "[limits]", f"history_limit = {history_limit}"]
        if max_jobs is not None:
            lines.append(f"max_jobs = {max_jobs}")
        lines += ["", "[timing]"]
        lines += [f"{k} = {json.dumps(v)}" for k, v in (timing or {}).items()]
        lines += ["", "[log]", 'format = "json"', f'level = "{log_level}"', ""]
        for nid in self.ids:
            lines += ["[[nodes]]", f'id = "{nid}"', f'raft = "{self.raft[nid]}"',
                      f'api = "{self.api[nid]}"', f'metrics = "{self.metrics_addr[nid]}"',
                      f"workers = {workers}", f"queue = {queue}", ""]
        with open(self.config, "w", encoding="utf-8") as f:
            f.write("\n".join(lines))
        _LIVE.append(self)

    # ---------------------------------------------------------------- processes

    def start(self, nid: str, env: dict[str, str] | None = None) -> None:
        if nid in self.procs and self.procs[nid].poll() is None:
            raise RuntimeError(f"{nid} is already running")
        full = dict(os.environ)
        full["PYTHONPATH"] = ROOT + (os.pathsep + full["PYTHONPATH"]
                                     if full.get("PYTHONPATH") else "")
        full.pop("RAFTSCHED_FAULT", None)
        full["BENCH_STAMP_DIR"] = self.stamp_dir
        full.update(env or {})
        with open(self.logs[nid], "ab") as log:
            self.procs[nid] = subprocess.Popen(
                [sys.executable, "-m", "raftsched", "node", "--config", self.config,
                 "--id", nid],
                stdout=subprocess.DEVNULL, stderr=log, stdin=subprocess.DEVNULL, env=full,
                cwd=ROOT, start_new_session=True)

    def start_all(self) -> None:
        for nid in self.ids:
            self.start(nid)

    def alive(self, nid: str) -> bool:
        return nid in self.procs and self.procs[nid].poll() is None

    def pid(self, nid: str) -> int:
        return self.procs[nid].pid

    def kill(self, nid: str) -> int:
        """SIGKILL ``nid``; returns the kill time (epoch ms, taken just before the signal)."""
        proc = self.procs[nid]
        t = now_ms()
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        return t

    def terminate(self, nid: str, timeout: float = 20.0) -> float:
        """SIGTERM ``nid`` and wait; SIGKILL after ``timeout``. Returns seconds to exit."""
        proc = self.procs[nid]
        t0 = time.monotonic()
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        return time.monotonic() - t0

    def terminate_all(self, timeout: float = 60.0) -> dict[str, float]:
        """SIGTERM every running node at once; seconds until each exited (SIGKILL after
        ``timeout``)."""
        t0 = time.monotonic()
        running = [n for n in self.ids if self.alive(n)]
        for n in running:
            os.kill(self.pid(n), signal.SIGTERM)
        out: dict[str, float] = {}
        for n in running:
            proc = self.procs[n]
            try:
                proc.wait(max(timeout - (time.monotonic() - t0), 0.1))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
            out[n] = time.monotonic() - t0
        return out

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    pass
        if self in _LIVE:
            _LIVE.remove(self)

    def __enter__(self) -> BenchCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------- clients

    def client(self, nids: list[str] | None = None, timeout: float = 15.0) -> Client:
        return Client([self.api[n] for n in (nids or self.ids)], timeout=timeout)

    def status(self, nid: str, timeout: float = 3.0) -> dict[str, Any]:
        with Client([self.api[nid]], timeout=timeout) as c:
            return c.status()

    def wait_leader(self, timeout: float = 30.0, among: list[str] | None = None) -> str:
        """A leader every live node of ``among`` agrees on (and that is alive)."""
        def agreed() -> str | None:
            live = [n for n in (among or self.ids) if self.alive(n)]
            leaders = {self.status(n)["leader"] for n in live}
            if len(leaders) == 1:
                leader = leaders.pop()
                if leader is not None and self.alive(leader):
                    return leader
            return None
        return wait_until(agreed, timeout, "an agreed leader")

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

    def rss_kb(self, nid: str) -> int | None:
        try:
            with open(f"/proc/{self.pid(nid)}/status", encoding="ascii") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1])
        except OSError:
            return None
        return None

    def cpu_s(self, nid: str) -> float | None:
        """utime + stime of the node process (all its threads), seconds."""
        try:
            with open(f"/proc/{self.pid(nid)}/stat", encoding="ascii") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            tck = os.sysconf("SC_CLK_TCK")
            return (int(fields[11]) + int(fields[12])) / tck
        except (OSError, IndexError, ValueError):
            return None

    def metrics(self, nid: str, timeout: float = 5.0) -> dict[str, float]:
        """``/metrics`` parsed as ``{"name{labels}": value}``."""
        url = f"http://{self.metrics_addr[nid]}/metrics"
        with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 - loopback
            text = resp.read().decode()
        out: dict[str, float] = {}
        for line in text.splitlines():
            if not line or line.startswith("#"):
                continue
            key, _, value = line.rpartition(" ")
            try:
                out[key] = float(value)
            except ValueError:
                continue
        return out

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
        """``runs`` of every job (newest first), fetched from ``nid`` (default: leader)."""
        from concurrent.futures import ThreadPoolExecutor

        target = nid or self.wait_leader()
        chunks = [job_ids[i::threads] for i in range(threads)]

        def work(chunk: list[str]) -> dict[str, list[dict[str, Any]]]:
            got = {}
            with self.client([target], timeout=60.0) as c:
                for j in chunk:
                    got[j] = c.runs(j, limit=limit)["runs"]
            return got

        out: dict[str, list[dict[str, Any]]] = {}
        with ThreadPoolExecutor(threads) as pool:
            for part in pool.map(work, chunks):
                out.update(part)
        return out
