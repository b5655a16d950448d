"""The HTTP API's pieces without a cluster: token derivation, the ``http`` config key,
schedule previews (words, zones, DST days), put diffs, feed events, and the event
stream dropping a client that does not read."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import socket
from datetime import UTC, datetime

import pytest

from raftsched.core.effects import HeartbeatSeen, LeaderChanged, RunEnded
from raftsched.core.errors import ConfigError
from raftsched.core.trigger import schedule_from_spec
from raftsched.faces.cli_preview import format_next
from raftsched.node.config.config import parse_config
from raftsched.node.observe.events import feed_event
from raftsched.node.service.preview import describe, diff_specs, next_fires
from raftsched.wire import http as http_mod
from raftsched.wire.credentials import Role, role_of, token

pytestmark = pytest.mark.timeout(30)
SECRET = "unit-secret-0123456789"


def _ms(text: str) -> int:
    return int(datetime.fromisoformat(text).astimezone(UTC).timestamp() * 1000)


def test_tokens_are_the_documented_hmacs_and_map_back_to_their_role() -> None:
    admin = hmac.new(SECRET.encode(), b"raftsched-http-v1:admin", hashlib.sha256).hexdigest()
    read = hmac.new(SECRET.encode(), b"raftsched-http-v1:read", hashlib.sha256).hexdigest()
    assert token(SECRET, Role.admin) == admin and token(SECRET, Role.read) == read
    assert role_of(SECRET, admin) is Role.admin and role_of(SECRET, read) is Role.read
    assert role_of(SECRET, admin[:-1] + "0") is None and role_of(SECRET, "") is None
    assert role_of("another-secret-xxxxxxxx", admin) is None


def _cfg(**node: object) -> dict[str, object]:
    return {"cluster": {"data_dir": "/tmp/x"},
            "nodes": [dict({"id": "n1", "raft": "127.0.0.1:7001", "api": "127.0.0.1:7101"},
                           **node)]}


def test_http_address_is_optional_validated_and_unique() -> None:
    assert parse_config(_cfg()).nodes[0].http is None
    assert parse_config(_cfg(http="127.0.0.1:8080")).nodes[0].http == "127.0.0.1:8080"
    with pytest.raises(ConfigError) as exc:
        parse_config(_cfg(http="localhost"))
    assert exc.value.key == "nodes[0].http"
    with pytest.raises(ConfigError) as exc:
        parse_config(_cfg(http="127.0.0.1:7101"))
    assert exc.value.key == "nodes[0].http" and "collides" in str(exc.value)


def test_preview_marks_dst_days_in_the_zone_and_says_it_in_words() -> None:
    sched = schedule_from_spec({"cron": "30 2 * * *", "tz": "Europe/Berlin"})
    out = next_fires(sched, _ms("2026-03-27T12:00:00+00:00"), 4)
    assert out["description"] == "At 02:30 (Europe/Berlin)"
    locals_ = [f["local"] for f in out["fires"]]
    # 2026-03-29 has no 02:30 in Berlin (clocks jump 02:00 -> 03:00): cron runs it at 03:00.
    assert locals_[0] == "2026-03-28T02:30:00+01:00"
    assert [f.get("dst_change") for f in out["fires"]] == [None, "+1h", None, None]
    assert out["fires"][2]["utc"] == "2026-03-30T00:30:00Z"
    text = format_next(dict(out, id="nightly", paused=False))
    assert "DST day (+1h)" in text and "Europe/Berlin" in text.splitlines()[1]


@pytest.mark.parametrize("spec", [{"cron": "0 3 * * *", "tz": "UTC"}, {"every": "1h"},
                                  {"at": "2030-01-01T03:00:00Z"}])
def test_a_utc_schedule_s_fire_times_have_one_time_column(spec: dict[str, str]) -> None:
    """Issue 29 papercut: its zone's column and the UTC column were two identical UTC."""
    out = next_fires(schedule_from_spec(spec), _ms("2029-12-31T12:00:00+00:00"), 2)
    header, first = format_next(dict(out, id="u", paused=False)).splitlines()[1:3]
    assert header.split() == ["#", "UTC"]
    assert first.split()[1] == out["fires"][0]["utc"]
    assert first.split()[2] in ("Mon", "Tue")


def test_every_and_at_in_words() -> None:
    assert describe(schedule_from_spec({"every": "90m"})) == "every 1 hour 30 minutes"
    assert describe(schedule_from_spec({"every": "1s"})) == "every second"
    assert describe(schedule_from_spec({"every": "1h", "offset": "15m"})) == \
        "every 1 hour, offset 15 minutes from the epoch"
    at = schedule_from_spec({"at": "2030-01-01T00:00:00Z"})
    assert describe(at) == "once, at 2030-01-01T00:00:00Z"
    assert len(next_fires(at, 0, 5)["fires"]) == 1


