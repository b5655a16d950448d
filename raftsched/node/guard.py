"""The guard: a small process beside each node that kills the node's job process
groups when the node stops answering or dies.

A node that loses its quorum stops its own runs (self-fence) before the leader
releases them. A node that is *frozen* (SIGSTOP, a hung interpreter, a VM pause)
cannot: its jobs run in their own process groups and keep running while the leader
releases their runs and starts them elsewhere — the same run twice. The guard is a
separate process the freeze does not reach. While the node is in touch with a quorum
its event loop keeps moving a deadline forward (on the host's monotonic clock, which
both processes share): the instant its own self-fence would have ended its runs,
counted from its last acknowledged heartbeat — always before the leader may release
them. Each argv run registers its process group. Past the deadline the guard
SIGKILLs every registered group that still exists (a frozen node cannot be asked to do
it gracefully), first leaving a marker file so the node, once it runs again, records
the run ``lost`` rather than ``failed``. When the node's pipe closes (the node died)
it kills them all and exits.

Run as ``python -I path/to/guard.py MARKER_DIR``; the node writes lines to its stdin:
``t DEADLINE`` (monotonic seconds), ``+ PGID`` (a run started), ``- PGID`` (its
process was reaped: the id may be reused from now on).
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import subprocess
import sys
import time

log = logging.getLogger("raftsched.guard")

#: Seconds between checks for a node past its deadline.
_POLL_S = 0.05


def main(argv: list[str]) -> int:
    markers = argv[0]
    groups: set[int] = set()
    deadline = float("inf")  # nothing to guard until the node has said when
    buf = b""
    while True:
        ready, _, _ = select.select([0], [], [], _POLL_S)
        if ready:
            chunk = os.read(0, 65536)
            if not chunk:
                _kill_all(groups, markers, "node exited")
                return 0
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for line in lines:
                kind, _, arg = line.partition(b" ")
                if kind == b"t":
                    with contextlib.suppress(ValueError):
                        deadline = float(arg)
                elif kind == b"+" and arg.isdigit():
                    groups.add(int(arg))
                elif kind == b"-" and arg.isdigit():
                    groups.discard(int(arg))
        late = time.monotonic() - deadline
        if groups and late > 0:
            _kill_all(groups, markers, f"guard: node unresponsive ({late:.1f}s past its "
                                       "self-fence)")


def _kill_all(groups: set[int], markers: str, reason: str) -> None:
    for pgid in sorted(groups):
        try:
            os.killpg(pgid, 0)  # ended meanwhile: a finished run is not a lost one
        except OSError:
            continue
        with contextlib.suppress(OSError):
            with open(os.path.join(markers, str(pgid)), "w", encoding="utf-8") as f:
                f.write(reason)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        sys.stderr.write(f"raftsched guard: killed process group {pgid} ({reason})\n")
    groups.clear()


class Guard:
    """The node's side: starts the guard process and talks to it (event loop thread)."""

    def __init__(self, marker_dir: str) -> None:
        self.marker_dir = marker_dir
        os.makedirs(marker_dir, mode=0o700, exist_ok=True)
        for name in os.listdir(marker_dir):  # markers of a previous life mean nothing now
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(marker_dir, name))
        self.proc: subprocess.Popen[bytes] | None = subprocess.Popen(
            # By path, isolated: the guard needs the standard library only, not the
            # package (and its imports) in memory.
            [sys.executable, "-I", os.path.abspath(__file__), marker_dir],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, start_new_session=True,
            close_fds=True)

    def _send(self, line: bytes) -> None:
        proc = self.proc
        if proc is None or proc.stdin is None:
            return
        try:
            proc.stdin.write(line)
            proc.stdin.flush()
        except (BrokenPipeError, ValueError, OSError) as exc:
            self.proc = None
            log.warning("the guard process is gone (%s): a frozen node's jobs will keep "
                        "running", exc)

    def deadline(self, monotonic_s: float) -> None:
        """Kill the registered groups if the node has not moved this on by then."""
        self._send(b"t %.3f\n" % monotonic_s)

    def add(self, pgid: int) -> None:
        self._send(b"+ %d\n" % pgid)

    def remove(self, pgid: int) -> None:
        self._send(b"- %d\n" % pgid)

    def killed(self, pgid: int) -> str | None:
        """The guard's reason if it killed this group (the marker is consumed)."""
        path = os.path.join(self.marker_dir, str(pgid))
        try:
            with open(path, encoding="utf-8") as f:
                reason = f.read()
            os.unlink(path)
        except OSError:
            return None
        return reason or "guard: node silent"

    def close(self) -> None:
        """Stop the guard (the node has stopped its runs itself)."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        with contextlib.suppress(OSError, ValueError):
            assert proc.stdin is not None
            proc.stdin.close()
        with contextlib.suppress(Exception):
            proc.wait(2)



if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
