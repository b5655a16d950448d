"""Issue 32 item 5: the ``http`` executor of a job spec — validation naming the field,
the round trip, the bytes of every other spec unchanged, the snapshot beside the spec
rows, and the gate that holds HTTP jobs back while a member runs an older release."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from raftsched.core.cmdbase import FEATURES
from raftsched.core.codec import decode_state, encode_state, packb
from raftsched.core.commands import Heartbeat, PutJob
from raftsched.core.errors import Conflict, InvalidSpec
from raftsched.core.httpspec import HttpSpec, expand
from raftsched.core.machine import ClusterState
from raftsched.core.model import JobSpec
from raftsched.core.specrows import spec_to_row
from raftsched.faces.cli_apply import exported
from raftsched.node.service.applyops import Features

T0 = 1_764_576_000_000
URL = "https://hooks.example.com/run"


def spec(**http: Any) -> dict[str, Any]:
    return {"id": "hook", "schedule": {"every": "1m"}, "http": dict({"url": URL}, **http),
            "env": {"TOKEN": "s3cr3t-token-value"}}


def refused(raw: dict[str, Any]) -> InvalidSpec:
    with pytest.raises(InvalidSpec) as info:
        JobSpec.from_spec(raw, allowed_call_prefixes=())
    return info.value


@pytest.mark.parametrize(("http", "field", "words"), [
    ({"url": "ftp://h/x"}, "http.url", "http:// or https://"),
    ({"url": "https:///path"}, "http.url", "with a host"),
    ({"url": "https://h:70000/"}, "http.url", "port 70000"),
    ({"url": 5}, "http.url", "http(s) URL"),
    ({"method": "TRACE"}, "http.method", "GET | HEAD | POST"),
    ({"method": "GET", "body": "x"}, "http.body", "carries no body"),
    ({"headers": {"Raftsched-Fence": "9"}}, "http.headers.Raftsched-Fence", "set by the node"),
    ({"headers": {"raftsched-run-id": "x"}}, "http.headers.raftsched-run-id", "set by the node"),
    ({"headers": {"Content-Length": "3"}}, "http.headers.Content-Length", "computed"),
    ({"headers": {"X-A": 5}}, "http.headers.X-A", "one-line string"),
    ({"headers": {"X-A": "a\r\nX-Evil: 1"}}, "http.headers.X-A", "one-line string"),
    ({"headers": {"bad name": "x"}}, "http.headers", "not a header name"),
    ({"headers": {"X-A": "a", "x-a": "b"}}, "http.headers.x-a", "given twice"),
    ({"headers": ["X-A"]}, "http.headers", "must be a map"),
    ({"headers": {"Authorization": "Bearer ${NOPE}"}}, "http.headers.Authorization",
     "${NOPE}, which is not in env"),
    ({"method": "POST", "body": "${MISSING}"}, "http.body", "not in env"),
    ({"method": "POST", "body": "x" * 40_000}, "http.body", "at most 32768"),
    ({"expect": [200, 600]}, "http.expect[1]", "100..599"),
    ({"expect": [True]}, "http.expect[0]", "100..599"),
    ({"expect": []}, "http.expect", "1..100"),
    ({"expect": 200}, "http.expect", "1..100"),
    ({"timeout": "500ms"}, "http.timeout", "at least 1s"),
    ({"timeout": "1x"}, "http.timeout", "unit"),
    ({"ca": ""}, "http.ca", "path of a CA bundle"),
    ({"insecure": True}, "http.insecure", "unknown field"),
    ({"urll": URL}, "http.urll", "did you mean 'url'"),
])
def test_every_field_is_validated_and_named(http: dict[str, Any], field: str, words: str) -> None:
    exc = refused(spec(**http))
    assert exc.field == field and words in str(exc), str(exc)
    # A header value is never quoted back: it may be a credential.
    assert "X-Evil" not in str(exc) and "s3cr3t" not in str(exc)


def test_exactly_one_executor_and_a_url_required() -> None:
    for extra in ({"command": ["true"]}, {"call": "m.jobs:f"}):
        with pytest.raises(InvalidSpec) as info:
            JobSpec.from_spec(dict(spec(), **extra), allowed_call_prefixes=("m",))
        exc = info.value
        assert exc.field == "command" and "command (argv), call or http" in str(exc)
    assert refused({"id": "x", "schedule": {"every": "1s"}}).field == "command"
    assert refused({"id": "x", "schedule": {"every": "1s"}, "http": {}}).field == "http.url"
    assert refused({"id": "x", "schedule": {"every": "1s"}, "http": "https://h"}).field == "http"


def test_defaults_round_trip_and_secrets_by_reference() -> None:
    job = JobSpec.from_spec(spec(), allowed_call_prefixes=())
    assert job.http == HttpSpec(url=URL, method="GET")
    assert job.http.succeeded(204) and not job.http.succeeded(301)
    posted = JobSpec.from_spec(spec(body='{"k": "${TOKEN}", "lit": "$${TOKEN}"}',
                                    headers={"Authorization": "Bearer ${TOKEN}"},
                                    expect=[204, 200, 204], timeout="30s", ca="/etc/ca.pem",
                                    method="post"), allowed_call_prefixes=())
    h = posted.http
    assert h is not None and h.method == "POST" and h.expect == (200, 204)
    assert h.timeout_ms == 30_000 and not h.succeeded(201) and h.succeeded(204)
    out = posted.to_spec()
    assert list(out)[:3] == ["id", "schedule", "http"] and "command" not in out
    assert out["http"] == {"url": URL, "method": "POST",
                           "headers": {"Authorization": "Bearer ${TOKEN}"},
                           "body": '{"k": "${TOKEN}", "lit": "$${TOKEN}"}', "timeout": "30s",
                           "expect": [200, 204], "ca": "/etc/ca.pem"}
    assert JobSpec.from_spec(out, allowed_call_prefixes=()) == posted
    assert JobSpec.from_spec(out, allowed_call_prefixes=None) == posted
    # The node fills references in when it sends; $${ is a literal ${.
    env = dict(posted.env)
    assert expand(h.body or "", env) == '{"k": "s3cr3t-token-value", "lit": "${TOKEN}"}'
    # job get shows header values and the body as written; env values masked.
    shown = posted.redacted()
    assert shown["env"] == {"TOKEN": "***"} and "s3cr3t" not in repr(shown)
    assert hash(posted) == hash(JobSpec.from_spec(out, allowed_call_prefixes=()))


def test_a_spec_without_http_keeps_its_bytes_and_its_row() -> None:
    raw = {"id": "c", "schedule": {"every": "1s"}, "command": ["true"], "env": {"A": "b"}}
    job = JobSpec.from_spec(raw, allowed_call_prefixes=())
    assert "http" not in job.to_spec() and job.http is None
    assert packb(job.to_spec()) == packb({
        "id": "c", "schedule": {"every": "1s"}, "command": ["true"], "timeout": "1h",
        "overlap": "skip", "misfire": {"policy": "once", "grace": "1m", "max_catchup": 10},
        "retries": {"max": 0, "backoff": "10s", "backoff_max": "1h"},
        "on_node_lost": "retry", "tags": [], "jitter": "0s", "paused": False,
        "env": {"A": "b"}})
    assert len(spec_to_row(job)) == 13


def test_the_snapshot_keeps_http_beside_the_rows_and_old_snapshots_read() -> None:
    st = ClusterState()
    plain = {"id": "c", "schedule": {"every": "1s"}, "command": ["true"]}
    assert st.apply(PutJob(spec=plain, at=T0))["ok"]
    before = encode_state(st)
    assert b"http" not in before  # no HTTP job: the snapshot is what it always was
    hook = JobSpec.from_spec(spec(headers={"X-Key": "${TOKEN}"}), allowed_call_prefixes=())
    assert st.apply(PutJob(spec=hook.to_spec(), at=T0 + 1))["ok"]
    back = decode_state(encode_state(st))
    assert back.jobs["hook"].spec == hook and back.jobs["c"].spec.http is None
    # The row itself has the shape every release reads: neither command nor call.
    row = spec_to_row(hook)
    assert len(row) == 13 and row[2] is None and row[3] is None
    assert encode_state(back) == encode_state(st)


def test_an_http_spec_waits_until_every_member_announces_http() -> None:
    st = ClusterState()
    older = tuple(f for f in FEATURES if f != "http")
    for nid, features in (("n1", FEATURES), ("n2", older)):
        assert st.apply(Heartbeat(at=T0, node=nid, boot=1, slots=1, queue=0,
                                  features=features))["ok"]
    gate = Features(raft=SimpleNamespace(read=lambda fn: fn(st)),  # type: ignore[arg-type]
                    config_ids=("n1", "n2"))
    for op, args in (("put_job", {"spec": spec()}), ("put_jobs", {"specs": [spec()]}),
                     ("apply", {"specs": [spec()]})):
        with pytest.raises(Conflict, match=r"^http: node\(s\) n2 run an older raftsched"):
            gate.check(op, args)
    gate.check("put_job", {"spec": {"id": "c", "schedule": {"every": "1s"},
                                    "command": ["true"]}})
    assert st.apply(Heartbeat(at=T0 + 1, node="n2", boot=2, slots=1, queue=0,
                              features=FEATURES))["ok"]
    gate.check("put_job", {"spec": spec()})


def test_export_keeps_the_http_table() -> None:
    job = JobSpec.from_spec(spec(headers={"X-Key": "${TOKEN}"}), allowed_call_prefixes=())
    out = exported(job.redacted())
    assert out == {"id": "hook", "schedule": {"every": "1m"},
                   "http": {"url": URL, "method": "GET", "headers": {"X-Key": "${TOKEN}"}},
                   "env": {"TOKEN": {"keep": True}}}
