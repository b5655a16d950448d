"""Issue 12 items 5 and 6 through a real node and the CLI: a job file is applied whole
or not at all; the env mask from ``job get`` never becomes a job's value."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from raftsched.core.errors import InvalidSpec, UnknownJob
from tests.support.harness import ROOT, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


def cli(c, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "raftsched", *args, "--addr", c.api["n1"]],
                          env=env, capture_output=True, text=True, timeout=60, input=stdin)


def test_a_multi_job_file_is_applied_all_or_nothing(cluster_factory, tmp_path):
    c = cluster_factory(1)
    c.start_all()
    c.wait_leader()
    m5 = {"id": "m5", "schedule": {"every": "1h"}, "command": ["true"]}
    m6 = {"id": "m6", "schedule": {"cron": "61 * * * *"}, "command": ["true"]}
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([m5, m6]))
    res = cli(c, "job", "put", str(bad))
    assert res.returncode == 1, res
    assert "invalid_spec" in res.stderr and "jobs[1] ('m6').schedule" in res.stderr, res.stderr
    with c.client() as cl:
        with pytest.raises(UnknownJob):
            cl.get_job("m5")
        assert cl.list_jobs()["total"] == 0

    good = tmp_path / "good.toml"
    good.write_text('[[jobs]]\nid = "m5"\nschedule = {every = "1h"}\ncommand = ["true"]\n'
                    '[[jobs]]\nid = "m6"\nschedule = {every = "2h"}\ncommand = ["true"]\n')
    res = cli(c, "job", "put", str(good))
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == ["put m5 (version 1, created)",
                                       "put m6 (version 1, created)"]
    # A file naming an existing job and a bad one: the existing job is untouched too.
    m5b = dict(m5, timeout="5m")
    bad.write_text(json.dumps([m5b, dict(m6, schedule={"every": "2h"}, overlap="sometimes")]))
    res = cli(c, "job", "put", str(bad), "--json")
    # Under --json the error is JSON on stdout.
    assert res.returncode == 1, res
    assert json.loads(res.stdout)["error"]["message"].startswith("jobs[1] ('m6').overlap"), res
    with c.client() as cl:
        assert cl.get_job("m5")["version"] == 1
        with pytest.raises(InvalidSpec):
            cl.put_jobs([m5b, m5b], atomic=True)
        assert cl.get_job("m5")["version"] == 1


def test_get_then_put_of_a_masked_env_is_refused_and_the_job_runs_with_its_value(
        cluster_factory, tmp_path):
    c = cluster_factory(1)
    c.start_all()
    c.wait_leader()
    out = tmp_path / "target.txt"
    spec = {"id": "x", "schedule": {"at": "2099-01-01T00:00:00Z"},
            "command": ["sh", "-c", f'printf %s "$TARGET" > {out}'],
            "env": {"TARGET": "s3://bucket"}}
    with c.client() as cl:
        cl.put_job(spec)
    res = cli(c, "job", "get", "x", "--json")
    assert res.returncode == 0, res.stderr
    shown = json.loads(res.stdout)["spec"]
    assert shown["env"] == {"TARGET": "***"}
    (tmp_path / "x.json").write_text(json.dumps(shown))
    res = cli(c, "job", "put", str(tmp_path / "x.json"))
    assert res.returncode == 1
    assert "invalid_spec: env.TARGET: '***' is the mask" in res.stderr, res.stderr
    # Inside a multi-job file too, and with the Python client.
    (tmp_path / "two.json").write_text(json.dumps([dict(shown, id="y"), shown]))
    res = cli(c, "job", "put", str(tmp_path / "two.json"))
    assert res.returncode == 1 and "jobs[0] ('y').env.TARGET" in res.stderr, res.stderr
    with c.client() as cl:
        with pytest.raises(InvalidSpec):
            cl.put_job(shown)
        assert cl.get_job("x")["version"] == 1
        cl.trigger("x")
        wait_until(lambda: out.exists() and out.read_text() == "s3://bucket", 15,
                   "the run wrote the real value")
