"""Full run logs: each run's stdout and stderr, on the disk of the node that ran it.

The replicated state keeps a small tail of each run's output (``limits.output_tail_bytes``,
for the last few runs); the whole output stays on the node that ran the run, under
``<data_dir>/<node>/logs/``: one folder per job (``job-<id>``), two files per attempt,
``<scheduled_ms>-<attempt>.out`` and ``.err`` (created at the first byte: a run that
prints nothing costs no file). Files and folders are the node user's only: output may
hold anything.

Bounds (``[limits]``): a run's log stops at ``log_bytes_per_run`` (what follows is
counted and said in a last line; the tail in the run record still shows the end); a
job keeps at most ``log_bytes_per_job`` and ``log_runs_per_job`` runs' logs on a node,
and a node ``log_bytes_per_node``; beyond, the oldest logs (by when they ended) are
removed first, never one being written. ``log_bytes_per_node = 0`` keeps none.

Writers are :class:`RunLog` objects (one per attempt; thread-safe: a Python callable
writes from a pool thread); the store (:class:`RunLogs`) indexes the finished ones,
prunes and reads, on the node's event loop. Reading a log is ``raftsched logs`` /
``GET /api/v1/runs/RUN_ID/logs`` (raftsched/node/service/logops.py).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("raftsched.runlog")

#: The two streams of a run, and their files' suffixes.
STREAMS = ("stdout", "stderr")
_SUFFIX = (".out", ".err")
#: Logs whose removal is remembered, to say "removed" rather than "no output".
_REMOVED_KEPT = 10_000
_FILE_RE = re.compile(r"(\d{1,19})-(\d{1,9})\.(out|err)\Z")
#: A log's key: (job id, scheduled ms, attempt).
Key = tuple[str, int, int]


@dataclass(frozen=True, slots=True, kw_only=True)
class LogLimits:
    """How much log a node keeps (``[limits]`` of the cluster TOML).

    :var run_bytes: one run's log (both streams); the rest is counted, not kept.
    :var job_bytes: all of one job's logs on this node.
    :var job_runs: logs of at most this many of a job's runs (attempts) on this node.
    :var node_bytes: all logs on this node; 0: no full logs at all.
    """

    run_bytes: int
    job_bytes: int
    job_runs: int
    node_bytes: int

    @classmethod
    def of(cls, limits: Any) -> LogLimits:
        """The log bounds of a config's :class:`~raftsched.node.config.config.Limits`."""
        return cls(run_bytes=limits.log_bytes_per_run, job_bytes=limits.log_bytes_per_job,
                   job_runs=limits.log_runs_per_job, node_bytes=limits.log_bytes_per_node)


def job_dir(root: str, job_id: str) -> str:
    """A job's folder. The prefix keeps job ids ``.`` and ``..`` (valid ids) inside."""
    return os.path.join(root, "job-" + job_id)


def split_run_id(run_id: str) -> tuple[str, int] | None:
    """``<job_id>@<scheduled_ms>`` as (job id, ms), or None if it is not one."""
    job, sep, ms = run_id.rpartition("@")
    if not sep or not job or not ms.isdigit() or len(ms) > 19 or "/" in job or "\0" in job:
        return None
    return job, int(ms)


