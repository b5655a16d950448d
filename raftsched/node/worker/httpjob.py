"""Running an HTTP job: one request per attempt, made by the node on its event loop.

The request carries the run's identity as headers — ``Raftsched-Run-Id``,
``Raftsched-Fence``, ``Raftsched-Attempt``, ``Raftsched-Scheduled-At`` (RFC 3339,
UTC), ``Raftsched-Job-Id`` and ``Raftsched-Node-Id`` — so the receiver can refuse an
attempt whose fence is lower than one it has seen (a stale attempt of a node that was
cut off or frozen). Header values and the body have the job's ``${NAME}`` references
filled in from its env here, and nowhere else: nothing logged holds them.

TLS is always verified: against the system's CAs, or the spec's ``ca`` bundle. There is
no way to turn verification off. Redirects are not followed (a 3xx is the response: a
redirect would send the fence and the body to another address). The response body is
streamed into the run's output (its log, and the tail of the run record); the log's
stderr gets one line saying what was asked and what came back.

aiohttp is imported at the first HTTP run, in a thread: a node without HTTP jobs does not
pay for it, and the import (0.4 s of CPU, seconds on a loaded host) must not hold the
node's event loop, whose heartbeats keep its lease (a node whose loop stalled past its
lease stops its own runs).
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import ssl
import time
from typing import TYPE_CHECKING, Any

from raftsched.core.httpspec import HttpSpec, expand

if TYPE_CHECKING:
    from raftsched.node.worker.output import Output
    from raftsched.node.worker.runtypes import RunContext

#: Bytes read from a response at once.
_CHUNK = 65536
#: Connections one HTTP run may open (it makes one request; redirects are not followed).
_CONNECTIONS = 4


class RequestFailed(Exception):
    """The request got no response (refused, TLS, DNS, a reset); ``reason`` says why in
    words safe to record (no header value, no body)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason[:200]


#: What the first HTTP run loads, in a thread: aiohttp and the User-Agent.
_loaded: tuple[Any, str] | None = None
#: Verifying client contexts by CA bundle (None: the system's), made in a thread.
_contexts: dict[str | None, ssl.SSLContext] = {}


def _load() -> tuple[Any, str]:
    from importlib.metadata import PackageNotFoundError, version
    aiohttp = importlib.import_module("aiohttp")
    try:
        agent = f"raftsched/{version('raftsched')}"
    except PackageNotFoundError:
        agent = "raftsched"
    return aiohttp, agent


async def _loaded_once() -> tuple[Any, str]:
    global _loaded
    if _loaded is None:
        _loaded = await asyncio.to_thread(_load)
    return _loaded


@functools.lru_cache(maxsize=64)
def tls_context(ca: str | None) -> ssl.SSLContext:
    """A verifying client context: the system's CAs, or only those of bundle ``ca``
    (cached: loading a CA store costs milliseconds; a changed file needs a restart)."""
    return ssl.create_default_context(cafile=ca)


async def _tls(ca: str | None) -> ssl.SSLContext:
    found = _contexts.get(ca)
    if found is None:
        found = _contexts[ca] = await asyncio.to_thread(tls_context, ca)
    return found


def headers_for(spec: HttpSpec, ctx: RunContext, env: dict[str, str],
                agent: str = "raftsched") -> dict[str, str]:
    """The request's headers: the spec's (env references filled in), then the run's."""
    out = {name: expand(value, env) for name, value in spec.headers}
    if not any(name.lower() == "user-agent" for name in out):
        out["User-Agent"] = agent
    out.update({"Raftsched-Job-Id": ctx.job_id, "Raftsched-Run-Id": ctx.run_id,
                "Raftsched-Fence": str(ctx.fence), "Raftsched-Attempt": str(ctx.attempt),
                "Raftsched-Scheduled-At": ctx.scheduled_at,
                "Raftsched-Node-Id": ctx.node_id})
    return out


async def request(spec: HttpSpec, ctx: RunContext, env: dict[str, str],
                  output: Output) -> tuple[int, str]:
    """Make the request; its status and the run's reason (``http 503``). The body goes
    into ``output``. Raises :class:`RequestFailed` when no response came."""
    aiohttp, agent = await _loaded_once()
    try:
        tls = await _tls(spec.ca) if spec.url[:6].lower() == "https:" else None
    except OSError as exc:  # the bundle is missing or unreadable on this node
        raise RequestFailed(f"http.ca {spec.ca}: {exc.strerror or exc}") from None
    except ssl.SSLError as exc:
        raise RequestFailed(f"http.ca {spec.ca}: not a PEM CA bundle ({exc.reason})") from None
    body = None if spec.body is None else expand(spec.body, env).encode("utf-8")
    began = time.monotonic()
    connector = aiohttp.TCPConnector(ssl=tls if tls is not None else True,
                                     limit=_CONNECTIONS, force_close=True)
    try:
        # No timeout of aiohttp's own (5 min): the run's timeout bounds the request.
        async with aiohttp.ClientSession(connector=connector, trust_env=False,
                                         timeout=aiohttp.ClientTimeout(total=None)
                                         ) as session:
            async with session.request(spec.method, spec.url,
                                       headers=headers_for(spec, ctx, env, agent), data=body,
                                       allow_redirects=False) as resp:
                async for chunk in resp.content.iter_chunked(_CHUNK):
                    output.add(chunk)
                status, words = resp.status, resp.reason or ""
    except aiohttp.ClientError as exc:
        # The URL is the spec's as written (no env value in it); headers never appear.
        raise RequestFailed(_why(exc)) from None
    took = (time.monotonic() - began) * 1000
    if output.log is not None:
        output.log.write(f"raftsched: {spec.method} {spec.url} -> {status} {words} "
                         f"({took:.0f} ms)\n".encode(), True)
    return status, f"http {status}"


def _why(exc: Any) -> str:
    """A short reason for a request that got no response."""
    import aiohttp  # loaded by now

    if isinstance(exc, aiohttp.ClientConnectorCertificateError):
        err = exc.certificate_error
        return (f"tls: the certificate of {exc.host} is not trusted: "
                f"{getattr(err, 'verify_message', None) or err}")
    if isinstance(exc, aiohttp.ClientSSLError):
        return f"tls: {exc}"[:200]
    if isinstance(exc, aiohttp.ClientConnectorError):
        return f"cannot connect to {exc.host}:{exc.port}: {exc.os_error.strerror or exc.os_error}"
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "the server closed the connection before it answered"
    return f"{type(exc).__name__}: {exc}"[:200]


__all__ = ["RequestFailed", "headers_for", "request", "tls_context"]
