"""The test-only faults (tests/support/faulthooks.py) still find the code they wrap,
and production code carries no test switch."""

from __future__ import annotations

import concurrent.futures
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.support import faulthooks

pytestmark = pytest.mark.timeout(60)

PKG = Path(__file__).resolve().parents[2] / "raftsched"


@pytest.mark.parametrize("fault", faulthooks.FAULTS)
def test_each_fault_installs_on_the_current_code_and_undoes(fault: str) -> None:
    from raftsched.node.node import Node
    from raftsched.node.worker.liveness import Liveness
    from raftsched.node.worker.worker import WorkerPool

    before = {(cls, name): cls.__dict__[name] for cls, name in (
        (WorkerPool, "_sync_claims"), (Liveness, "__init__"), (Node, "_release"))}
    undo = faulthooks.install(fault)
    try:
        changed = [key for key, fn in before.items() if key[0].__dict__[key[1]] is not fn]
        assert len(changed) == 1, changed
    finally:
        undo()
    assert all(cls.__dict__[name] is fn for (cls, name), fn in before.items())


def test_an_unknown_fault_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown fault"):
        faulthooks.install("nope")
    with pytest.raises(ValueError, match="unknown fault"):
        faulthooks.fault_env("/tmp", "nope")


def test_one_heartbeat_commits_but_is_never_answered_after_three_starts() -> None:
    sent: list[Any] = []

    class Raft:
        def submit(self, cmd: Any) -> concurrent.futures.Future[Any]:
            sent.append(cmd)
            fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
            fut.set_result({"ok": True})
            return fut

        def ready(self) -> bool:
            return True

    live = SimpleNamespace(worker=SimpleNamespace(counters=SimpleNamespace(started=2)))
    port = faulthooks._UnansweredHeartbeat(Raft(), live)
    assert port.ready()  # everything else passes through
    assert port.submit("hb1").done()
    live.worker.counters.started = 3
    dropped = port.submit("hb2")
    assert not dropped.done()
    assert port.submit("hb3").done(), "only one heartbeat goes unanswered"
    assert sent == ["hb1", "hb2", "hb3"], "the unanswered one was still submitted"


def test_production_code_reads_no_test_fault_switch() -> None:
    for path in sorted(PKG.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        assert "RAFTSCHED_FAULT" not in text and "RS_TEST_" not in text, path


def test_only_a_node_process_gets_the_fault_its_jobs_start_as_any_job() -> None:
    assert faulthooks.is_node_process(
        ["/venv/bin/python", "-m", "raftsched", "node", "--config", "c.toml", "--id", "n1"])
    assert not faulthooks.is_node_process(["/venv/bin/python", "-c", "import json"])
    assert not faulthooks.is_node_process(["/venv/bin/python", "-m", "raftsched", "status"])
