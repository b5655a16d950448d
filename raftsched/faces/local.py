"""``raftsched local --nodes N``: a whole cluster on loopback, for trying raftsched.

It writes a cluster config into the data dir, starts one ``raftsched node`` process
per node, prints a readable live feed of the runs across the cluster (from the
nodes' JSON event lines), and on Ctrl-C drains the cluster, then stops every node
(:mod:`raftsched.faces.localstop`). It checks every port first (:mod:`raftsched.node.ports`).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import IO, Any

from raftsched.faces import localstop
from raftsched.faces.launcher import (
    NodeAddrs,
    base_layout,
    config_text,
    spawn_node,
    terminate_procs,
)
from raftsched.node import ports
from raftsched.node.config.config import DEFAULT_SECRET_ENV, load_config
from raftsched.wire.client import Client
from raftsched.wire.secretfile import load_or_create_secret

#: Events shown in the live feed (others are still in the nodes' logs): a run is two
#: lines, its start (the node running it) and its end (the leader's record of it; the
#: worker's own run.finished would be a third line saying the same). A start refused
#: because the run moved on is the node's business: the run's end line tells its fate.
FEED = ("run.started", "run.ended", "run.missed", "run.skipped", "run.shed",
        "claim.released", "node.lost", "node.back", "leader.changed",
        "job.put", "job.removed", "job.paused", "job.resumed", "node.started", "node.stopped",
        "node.self_fenced", "quorum.lost", "quorum.back")


def write_config(path: str, *, nodes: int, base_port: int, data_dir: str,
                 workers: int = 4) -> None:
    """A loopback cluster config: raft base+i, api base+100+i, metrics base+200+i,
    HTTP API and dashboard base+300+i."""
    with open(path, "w", encoding="utf-8") as f:
        f.write(config_text(base_layout(nodes, base_port), data_dir=data_dir,
                            secret_env=DEFAULT_SECRET_ENV, workers=workers))


def layout_ports(layout: list[NodeAddrs]) -> list[tuple[str, str]]:
    """``(what, addr)`` of every port the nodes of ``layout`` listen on."""
    out = []
    for n in layout:
        out += [(f"{n.id} raft", n.raft), (f"{n.id} api", n.api),
                (f"{n.id} metrics", n.metrics)]
        if n.http is not None:
            out.append((f"{n.id} http", n.http))
    return out


def check_ports(layout: list[NodeAddrs]) -> str | None:
    """None when every port of ``layout`` is free, else the error to print: all or
    nothing, since a node restart-looping on a taken port beside nodes that formed a
    cluster without it looks like a working cluster (and the taken API port may be
    another cluster's)."""
    top = max(int(addr.rpartition(":")[2]) for _, addr in layout_ports(layout))
    if top > 65535:
        return f"--base-port: the layout would need port {top}; ports end at 65535"
    busy = ports.taken(layout_ports(layout))
    if not busy:
        return None
    lines = [f"raftsched local: {t.describe()}" for t in busy]
    them = "it" if len(busy) == 1 else "them"
    lines.append(f"raftsched local: started nothing; stop what holds {them} or choose "
                 f"another --base-port (the nodes use P+1.., P+101.., P+201.., P+301..)")
    return "\n".join(lines)


def format_event(node_id: str, line: str) -> str | None:
    """One feed line for a node's log line, or None when it is not shown."""
    try:
        ev = json.loads(line)
    except ValueError:
        return f"[{node_id}] {line.rstrip()}" if line.strip() else None
    if not isinstance(ev, dict):
        return None
    kind = ev.get("event")
    if kind is None:
        if ev.get("level") in ("ERROR", "CRITICAL"):
            return f"[{node_id}] error {ev.get('logger')}: {ev.get('msg')}"
        return None
    if kind not in FEED:
        return None
    if kind == "leader.changed" and ev.get("leader") != node_id:
        return None  # every node applies it: the new leader's line says it once
    stamp = time.strftime("%H:%M:%S", time.gmtime(ev.get("ts_ms", 0) / 1000))
    stamp += f".{ev.get('ts_ms', 0) % 1000:03d}"
    skip = {"ts_ms", "event", "node", "run_id", "job_id", "outcome"}
    extra = " ".join(f"{k}={v}" for k, v in ev.items() if k not in skip)
    parts = [f"{stamp} [{node_id}] {kind:<18}"]
    if ev.get("run_id"):
        parts.append(ev["run_id"])
    elif ev.get("job_id"):
        parts.append(ev["job_id"])
    if ev.get("outcome"):
        parts.append(f"-> {ev['outcome']}")
    if extra:
        parts.append(extra)
    return " ".join(parts)


def _pump(node_id: str, stream: IO[str], out: IO[str], lock: threading.Lock) -> None:
    for line in stream:
        text = format_event(node_id, line)
        if text:
            with lock:
                out.write(text + "\n")
                out.flush()


#: A node that dies is restarted after this, doubling per quick death up to the cap.
RESTART_BACKOFF_S = (0.5, 10.0)
#: A node that stayed up this long counts as healthy again (its backoff resets).
HEALTHY_AFTER_S = 30.0
#: Deaths in a row, each before HEALTHY_AFTER_S, after which a node is left down.
MAX_QUICK_DEATHS = 8


def _died(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with {code}"


class _Member:
    """One node process of the local cluster and its restart bookkeeping."""

    def __init__(self, node_id: str, config: str) -> None:
        self.node_id = node_id
        self.config = config
        self.proc: subprocess.Popen[str] | None = None
        self.started = 0.0
        self.quick_deaths = 0
        self.restart_at: float | None = None
        self.pump: threading.Thread | None = None

    def spawn(self, out: IO[str], lock: threading.Lock) -> None:
        self.proc = spawn_node(self.config, self.node_id, stderr=subprocess.PIPE, text=True)
        self.started = time.monotonic()
        self.restart_at = None
        self.pump = threading.Thread(target=_pump, daemon=True,
                                     args=(self.node_id, self.proc.stderr, out, lock))
        self.pump.start()

    def backoff(self) -> float:
        lo, hi = RESTART_BACKOFF_S
        return min(lo * 2 ** max(self.quick_deaths - 1, 0), hi)


def _drain_then_stop(procs: dict[str, subprocess.Popen[str]], client: Callable[[], Client],
                     data_dir: str, stop_timeout_s: float, hurry: threading.Event,
                     say: Callable[[str], None]) -> None:
    """Stop the nodes so that their runs drain and commit their outcomes (see
    :mod:`raftsched.faces.localstop`); a second stop signal cuts every wait short."""
    with client() as cl:
        say("raftsched local: stopping: draining every node (no new runs start)")
        busy = (localstop.wait_idle(cl, time.monotonic() + stop_timeout_s, hurry, say)
                if localstop.drain_all(cl, data_dir, say) else None)
    for wave in localstop.stop_order(procs, busy):
        if hurry.is_set():
            return
        if busy:
            say(f"raftsched local: stopping {', '.join(wave)}")
        for node_id in wave:
            with contextlib.suppress(ProcessLookupError):
                procs[node_id].send_signal(signal.SIGTERM)
        # Each drains for up to stop_timeout, then commits its outcomes and leaves.
        until = time.monotonic() + stop_timeout_s + 10
        while (any(procs[n].poll() is None for n in wave) and not hurry.is_set()
               and time.monotonic() < until):
            hurry.wait(0.1)


def run_local(*, nodes: int = 3, base_port: int = 7000, data_dir: str | None = None,
              out: IO[str] | None = None) -> int:
    """Start ``nodes`` node processes and feed their runs until Ctrl-C/SIGTERM; a node
    that dies is reported in the feed and restarted (bounded backoff)."""
    out = out or sys.stdout
    if not 1 <= nodes <= 9:
        sys.stderr.write("error: --nodes must be 1..9\n")
        return 2
    problem = check_ports(base_layout(nodes, base_port))
    if problem is not None:
        sys.stderr.write(problem + "\n")
        return 1
    data_dir = os.path.abspath(data_dir or "./raftsched-local")
    os.makedirs(data_dir, exist_ok=True)
    cfg_path = os.path.join(data_dir, "cluster.toml")
    write_config(cfg_path, nodes=nodes, base_port=base_port, data_dir=data_dir)
    cfg = load_config(cfg_path)
    secret_line = ""
    secret = os.environ.get(DEFAULT_SECRET_ENV) or None
    if secret is None:
        # Made before the nodes start: they share it (and never race to make it).
        secret, secret_path = load_or_create_secret(data_dir)
        secret_line = (f"  the cluster secret is in {secret_path}; this user's clients on "
                       f"this host find it\n")
    lock = threading.Lock()
    stopping = threading.Event()
    hurry = threading.Event()  # a second stop signal: stop now, without the drain

    def stop(*_: Any) -> None:
        if stopping.is_set():
            hurry.set()
        stopping.set()

    def client() -> Client:
        return Client([n.api for n in cfg.nodes], secret=secret,
                      timeout=localstop.CALL_TIMEOUT_S)

    def say(text: str) -> None:
        with lock:
            out.write(text + "\n")
            out.flush()

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    # A closed terminal: the nodes run in sessions of their own and would outlive us.
    signal.signal(signal.SIGHUP, stop)
    members = [_Member(n.id, cfg_path) for n in cfg.nodes]
    for m in members:
        m.spawn(out, lock)
    addrs = ",".join(n.api for n in cfg.nodes)
    table = "\n".join(f"  {n.id}  pid {m.proc.pid if m.proc else '-'}  api {n.api}  "
                      f"raft {n.raft}  metrics {n.metrics}"
                      for n, m in zip(cfg.nodes, members, strict=True))
    say(f"raftsched local: {nodes} nodes, data in {data_dir}\n{table}\n"
        f"  try: raftsched status --addr {cfg.nodes[0].api}\n"
        f"  or:  export RAFTSCHED_ADDR={addrs}\n"
        f"  dashboard: http://{cfg.nodes[0].http}/ (its token: raftsched http-token --url)\n"
        f"{secret_line}"
        "  a node that dies is restarted; Ctrl-C stops the cluster (its runs drain first).")
    if localstop.read_marker(data_dir):
        threading.Thread(target=localstop.undrain_marked, daemon=True,
                         args=(client, data_dir, stopping, say)).start()
    code = 0
    try:
        while not stopping.is_set():
            now = time.monotonic()
            for m in members:
                proc = m.proc
                if proc is not None and m.restart_at is None and proc.poll() is not None:
                    m.quick_deaths = 1 if now - m.started >= HEALTHY_AFTER_S \
                        else m.quick_deaths + 1
                    if m.quick_deaths > MAX_QUICK_DEATHS:
                        say(f"[{m.node_id}] {_died(proc.returncode)}; died {MAX_QUICK_DEATHS} "
                            f"times in a row, left down (see its messages above)")
                        m.proc, code = None, 1
                        continue
                    m.restart_at = now + m.backoff()
                    say(f"[{m.node_id}] {_died(proc.returncode)} (pid {proc.pid}); restarting "
                        f"in {m.backoff():g}s")
                elif m.restart_at is not None and now >= m.restart_at:
                    m.spawn(out, lock)
                    say(f"[{m.node_id}] restarted (pid {m.proc.pid if m.proc else '-'})")
            if all(m.proc is None for m in members):
                break
            stopping.wait(0.2)
    finally:
        running = {m.node_id: m.proc for m in members
                   if m.proc is not None and m.proc.poll() is None}
        if running and stopping.is_set() and not hurry.is_set():
            _drain_then_stop(running, client, data_dir,
                             cfg.timing.stop_timeout_ms / 1000, hurry, say)
        deadline = time.monotonic() + 10
        # Whatever is left (all of them after a second Ctrl-C): at once, as before.
        terminate_procs({m.node_id: m.proc for m in members if m.proc is not None}, 10)
        for m in members:  # the nodes' last lines (node.stopped) reach the feed first
            if m.pump is not None:
                m.pump.join(max(deadline - time.monotonic(), 1.0))
        say("raftsched local: stopped")
    return code
