"""One authenticated connection from a client to one node of the raftsched API.

Dialling (plain TCP, or TLS checked against a CA), the ``hello``/``auth`` handshake in
which both sides prove the cluster secret (:mod:`raftsched.wire.session`), and the
request/reply frames over it (sealed with AES-GCM when not on TLS). Which node to dial,
and what to do when it fails, is :class:`raftsched.wire.client.Client`'s: this module
knows one address at a time, ``self._addrs[self._current]``.
"""

from __future__ import annotations

import hmac
import itertools
import os
import socket
import ssl
import time
from typing import Any

from raftsched.core.errors import (
    InvalidArgument,
    ProtocolError,
    RaftschedError,
    Unauthenticated,
    WrongCluster,
    from_wire,
)
from raftsched.core.packing import unpackb
from raftsched.wire import session
from raftsched.wire.framing import FRAME_HEADER, WIRE_VERSION, encode_frame, frame_length
from raftsched.wire.secretfile import SECRET_FILE_ENV, candidate_secrets
from raftsched.wire.session import cluster_id as derive_cluster_id

#: A CA certificate file: connect with TLS and verify the node's certificate with it.
TLS_CA_ENV = "RAFTSCHED_TLS_CA"
#: Replies (a job list, a run history) may be far larger than requests.
MAX_REPLY_BYTES = 64 * 1024 * 1024
#: A hello unanswered this long makes the client ask, in HTTP, what listens there.
HELLO_WAIT_S = 2.0
#: The first bytes of an HTTP reply (our API port answers HTTP requests with one).
_HTTP_STARTS = frozenset({b"HTTP"})
_NOT_API = ("this is an HTTP endpoint (the metrics port?), not the raftsched API port; "
            "give the node's `api` address (default 127.0.0.1:7101)")

_NOT_API_RAFT = ("likely a node's Raft port (for its peers only), not its API port; give "
                 "the node's `api` address (default 127.0.0.1:7101)")


class NotTheApi(ProtocolError):
    """The address answers, but it is not a raftsched API port (an HTTP server)."""


