"""A node with no configured secret never listens unauthenticated (issue 12 item 0).

It generates a secret at first boot into its cluster data dir (mode 0600), uses it as
pysyncobj's password and for the API, and leaves a pointer so that a CLI or Client of
the same user on the same host finds it with no configuration.
"""

from __future__ import annotations

import os
import pickle
import socket
import stat
import struct
import subprocess
import sys
import zlib
from typing import Any

import pytest

from raftsched.core.errors import Unauthenticated, WrongCluster
from raftsched.wire.client import Client
from raftsched.wire.secretfile import cluster_id
from tests.fuzz import RawConn
from tests.support.harness import ROOT, Cluster, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


class _CreatesFile:
    """Unpickling this calls ``open(path, "w")``: it creates ``path``."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (self.path, "w"))


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RAFTSCHED_SECRET",
                                                             "RS_TEST_SECRET")}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def _secret_file(c: Cluster) -> str:
    return os.path.join(c.tmp, "data", "secret")


def test_a_node_without_a_secret_never_unpickles_what_reaches_its_raft_port(
        cluster_factory: Any, tmp_path: Any) -> None:
    c = cluster_factory(1)  # no secret configured anywhere
    c.start_all()
    c.wait_leader()
    host, _, port = c.raft["n1"].rpartition(":")
    marker = str(tmp_path / "pwned")
    data = zlib.compress(pickle.dumps(_CreatesFile(marker)))
    for payload in (struct.pack("i", len(data)) + data,
                    struct.pack("i", len(data)) + data + struct.pack("i", len(data)) + data):
        with socket.create_connection((host, int(port)), timeout=5) as s:
            s.settimeout(5)
            s.sendall(payload)
            try:  # the node drops the connection once the message fails to decrypt
                while s.recv(4096):
                    pass
            except ConnectionResetError:
                pass
    assert c.alive("n1")
    assert c.status("n1")["leader"] == "n1"
    assert not os.path.exists(marker), "the node unpickled a stranger's message"
    st = os.stat(_secret_file(c))
    assert stat.S_IMODE(st.st_mode) == 0o600


def test_a_local_client_without_the_secret_gets_unauthenticated(
        cluster_factory: Any, tmp_path: Any, monkeypatch: Any) -> None:
    c = cluster_factory(1)
    c.start_all()
    c.wait_leader()
    # Another user's view: no pointer to follow, no secret in the environment.
    monkeypatch.setenv("RAFTSCHED_RUNTIME_DIR", str(tmp_path / "elsewhere"))
    monkeypatch.delenv("RAFTSCHED_SECRET", raising=False)
    with Client(c.api["n1"], timeout=5) as cl, pytest.raises(Unauthenticated):
        cl.status()
    conn = RawConn(c.api["n1"])
    try:
        reply = conn.request("status")
    finally:
        conn.sock.close()
    assert reply["ok"] is False
    assert reply["error"]["code"] == "unauthenticated"
    # The generated secret, given explicitly or via $RAFTSCHED_SECRET, is the key.
    with open(_secret_file(c), encoding="ascii") as f:
        secret = f.read().strip()
    monkeypatch.setenv("RAFTSCHED_SECRET", secret)
    with Client(c.api["n1"], timeout=5) as cl:
        assert cl.status()["cluster_id"] == cluster_id(secret)
        assert cl.cluster_id == cluster_id(secret)


def test_the_secret_survives_restarts_and_a_client_refuses_another_cluster(
        cluster_factory: Any) -> None:
    c = cluster_factory(1)
    c.start_all()
    c.wait_leader()
    first = c.status("n1")["cluster_id"]
    with open(_secret_file(c), encoding="ascii") as f:
        secret = f.read()
    c.kill("n1")
    c.start("n1")
    c.wait_leader()
    with open(_secret_file(c), encoding="ascii") as f:
        assert f.read() == secret
    assert c.status("n1")["cluster_id"] == first
    with Client(c.api["n1"], cluster_id="0123456789abcdef", timeout=5) as cl, \
            pytest.raises(WrongCluster):
        cl.status()
    with Client(c.api["n1"], cluster_id=first, timeout=5) as cl:
        assert cl.status()["node"] == "n1"


def test_the_cli_finds_a_local_node_s_generated_secret_with_no_configuration(
        cluster_factory: Any, tmp_path: Any) -> None:
    c = cluster_factory(1)
    c.start_all()
    c.wait_leader()
    res = subprocess.run([sys.executable, "-m", "raftsched", "status", "--json", "--addr",
                          c.api["n1"]], env=_env(), capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    with open(_secret_file(c), encoding="ascii") as f:
        assert f.read().strip() not in res.stdout + res.stderr
    # A secret of another cluster exported in the shell does not hide this node's own.
    res = subprocess.run([sys.executable, "-m", "raftsched", "status", "--addr", c.api["n1"]],
                         env=_env(RAFTSCHED_SECRET="another-cluster-secret-0123456789"),
                         capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    # Without the pointer (another user), the CLI is refused and says how to fix it.
    res = subprocess.run([sys.executable, "-m", "raftsched", "status", "--addr", c.api["n1"]],
                         env=_env(RAFTSCHED_RUNTIME_DIR=str(tmp_path / "other")),
                         capture_output=True, text=True, timeout=30)
    assert res.returncode == 1 and "unauthenticated" in res.stderr
    # $RAFTSCHED_SECRET_FILE names the file for a client that has no pointer.
    res = subprocess.run([sys.executable, "-m", "raftsched", "status", "--addr", c.api["n1"]],
                         env=_env(RAFTSCHED_RUNTIME_DIR=str(tmp_path / "other"),
                                  RAFTSCHED_SECRET_FILE=_secret_file(c)),
                         capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr


def _ports_free(*ports: int) -> bool:
    for port in ports:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                return False
    return True


def test_the_embedded_default_node_and_the_cli_work_with_zero_configuration(
        tmp_path: Any) -> None:
    """`raftsched node` with no config (fixed ports 7001/7101/7201), then the CLI with
    no --addr, no secret: exactly the README's "On a new machine" and tour."""
    if not _ports_free(7001, 7101, 7201):
        pytest.skip("the default ports 7001/7101/7201 are taken on this machine")
    env = _env()
    env.pop("RAFTSCHED_ADDR", None)
    log = open(tmp_path / "node.log", "wb")  # noqa: SIM115 - closed below
    node = subprocess.Popen([sys.executable, "-m", "raftsched", "node"], cwd=tmp_path, env=env,
                            stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)
    try:
        def status() -> bool:
            if node.poll() is not None:
                text = (tmp_path / "node.log").read_text(errors="replace")
                if "in use" in text:  # another suite took the default ports meanwhile
                    pytest.skip("the default ports were taken while the node started")
                raise AssertionError(f"the default node exited: {text[-2000:]}")
            res = subprocess.run([sys.executable, "-m", "raftsched", "status", "--json"],
                                 cwd=tmp_path, env=env, capture_output=True, text=True,
                                 timeout=30)
            return res.returncode == 0 and '"leader": "n1"' in res.stdout
        wait_until(status, 30, "the CLI to reach the default node with no configuration")
        mode = stat.S_IMODE(os.stat(tmp_path / "raftsched-data" / "secret").st_mode)
        assert mode == 0o600
    finally:
        node.terminate()
        node.wait(30)
        log.close()
    assert node.returncode == 0


def test_raft_and_api_of_a_secretless_cluster_share_one_generated_secret(
        cluster_factory: Any) -> None:
    c = cluster_factory(3)
    c.start_all()
    leader = c.wait_leader()
    ids = {c.status(n)["cluster_id"] for n in c.ids}
    assert len(ids) == 1
    with c.client() as cl:
        cl.put_job({"id": "x", "schedule": {"at": "2099-01-01T00:00:00Z"}, "command": ["true"]})
    wait_until(lambda: all(c.status(n)["jobs"] == 1 for n in c.ids), 10, "replication")
    assert leader in c.ids
