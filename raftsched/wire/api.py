"""The client API server: length-prefixed msgpack frames over TCP.

A frame is a 4-byte big-endian length and a msgpack body. A request is
``{id, op, args}``; a reply is ``{v: 1, id, ok: true, result}`` or
``{v: 1, id, ok: false, error: {code, message}}``.

Each connection has a reader task and a worker task joined by a bounded queue: the
reader may run up to ``max_inflight_per_conn`` requests ahead (pipelining), the worker
answers them strictly in order, and a full queue (or more than ``QUEUED_FRAMES_BUDGET``
frames worth of unanswered bytes) stops the reader (backpressure).
Anything a peer sends is untrusted: every failure is answered or ends only that
connection, and frame contents (args, macs, nonces) are never logged.

Authentication is mutual (:mod:`raftsched.wire.session`, protocol 2): the client proves
a credential of the node's keyring, the node proves it too, and without TLS every frame
after that is sealed with AES-GCM. With an ``ssl_context`` the port speaks TLS only.
The worker, not the reader, decodes frames: whether a frame is sealed depends on the
auth answered before it, and the worker answers in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from raftsched.core.codec import FRAME_HEADER, WIRE_VERSION, encode_frame, frame_length, unpackb
from raftsched.core.errors import (
    FrameTooLarge,
    LimitExceeded,
    ProtocolError,
    RaftschedError,
    Unauthenticated,
)
from raftsched.wire import session
from raftsched.wire.session import ADMIN, READ_OPS, SEAL_OVERHEAD, Credential

log = logging.getLogger(__name__)

Handler = Callable[[str, dict[str, Any]], Awaitable[Any]]

PROTOCOL = session.PROTOCOL
#: The credential of the request being handled (its name and role), for audit events.
CREDENTIAL: contextvars.ContextVar[Credential | None] = contextvars.ContextVar(
    "raftsched_api_credential", default=None)
#: A brute-force guesser gets this many tries per connection, then must reconnect.
MAX_AUTH_FAILURES = 3
MAX_OP_LEN = 64
#: Ops answered here, not by the node's handler; ping and the auth pair need no auth.
_OPEN_OPS = frozenset({"hello", "auth", "ping"})
# A last error frame or a close handshake must not hold a task hostage.
_FAREWELL_TIMEOUT_S = 1.0
_CLOSE_GRACE_S = 5.0
# A flood of refused connections must not flood the log too.
_REJECT_LOG_EVERY_S = 10.0
#: The first four bytes of an HTTP request (as a frame header they announce ~1.2 GB).
HTTP_METHODS = frozenset({b"GET ", b"POST", b"HEAD", b"PUT ", b"DELE", b"OPTI", b"PATC",
                          b"CONN", b"TRAC"})
#: Bytes of read-but-unanswered requests one connection may hold, in frames: bounds
#: memory to connections x this x max_frame_bytes, whatever the pipelining depth.
QUEUED_FRAMES_BUDGET = 2


@dataclass(frozen=True, slots=True, kw_only=True)
class ApiStatistics:
    """Counters of one :class:`ApiServer` since it started.

    :var connections_open: connections being served now.
    :var connections_total: connections accepted (not counting rejected ones).
    :var requests_total: complete frames received.
    :var errors_total: error replies sent, by error code.
    :var rejected_connections: connections refused by ``max_connections``.
    :var frames_too_large: frames refused unread because of their announced length.
    """

    connections_open: int
    connections_total: int
    requests_total: int
    errors_total: dict[str, int]
    rejected_connections: int
    frames_too_large: int


class _Conn:
    """Per-connection state; touched only by that connection's tasks."""

    __slots__ = ("peer", "reader", "writer", "queue", "nonce", "cnonce", "cred",
                 "auth_failures", "busy", "queued_bytes", "drained", "ciphers", "armed",
                 "tls")

    def __init__(self, peer: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 depth: int) -> None:
        self.peer = peer
        self.reader = reader
        self.writer = writer
        # Items: (size, ("req", id, op, args)) or (size, ("reply", reply, close_after)).
        self.queue: asyncio.Queue[tuple[int, tuple[Any, ...]] | None] = \
            asyncio.Queue(maxsize=depth)
        self.queued_bytes = 0
        self.drained = asyncio.Event()
        self.nonce: bytes | None = None
        self.cnonce: bytes | None = None
        #: The credential this connection proved; None until then.
        self.cred: Credential | None = None
        self.auth_failures = 0
        self.busy = False
        #: Set once authenticated without TLS: every later frame is sealed.
        self.ciphers: session.Ciphers | None = None
        self.armed: session.Ciphers | None = None  # ciphers the next reply switches on
        self.tls = writer.get_extra_info("ssl_object") is not None


