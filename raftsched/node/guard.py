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

Run as ``python -I path/to/guard.py FD PACKAGE_ROOT``: FD is its end of a
``SOCK_SEQPACKET`` socket pair; each message is one msgpack map (see :class:`Guard`).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import hashlib
import hmac
import logging
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("raftsched.guard")

#: Seconds between checks of the deadline and of children that ended.
_POLL_S = 0.05
#: The longest the guard sleeps with nothing to do (no job, or a deadline far off).
_IDLE_S = 1.0
#: How long the guard tries to prove a dead node's processes are all gone.
_PROOF_S = 5.0
#: A group whose leader ended is still signalled on request this long after (its
#: members may hold the output pipe); after that its id may belong to someone else.
_GROUP_KEPT_S = 5.0
#: Seconds a send to the guard may block before the guard counts as gone.
_SEND_TIMEOUT_S = 5
#: The largest message either side sends (a spawn carries argv and the environment).
MAX_MESSAGE = 1 << 20
_PR_SET_CHILD_SUBREAPER = 36


def proof(secret: str, cluster_id: str, node: str, boot: int) -> str:
    """The HMAC a death certificate carries: only a holder of the secret can claim that
    incarnation ``boot`` of ``node`` in cluster ``cluster_id`` is dead."""
    msg = f"raftsched certify v1|{cluster_id}|{node}|{boot}".encode()
    return hmac.new(secret.encode("utf-8"), msg, hashlib.sha256).hexdigest()


# ------------------------------------------------------------------ the guard process

@dataclass(slots=True)
class _Job:
    fence: int
    run_id: str
    proc: subprocess.Popen[bytes]
    killed: str | None = None


@dataclass(slots=True)
class _GuardState:
    sock: socket.socket
    subreaper: bool
    jobs: dict[int, _Job] = field(default_factory=dict)
    ended_groups: dict[int, float] = field(default_factory=dict)
    deadline: float = float("inf")
    hello: dict[str, Any] = field(default_factory=dict)


def main(argv: list[str]) -> int:
    import msgpack

    sock = socket.socket(fileno=int(argv[0]))
    if len(argv) > 1 and argv[1] not in sys.path:
        sys.path.insert(0, argv[1])  # the package, for the certificate's client
    g = _GuardState(sock=sock, subreaper=_become_subreaper())
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's ^C is for the node
    send_certificate = _certificate_sender()
    while True:
        # Messages and ended children wake it; the clock only matters near the deadline
        # of a node that has jobs (an idle guard looks once a second).
        wait = min(max(g.deadline - time.monotonic(), _POLL_S), _IDLE_S) if g.jobs else _IDLE_S
        ready, _, _ = select.select([sock.fileno(), wake_r], [], [], wait)
        if wake_r in ready:
            with contextlib.suppress(BlockingIOError):
                os.read(wake_r, 4096)
        if sock.fileno() in ready:
            try:
                data, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE, 4)
            except OSError:
                data, fds = b"", []
            if not data:
                _on_node_death(g, send_certificate)
                return 0
            try:
                _handle(g, msgpack.unpackb(data), fds, msgpack.packb)
            finally:
                for fd in fds:
                    with contextlib.suppress(OSError):
                        os.close(fd)
        _reap(g, msgpack.packb)
        late = time.monotonic() - g.deadline
        if late > 0 and (g.jobs or _children()):
            _kill_everything(g, f"guard: node unresponsive ({late:.1f}s past its self-fence)")


def _become_subreaper() -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _certificate_sender() -> Callable[[dict[str, Any]], bool] | None:
    """The function that sends a certificate, imported now (not when the node dies:
    the client's import costs more than the whole release is meant to take)."""
    try:
        from raftsched.wire.client import Client
    except Exception as exc:  # noqa: BLE001 - no certificates then; the lease still holds
        sys.stderr.write(f"raftsched guard: cannot load the client ({exc}); a dead node's "
                         "runs will wait for its lease\n")
        return None

    def send(hello: dict[str, Any]) -> bool:
        node, boot = hello["node"], hello["boot"]
        secrets = hello.get("secrets") or []
        members = [a for a in hello.get("members") or [] if a != hello.get("api")]
        if not secrets or not members:
            return False
        give_up = time.monotonic() + float(hello.get("give_up_s", 10.0))
        rid = f"certify-{node}-{boot}"[:64]
        while time.monotonic() < give_up:
            try:
                with Client(members, secret=secrets[0], tls_ca=hello.get("tls_ca"),
                            cluster_id=hello.get("cluster_id"),
                            timeout=max(0.5, min(3.0, give_up - time.monotonic()))) as cl:
                    reply = cl.call("certify", node=node, boot=boot, rid=rid,
                                    proof=proof(secrets[0], hello.get("cluster_id") or "",
                                                node, boot))
                sys.stderr.write(f"raftsched guard: certified {node} incarnation {boot} "
                                 f"dead ({len(reply.get('released', []))} runs released)\n")
                return True
            except Exception as exc:  # noqa: BLE001 - refused, or no member answered
                code = getattr(exc, "code", "")
                if code in ("conflict", "invalid_argument", "unauthenticated", "forbidden",
                            "unsupported"):
                    sys.stderr.write(f"raftsched guard: certificate refused: {exc}\n")
                    return False
                time.sleep(0.1)
        return False

    return send


