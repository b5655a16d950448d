"""A small synchronous client of the raftsched API, with failover across nodes.

One connection is kept open and reused; on connect the client says ``hello`` and the
two sides prove the cluster secret to each other (:mod:`raftsched.wire.session`): a
node that does not ask for it, or cannot prove it, is refused as an impostor before
anything else is sent. Without TLS every later frame is sealed (AES-GCM); with a CA
(``tls_ca``, ``$RAFTSCHED_TLS_CA``) the connection is TLS, and the node's certificate
must be signed by that CA for the address dialled. The secret is the one given, else ``$RAFTSCHED_SECRET`` (or the variable
``secret_env`` names), else a secret file found as :mod:`raftsched.wire.secretfile`
describes (a node's generated secret, for a client of the same user on its host). With
``cluster_id`` the client refuses a node of any other cluster. When a node is
unreachable, or answers ``not_ready``/``unavailable``, the same request goes to the
next address. Write ops carry a client-made ``rid`` that stays the same across those
retries, so the cluster applies each call once.
"""

from __future__ import annotations

import hmac
import itertools
import logging
import os
import socket
import ssl
import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any

from raftsched.core.codec import FRAME_HEADER, WIRE_VERSION, encode_frame, frame_length, unpackb
from raftsched.core.errors import (
    InvalidArgument,
    NotReady,
    ProtocolError,
    RaftschedError,
    Unauthenticated,
    Unavailable,
    WrongCluster,
    from_wire,
)
from raftsched.wire import session
from raftsched.wire.credentials import Role, token
from raftsched.wire.secretfile import SECRET_FILE_ENV, candidate_secrets
from raftsched.wire.session import cluster_id as derive_cluster_id

log = logging.getLogger(__name__)

DEFAULT_ADDR = "127.0.0.1:7101"
DEFAULT_SECRET_ENV = "RAFTSCHED_SECRET"
#: A CA certificate file: connect with TLS and verify the node's certificate with it.
TLS_CA_ENV = "RAFTSCHED_TLS_CA"
#: Replies (a job list, a run history) may be far larger than requests.
MAX_REPLY_BYTES = 64 * 1024 * 1024
#: Ops that change state; they carry a ``rid`` so a retry after failover is not re-applied.
WRITE_OPS = frozenset({"put_job", "put_jobs", "apply", "delete_job", "pause", "resume", "trigger",
                       "drain", "transfer_leader", "add_node", "remove_node"})
#: Error codes meaning "this node cannot serve it now, another may".
FAILOVER_CODES = frozenset({"not_ready", "unavailable"})
#: A hello unanswered this long makes the client ask, in HTTP, what listens there.
HELLO_WAIT_S = 2.0
#: The first bytes of an HTTP reply (our API port answers HTTP requests with one).
_HTTP_STARTS = frozenset({b"HTTP"})
_NOT_API = ("this is an HTTP endpoint (the metrics port?), not the raftsched API port; "
            "give the node's `api` address (default 127.0.0.1:7101)")
#: Each address is tried at most this many times per call.
MAX_ROUNDS = 2
# Between rounds: long enough for an election to settle, short against the timeout.
_ROUND_PAUSE_S = 0.5


