"""The guard process on its own (issue 28): it spawns the node's jobs, it is their child
subreaper, and when the node's end of its socket closes it kills every process the node
caused — a daemon that left its job's group included — and proves none is left before it
sends a death certificate; one it cannot kill means no certificate.

These drive the real guard process through :class:`Guard` from an event loop, exactly as
the node does; the test process plays the node (closing its socket is its death)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from raftsched.node.worker.guard import Guard

pytestmark = pytest.mark.timeout(90)

FREEZER = "/sys/fs/cgroup/freezer"

#: Writes its pid, starts a daemon in a session of its own (out of the job's group)
#: that writes its pid too, then sleeps.
DAEMONIZING = """
import os, subprocess, sys, time
out = sys.argv[1]
d = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                     start_new_session=True)
with open(out, "w") as f:
    f.write(f"{os.getpid()} {d.pid}")
time.sleep(120)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _run(test: Callable[[Guard], Awaitable[None]]) -> None:
    async def main() -> None:
        guard = Guard()
        guard.attach(asyncio.get_running_loop())
        try:
            await test(guard)
        finally:
            guard.close()
    asyncio.run(main())


async def _spawn(guard: Guard, argv: list[str], fence: int = 7) -> tuple[int, int]:
    """Spawn ``argv`` through the guard; its pid and the read end of its output."""
    r, w = os.pipe()
    try:
        pid = await guard.spawn(argv, dict(os.environ), w, fence=fence, run_id=f"j@{fence}")
    finally:
        os.close(w)
    return pid, r


async def _until(cond: Callable[[], Any], what: str, within: float = 15.0) -> Any:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        await asyncio.sleep(0.02)
    raise AssertionError(f"no {what} within {within}s")


def test_the_guard_spawns_a_job_and_reports_its_output_and_exit() -> None:
    async def test(guard: Guard) -> None:
        pid, r = await _spawn(guard, ["sh", "-c", "echo out; echo err >&2; exit 3"])
        ex = await asyncio.wait_for(guard.exited(pid), 15)
        with os.fdopen(r, "rb") as f:
            assert f.read() == b"out\nerr\n"
        assert (ex.code, ex.killed) == (3, None)

    _run(test)


def test_a_missing_program_is_refused_naming_it() -> None:
    async def test(guard: Guard) -> None:
        with pytest.raises(FileNotFoundError) as info:
            await _spawn(guard, ["/no/such/program", "x"])
        assert info.value.filename == "/no/such/program"

    _run(test)


def test_a_node_death_kills_every_process_it_caused_even_a_daemon(tmp_path) -> None:
    out = str(tmp_path / "pids")
    seen: dict[str, int] = {}

    async def test(guard: Guard) -> None:
        await _spawn(guard, [sys.executable, "-c", DAEMONIZING, out])
        text = await _until(lambda: os.path.exists(out) and open(out).read(), "the pids")
        job, daemon = map(int, text.split())
        seen.update(job=job, daemon=daemon, guard=guard.proc.pid if guard.proc else 0)
        assert os.getsid(daemon) == daemon != os.getpgid(job)  # out of the job's group
        assert _alive(job) and _alive(daemon)
        guard.close()  # the node's end of the socket closes: to the guard, its death
        await _until(lambda: not _alive(job) and not _alive(daemon), "both killed", 10)

    _run(test)
    assert seen["daemon"]
    # Done proving (no member to tell), the guard exits.
    deadline = time.monotonic() + 15
    while _alive(seen["guard"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(seen["guard"])


def test_a_frozen_node_past_its_deadline_loses_its_job_and_learns_why() -> None:
    async def test(guard: Guard) -> None:
        pid, r = await _spawn(guard, [sys.executable, "-c", "import time; time.sleep(120)"])
        os.close(r)
        guard.deadline(time.monotonic() - 1.0)  # the node's lease ran out long ago
        ex = await asyncio.wait_for(guard.exited(pid), 15)
        assert ex.code == -signal.SIGKILL
        assert ex.killed is not None and "node unresponsive" in ex.killed

    _run(test)


class _Member:
    """A TCP listener standing in for a member's API: it records who connects (the
    guard's certificate) and says nothing."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.addr = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.connected = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            conn, _ = self.sock.accept()
            self.connected.set()
            conn.close()

    def close(self) -> None:
        self.sock.close()


def _hello(guard: Guard, member: _Member) -> None:
    guard.hello(node="n9", boot=123, api="127.0.0.1:1", members=[member.addr],
                secrets=["s" * 32], cluster_id="c", tls_ca=None, give_up_s=3.0)


def test_a_proven_death_is_reported_to_a_member() -> None:
    member = _Member()

    async def test(guard: Guard) -> None:
        _hello(guard, member)
        pid, r = await _spawn(guard, [sys.executable, "-c", "import time; time.sleep(120)"])
        os.close(r)
        guard.close()
        await _until(lambda: not _alive(pid), "the job killed", 10)
        assert await asyncio.to_thread(member.connected.wait, 10), "no certificate sent"

    try:
        _run(test)
    finally:
        member.close()


@pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists(f"{FREEZER}/cgroup.procs"),
                    reason="needs root and a cgroup v1 freezer (a process SIGKILL cannot end)")
def test_a_guard_that_cannot_prove_a_job_dead_sends_no_certificate(tmp_path) -> None:
    """A job frozen by the cgroup v1 freezer ignores SIGKILL (state D) until it is
    thawed, like a process stuck in uninterruptible sleep: the guard cannot reap it,
    so it must not claim the node's processes are gone (the lease applies)."""
    member = _Member()
    group = f"{FREEZER}/raftsched-test-{os.getpid()}"
    os.makedirs(group, exist_ok=True)

    async def test(guard: Guard) -> None:
        _hello(guard, member)
        pid, r = await _spawn(guard, [sys.executable, "-c", "import time; time.sleep(120)"])
        os.close(r)
        with open(f"{group}/cgroup.procs", "w") as f:
            f.write(str(pid))
        with open(f"{group}/freezer.state", "w") as f:
            f.write("FROZEN")
        guard.close()
        # Past the guard's whole proof window (5 s) and then some: still no certificate.
        assert not await asyncio.to_thread(member.connected.wait, 8.0)
        assert _alive(pid)
        with open(f"{group}/freezer.state", "w") as f:
            f.write("THAWED")
        await _until(lambda: not _alive(pid), "the thawed job to die", 10)

    try:
        _run(test)
    finally:
        member.close()
        with contextlib.suppress(OSError):
            with open(f"{group}/freezer.state", "w") as f:
                f.write("THAWED")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                os.rmdir(group)
                break
            time.sleep(0.1)