class RunLog:
    """The log of one attempt being written; see the module docstring."""

    def __init__(self, store: RunLogs, key: Key) -> None:
        self.store = store
        self.key = key
        #: Bytes kept and bytes dropped (over the run's bound), per stream.
        self.sizes = [0, 0]
        self.dropped = [0, 0]
        self.closed = False
        self._fds: list[int | None] = [None, None]
        self._failed = False
        self._lock = threading.Lock()

    @property
    def opened(self) -> bool:
        """Did this log create a file?"""
        return self._fds[0] is not None or self._fds[1] is not None

    def path(self, err: bool) -> str:
        job, ms, attempt = self.key
        return os.path.join(job_dir(self.store.root, job), f"{ms}-{attempt}{_SUFFIX[err]}")

    def write(self, data: bytes, err: bool = False) -> None:
        """Append ``data`` to stdout (or stderr); never raises (a full disk costs the
        log, not the run)."""
        if not data:
            return
        i = int(err)
        with self._lock:
            if self.closed:
                return
            room = self.store.limits.run_bytes - self.sizes[0] - self.sizes[1]
            keep = data if len(data) <= room else data[:max(room, 0)]
            self.dropped[i] += len(data) - len(keep)
            if keep and not self._write(i, keep):
                self.dropped[i] += len(keep)

    def _write(self, i: int, data: bytes) -> bool:
        fd = self._fds[i]
        try:
            if fd is None:
                if self._failed:
                    return False
                os.makedirs(job_dir(self.store.root, self.key[0]), mode=0o700, exist_ok=True)
                fd = self._fds[i] = os.open(self.path(bool(i)),
                                            os.O_WRONLY | os.O_CREAT | os.O_TRUNC
                                            | os.O_APPEND | os.O_CLOEXEC, 0o600)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        except OSError as exc:
            if not self._failed:
                log.warning("cannot write the log of %s@%s: %s", self.key[0], self.key[1], exc)
            self._failed = True
            return False
        self.sizes[i] += len(data)
        return True

    def close(self) -> None:
        """The run ended: say what was cut, close the files, let the store index it.
        Called on the node's event loop."""
        with self._lock:
            if self.closed:
                return
            for i in (0, 1):
                if self.dropped[i] and not self._failed:
                    # Past the bound: the note itself is not counted against it.
                    self._write(i, (f"\n[raftsched: {self.dropped[i]} more bytes of "
                                    f"{STREAMS[i]} not kept: limits.log_bytes_per_run "
                                    f"({self.store.limits.run_bytes}) reached; the run "
                                    "record's tail has the end]\n").encode())
            self.closed = True
            for fd in self._fds:
                if fd is not None:
                    with contextlib.suppress(OSError):
                        os.close(fd)
        self.store.finished(self)


