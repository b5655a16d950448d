"""App instances with an embedded raftsched member (``tests/support/embedapp.py``)
as real processes: several instances of one cluster on loopback, or one gunicorn with
several workers on one host. Every process started here is killed at ``close()``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from raftsched.faces.launcher import kill_group
from raftsched.wire.client import Client
from tests.support.harness import ROOT, free_ports, json_lines, wait_until

#: Fast failure detection on a loaded 2-core machine, still far from false alarms.
TIMING = {"node_timeout": "3s", "heartbeat": "250ms"}


class Apps:
    """``n`` members of one cluster under ``tmp``; instances start by member id."""

    def __init__(self, tmp: str, n: int = 3, *, workers: int = 4) -> None:
        self.tmp = tmp
        self.ids = [f"n{i}" for i in range(1, n + 1)]
        ports = free_ports(2 * n)
        self.raft = {nid: f"127.0.0.1:{ports[i]}" for i, nid in enumerate(self.ids)}
        self.api = {nid: f"127.0.0.1:{ports[n + i]}" for i, nid in enumerate(self.ids)}
        self.witness = os.path.join(tmp, "witness.jsonl")
        self.config = os.path.join(tmp, "cluster.toml")
        self.secret = "embedded-cluster-test-secret-0123456789"
        lines = ["[cluster]", f"data_dir = {json.dumps(os.path.join(tmp, 'data'))}",
                 'secret_env = "RS_APP_SECRET"', "", "[timing]"]
        lines += [f"{k} = {json.dumps(v)}" for k, v in TIMING.items()]
        for nid in self.ids:
            lines += ["", "[[nodes]]", f'id = "{nid}"', f'raft = "{self.raft[nid]}"',
                      f'api = "{self.api[nid]}"', f"workers = {workers}"]
        with open(self.config, "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.outs: dict[str, str] = {}
        self.peers = ",".join(f"{nid}={self.raft[nid]}/{self.api[nid]}" for nid in self.ids)

    def env(self, nid: str, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
        env.update({"RAFTSCHED_CONFIG": self.config, "RAFTSCHED_NODE_ID": nid,
                    "RS_APP_SECRET": self.secret, "EMBEDAPP_WITNESS": self.witness,
                    "PYTHONUNBUFFERED": "1"})
        env.update(extra or {})
        return env

    def start(self, nid: str, extra: dict[str, str] | None = None,
              argv: list[str] | None = None) -> subprocess.Popen[bytes]:
        """Start instance ``nid`` (``python -m tests.support.embedapp`` unless
        ``argv`` says otherwise); its stdout and stderr go to ``<tmp>/<nid>.out``."""
        assert nid not in self.procs or self.procs[nid].poll() is not None, f"{nid} runs"
        out = os.path.join(self.tmp, f"{nid}.out")
        self.outs[nid] = out
        with open(out, "ab") as f:
            self.procs[nid] = subprocess.Popen(
                argv or [sys.executable, "-m", "tests.support.embedapp"],
                stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=ROOT,
                env=self.env(nid, extra), start_new_session=True)
        return self.procs[nid]

    def declared(self, nid: str) -> list[dict[str, Any]]:
        """The ``declared`` lines instance ``nid``'s processes printed so far."""
        return [d["declared"] for d in json_lines(self.outs.get(nid, "")) if "declared" in d]

    def signal(self, nid: str, sig: int) -> None:
        proc = self.procs[nid]
        if proc.poll() is None:
            os.kill(proc.pid, sig)

    def stop(self, nid: str, timeout: float = 60) -> int:
        """SIGTERM (a drain) and wait; the exit code."""
        self.signal(nid, signal.SIGTERM)
        return self.procs[nid].wait(timeout)

    def kill(self, nid: str) -> None:
        self.signal(nid, signal.SIGKILL)
        self.procs[nid].wait(10)

    def client(self, timeout: float = 10.0) -> Client:
        return Client([self.api[n] for n in self.ids], secret=self.secret, timeout=timeout)

    def holds(self, nid: str) -> int | None:
        """Runs instance ``nid``'s worker holds: waiting for their instant, running, or
        waiting for their finish to commit (its own ``status``); None if it does not
        answer."""
        try:
            with Client([self.api[nid]], secret=self.secret, timeout=2.0) as cl:
                worker = cl.status(stale=True)["worker"]
        except Exception:  # noqa: BLE001 - not answering is an answer here
            return None
        return int(worker["waiting"]) + int(worker["busy"])

    def close(self) -> None:
        for proc in self.procs.values():
            kill_group(proc)

    def tail(self, nid: str, n: int = 3000) -> str:
        try:
            with open(self.outs[nid], encoding="utf-8", errors="replace") as f:
                return f.read()[-n:]
        except (KeyError, OSError):
            return ""


def executions(witness: str) -> Counter[str]:
    """run id -> how many executions the witness file saw."""
    return Counter(w["run_id"] for w in json_lines(witness))


def quiet_moment(witness: str, jobs: int, timeout: float = 30.0, *,
                 idle: Callable[[], int | None] | None = None) -> None:
    """Return inside a gap between fire times: every one of ``jobs`` 1 s jobs executed
    the newest fire time at least 0.2 s ago and the next is at least 0.35 s away. A
    SIGKILL then ends no callable between its effect and its recorded finish (that
    case is at-least-once by design: ``on_node_lost`` retries it). ``idle`` (e.g.
    ``lambda: apps.holds(nid)``) must also say 0: the node about to be killed or frozen
    holds nothing, so its finishes are committed too (0.2 s after the last call does not
    promise that on a loaded machine: the finish is forwarded, synced and committed)."""

    def quiet() -> bool:
        lines = json_lines(witness)
        if not lines:
            return False
        newest = max(int(w["run_id"].rsplit("@", 1)[1]) for w in lines)
        at_newest = [w for w in lines if w["run_id"].endswith(f"@{newest}")]
        now = time.time()
        if not (len({w["job"] for w in at_newest}) == jobs
                and now - max(w["t"] for w in at_newest) > 0.2
                and now < newest / 1000 + 0.65):
            return False
        if idle is None:
            return True
        # Asked after the timing above, so the gap is checked again after the answer.
        return idle() == 0 and time.time() < newest / 1000 + 0.65

    wait_until(quiet, timeout, "a quiet moment between fire times", interval=0.01)


def fire_times(witness: str) -> dict[str, list[int]]:
    """job -> the fire times executed (ms), sorted, with repeats."""
    out: dict[str, list[int]] = {}
    for w in json_lines(witness):
        out.setdefault(w["job"], []).append(int(w["run_id"].rsplit("@", 1)[1]))
    return {job: sorted(ts) for job, ts in out.items()}
