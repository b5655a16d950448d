"""Small HTTP helpers for the HTTP API and dashboard tests (stdlib only).

Each takes ``ca``: a CA certificate file to speak HTTPS with (a node of a cluster with
TLS serves nothing else), verifying the node's certificate chain and host name with it;
None speaks plain HTTP."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import ssl
import tempfile
import time
from collections.abc import Iterator
from typing import Any

from raftsched.wire.credentials import Role, token
from tests.support.harness import Cluster, wait_until


def tokens(secret: str) -> dict[str, str]:
    return {"admin": token(secret, Role.admin), "read": token(secret, Role.read)}


def tls_keys(certs_dir: str) -> dict[str, str]:
    """The ``[cluster]`` TLS keys of nodes whose certificates ``raftsched certs`` wrote
    into ``certs_dir`` (``ca.crt``, ``<id>.crt``, ``<id>.key``)."""
    return {"tls_cert": os.path.join(certs_dir, "{id}.crt"),
            "tls_key": os.path.join(certs_dir, "{id}.key"),
            "tls_ca": os.path.join(certs_dir, "ca.crt")}


@contextlib.contextmanager
def http_cluster(prefix: str, secret: str, *, n: int = 3,
                 certs_dir: str | None = None) -> Iterator[Cluster]:
    """A running ``n``-node cluster whose nodes serve HTTP, with a leader; closed after.
    With ``certs_dir`` (see :func:`tls_keys`) the cluster has TLS, so it serves HTTPS."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        c = Cluster(tmp, n, secret=secret, http=True,
                    cluster_extra=tls_keys(certs_dir) if certs_dir else None,
                    tls_ca=os.path.join(certs_dir, "ca.crt") if certs_dir else None)
        try:
            c.start_all()
            c.wait_leader()
            yield c
        finally:
            c.close()


def connection(addr: str, timeout: float, ca: str | None = None) -> http.client.HTTPConnection:
    """A connection to ``addr``: HTTPS verified with ``ca`` when given, else plain HTTP."""
    host, port = addr.rsplit(":", 1)
    if ca is None:
        return http.client.HTTPConnection(host, int(port), timeout=timeout)
    return http.client.HTTPSConnection(host, int(port), timeout=timeout,
                                       context=ssl.create_default_context(cafile=ca))


def request(addr: str, method: str, path: str, tok: str | None = None, body: Any = None,
            headers: dict[str, str] | None = None, timeout: float = 15.0,
            ca: str | None = None) -> tuple[int, Any, dict[str, str]]:
    """(status, parsed JSON body or text, headers) of one request."""
    conn = connection(addr, timeout, ca)
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


def wait_serving(addr: str, timeout: float = 30.0, ca: str | None = None) -> None:
    """Return once the HTTP server at ``addr`` answers (a restarted node takes a while)."""

    def serving() -> bool:
        try:
            return request(addr, "GET", "/openapi.json", timeout=5, ca=ca)[0] == 200
        except OSError:
            return False

    wait_until(serving, timeout, f"the HTTP server at {addr}")


class EventStream:
    """A Server-Sent-Events reader: ``next_matching`` with a deadline."""

    def __init__(self, addr: str, tok: str, timeout: float = 30.0,
                 ca: str | None = None) -> None:
        self.conn = connection(addr, timeout, ca)
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