class NodeConnection:
    """The connection state and handshake of a client; :class:`~raftsched.wire.client.Client`
    adds the ops and the failover across ``addrs``. Not thread-safe on its own: the
    client calls it under its lock.

    :param addrs: (host, port) pairs, as :func:`raftsched.wire.client.parse_addrs` gives.
    The other parameters are :class:`~raftsched.wire.client.Client`'s.
    """

    def __init__(self, addrs: list[tuple[str, int]], *, secret: str | None,
                 cluster_id: str | None, secret_env: str, tls_ca: str | None) -> None:
        self._addrs = addrs
        ca = tls_ca if tls_ca is not None else (os.environ.get(TLS_CA_ENV) or None)
        self._ssl: ssl.SSLContext | None = None
        if ca:
            try:
                self._ssl = ssl.create_default_context(cafile=ca)
            except (OSError, ssl.SSLError) as exc:
                raise InvalidArgument("tls_ca", f"{ca}: cannot load a CA certificate: "
                                                f"{getattr(exc, 'strerror', None) or exc}"
                                      ) from None
        self._ciphers: session.Ciphers | None = None
        #: The role the node granted on the last connection: "admin" or "read".
        self.role: str | None = None
        self._secret_env = secret_env
        self._secret = secret if secret is not None else (os.environ.get(secret_env) or None)
        #: The secret a node accepted (the HTTP token derives from it).
        self._proven: str | None = None
        self._cluster_id = cluster_id
        self._sock: socket.socket | None = None
        self._current = 0  # index of the address that last worked
        self._ids = itertools.count(1)
        self.node: str | None = None  # node id from the last hello
        self.cluster_id: str | None = None  # cluster id from the last hello

    def _connect(self, deadline: float) -> None:
        host, port = self._addrs[self._current]
        self._open(host, port, deadline)
        cnonce = session.new_nonce()
        try:
            try:
                hello = self._roundtrip("hello", self._hello_args(cnonce),
                                        min(deadline, time.monotonic() + HELLO_WAIT_S))
            except ConnectionError as exc:
                if isinstance(exc, RaftschedError) or self._ssl is not None:
                    raise
                # Hung up on at hello: a TLS API port, or (far likelier on a first try)
                # a node's Raft port, which drops any stranger. Ask in TLS which one.
                if _speaks_tls(host, port, deadline):
                    raise ConnectionError(f"{host}:{port} speaks TLS: give its CA "
                                          f"(--tls-ca or ${TLS_CA_ENV})") from None
                raise NotTheApi(f"{host}:{port} closed the connection at hello and does not "
                                f"speak TLS: {_NOT_API_RAFT}") from None
            except TimeoutError:
                # Silence after our hello: a slow node, or a server waiting for a line we
                # never send (the metrics port is HTTP). Ask in HTTP which one it is.
                if time.monotonic() >= deadline:
                    raise
                if not _is_raftsched_api(host, port, deadline):
                    raise NotTheApi(f"{host}:{port} is silent to the raftsched protocol but "
                                    f"answers HTTP: {_NOT_API}") from None
                self._open(host, port, deadline)
                hello = self._roundtrip("hello", self._hello_args(cnonce), deadline)
            if not isinstance(hello, dict):
                raise ProtocolError("hello reply is not a map")
            self.node = str(hello.get("node")) if hello.get("node") is not None else None
            got = hello.get("cluster_id")
            self.cluster_id = got if isinstance(got, str) else None
            ids = hello.get("cluster_ids")
            # During a secret rotation a node accepts (and names) more than one secret.
            accepted = set(ids) if isinstance(ids, list) else {self.cluster_id}
            if self._cluster_id is not None and self._cluster_id not in accepted:
                raise WrongCluster(
                    f"{host}:{port} is node {self.node!r:.70} of cluster "
                    f"{self.cluster_id!r:.40}, not of cluster {self._cluster_id!r:.40}; "
                    f"refusing to talk to it")
            if not hello.get("auth_required"):
                # Every raftsched node asks for the secret: one that does not is an
                # impostor (or a relay) that would read whatever we send it next.
                raise Unauthenticated(
                    f"{host}:{port} does not ask for the cluster secret: not a raftsched "
                    f"node (an impostor?); refusing to send it anything")
            self._auth(hello, cnonce, deadline)
        except BaseException:
            self._drop()
            raise

    @staticmethod
    def _hello_args(cnonce: bytes) -> dict[str, Any]:
        return {"cnonce": cnonce.hex(), "protocol": session.PROTOCOL}

    def _open(self, host: str, port: int, deadline: float) -> None:
        self._drop()
        sock = socket.create_connection((host, port), timeout=_remaining(deadline))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self._ssl is not None:
            try:
                sock.settimeout(_remaining(deadline))
                sock = self._ssl.wrap_socket(sock, server_hostname=host)
            except ssl.SSLCertVerificationError as exc:
                sock.close()
                raise Unauthenticated(f"{host}:{port}: the node's TLS certificate is not "
                                      f"trusted: {exc.verify_message}") from None
            except BaseException:
                sock.close()
                raise
        self._sock = sock

    def _auth(self, hello: dict[str, Any], cnonce: bytes, deadline: float) -> None:
        secret = self._secret
        ids = hello.get("cluster_ids")
        known = set(ids) if isinstance(ids, list) else {self.cluster_id}
        # A read-only token is what its holder chose: never traded for an admin file.
        if secret is None or (self.cluster_id is not None
                              and not secret.startswith(session.RO_PREFIX)
                              and derive_cluster_id(secret) not in known):
            # None, or certainly not this node's (an exported secret of another cluster):
            # this user's file for this very node, if there is one, is.
            secret = self._local_secret() or secret
        if not secret:
            raise Unauthenticated(
                f"the node requires authentication: set the cluster secret in the "
                f"{self._secret_env} environment variable (or the one --secret-env names), "
                f"or {SECRET_FILE_ENV} to a file holding it")
        if hello.get("protocol") != session.PROTOCOL:
            raise ProtocolError(f"the node speaks protocol {hello.get('protocol')!r:.10}, "
                                f"this client {session.PROTOCOL}: upgrade the older side")
        snonce = session.parse_nonce(hello.get("nonce"), "the hello's nonce")
        key = secret.encode("utf-8")
        proof = session.client_proof(key, snonce, cnonce).hex()
        reply = self._roundtrip("auth", {"proof": proof}, deadline)
        host, port = self._addrs[self._current]
        theirs = reply.get("proof") if isinstance(reply, dict) else None
        if not isinstance(theirs, str) or not hmac.compare_digest(
                theirs.encode(), session.server_proof(key, snonce, cnonce).hex().encode()):
            raise Unauthenticated(f"{host}:{port} accepted our proof but could not prove it "
                                  f"knows the cluster secret (an impostor relaying to a "
                                  f"node?); refusing to send it anything")
        self.role = reply.get("role") if isinstance(reply.get("role"), str) else None
        if self._ssl is None:
            if not reply.get("sealed"):
                raise Unauthenticated(f"{host}:{port} would not seal the connection; "
                                      f"refusing to send anything in the clear")
            self._ciphers = session.ciphers(key, snonce, cnonce, server=False)
        self._proven = secret

    def _local_secret(self) -> str | None:
        """A secret file on this host for the node just greeted: only one whose cluster id
        is the node's (a stale pointer or another cluster's file is never tried)."""
        host, port = self._addrs[self._current]
        for secret in candidate_secrets(f"{host}:{port}"):
            if self.cluster_id is None or derive_cluster_id(secret) == self.cluster_id:
                return secret
        return None

    def _roundtrip(self, op: str, args: dict[str, Any], deadline: float) -> Any:
        sock = self._sock
        assert sock is not None
        req_id = next(self._ids)
        frame = _encode_request(req_id, op, args)
        if self._ciphers is not None:
            sealed = self._ciphers.send.seal(frame[FRAME_HEADER.size:])
            frame = FRAME_HEADER.pack(len(sealed)) + sealed
        try:
            sock.settimeout(_remaining(deadline))
            sock.sendall(frame)
            reply = self._read_reply(sock, deadline)
        except BaseException:
            # A half-read or timed-out reply leaves the stream unsynchronized: never reuse it.
            self._drop()
            raise
        got = reply.get("id")
        ok = reply["ok"]
        if got != req_id and not (got is None and not ok):
            self._drop()
            raise ProtocolError(f"reply id {got!r:.40} does not match request {req_id}")
        if ok:
            return reply.get("result")
        if got is None:
            # A connection-level error (limit, bad frame): the node closes this connection.
            self._drop()
        raise from_wire(reply.get("error"))

    def _read_reply(self, sock: socket.socket, deadline: float) -> dict[str, Any]:
        header = _recv_exactly(sock, FRAME_HEADER.size, deadline)
        if header in _HTTP_STARTS:
            raise NotTheApi(f"{_peer(sock)} answered in HTTP: {_NOT_API}")
        try:
            size = frame_length(header, MAX_REPLY_BYTES)
        except RaftschedError as exc:
            raise ProtocolError(f"reply frame refused: {exc.message}") from None
        body = _recv_exactly(sock, size, deadline)
        if self._ciphers is not None:
            body = self._ciphers.recv.open(body)
        reply = unpackb(body)
        if not isinstance(reply, dict) or not isinstance(reply.get("ok"), bool):
            raise ProtocolError("reply is not a {v, id, ok, ...} map")
        if reply.get("v") != WIRE_VERSION:
            raise ProtocolError(f"reply version {reply.get('v')!r:.20} is not {WIRE_VERSION}")
        return reply

    def _drop(self) -> None:
        self._ciphers = None
        sock, self._sock = self._sock, None
        if sock is not None:
            try:
                sock.close()
            except OSError:
                pass


