"""The CLI's pure formatters, job-file loading and exit codes (no cluster needed)."""

from __future__ import annotations

import io
import json
import socket
from pathlib import Path
from typing import Any

import pytest

from raftsched.core.errors import InvalidSpec
from raftsched.faces.cli import load_job_file, main
from raftsched.faces.cliformat import (
    clean,
    format_job,
    format_jobs,
    format_put,
    format_runs,
    format_schedule,
    format_status,
    format_time,
)

T0 = 1_795_939_200_000  # 2026-11-29T08:00:00Z


def last(run_id: str, state: str, reason: str, at_ms: int) -> dict[str, Any]:
    """A job's ``last`` as the API gives it: a named object."""
    return {"run_id": run_id, "state": state, "reason": reason, "at_ms": at_ms}


def job(job_id: str, schedule: dict[str, Any], **kw: Any) -> dict[str, Any]:
    base = {"id": job_id, "spec": {"id": job_id, "schedule": schedule,
                                   "env": {"TOKEN": "***"}},
            "version": 2, "created_ms": T0 - 60_000, "updated_ms": T0, "hwm_ms": T0,
            "next_ms": T0 + 900_000, "paused": False, "active": [], "last": None}
    base.update(kw)
    return base


def run(run_id: str, scheduled: int, **kw: Any) -> dict[str, Any]:
    base = {"run_id": run_id, "job_id": run_id.split("@")[0], "scheduled_ms": scheduled,
            "attempt": 1, "fence": 7, "state": "succeeded", "node": "n2", "reason": "",
            "created_ms": scheduled, "assigned_ms": scheduled, "started_ms": scheduled + 5,
            "finished_ms": scheduled + 1500, "exit_code": 0, "tail": "", "not_before_ms": 0,
            "manual": False, "until_ms": None, "count": 1, "transitions": []}
    base.update(kw)
    return base


def split_row(line: str) -> list[str]:
    return line.split()


# ------------------------------------------------------------------ times

@pytest.mark.parametrize(("ms", "text"), [
    (T0, "2026-11-29T08:00:00Z"),
    (T0 + 250, "2026-11-29T08:00:00.250Z"),
    (0, "1970-01-01T00:00:00Z"),
    (None, "-"),
])
def test_format_time(ms: int | None, text: str) -> None:
    assert format_time(ms) == text


def test_format_schedule() -> None:
    assert format_schedule({"cron": "0 8 * * *", "tz": "Europe/Berlin"}) \
        == "0 8 * * * Europe/Berlin"
    assert format_schedule({"every": "15m"}) == "every 15m"
    assert format_schedule({"every": "1h", "offset": "5m"}) == "every 1h (+5m)"
    assert format_schedule({"at": "2026-11-29T08:00:00Z"}) == "at 2026-11-29T08:00:00Z"


def test_clean_escapes_terminal_controls() -> None:
    assert clean("a\x1b[2Jb") == "a\\x1b[2Jb"
    assert clean("l1\nl2\x07", multiline=True) == "l1\nl2\\x07"


# ------------------------------------------------------------------ job ls / get / put

def test_format_jobs_columns() -> None:
    result = {"jobs": [
        job("backup", {"cron": "0 8 * * *", "tz": "UTC"},
            last=last("backup@1", "succeeded", "exit 0", T0), active=["backup@2"]),
        job("report", {"every": "15m"}, next_ms=None, paused=True,
            last=last("report@1", "missed", "no_leader", T0)),
    ], "total": 2}
    lines = format_jobs(result).splitlines()
    assert split_row(lines[0]) == ["ID", "SCHEDULE", "NEXT", "PAUSED", "LAST", "ACTIVE"]
    assert lines[1].startswith("backup  0 8 * * * UTC  2026-11-29T08:15:00Z  no")
    assert split_row(lines[1])[-2:] == ["succeeded", "1"]  # no "(exit 0)" noise
    assert split_row(lines[2]) == ["report", "every", "15m", "-", "yes", "missed(no_leader)", "0"]
    # Columns line up: every row's NEXT starts under the header's NEXT.
    col = lines[0].index("NEXT")
    assert lines[1][col:].startswith("2026-11-29T08:15:00Z") and lines[2][col] == "-"
    assert len(lines) == 3


