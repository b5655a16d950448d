"""Real node processes on loopback for integration tests.

A :class:`Cluster` writes a config with free ports, starts ``python -m raftsched node``
processes, and can SIGKILL, SIGSTOP, SIGCONT and restart them. Jobs record what
actually ran by appending their RAFTSCHED_* environment to a witness file. Every
process started here is killed at ``close()``; nothing else is ever signalled.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from raftsched.client import Client

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def free_ports(n: int) -> list[int]:
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


def wait_until(cond: Callable[[], Any], timeout: float, what: str, interval: float = 0.05) -> Any:
    """Poll ``cond`` until it returns something truthy, or fail naming ``what``."""
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            value = cond()
            if value:
                return value
        except Exception as exc:  # noqa: BLE001 - keep polling, report the last one
            last_exc = exc
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.1f}s waiting for {what}"
                         + (f" (last error: {last_exc!r})" if last_exc else ""))


async def await_until(cond: Callable[[], Any], timeout: float, what: str,
                      interval: float = 0.005) -> Any:
    """:func:`wait_until` inside an event loop: poll without blocking the loop."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        await asyncio.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.1f}s waiting for {what}")


def witness_command(path: str, sleep_s: float = 0.0) -> list[str]:
    """argv that appends one JSON line of the run's identity to ``path`` (then sleeps)."""
    script = (
        "import json,os,sys,time\n"
        "e=os.environ\n"
        "rec={k:e.get('RAFTSCHED_'+k) for k in "
        "('JOB_ID','RUN_ID','SCHEDULED_AT','FENCE','ATTEMPT','NODE_ID')}\n"
        "rec['t']=time.time()\n"
        f"open({path!r},'a').write(json.dumps(rec)+'\\n')\n"
        f"time.sleep({sleep_s})\n"
    )
    return [sys.executable, "-c", script]


def outcomes_by_fire_time(runs: list[dict[str, Any]], step_ms: int = 1000
                          ) -> dict[int, list[str]]:
    """fire time -> the outcomes recorded for it (``state:reason``), range records of
    missed fire times expanded (schedules every ``step_ms``)."""
    out: dict[int, list[str]] = {}
    for run in runs:
        end = run["until_ms"] or run["scheduled_ms"]
        for t in range(run["scheduled_ms"], end + 1, step_ms):
            out.setdefault(t, []).append(f"{run['state']}:{run['reason']}")
    return out


def rss_kb(pid: int) -> int:
    """Resident memory of a process, in kB."""
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def json_lines(path: str) -> list[dict[str, Any]]:
    """The JSON objects of a JSON-lines file (a log, a witness file); other lines, and
    a last line still being written, are skipped. Missing file: none."""
    out: list[dict[str, Any]] = []
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if not line.endswith("\n"):
                    break
                try:
                    obj = json.loads(line)
                except ValueError:
                    continue
                if isinstance(obj, dict):
                    out.append(obj)
    except FileNotFoundError:
        pass
    return out


def read_witness(path: str) -> list[dict[str, Any]]:
    """What the jobs recorded (see :func:`witness_command`)."""
    return json_lines(path)


