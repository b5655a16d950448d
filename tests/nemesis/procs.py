"""Node processes inside their namespaces, each in its own cgroup v1 freezer group.

A node is started through ``sh -c 'echo $$ > GROUP/cgroup.procs; exec ip netns exec NS
python -m raftsched node ...'``: neither the shell nor ``ip netns exec`` forks, so
the pid we hold is the node's, and the node's guard and job processes are born in the
group: freezing it pauses the node, its guard and its jobs together (a paused VM).
Every process is killed by pid: the node by its own, the rest by the pids listed in
its freezer group. Each node's journal is a ``journalhooks.LossyFile``: a killed node
loses what it had not synced, as a machine that loses power does.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

from tests.nemesis.net import FREEZER, Net, node_addr
from tests.support.journalhooks import hook_dir

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: Fixed ports: each node has its own namespace, so they never collide.
RAFT_PORT, API_PORT, METRICS_PORT = 7001, 7101, 7201


def freezer_pids(group: str) -> list[int]:
    try:
        with open(os.path.join(group, "cgroup.procs"), encoding="ascii") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def set_frozen(group: str, frozen: bool) -> None:
    with open(os.path.join(group, "freezer.state"), "w", encoding="ascii") as f:
        f.write("FROZEN" if frozen else "THAWED")


def remove_freezer(group: str) -> None:
    """Thaw the group, SIGKILL every process in it (by pid) and remove it."""
    with contextlib.suppress(OSError):
        set_frozen(group, False)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        pids = freezer_pids(group)
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)
    with contextlib.suppress(OSError):
        os.rmdir(group)


def write_config(path: str, data_dir: str, n: int, *, history_limit: int = 100_000) -> None:
    lines = ["[cluster]", f'data_dir = "{data_dir}"', 'secret_env = "RS_NEMESIS_SECRET"', "",
             "[limits]", f"history_limit = {history_limit}", "",
             "[timing]", 'node_timeout = "3s"', 'heartbeat = "500ms"', "",
             "[log]", 'format = "json"', 'level = "info"', ""]
    for i in range(1, n + 1):
        a = node_addr(i)
        lines += ["[[nodes]]", f'id = "n{i}"', f'raft = "{a}:{RAFT_PORT}"',
                  f'api = "{a}:{API_PORT}"', f'metrics = "{a}:{METRICS_PORT}"',
                  "workers = 8", ""]
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))


class Nodes:
    """``n`` nodes in the namespaces of ``net``; logs and data under ``out``."""

    def __init__(self, net: Net, out: str, secret: str) -> None:
        self.net = net
        self.n = net.n
        self.out = out
        self.secret = secret
        self.ids = [f"n{i}" for i in range(1, self.n + 1)]
        self.config = os.path.join(out, "cluster.toml")
        write_config(self.config, os.path.join(out, "data"), self.n)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.groups = {nid: os.path.join(FREEZER, f"{net.tag}-{nid}") for nid in self.ids}
        self.clock_files = {nid: os.path.join(out, f"{nid}.clock") for nid in self.ids}
        self.api = {nid: f"{node_addr(i)}:{API_PORT}" for i, nid in enumerate(self.ids, 1)}
        for nid in self.ids:
            os.makedirs(self.groups[nid], exist_ok=True)
            self.set_clock(nid, 0)

    def index(self, nid: str) -> int:
        return self.ids.index(nid) + 1

    def log_path(self, nid: str) -> str:
        return os.path.join(self.out, f"{nid}.log")

    def start(self, nid: str) -> None:
        assert not self.alive(nid), f"{nid} runs"
        env = dict(os.environ)
        # Every journal loses what it had not synced when its node is SIGKILLed
        # (tests/support/journalhooks.py): each kill is a power cut of that node.
        env["PYTHONPATH"] = os.pathsep.join([hook_dir(self.out), ROOT, env.get("PYTHONPATH", "")])
        env["RS_TEST_LOSSY_JOURNAL"] = "1"
        env["RS_NEMESIS_SECRET"] = self.secret
        env["RAFTSCHED_CLOCK_FILE"] = self.clock_files[nid]
        procs_file = os.path.join(self.groups[nid], "cgroup.procs")
        node = [sys.executable, "-m", "raftsched", "node", "--config", self.config, "--id", nid]
        # Into the group first: `ip netns exec` mounts a fresh /sys (no cgroup fs).
        script = 'echo $$ > "$0" && exec "$@"'
        with open(self.log_path(nid), "ab") as log:
            self.procs[nid] = subprocess.Popen(
                ["sh", "-c", script, procs_file,
                 "ip", "netns", "exec", self.net.ns(self.index(nid)), *node],
                stdout=subprocess.DEVNULL, stderr=log, stdin=subprocess.DEVNULL, env=env,
                start_new_session=True)

    def alive(self, nid: str) -> bool:
        return nid in self.procs and self.procs[nid].poll() is None

    def signal(self, nid: str, sig: int) -> None:
        if self.alive(nid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.procs[nid].pid, sig)

    def kill(self, nid: str, *, host: bool = False) -> None:
        """SIGKILL the node (its guard then kills its jobs, proves it and certifies the
        death); ``host``: every process of the node's group — node, guard and jobs — at
        one instant (frozen first, so none of them sees the others die: a lost host)."""
        group = self.groups[nid]
        if host:
            with contextlib.suppress(OSError):
                set_frozen(group, True)
            for pid in freezer_pids(group):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            set_frozen(group, False)
        self.signal(nid, signal.SIGCONT)
        self.signal(nid, signal.SIGKILL)
        if nid in self.procs:
            self.procs[nid].wait(10)

    def freeze(self, nid: str, frozen: bool) -> None:
        set_frozen(self.groups[nid], frozen)

    def set_clock(self, nid: str, offset_ms: int) -> None:
        tmp = self.clock_files[nid] + ".tmp"
        with open(tmp, "w", encoding="ascii") as f:
            f.write(f"{offset_ms}\n")
        os.replace(tmp, self.clock_files[nid])

    def close(self) -> None:
        for nid in self.ids:
            with contextlib.suppress(Exception):
                self.kill(nid)
        for group in self.groups.values():
            remove_freezer(group)