def test_put_diff_names_fields_and_hides_env_values() -> None:
    old = {"id": "a", "command": ["x"], "env": {"K": "secret-value"}}
    assert diff_specs(None, old)["change"] == "created"
    assert diff_specs(old, dict(old))["change"] == "unchanged"
    d = diff_specs(old, {"id": "a", "command": ["y"], "env": {"K": "other"}})
    assert d["change"] == "updated" and d["fields"] == ["command", "env"]
    assert "secret-value" not in json.dumps(d) and "other" not in json.dumps(d)


def test_feed_events_carry_the_run_job_and_outcome() -> None:
    ev = feed_event(RunEnded("j@5", "failed", "n2", "exit 3"), node="n1", seq=7, ts_ms=9)
    assert ev == {"seq": 7, "ts_ms": 9, "event": "run.ended", "node": "n1", "run_id": "j@5",
                  "outcome": "failed", "on": "n2", "reason": "exit 3", "job_id": "j"}
    assert feed_event(HeartbeatSeen("n1", 5), node="n1", seq=1, ts_ms=1) is None
    assert feed_event(LeaderChanged("n3", 4), node="n1", seq=2, ts_ms=1)["leader"] == "n3"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_client_that_does_not_read_is_dropped_not_buffered(monkeypatch) -> None:
    monkeypatch.setattr(http_mod, "SSE_QUEUE", 8)
    subscribers: list = []

    def subscribe(cb):
        subscribers.append(cb)
        return lambda: subscribers.remove(cb)

    async def handler(op, args):
        return {}

    async def main() -> tuple[list[str], int, int]:
        port = _free_port()
        srv = http_mod.HttpServer(handler=handler, subscribe=subscribe, host="127.0.0.1",
                                  port=port, secret=SECRET, node_id="n1")
        await srv.start()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(f"GET /api/v1/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                         f"{token(SECRET, Role.read)}\r\n\r\n".encode())
            await writer.drain()
            deadline = asyncio.get_running_loop().time() + 10
            while not subscribers:
                assert asyncio.get_running_loop().time() < deadline, "never subscribed"
                await asyncio.sleep(0.01)
            for i in range(100):  # all at once: the stream cannot drain in between
                subscribers[0]({"seq": i, "event": "run.ended"})
            data = await asyncio.wait_for(reader.read(), 10)  # the server ends the stream
            writer.close()
            lines = [ln for ln in data.decode().splitlines() if ln.startswith("data: ")]
            return lines, len(subscribers), srv.dropped_clients
        finally:
            await srv.close()

    lines, left, dropped = asyncio.run(main())
    events = [json.loads(ln[6:])["event"] for ln in lines]
    assert events[0] == "stream.open" and events[-1] == "stream.dropped"
    assert events.count("run.ended") == 8  # the queue's worth, then dropped
    assert left == 0 and dropped == 1


def test_job_next_of_a_file_needs_no_cluster(tmp_path, capsys) -> None:
    """``raftsched job next FILE`` computes locally: a multi-job JSON file gives one
    preview per job, in order; a bad schedule names its field; --count is bounded."""
    from raftsched.faces.cli import main

    path = tmp_path / "jobs.json"
    path.write_text(json.dumps([
        {"id": "a", "schedule": {"cron": "0 3 * * *", "tz": "Europe/Berlin"},
         "command": ["true"]},
        {"id": "b", "schedule": {"every": "15m"}, "command": ["true"], "paused": True}]))
    assert main(["job", "next", str(path), "--count", "2", "--json",
                 "--addr", "127.0.0.1:1"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["id"] for r in out] == ["a", "b"] and out[1]["paused"] is True
    assert all(len(r["fires"]) == 2 for r in out)
    assert out[1]["fires"][1]["at_ms"] - out[1]["fires"][0]["at_ms"] == 900_000
    assert main(["job", "next", str(path), "--addr", "127.0.0.1:1"]) == 0
    text = capsys.readouterr().out
    assert "a: At 03:00 (Europe/Berlin)" in text and "[paused: nothing fires" in text
    path.write_text(json.dumps({"id": "c", "schedule": {"cron": "61 * * * *"},
                                "command": ["true"]}))
    assert main(["job", "next", str(path), "--addr", "127.0.0.1:1"]) == 1
    assert "minute" in capsys.readouterr().err
    assert main(["job", "next", str(path), "--count", "1000", "--addr", "127.0.0.1:1"]) == 1
