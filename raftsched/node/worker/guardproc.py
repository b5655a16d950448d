"""The guard process itself (the node side and the argument are in :mod:`guard`).

Run as ``python -I path/to/guardproc.py FD PACKAGE_ROOT``: FD is its end of a
``SOCK_SEQPACKET`` socket pair with its node; each message is one msgpack map (see
:class:`raftsched.node.worker.guard.Guard`). It imports nothing of the package until it loads
the client for the certificate, from PACKAGE_ROOT.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import hmac
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

#: Seconds between checks of the deadline and of children that ended.
_POLL_S = 0.05
#: The longest the guard sleeps with nothing to do (no job, or a deadline far off).
_IDLE_S = 1.0
#: How long the guard tries to prove a dead node's processes are all gone.
_PROOF_S = 5.0
#: A group whose leader ended is still signalled on request this long after (its
#: members may hold the output pipe); after that its id may belong to someone else.
_GROUP_KEPT_S = 5.0
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



if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
