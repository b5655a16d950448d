"""Issue 12 item 7 with a real node: an `at` already past runs within its grace and is
refused beyond it (every fire time ends in one recorded outcome); a finished one-shot
job shows done, and `[limits] done_retention` removes it after that long."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from raftsched.core.durations import format_timestamp
from raftsched.core.errors import InvalidSpec, UnknownJob
from tests.support.harness import ROOT, read_witness, wait_until, witness_command

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def _ago(seconds: int) -> str:
    return format_timestamp((int(time.time()) - seconds) * 1000)


def test_a_past_at_runs_inside_its_grace_is_refused_beyond_and_is_then_done(
        cluster_factory, tmp_path):
    c = cluster_factory(1)
    c.start_all()
    c.wait_leader()
    ran = str(tmp_path / "ran.jsonl")
    with c.client() as cl:
        cl.put_job({"id": "late", "schedule": {"at": _ago(20)},
                    "command": witness_command(ran)})
        wait_until(lambda: len(read_witness(ran)) == 1, 30, "the late one-shot to run")
        wait_until(lambda: cl.get_job("late")["done"], 30, "the one-shot job to show done")
        runs = cl.runs("late")["runs"]
        assert [r["state"] for r in runs] == ["succeeded"], runs
        with pytest.raises(InvalidSpec) as info:
            cl.put_job({"id": "stale", "schedule": {"at": _ago(300)}, "command": ["true"]})
        assert info.value.field == "schedule.at"
        assert "beyond misfire.grace" in str(info.value)
        with pytest.raises(UnknownJob):
            cl.get_job("stale")
    out = subprocess.run([sys.executable, "-m", "raftsched", "job", "ls", "--addr", c.api["n1"]],
                         capture_output=True, text=True, timeout=60, cwd=ROOT,
                         env=c.node_env())
    assert out.returncode == 0, out.stderr
    row = next(line for line in out.stdout.splitlines() if line.startswith("late"))
    assert " done " in row, out.stdout
    assert len(read_witness(ran)) == 1


def test_done_retention_removes_a_finished_one_shot_job(cluster_factory, tmp_path):
    c = cluster_factory(1, limits={"done_retention": "1s"})
    c.start_all()
    c.wait_leader()
    ran = str(tmp_path / "ran.jsonl")
    with c.client() as cl:
        cl.put_job({"id": "once", "schedule": {"at": format_timestamp(
            (int(time.time()) + 2) * 1000)}, "command": witness_command(ran)})
        cl.put_job({"id": "keep", "schedule": {"every": "1h"}, "command": ["true"]})

        def gone() -> bool:
            try:
                cl.get_job("once")
            except UnknownJob:
                return True
            return False

        wait_until(gone, 60, "the finished one-shot job to be removed")
        assert len(read_witness(ran)) == 1
        assert cl.get_job("keep")["id"] == "keep"
    expired = [e for e in c.events("n1") if e.get("event") == "job.expired"]
    assert [e["job_id"] for e in expired] == ["once"]
    assert json.dumps(expired)  # events are JSON lines