class Cluster:
    """``n`` nodes on loopback under ``tmp``; see the module docstring."""

    def __init__(self, tmp: str, n: int = 3, *, workers: int = 4,
                 timing: dict[str, str] | None = None, secret: str | None = None,
                 allow: tuple[str, ...] = (), tags: dict[str, list[str]] | None = None) -> None:
        self.tmp = tmp
        self.n = n
        self.ids = [f"n{i}" for i in range(1, n + 1)]
        ports = free_ports(3 * n)
        self.raft = {nid: f"127.0.0.1:{ports[i]}" for i, nid in enumerate(self.ids)}
        self.api = {nid: f"127.0.0.1:{ports[n + i]}" for i, nid in enumerate(self.ids)}
        self.metrics = {nid: f"127.0.0.1:{ports[2 * n + i]}" for i, nid in enumerate(self.ids)}
        self.secret = secret
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.logs: dict[str, str] = {}
        self.config = os.path.join(tmp, "cluster.toml")
        timing = dict({"node_timeout": "2s", "heartbeat": "250ms"}, **(timing or {}))
        lines = ["[cluster]", f"data_dir = {json.dumps(os.path.join(tmp, 'data'))}",
                 'secret_env = "RS_TEST_SECRET"',
                 f"allowed_call_prefixes = {json.dumps(list(allow))}", "", "[timing]"]
        lines += [f"{k} = {json.dumps(v)}" for k, v in timing.items()]
        lines += ["", "[log]", 'format = "json"', 'level = "info"', ""]
        for nid in self.ids:
            lines += ["[[nodes]]", f'id = "{nid}"', f'raft = "{self.raft[nid]}"',
                      f'api = "{self.api[nid]}"', f'metrics = "{self.metrics[nid]}"',
                      f"workers = {workers}", f"tags = {json.dumps((tags or {}).get(nid, []))}",
                      ""]
        with open(self.config, "w", encoding="utf-8") as f:
            f.write("\n".join(lines))

    # ---------------------------------------------------------------- processes

    def start(self, nid: str, env: dict[str, str] | None = None) -> None:
        assert nid not in self.procs or self.procs[nid].poll() is not None, f"{nid} runs"
        full_env = dict(os.environ)
        full_env["PYTHONPATH"] = ROOT + os.pathsep + full_env.get("PYTHONPATH", "")
        full_env.pop("RAFTSCHED_FAULT", None)
        if self.secret:
            full_env["RS_TEST_SECRET"] = self.secret
        full_env.update(env or {})
        log_path = os.path.join(self.tmp, f"{nid}.log")
        self.logs[nid] = log_path
        with open(log_path, "ab") as log:
            self.procs[nid] = subprocess.Popen(
                [sys.executable, "-m", "raftsched", "node", "--config", self.config, "--id", nid],
                stdout=subprocess.DEVNULL, stderr=log, stdin=subprocess.DEVNULL, env=full_env,
                start_new_session=True)

    def start_all(self, env: dict[str, dict[str, str]] | None = None) -> None:
        for nid in self.ids:
            self.start(nid, (env or {}).get(nid))

    def signal(self, nid: str, sig: int) -> None:
        proc = self.procs[nid]
        if proc.poll() is None:
            os.kill(proc.pid, sig)

    def kill(self, nid: str) -> float:
        """SIGKILL the node; returns the time of the kill."""
        t = time.time()
        self.signal(nid, signal.SIGKILL)
        self.procs[nid].wait(10)
        return t

    def alive(self, nid: str) -> bool:
        return nid in self.procs and self.procs[nid].poll() is None

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                try:
                    os.kill(proc.pid, signal.SIGCONT)
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait(10)

    # ---------------------------------------------------------------- clients

    def client(self, nids: list[str] | None = None, timeout: float = 10.0) -> Client:
        return Client([self.api[n] for n in (nids or self.ids)], secret=self.secret,
                      timeout=timeout)

    def status(self, nid: str) -> dict[str, Any]:
        with Client([self.api[nid]], secret=self.secret, timeout=2.0) as c:
            return c.status()

    def wait_leader(self, timeout: float = 20.0, among: list[str] | None = None) -> str:
        """Wait until a live node reports a leader that is alive and every live node of
        ``among`` agrees; returns the leader id."""
        among = [n for n in (among or self.ids) if self.alive(n)]

        def agreed() -> str | None:
            leaders = set()
            for nid in among:
                st = self.status(nid)
                leaders.add(st["leader"])
            if len(leaders) == 1:
                leader = leaders.pop()
                if leader is not None and self.alive(leader):
                    return leader
            return None

        return wait_until(agreed, timeout, f"a leader agreed by {among}")

    def events(self, nid: str) -> list[dict[str, Any]]:
        path = self.logs.get(nid)
        return json_lines(path) if path else []
