"""Issue 32 item 6 through a real node: ``start``/``end`` bounds in a job file and in the
JSON API. ``job put``, ``job put --dry-run``, ``job next FILE`` and ``apply --dry-run``
refuse a bad bound alike, naming the field; ``job next`` lists only fire times inside
the bounds; the job runs inside them only, and after its end ``job ls``, ``job get`` and
the HTTP API show it done."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest

from raftsched.core.durations import format_timestamp, parse_timestamp
from raftsched.faces.cli import main
from tests.support.harness import Cluster, read_witness, wait_until, witness_command
from tests.support.httputil import request, tokens

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

SECRET = "bounds-test-secret-0123456789abcdef"
TOK = tokens(SECRET)


@pytest.fixture(scope="module")
def node(tmp_path_factory: Any) -> Iterator[Cluster]:
    c = Cluster(str(tmp_path_factory.mktemp("bounds")), 1, secret=SECRET, http=True)
    try:
        c.start_all()
        c.wait_leader()
        yield c
    finally:
        c.close()


def _run(capsys: Any, c: Cluster, *argv: str) -> tuple[int, str, str]:
    rc = main([*argv, "--addr", c.api["n1"], "--secret-env", "RS_TEST_SECRET"])
    out = capsys.readouterr()
    return rc, out.out, out.err


def _whole_second(ahead_s: int) -> int:
    return (int(time.time()) + ahead_s) * 1000


def _job(job_id: str, extra: str, command: list[str] | None = None) -> str:
    return (f'id = "{job_id}"\nschedule = {{every = "1s"}}\n'
            f"command = {json.dumps(command or ['true'])}\n{extra}")


#: Files every put path refuses, with the field the error must name.
REFUSED = {
    "end-before-start": ('start = "2030-01-02T00:00:00Z"\nend = "2030-01-01T00:00:00Z"\n',
                         "end"),
    "start-not-a-time": ('start = "next tuesday"\n', "start"),
    "end-without-zone": ('end = "2030-01-01T00:00:00"\n', "end"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_bad_bound_is_refused_alike_by_every_put_path_naming_the_field(
        case: str, node: Cluster, tmp_path: Any, capsys: Any, monkeypatch: Any) -> None:
    monkeypatch.setenv("RS_TEST_SECRET", SECRET)
    extra, field = REFUSED[case]
    path = tmp_path / f"{case}.toml"
    path.write_text(_job("bad", extra))
    rc, out, err = _run(capsys, node, "job", "put", str(path))
    assert rc == 1 and out == "", (out, err)
    error = err.strip()
    assert error.startswith(f"error: invalid_spec: {field}: "), error
    for argv in (("job", "put", "--dry-run", str(path)), ("job", "next", str(path))):
        assert _run(capsys, node, *argv) == (1, "", error + "\n"), argv
    # apply names the file, then the field.
    rc, out, err = _run(capsys, node, "apply", "--dry-run", str(path))
    assert rc == 1 and f"{field}: " in err and error.partition(f"{field}: ")[2] in err, err
    # The JSON API refuses it with the same words.
    spec = json.loads(json.dumps(__import__("tomllib").loads(path.read_text())))
    status, body, _ = request(node.http["n1"], "PUT", "/api/v1/jobs/bad", TOK["admin"], spec)
    assert status == 400 and body["error"]["code"] == "invalid_spec", body
    assert body["error"]["message"] == error.removeprefix("error: invalid_spec: ")
    with node.client() as cl:
        assert cl.list_jobs()["total"] == 0


def test_a_bounded_job_through_the_cli_runs_inside_its_bounds_then_shows_done(
        node: Cluster, tmp_path: Any, capsys: Any, monkeypatch: Any) -> None:
    monkeypatch.setenv("RS_TEST_SECRET", SECRET)
    ran = str(tmp_path / "ran.jsonl")
    start, end = _whole_second(12), _whole_second(16)
    path = tmp_path / "window.toml"
    path.write_text(_job("window", f'start = "{format_timestamp(start)}"\n'
                                   f'end = "{format_timestamp(end)}"\n', witness_command(ran)))

    rc, out, err = _run(capsys, node, "job", "next", str(path), "--count", "20", "--json")
    assert rc == 0, err
    preview = json.loads(out)
    fires = [f["at_ms"] for f in preview["fires"]]
    assert fires == list(range(max(start, fires[0]), end + 1, 1000)) and fires[-1] == end
    assert (preview["start"], preview["end"]) == (format_timestamp(start), format_timestamp(end))
    assert preview["description"].endswith(
        f"from {format_timestamp(start)}, until {format_timestamp(end)}")
    rc, out, err = _run(capsys, node, "job", "put", "--dry-run", str(path))
    assert (rc, out) == (0, "window: would be created\n(dry run: nothing was changed)\n"), err
    assert _run(capsys, node, "job", "put", str(path))[0] == 0
    rc, out, _ = _run(capsys, node, "job", "next", "window", "--count", "20", "--json")
    assert rc == 0 and [f["at_ms"] for f in json.loads(out)["fires"]][-1] == end
    rc, out, _ = _run(capsys, node, "job", "ls")
    row = next(line for line in out.splitlines() if line.startswith("window"))
    assert f"every 1s from {format_timestamp(start)} until {format_timestamp(end)}" in row
    assert " done " not in row

    with node.client() as cl:
        wait_until(lambda: cl.get_job("window")["done"], 60, "the job done after its end")
        runs = cl.runs("window")["runs"]
    assert sorted(r["scheduled_ms"] for r in runs) == list(range(start, end + 1, 1000)), runs
    assert {r["state"] for r in runs} == {"succeeded"}, runs
    witnessed = [parse_timestamp(w["SCHEDULED_AT"], "w") for w in read_witness(ran)]
    assert sorted(witnessed) == list(range(start, end + 1, 1000))

    rc, out, _ = _run(capsys, node, "job", "ls")
    row = next(line for line in out.splitlines() if line.startswith("window"))
    assert re.search(r" done +no ", row), out
    rc, out, _ = _run(capsys, node, "job", "get", "window")
    assert "next: done" in out and f'"end": "{format_timestamp(end)}"' in out, out
    rc, out, _ = _run(capsys, node, "job", "next", "window")
    assert rc == 0 and f"(no further fire times up to its end, {format_timestamp(end)})" in out


def test_a_bounded_job_through_the_json_api(node: Cluster, tmp_path: Any) -> None:
    addr, admin = node.http["n1"], TOK["admin"]
    start, end = _whole_second(8), _whole_second(10)
    spec = {"schedule": {"every": "1s"}, "command": ["true"],
            "start": format_timestamp(start), "end": format_timestamp(end)}
    status, body, _ = request(addr, "PUT", "/api/v1/jobs/api-window?dry_run=true", admin, spec)
    assert status == 200 and body["results"][0]["change"] == "created", body
    status, body, _ = request(addr, "PUT", "/api/v1/jobs/api-window", admin, spec)
    assert status == 201, body
    status, job, _ = request(addr, "GET", "/api/v1/jobs/api-window", TOK["read"])
    assert status == 200 and job["done"] is False
    assert (job["spec"]["start"], job["spec"]["end"]) == (spec["start"], spec["end"])
    status, nxt, _ = request(addr, "GET", "/api/v1/jobs/api-window/next?count=10", TOK["read"])
    assert status == 200 and nxt["end"] == spec["end"]
    assert all(start <= f["at_ms"] <= end for f in nxt["fires"]) and nxt["fires"], nxt
    # A preview of a spec not stored honours its bounds too.
    status, prev, _ = request(addr, "POST", "/api/v1/preview", TOK["read"],
                              {"spec": dict(spec, id="p"), "count": 10})
    assert status == 200 and [f["at_ms"] for f in prev["fires"]][-1] == end, prev
    # A put whose end already passed is accepted and done at once (nothing can fire).
    past = dict(spec, start=format_timestamp(start - 3_600_000),
                end=format_timestamp(start - 3_000_000))
    status, body, _ = request(addr, "PUT", "/api/v1/jobs/api-ended", admin, past)
    assert status == 201, body

    def done(job_id: str) -> bool:
        return bool(request(addr, "GET", f"/api/v1/jobs/{job_id}", TOK["read"])[1]["done"])

    assert done("api-ended")
    wait_until(lambda: done("api-window"), 60, "the API's job done after its end")
    status, runs, _ = request(addr, "GET", "/api/v1/jobs/api-window/runs", TOK["read"])
    assert status == 200 and runs["runs"], runs
    assert all(start <= r["scheduled_ms"] <= end for r in runs["runs"]), runs
