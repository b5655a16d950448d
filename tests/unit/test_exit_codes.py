"""Issue 12 item 11: exit codes, JSON errors and named API shapes (no cluster needed)."""

from __future__ import annotations

import json
import socket

import pytest

from raftsched.core.codec import decode_state, encode_state
from raftsched.core.machine import ClusterState
from raftsched.core.model import JobSpec
from raftsched.core.records import JobRecord, NodeRecord, RunRecord
from raftsched.faces import cli
from raftsched.wire.client import _no_answer


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_unreachable_cluster_exits_3_with_a_json_error_on_stdout(
        capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["job", "ls", "--json", "--addr", f"127.0.0.1:{_closed_port()}",
                     "--timeout", "1"])
    out = capsys.readouterr()
    assert code == 3
    err = json.loads(out.out)["error"]
    assert err["code"] == "unavailable" and "refused" in err["message"].lower()


def test_usage_error_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["job", "ls", "--limit", "0"]) == 2
    assert cli.main([]) == 2


def test_bad_job_file_exits_1_with_json_error(tmp_path, capsys) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("id = ")
    assert cli.main(["job", "put", str(bad), "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["error"]["code"] == "invalid_spec"


def test_run_transitions_and_job_last_are_named_objects() -> None:
    run = RunRecord(run_id="j@1000", job_id="j", scheduled_ms=1000, created_ms=900)
    run.note(950, "planned")
    assert run.to_dict()["transitions"] == [
        {"at_ms": 950, "state": "pending", "node": None, "fence": 0, "note": "planned"}]
    spec = JobSpec.from_spec({"id": "j", "schedule": {"every": "1s"}, "command": ["true"]})
    job = JobRecord(spec, version=1, created_ms=1, updated_ms=1, hwm_ms=0, next_ms=None,
                    last=("j@1000", "failed", "exit 3", 2000))
    assert job.to_dict()["last"] == {"run_id": "j@1000", "state": "failed",
                                     "reason": "exit 3", "at_ms": 2000}


def test_no_answer_prefers_the_node_that_said_why() -> None:
    err = _no_answer("list_jobs", {"127.0.0.1:1": "not_ready: no quorum: node n1 reaches 0",
                                   "127.0.0.1:2": "Connection refused"}, 10)
    assert err.code == "not_ready"
    assert err.message.startswith("no quorum: node n1 reaches 0 (said 127.0.0.1:1)")
    assert "127.0.0.1:2: Connection refused" in err.message
    err = _no_answer("status", {"127.0.0.1:2": "Connection refused"}, 10)
    assert err.code == "unavailable" and "127.0.0.1:2: Connection refused" in err.message


def test_a_node_reports_its_pid_in_its_heartbeat_and_old_rows_still_load() -> None:
    st = ClusterState()
    hb = {"op": "heartbeat", "at": 1000, "node": "n1", "boot": 1, "slots": 2, "queue": 8,
          "tags": [], "api": "127.0.0.1:7101"}
    assert st.apply_map(dict(hb, pid=4242))["ok"]
    assert st.nodes["n1"].to_dict()["pid"] == 4242
    assert decode_state(encode_state(st)).nodes["n1"].pid == 4242
    assert st.apply_map(dict(hb, at=2000))["ok"]  # a node older than the field
    assert st.nodes["n1"].pid is None
    assert not st.apply_map(dict(hb, at=3000, pid="x"))["ok"]
    old_row = st.nodes["n1"].to_row()[:10]  # a snapshot row written before pid existed
    assert NodeRecord.from_row(old_row).pid is None
