"""The embedded ``raftsched.Scheduler``: a node in this process running Python callables."""

from __future__ import annotations

import threading

import pytest

import raftsched
from tests.integration.harness import free_ports, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

CALLS: list[raftsched.RunContext] = []
_LOCK = threading.Lock()


def record(ctx: raftsched.RunContext) -> str:
    with _LOCK:
        CALLS.append(ctx)
    return f"ran {ctx.run_id}"


def test_embedded_scheduler_runs_a_registered_callable_with_its_context(tmp_path):
    raft_port, api_port = free_ports(2)
    with raftsched.Scheduler(data_dir=str(tmp_path / "data"), raft=f"127.0.0.1:{raft_port}",
                             api=f"127.0.0.1:{api_port}") as sched:
        sched.add_job(record, id="embedded", schedule={"every": "1s"})
        wait_until(lambda: len(CALLS) >= 2, 15, "two calls")
        runs = sched.client.runs("embedded")["runs"]
    first = CALLS[0]
    assert first.job_id == "embedded" and first.attempt == 1 and first.node_id == "n1"
    assert first.run_id == f"embedded@{first.scheduled_ms}"
    assert first.scheduled_at.endswith("Z")
    done = {r["run_id"]: r for r in runs if r["state"] == "succeeded"}
    assert first.run_id in done and done[first.run_id]["fence"] == first.fence
    assert done[first.run_id]["tail"] == f"ran {first.run_id}"
