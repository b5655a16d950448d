"""Issue 12 item 9: ``raftsched local`` survives the failover its README demo causes."""

from __future__ import annotations

import os
import re
import signal

import pytest

from raftsched.wire.client import Client
from tests.support.harness import wait_until
from tests.support.localproc import LocalProcess

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]


def test_killing_the_leader_shows_the_new_leader_and_next_run_and_restarts_it(tmp_path):
    with LocalProcess(str(tmp_path / "local")) as local:
        with Client(local.addrs, timeout=5) as cl:
            wait_until(lambda: cl.status()["health"] == "ok", 40, "a healthy local cluster")
            local.read()
            assert sorted(local.pids) == ["n1", "n2", "n3"], local.lines[:8]

            def pids_reported() -> dict[str, int] | None:
                got = {n["node_id"]: n.get("pid") for n in cl.status()["nodes"]}
                return got if all(got.get(n) for n in ("n1", "n2", "n3")) else None

            reported = wait_until(pids_reported, 20, "every node's pid in status")
            assert reported == {n: local.pid(n) for n in ("n1", "n2", "n3")}
            cl.put_job({"id": "feed", "schedule": {"every": "1s"}, "command": ["true"]})
            local.wait_line(r"run\.started +feed@", 30, "a run in the feed")
            old = cl.status()
            leader, term = old["leader"], old["term"]
            mark = len(local.read())
            os.kill(local.pid(leader), signal.SIGKILL)

            died = local.wait_line(rf"^\[{leader}\] killed by SIGKILL", 15, "the death",
                                   after=mark)
            new_leader = local.wait_line(r"leader\.changed .*leader=n\d", 30, "a new leader",
                                         after=mark)
            line = local.lines[new_leader]
            elected = re.search(r"leader=(n\d)", line)
            assert elected and elected.group(1) != leader, line
            assert int(re.search(r"term=(\d+)", line).group(1)) > term, line  # type: ignore
            local.wait_line(r"run\.started +feed@", 30, "the next run after the failover",
                            after=new_leader)
            back = local.wait_line(rf"^\[{leader}\] restarted \(pid \d+\)", 30,
                                   "the dead node restarted", after=died)
            assert back > died
            new_pid = local.pid(leader)
            assert new_pid != reported[leader]

            def rejoined() -> bool:
                node = next(n for n in cl.status()["nodes"] if n["node_id"] == leader)
                return node["alive"] and node["pid"] == new_pid

            wait_until(rejoined, 40, "the restarted node alive with its new pid")
            wait_until(lambda: cl.status()["health"] == "ok", 40, "the cluster ok again")
        assert local.stop() == 0, local.lines[-20:]
    assert any("raftsched local: stopped" in ln for ln in local.lines)
