"""Issue 32 item 3 on a real 3-node cluster: a run's full log, kept on the node that ran
it, read from any node through the CLI (``raftsched logs``, ``--follow``, ``--stderr``)
and the HTTP API (as /openapi.json says), never mixed with another job's, with the
job's env values masked; bounded by the node's limits (oldest removed first, a run cut
at its bound); kept across the node's restart; and, while that node is down, an error
naming it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

import jsonschema
import pytest

from tests.support.harness import ROOT, Cluster, wait_until
from tests.support.httputil import request, tokens, wait_serving

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

SECRET = "run-logs-test-secret-0123456789"
TOK = tokens(SECRET)
TOKEN = "hush-hush-value-42"
#: The node with the "solo" tag: every job here runs there, so its logs are there.
HOLDER = "n2"


def _cli(c: Cluster, *argv: str, addrs: list[str] | None = None
         ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(_argv(c, *argv, addrs=addrs), env=_env(), capture_output=True,
                          text=True, timeout=120)


def _argv(c: Cluster, *argv: str, addrs: list[str] | None = None) -> list[str]:
    return [sys.executable, "-m", "raftsched", *argv,
            "--addr", ",".join(c.api[n] for n in (addrs or c.ids)),
            "--secret-env", "RS_TEST_SECRET"]


def _env() -> dict[str, str]:
    return dict(os.environ, RS_TEST_SECRET=SECRET,
                PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))


def _ended(c: Cluster, job: str, run_id: str) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        with c.client() as cl:
            runs = [r for r in cl.runs(job)["runs"] if r["run_id"] == run_id]
        return runs[0] if runs and runs[0]["finished_ms"] is not None else None
    return wait_until(done, 60, f"{run_id} to end")


def _put(c: Cluster, job: str, script: str, **extra: Any) -> None:
    with c.client() as cl:
        cl.put_job(dict({"id": job, "schedule": {"at": "2099-01-01T00:00:00Z"},
                         "command": ["sh", "-c", script], "tags": ["solo"]}, **extra))


def _checked(c: Cluster, nid: str, path: str, expect: int = 200) -> Any:
    """GET a logs route; the answer validated against the OpenAPI document."""
    from raftsched.wire.openapi import document
    status, data, _ = request(c.http[nid], "GET", path, TOK["read"])
    assert status == expect, (path, status, data)
    doc = document()
    op = doc["paths"]["/api/v1/runs/{run}/logs"]["get"]
    schema = op["responses"][str(status)]["content"]["application/json"]["schema"]
    jsonschema.Draft202012Validator(dict(schema, components=doc["components"])).validate(data)
    return data


def test_logs_from_any_node_follow_limits_restart_and_a_down_node(cluster_factory, tmp_path):
    c = cluster_factory(3, secret=SECRET, http=True, tags={HOLDER: ["solo"]},
                        limits={"log_runs_per_job": 2, "log_bytes_per_run": 65536})
    c.start_all()
    c.wait_leader()
    flag = tmp_path / "go-on"
    # Line 1, then wait for the test to have *seen* it through --follow, then the rest:
    # the follow streams while the run runs, or this run never ends.
    _put(c, "chatty", f'echo "line 1"; echo "warn 1" >&2; '
                      f'while [ ! -e {flag} ]; do sleep 0.05; done; '
                      f'echo "line 2 $TOKEN"; echo "warn 2" >&2; echo "line 3"',
         env={"TOKEN": TOKEN})
    with c.client() as cl:
        run_id = cl.trigger("chatty")["run_id"]
    others = [n for n in c.ids if n != HOLDER]
    follow = subprocess.Popen(_argv(c, "logs", run_id, "--follow", addrs=others), env=_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert follow.stdout is not None
        assert follow.stdout.readline() == "line 1\n"  # before the run could end
        flag.touch()
        rest, err = follow.communicate(timeout=60)
    finally:
        if follow.poll() is None:
            follow.kill()
    assert follow.returncode == 0, err
    assert rest == "line 2 ***\nline 3\n" and TOKEN not in err
    assert f"bytes on stderr: raftsched logs {run_id} --stderr" in err
    run = _ended(c, "chatty", run_id)
    assert run["node"] == HOLDER and run["state"] == "succeeded"
    # From every node, the same bytes; stderr apart; the tail still merged.
    for nid in c.ids:
        out = _cli(c, "logs", run_id, addrs=[nid])
        assert (out.returncode, out.stdout) == (0, "line 1\nline 2 ***\nline 3\n"), out.stderr
        err = _cli(c, "logs", run_id, "--stderr", addrs=[nid])
        assert err.stdout == "warn 1\nwarn 2\n"
    assert "line 1" in run["tail"] and "warn 2" in run["tail"] and TOKEN not in run["tail"]
    page = _checked(c, "n1", f"/api/v1/runs/{run_id}/logs")
    assert (page["text"], page["node"], page["done"], page["attempt"]) == \
        ("line 1\nline 2 ***\nline 3\n", HOLDER, True, 1)
    assert page["sizes"] == {"stdout": 25, "stderr": 14}
    end = _checked(c, "n3", f"/api/v1/runs/{run_id}/logs?stream=stderr&offset=-7&limit=3")
    assert (end["text"], end["offset"], end["next_offset"]) == ("war", 7, 10)
    as_json = json.loads(_cli(c, "logs", run_id, "--json", addrs=["n1"]).stdout)
    assert as_json["text"] == page["text"] and as_json["node"] == HOLDER

    # Two jobs at once on one node: each log holds its own lines only.
    for job in ("ping", "pong"):
        _put(c, job, f"for i in $(seq 1 200); do echo {job}-$i; done")
    with c.client() as cl:
        runs = [cl.trigger(job)["run_id"] for job in ("ping", "pong")]
    for job, rid in zip(("ping", "pong"), runs, strict=True):
        _ended(c, job, rid)
        lines = _cli(c, "logs", rid).stdout.splitlines()
        assert lines == [f"{job}-{i}" for i in range(1, 201)]

    # A run over log_bytes_per_run keeps its start and says so; its tail has the end.
    _put(c, "flood", "seq 1 30000; echo the-end")
    with c.client() as cl:
        flood = cl.trigger("flood")["run_id"]
    tail = _ended(c, "flood", flood)["tail"]
    text = _cli(c, "logs", flood).stdout
    assert text.startswith("1\n2\n3\n") and "not kept: limits.log_bytes_per_run (65536)" in text
    assert len(text) < 66_000 and "the-end" not in text and tail.endswith("the-end\n")

    # log_runs_per_job = 2: a third run's log removes the first's, said as such.
    with c.client() as cl:
        for _ in range(2):
            _ended(c, "chatty", cl.trigger("chatty", force=True)["run_id"])
    gone = _cli(c, "logs", run_id)
    assert gone.returncode == 0 and gone.stdout == ""
    assert f"the log of {run_id} (attempt 1) was removed from {HOLDER} by its limits " \
           "(limits.log_runs_per_job)" in gone.stderr, gone.stderr

    # The holder down: the error names it (CLI exit 3; HTTP 503), no other node has it.
    c.kill(HOLDER)
    down = _cli(c, "logs", runs[0], addrs=others)
    assert down.returncode == 3, down
    assert f"error: node_unavailable: the log of {runs[0]} (attempt 1) is on node {HOLDER}, " \
           "which does not answer" in down.stderr, down.stderr
    body = _checked(c, "n1", f"/api/v1/runs/{runs[0]}/logs", expect=503)
    assert body["error"]["code"] == "node_unavailable" and HOLDER in body["error"]["message"]
    # Back: its logs were kept on its disk.
    c.start(HOLDER)
    wait_serving(c.http[HOLDER])
    back = wait_until(lambda: (o := _cli(c, "logs", runs[1], addrs=others)).returncode == 0
                      and o, 60, "the log once its node is back")
    assert back.stdout.splitlines()[-1] == "pong-200"

    # Asking wrong: the field is named.
    bad = _cli(c, "logs", "no-such-job@123")
    assert bad.returncode == 1 and "unknown_run" in bad.stderr, bad.stderr
    bad = _cli(c, "logs", "not-a-run-id")
    assert bad.returncode == 1 and "invalid_argument: run: must be a run id" in bad.stderr
    bad = _cli(c, "logs", run_id, "--attempt", "9")
    assert bad.returncode == 1 and "attempt: run" in bad.stderr, bad.stderr
    status, data, _ = request(c.http["n1"], "GET", f"/api/v1/runs/{run_id}/logs?wait=99",
                              TOK["read"])
    assert status == 400 and data["error"]["message"].startswith("wait:"), data


def test_a_follow_waits_for_the_run_to_be_placed_and_ends_with_it(cluster_factory):
    """``--follow`` on a run just triggered (not yet on a node) waits for its node and
    prints everything, ending when the run ends; a run that failed says so in its exit
    status only through ``runs``: logs exits 0 with what it printed."""
    c = cluster_factory(3, secret=SECRET, tags={HOLDER: ["solo"]})
    c.start_all()
    c.wait_leader()
    _put(c, "slowish", "sleep 1; echo one; sleep 1; echo two >&2; exit 3")
    with c.client() as cl:
        run_id = cl.trigger("slowish")["run_id"]
    started = time.monotonic()
    out = _cli(c, "logs", run_id, "--follow", "--stderr")
    assert out.returncode == 0 and out.stdout == "two\n", out.stderr
    assert "4 bytes on stdout" in out.stderr
    run = _ended(c, "slowish", run_id)
    assert run["state"] == "failed" and run["reason"] == "exit 3"
    assert time.monotonic() - started < 60