class _Close(Exception):
    """Raised inside a connection to end it after the current reply."""


class ApiServer:
    """Serves the client API of one node. See the module docstring."""

    def __init__(self, *, handler: Handler, host: str, port: int, secret: str | None,
                 node_id: str, max_frame_bytes: int = 1 << 20, max_connections: int = 256,
                 idle_timeout_s: float = 300.0, max_inflight_per_conn: int = 64,
                 http_addr: str | None = None, cluster_id: str | None = None,
                 json_http_addr: str | None = None,
                 credentials: tuple[Credential, ...] | None = None,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        """``secret`` (one admin secret) or ``credentials`` (a keyring, see
        :func:`raftsched.wire.session.keyring`); neither: no authentication at all
        (tests of the framing only: clients refuse such a server)."""
        if max_frame_bytes < 64 or max_connections < 1 or idle_timeout_s <= 0 \
                or max_inflight_per_conn < 1:
            raise ValueError("ApiServer limits must be positive (max_frame_bytes >= 64)")
        self._handler = handler
        self._host = host
        self._port = port
        if credentials is None and secret:
            credentials = session.keyring([secret])
        self._creds: tuple[Credential, ...] | None = credentials or None
        self._ssl = ssl_context
        self._node_id = node_id
        self._cluster_id = cluster_id
        self._cluster_ids: list[str] = [cluster_id] if cluster_id else []
        self._max_frame = max_frame_bytes
        self._max_conns = max_connections
        self._idle_s = idle_timeout_s
        self._depth = max_inflight_per_conn
        self._http_addr = http_addr
        self._json_http_addr = json_http_addr
        self._server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._open = 0
        self._conns_total = 0
        self._requests = 0
        self._errors: dict[str, int] = {}
        self._rejected = 0
        self._too_large = 0
        self._reject_logged = -_REJECT_LOG_EVERY_S

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Listen; raises OSError when the address is busy or not bindable."""
        if self._server is not None:
            raise RuntimeError("ApiServer already started")
        self._server = await asyncio.start_server(
            self._accept, self._host, self._port, ssl=self._ssl,
            ssl_handshake_timeout=10.0 if self._ssl is not None else None)
        log.info("api listening on %s:%s%s", self._host, self.bound_port,
                 " (TLS)" if self._ssl is not None else "")

    def set_credentials(self, credentials: tuple[Credential, ...],
                        cluster_ids: list[str] | None = None) -> None:
        """A new keyring (a secret rotation): new authentications use it at once;
        connections already authenticated keep theirs."""
        if not credentials:
            raise ValueError("a keyring cannot be emptied")
        self._creds = credentials
        if cluster_ids:
            self._cluster_id = cluster_ids[0]  # the used secret's: hello names it
            self._cluster_ids = list(cluster_ids)

    async def close(self) -> None:
        """Stop accepting, end every connection and wait for their tasks."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            _, stuck = await asyncio.wait(tasks, timeout=_CLOSE_GRACE_S)
            if stuck:
                # A handler that swallows cancellation must not hang the node's shutdown.
                log.warning("api: %s connections did not end within %ss of close", len(stuck),
                            _CLOSE_GRACE_S)
        if server is not None:
            with contextlib.suppress(Exception):
                await server.wait_closed()

    def listening_fds(self) -> list[int]:
        """File descriptors of the listening sockets (closed in forked children)."""
        if self._server is None:
            return []
        return [sock.fileno() for sock in self._server.sockets]

    @property
    def bound_port(self) -> int:
        """The port actually listened on (useful with ``port=0``)."""
        if self._server is None or not self._server.sockets:
            return self._port
        return int(self._server.sockets[0].getsockname()[1])

    def statistics(self) -> ApiStatistics:
        return ApiStatistics(
            connections_open=self._open, connections_total=self._conns_total,
            requests_total=self._requests, errors_total=dict(self._errors),
            rejected_connections=self._rejected, frames_too_large=self._too_large)

    # ------------------------------------------------------------------ connections

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        peer = _peer_name(writer)
        if self._server is None:  # closing: a connection accepted in the race gets nothing
            writer.close()
            return
        if self._open >= self._max_conns:
            await self._reject(writer, peer)
            return
        self._tasks.add(task)
        self._open += 1
        self._conns_total += 1
        log.debug("api connection from %s", peer)
        conn = _Conn(peer, reader, writer, self._depth)
        try:
            await self._serve(conn)
        except asyncio.CancelledError:
            pass  # server closing; the transport is closed below
        except Exception:  # noqa: BLE001 - one connection's failure must not reach the node
            log.exception("api connection from %s failed", peer)
        finally:
            self._open -= 1
            self._tasks.discard(task)
            writer.close()
            with contextlib.suppress(Exception, asyncio.CancelledError):
                async with asyncio.timeout(_FAREWELL_TIMEOUT_S):
                    await writer.wait_closed()
            log.debug("api connection from %s closed", peer)

    async def _reject(self, writer: asyncio.StreamWriter, peer: str) -> None:
        self._rejected += 1
        now = asyncio.get_running_loop().time()
        if now - self._reject_logged >= _REJECT_LOG_EVERY_S:
            self._reject_logged = now
            log.warning("api connection from %s refused: max_connections (%s) reached "
                        "(%s refused so far)", peer, self._max_conns, self._rejected)
        err = LimitExceeded("max_connections",
                            f"the node serves at most {self._max_conns} connections")
        try:
            writer.write(encode_frame(self._error_reply(None, err)))
            async with asyncio.timeout(_FAREWELL_TIMEOUT_S):
                await writer.drain()
        except OSError:  # TimeoutError included
            pass
        finally:
            writer.close()

    async def _serve(self, conn: _Conn) -> None:
        worker = asyncio.create_task(self._work(conn))
        reader = asyncio.create_task(self._read_loop(conn))
        tasks = (reader, worker)
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            if not worker.done():
                # Requests already read are still answered (their effects happen anyway);
                # the sentinel ends the worker after them.
                put = asyncio.ensure_future(conn.queue.put(None))
                await asyncio.wait({put, worker}, return_when=asyncio.FIRST_COMPLETED)
                put.cancel()
                await asyncio.wait({worker})
        finally:
            # The worker ended the connection (fatal reply, failed auths) or we are closing.
            for task in tasks:
                task.cancel()
            results = await asyncio.gather(*tasks, return_exceptions=True)
        for result in results:
            if isinstance(result, Exception):
                log.error("api connection from %s failed", conn.peer, exc_info=result)

    async def _read_loop(self, conn: _Conn) -> None:
        """Read frames and queue them; ends on EOF, idle timeout or a fatal frame."""
        header_len = FRAME_HEADER.size
        first = True
        while True:
            header = await self._read_timed(conn, header_len, waiting_for_frame=True)
            if header is None:
                return
            if first and header in HTTP_METHODS:
                # A browser or curl on the API port: a frame "length" of 1.2 GB would say
                # nothing useful; tell it in its own protocol where it is.
                await self._answer_http(conn)
                return
            first = False
            try:
                # A sealed frame carries its tag on top (the client seals only after
                # the auth reply, which sets conn.ciphers before it is sent).
                sealed = conn.ciphers is not None or conn.armed is not None
                size = frame_length(header, self._max_frame + (SEAL_OVERHEAD if sealed else 0))
            except FrameTooLarge as exc:
                # The body is never read: the stream is unsynchronized, so the connection ends.
                if sealed:  # in the sender's terms: the message it sealed
                    exc = FrameTooLarge(exc.size - SEAL_OVERHEAD, self._max_frame)
                self._too_large += 1
                log.warning("api frame of %s bytes from %s refused (limit %s)", exc.size,
                            conn.peer, self._max_frame)
                await conn.queue.put((0, ("reply", self._error_reply(None, exc), True)))
                return
            budget = QUEUED_FRAMES_BUDGET * self._max_frame
            while conn.queued_bytes and conn.queued_bytes + size > budget:
                conn.drained.clear()
                await conn.drained.wait()
            body = await self._read_timed(conn, size, waiting_for_frame=False)
            if body is None:
                return
            self._requests += 1
            conn.queued_bytes += size
            await conn.queue.put((size, ("raw", body)))

    async def _answer_http(self, conn: _Conn) -> None:
        """One plain HTTP 400 naming this port and where HTTP is served, then close."""
        where = (f"HTTP is served on http://{self._http_addr}/ (/metrics, /healthz, /readyz)"
                 if self._http_addr else "this node serves no metrics over HTTP")
        if self._json_http_addr:
            where += (f"; the HTTP/JSON API and dashboard on http://{self._json_http_addr}/ "
                      "(/api/v1/...)")
        body = (f"this is the raftsched API port (msgpack over TCP); {where}; use the "
                f"raftsched CLI or raftsched.Client here\n").encode()
        head = (f"HTTP/1.0 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
        log.debug("api connection from %s spoke HTTP; answered 400", conn.peer)
        with contextlib.suppress(Exception):
            # Read the request's head first: closing with unread bytes would reset the
            # connection and the client might never see the answer.
            async with asyncio.timeout(_FAREWELL_TIMEOUT_S):
                await conn.reader.readuntil(b"\r\n\r\n")
        with contextlib.suppress(Exception):
            conn.writer.write(head + body)
            async with asyncio.timeout(_FAREWELL_TIMEOUT_S):
                await conn.writer.drain()
        conn.writer.close()

    async def _read_timed(self, conn: _Conn, n: int, *, waiting_for_frame: bool) -> bytes | None:
        """``n`` bytes, or None on EOF/idle timeout. Between frames, time spent waiting
        for our own replies does not count as idleness."""
        while True:
            try:
                async with asyncio.timeout(self._idle_s):
                    return await conn.reader.readexactly(n)
            except asyncio.IncompleteReadError:
                return None
            except TimeoutError:  # before OSError: TimeoutError is one
                if waiting_for_frame and (conn.busy or not conn.queue.empty()):
                    continue
                log.debug("api connection from %s idle for %ss; closing", conn.peer,
                          self._idle_s)
                return None
            except OSError:
                return None

    def _parse(self, conn: _Conn, body: bytes) -> tuple[Any, ...]:
        """A queue item for one body; a malformed body becomes a protocol_error reply
        (one that fails to open ends the connection: the stream can no longer be read)."""
        req_id: Any = None
        if conn.ciphers is not None:
            try:
                body = conn.ciphers.recv.open(body)
            except ProtocolError as exc:
                return ("reply", self._error_reply(None, exc), True)
        try:
            msg = unpackb(body)
            if not isinstance(msg, dict):
                raise ProtocolError(f"request must be a map, not {_tname(msg)}")
            raw_id = msg.get("id")
            if raw_id is not None and (isinstance(raw_id, bool)
                                       or not isinstance(raw_id, (int, str))):
                raise ProtocolError(f"request id must be an integer or string, not "
                                    f"{_tname(raw_id)}")
            req_id = raw_id
            op = msg.get("op")
            if not isinstance(op, str) or not 0 < len(op) <= MAX_OP_LEN:
                raise ProtocolError("request needs an op (a string of 1..64 characters)")
            args = msg.get("args")
            if args is None:
                args = {}
            elif not isinstance(args, dict):
                raise ProtocolError(f"request args must be a map, not {_tname(args)}")
        except ProtocolError as exc:
            return ("reply", self._error_reply(req_id, exc), False)
        return ("req", req_id, op, args)

    async def _work(self, conn: _Conn) -> None:
        """Answer queued requests in order; ends on the None sentinel or a fatal reply."""
        while True:
            entry = await conn.queue.get()
            if entry is None:
                return
            size, item = entry
            try:
                if not await self._answer(conn, item):
                    return
            finally:
                conn.queued_bytes -= size
                conn.drained.set()

    async def _answer(self, conn: _Conn, item: tuple[Any, ...]) -> bool:
        """Answer one queue item; False when the connection must end."""
        if item[0] == "raw":
            item = self._parse(conn, item[1])
        if item[0] == "reply":
            _, reply, close_after = item
            await self._send(conn, reply)
            if close_after:
                self._abort_reader(conn)
                return False
            return True
        _, req_id, op, args = item
        conn.busy = True
        try:
            reply = await self._dispatch(conn, req_id, op, args)
            await self._send(conn, reply)
        except _Close:
            self._abort_reader(conn)
            return False
        finally:
            conn.busy = False
        return True

    def _abort_reader(self, conn: _Conn) -> None:
        # Closing the transport wakes the reader with EOF/ConnectionError.
        conn.writer.close()

    async def _send(self, conn: _Conn, reply: dict[str, Any]) -> None:
        try:
            frame = encode_frame(reply)
        except Exception:  # noqa: BLE001 - a handler returned something msgpack cannot carry
            log.exception("api reply to %s could not be encoded", conn.peer)
            frame = encode_frame(self._error_reply(
                reply.get("id"), RaftschedError("the reply could not be encoded")))
        if conn.writer.is_closing():
            return
        if conn.ciphers is not None:
            sealed = conn.ciphers.send.seal(frame[FRAME_HEADER.size:])
            frame = FRAME_HEADER.pack(len(sealed)) + sealed
        if conn.armed is not None:
            # This was the auth reply, in the clear; everything after it is sealed.
            conn.ciphers, conn.armed = conn.armed, None
        conn.writer.write(frame)
        try:
            # A peer that never reads would otherwise pin our buffers forever.
            async with asyncio.timeout(self._idle_s):
                await conn.writer.drain()
        except OSError:  # TimeoutError included
            conn.writer.close()

    # ------------------------------------------------------------------ requests

    async def _dispatch(self, conn: _Conn, req_id: Any, op: str,
                        args: dict[str, Any]) -> dict[str, Any]:
        try:
            if op in _OPEN_OPS:
                result = self._builtin(conn, op, args)
            elif self._creds is not None and conn.cred is None:
                raise Unauthenticated("authenticate first: send hello, then auth with the "
                                      "proof of a cluster credential")
            elif conn.cred is not None and conn.cred.role != ADMIN and op not in READ_OPS:
                raise Unauthenticated(f"{op[:40]!r} needs an admin credential; this "
                                      f"connection holds a read-only one")
            else:
                token = CREDENTIAL.set(conn.cred)
                try:
                    result = await self._handler(op, args)
                finally:
                    CREDENTIAL.reset(token)
        except _Close:
            raise
        except RaftschedError as exc:
            if isinstance(exc, Unauthenticated) and op == "auth" \
                    and conn.auth_failures >= MAX_AUTH_FAILURES:
                await self._send(conn, self._error_reply(req_id, exc))
                log.warning("api connection from %s: %s failed auths; closing", conn.peer,
                            conn.auth_failures)
                raise _Close() from None
            return self._error_reply(req_id, exc)
        except Exception:  # noqa: BLE001 - the node must answer, not crash
            # Only the op is logged: args may hold secrets (env values, macs).
            log.exception("api handler failed for op %s", op)
            return self._error_reply(req_id, RaftschedError("internal error; see the node log"))
        return {"v": WIRE_VERSION, "id": req_id, "ok": True, "result": result}

    def _builtin(self, conn: _Conn, op: str, args: dict[str, Any]) -> Any:
        if op == "ping":
            return {"pong": True}
        if op == "hello":
            if conn.cred is not None:
                raise ProtocolError("already authenticated on this connection")
            conn.nonce = session.new_nonce()
            # A client of protocol 1 sends no nonce: it learns here that it must upgrade.
            conn.cnonce = (session.parse_nonce(args["cnonce"], "cnonce")
                           if args.get("cnonce") is not None else None)
            hello: dict[str, Any] = {"nonce": conn.nonce.hex(), "node": self._node_id,
                                     "auth_required": self._creds is not None,
                                     "protocol": PROTOCOL, "tls": conn.tls}
            if self._cluster_id is not None:
                hello["cluster_id"] = self._cluster_id
                hello["cluster_ids"] = list(self._cluster_ids)
            return hello
        # op == "auth"
        if self._creds is None:
            raise Unauthenticated("this server authenticates no one (it has no secret)")
        if conn.cred is not None:
            raise ProtocolError("already authenticated on this connection")
        if conn.nonce is None or conn.cnonce is None:
            conn.auth_failures += 1
            if conn.nonce is not None or "mac" in args:
                raise Unauthenticated(f"this node speaks protocol {PROTOCOL} (mutual "
                                      f"authentication, sealed frames): upgrade the client")
            raise Unauthenticated("send hello first: auth answers the nonce of the last hello")
        proof = args.get("proof")
        given = b""
        if isinstance(proof, str) and len(proof) <= 128:
            with contextlib.suppress(ValueError):
                given = bytes.fromhex(proof)
        snonce, cnonce = conn.nonce, conn.cnonce
        conn.nonce = conn.cnonce = None  # one nonce, one proof
        cred = session.match(self._creds, given, snonce, cnonce)
        if cred is None:
            conn.auth_failures += 1
            raise Unauthenticated("authentication failed: wrong cluster secret")
        conn.cred = cred
        if not conn.tls:
            conn.armed = session.ciphers(cred.key, snonce, cnonce, server=True)
        return {"ok": True, "role": cred.role, "sealed": not conn.tls,
                "proof": session.server_proof(cred.key, snonce, cnonce).hex()}

    def _error_reply(self, req_id: Any, exc: RaftschedError) -> dict[str, Any]:
        err = exc.to_wire()
        code = err["code"]
        self._errors[code] = self._errors.get(code, 0) + 1
        return {"v": WIRE_VERSION, "id": req_id, "ok": False, "error": err}


def _peer_name(writer: asyncio.StreamWriter) -> str:
    peer = writer.get_extra_info("peername")
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"{peer[0]}:{peer[1]}"
    return str(peer)


def _tname(value: Any) -> str:
    return type(value).__name__
