"""One client connection of the API server: frames in, replies out, in order.

A frame is a 4-byte big-endian length and a msgpack body. A request is
``{id, op, args}``; a reply is ``{v: 1, id, ok: true, result}`` or
``{v: 1, id, ok: false, error: {code, message}}``.

Each connection has a reader task and a worker task joined by a bounded queue: the
reader may run up to ``max_inflight_per_conn`` requests ahead (pipelining), the worker
answers them strictly in order, and a full queue (or more than ``QUEUED_FRAMES_BUDGET``
frames worth of unanswered bytes) stops the reader (backpressure).
Anything a peer sends is untrusted: every failure is answered or ends only that
connection, and frame contents (args, macs, nonces) are never logged.

The worker, not the reader, decodes frames: whether a frame is sealed depends on the
auth answered before it, and the worker answers in order. What a request means
(authentication, the node's ops) is :class:`raftsched.wire.api.ApiServer`'s
``_dispatch``; this module only moves frames.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from typing import Any

from raftsched.core.errors import FrameTooLarge, ProtocolError, RaftschedError
from raftsched.core.packing import unpackb
from raftsched.wire import session
from raftsched.wire.framing import FRAME_HEADER, encode_frame, frame_length
from raftsched.wire.session import SEAL_OVERHEAD, Credential

# The API server's logger, not this module's: operators and tests filter the API's
# messages by that one name, wherever in the package they are written.
log = logging.getLogger("raftsched.wire.api")

MAX_OP_LEN = 64
# A last error frame or a close handshake must not hold a task hostage.
FAREWELL_TIMEOUT_S = 1.0
#: The first four bytes of an HTTP request (as a frame header they announce ~1.2 GB).
HTTP_METHODS = frozenset({b"GET ", b"POST", b"HEAD", b"PUT ", b"DELE", b"OPTI", b"PATC",
                          b"CONN", b"TRAC"})
#: Bytes of read-but-unanswered requests one connection may hold, in frames: bounds
#: memory to connections x this x max_frame_bytes, whatever the pipelining depth.
QUEUED_FRAMES_BUDGET = 2


class ApiConnection:
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


class CloseConnection(Exception):
    """Raised inside a connection to end it after the current reply."""


class FramePipeline:
    """The per-connection reader and worker of :class:`raftsched.wire.api.ApiServer`
    (its base class): see the module docstring. The server sets the limits and counters
    declared here and answers requests in :meth:`_dispatch`."""

    _max_frame: int
    _idle_s: float
    _requests: int
    _too_large: int
    _http_addr: str | None
    _json_http_addr: str | None
    _ssl: ssl.SSLContext | None

    async def _dispatch(self, conn: ApiConnection, req_id: Any, op: str,
                        args: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def _error_reply(self, req_id: Any, exc: RaftschedError) -> dict[str, Any]:
        raise NotImplementedError

    async def _serve(self, conn: ApiConnection) -> None:
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

    async def _read_loop(self, conn: ApiConnection) -> None:
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

    async def _answer_http(self, conn: ApiConnection) -> None:
        """One plain HTTP 400 naming this port and where HTTP is served, then close."""
        where = (f"HTTP is served on http://{self._http_addr}/ (/metrics, /healthz, /readyz)"
                 if self._http_addr else "this node serves no metrics over HTTP")
        if self._json_http_addr:
            # The JSON API speaks TLS exactly when this port does (the node's certificate).
            scheme = "https" if self._ssl is not None else "http"
            where += (f"; the HTTP/JSON API and dashboard on {scheme}://{self._json_http_addr}/ "
                      "(/api/v1/...)")
        body = (f"this is the raftsched API port (msgpack over TCP); {where}; use the "
                f"raftsched CLI or raftsched.Client here\n").encode()
        head = (f"HTTP/1.0 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
        log.debug("api connection from %s spoke HTTP; answered 400", conn.peer)
        with contextlib.suppress(Exception):
            # Read the request's head first: closing with unread bytes would reset the
            # connection and the client might never see the answer.
            async with asyncio.timeout(FAREWELL_TIMEOUT_S):
                await conn.reader.readuntil(b"\r\n\r\n")
        with contextlib.suppress(Exception):
            conn.writer.write(head + body)
            async with asyncio.timeout(FAREWELL_TIMEOUT_S):
                await conn.writer.drain()
        conn.writer.close()

    async def _read_timed(self, conn: ApiConnection, n: int, *,
                          waiting_for_frame: bool) -> bytes | None:
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

    def _parse(self, conn: ApiConnection, body: bytes) -> tuple[Any, ...]:
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

    async def _work(self, conn: ApiConnection) -> None:
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

    async def _answer(self, conn: ApiConnection, item: tuple[Any, ...]) -> bool:
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
        except CloseConnection:
            self._abort_reader(conn)
            return False
        finally:
            conn.busy = False
        return True

    def _abort_reader(self, conn: ApiConnection) -> None:
        # Closing the transport wakes the reader with EOF/ConnectionError.
        conn.writer.close()

    async def _send(self, conn: ApiConnection, reply: dict[str, Any]) -> None:
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


def _tname(value: Any) -> str:
    return type(value).__name__
