"""One process per data dir, no corrupt journal replayed, and stop signals always end a
node (issue 12 items 1 and 13): real node processes."""

from __future__ import annotations

import os
import signal
import socket
import struct
import subprocess
import sys
import time
from typing import Any

import pytest

import raftsched
from raftsched.core.errors import DataDirLocked
from tests.support.faulthooks import fault_env
from tests.support.harness import ROOT, Cluster, free_ports, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

JOURNAL_HEADER = 40  # pysyncobj 0.3.17: name 24 + version 8 + format 4 + end offset 4


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def _node_cmd(config: str) -> list[str]:
    return [sys.executable, "-m", "raftsched", "node", "--config", config, "--id", "n1"]


def _running_node(cluster_factory: Any) -> Cluster:
    c = cluster_factory(1)
    c.start_all()
    c.wait_leader()
    with c.client() as cl:
        cl.put_job({"id": "keep", "schedule": {"at": "2099-01-01T00:00:00Z"},
                    "command": ["true"]})
    return c


def _other_ports_config(c: Cluster) -> str:
    """The same data dir as ``c``'s node, but ports of its own."""
    raft, api, metrics = free_ports(3)
    with open(c.config, encoding="utf-8") as f:
        text = f.read()
    text = (text.replace(c.raft["n1"], f"127.0.0.1:{raft}")
            .replace(c.api["n1"], f"127.0.0.1:{api}")
            .replace(c.metrics["n1"], f"127.0.0.1:{metrics}"))
    path = os.path.join(c.tmp, "other-ports.toml")
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return path


def test_a_second_process_on_a_node_s_data_dir_is_refused_naming_dir_and_pid(
        cluster_factory: Any) -> None:
    c = _running_node(cluster_factory)
    pid = c.procs["n1"].pid
    node_dir = os.path.join(c.tmp, "data", "n1")
    for config in (c.config, _other_ports_config(c)):
        res = subprocess.run(_node_cmd(config), env=_env(), capture_output=True, text=True,
                             timeout=60)
        assert res.returncode == 1
        assert "data_dir_locked" in res.stderr and node_dir in res.stderr
        assert f"process {pid}" in res.stderr
    # The embedded Scheduler on the same data dir is refused the same way once no node
    # answers as this member on its API (here: its own ports) within its start timeout;
    # another worker of the same app would answer there, and it would be its client.
    raft, api = free_ports(2)
    sched = raftsched.Scheduler(data_dir=os.path.join(c.tmp, "data"),
                                raft=f"127.0.0.1:{raft}", api=f"127.0.0.1:{api}")
    with pytest.raises(DataDirLocked) as err:
        sched.start(timeout=3)
    assert sched.role is None
    assert err.value.pid == pid and err.value.path == node_dir
    # The node was never disturbed.
    assert c.alive("n1")
    with c.client() as cl:
        assert [j["id"] for j in cl.list_jobs()["jobs"]] == ["keep"]
    assert c.status("n1")["term"] == 1


def test_a_node_whose_port_is_taken_writes_nothing_and_names_the_holder(tmp_path: Any) -> None:
    """Issue 29 papercut: started from another directory beside a running node, a node
    made ``./raftsched-data`` (its secret, its node dir) there, then failed on its port."""
    raft, api, metrics = free_ports(3)
    config = tmp_path / "cluster.toml"
    config.write_text(f'''[cluster]
data_dir = "./raftsched-data"
[[nodes]]
id = "n1"
raft = "127.0.0.1:{raft}"
api = "127.0.0.1:{api}"
metrics = "127.0.0.1:{metrics}"
''')
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    with socket.socket() as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("127.0.0.1", api))
        holder.listen()
        res = subprocess.run(_node_cmd(str(config)), env=_env(), cwd=elsewhere,
                             capture_output=True, text=True, timeout=60)
    assert res.returncode == 1, res
    assert "port_in_use" in res.stderr, res.stderr
    assert f"port 127.0.0.1:{api} (n1 api) is in use by pid {os.getpid()}" in res.stderr
    assert list(elsewhere.iterdir()) == [], "a refused node wrote into its cwd"


def _stop(c: Cluster, sig: int = signal.SIGTERM, bound: float = 20.0) -> tuple[int, float]:
    t0 = time.monotonic()
    c.signal("n1", sig)
    code = c.procs["n1"].wait(bound)
    return code, time.monotonic() - t0


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_and_sighup_stop_a_node_cleanly(cluster_factory: Any, sig: int) -> None:
    c = _running_node(cluster_factory)
    code, took = _stop(c, sig)
    assert code == 0, f"exit {code} after {signal.Signals(sig).name}"
    assert any(e.get("event") == "node.stopped" for e in c.events("n1"))
    assert took < 20
    # The data dir is free again: the node restarts with its job.
    c.start("n1")
    c.wait_leader()
    with c.client() as cl:
        assert cl.get_job("keep")["spec"]["id"] == "keep"