def test_format_jobs_says_when_truncated() -> None:
    out = format_jobs({"jobs": [job("a", {"every": "1m"})], "total": 5})
    assert "1 of 5 jobs shown" in out


def test_format_job_lines() -> None:
    out = format_job(job("backup", {"every": "1m"}, last=last("backup@1", "failed", "exit 3", T0)))
    lines = out.splitlines()
    assert lines[0] == "id: backup"
    assert "next: 2026-11-29T08:15:00Z" in lines
    assert "last: failed(exit 3) backup@1 at 2026-11-29T08:00:00Z" in lines
    spec_at = lines.index("spec: {")
    spec = json.loads("\n".join(["{", *lines[spec_at + 1:]]))
    assert spec["env"] == {"TOKEN": "***"}


def test_format_put() -> None:
    assert format_put({"job": "a", "version": 1, "created": True}) == "put a (version 1, created)"
    assert format_put({"job": "a", "version": 4, "created": False}) == "put a (version 4, updated)"


# ------------------------------------------------------------------ runs

def test_format_runs_table_range_and_tail() -> None:
    result = {"job": "backup", "runs": [
        run("backup@3", T0 + 120_000, state="started", finished_ms=None, exit_code=None,
            tail="partial"),
        run("backup@2", T0 + 60_000, state="failed", reason="exit 3", exit_code=3, attempt=2,
            tail="line1\nboom\x1b[31m\n"),
        run("backup@1", T0, state="missed", reason="no_leader", node=None, fence=0,
            started_ms=None, finished_ms=None, exit_code=None, until_ms=T0 + 50_000, count=6),
    ]}
    lines = format_runs(result).splitlines()
    assert split_row(lines[0]) == ["RUN_ID", "SCHEDULED", "NODE", "ATT", "FENCE", "STATE",
                                   "REASON", "START", "END", "EXIT"]
    assert split_row(lines[1])[:6] == ["backup@3", "2026-11-29T08:02:00Z", "n2", "1", "7",
                                       "started"]
    assert split_row(lines[1])[-2:] == ["-", "-"]  # not ended, no exit code
    assert split_row(lines[2])[5:7] == ["failed", "exit"]
    assert split_row(lines[2])[-1] == "3"
    assert split_row(lines[3])[:3] == ["backup@1", "×6",
                                       "2026-11-29T08:00:00Z..2026-11-29T08:00:50Z"]
    # The newest run with a tail is backup@3.
    assert lines[4] == "--- output tail of backup@3 ---"
    assert lines[5:] == ["partial"]


def test_format_runs_tail_is_escaped() -> None:
    out = format_runs({"job": "j", "runs": [run("j@1", T0, tail="ok\n\x1b[2J\n")]})
    assert "\x1b" not in out
    assert out.endswith("--- output tail of j@1 ---\nok\n\\x1b[2J")


def test_format_runs_empty() -> None:
    assert format_runs({"job": "j", "runs": []}) == "no runs of j yet"


# ------------------------------------------------------------------ status

