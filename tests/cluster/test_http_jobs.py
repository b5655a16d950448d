"""Issue 32 item 5, HTTP jobs, against a real receiver on loopback.

First the node's executor alone (a real event loop and receiver, no cluster): the
run's identity as headers, ``${NAME}`` filled in on the wire and nowhere else, the
outcome from the status (``expect``), TLS verified with the system's CAs or the spec's
``ca`` and no way around it, no redirect followed, the request's timeout, a stop.
Then a real 3-node cluster: put through the CLI and the HTTP API (errors naming the
field through both), the body in the run's log, a node SIGKILLed while its request
is held (the retried attempt arrives with a higher fence and the receiver can refuse
the stale one), and the put refused while a member runs a release without HTTP jobs.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from raftsched.core.model import JobSpec
from raftsched.node.worker.executor import Execution
from raftsched.node.worker.runlog import LogLimits, RunLogs
from raftsched.node.worker.runtypes import ExecutionResult, RunContext
from raftsched.wire import certs
from tests.support.faulthooks import fault_env
from tests.support.harness import ROOT, Cluster, free_ports, wait_until
from tests.support.httputil import request, tokens, wait_serving
from tests.support.receiver import Receiver

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

SECRET = "http-jobs-test-secret-0123456789"
TOK = tokens(SECRET)
TOKEN = "tok-s3cr3t-value"


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


# ------------------------------------------------------------------ the executor alone

def _execute(http: dict[str, Any], tmp_path: Any, *, stop_after_s: float | None = None,
             timeout: str = "1h") -> tuple[ExecutionResult, RunLogs]:
    job = JobSpec.from_spec({"id": "h", "schedule": {"every": "1m"}, "http": http,
                             "env": {"TOKEN": TOKEN}, "timeout": timeout},
                            allowed_call_prefixes=())
    ctx = RunContext(job_id="h", run_id="h@1000", scheduled_ms=1000, fence=41, attempt=3,
                     node_id="n2")
    logs = RunLogs(str(tmp_path / "logs"), LogLimits(run_bytes=1 << 20, job_bytes=1 << 21,
                                                     job_runs=10, node_bytes=1 << 22))
    execution = Execution(spec=job, ctx=ctx, base_env={}, tail_bytes=256, allowed=(),
                          kill_grace_s=0.5, logs=logs)

    async def go() -> ExecutionResult:
        done: asyncio.Future[ExecutionResult] = asyncio.get_running_loop().create_future()
        execution.start(done.set_result)
        if stop_after_s is not None:
            asyncio.get_running_loop().call_later(stop_after_s, execution.stop, 0.5,
                                                  "node stopping")
        return await asyncio.wait_for(done, 60)

    return asyncio.run(go()), logs


def _log(logs: RunLogs, stream: int = 0) -> bytes:
    return logs.read(("h", 1000, 3), stream, 0, 1 << 20)["data"]


def test_the_request_carries_the_run_and_its_secrets_only_on_the_wire(receiver, tmp_path):
    receiver.answers["/ok"] = lambda req: (200, b"hello " + req["body"])
    result, logs = _execute({"url": receiver.url("/ok"), "method": "PUT",
                             "body": '{"token": "${TOKEN}", "lit": "$${TOKEN}"}',
                             "headers": {"Authorization": "Bearer ${TOKEN}",
                                         "Content-Type": "application/json"}}, tmp_path)
    assert (result.outcome, result.reason, result.exit_code) == ("succeeded", "http 200", None)
    (req,) = receiver.requests("/ok")
    h = req["headers"]
    assert req["method"] == "PUT" and h["authorization"] == f"Bearer {TOKEN}"
    assert json.loads(req["body"]) == {"token": TOKEN, "lit": "${TOKEN}"}
    assert (h["raftsched-run-id"], h["raftsched-fence"], h["raftsched-attempt"],
            h["raftsched-job-id"], h["raftsched-node-id"]) == ("h@1000", "41", "3", "h", "n2")
    assert h["raftsched-scheduled-at"] == "1970-01-01T00:00:01.000Z"
    assert h["user-agent"].startswith("raftsched") and h["content-type"] == "application/json"
    # The body came back with the secret in it: masked in the tail and in the log.
    assert result.tail == 'hello {"token": "***", "lit": "${TOKEN}"}'
    assert _log(logs) == result.tail.encode()
    err = _log(logs, 1).decode()
    assert err.startswith(f"raftsched: PUT {receiver.url('/ok')} -> 200 OK (") and TOKEN not in err


def test_the_status_decides_and_a_redirect_is_not_followed(receiver, tmp_path):
    receiver.answers["/down"] = lambda req: (503, b"try later")
    receiver.answers["/moved"] = lambda req: (302, b"")
    receiver.answers["/accepted"] = lambda req: (202, b"queued")
    result, _ = _execute({"url": receiver.url("/down")}, tmp_path)
    assert (result.outcome, result.reason, result.tail) == ("failed", "http 503", "try later")
    result, _ = _execute({"url": receiver.url("/moved")}, tmp_path)
    assert (result.outcome, result.reason) == ("failed", "http 302")
    assert [r["path"] for r in receiver.seen].count("/moved") == 1  # not followed
    result, _ = _execute({"url": receiver.url("/accepted"), "expect": [202]}, tmp_path)
    assert (result.outcome, result.reason) == ("succeeded", "http 202")
    result, _ = _execute({"url": receiver.url("/ok"), "expect": [202]}, tmp_path)
    assert (result.outcome, result.reason) == ("failed", "http 200")
    port = free_ports(1)[0]
    result, _ = _execute({"url": f"http://127.0.0.1:{port}/x"}, tmp_path)
    assert result.outcome == "failed" and result.reason.startswith(
        f"cannot connect to 127.0.0.1:{port}"), result.reason


def test_tls_is_verified_against_the_system_or_the_spec_s_ca(tmp_path):
    ca_cert, _ = certs.create_ca(str(tmp_path / "ca"))
    cert, key = certs.create_node(str(tmp_path / "ca"), "receiver")
    r = Receiver(tls=certs.server_context(cert, key))
    try:
        result, _ = _execute({"url": r.url("/x", "https")}, tmp_path)
        assert result.outcome == "failed" and result.reason.startswith(
            "tls: the certificate of 127.0.0.1 is not trusted"), result.reason
        assert r.seen == []  # nothing reached an unverified server
        result, _ = _execute({"url": r.url("/x", "https"), "ca": ca_cert}, tmp_path)
        assert (result.outcome, result.reason) == ("succeeded", "http 200")
        result, _ = _execute({"url": r.url("/x", "https"), "ca": str(tmp_path / "none.pem")},
                             tmp_path)
        assert result.outcome == "failed" and result.reason.startswith("http.ca "), result
    finally:
        r.close()


def test_the_request_s_timeout_and_a_stop(receiver, tmp_path):
    release = threading.Event()
    receiver.answers["/slow"] = lambda req: (release.wait(20), (200, b"late"))[1]
    try:
        result, _ = _execute({"url": receiver.url("/slow"), "timeout": "1s"}, tmp_path)
        assert (result.outcome, result.reason) == ("timed_out", "timeout 1s")
        result, _ = _execute({"url": receiver.url("/slow")}, tmp_path, timeout="2s")
        assert (result.outcome, result.reason) == ("timed_out", "timeout 2s")
        result, _ = _execute({"url": receiver.url("/slow")}, tmp_path, stop_after_s=0.5)
        assert (result.outcome, result.reason) == ("lost", "node stopping")
    finally:
        release.set()


# ------------------------------------------------------------------ a real cluster

def _cli(c: Cluster, *argv: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, RS_TEST_SECRET=SECRET,
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "raftsched", *argv,
                           "--addr", ",".join(c.api[n] for n in c.ids),
                           "--secret-env", "RS_TEST_SECRET", "--timeout", "20"],
                          env=env, capture_output=True, text=True, timeout=90, input=stdin)


def _ended(c: Cluster, job: str, n: int = 1) -> list[dict[str, Any]]:
    def done() -> list[dict[str, Any]] | None:
        with c.client() as cl:
            runs = cl.runs(job)["runs"]
        ended = [r for r in runs if r["finished_ms"] is not None]
        return ended if len(ended) >= n else None
    return wait_until(done, 60, f"{n} ended run(s) of {job}")


def test_http_jobs_through_the_cli_and_the_http_api(cluster_factory, receiver, tmp_path):
    c = cluster_factory(3, secret=SECRET, http=True)
    c.start_all()
    c.wait_leader()
    receiver.answers["/fail"] = lambda req: (500, b"boom: " + req["body"])
    job_file = tmp_path / "ping.toml"
    job_file.write_text(f'id = "ping"\nschedule = {{ at = "2099-01-01T00:00:00Z" }}\n'
                        f'http = {{ url = "{receiver.url("/ping")}", method = "POST", '
                        f'headers = {{ X-Key = "${{TOKEN}}" }}, body = "hi", '
                        f'expect = [200, 204] }}\nenv = {{ TOKEN = "{TOKEN}" }}\n')
    put = _cli(c, "job", "put", str(job_file))
    assert put.returncode == 0 and "ping" in put.stdout, put.stderr
    got = json.loads(_cli(c, "job", "get", "ping", "--json").stdout)
    assert got["spec"]["http"] == {"url": receiver.url("/ping"), "method": "POST",
                                   "headers": {"X-Key": "${TOKEN}"}, "body": "hi",
                                   "expect": [200, 204]}
    assert TOKEN not in json.dumps(got)
    # The same spec shape over HTTP: a PUT, with the same validation.
    status, body, _ = request(c.http["n2"], "PUT", "/api/v1/jobs/fail", TOK["admin"],
                              {"schedule": {"at": "2099-01-01T00:00:00Z"},
                               "http": {"url": receiver.url("/fail"), "method": "POST",
                                        "body": "payload"}})
    assert status == 201, body
    for bad, field in (({"url": "ftp://x/"}, "http.url"),
                       ({"url": receiver.url("/"), "headers": {"Raftsched-Fence": "1"}},
                        "http.headers.Raftsched-Fence"),
                       ({"url": receiver.url("/"), "expect": [99]}, "http.expect[0]"),
                       ({"url": receiver.url("/"), "method": "BREW"}, "http.method")):
        status, body, _ = request(c.http["n1"], "PUT", "/api/v1/jobs/bad", TOK["admin"],
                                  {"schedule": {"every": "1m"}, "http": bad})
        assert status == 400 and body["error"]["code"] == "invalid_spec", body
        assert body["error"]["message"].startswith(field + ":"), body
        out = _cli(c, "job", "put", "-", stdin=json.dumps(
            {"id": "bad", "schedule": {"every": "1m"}, "http": bad}))
        assert out.returncode == 1 and f"invalid_spec: {field}:" in out.stderr, out.stderr
    assert _cli(c, "job", "trigger", "ping").returncode == 0
    status, _, _ = request(c.http["n3"], "POST", "/api/v1/jobs/fail/trigger", TOK["admin"], {})
    assert status == 200
    (ok,) = _ended(c, "ping")
    (failed,) = _ended(c, "fail")
    assert (ok["state"], ok["reason"]) == ("succeeded", "http 200"), ok
    assert (failed["state"], failed["reason"], failed["tail"]) == \
        ("failed", "http 500", "boom: payload"), failed
    (req,) = receiver.requests("/ping")
    assert req["headers"]["x-key"] == TOKEN and req["body"] == b"hi"
    assert req["headers"]["raftsched-run-id"] == ok["run_id"]
    assert int(req["headers"]["raftsched-fence"]) == ok["fence"]
    # The response body is the run's log, read through any node.
    logs = _cli(c, "logs", ok["run_id"])
    assert logs.returncode == 0 and json.loads(logs.stdout)["raftsched-run-id"] == ok["run_id"]
    status, body, _ = request(c.http["n1"], "GET", f"/api/v1/runs/{failed['run_id']}/logs",
                              TOK["read"])
    assert status == 200 and body["text"] == "boom: payload" and body["done"], body
    status, body, _ = request(c.http["n1"], "GET",
                              f"/api/v1/runs/{failed['run_id']}/logs?stream=stderr",
                              TOK["read"])
    assert "POST " + receiver.url("/fail") + " -> 500" in body["text"], body
    # Exported as a job file, it puts back unchanged.
    export = _cli(c, "job", "export", "--dir", str(tmp_path / "jobs"))
    assert export.returncode == 0, export.stderr
    text = (tmp_path / "jobs" / "ping.toml").read_text()
    assert "http = " in text and TOKEN not in text
    dry = _cli(c, "apply", str(tmp_path / "jobs"), "--dry-run")
    assert dry.returncode == 0 and "0 to create, 0 to update" in dry.stdout, dry.stdout


def test_a_killed_node_s_request_is_retried_with_a_higher_fence(cluster_factory, receiver):
    """The node holding the request is SIGKILLed while the receiver holds it: its guard
    certifies it dead, the run is retried on another node as attempt 2 with a new
    fence, and a receiver that keeps the highest fence it saw refuses the first
    attempt's request when it finally answers it."""
    # A node timeout far above the guard's certificate: with the harness's 2 s the lease
    # release (~1.8 s) can beat a guard slowed by a loaded machine, and the reason
    # asserted at the end would be the lease's.
    c = cluster_factory(3, secret=SECRET, timing={"node_timeout": "12s"})
    c.start_all()
    leader = c.wait_leader()
    highest = {"fence": 0}
    first_in = threading.Event()
    release = threading.Event()

    def answer(req: dict[str, Any]) -> tuple[int, bytes]:
        fence = int(req["headers"]["raftsched-fence"])
        if req["headers"]["raftsched-attempt"] == "1":
            first_in.set()
            release.wait(60)  # held while its node is killed
        # What a receiver that refuses stale attempts does: the highest fence wins.
        with receiver.lock:
            stale = fence < highest["fence"]
            highest["fence"] = max(highest["fence"], fence)
        return (409, b"stale fence") if stale else (200, b"done")

    receiver.answers["/slow"] = answer
    with c.client() as cl:
        cl.put_job({"id": "slow", "schedule": {"at": "2099-01-01T00:00:00Z"},
                    "http": {"url": receiver.url("/slow")}, "on_node_lost": "retry"})
        run_id = cl.trigger("slow")["run_id"]
    if not first_in.wait(30):
        with c.client() as cl:
            runs = cl.runs("slow")["runs"]
        raise AssertionError(f"the first attempt never reached the receiver: {runs}")
    (first,) = receiver.requests("/slow")
    holder = first["headers"]["raftsched-node-id"]
    assert holder != leader  # the leader runs jobs only when no follower has a slot
    c.kill(holder)
    wait_until(lambda: len(receiver.requests("/slow")) >= 2, 30, "the retried attempt")
    second = receiver.requests("/slow")[1]["headers"]
    assert second["raftsched-run-id"] == run_id and second["raftsched-attempt"] == "2"
    assert int(second["raftsched-fence"]) > int(first["headers"]["raftsched-fence"])
    assert second["raftsched-node-id"] not in (holder,)
    survivors = [n for n in c.ids if n != holder]
    with c.client(survivors) as cl:
        def ended() -> dict[str, Any] | None:
            run = cl.runs("slow")["runs"][0]
            return run if run["state"] == "succeeded" else None
        run = wait_until(ended, 30, "attempt 2 to succeed")
    assert run["attempt"] == 2 and run["reason"] == "http 200"
    release.set()  # the first attempt's request, answered late: refused as stale
    wait_until(lambda: highest["fence"] == int(second["raftsched-fence"]), 10, "fences")
    with c.client(survivors) as cl:
        history = cl.runs("slow")["runs"]
    assert [(r["attempt"], r["state"]) for r in history] == [(2, "succeeded"), (1, "lost")]
    assert "certified" in history[1]["reason"], history[1]