def test_a_stuck_shutdown_still_ends_the_process(cluster_factory: Any) -> None:
    # The watchdog's limit counts after the drain: RAFTSCHED_STOP_LIMIT_S plus
    # timing.stop_timeout (30 s by default, 1 s here).
    c = cluster_factory(1, timing={"stop_timeout": "1s"})
    c.start("n1", env={**fault_env(c.tmp, "hang_on_stop"), "RAFTSCHED_STOP_LIMIT_S": "2"})
    c.wait_leader()
    code, took = _stop(c, bound=30)
    assert code == 1 and took < 30
    with open(c.logs["n1"], encoding="utf-8") as f:
        assert "shutdown did not finish within 3s" in f.read()


def _journal(c: Cluster) -> str:
    return os.path.join(c.tmp, "data", "n1", "raft.journal")


def _record_offsets(path: str) -> list[int]:
    with open(path, "rb") as f:
        data = f.read()
    (end,) = struct.unpack_from("<I", data, JOURNAL_HEADER - 4)
    offsets, at = [], JOURNAL_HEADER
    while at < end:
        offsets.append(at)
        at += struct.unpack_from("<I", data, at)[0] + 8
    return offsets


def _corrupt_truncate(path: str) -> None:
    offsets = _record_offsets(path)
    with open(path, "r+b") as f:
        f.truncate(offsets[len(offsets) // 2] + 10)


def _corrupt_garbage(path: str) -> None:
    offsets = _record_offsets(path)
    with open(path, "r+b") as f:
        f.seek(offsets[len(offsets) // 2])
        f.write(os.urandom(64))


def _corrupt_term(path: str) -> None:
    offsets = _record_offsets(path)
    with open(path, "r+b") as f:
        f.seek(offsets[-1] + 4 + 8)
        f.write(struct.pack("<Q", 13990913564861476515))


@pytest.mark.parametrize("corrupt", [_corrupt_truncate, _corrupt_garbage, _corrupt_term])
def test_a_corrupt_journal_is_refused_at_boot_and_never_replayed(
        cluster_factory: Any, corrupt: Any) -> None:
    c = _running_node(cluster_factory)
    assert _stop(c)[0] == 0
    path = _journal(c)
    assert len(_record_offsets(path)) > 4
    corrupt(path)
    with open(path, "rb") as f:
        before = f.read()
    res = subprocess.run(_node_cmd(c.config), env=_env(), capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 1
    assert "corrupt_journal" in res.stderr and path in res.stderr
    assert "corrupt at byte" in res.stderr and "refusing to replay" in res.stderr
    with open(path, "rb") as f:
        assert f.read() == before, "the refused boot changed the journal"


def test_a_journal_that_is_fine_boots_after_many_restarts(cluster_factory: Any) -> None:
    c = _running_node(cluster_factory)
    for _ in range(2):
        assert _stop(c)[0] == 0
        c.start("n1")
        wait_until(lambda: c.status("n1")["leader"] == "n1", 20, "the node to lead again")
    with c.client() as cl:
        assert cl.get_job("keep")["spec"]["id"] == "keep"


def test_sighup_to_raftsched_local_stops_its_nodes_cleanly(tmp_path: Any) -> None:
    """A closed terminal: `local` and every node it started end, the nodes with
    `node.stopped` (they run in sessions of their own and would otherwise live on)."""
    from tests.support.localproc import LocalProcess

    with LocalProcess(str(tmp_path / "local"), nodes=2) as local:
        wait_until(lambda: len(local.read()) and sorted(local.pids) == ["n1", "n2"], 30,
                   "local's banner with both pids")
        for nid in ("n1", "n2"):
            local.wait_line(rf"\[{nid}\] node\.started", 30, f"{nid} started")
        pids = [local.pid(n) for n in ("n1", "n2")]
        os.kill(local.proc.pid, signal.SIGHUP)
        assert local.proc.wait(30) == 0
        for pid in pids:
            assert not os.path.exists(f"/proc/{pid}") or \
                open(f"/proc/{pid}/stat").read().split()[2] == "Z"
        stopped = [line for line in local.read() if "node.stopped" in line]
        assert len(stopped) == 2, "\n".join(local.lines)
