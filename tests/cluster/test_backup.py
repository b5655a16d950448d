"""Backup and restore with real processes (issue 16 item 5): a backup taken under load
from a follower restores into a new cluster with the same jobs and run history; a
corrupt, truncated or foreign file is refused with a clear error and writes nothing."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from raftsched.node.service.backupfile import decode_backup
from tests.support.harness import ROOT, Cluster, read_witness, wait_until, witness_command

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]

SECRET = "backup-secret-0123456789abc"


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, RS_TEST_SECRET=SECRET,
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "raftsched", *args], capture_output=True,
                          text=True, env=env, timeout=120)


def test_backup_under_load_restores_into_a_new_cluster(cluster_factory, tmp_path):
    c = cluster_factory(3, secret=SECRET)
    c.start_all()
    leader = c.wait_leader()
    ran = str(tmp_path / "ran.jsonl")
    with c.client() as cl:
        cl.put_jobs([{"id": f"b{i}", "schedule": {"every": "1s"}, "overlap": "allow",
                      "command": witness_command(ran)} for i in range(10)], atomic=True)
        cl.put_job({"id": "nightly", "schedule": {"cron": "0 3 * * *", "tz": "Europe/Berlin"},
                    "command": ["true"], "env": {"TOKEN": "t0ps3cret"}, "paused": True})
    wait_until(lambda: len(read_witness(ran)) >= 40, 60, "runs before the backup")
    follower = next(n for n in c.ids if n != leader)
    path = str(tmp_path / "cluster.bak")
    out = cli("backup", path, "--addr", c.api[follower], "--secret-env", "RS_TEST_SECRET")
    assert out.returncode == 0, out.stderr
    assert f"wrote {path}: cluster " in out.stdout and "at log index" in out.stdout
    assert os.stat(path).st_mode & 0o077 == 0
    with open(path, "rb") as f:
        data = f.read()
    header, state = decode_backup(data, path)
    assert header["node"] == follower and header["index"] > 0 and header["term"] >= 1
    assert set(state.jobs) == {f"b{i}" for i in range(10)} | {"nightly"}
    history = {job: [r.view() for r in state.history.get(job, ())] for job in state.jobs}
    assert sum(map(len, history.values())) >= 30, "the backup holds the run history"
    # Destroy the cluster: processes and data.
    c.close()
    shutil.rmtree(os.path.join(c.tmp, "data"))

    new = Cluster(str(tmp_path / "new"), 3, secret=SECRET)
    try:
        out = cli("restore", path, "--config", new.config)
        assert out.returncode == 0, out.stderr
        assert "restored 11 jobs from cluster" in out.stdout
        new.start_all()
        new.wait_leader(60)
        with new.client() as cl:
            jobs = {j["id"]: j for j in cl.list_jobs()["jobs"]}
            assert set(jobs) == set(state.jobs)
            for job_id, rec in state.jobs.items():
                want = rec.to_dict()
                assert jobs[job_id]["spec"]["schedule"] == want["spec"]["schedule"]
                assert jobs[job_id]["version"] == want["version"]
                assert jobs[job_id]["created_ms"] == want["created_ms"]
            # The env value came back too (the API masks it: compare the spec itself).
            assert state.jobs["nightly"].spec.env == {"TOKEN": "t0ps3cret"}
            for job_id, runs in history.items():
                now = {r["run_id"]: r for r in cl.runs(job_id, limit=1000)["runs"]}
                for run in runs:
                    assert now.get(run["run_id"]) == run, (job_id, run["run_id"])
            # The new cluster schedules on from there, with its own members.
            t0 = max(r["t"] for r in read_witness(ran))
            wait_until(lambda: any(r["t"] > t0 for r in read_witness(ran)), 30, "new runs")
            members = cl.status()["membership"]
            assert [m["raft"] for m in members["members"]] == [new.raft[n] for n in new.ids]
            assert not members["problems"]
        # A data dir in use is never overwritten.
        out = cli("restore", path, "--config", new.config, "--id", "n1")
        assert out.returncode == 1 and "restore seeds a new cluster" in out.stderr
    finally:
        new.close()


@pytest.mark.timeout(120)
def test_a_corrupt_or_truncated_backup_is_refused(cluster_factory, tmp_path):
    c = cluster_factory(1, secret=SECRET)
    c.start_all()
    c.wait_leader()
    with c.client() as cl:
        cl.put_job({"id": "x", "schedule": {"every": "1h"}, "command": ["true"]})
    path = str(tmp_path / "one.bak")
    assert cli("backup", path, "--addr", c.api["n1"], "--secret-env",
               "RS_TEST_SECRET").returncode == 0
    with open(path, "rb") as f:
        good = f.read()
    target = Cluster(str(tmp_path / "target"), 1, secret=SECRET)
    cases = {
        "truncated": (good[:-10], "truncated or damaged: the header announces"),
        "flipped": (good[:-5] + bytes([good[-5] ^ 0xFF]) + good[-4:],
                    "checksum does not match"),
        "foreign": (b"PK\x03\x04 a zip file", "not a raftsched backup"),
        "newer": (good.replace(b'"format": 1', b'"format": 9', 1),
                  "backup format v9 was written by a newer raftsched"),
        "empty": (b"", "the file is empty"),
    }
    for name, (data, message) in cases.items():
        bad = str(tmp_path / f"{name}.bak")
        with open(bad, "wb") as f:
            f.write(data)
        out = cli("restore", bad, "--config", target.config)
        assert out.returncode == 1, (name, out.stdout, out.stderr)
        assert "corrupt_backup" in out.stderr and message in out.stderr, (name, out.stderr)
        assert "nothing was restored" in out.stderr
        assert not os.path.exists(os.path.join(target.tmp, "data", "n1", "raft.dump")), name
    out = cli("restore", str(tmp_path / "missing.bak"), "--config", target.config)
    assert out.returncode == 1 and "no such file" in out.stderr