class RunLogs:
    """This node's run logs: writers, the index of finished ones, pruning, reading.
    Every method but :meth:`scan` and :meth:`read` runs on the node's event loop
    (``read`` only reads files: safe in a thread)."""

    def __init__(self, root: str, limits: LogLimits) -> None:
        self.root = root
        self.limits = limits
        #: Finished logs, oldest (first finished) first: key -> bytes on disk.
        self._done: OrderedDict[Key, int] = OrderedDict()
        self._jobs: dict[str, OrderedDict[Key, int]] = {}
        self._job_bytes: dict[str, int] = {}
        self.total = 0
        self._open: dict[Key, RunLog] = {}
        #: Recently removed logs -> which bound removed them.
        self._removed: OrderedDict[Key, str] = OrderedDict()

    @property
    def enabled(self) -> bool:
        return self.limits.node_bytes > 0

    def open(self, run_id: str, attempt: int) -> RunLog | None:
        """The writer of attempt ``attempt`` of ``run_id`` (None: logs are off, or the
        id is not a run id)."""
        parts = split_run_id(run_id)
        if not self.enabled or parts is None:
            return None
        key = (parts[0], parts[1], attempt)
        writer = self._open[key] = RunLog(self, key)
        self._forget(key)  # a log written again replaces the old one
        return writer

    def is_open(self, key: Key) -> bool:
        return key in self._open

    def removed(self, key: Key) -> str | None:
        """Why this log was removed (the bound), if it was recently."""
        return self._removed.get(key)

    def finished(self, writer: RunLog) -> None:
        key = writer.key
        if self._open.get(key) is writer:
            del self._open[key]
        if writer.opened:
            self._add(key, writer.sizes[0] + writer.sizes[1])
            self.prune(key[0])
        # A run that printed nothing has no file and no index entry: thousands of silent
        # runs a second cost no file system work at all.

    def _add(self, key: Key, size: int) -> None:
        self._forget(key)
        self._done[key] = size
        self._jobs.setdefault(key[0], OrderedDict())[key] = size
        self._job_bytes[key[0]] = self._job_bytes.get(key[0], 0) + size
        self.total += size

    def _forget(self, key: Key) -> None:
        size = self._done.pop(key, None)
        if size is None:
            return
        job = self._jobs[key[0]]
        del job[key]
        self._job_bytes[key[0]] -= size
        if not job:
            del self._jobs[key[0]], self._job_bytes[key[0]]
        self.total -= size

    def prune(self, job_id: str | None = None) -> None:
        """Remove the oldest logs of ``job_id`` over its bounds, then the node's oldest
        over the node's bound."""
        lim = self.limits
        if job_id is not None:
            while job_id in self._jobs and (self._job_bytes[job_id] > lim.job_bytes
                                            or len(self._jobs[job_id]) > lim.job_runs):
                why = ("log_bytes_per_job" if self._job_bytes[job_id] > lim.job_bytes
                       else "log_runs_per_job")
                self._remove(next(iter(self._jobs[job_id])), why)
        while self.total > lim.node_bytes and self._done:
            self._remove(next(iter(self._done)), "log_bytes_per_node")

    def _remove(self, key: Key, why: str) -> None:
        self._forget(key)
        job, ms, attempt = key
        for suffix in _SUFFIX:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(job_dir(self.root, job), f"{ms}-{attempt}{suffix}"))
        if job not in self._jobs and not any(k[0] == job for k in self._open):
            with contextlib.suppress(OSError):
                os.rmdir(job_dir(self.root, job))  # only when empty
        self._removed[key] = why
        while len(self._removed) > _REMOVED_KEPT:
            self._removed.popitem(last=False)

    # ------------------------------------------------------------ after a restart

    def scan(self) -> list[tuple[float, Key, int]]:
        """The logs on disk as (finished at, key, bytes): run in a thread at start (a
        node keeps up to ``log_runs_per_job`` files per job)."""
        found: dict[Key, list[float]] = {}
        try:
            folders = [e for e in os.scandir(self.root) if e.name.startswith("job-")]
        except FileNotFoundError:
            return []
        for folder in folders:
            job = folder.name[len("job-"):]
            try:
                entries = list(os.scandir(folder.path))
            except OSError:
                continue
            for entry in entries:
                m = _FILE_RE.match(entry.name)
                if m is None:
                    continue
                try:
                    st = entry.stat()
                except OSError:
                    continue
                item = found.setdefault((job, int(m.group(1)), int(m.group(2))), [0.0, 0])
                item[0] = max(item[0], st.st_mtime)
                item[1] += st.st_size
        return sorted((when, key, int(size)) for key, (when, size) in found.items())

    def adopt(self, scanned: list[tuple[float, Key, int]]) -> None:
        """Index what :meth:`scan` found (older than anything finished since), prune."""
        newer = list(self._done.items())
        known = {key for key, _ in newer}
        for key in known:
            self._forget(key)
        for _, key, size in scanned:
            if key not in self._open and key not in known:
                self._add(key, size)
        for key, size in newer:
            self._add(key, size)
        for job in list(self._jobs):
            self.prune(job)
        self.prune()

    # ------------------------------------------------------------ reading

    def read(self, key: Key, stream: int, offset: int, limit: int) -> dict[str, Any]:
        """Up to ``limit`` bytes of a stream from ``offset`` (negative: that far from
        the end). ``data`` ends on a whole UTF-8 character unless the log is complete."""
        writing = key in self._open
        job, ms, attempt = key
        base = os.path.join(job_dir(self.root, job), f"{ms}-{attempt}")
        sizes = []
        for suffix in _SUFFIX:
            try:
                sizes.append(os.stat(base + suffix).st_size)
            except FileNotFoundError:
                sizes.append(0)
        size = sizes[stream]
        start = max(0, size + offset) if offset < 0 else offset
        data = b""
        if start < size:
            try:
                with open(base + _SUFFIX[stream], "rb") as f:
                    f.seek(start)
                    data = f.read(min(limit, size - start))
            except FileNotFoundError:  # removed meanwhile
                data = b""
        if data and (writing or start + len(data) < size):
            data = data[:len(data) - _partial_tail(data)]
        return {"offset": start, "data": data, "next_offset": start + len(data),
                "size": size, "sizes": dict(zip(STREAMS, sizes, strict=True)),
                "writing": writing, "removed": self._removed.get(key)}


def _partial_tail(data: bytes) -> int:
    """How many bytes at the end of ``data`` begin a UTF-8 character not complete in it."""
    for back in range(1, min(4, len(data)) + 1):
        b = data[-back]
        if b < 0x80:
            return 0
        if b >= 0xC0:  # a lead byte: complete if its sequence fits in what follows
            need = 2 if b < 0xE0 else 3 if b < 0xF0 else 4
            return back if need > back else 0
    return 0


__all__ = ["STREAMS", "LogLimits", "RunLog", "RunLogs", "job_dir", "split_run_id"]
