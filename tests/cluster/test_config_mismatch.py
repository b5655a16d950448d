"""Members whose configs differ say so loudly (issue 12 item 13): real node processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from typing import Any

import pytest

from tests.support.harness import ROOT, Cluster, free_ports, json_lines, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def _mismatches(path: str) -> list[dict[str, Any]]:
    return [e for e in json_lines(path) if e.get("event") == "config.mismatch"]


def test_a_member_the_others_do_not_know_is_named_in_config_mismatch_events(
        cluster_factory: Any) -> None:
    c: Cluster = cluster_factory(3)
    c.start("n1")
    c.start("n2")
    # n3 runs with a config that also lists an n4 the others do not know.
    raft, api, metrics = free_ports(3)
    with open(c.config, encoding="utf-8") as f:
        text = f.read()
    text += (f'\n[[nodes]]\nid = "n4"\nraft = "127.0.0.1:{raft}"\napi = "127.0.0.1:{api}"\n'
             f'metrics = "127.0.0.1:{metrics}"\n')
    odd = os.path.join(c.tmp, "odd.toml")
    with open(odd, "w", encoding="utf-8") as f:
        f.write(text)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    log_path = os.path.join(c.tmp, "n3-odd.log")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "raftsched", "node", "--config", odd,
                                 "--id", "n3"], stdout=subprocess.DEVNULL, stderr=log,
                                stdin=subprocess.DEVNULL, env=env, start_new_session=True)
    try:
        # The odd node names the member only it has, for each peer it compares with.
        found = wait_until(lambda: {e["peer"] for e in _mismatches(log_path)} >= {"n1", "n2"}
                           and _mismatches(log_path), 30, "n3's config.mismatch events")
        for ev in found:
            assert ev["only_here"] == ["n4"] and ev["only_there"] == []
            assert "n4" in ev["problem"]
        # The others name it too (they compare with n3, which they know).
        for nid in ("n1", "n2"):
            ev = wait_until(lambda nid=nid: [e for e in _mismatches(c.logs[nid])
                                             if e["peer"] == "n3"], 30,
                            f"{nid}'s config.mismatch about n3")[0]
            assert ev["only_there"] == ["n4"] and ev["only_here"] == []
        # Once per difference, not once per check.
        assert len([e for e in _mismatches(c.logs["n1"]) if e["peer"] == "n3"]) == 1
        # n1 and n2 run the same config: nothing is reported between them.
        assert not [e for e in _mismatches(c.logs["n1"]) if e["peer"] == "n2"]
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def test_members_with_the_same_config_report_nothing(cluster_factory: Any) -> None:
    c: Cluster = cluster_factory(3)
    c.start_all()
    c.wait_leader()
    with c.client() as cl:
        assert cl.call("members")["members"] == [{"id": n, "raft": c.raft[n]} for n in c.ids]
    # Every node compares with every peer (and logs the first match of each).
    for nid in c.ids:
        wait_until(lambda nid=nid: sum("config matches peer" in str(e.get("msg"))
                                       for e in json_lines(c.logs[nid])) == 2, 30,
                   f"{nid} to compare its config with both peers")
        assert not _mismatches(c.logs[nid])


def test_a_peer_with_another_secret_is_a_config_mismatch(cluster_factory: Any) -> None:
    c: Cluster = cluster_factory(2, secret="first-secret-0123456789abcdef")
    c.start("n1")
    c.start("n2", env={"RS_TEST_SECRET": "other-secret-0123456789abcdef"})
    ev = wait_until(lambda: [e for e in _mismatches(c.logs["n1"]) if e["peer"] == "n2"], 30,
                    "n1's config.mismatch about n2's secret")[0]
    assert "secrets differ" in ev["problem"]
    for nid in c.ids:
        with open(c.logs[nid], encoding="utf-8") as f:
            text = f.read()
        assert "first-secret" not in text and "other-secret" not in text
