"""Issue 29 item 7: a job whose tags no member has is put with a warning that says so,
and its runs are recorded ``missed (unplaceable: no member has tags [gpu])``, not
``shed (overload)``. The CLI runs as a real process against a real node."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from raftsched.wire.client import Client
from tests.support.harness import ROOT, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

SECRET = "unplaceable-tags-test-secret-0123456789"
GPU = "no member has tags [gpu]"


def cli(cluster, *argv: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, RS_TEST_SECRET=SECRET,
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("RAFTSCHED_ADDR", None)
    return subprocess.run(
        [sys.executable, "-m", "raftsched", *argv, "--addr", cluster.api["n1"],
         "--secret-env", "RS_TEST_SECRET", "--timeout", "10"],
        capture_output=True, text=True, timeout=60, env=env)


def test_a_put_of_tags_no_member_has_warns_and_its_runs_say_unplaceable(cluster_factory,
                                                                         tmp_path):
    c = cluster_factory(1, secret=SECRET, tags={"n1": ["linux"]})
    c.start_all()
    c.wait_leader()
    with Client([c.api["n1"]], secret=SECRET, timeout=10) as cl:
        # The warning is judged from the members' heartbeats (their tags).
        wait_until(lambda: [n["tags"] for n in cl.status()["nodes"]] == [["linux"]], 20,
                   "n1's heartbeat with its tags")
    gpu = tmp_path / "gpu.toml"
    gpu.write_text('id = "gpu"\nschedule = { every = "1h" }\ncommand = ["true"]\n'
                   'tags = ["gpu"]\nmisfire = { grace = "0s" }\n')
    put = cli(c, "job", "put", str(gpu))
    # Put all the same (a node with the tag may join later), with a warning on stderr.
    assert put.returncode == 0, put
    assert put.stdout.strip() == "put gpu (version 1, created)", put
    assert GPU in put.stderr and put.stderr.startswith("warning: job gpu: "), put

    as_json = cli(c, "job", "put", str(gpu), "--json")
    assert as_json.returncode == 0, as_json
    (reply,) = json.loads(as_json.stdout)
    assert reply["version"] == 2 and any(GPU in w for w in reply["warnings"]), reply

    linux = tmp_path / "linux.toml"
    linux.write_text('id = "lx"\nschedule = { every = "1h" }\ncommand = ["true"]\n'
                     'tags = ["linux"]\n')
    quiet = cli(c, "job", "put", str(linux))
    assert quiet.returncode == 0 and quiet.stderr == "", quiet

    with Client([c.api["n1"]], secret=SECRET, timeout=10) as cl:
        assert "warnings" not in cl.put_job({"id": "lx2", "schedule": {"every": "1h"},
                                             "command": ["true"]})
        assert any(GPU in w for w in cl.put_job(
            {"id": "gpu2", "schedule": {"every": "1h"}, "command": ["true"],
             "tags": ["gpu"]})["warnings"])
        cl.trigger("gpu")

        def ended() -> dict | None:
            runs = [r for r in cl.runs("gpu")["runs"] if r.get("manual")]
            return runs[0] if runs and runs[0]["state"] not in (
                "pending", "assigned", "started") else None

        run = wait_until(ended, 20, "the triggered run's outcome")
    assert (run["state"], run["reason"]) == ("missed", f"unplaceable: {GPU}"), run
