"""Issue 17 item 6 through real nodes and the CLI: ``apply DIR`` makes the cluster's jobs
equal a directory of job files in one all-or-nothing command, with a diff first;
``job export`` writes the jobs back out (env values as ``{ keep = true }``, never the
mask) and export -> apply changes nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from raftsched.core.errors import Conflict, InvalidSpec, UnknownJob
from tests.support.harness import ROOT, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]


def cli(c, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               RS_TEST_SECRET=c.secret)
    addrs = ",".join(c.api[n] for n in c.ids)
    return subprocess.run([sys.executable, "-m", "raftsched", *args, "--addr", addrs,
                           "--secret-env", "RS_TEST_SECRET", "--timeout", "20"],
                          env=env, capture_output=True, text=True, timeout=60)


def versions(c) -> dict[str, int]:
    with c.client() as cl:
        return {j["id"]: j["version"] for j in cl.list_jobs()["jobs"]}


def test_export_apply_round_trip_diff_prune_and_all_or_nothing(cluster_factory, tmp_path):
    c = cluster_factory(3, secret="apply-test-secret")
    c.start_all()
    c.wait_leader()
    out = tmp_path / "target.txt"
    with c.client() as cl:
        cl.put_job({"id": "backup", "schedule": {"cron": "0 3 * * *", "tz": "Europe/Berlin"},
                    "command": ["sh", "-c", f'printf %s "$TARGET" > {out}'],
                    "env": {"TARGET": "s3://bucket", "TOKEN": "hunter2"},
                    "retries": {"max": 2, "backoff": "5s"}, "jitter": "0s", "overlap": "allow"})
        cl.put_job({"id": "tick", "schedule": {"every": "1h"}, "command": ["true"],
                    "timeout": "5m", "paused": True})
        cl.put_job({"id": "odd \"one\"".replace(" ", "_").replace('"', "q"),
                    "schedule": {"at": "2099-01-01T00:00:00Z"},
                    "command": ["printf", "a\tb \"c\" \\ é"]})
    before = versions(c)

    # export -> apply is a no-op: no new versions, and the mask is never written.
    d = tmp_path / "jobs"
    res = cli(c, "job", "export", "--dir", str(d))
    assert res.returncode == 0, res.stderr
    assert sorted(os.listdir(d)) == ["backup.toml", "odd_qoneq.toml", "tick.toml"]
    text = (d / "backup.toml").read_text()
    assert "***" not in text and "hunter2" not in text
    assert "TARGET = { keep = true }" in text, text
    assert "paused" not in (d / "backup.toml").read_text()
    res = cli(c, "apply", str(d))
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "0 to create, 0 to update, 0 to remove, 3 unchanged", res.stdout
    assert versions(c) == before
    # The stdout form (one document of [[jobs]]) round-trips too.
    res = cli(c, "job", "export")
    assert res.returncode == 0, res.stderr
    (tmp_path / "all.toml").write_text(res.stdout)
    res = cli(c, "apply", str(tmp_path / "all.toml"), "--prune")
    assert res.returncode == 0 and "3 unchanged" in res.stdout, (res.stdout, res.stderr)
    assert versions(c) == before

    # A change and a new job: the dry run prints a unified diff and changes nothing.
    (d / "tick.toml").write_text((d / "tick.toml").read_text().replace('"5m"', '"7m"'))
    (d / "new.toml").write_text('id = "new"\nschedule = { every = "2h" }\n'
                                'command = ["true"]\nenv = { A = "secret-a" }\n')
    (d / "backup.toml").write_text((d / "backup.toml").read_text().replace(
        "TOKEN = { keep = true }", 'TOKEN = "hunter3"'))
    res = cli(c, "apply", str(d), "--dry-run")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert "update tick: timeout" in lines, res.stdout
    assert '-timeout = "5m"' in lines and '+timeout = "7m"' in lines, res.stdout
    assert "create new" in lines and "+++ files/new" in lines, res.stdout
    assert "update backup: env.TOKEN" in lines, res.stdout
    assert "secret-a" not in res.stdout and "hunter" not in res.stdout
    assert lines[-1] == "1 to create, 2 to update, 0 to remove, 1 unchanged", res.stdout
    assert versions(c) == before

    # Atomic: a bad file among good changes changes nothing, and the error names it.
    (d / "zbad.toml").write_text('id = "zbad"\nschedule = { cron = "61 * * * *" }\n'
                                 'command = ["true"]\n')
    res = cli(c, "apply", str(d))
    assert res.returncode == 1, res
    assert f"{d / 'zbad.toml'}: schedule.cron" in res.stderr, res.stderr
    assert versions(c) == before
    (d / "zbad.toml").write_text('id = "zbad"\nschedule = { every = "1h" }\n'
                                 'commnd = ["true"]\n')
    res = cli(c, "apply", str(d))
    assert res.returncode == 1 and "did you mean 'command'" in res.stderr, res.stderr
    os.remove(d / "zbad.toml")

    res = cli(c, "apply", str(d))
    assert res.returncode == 0, res.stderr
    assert "created new (version 1)" in res.stdout, res.stdout
    assert f"updated tick (version {before['tick'] + 1})" in res.stdout, res.stdout
    after = versions(c)
    assert after["odd_qoneq"] == before["odd_qoneq"] and after["new"] == 1
    with c.client() as cl:
        tick = cl.get_job("tick")
        assert tick["spec"]["timeout"] == "7m" and tick["paused"] is True  # kept paused
        # The kept env value is the real one: the job runs with it.
        cl.trigger("backup")
    wait_until(lambda: out.exists() and out.read_text() == "s3://bucket", 30,
               "backup ran with its kept TARGET")

    # --prune removes the jobs no file names; again as one command.
    os.remove(d / "odd_qoneq.toml")
    res = cli(c, "apply", str(d), "--prune")
    assert res.returncode == 0, res.stderr
    assert "remove odd_qoneq" in res.stdout and "removed odd_qoneq" in res.stdout, res.stdout
    with c.client() as cl:
        with pytest.raises(UnknownJob):
            cl.get_job("odd_qoneq")
        # A keep for a variable the job does not have is refused naming it.
        bad = {"id": "new", "schedule": {"every": "2h"}, "command": ["true"],
               "env": {"B": {"keep": True}}}
        with pytest.raises(InvalidSpec, match=r"specs\[0\]\.env\.B: .*has no env B"):
            cl.apply([bad])
        # A diff's expected versions refuse an apply when a job changed since.
        diff = cl.diff_apply([dict(bad, env={"A": "x"})])
        cl.put_job({"id": "new", "schedule": {"every": "3h"}, "command": ["true"]})
        with pytest.raises(Conflict, match="changed since the diff"):
            cl.apply([dict(bad, env={"A": "x"})], expect=diff["expect"])
        assert cl.get_job("new")["spec"]["schedule"] == {"every": "3h"}
    assert json.loads(cli(c, "apply", str(d), "--dry-run", "--json").stdout)["changes"]
