"""A small synchronous client of the raftsched API, with failover across nodes.

One connection is kept open and reused; on connect the client says ``hello`` and, if
the node requires it, proves the cluster secret with ``auth`` (HMAC-SHA256 of the
node's nonce). When a node is unreachable, or answers ``not_ready``/``unavailable``,
the same request goes to the next address. Write ops carry a client-made ``rid``
that stays the same across those retries, so the cluster applies each call once.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import logging
import socket
import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any

from raftsched.codec import FRAME_HEADER, WIRE_VERSION, encode_frame, frame_length, unpackb
from raftsched.errors import (
    InvalidArgument,
    ProtocolError,
    RaftschedError,
    Unauthenticated,
    Unavailable,
    from_wire,
)

log = logging.getLogger(__name__)

DEFAULT_ADDR = "127.0.0.1:7101"
DEFAULT_SECRET_ENV = "RAFTSCHED_SECRET"
#: Replies (a job list, a run history) may be far larger than requests.
MAX_REPLY_BYTES = 64 * 1024 * 1024
#: Ops that change state; they carry a ``rid`` so a retry after failover is not re-applied.
WRITE_OPS = frozenset({"put_job", "put_jobs", "delete_job", "pause", "resume", "trigger"})
#: Error codes meaning "this node cannot serve it now, another may".
FAILOVER_CODES = frozenset({"not_ready", "unavailable"})
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
    :param secret: the cluster secret (only needed when the nodes require auth).
    :param timeout: seconds one call may take in total, failover included.
    """

    def __init__(self, addrs: str | Sequence[str] = DEFAULT_ADDR, *,
                 secret: str | None = None, timeout: float = 10.0) -> None:
        if not timeout > 0:
            raise InvalidArgument("timeout", "must be positive")
        self._addrs = parse_addrs(addrs)
        self._secret = secret
        self._timeout = float(timeout)
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._current = 0  # index of the address that last worked
        self._ids = itertools.count(1)
        self.node: str | None = None  # node id from the last hello

    # ------------------------------------------------------------------ ops

    def put_job(self, spec: dict[str, Any]) -> Any:
        return self.call("put_job", spec=spec)

    def get_job(self, job_id: str) -> Any:
        return self.call("get_job", id=job_id)

    def list_jobs(self, prefix: str | None = None, limit: int = 1000) -> Any:
        return self.call("list_jobs", prefix=prefix, limit=limit)

    def delete_job(self, job_id: str) -> Any:
        return self.call("delete_job", id=job_id)

    def pause(self, job_id: str) -> Any:
        return self.call("pause", id=job_id)

    def resume(self, job_id: str, catch_up: bool = False) -> Any:
        return self.call("resume", id=job_id, catch_up=catch_up)

    def trigger(self, job_id: str, force: bool = False) -> Any:
        return self.call("trigger", id=job_id, force=force)

    def runs(self, job_id: str, limit: int = 100) -> Any:
        return self.call("runs", id=job_id, limit=limit)

    def status(self) -> Any:
        return self.call("status")

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
        tried: list[str] = []
        last = "no attempt"
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
            if addr not in tried:
                tried.append(addr)
            # A frozen node (SIGSTOP, GC pause, half-open link) must not eat the whole
            # timeout: each address gets its share, then the next one is tried (writes
            # are safe to retry elsewhere: they carry one request id).
            share = deadline if n == 1 else min(
                deadline, time.monotonic() + max(self._timeout / n, 1.0))
            try:
                return self._request(op, args, share)
            except _Failover as exc:
                last = f"{addr}: {exc.reason}"
                log.debug("raftsched %s failed on %s (%s); trying the next address", op,
                          addr, exc.reason)
                self._drop()
        raise Unavailable(f"no node answered {op} (tried {', '.join(tried)}, timeout "
                          f"{self._timeout:g}s); last error: {last}")

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
        sock = socket.create_connection((host, port), timeout=_remaining(deadline))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock = sock
        try:
            hello = self._roundtrip("hello", {}, deadline)
            if not isinstance(hello, dict):
                raise ProtocolError("hello reply is not a map")
            self.node = str(hello.get("node")) if hello.get("node") is not None else None
            if hello.get("auth_required"):
                self._auth(hello, deadline)
        except BaseException:
            self._drop()
            raise

    def _auth(self, hello: dict[str, Any], deadline: float) -> None:
        if not self._secret:
            raise Unauthenticated(
                f"the node requires authentication: set the cluster secret in the "
                f"{DEFAULT_SECRET_ENV} environment variable (or the one --secret-env names)")
        nonce = hello.get("nonce")
        try:
            nonce_bytes = bytes.fromhex(nonce) if isinstance(nonce, str) else None
        except ValueError:
            nonce_bytes = None
        if not nonce_bytes:
            raise ProtocolError("hello reply has no valid nonce")
        mac = hmac.new(self._secret.encode("utf-8"), nonce_bytes, hashlib.sha256).hexdigest()
        self._roundtrip("auth", {"mac": mac}, deadline)

    def _roundtrip(self, op: str, args: dict[str, Any], deadline: float) -> Any:
        sock = self._sock
        assert sock is not None
        req_id = next(self._ids)
        frame = _encode_request(req_id, op, args)
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
        try:
            size = frame_length(header, MAX_REPLY_BYTES)
        except RaftschedError as exc:
            raise ProtocolError(f"reply frame refused: {exc.message}") from None
        reply = unpackb(_recv_exactly(sock, size, deadline))
        if not isinstance(reply, dict) or not isinstance(reply.get("ok"), bool):
            raise ProtocolError("reply is not a {v, id, ok, ...} map")
        if reply.get("v") != WIRE_VERSION:
            raise ProtocolError(f"reply version {reply.get('v')!r:.20} is not {WIRE_VERSION}")
        return reply

    def _drop(self) -> None:
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


def _describe(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "timed out"
    return getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
