"""The guard: a small process beside each node that spawns the node's job processes,
kills them when the node stops answering, and — when the node dies — proves that
nothing of that incarnation runs any more and tells the cluster so.

Why a separate process. A node that loses its quorum stops its own runs (self-fence)
before the leader releases them. A node that is *frozen* (SIGSTOP, a hung interpreter, a
VM pause) cannot, and a node that *dies* (SIGKILL, the OOM killer, a segfault) leaves
its jobs running as orphans. The guard is the node's child, in its own session: a
freeze or a death of the node does not reach it.

Why the guard spawns the jobs. Every job process is forked by the guard (the node sends
it the argv, the environment and the write ends of the stdout and stderr pipes), and
the guard is a *child subreaper* (``PR_SET_CHILD_SUBREAPER``): a job's descendant
whose parent dies — a daemon that double-forks, a grandchild in its own session — is
re-parented to the guard, not to init. So every process the node ever caused to run
is, at any moment, a descendant of the guard, and once the node is gone, killing the
guard's children until it has none (``waitpid`` reports ``ECHILD``) proves that none
of them runs. No process can be started for the node after that: only the node asks
the guard to spawn, and the node is dead (the kernel closed its end of the socket:
that is how the guard knows).

The certificate. Then the guard sends ``certify(node, incarnation)`` to any member it
can reach, authenticated with the cluster secret (the API handshake, and an HMAC of the
claim itself), and the cluster releases that incarnation's runs at once
(:func:`raftsched.core.nodes.apply_certify`) instead of waiting until the node's lease
has provably ended. A guard that cannot prove it — a child that will not die (stuck in
uninterruptible sleep), no subreaper on this kernel, the node frozen rather than dead —
sends nothing, and the lease applies as before.

While the node runs, it keeps moving a deadline forward (on the host's monotonic clock,
which both processes share): the instant its own self-fence would have ended its runs,
counted from its last acknowledged heartbeat, always before the leader may release
them. Past it the guard SIGKILLs every process of the node's (a frozen node cannot be
asked to do it gracefully) and says so in the run's exit report.

The guard process is :mod:`~raftsched.node.worker.guardproc` (started by path, isolated); this
module is the node's side of it.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import struct
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from raftsched.node.worker import guardproc
from raftsched.node.worker.guardproc import MAX_MESSAGE, proof

log = logging.getLogger("raftsched.guard")

#: Seconds a send to the guard may block before the guard counts as gone.
_SEND_TIMEOUT_S = 5


# ------------------------------------------------------------------ the node's side

@dataclass(frozen=True, slots=True, kw_only=True)
class Exit:
    """How a job process the guard spawned ended.

    :var code: its exit status as :attr:`subprocess.Popen.returncode` gives it
        (negative: killed by that signal).
    :var killed: the guard's reason when the guard killed it (the node was frozen past
        its self-fence); None otherwise.
    """

    code: int
    killed: str | None


class Guard:
    """The node's side: starts the guard process and talks to it. Every method runs on
    the node's event loop once :meth:`attach` was called (before that, only
    :meth:`hello` and :meth:`deadline`)."""

    def __init__(self) -> None:
        import msgpack

        self._pack, self._unpack = msgpack.packb, msgpack.unpackb
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        # The folder holding the package (raftsched/node/worker/guard.py, three up).
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
            os.path.abspath(__file__)))))
        try:
            self.proc: subprocess.Popen[bytes] | None = subprocess.Popen(
                # By path, isolated: the guard must not run the embedding app's site
                # hooks or environment; it imports only the client, from the package root.
                [sys.executable, "-I", os.path.abspath(guardproc.__file__), str(theirs.fileno()),
                 root],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, pass_fds=[theirs.fileno()],
                start_new_session=True, close_fds=True)
        except BaseException:
            mine.close()
            raise
        finally:
            theirs.close()
        # Sends block (a spawn must reach the guard), but never for long: a guard that
        # reads nothing for this long is treated as gone. Reads never block (MSG_DONTWAIT).
        mine.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO,
                        struct.pack("ll", _SEND_TIMEOUT_S, 0))
        self.sock: socket.socket | None = mine
        self._next_id = 0
        self._spawns: dict[int, asyncio.Future[int]] = {}
        self._exits: dict[int, asyncio.Future[Exit]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        #: Called once if the guard process goes away while the node runs.
        self.on_lost: Callable[[], None] | None = None

    @property
    def alive(self) -> bool:
        return self.sock is not None

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start reading the guard's reports on ``loop`` (the node's event loop)."""
        self._loop = loop
        if self.sock is not None:
            loop.add_reader(self.sock.fileno(), self._readable)

    def _send(self, msg: dict[str, Any], fds: tuple[int, ...] = ()) -> None:
        sock = self.sock
        if sock is None:
            raise BrokenPipeError("the guard process is gone")
        data = self._pack(msg)
        try:
            if fds:
                socket.send_fds(sock, [data], list(fds))
            else:
                sock.send(data)
        except OSError as exc:
            self._gone(exc)
            raise BrokenPipeError("the guard process is gone") from exc

    def hello(self, *, node: str, boot: int, api: str, members: list[str],
              secrets: list[str], cluster_id: str, tls_ca: str | None,
              give_up_s: float) -> None:
        """What the guard needs to certify this incarnation's death: who it is, where the
        other members are, and the secret to prove it with (never on argv or in the
        environment: only through this private socket)."""
        with contextlib.suppress(BrokenPipeError):
            self._send({"t": "hello", "node": node, "boot": boot, "api": api,
                        "members": members, "secrets": secrets, "cluster_id": cluster_id,
                        "tls_ca": tls_ca, "give_up_s": give_up_s})

    def deadline(self, monotonic_s: float) -> None:
        """Kill the node's processes if the node has not moved this on by then."""
        with contextlib.suppress(BrokenPipeError):
            self._send({"t": "deadline", "at": monotonic_s})

    async def spawn(self, argv: list[str], env: Mapping[str, str], output_fd: int, *,
                    fence: int, run_id: str, err_fd: int | None = None) -> int:
        """Have the guard start ``argv`` in its own session with stdout on ``output_fd``
        and stderr on ``err_fd`` (None: on ``output_fd`` too); its pid. Raises
        :class:`OSError` as :class:`subprocess.Popen` would (a missing program,
        permissions)."""
        assert self._loop is not None
        self._next_id += 1
        req = self._next_id
        fut: asyncio.Future[int] = self._loop.create_future()
        self._spawns[req] = fut
        try:
            self._send({"t": "spawn", "id": req, "argv": list(argv), "env": dict(env),
                        "fence": fence, "run": run_id},
                       (output_fd,) if err_fd is None else (output_fd, err_fd))
            return await fut
        finally:
            self._spawns.pop(req, None)

    def exited(self, pid: int) -> asyncio.Future[Exit]:
        """The future of how ``pid`` (a spawn's) ends."""
        assert self._loop is not None
        fut = self._exits.get(pid)
        if fut is None:
            fut = self._exits[pid] = self._loop.create_future()
        return fut

    def kill(self, pid: int, sig: int) -> None:
        """Signal the process group of job ``pid`` (only while it is ours: the guard
        knows when it was reaped)."""
        with contextlib.suppress(BrokenPipeError):
            self._send({"t": "kill", "pid": pid, "sig": int(sig)})

    def _readable(self) -> None:
        sock = self.sock
        if sock is None:
            return
        while True:
            try:
                data = sock.recv(MAX_MESSAGE, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return
            except OSError as exc:
                self._gone(exc)
                return
            if not data:
                self._gone(None)
                return
            msg = self._unpack(data)
            kind = msg.get("t")
            if kind == "spawned":
                fut = self._spawns.get(msg["id"])
                if fut is not None and not fut.done():
                    fut.set_result(msg["pid"])
            elif kind == "refused":
                fut = self._spawns.get(msg["id"])
                if fut is not None and not fut.done():
                    fut.set_exception(OSError(msg["errno"], msg["error"], msg["filename"]))
            elif kind == "exited":
                ex = self.exited(msg["pid"])
                if not ex.done():
                    ex.set_result(Exit(code=msg["code"], killed=msg["killed"]))

    def forget(self, pid: int) -> None:
        """The executor has read how ``pid`` ended."""
        self._exits.pop(pid, None)

    def _gone(self, exc: BaseException | None) -> None:
        sock, self.sock = self.sock, None
        if sock is None:
            return
        if self._loop is not None:
            with contextlib.suppress(Exception):
                self._loop.remove_reader(sock.fileno())
        sock.close()
        log.warning("the guard process is gone (%s): this node's runs are stopped and a "
                    "frozen node's jobs would keep running", exc or "closed")
        err = BrokenPipeError("the guard process is gone")
        for fut in list(self._spawns.values()):
            if not fut.done():
                fut.set_exception(err)
        for pid, ex in list(self._exits.items()):
            if not ex.done():
                # Orphaned (init is their parent now), not yet reaped: the pid is theirs.
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)
                ex.set_result(Exit(code=-signal.SIGKILL, killed="the guard process died"))
        if self.on_lost is not None:
            self.on_lost()

    def close(self) -> None:
        """Stop the guard (the node has stopped its runs itself): it kills what is left,
        proves it and certifies this incarnation dead."""
        sock, self.sock = self.sock, None
        if sock is not None:
            if self._loop is not None:
                with contextlib.suppress(Exception):
                    self._loop.remove_reader(sock.fileno())
            sock.close()
        # Not waited for: it goes on to prove and certify this incarnation's end.
        self.proc = None


__all__ = ["MAX_MESSAGE", "Exit", "Guard", "proof"]
