"""An in-process cluster of three real replicas, ticked by the test.

Three :class:`~raftsched.node.replica.raft.RaftNode` replicas (real pysyncobj, real loopback
TCP, real journals) made with ``auto_tick=False``: there is no Raft thread, the test
calls each replica's ``tick`` in turn, and a replica it does not tick is paused, like a
SIGSTOPped process (its sockets open, its peers' messages waiting in the kernel), but
chosen step by step. Used by ``tests/inprocess/test_inprocess_raft.py`` and
``tests/faults/test_prevote.py``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from raftsched.core.codec import encode_state
from raftsched.core.commands import Heartbeat, LeaderRecord
from raftsched.faces.launcher import free_ports
from raftsched.node.config.config import Timing
from raftsched.node.replica.raft import RaftNode

#: Generous: every wait below is bounded by this (a loaded machine ticks slowly).
DEADLINE_S = 40.0
T0 = 20_000 * 86_400 * 1000


class Cluster:
    """Three replicas in this thread; ``paused`` ones are not ticked."""

    def __init__(self, tmp_path: Any, election_ms: tuple[int, int] = (2000, 4000),
                 connection_ms: int = 8000) -> None:
        ports = free_ports(3)
        self.addr = {f"n{i + 1}": f"127.0.0.1:{p}" for i, p in enumerate(ports)}
        self.paused: set[str] = set()
        # Every replica runs in this one thread, so a stall of the thread (a loaded
        # machine) stalls them all; election timeouts far above any such stall keep
        # the only elections the ones the test causes. The connection timeout keeps a
        # paused replica's connections open, as a short SIGSTOP does.
        timing = Timing(election_timeout_min_ms=election_ms[0],
                        election_timeout_max_ms=election_ms[1],
                        connection_timeout_ms=connection_ms, leader_fallback_ms=8000)
        self.nodes: dict[str, RaftNode] = {}
        try:
            for nid, addr in self.addr.items():
                self.nodes[nid] = RaftNode(
                    self_addr=addr, peers=[a for a in self.addr.values() if a != addr],
                    data_dir=str(tmp_path / nid), secret="in-process-test-secret-0123456789",
                    timing=timing, on_effects=lambda _effects: None, auto_tick=False)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        for node in self.nodes.values():
            node.destroy()

    def tick(self) -> None:
        for nid, node in self.nodes.items():
            if nid not in self.paused:
                node.tick(0.002)

    def run_for(self, seconds: float, *, paused: str | None = None) -> None:
        """Tick every running replica (all but ``paused`` too) for ``seconds``: a
        replica not ticked is a stall of its Raft thread, exactly as long as asked."""
        if paused is not None:
            self.paused.add(paused)
        try:
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                self.tick()
        finally:
            if paused is not None:
                self.paused.discard(paused)

    def until(self, cond: Callable[[], Any], what: str) -> Any:
        """Tick the running replicas until ``cond()`` is truthy; fail naming ``what``."""
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline:
            self.tick()
            value = cond()
            if value:
                return value
        raise AssertionError(f"no {what} within {DEADLINE_S}s")

    def leader(self) -> str | None:
        """The running replica that leads and that every running replica follows."""
        running = [n for n in self.nodes if n not in self.paused]
        leaders = [n for n in running if self.nodes[n].leader_term() is not None]
        if len(leaders) != 1:
            return None
        addr = self.addr[leaders[0]]
        if all(self.nodes[n].leader_addr() == addr for n in running):
            return leaders[0]
        return None

    def commit(self, nid: str, cmd: Any) -> dict[str, Any]:
        """Submit ``cmd`` on replica ``nid`` and tick until it resolves."""
        fut = self.nodes[nid].submit(cmd)
        self.until(fut.done, f"outcome of {cmd!r}")
        return fut.result()

    def states(self) -> dict[str, bytes]:
        return {nid: node.read(encode_state) for nid, node in self.nodes.items()}

    def converged(self) -> bool:
        """Every replica applied the same entries and holds the same state bytes."""
        states = self.states()
        return len(set(states.values())) == 1 and len(
            {node.read(lambda st: st.applied) for node in self.nodes.values()}) == 1


def heartbeat(nid: str, at: int) -> Heartbeat:
    return Heartbeat(node=nid, boot=1, slots=4, queue=0, at=at)


def establish(c: Cluster) -> tuple[str, int]:
    """A leader every replica follows, with its leadership record committed."""
    leader = c.until(c.leader, "leader")
    term = c.nodes[leader].leader_term()
    assert term is not None
    assert c.commit(leader, LeaderRecord(node=leader, term=term, at=T0, skew={}))["ok"]
    return leader, term
