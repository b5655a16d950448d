"""A node whose construction fails after its Raft replica started frees what it took.

``Node.__init__`` opens the data dir (its lock) and starts the Raft replica (its thread
and port) before it builds the worker, the leader loop, the operations and the servers.
One of those failing used to leave the replica running and the lock held in the
process: an app embedding raftsched that caught the error and started again found its
own data dir locked (the embedded ``Scheduler`` then waits as a client for a node that
never serves).
"""

from __future__ import annotations

import pytest

import raftsched
from raftsched.node.node import Node
from tests.support.harness import free_ports

pytestmark = pytest.mark.timeout(120)


def _sched(tmp_path, ports) -> raftsched.Scheduler:
    return raftsched.Scheduler(data_dir=str(tmp_path / "data"), raft=f"127.0.0.1:{ports[0]}",
                               api=f"127.0.0.1:{ports[1]}")


@pytest.mark.parametrize("builder", ["_build_worker", "_build_leader", "_build_ops",
                                     "_build_servers"])
def test_a_node_that_fails_to_build_frees_its_data_dir_and_raft_port(
        tmp_path, monkeypatch, builder: str) -> None:
    ports = free_ports(2)

    def broken(self: Node, *args: object) -> None:
        raise RuntimeError(f"{builder} failed")

    monkeypatch.setattr(Node, builder, broken)
    with pytest.raises(RuntimeError, match=f"{builder} failed"), _sched(tmp_path, ports):
        pass
    monkeypatch.undo()
    # The same process, the same data dir and ports: a node of its own, answering.
    with _sched(tmp_path, ports) as sched:
        assert sched.client.status()["health"] == "ok"
