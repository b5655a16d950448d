"""The ``run_log`` operation: a run's full log, read from the node that holds it.

A run's log is on the disk of the node that ran the attempt (raftsched/node/worker/runlog.py),
and the run record names that node. Any node answers: it finds the attempt in its
replica (the current run, or the attempts kept in the job's history), serves the log
itself when it ran that attempt, and otherwise asks the node that did, over the API
with the cluster secret. A node that does not answer is named in the error
(``node_unavailable``): the log is on its disk, nowhere else.

Reading is in chunks (``offset``/``limit``; a negative offset counts from the end) of
one stream, ``stdout`` or ``stderr``. ``done`` says the log will not grow any more (the
attempt has ended); until then a reader polls with the reply's ``next_offset``, and
``wait`` lets the holder keep a poll open (up to 10 s) until there is more, or the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from raftsched.core import queries
from raftsched.core.errors import (
    InvalidArgument,
    NodeUnavailable,
    RaftschedError,
    UnknownRun,
)
from raftsched.node.worker.runlog import STREAMS, split_run_id

if TYPE_CHECKING:
    from raftsched.core.machine import ClusterState
    from raftsched.node.replica.port import ReplicaPort
    from raftsched.node.replica.reads import ReadBarrier
    from raftsched.node.worker.runlog import RunLogs

Op = Callable[[dict[str, Any]], Awaitable[Any]]

#: Bytes per reply when the caller names no limit, and at most.
DEFAULT_LIMIT = 256 * 1024
MAX_LIMIT = 1024 * 1024
#: The longest a poll may be kept open for more output.
MAX_WAIT_S = 10.0
#: How often a kept-open poll looks at the file again.
_POLL_S = 0.1
#: Asks of other nodes at once. Each runs on a daemon thread of its own, not the loop's
#: shared executor: a follower's poll is kept open for seconds, and must neither queue
#: the node's other work done in threads (webhooks, secret reloads, member checks)
#: behind it nor hold up the node's exit.
MAX_ASKS = 16
#: The states in which an attempt may still write to its log.
_ACTIVE = frozenset({"assigned", "started"})


@dataclass(frozen=True, slots=True)
class Attempt:
    """One attempt of a run as the replica knows it: its number, node (None: never
    placed), state and fence."""

    attempt: int
    node: str | None
    state: str
    fence: int


def attempts(run_id: str, job_id: str, st: ClusterState) -> list[Attempt]:
    """Every attempt of ``run_id`` the state holds, oldest first (under the lock: the
    run, then the job's bounded history)."""
    out = [Attempt(r.attempt, r.node, r.state, r.fence)
           for r in st.history.get(job_id, ()) if r.run_id == run_id]
    run = st.runs.get(run_id)
    if run is not None:
        out.append(Attempt(run.attempt, run.node, run.state, run.fence))
    return sorted(out, key=lambda a: a.attempt)


def pick(found: list[Attempt], wanted: int | None) -> Attempt | None:
    """The attempt asked for, else the newest one that was placed on a node, else the
    newest (a run never placed)."""
    if wanted is not None:
        return next((a for a in reversed(found) if a.attempt == wanted), None)
    placed = [a for a in found if a.node is not None]
    return placed[-1] if placed else (found[-1] if found else None)


class LogOps:
    """See the module docstring; every method runs on the node's event loop.

    :param raft: the replica (which node ran which attempt).
    :param reads: the read barrier, for a run this replica does not know yet.
    :param logs: this node's logs.
    :param node_id: this node.
    :param secret: the cluster secret in use (read at each call: a rotation changes it).
    :param tls_ca: the CA of a TLS cluster (None: frames sealed with the secret).
    :param cluster_id: the cluster's id; a node of another cluster is not asked.
    """

    def __init__(self, *, raft: ReplicaPort, reads: ReadBarrier, logs: RunLogs, node_id: str,
                 secret: Callable[[], str | None], tls_ca: str | None,
                 cluster_id: Callable[[], str | None]) -> None:
        self.raft = raft
        self.reads = reads
        self.logs = logs
        self.node_id = node_id
        self.secret = secret
        self.tls_ca = tls_ca
        self.cluster_id = cluster_id
        self._asks = asyncio.Semaphore(MAX_ASKS)

    def ops(self) -> dict[str, Op]:
        return {"run_log": self.run_log}

    async def adopt(self) -> None:
        """At start: index the logs a previous incarnation left, and prune them to the
        limits (the scan is in a thread: a node may hold many files)."""
        self.logs.adopt(await asyncio.to_thread(self.logs.scan))

    def ask(self, node: str, api: str, args: dict[str, Any]) -> Any:
        """``run_log`` on member ``node`` at ``api`` (blocking: called in a thread)."""
        from raftsched.wire.client import Client

        timeout = float(args.get("wait") or 0) + 5.0
        with Client([api], secret=self.secret(), timeout=timeout, tls_ca=self.tls_ca or "",
                    cluster_id=self.cluster_id()) as client:
            return client.call("run_log", **args)

    async def run_log(self, args: dict[str, Any]) -> dict[str, Any]:
        run_id, job_id, ms, req = _args(args)
        found = self.raft.read(functools.partial(attempts, run_id, job_id))
        if not found and args.get("local") is not True:
            await self.reads.wait()  # a run this replica may not have applied yet
            found = self.raft.read(functools.partial(attempts, run_id, job_id))
        if not found:
            raise UnknownRun(run_id, f"no run {run_id!r} in the cluster's state (a job's "
                                     "history keeps its last runs: limits.history_limit)")
        chosen = pick(found, req["attempt"])
        if chosen is None:
            raise InvalidArgument("attempt", f"run {run_id} has no attempt {req['attempt']} "
                                             f"(attempts: {[a.attempt for a in found]})")
        head = {"run_id": run_id, "job_id": job_id, "attempt": chosen.attempt,
                "attempts": [a.attempt for a in found], "node": chosen.node,
                "state": chosen.state, "stream": STREAMS[req["stream"]]}
        if chosen.node is None:
            # Never placed (pending, or missed/skipped before it ran): nothing written.
            return dict(head, offset=0, next_offset=0, size=0, data=b"",
                        sizes=dict.fromkeys(STREAMS, 0), removed=None,
                        done=chosen.state not in ("pending", "queued"))
        if chosen.node == self.node_id or args.get("local") is True:
            return dict(await self._local(run_id, ms, chosen, req), **head)
        return await self._forward(chosen, head, args)

    async def _local(self, run_id: str, ms: int, chosen: Attempt,
                     req: dict[str, Any]) -> dict[str, Any]:
        key = (run_id.rpartition("@")[0], ms, chosen.attempt)
        deadline = time.monotonic() + req["wait"]
        while True:
            part = await asyncio.to_thread(self.logs.read, key, req["stream"], req["offset"],
                                           req["limit"])
            part["done"] = not part.pop("writing") and not self._may_write(run_id, chosen)
            if part["data"] or part["done"] or time.monotonic() >= deadline:
                return part
            await asyncio.sleep(_POLL_S)

    def _may_write(self, run_id: str, chosen: Attempt) -> bool:
        """Is the attempt still placed here (assigned and about to begin, or started and
        not yet ended)? Then its log may still grow, though no writer is open yet."""
        me = self.node_id

        def active(st: ClusterState) -> bool:
            run = st.runs.get(run_id)
            return (run is not None and run.attempt == chosen.attempt
                    and run.fence == chosen.fence and run.node == me
                    and run.state in _ACTIVE)

        return bool(self.raft.read(active))

    async def _forward(self, chosen: Attempt, head: dict[str, Any],
                       args: dict[str, Any]) -> dict[str, Any]:
        node = chosen.node
        assert node is not None
        api = self.raft.read(partial(queries.node_api, node))
        where = f"the log of {head['run_id']} (attempt {chosen.attempt}) is on node {node}"
        if not api:
            raise NodeUnavailable(node, f"{where}, whose API address is not known")
        fwd = {k: v for k, v in args.items() if k in _ARGS}
        fwd.update(attempt=chosen.attempt, local=True)
        try:
            async with self._asks:
                reply = await _on_daemon_thread(self.ask, node, api, fwd)
        except RaftschedError as exc:
            if exc.code in ("unavailable", "not_ready", "wrong_cluster", "unauthenticated"):
                raise NodeUnavailable(node, f"{where}, which does not answer at {api} "
                                            f"({exc.message[:200]})") from None
            if exc.code == "invalid_argument" and "unknown operation" in exc.message:
                raise NodeUnavailable(node, f"{where}, which runs an older raftsched that "
                                            "cannot serve run logs") from None
            raise
        except OSError as exc:
            raise NodeUnavailable(node, f"{where}, which does not answer at {api} "
                                        f"({exc.strerror or exc})") from None
        return dict(reply, **head)


def _on_daemon_thread(fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
    """``fn(*args)`` on a daemon thread of its own; its result (or exception) as a future
    of the running loop (nobody hears of it if the loop has closed meanwhile)."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[Any] = loop.create_future()

    def settle(value: Any, exc: BaseException | None) -> None:
        if not fut.done():
            if exc is None:
                fut.set_result(value)
            else:
                fut.set_exception(exc)

    def run() -> None:
        try:
            value, exc = fn(*args), None
        except BaseException as e:  # noqa: BLE001 - handed to the awaiting coroutine
            value, exc = None, e
        with contextlib.suppress(RuntimeError):  # the loop has closed
            loop.call_soon_threadsafe(settle, value, exc)

    threading.Thread(target=run, name="run-log-ask", daemon=True).start()
    return fut


_ARGS = ("run", "attempt", "stream", "offset", "limit", "wait")


def _args(args: dict[str, Any]) -> tuple[str, str, int, dict[str, Any]]:
    run_id = args.get("run")
    parts = split_run_id(run_id) if isinstance(run_id, str) and len(run_id) <= 160 else None
    if parts is None:
        raise InvalidArgument("run", "must be a run id, <job_id>@<scheduled_ms>")
    stream = args.get("stream", "stdout")
    if stream not in STREAMS:
        raise InvalidArgument("stream", "must be stdout or stderr")
    out: dict[str, Any] = {"stream": STREAMS.index(stream)}
    for key, lo, hi, default in (("offset", -(1 << 62), 1 << 62, 0),
                                 ("limit", 1, MAX_LIMIT, DEFAULT_LIMIT),
                                 ("attempt", 1, 1 << 31, None)):
        value = args.get(key, default)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or not lo <= value <= hi):
            raise InvalidArgument(key, f"must be an integer in {lo}..{hi}")
        out[key] = value
    wait = args.get("wait", 0)
    if isinstance(wait, bool) or not isinstance(wait, (int, float)) or not 0 <= wait <= MAX_WAIT_S:
        raise InvalidArgument("wait", f"must be 0..{MAX_WAIT_S:g} seconds")
    out["wait"] = float(wait)
    return str(run_id), parts[0], parts[1], out


__all__ = ["DEFAULT_LIMIT", "MAX_LIMIT", "Attempt", "LogOps", "attempts", "pick"]
