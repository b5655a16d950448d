"""Issue 12 items 11 and 12: exit codes, JSON errors, and errors that say what is wrong.

The CLI runs as a real process against real nodes; exit codes and messages are what a
script or a new user sees.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from raftsched.wire.client import Client
from tests.support.harness import ROOT, Cluster, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

SECRET = "cli-errors-test-secret-0123456789"


def cli(cluster, *argv: str, addrs: list[str] | None = None,
        timeout: float = 6.0) -> subprocess.CompletedProcess[str]:
    """``raftsched ARGV --addr ... --secret-env RS_TEST_SECRET`` as a process."""
    env = dict(os.environ, RS_TEST_SECRET=SECRET,
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("RAFTSCHED_ADDR", None)
    addr = ",".join(addrs if addrs is not None else [cluster.api[n] for n in cluster.ids])
    return subprocess.run(
        [sys.executable, "-m", "raftsched", *argv, "--addr", addr,
         "--secret-env", "RS_TEST_SECRET", "--timeout", str(timeout)],
        capture_output=True, text=True, timeout=60, env=env)


@pytest.fixture(scope="module")
def one_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One node the read-only tests below share (none changes it; each leaves it
    answering ``ok``)."""
    c = Cluster(str(tmp_path_factory.mktemp("cli-errors")), 1, secret=SECRET)
    try:
        c.start_all()
        c.wait_leader()
        yield c
    finally:
        c.close()


def health(cluster, nid: str) -> str:
    # A node without a quorum takes a moment to answer status (it waits to catch up).
    with Client([cluster.api[nid]], secret=SECRET, timeout=10) as cl:
        return cl.status()["health"]


def test_exit_codes_follow_the_cluster_health_and_no_quorum_is_said(cluster_factory,
                                                                    tmp_path):
    c = cluster_factory(3, secret=SECRET)
    c.start_all()
    c.wait_leader()
    wait_until(lambda: health(c, "n1") == "ok", 20, "cluster ok")
    job = tmp_path / "j.toml"
    job.write_text('id = "j"\nschedule = { every = "1h" }\ncommand = ["true"]\n')
    assert cli(c, "job", "put", str(job)).returncode == 0

    ok = cli(c, "status")
    assert ok.returncode == 0, ok
    assert json.loads(cli(c, "status", "--json").stdout)["health"] == "ok"

    # One node down: the cluster works (exit 0 for jobs) but status says degraded: 3.
    c.kill("n3")
    c.wait_leader(among=["n1", "n2"])
    wait_until(lambda: health(c, "n1") == "degraded", 20, "cluster degraded")
    degraded = cli(c, "status", addrs=[c.api["n1"]])
    assert degraded.returncode == 3, degraded
    assert "degraded" in degraded.stdout
    listed = cli(c, "job", "ls", "--json")
    assert listed.returncode == 0, listed
    assert [j["id"] for j in json.loads(listed.stdout)["jobs"]] == ["j"]

    # Two of three down: no quorum. status is 3 (down); reads and writes are errors
    # with exit 3 that say "no quorum" (never an empty list, never "Connection refused").
    c.kill("n2")
    wait_until(lambda: health(c, "n1") == "down", 20, "cluster down")
    down = cli(c, "status", "--json", addrs=[c.api["n1"]])
    assert down.returncode == 3, down
    assert json.loads(down.stdout)["health"] == "down"

    ls = cli(c, "job", "ls")
    assert ls.returncode == 3, ls
    assert ls.stdout == "" and "no quorum" in ls.stderr and "not_ready" in ls.stderr, ls
    assert "Connection refused" not in ls.stderr.split(";")[0]

    ls_json = cli(c, "job", "ls", "--json")
    assert ls_json.returncode == 3, ls_json
    err = json.loads(ls_json.stdout)["error"]
    assert err["code"] == "not_ready" and "no quorum" in err["message"]

    put = cli(c, "job", "put", str(job), "--json")
    assert put.returncode == 3, put
    err = json.loads(put.stdout)["error"]
    assert err["code"] == "not_ready" and err["message"].startswith("no quorum"), err


def test_status_without_a_leader_does_not_call_stopped_nodes_alive(cluster_factory):
    """Issue 29 papercut: with the quorum gone, nobody judges liveness, and the last
    verdict (every node alive) was shown as if current."""
    c = cluster_factory(3, secret=SECRET)
    c.start_all()
    c.wait_leader()
    wait_until(lambda: health(c, "n1") == "ok", 20, "cluster ok")
    c.kill("n2")
    c.kill("n3")
    wait_until(lambda: health(c, "n1") == "down", 20, "cluster down")
    down = cli(c, "status", "--json", addrs=[c.api["n1"]])
    assert down.returncode == 3, down
    alive = {n["node_id"]: n["alive"] for n in json.loads(down.stdout)["nodes"]}
    assert alive == {"n1": True, "n2": False, "n3": False}, alive
    text = cli(c, "status", addrs=[c.api["n1"]])
    rows = {line.split()[0]: line.split()[1:3] for line in text.stdout.splitlines()
            if line[:2] in ("n1", "n2", "n3")}
    assert rows == {"n1": ["yes", "yes"], "n2": ["no", "no"], "n3": ["no", "no"]}, text.stdout


def test_errors_are_json_on_stdout_under_json_with_exit_1(one_node: Cluster) -> None:
    c = one_node
    got = cli(c, "job", "get", "nope", "--json")
    assert got.returncode == 1, got
    assert json.loads(got.stdout) == {"error": {"code": "unknown_job",
                                                "message": json.loads(got.stdout)["error"]
                                                ["message"]}}
    assert "nope" in json.loads(got.stdout)["error"]["message"]


def test_pointing_the_cli_at_the_metrics_port_says_so(one_node: Cluster) -> None:
    c = one_node
    res = cli(c, "status", addrs=[c.metrics["n1"]], timeout=8)
    assert res.returncode == 3, res
    assert "metrics port" in res.stderr and "HTTP" in res.stderr, res.stderr
    assert "timed out" not in res.stderr


def test_pointing_the_cli_at_the_raft_port_says_so_and_not_tls(one_node: Cluster) -> None:
    """Issue 29 papercut: the Raft port's hang-up was reported as "a TLS port?"."""
    c = one_node
    res = cli(c, "status", addrs=[c.raft["n1"]], timeout=8)
    assert res.returncode == 3, res
    assert "Raft port" in res.stderr and "`api` address" in res.stderr, res.stderr
    assert "TLS port" not in res.stderr and "--tls-ca" not in res.stderr, res.stderr
    # With the API port after it in the list, the CLI goes on to it.
    ok = cli(c, "status", addrs=[c.raft["n1"], c.api["n1"]], timeout=8)
    assert ok.returncode == 0, ok
    assert health(c, "n1") == "ok"


def test_an_http_client_on_the_api_port_is_told_where_it_is(one_node: Cluster) -> None:
    c = one_node
    for method in ("GET", "POST", "HEAD", "PUT"):
        req = urllib.request.Request(f"http://{c.api['n1']}/api/v1/jobs", method=method,
                                     data=b"{}" if method in ("POST", "PUT") else None)
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(req, timeout=10)
        assert info.value.code == 400
        if method != "HEAD":
            body = info.value.read().decode()
            assert "this is the raftsched API port (msgpack over TCP)" in body
            assert f"http://{c.metrics['n1']}/" in body
    # The port still serves the real protocol afterwards.
    assert health(c, "n1") == "ok"