def _handle(g: _GuardState, msg: Any, fds: list[int], pack: Callable[[Any], bytes]) -> None:
    if not isinstance(msg, dict):
        return
    kind = msg.get("t")
    if kind == "spawn":
        _spawn(g, msg, fds, pack)
    elif kind == "kill":
        pid, sig = msg.get("pid"), msg.get("sig")
        if isinstance(pid, int) and isinstance(sig, int) and (
                pid in g.jobs or time.monotonic() - g.ended_groups.get(pid, -1e9)
                < _GROUP_KEPT_S):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, sig)
    elif kind == "deadline":
        at = msg.get("at")
        if isinstance(at, (int, float)):
            g.deadline = float(at)
    elif kind == "hello":
        g.hello = msg


def _spawn(g: _GuardState, msg: dict[str, Any], fds: list[int],
           pack: Callable[[Any], bytes]) -> None:
    req = msg.get("id")
    out = fds[0] if fds else subprocess.DEVNULL
    # A second fd is the job's stderr (kept apart in its log); with one, both streams
    # share it, as they always did.
    err = fds[1] if len(fds) > 1 else subprocess.STDOUT
    try:
        proc = subprocess.Popen(
            msg["argv"], env=msg["env"], stdin=subprocess.DEVNULL, stdout=out,
            stderr=err, start_new_session=True, close_fds=True)
    except OSError as exc:
        _send(g, pack({"t": "refused", "id": req, "errno": exc.errno or 0,
                       "error": exc.strerror or str(exc), "filename": exc.filename}))
        return
    except (KeyError, TypeError, ValueError) as exc:
        _send(g, pack({"t": "refused", "id": req, "errno": errno.EINVAL, "error": str(exc),
                       "filename": None}))
        return
    g.jobs[proc.pid] = _Job(fence=int(msg.get("fence", 0)), run_id=str(msg.get("run", "")),
                            proc=proc)
    _send(g, pack({"t": "spawned", "id": req, "pid": proc.pid}))


def _send(g: _GuardState, data: bytes) -> None:
    with contextlib.suppress(OSError):
        g.sock.send(data)


def _reap(g: _GuardState, pack: Callable[[Any], bytes] | None) -> None:
    """Collect every child that ended; report the node's jobs (orphans re-parented to
    us are reaped silently)."""
    now = time.monotonic()
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
        job = g.jobs.pop(pid, None)
        if job is None:
            continue
        code = os.waitstatus_to_exitcode(status)
        job.proc.returncode = code  # reaped here: Popen must never wait for it again
        g.ended_groups[pid] = now
        if pack is not None:
            _send(g, pack({"t": "exited", "pid": pid, "code": code, "killed": job.killed}))
    for pid, when in list(g.ended_groups.items()):
        if now - when > _GROUP_KEPT_S:
            del g.ended_groups[pid]


def _children() -> list[int]:
    """Our children now: the jobs, and any orphan re-parented to us."""
    me = os.getpid()
    found: list[int] = []
    try:
        with open(f"/proc/{me}/task/{me}/children", encoding="ascii") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        pass
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", encoding="ascii", errors="replace") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid == me:
            found.append(int(name))
    return found


def _kill_everything(g: _GuardState, reason: str) -> None:
    """SIGKILL every job's group and every other child we have."""
    for pid, job in g.jobs.items():
        if job.killed is None:
            job.killed = reason
            sys.stderr.write(f"raftsched guard: killed process group {pid} ({reason})\n")
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
    for pid in _children():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def _on_node_death(g: _GuardState, send_certificate: Callable[[dict[str, Any]], bool] | None
                   ) -> None:
    """The node's end of the socket closed: it died (or stopped). Kill and reap until we
    have no child left, then, if that is proven, certify the incarnation dead."""
    end = time.monotonic() + _PROOF_S
    proven = False
    while time.monotonic() < end:
        _kill_everything(g, "node exited")
        _reap(g, None)
        try:
            # With no child left at all, nothing of the node runs: every process it caused
            # was our descendant, and an orphaned one would have become our child.
            os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            proven = True
            break
        time.sleep(0.005)
    if not (proven and g.subreaper and g.hello and send_certificate is not None):
        if g.hello:
            sys.stderr.write("raftsched guard: the node's processes could not all be proven "
                             "gone; its runs wait for its lease\n")
        return
    send_certificate(g.hello)


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
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        try:
            self.proc: subprocess.Popen[bytes] | None = subprocess.Popen(
                # By path, isolated: the guard must not run the embedding app's site
                # hooks or environment; it imports only the client, from the package root.
                [sys.executable, "-I", os.path.abspath(__file__), str(theirs.fileno()), root],
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


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
