"""The embedded ``raftsched.Scheduler`` beside a real node process: it never takes that
node's ports, nor uses that node."""

from __future__ import annotations

import pytest

import raftsched
from tests.support.harness import free_ports

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def test_embedded_scheduler_on_a_running_node_s_ports_raises_and_never_uses_that_node(
        cluster_factory, tmp_path):
    """Issue 12 item 3: the bind error is raised by start(), the `with` block never runs."""
    c = cluster_factory(1)
    c.start_all()
    c.wait_leader()
    free_raft, free_api = free_ports(2)
    entered = []
    for raft, api in ((c.raft["n1"], c.api["n1"]), (f"127.0.0.1:{free_raft}", c.api["n1"]),
                      (c.raft["n1"], f"127.0.0.1:{free_api}")):
        sched = raftsched.Scheduler(data_dir=str(tmp_path / "embedded"), raft=raft, api=api)
        with pytest.raises(OSError, match="in use|address already in use"):
            with sched:
                entered.append(raft)
        assert sched._thread is not None and not sched._thread.is_alive()
    assert entered == []
    with c.client() as cl:
        assert cl.list_jobs()["total"] == 0
    # The data dir is free again after each failed start: a good start works.
    raft, api = free_ports(2)
    with raftsched.Scheduler(data_dir=str(tmp_path / "embedded"), raft=f"127.0.0.1:{raft}",
                             api=f"127.0.0.1:{api}") as sched:
        st = sched.client.status()
        assert st["cluster_id"] == sched.client.cluster_id != c.status("n1")["cluster_id"]