class _Failover(Exception):
    """This address failed in a way another address may not; carries the reason."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def parse_addrs(addrs: str | Sequence[str]) -> list[tuple[str, int]]:
    """``"h1:p1,h2:p2"`` or ``["h1:p1", ...]`` as (host, port) pairs; IPv6 as ``[::1]:p``."""
    items = addrs.split(",") if isinstance(addrs, str) else list(addrs)
    out: list[tuple[str, int]] = []
    for item in items:
        if not isinstance(item, str):
            raise InvalidArgument("addr", f"must be a HOST:PORT string, not {type(item).__name__}")
        text = item.strip()
        if not text:
            continue
        host, sep, port = text.rpartition(":")
        host = host.strip("[]")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise InvalidArgument("addr", f"{text!r} is not HOST:PORT")
        out.append((host, int(port)))
    if not out:
        raise InvalidArgument("addr", "no address given")
    return out


class Client:
    """A blocking, thread-safe client; see the module docstring.

    :param addrs: ``"host:port"``, a comma-separated list of them, or a sequence.
    :param secret: the cluster secret; None: ``$secret_env``, else a local secret file.
    :param timeout: seconds one call may take in total, failover included.
    :param cluster_id: refuse (``WrongCluster``) a node whose hello names another cluster.
    :param secret_env: the environment variable to read when ``secret`` is None.
    :param tls_ca: a CA certificate (PEM file): speak TLS and accept only a node whose
        certificate it signed for the address dialled; None: ``$RAFTSCHED_TLS_CA``, else
        no TLS (frames are then sealed with a key only the secret's holders derive).
    """

    def __init__(self, addrs: str | Sequence[str] = DEFAULT_ADDR, *,
                 secret: str | None = None, timeout: float = 10.0,
                 cluster_id: str | None = None, secret_env: str = DEFAULT_SECRET_ENV,
                 tls_ca: str | None = None) -> None:
        if not timeout > 0:
            raise InvalidArgument("timeout", "must be positive")
        self._addrs = parse_addrs(addrs)
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
        self._timeout = float(timeout)
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._current = 0  # index of the address that last worked
        self._ids = itertools.count(1)
        self.node: str | None = None  # node id from the last hello
        self.cluster_id: str | None = None  # cluster id from the last hello

    # ------------------------------------------------------------------ ops

    def put_job(self, spec: dict[str, Any]) -> Any:
        return self.call("put_job", spec=spec)

    def put_jobs(self, specs: list[dict[str, Any]], *, atomic: bool = False) -> Any:
        """Put up to 1000 specs in one request; ``atomic``: all of them or none, in one
        command (else the node commits them a few dozen at a time, in order)."""
        return self.call("put_jobs", specs=specs, atomic=atomic)

    def diff_apply(self, specs: list[dict[str, Any]], *, prune: bool = False) -> Any:
        """What :meth:`apply` would change (``changes``, ``unchanged``, ``expect``)."""
        return self.call("diff_apply", specs=specs, prune=prune)

    def apply(self, specs: list[dict[str, Any]], *, prune: bool = False,
              expect: dict[str, int] | None = None) -> Any:
        """Make the cluster's jobs equal ``specs`` in one command (``prune``: remove the
        others); ``expect`` (a diff's) refuses it if a job changed since."""
        args: dict[str, Any] = {"specs": specs, "prune": prune}
        if expect is not None:
            args["expect"] = expect
        return self.call("apply", **args)

    # Reads are consistent: answered once the node has applied everything the cluster
    # had committed when they arrived, else ``not_ready``. ``stale=True`` answers at once
    # from whatever the node holds, and the reply says ``"stale": true``.

    def get_job(self, job_id: str, *, stale: bool = False) -> Any:
        return self.call("get_job", id=job_id, **_stale(stale))

    def list_jobs(self, prefix: str | None = None, limit: int = 1000, *,
                  stale: bool = False) -> Any:
        return self.call("list_jobs", prefix=prefix, limit=limit, **_stale(stale))

    def delete_job(self, job_id: str) -> Any:
        return self.call("delete_job", id=job_id)

    def pause(self, job_id: str) -> Any:
        return self.call("pause", id=job_id)

    def resume(self, job_id: str, catch_up: bool = False) -> Any:
        return self.call("resume", id=job_id, catch_up=catch_up)

    def trigger(self, job_id: str, force: bool = False) -> Any:
        return self.call("trigger", id=job_id, force=force)

    def runs(self, job_id: str, limit: int = 100, *, stale: bool = False,
             before: int | None = None) -> Any:
        """Newest first; ``before`` (a page's last ``scheduled_ms``) gives the next page."""
        extra = {} if before is None else {"before": before}
        return self.call("runs", id=job_id, limit=limit, **_stale(stale), **extra)

    def next_fires(self, job_id: str | None = None, *, spec: dict[str, Any] | None = None,
                   count: int = 5) -> Any:
        """The next ``count`` fire times of a job (or of a spec not stored), in words too."""
        return self.call("next_fires", count=count,
                         **({"spec": spec} if spec is not None else {"id": job_id}))

    def preview_put(self, specs: list[dict[str, Any]]) -> Any:
        """What putting ``specs`` would change (created/updated/unchanged), committing nothing."""
        return self.call("preview_put", specs=specs)

    def drain(self, node_id: str) -> Any:
        """No new runs on ``node_id``, and it hands leadership away; its runs finish."""
        return self.call("drain", node=node_id, draining=True)

    def undrain(self, node_id: str) -> Any:
        return self.call("drain", node=node_id, draining=False)

    def transfer_leader(self, to: str | None = None) -> Any:
        """Ask the leader to hand leadership to node ``to`` (or the most caught-up one)."""
        return self.call("transfer_leader", to=to)

    def add_node(self, node_id: str, *, raft: str, api: str, force: bool = False) -> Any:
        """Add member ``node_id`` (start it with ``raftsched node --join`` first)."""
        return self.call("add_node", node=node_id, raft=raft, api=api, force=force)

    def remove_node(self, node_id: str, *, wait: float = 60.0) -> Any:
        """Remove member ``node_id``: drained first, its runs end, then it leaves."""
        return self.call("remove_node", node=node_id, wait=wait)

    def backup(self) -> bytes:
        """A backup file of the cluster's state (``raftsched backup``): taken by the node
        this client talks to once it has caught up with the leader, fetched in chunks."""
        reply = self.call("backup")
        parts = [reply["chunk"]]
        got = len(reply["chunk"])
        while got < reply["size"]:
            more = self.call("backup", id=reply["id"], offset=got)
            if not more["chunk"]:
                raise ProtocolError(f"backup ended at {got} of {reply['size']} bytes")
            parts.append(more["chunk"])
            got += len(more["chunk"])
        return b"".join(parts)

    def status(self, *, stale: bool = False) -> Any:
        """Always answers; ``consistent`` says whether its counts are caught up."""
        return self.call("status", **_stale(stale))

    def call(self, op: str, /, **args: Any) -> Any:
        """Send ``op`` with ``args``; the reply's result, or the reply's error raised."""
        if op in WRITE_OPS and "rid" not in args:
            args["rid"] = uuid.uuid4().hex[:32]
        with self._lock:
            return self._call_with_failover(op, args)

    # ------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        with self._lock:
            self._drop()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ internals

    def _call_with_failover(self, op: str, args: dict[str, Any]) -> Any:
        deadline = time.monotonic() + self._timeout
        n = len(self._addrs)
        reasons: dict[str, str] = {}  # address -> its last failure, in the order tried
        start = self._current
        for attempt in range(MAX_ROUNDS * n):
            if attempt and attempt % n == 0:
                # A whole round failed: give an election a moment before going round again.
                pause = min(_ROUND_PAUSE_S, deadline - time.monotonic())
                if pause > 0:
                    time.sleep(pause)
            if time.monotonic() >= deadline:
                break
            index = (start + attempt) % n
            if index != self._current:
                self._drop()
                self._current = index
            host, port = self._addrs[index]
            addr = f"{host}:{port}"
            # A frozen node (SIGSTOP, GC pause, half-open link) must not eat the whole
            # timeout: each address gets its share, then the next one is tried (writes
            # are safe to retry elsewhere: they carry one request id).
            share = deadline if n == 1 else min(
                deadline, time.monotonic() + max(self._timeout / n, 1.0))
            try:
                return self._request(op, args, share)
            except _Failover as exc:
                reasons[addr] = exc.reason
                log.debug("raftsched %s failed on %s (%s); trying the next address", op,
                          addr, exc.reason)
                self._drop()
        raise _no_answer(op, reasons, self._timeout)

    def _request(self, op: str, args: dict[str, Any], deadline: float) -> Any:
        """One attempt on the current address; _Failover when another node may do better."""
        try:
            if self._sock is not None:
                try:
                    return self._roundtrip(op, args, deadline)
                except ConnectionError as exc:
                    if isinstance(exc, RaftschedError):  # NotReady is a ConnectionError too
                        raise
                    # A kept connection the node has since closed (idle timeout, restart):
                    # that says nothing about the node, so reconnect to it once first.
                    log.debug("raftsched connection to %s:%s went stale; reconnecting",
                              *self._addrs[self._current])
            self._connect(deadline)
            reply = self._roundtrip(op, args, deadline)
        except NotTheApi as exc:  # a wrong address in the list: the others may be right
            raise _Failover(exc.message) from None
        # RaftschedError first: several of them (Unauthenticated, NotReady) are OSErrors.
        except RaftschedError as exc:
            if exc.code in FAILOVER_CODES:
                raise _Failover(f"{exc.code}: {exc.message}") from None
            raise
        except OSError as exc:  # refused, reset, timed out, closed by the node
            raise _Failover(_describe(exc)) from None
        return reply

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
                raise ConnectionError(f"{host}:{port} closed the connection at hello (a TLS "
                                      f"port? give its CA: --tls-ca or ${TLS_CA_ENV})") from None
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

    def http_token(self, *, read_only: bool = False) -> str:
        """A bearer token for the cluster's HTTP API, derived from the secret this client
        proved to a node (it connects first if it has not yet)."""
        if self._proven is None:
            self.call("ping")
        if self._proven is None:
            raise Unauthenticated("the node asked for no secret: no token can be derived")
        return token(self._proven, Role.read if read_only else Role.admin)

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


def _stale(stale: bool) -> dict[str, Any]:
    return {"stale": True} if stale else {}


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


def _describe(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "timed out"
    return getattr(exc, "strerror", None) or str(exc) or type(exc).__name__


class NotTheApi(ProtocolError):
    """The address answers, but it is not a raftsched API port (an HTTP server)."""


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


def _no_answer(op: str, reasons: dict[str, str], timeout: float) -> RaftschedError:
    """The error of a call no address answered: ``not_ready`` with the node's own words
    when a node said why (no quorum), else ``unavailable`` with each address's reason."""
    if not reasons:
        return Unavailable(f"no node answered {op} within {timeout:g}s")
    told = [(a, r) for a, r in reasons.items() if r.startswith("not_ready: ")]
    others = "; ".join(f"{a}: {r}" for a, r in reasons.items() if not r.startswith("not_ready"))
    if told:
        addr, reason = told[-1]
        text = f"{reason[len('not_ready: '):]} (said {addr})"
        return NotReady(text + (f"; {others}" if others else ""))
    return Unavailable(f"no node answered {op} (timeout {timeout:g}s): {others}")