def test_http_jobs_wait_until_every_member_runs_this_release(cluster_factory, receiver):
    """A member of the release before HTTP jobs would refuse such a spec in its apply
    and part from the others' state: the put is refused, naming it, until it runs this
    release; jobs without http are put as always."""
    c = cluster_factory(3, secret=SECRET, http=True)
    c.start_all({"n3": fault_env(c.tmp, "announce_no_http")})
    c.wait_leader()
    spec = {"id": "hook", "schedule": {"every": "1m"}, "http": {"url": receiver.url("/h")}}

    def refused() -> subprocess.CompletedProcess[str] | None:
        out = _cli(c, "job", "put", "-", stdin=json.dumps(spec))
        return out if out.returncode == 1 else None
    out = wait_until(refused, 30, "n3's heartbeat without http")
    assert "conflict: http: node(s) n3 run an older raftsched" in out.stderr, out.stderr
    status, body, _ = request(c.http["n1"], "PUT", "/api/v1/jobs/hook", TOK["admin"], spec)
    assert status == 409 and body["error"]["code"] == "conflict", body
    assert "n3" in body["error"]["message"]
    plain = {"id": "plain", "schedule": {"every": "1m"}, "command": ["true"]}
    assert _cli(c, "job", "put", "-", stdin=json.dumps(plain)).returncode == 0
    c.terminate("n3")
    c.start("n3")  # upgraded: announces http
    wait_serving(c.http["n3"])

    def accepted() -> bool:
        return _cli(c, "job", "put", "-", stdin=json.dumps(spec)).returncode == 0
    wait_until(accepted, 60, "the put once every member announces http")
    with c.client() as cl:
        assert cl.get_job("hook")["spec"]["http"]["url"] == receiver.url("/h")
