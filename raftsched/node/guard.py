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

A run's group is only known once its process exists, and the node may die or freeze
between the fork and telling the guard (a nemesis run caught a SIGKILL there: the job
ran on, unguarded, beside the attempt the cluster started elsewhere). So the node
announces a spawn *before* it forks, naming the run id and fencing token the job's
environment will carry; when the guard must kill and a spawn is still unconfirmed, it
finds that process by its environment (``/proc/PID/environ``) and kills its group too,
looking again for a while in case the child had not yet reached its ``exec``.

Run as ``python -I path/to/guard.py MARKER_DIR``; the node writes lines to its stdin:
``t DEADLINE`` (monotonic seconds), ``s FENCE RUN_ID`` (a run is about to be spawned),
``+ PGID FENCE`` (it started: its group), ``x FENCE`` (it was never spawned), ``- PGID``
(its process was reaped: the id may be reused from now on).
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
#: How long the guard keeps looking for an unconfirmed spawn after its node died (a
#: child between fork and exec still shows the node's environment, not the job's).
_SPAWN_SEARCH_S = 2.0
#: Seconds between two searches of /proc for unconfirmed spawns; while a frozen node
#: stays late the gap doubles up to _SCAN_MAX_S (a child it had not forked yet will not
#: appear before it runs again, and then it confirms or cancels the spawn itself).
_SCAN_EVERY_S = 0.1
_SCAN_MAX_S = 5.0


def main(argv: list[str]) -> int:
    markers = argv[0]
    groups: set[int] = set()
    spawning: dict[bytes, bytes] = {}  # fence -> run id, announced and not yet confirmed
    deadline = float("inf")  # nothing to guard until the node has said when
    next_scan, scan_gap = 0.0, _SCAN_EVERY_S
    buf = b""
    while True:
        ready, _, _ = select.select([0], [], [], _POLL_S)
        if ready:
            chunk = os.read(0, 65536)
            if not chunk:
                _kill_all(groups, markers, "node exited")
                _search_spawns(spawning, markers, "node exited", _SPAWN_SEARCH_S)
                return 0
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for line in lines:
                _take(line, groups, spawning)
                if line.startswith(b"t "):
                    with contextlib.suppress(ValueError):
                        deadline = float(line[2:])
        late = time.monotonic() - deadline
        if late <= 0:
            next_scan, scan_gap = 0.0, _SCAN_EVERY_S
        elif groups or spawning:
            reason = f"guard: node unresponsive ({late:.1f}s past its self-fence)"
            _kill_all(groups, markers, reason)
            if spawning and time.monotonic() >= next_scan:
                _kill_spawned(spawning, markers, reason)
                next_scan = time.monotonic() + scan_gap
                scan_gap = min(scan_gap * 2, _SCAN_MAX_S)


def _take(line: bytes, groups: set[int], spawning: dict[bytes, bytes]) -> None:
    """Apply one of the node's lines (``t`` is read by the caller)."""
    kind, _, rest = line.partition(b" ")
    arg, _, more = rest.partition(b" ")
    if kind == b"+" and arg.isdigit():
        groups.add(int(arg))
        spawning.pop(more, None)
    elif kind == b"-" and arg.isdigit():
        groups.discard(int(arg))
    elif kind == b"s" and arg.isdigit() and more:
        spawning[arg] = more
    elif kind == b"x":
        spawning.pop(arg, None)


def _search_spawns(spawning: dict[bytes, bytes], markers: str, reason: str,
                   for_s: float) -> None:
    """Kill the unconfirmed spawns, looking again until ``for_s`` has passed."""
    end = time.monotonic() + for_s
    while spawning:
        _kill_spawned(spawning, markers, reason)
        if time.monotonic() >= end:
            return
        time.sleep(_SCAN_EVERY_S)


def _kill_spawned(spawning: dict[bytes, bytes], markers: str, reason: str) -> None:
    """Kill the group of every process whose environment names an unconfirmed spawn:
    its fencing token is unique to that attempt in its cluster, its run id guards
    against a stranger carrying the same number, and it must lead its own session and
    group (``start_new_session``), so no other group is ever taken for it."""
    wanted = {(b"RAFTSCHED_FENCE=" + fence, b"RAFTSCHED_RUN_ID=" + run_id): fence
              for fence, run_id in spawning.items()}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        try:
            # Both files through one directory handle: a pid reused between two reads
            # would otherwise pair one process's environment with another's group.
            dir_fd = os.open(f"/proc/{pid}", os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            continue
        try:
            env = set(_read_at(dir_fd, "environ").split(b"\0"))
            fields = _read_at(dir_fd, "stat").rsplit(b")", 1)[1].split()
            pgid, sid = int(fields[2]), int(fields[3])
        except (OSError, ValueError, IndexError):
            continue  # gone, or not ours to read
        finally:
            os.close(dir_fd)
        if not pgid == sid == pid:
            continue
        for (fence_var, run_var), fence in wanted.items():
            if fence_var in env and run_var in env:
                # Found: from now on it is an ordinary group (its reap will say "-").
                spawning.pop(fence, None)
                _kill_all({pgid}, markers, reason)


def _read_at(dir_fd: int, name: str) -> bytes:
    fd = os.open(name, os.O_RDONLY, dir_fd=dir_fd)
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


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

    def spawning(self, fence: int, run_id: str) -> None:
        """Say before the fork that this attempt is about to start (see the module
        docstring): a death or freeze before :meth:`add` must not leave it unguarded."""
        self._send(b"s %d %s\n" % (fence, run_id.encode()))

    def not_spawned(self, fence: int) -> None:
        self._send(b"x %d\n" % fence)

    def add(self, pgid: int, fence: int) -> None:
        self._send(b"+ %d %d\n" % (pgid, fence))

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
