"""Real node processes on loopback for integration tests.

A :class:`Cluster` (the shared launcher, :mod:`raftsched.faces.launcher`, with the
tests' config: a cluster secret env, ``info`` logs, a short node timeout) writes a
config with free ports, starts ``python -m raftsched node`` processes, and can SIGKILL,
SIGSTOP, SIGCONT and restart them. Jobs record what actually ran by appending their
RAFTSCHED_* environment to a witness file. Every process started here is killed at
``close()``; nothing else is ever signalled.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from raftsched.faces.launcher import (
    LoopbackCluster,
    free_ports,
    json_lines,
    node_argv,
    wait_until,
)

__all__ = ["ROOT", "Cluster", "await_until", "free_ports", "json_lines", "outcomes_by_fire_time",
           "read_witness", "rss_kb", "wait_until", "witness_command"]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


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


def witness_command(path: str, sleep_s: float = 0.0, *, phases: bool = False,
                    tick_s: float = 0.2) -> list[str]:
    """argv that appends one JSON line of the run's identity to ``path`` (then sleeps).

    With ``phases`` each line also has ``pid``, ``forked`` (when the process was forked,
    from /proc: 10 ms ticks) and ``phase``: ``start`` (``t`` is the start), a ``tick``
    every ``tick_s`` while it sleeps (a killed run's last tick bounds when it was still
    alive) and ``end`` (``t`` is the end)."""
    script = (
        "import json,os,sys,time\n"
        "e=os.environ\n"
        "rec={k:e.get('RAFTSCHED_'+k) for k in "
        "('JOB_ID','RUN_ID','SCHEDULED_AT','FENCE','ATTEMPT','NODE_ID')}\n"
        "rec['t']=time.time()\n"
    )
    if not phases:
        return [sys.executable, "-c", script + (
            f"open({path!r},'a').write(json.dumps(rec)+'\\n')\n"
            f"time.sleep({sleep_s})\n")]
    script += (
        "rec['pid']=os.getpid()\n"
        # When the process was forked (its start line may come much later: Python's
        # startup, or a freeze of the whole node right after the spawn).
        "try:\n"
        "    st=open('/proc/self/stat').read().rsplit(')',1)[1].split()\n"
        "    up=float(open('/proc/uptime').read().split()[0])\n"
        "    rec['forked']=time.time()-up+int(st[19])/os.sysconf('SC_CLK_TCK')\n"
        "except Exception:\n"
        "    pass\n"
        "def w(phase):\n"
        "    rec['phase']=phase; rec['t']=time.time()\n"
        f"    with open({path!r},'a') as f: f.write(json.dumps(rec)+'\\n')\n"
        "w('start')\n"
        f"end=time.monotonic()+{sleep_s}\n"
        "while True:\n"
        "    left=end-time.monotonic()\n"
        "    if left<=0: break\n"
        f"    time.sleep(min({tick_s},left))\n"
        "    if time.monotonic()<end: w('tick')\n"
        "w('end')\n"
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


def read_witness(path: str) -> list[dict[str, Any]]:
    """What the jobs recorded (see :func:`witness_command`)."""
    return json_lines(path)


class Cluster(LoopbackCluster):
    """``n`` nodes on loopback under ``tmp``; see the module docstring. ``metrics`` maps
    a node id to its metrics address."""

    def __init__(self, tmp: str, n: int = 3, *, workers: int = 4,
                 timing: dict[str, str] | None = None, secret: str | None = None,
                 allow: tuple[str, ...] = (), tags: dict[str, list[str]] | None = None,
                 http: bool = False, limits: dict[str, object] | None = None,
                 cluster_extra: dict[str, str] | None = None,
                 tls_ca: str | None = None) -> None:
        """``cluster_extra``: more ``[cluster]`` keys (TLS paths, secret_file);
        ``tls_ca``: the CA this harness's clients verify nodes with."""
        super().__init__(tmp, n, secret_env="RS_TEST_SECRET", secret=secret, pythonpath=ROOT,
                         http=http, allowed_call_prefixes=list(allow), limits=limits,
                         tls_ca=tls_ca, cluster_extra=cluster_extra,
                         timing=dict({"node_timeout": "2s", "heartbeat": "250ms"},
                                     **(timing or {})),
                         log_level="info", workers=workers, tags=tags or {})
        self.metrics = self.metrics_addr
        self.workers = workers
        #: Nodes started with another file than ``config`` (added later: new_node()).
        self.configs: dict[str, str] = {}

    def new_node(self, nid: str) -> None:
        """Addresses and a config file for a node not in the cluster's file: the file
        is the cluster's plus this node's table (what an operator writes for a node
        that is to join). Start it with ``start(nid, join=True)``."""
        raft, api, metrics = (f"127.0.0.1:{p}" for p in free_ports(3))
        self.raft[nid], self.api[nid], self.metrics[nid] = raft, api, metrics
        self.ids.append(nid)
        self.logs[nid] = os.path.join(self.tmp, f"{nid}.log")
        path = os.path.join(self.tmp, f"cluster-{nid}.toml")
        with open(self.config, encoding="utf-8") as f:
            text = f.read()
        text += "\n".join(["", "[[nodes]]", f'id = "{nid}"', f'raft = "{raft}"',
                           f'api = "{api}"', f'metrics = "{metrics}"',
                           f"workers = {self.workers}", ""])
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        self.configs[nid] = path

    def start(self, nid: str, env: Any = None, *, join: bool = False) -> None:
        """Start node ``nid``; ``join``: with ``--join`` (a node to be added)."""
        if not join and nid not in self.configs:
            super().start(nid, env)
            return
        if self.alive(nid):
            raise RuntimeError(f"{nid} is already running")
        argv = node_argv(self.configs.get(nid, self.config), nid) + (["--join"] if join else [])
        with open(self.logs[nid], "ab") as log:
            self.procs[nid] = subprocess.Popen(
                argv, stdout=subprocess.DEVNULL, stderr=log, stdin=subprocess.DEVNULL,
                env=self.node_env(env), cwd=self.cwd, start_new_session=True)
