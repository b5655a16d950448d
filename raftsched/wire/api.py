"""The client API server of a node: listening, accepting (within ``max_connections``),
authentication and the dispatch of each request to the node's handler.

The wire format and each connection's reader/worker pipeline are
:mod:`raftsched.wire.apiconn`'s (the base class :class:`~raftsched.wire.apiconn.FramePipeline`).

Authentication is mutual (:mod:`raftsched.wire.session`, protocol 2): the client proves
a credential of the node's keyring, the node proves it too, and without TLS every frame
after that is sealed with AES-GCM. With an ``ssl_context`` the port speaks TLS only.
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

from raftsched.core.errors import (
    LimitExceeded,
    ProtocolError,
    RaftschedError,
    Unauthenticated,
)
from raftsched.wire import session
from raftsched.wire.apiconn import (
    FAREWELL_TIMEOUT_S,
    HTTP_METHODS,
    MAX_OP_LEN,
    QUEUED_FRAMES_BUDGET,
    ApiConnection,
    CloseConnection,
    FramePipeline,
)
from raftsched.wire.framing import WIRE_VERSION, encode_frame
from raftsched.wire.session import ADMIN, READ_OPS, Credential

log = logging.getLogger(__name__)

Handler = Callable[[str, dict[str, Any]], Awaitable[Any]]

PROTOCOL = session.PROTOCOL
#: The credential of the request being handled (its name and role), for audit events.
CREDENTIAL: contextvars.ContextVar[Credential | None] = contextvars.ContextVar(
    "raftsched_api_credential", default=None)
#: A brute-force guesser gets this many tries per connection, then must reconnect.
MAX_AUTH_FAILURES = 3
#: Ops answered here, not by the node's handler; ping and the auth pair need no auth.
_OPEN_OPS = frozenset({"hello", "auth", "ping"})
_CLOSE_GRACE_S = 5.0
# A flood of refused connections must not flood the log too.
_REJECT_LOG_EVERY_S = 10.0


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


class ApiServer(FramePipeline):
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
        self._server: asyncio.Server | None = None
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
        conn = ApiConnection(peer, reader, writer, self._depth)
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
                async with asyncio.timeout(FAREWELL_TIMEOUT_S):
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
            async with asyncio.timeout(FAREWELL_TIMEOUT_S):
                await writer.drain()
        except OSError:  # TimeoutError included
            pass
        finally:
            writer.close()

    # ------------------------------------------------------------------ requests

    async def _dispatch(self, conn: ApiConnection, req_id: Any, op: str,
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
        except CloseConnection:
            raise
        except RaftschedError as exc:
            if isinstance(exc, Unauthenticated) and op == "auth" \
                    and conn.auth_failures >= MAX_AUTH_FAILURES:
                await self._send(conn, self._error_reply(req_id, exc))
                log.warning("api connection from %s: %s failed auths; closing", conn.peer,
                            conn.auth_failures)
                raise CloseConnection() from None
            return self._error_reply(req_id, exc)
        except Exception:  # noqa: BLE001 - the node must answer, not crash
            # Only the op is logged: args may hold secrets (env values, macs).
            log.exception("api handler failed for op %s", op)
            return self._error_reply(req_id, RaftschedError("internal error; see the node log"))
        return {"v": WIRE_VERSION, "id": req_id, "ok": True, "result": result}

    def _builtin(self, conn: ApiConnection, op: str, args: dict[str, Any]) -> Any:
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


#: Kept importable from here (the framing moved to apiconn).
__all__ = ["CREDENTIAL", "HTTP_METHODS", "MAX_AUTH_FAILURES", "MAX_OP_LEN", "PROTOCOL",
           "QUEUED_FRAMES_BUDGET", "ApiServer", "ApiStatistics", "Handler"]
