"""``raftsched local --nodes N``: a whole cluster on loopback, for trying raftsched.

It writes a cluster config into the data dir, starts one ``raftsched node`` process
per node, prints a readable live feed of the runs across the cluster (from the
nodes' JSON event lines), and stops every node cleanly on Ctrl-C.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import IO, Any

from raftsched.config import load_config

#: Events shown in the live feed (others are still in the nodes' logs).
FEED = ("run.started", "run.finished", "run.ended", "run.missed", "run.skipped", "run.shed",
        "run.start_rejected", "claim.released", "node.lost", "node.back", "leader.changed",
        "job.put", "job.removed", "job.paused", "job.resumed", "node.started", "node.stopped",
        "node.self_fenced")


def write_config(path: str, *, nodes: int, base_port: int, data_dir: str,
                 workers: int = 4) -> None:
    """A loopback cluster config: raft base+i, api base+100+i, metrics base+200+i."""
    lines = ["[cluster]", f'data_dir = {json.dumps(data_dir)}', 'secret_env = "RAFTSCHED_SECRET"',
             "", "[log]", 'format = "json"', ""]
    for i in range(1, nodes + 1):
        lines += ["[[nodes]]", f'id = "n{i}"', f'raft = "127.0.0.1:{base_port + i}"',
                  f'api = "127.0.0.1:{base_port + 100 + i}"',
                  f'metrics = "127.0.0.1:{base_port + 200 + i}"', f"workers = {workers}", ""]
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))


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


def run_local(*, nodes: int = 3, base_port: int = 7000, data_dir: str | None = None,
              out: IO[str] | None = None) -> int:
    """Start ``nodes`` node processes and feed their runs until Ctrl-C/SIGTERM."""
    out = out or sys.stdout
    if not 1 <= nodes <= 9:
        sys.stderr.write("error: --nodes must be 1..9\n")
        return 2
    data_dir = os.path.abspath(data_dir or "./raftsched-local")
    os.makedirs(data_dir, exist_ok=True)
    cfg_path = os.path.join(data_dir, "cluster.toml")
    write_config(cfg_path, nodes=nodes, base_port=base_port, data_dir=data_dir)
    cfg = load_config(cfg_path)
    procs: dict[str, subprocess.Popen[str]] = {}
    lock = threading.Lock()
    stopping = threading.Event()

    def stop(*_: Any) -> None:
        stopping.set()

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    for n in cfg.nodes:
        procs[n.id] = subprocess.Popen(
            [sys.executable, "-m", "raftsched", "node", "--config", cfg_path, "--id", n.id],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            start_new_session=True)
        threading.Thread(target=_pump, args=(n.id, procs[n.id].stderr, out, lock),
                         daemon=True).start()
    addrs = ",".join(n.api for n in cfg.nodes)
    with lock:
        out.write(f"raftsched local: {nodes} nodes, data in {data_dir}\n"
                  f"  try: raftsched status --addr {cfg.nodes[0].api}\n"
                  f"  or:  export RAFTSCHED_ADDR={addrs}\n"
                  "  Ctrl-C stops the cluster.\n")
        out.flush()
    code = 0
    try:
        while not stopping.is_set():
            for node_id, proc in procs.items():
                if proc.poll() is not None:
                    with lock:
                        out.write(f"[{node_id}] exited with {proc.returncode}\n")
                    code = 1
                    stopping.set()
            stopping.wait(0.2)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        for proc in procs.values():
            try:
                proc.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        with lock:
            out.write("raftsched local: stopped\n")
    return code
