"""The edges reach the replicated state through one narrow port (``RaftNode.read`` for a
bounded copy under the lock, ``RaftNode.submit`` for changes): no edge module holds the
state lock or touches the state itself, so none can hold the lock pysyncobj's thread
needs by accident."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)

PKG = Path(__file__).resolve().parents[2] / "raftsched"
#: The replica itself, and the lock's implementation.
OWNERS = {"node/replica/raft.py", "node/replica/replica.py", "node/replica/timedlock.py"}
REACH = re.compile(r"\braft\.(_?lock|_?state)\b")


def test_no_edge_module_holds_the_state_lock_or_reads_the_state() -> None:
    found = []
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG).as_posix()
        if rel in OWNERS or rel.startswith("core/"):
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            code = line.split("#", 1)[0]
            if REACH.search(code):
                found.append(f"{rel}:{n}: {line.strip()}")
    assert found == []


def test_the_pattern_sees_the_old_shapes() -> None:
    for line in ("with self.raft.lock:", "jobs = node.raft.state.jobs", "with raft.lock:",
                 "x = self.node.raft._state"):
        assert REACH.search(line), line
    assert not REACH.search("view = self.raft.read(lambda st: st.job_view(j))")
