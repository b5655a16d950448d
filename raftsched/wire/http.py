"""The optional HTTP/JSON API, Server-Sent Events and dashboard of one node (aiohttp).

It is an adapter only: every route calls the node's op handler (the same callable the
msgpack API calls), so validation, limits and error codes are those of the msgpack
API; this module maps them to HTTP statuses. It runs on the node's event loop.

Auth: every request under ``/api/v1/`` carries ``Authorization: Bearer <token>``,
a token derived from the cluster secret (:mod:`raftsched.wire.credentials`). A
read-only token may GET; writes need the admin token. The dashboard's files and
``/openapi.json`` hold nothing secret and are served without a token.

TLS: with an ``ssl_context`` (the node's, whenever the cluster has TLS configured: the
certificate of its msgpack API) the port speaks HTTPS only, so a bearer token never
crosses the network in the clear; a plain HTTP request fails its handshake.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import ssl
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from raftsched.core.errors import InvalidArgument, RaftschedError
from raftsched.wire.api import CREDENTIAL
from raftsched.wire.credentials import Role, role_of
from raftsched.wire.openapi import document
from raftsched.wire.session import ADMIN, READ, Credential, fingerprint

log = logging.getLogger(__name__)

Handler = Callable[[str, dict[str, Any]], Awaitable[Any]]
#: ``subscribe(callback)`` registers a callback for feed events; returns the unsubscribe.
Subscribe = Callable[[Callable[[dict[str, Any]], None]], Callable[[], None]]

STATIC_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "static")
#: Error code -> HTTP status. Anything else is a 500 (an internal error).
STATUS_OF: dict[str, int] = {
    "invalid_spec": 400, "invalid_argument": 400, "protocol_error": 400, "config_error": 400,
    "unauthenticated": 401, "forbidden": 403, "stale_fence": 409,
    "unknown_job": 404, "unknown_run": 404, "not_found": 404, "conflict": 409,
    "frame_too_large": 413, "limit_exceeded": 429, "overloaded": 429,
    "not_ready": 503, "unavailable": 503, "wrong_cluster": 503, "node_unavailable": 503,
}
#: Events a slow SSE client may have unread before it is dropped.
SSE_QUEUE = 256
#: SSE streams served at once (each holds a queue); more are refused with 429.
MAX_SSE_CLIENTS = 64
#: A comment line this often keeps proxies and the browser from closing an idle stream.
SSE_KEEPALIVE_S = 15.0
_JSON_HEADERS = {"Cache-Control": "no-store"}
#: POST routes that only read (a body carries their input): a read-only token may call them.
_READ_POSTS = frozenset({"/api/v1/preview"})
#: On every answer: the dashboard runs only its own script, talks only to this origin
#: and cannot be framed; nothing is sniffed into another type.
_SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
                               "connect-src 'self'; img-src 'self'; base-uri 'none'; "
                               "form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"}


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), default=str)


def _json(value: Any, status: int = 200) -> web.Response:
    """A JSON body ending in a newline (a shell prompt after curl starts on its own line)."""
    return web.Response(text=_dumps(value) + "\n", status=status,
                        content_type="application/json", headers=_JSON_HEADERS)


def _error(status: int, code: str, message: str) -> web.Response:
    return _json({"error": {"code": code, "message": message}}, status)


def _query_int(request: web.Request, key: str) -> Any:
    """The query value as an int when it is one; else the raw text, so the op handler
    refuses it with its own message (one validation, not two)."""
    raw = request.query.get(key)
    if raw is None:
        return None
    with contextlib.suppress(ValueError):
        return int(raw)
    return raw


def _query_float(request: web.Request, key: str) -> Any:
    raw = request.query.get(key)
    if raw is None:
        return None
    with contextlib.suppress(ValueError):
        return float(raw)
    return raw


def _query_bool(request: web.Request, key: str) -> Any:
    raw = request.query.get(key)
    return {"true": True, "1": True, "false": False, "0": False}.get(raw, raw) \
        if raw is not None else None


class HttpServer:
    """Serves one node's HTTP API, event stream and dashboard; see the module docstring."""

    def __init__(self, *, handler: Handler, subscribe: Subscribe, host: str, port: int,
                 secret: str, node_id: str, max_body_bytes: int = 1 << 20,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        self._handler = handler
        self._ssl = ssl_context
        self._subscribe = subscribe
        self._host = host
        self._port = port
        self._secrets = [secret]
        self._node_id = node_id
        self._runner: web.AppRunner | None = None
        self._sock: socket.socket | None = None
        self._sse_clients = 0
        #: SSE clients dropped because they read too slowly (tests and metrics read it).
        self.dropped_clients = 0
        self._streams: set[web.StreamResponse] = set()
        self._closing = asyncio.Event()
        app = web.Application(client_max_size=max_body_bytes, middlewares=[self._auth])
        r = app.router
        r.add_get("/api/v1/jobs", self._list_jobs)
        r.add_post("/api/v1/jobs", self._put_jobs)
        r.add_get("/api/v1/jobs/{id}", self._get_job)
        r.add_put("/api/v1/jobs/{id}", self._put_job)
        r.add_delete("/api/v1/jobs/{id}", self._delete_job)
        r.add_post("/api/v1/jobs/{id}/pause", self._simple("pause"))
        r.add_post("/api/v1/jobs/{id}/resume", self._simple("resume", ("catch_up",)))
        r.add_post("/api/v1/jobs/{id}/trigger", self._simple("trigger", ("force",)))
        r.add_get("/api/v1/jobs/{id}/runs", self._runs)
        r.add_get("/api/v1/jobs/{id}/next", self._next)
        r.add_get("/api/v1/runs/{run}/logs", self._run_log)
        r.add_post("/api/v1/jobs/{id}/backfill", self._backfill)
        r.add_get("/api/v1/backfills", self._backfills)
        r.add_post("/api/v1/backfills/{bf}/cancel", self._backfill_cancel)
        r.add_post("/api/v1/preview", self._preview)
        r.add_get("/api/v1/status", self._status)
        r.add_get("/api/v1/token", self._token)
        r.add_get("/api/v1/events", self._events)
        r.add_get("/openapi.json", self._openapi)
        r.add_get("/", self._index)
        r.add_static("/static", STATIC_DIR, show_index=False)
        self._app = app

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Listen; OSError when the address is taken."""
        info = socket.getaddrinfo(self._host, self._port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(info[0], socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(info[4])
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        self._sock = sock
        self._runner = web.AppRunner(self._app, access_log=None, handle_signals=False,
                                     shutdown_timeout=1.0)
        await self._runner.setup()
        await web.SockSite(self._runner, sock, ssl_context=self._ssl).start()

    @property
    def scheme(self) -> str:
        """``https`` when the port speaks TLS, else ``http``."""
        return "https" if self._ssl is not None else "http"

    def listening_fds(self) -> list[int]:
        return [self._sock.fileno()] if self._sock is not None else []

    async def close(self) -> None:
        self._closing.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # ------------------------------------------------------------------ auth

    @web.middleware
    async def _auth(self, request: web.Request,
                    handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                    ) -> web.StreamResponse:
        if not request.path.startswith("/api/"):
            resp = await handler(request)
            resp.headers.update(_SECURITY_HEADERS)
            return resp
        role = self._role(request)
        if role is None:
            resp = _error(401, "unauthenticated",
                          "send 'Authorization: Bearer <token>'; `raftsched http-token` "
                          "prints one")
            resp.headers["WWW-Authenticate"] = 'Bearer realm="raftsched"'
            return resp
        if request.method not in ("GET", "HEAD") and role is not Role.admin \
                and request.path not in _READ_POSTS:
            return _error(403, "forbidden", "this token is read-only; writes need the "
                                            "admin token")
        # Audit events name the credential (never the token): see node/service/audit.py.
        presented = request.headers.get("Authorization", "").partition(" ")[2].strip()
        cred = CREDENTIAL.set(Credential(
            name=f"http-{role.value}:{fingerprint(presented)}",
            role=ADMIN if role is Role.admin else READ, key=b""))
        try:
            return await handler(request)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            # aiohttp's own refusals (no such route, method, a body over the limit): the
            # API's JSON error shape too.
            code = {404: "not_found", 413: "frame_too_large"}.get(exc.status,
                                                                  "invalid_argument")
            return _error(exc.status, code, f"{request.method} {request.path[:200]}: "
                                            f"{exc.reason}")
        except RaftschedError as exc:
            return _error(STATUS_OF.get(exc.code, 500), exc.code, str(exc))
        except Exception:
            log.exception("HTTP %s %s failed", request.method, request.path)
            return _error(500, "internal", "internal error; see the node's log")
        finally:
            CREDENTIAL.reset(cred)

    def _role(self, request: web.Request) -> Role | None:
        """What the request's bearer token may do; None without a valid one."""
        scheme, _, presented = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not presented.strip():
            return None
        for secret in self._secrets:  # the used secret first, then any still accepted
            if (role := role_of(secret, presented.strip())) is not None:
                return role
        return None

    def set_secrets(self, secrets: list[str]) -> None:
        """A secret rotation: tokens of every secret of the keyring are accepted."""
        self._secrets = list(secrets)

    # ------------------------------------------------------------------ helpers

    async def _call(self, op: str, args: dict[str, Any], status: int = 200) -> web.Response:
        result = await self._handler(op, {k: v for k, v in args.items() if v is not None})
        return _json(result, status)

    @staticmethod
    async def _body(request: web.Request) -> Any:
        if not request.can_read_body:
            return {}
        raw = await request.read()  # at most client_max_size, else aiohttp answers 413
        try:
            return json.loads(raw.decode("utf-8"))
        except (ValueError, RecursionError) as exc:  # not UTF-8, not JSON, nested too deep
            # Not the exception's text: it may quote the (maybe secret) body.
            raise InvalidArgument("body", f"not a JSON document ({type(exc).__name__})"
                                  ) from None

    @staticmethod
    def _rid(request: web.Request) -> str | None:
        return request.headers.get("Idempotency-Key")

    def _simple(self, op: str, flags: tuple[str, ...] = ()
                ) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def route(request: web.Request) -> web.Response:
            body = await self._body(request)
            if not isinstance(body, dict):
                return _error(400, "invalid_argument", "body: must be a JSON object")
            args: dict[str, Any] = {"id": request.match_info["id"], "rid": self._rid(request)}
            args.update({k: body[k] for k in flags if k in body})
            return await self._call(op, args)
        return route

    # ------------------------------------------------------------------ routes

    async def _list_jobs(self, request: web.Request) -> web.Response:
        return await self._call("list_jobs", {"prefix": request.query.get("prefix"),
                                              "limit": _query_int(request, "limit"),
                                              "stale": _query_bool(request, "stale")})

    async def _get_job(self, request: web.Request) -> web.Response:
        return await self._call("get_job", {"id": request.match_info["id"],
                                            "stale": _query_bool(request, "stale")})

    async def _put_job(self, request: web.Request) -> web.Response:
        spec = await self._body(request)
        job_id = request.match_info["id"]
        if isinstance(spec, dict):
            if "id" not in spec:
                spec = dict(spec, id=job_id)
            elif spec["id"] != job_id:
                return _error(400, "invalid_argument",
                              f"id: the body's id {str(spec['id'])[:64]!r} is not the "
                              f"path's {job_id!r}")
        if _query_bool(request, "dry_run") is True:
            return await self._call("preview_put", {"specs": [spec]})
        result = await self._handler("put_job", {"spec": spec, "rid": self._rid(request)})
        return _json(result, 201 if result.get("created") else 200)

    async def _put_jobs(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        if not isinstance(body, dict):
            return _error(400, "invalid_argument", "body: must be a JSON object")
        if _query_bool(request, "dry_run") is True:
            return await self._call("preview_put", {"specs": body.get("specs")})
        return await self._call("put_jobs", {"specs": body.get("specs"), "atomic": True,
                                             "rid": self._rid(request)})

    async def _delete_job(self, request: web.Request) -> web.Response:
        return await self._call("delete_job", {"id": request.match_info["id"],
                                               "rid": self._rid(request)})

    async def _runs(self, request: web.Request) -> web.Response:
        return await self._call("runs", {"id": request.match_info["id"],
                                         "limit": _query_int(request, "limit"),
                                         "before": _query_int(request, "before"),
                                         "stale": _query_bool(request, "stale")})

    async def _next(self, request: web.Request) -> web.Response:
        return await self._call("next_fires", {"id": request.match_info["id"],
                                               "count": _query_int(request, "count"),
                                               "stale": _query_bool(request, "stale")})

    async def _run_log(self, request: web.Request) -> web.Response:
        """A chunk of a run's full log (the msgpack op's reply, its bytes as ``text``:
        UTF-8, an undecodable byte as U+FFFD; chunks end on whole characters)."""
        result = await self._handler("run_log", {k: v for k, v in {
            "run": request.match_info["run"], "stream": request.query.get("stream"),
            "offset": _query_int(request, "offset"), "limit": _query_int(request, "limit"),
            "attempt": _query_int(request, "attempt"),
            "wait": _query_float(request, "wait")}.items() if v is not None})
        data = result.pop("data", b"")
        result["text"] = data.decode("utf-8", "replace") if isinstance(data, bytes) else ""
        return _json(result)

    async def _backfill(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        if not isinstance(body, dict):
            return _error(400, "invalid_argument", "body: must be a JSON object")
        args = {k: body[k] for k in ("from", "to", "overlap", "max", "rerun") if k in body}
        return await self._call("backfill", dict(args, id=request.match_info["id"],
                                                 rid=self._rid(request)), 201)

    async def _backfills(self, request: web.Request) -> web.Response:
        return await self._call("backfills", {"job": request.query.get("job")})

    async def _backfill_cancel(self, request: web.Request) -> web.Response:
        return await self._call("backfill_cancel", {"backfill": request.match_info["bf"],
                                                    "rid": self._rid(request)})

    async def _token(self, request: web.Request) -> web.Response:
        """What the presented token may do (the dashboard shows buttons accordingly)."""
        return _json({"role": str(self._role(request)), "node": self._node_id})

    async def _preview(self, request: web.Request) -> web.Response:
        """next fire times of a spec that is not (yet) in the cluster: a GET in spirit,
        a POST only to carry the spec; reading needs no admin token."""
        body = await self._body(request)
        if not isinstance(body, dict):
            return _error(400, "invalid_argument", "body: must be a JSON object")
        return await self._call("next_fires", {"spec": body.get("spec"),
                                               "count": body.get("count")})

    async def _status(self, request: web.Request) -> web.Response:
        return await self._call("status", {"stale": _query_bool(request, "stale")})

    async def _openapi(self, request: web.Request) -> web.Response:
        return _json(document())

    async def _index(self, request: web.Request) -> web.FileResponse:
        return web.FileResponse(os.path.join(STATIC_DIR, "index.html"),
                                headers={"Cache-Control": "no-cache"})

    async def _events(self, request: web.Request) -> web.StreamResponse:
        """Server-Sent Events: one ``data:`` JSON object per feed event (its ``seq`` as
        the SSE id). A client that falls SSE_QUEUE events behind is dropped (it gets a
        last ``dropped`` event) rather than buffering without bound. ``?limit=N`` ends the
        stream after N events (for scripts: ``curl ... | head`` would fail on SIGPIPE)."""
        limit = _query_int(request, "limit")
        if limit is not None and (not isinstance(limit, int) or not 0 < limit <= 1_000_000):
            return _error(400, "invalid_argument", "limit: must be 1..1000000 events")
        if self._sse_clients >= MAX_SSE_CLIENTS:
            return _error(429, "overloaded", f"at most {MAX_SSE_CLIENTS} event streams")
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(maxsize=SSE_QUEUE)
        overflow = False

        def push(event: dict[str, Any]) -> None:
            nonlocal overflow
            if overflow:
                return
            try:
                queue.put_nowait(event)
            except asyncio.QueueFull:
                overflow = True

        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-store",
                                           "X-Accel-Buffering": "no"})
        resp.force_close()  # an ended stream ends the connection (a dropped client sees EOF)
        self._sse_clients += 1
        unsubscribe = self._subscribe(push)
        try:
            await resp.prepare(request)
            await resp.write(f": raftsched events from {self._node_id}\n\n".encode())
            await resp.write(("data: " + _dumps({"event": "stream.open", "node": self._node_id})
                              + "\n\n").encode())
            sent = 0  # feed events (stream.open not counted)
            while not self._closing.is_set() and (limit is None or sent < limit):
                try:
                    event = await asyncio.wait_for(queue.get(), SSE_KEEPALIVE_S)
                except TimeoutError:
                    if overflow:
                        break
                    await resp.write(b": keepalive\n\n")
                    continue
                seq = event.get("seq")
                head = f"id: {seq}\n" if seq is not None else ""
                await resp.write((head + "data: " + _dumps(event) + "\n\n").encode())
                sent += 1
                if overflow and queue.empty():
                    break
            if overflow:
                self.dropped_clients += 1
                await resp.write(("data: " + _dumps({"event": "stream.dropped",
                                                     "node": self._node_id,
                                                     "reason": "client too slow"})
                                  + "\n\n").encode())
        except ConnectionResetError:  # the client went away
            pass
        finally:
            unsubscribe()
            self._sse_clients -= 1
        return resp


__all__ = ["STATUS_OF", "HttpServer"]
