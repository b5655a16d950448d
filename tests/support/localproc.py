"""``raftsched local`` as a real process for tests: its live feed, its nodes' pids,
and cleanup of every process it started (its nodes run in sessions of their own, so
signalling ``local``'s group would not reach them)."""

from __future__ import annotations

import os
import random
import re
import signal
import socket
import subprocess
import sys
from typing import Any

from raftsched.faces.launcher import reserve_ports
from tests.support.harness import ROOT, wait_until

_BANNER_PID = re.compile(r"^\s+(n\d)\s+pid (\d+)\s+api ")
_RESTARTED = re.compile(r"^\[(n\d)\] restarted \(pid (\d+)\)")


def free_local_base() -> int:
    """A base port P with P+1..3, P+101..103, P+201..203, P+301..303 all free (``local``'s
    layout: Raft, API, metrics, HTTP), below the kernel's ephemeral range so other tests'
    sockets do not take them."""
    offsets = (1, 2, 3, 101, 102, 103, 201, 202, 203, 301, 302, 303)
    for _ in range(200):
        base = random.randrange(20000, 32000)
        socks = []
        try:
            for off in offsets:
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", base + off))
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
        # Another test worker may have picked an overlapping range a moment ago.
        if reserve_ports([base + off for off in offsets]):
            return base
    raise RuntimeError("no free port range for raftsched local")


class LocalProcess:
    """``raftsched local --nodes N`` started with ``argv_prefix`` (default: this Python's
    ``-m raftsched``), reading its output without blocking."""

    def __init__(self, data_dir: str, *, nodes: int = 3, base: int | None = None,
                 argv_prefix: list[str] | None = None, env: dict[str, str] | None = None,
                 cwd: str | None = None) -> None:
        self.base = base if base is not None else free_local_base()
        self.addrs = [f"127.0.0.1:{self.base + 100 + i}" for i in range(1, nodes + 1)]
        full_env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get(
            "PYTHONPATH", ""), **(env or {}))
        argv = (argv_prefix or [sys.executable, "-m", "raftsched"]) + [
            "local", "--nodes", str(nodes), "--base-port", str(self.base),
            "--data-dir", data_dir]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     env=full_env, cwd=cwd, start_new_session=True)
        assert self.proc.stdout is not None
        self._fd = self.proc.stdout.fileno()
        os.set_blocking(self._fd, False)
        self._partial = b""
        self.lines: list[str] = []
        self.pids: dict[str, list[int]] = {}  # node -> every pid it had, newest last

    def read(self) -> list[str]:
        """Take whatever output arrived; returns all lines so far."""
        chunk = b""
        while True:
            try:
                got = os.read(self._fd, 1 << 16)
            except (BlockingIOError, OSError):
                break
            if not got:
                break
            chunk += got
        if chunk:
            *whole, self._partial = (self._partial + chunk).split(b"\n")
            for raw in whole:
                line = raw.decode("utf-8", "replace")
                self.lines.append(line)
                m = _BANNER_PID.match(line) or _RESTARTED.match(line)
                if m:
                    self.pids.setdefault(m.group(1), []).append(int(m.group(2)))
        return self.lines

    def wait_line(self, pattern: str, timeout: float, what: str, after: int = 0) -> int:
        """Index of the first line at or after ``after`` matching ``pattern``."""
        rx = re.compile(pattern)

        def found() -> int | None:
            lines = self.read()
            return next((i for i in range(after, len(lines)) if rx.search(lines[i])), None)

        def cond() -> tuple[int] | None:
            i = found()
            return None if i is None else (i,)

        return int(wait_until(cond, timeout, what)[0])

    def pid(self, node: str) -> int:
        return self.pids[node][-1]

    def stop(self, timeout: float = 30) -> int:
        """Ctrl-C, as a user would; returns local's exit code."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        self.read()
        return self.proc.returncode if self.proc.returncode is not None else -1

    def close(self) -> None:
        """Kill whatever is left: local itself and every node pid it reported."""
        # Its banner may not have been read yet (a test that failed before it looked):
        # the node pids are in it.
        self.read()
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        for pids in self.pids.values():
            for pid in pids:
                if _is_raftsched(pid):
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass

    def __enter__(self) -> LocalProcess:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _is_raftsched(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"raftsched" in f.read()
    except OSError:
        return False
