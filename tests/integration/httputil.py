"""Small HTTP helpers for the HTTP API and dashboard tests (stdlib only)."""

from __future__ import annotations

import contextlib
import http.client
import json
import tempfile
import time
from collections.abc import Iterator
from typing import Any

from raftsched.wire.credentials import Role, token
from tests.integration.harness import Cluster, wait_until


def tokens(secret: str) -> dict[str, str]:
    return {"admin": token(secret, Role.admin), "read": token(secret, Role.read)}


@contextlib.contextmanager
def http_cluster(prefix: str, secret: str) -> Iterator[Cluster]:
    """A running 3-node cluster whose nodes serve HTTP, with a leader; closed after."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        c = Cluster(tmp, 3, secret=secret, http=True)
        try:
            c.start_all()
            c.wait_leader()
            yield c
        finally:
            c.close()


def request(addr: str, method: str, path: str, tok: str | None = None, body: Any = None,
            headers: dict[str, str] | None = None, timeout: float = 15.0
            ) -> tuple[int, Any, dict[str, str]]:
    """(status, parsed JSON body or text, headers) of one request."""
    host, port = addr.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        hdrs = dict(headers or {})
        if tok is not None:
            hdrs["Authorization"] = f"Bearer {tok}"
        data = None
        if body is not None:
            data = body if isinstance(body, (bytes, str)) else json.dumps(body)
            hdrs["Content-Type"] = "application/json"
        conn.request(method, path, body=data, headers=hdrs)
        resp = conn.getresponse()
        raw = resp.read().decode("utf-8", "replace")
        ctype = resp.getheader("Content-Type") or ""
        parsed = json.loads(raw) if "json" in ctype and raw else raw
        return resp.status, parsed, {k.lower(): v for k, v in resp.getheaders()}
    finally:
        conn.close()


def wait_serving(addr: str, timeout: float = 30.0) -> None:
    """Return once the HTTP server at ``addr`` answers (a restarted node takes a while)."""

    def serving() -> bool:
        try:
            return request(addr, "GET", "/openapi.json", timeout=5)[0] == 200
        except OSError:
            return False

    wait_until(serving, timeout, f"the HTTP server at {addr}")


class EventStream:
    """A Server-Sent-Events reader: ``next_matching`` with a deadline."""

    def __init__(self, addr: str, tok: str, timeout: float = 30.0) -> None:
        host, port = addr.rsplit(":", 1)
        self.conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
        self.conn.request("GET", "/api/v1/events", headers={"Authorization": f"Bearer {tok}",
                                                            "Accept": "text/event-stream"})
        self.resp = self.conn.getresponse()
        self.status = self.resp.status
        self.seen: list[dict[str, Any]] = []

    def next_event(self, deadline: float | None = None) -> dict[str, Any] | None:
        """The next ``data:`` event; None at the end of the stream, or once ``deadline``
        (monotonic) has passed (the stream's keep-alive comments never end a read)."""
        data: list[str] = []
        while True:
            line = self.resp.readline()
            if not line or (deadline is not None and time.monotonic() > deadline):
                return None
            text = line.decode("utf-8").rstrip("\r\n")
            if text.startswith("data: "):
                data.append(text[6:])
            elif text == "" and data:
                ev = json.loads("\n".join(data))
                self.seen.append(ev)
                return ev

    def wait_for(self, pred: Any, timeout: float, what: str) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ev = self.next_event(deadline)  # blocks at most the connection timeout
            if ev is None:
                break
            if pred(ev):
                return ev
        raise AssertionError(f"no event {what} within {timeout:.0f}s; saw "
                             f"{[e.get('event') for e in self.seen][-20:]}")

    def close(self) -> None:
        self.conn.close()
