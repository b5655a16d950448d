"""A small synchronous client of the raftsched API: the ops, and failover across nodes.

One connection is kept open and reused (:mod:`raftsched.wire.clientconn` dials it and
runs the handshake): on connect the client says ``hello`` and the two sides prove the
cluster secret to each other (:mod:`raftsched.wire.session`): a node that does not ask
for it, or cannot prove it, is refused as an impostor before anything else is sent.
Without TLS every later frame is sealed (AES-GCM); with a CA (``tls_ca``,
``$RAFTSCHED_TLS_CA``) the connection is TLS, and the node's certificate must be signed
by that CA for the address dialled. The secret is the one given, else
``$RAFTSCHED_SECRET`` (or the variable ``secret_env`` names), else a secret file found
as :mod:`raftsched.wire.secretfile` describes (a node's generated secret, for a client
of the same user on its host). With ``cluster_id`` the client refuses a node of any
other cluster. When a node is unreachable, or answers ``not_ready``/``unavailable``,
the same request goes to the next address. Write ops carry a client-made ``rid`` that
stays the same across those retries, so the cluster applies each call once.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any

from raftsched.core.errors import (
    InvalidArgument,
    NotReady,
    ProtocolError,
    RaftschedError,
    Unauthenticated,
    Unavailable,
)
from raftsched.wire.clientconn import (
    HELLO_WAIT_S,
    MAX_REPLY_BYTES,
    TLS_CA_ENV,
    NodeConnection,
    NotTheApi,
)
from raftsched.wire.credentials import Role, token

log = logging.getLogger(__name__)

DEFAULT_ADDR = "127.0.0.1:7101"
DEFAULT_SECRET_ENV = "RAFTSCHED_SECRET"
#: Ops that change state; they carry a ``rid`` so a retry after failover is not re-applied.
WRITE_OPS = frozenset({"put_job", "put_jobs", "apply", "delete_job", "pause", "resume", "trigger",
                       "drain", "transfer_leader", "add_node", "remove_node", "certify",
                       "backfill", "backfill_cancel"})
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


class Client(NodeConnection):
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
        super().__init__(parse_addrs(addrs), secret=secret, cluster_id=cluster_id,
                         secret_env=secret_env, tls_ca=tls_ca)
        self._timeout = float(timeout)
        self._lock = threading.Lock()

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

    def backfill(self, job_id: str, start: str | int, end: str | int, *,
                 overlap: str = "queue", max_active: int = 1, rerun: bool = False) -> Any:
        """Run the job's fire times in ``start..end`` (RFC 3339 or epoch ms) once each, as
        one backfill; returns its view (``id`` ``bf-<n>``)."""
        return self.call("backfill", id=job_id, overlap=overlap, max=max_active, rerun=rerun,
                         **{"from": start, "to": end})

    def backfill_cancel(self, backfill_id: str) -> Any:
        return self.call("backfill_cancel", backfill=backfill_id)

    def backfills(self, job_id: str | None = None) -> Any:
        """Running and recently finished backfills, newest first."""
        return self.call("backfills", **({} if job_id is None else {"job": job_id}))

    def runs(self, job_id: str, limit: int = 100, *, stale: bool = False,
             before: int | None = None) -> Any:
        """Newest first; ``before`` (a page's last ``scheduled_ms``) gives the next page."""
        extra = {} if before is None else {"before": before}
        return self.call("runs", id=job_id, limit=limit, **_stale(stale), **extra)

    def run_log(self, run_id: str, *, stderr: bool = False, offset: int = 0,
                limit: int | None = None, attempt: int | None = None,
                wait: float = 0.0) -> Any:
        """A chunk of a run's full log (stdout, or ``stderr``), from the node that ran the
        attempt (the newest one that ran, or ``attempt``): ``data`` (bytes), its
        ``offset`` (negative asks for the end), ``next_offset``, the stream's ``size``,
        ``sizes`` of both streams, ``node``, ``attempt``, and ``done`` (the log will not
        grow); ``wait`` (<= 10 s) keeps the call open until there is more or the end."""
        args: dict[str, Any] = {"run": run_id, "stream": "stderr" if stderr else "stdout",
                                "offset": offset, "wait": wait}
        if limit is not None:
            args["limit"] = limit
        if attempt is not None:
            args["attempt"] = attempt
        return self.call("run_log", **args)

    def read_log(self, run_id: str, *, stderr: bool = False,
                 attempt: int | None = None) -> bytes:
        """The whole log of a run's stream as it is now (see :meth:`run_log`)."""
        parts: list[bytes] = []
        offset = 0
        while True:
            reply = self.run_log(run_id, stderr=stderr, offset=offset, attempt=attempt)
            parts.append(reply["data"])
            attempt = reply["attempt"]  # the same attempt for every chunk
            if not reply["data"] or reply["next_offset"] >= reply["size"]:
                return b"".join(parts)
            offset = reply["next_offset"]

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

    def http_token(self, *, read_only: bool = False) -> str:
        """A bearer token for the cluster's HTTP API, derived from the secret this client
        proved to a node (it connects first if it has not yet)."""
        if self._proven is None:
            self.call("ping")
        if self._proven is None:
            raise Unauthenticated("the node asked for no secret: no token can be derived")
        return token(self._proven, Role.read if read_only else Role.admin)


def _stale(stale: bool) -> dict[str, Any]:
    return {"stale": True} if stale else {}


def _describe(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "timed out"
    return getattr(exc, "strerror", None) or str(exc) or type(exc).__name__


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


#: Kept importable from here (they moved to clientconn with the connection they govern).
__all__ = ["DEFAULT_ADDR", "DEFAULT_SECRET_ENV", "FAILOVER_CODES", "HELLO_WAIT_S",
           "MAX_REPLY_BYTES", "MAX_ROUNDS", "TLS_CA_ENV", "WRITE_OPS", "Client", "NotTheApi",
           "parse_addrs"]