def test_format_status() -> None:
    summary = "cluster ok: leader n1 (term 3), 3/3 nodes alive, 12 jobs, 2 runs active"
    node = {"alive": True, "connected": True, "slots": 4, "queue": 16, "tags": ["gpu", "eu"],
            "inflight": 1, "skew_ms": 2, "boot_ms": T0}
    status = {"node": "n1", "leader": "n1", "leader_addr": "127.0.0.1:7101", "term": 3,
              "health": "ok", "summary": summary,
              "nodes": [dict(node, node_id="n1", api="127.0.0.1:7101", last_seen_ms=T0 + 3000,
                             pid=4242),
                        dict(node, node_id="n2", api="127.0.0.1:7102", last_seen_ms=T0,
                             alive=False, tags=[], skew_ms=None, pid=None)],
              "jobs": 12, "active_runs": 2, "commit_index": 40, "applied": 40,
              "totals": {"succeeded": 10, "missed": 1}}
    lines = format_status(status).splitlines()
    assert lines[0] == summary
    header = lines.index(next(line for line in lines if line.startswith("NODE")))
    assert split_row(lines[header]) == ["NODE", "ALIVE", "CONNECTED", "PID", "API", "SLOTS",
                                        "INFLIGHT", "TAGS", "LAST_SEEN", "SKEW_MS"]
    assert split_row(lines[header + 1]) == ["n1", "yes", "yes", "4242", "127.0.0.1:7101", "4",
                                            "1", "gpu,eu", "0.0s", "2"]
    assert split_row(lines[header + 2]) == ["n2", "no", "yes", "-", "127.0.0.1:7102", "4",
                                            "1", "-", "3.0s", "-"]
    assert "totals: missed=1 succeeded=10" in lines
    # With the node's clock in the reply, ages are measured from it.
    lines = format_status(dict(status, now_ms=T0 + 4000)).splitlines()
    assert split_row(lines[header + 1])[8] == "1.0s"
    assert split_row(lines[header + 2])[8] == "4.0s"


# ------------------------------------------------------------------ job files

def test_load_job_file_shapes(tmp_path: Path) -> None:
    one = tmp_path / "one.toml"
    one.write_text('id = "a"\nschedule = { every = "1m" }\ncommand = ["true"]\n')
    assert [j["id"] for j in load_job_file(str(one))] == ["a"]
    many = tmp_path / "many.toml"
    many.write_text('[[jobs]]\nid = "a"\n[[jobs]]\nid = "b"\n')
    assert [j["id"] for j in load_job_file(str(many))] == ["a", "b"]
    lst = tmp_path / "list.json"
    lst.write_text('[{"id": "a"}, {"id": "b"}]')
    assert [j["id"] for j in load_job_file(str(lst))] == ["a", "b"]
    wrapped = tmp_path / "wrapped.json"
    wrapped.write_text('{"jobs": [{"id": "c"}]}')
    assert [j["id"] for j in load_job_file(str(wrapped))] == ["c"]
    bad = tmp_path / "bad.json"
    bad.write_text("[1]")
    with pytest.raises(InvalidSpec, match="jobs\\[0\\]"):
        load_job_file(str(bad))


def test_load_job_file_from_stdin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO('{"id": "s"}'))
    assert load_job_file("-") == [{"id": "s"}]


def test_bad_toml_file_exits_1_with_clear_message(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('id = "a"\nschedule = {every = \n')
    assert main(["job", "put", str(bad), "--addr", "127.0.0.1:1", "--timeout", "1"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: invalid_spec: {bad}: ")
    assert "line 2" in err


def test_missing_file_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["job", "put", str(tmp_path / "nope.json")]) == 1
    assert "error: invalid_spec:" in capsys.readouterr().err


# ------------------------------------------------------------------ main

def test_help_and_usage_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    assert "job" in capsys.readouterr().out
    assert main([]) == 2
    assert "usage:" in capsys.readouterr().err
    assert main(["job"]) == 2
    assert main(["job", "frob"]) == 2
    assert main(["runs"]) == 2  # ID missing
    assert main(["status", "--timeout", "-1"]) == 2


def test_unreachable_node_is_an_error_not_a_traceback(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as s:  # bound, not listening: connections are refused
        s.bind(("127.0.0.1", 0))
        monkeypatch.setenv("RAFTSCHED_ADDR", f"127.0.0.1:{s.getsockname()[1]}")
        assert main(["status", "--timeout", "1"]) == 3  # the cluster cannot answer: exit 3
    err = capsys.readouterr().err
    assert err.startswith("error: unavailable: ") and "127.0.0.1:" in err