def _encode_request(req_id: int, op: str, args: dict[str, Any]) -> bytes:
    """The request frame; args msgpack cannot carry (a TOML datetime, a lone surrogate
    from a JSON escape, a huge int) are the caller's InvalidArgument, not a crash."""
    try:
        return encode_frame({"id": req_id, "op": op, "args": args})
    except UnicodeEncodeError:
        # Not the exception's text: it would quote the offending (maybe secret) string.
        raise InvalidArgument("args", "hold text that is not valid UTF-8 "
                                      "(a lone surrogate)") from None
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidArgument("args", f"cannot be sent: {exc}") from None


def _remaining(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("timed out")
    return left


def _recv_exactly(sock: socket.socket, n: int, deadline: float) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        sock.settimeout(_remaining(deadline))
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise ConnectionError("connection closed by the node")
        buf += chunk
    return bytes(buf)


def _http_reply(host: str, port: int, deadline: float) -> bytes | None:
    """The start of what ``host:port`` answers to an HTTP request, or None when it does
    not answer in HTTP within a second (or by the deadline)."""
    wait = min(1.0, deadline - time.monotonic() + 1.0)
    try:
        with socket.create_connection((host, port), timeout=wait) as probe:
            probe.settimeout(wait)
            probe.sendall(b"GET / HTTP/1.0\r\nHost: raftsched-client\r\n\r\n")
            data = probe.recv(512)
    except OSError:
        return None
    return data if data.startswith(b"HTTP/") else None


def _speaks_tls(host: str, port: int, deadline: float) -> bool:
    """Does ``host:port`` answer a TLS handshake (within a second, or by the deadline)?
    Nothing is sent over it: it only tells a TLS port from a port that hangs up."""
    wait = max(min(1.0, deadline - time.monotonic()), 0.2)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    try:
        with socket.create_connection((host, port), timeout=wait) as raw:
            raw.settimeout(wait)
            with ctx.wrap_socket(raw, server_hostname=host):
                return True
    except ssl.SSLError as exc:
        # The server answered in TLS but would not finish (an alert: a client
        # certificate it wants, a version it refuses): still a TLS port.
        return not isinstance(exc, ssl.SSLEOFError | ssl.SSLZeroReturnError) and \
            "WRONG_VERSION_NUMBER" not in str(exc)
    except OSError:
        return False


def _is_raftsched_api(host: str, port: int, deadline: float) -> bool:
    """Does ``host:port`` say, in HTTP, that it is a raftsched API port (then it is only
    slow)? False for any other HTTP server; True when it says nothing (keep waiting)."""
    reply = _http_reply(host, port, deadline)
    return reply is None or b"raftsched API port" in reply


def _peer(sock: socket.socket) -> str:
    try:
        host, port = sock.getpeername()[:2]
    except OSError:
        return "the node"
    return f"{host}:{port}"


