"""This node's replica of the cluster state, seen from inside: each committed log entry
decoded and applied under the state lock (in pysyncobj's Raft thread) with its effects
handed on, a snapshot restored, a format this version cannot read refused (the node
stops rather than skip it), and :meth:`Replica.read`, the one port through which the
edges read the state.

Held by :class:`raftsched.node.replica.raft.RaftNode`, which owns pysyncobj (this module
never imports it: see :mod:`raftsched.node.replica.compat`) and the submit side, and
passes its reads here.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from raftsched.core.codec import (
    COMMAND_VERSIONS,
    decode_command,
    decode_state,
    format_problem,
    unknown_command_version,
)
from raftsched.core.commands import Command, Unreadable, read
from raftsched.core.effects import Effect, Restored
from raftsched.core.machine import ClusterState
from raftsched.node.observe import gcwatch
from raftsched.node.replica.timedlock import TimedLock

if TYPE_CHECKING:
    from raftsched.node.replica.raftsync import RaftSyncObj

# The Raft adapter's logger: one component, whichever of its modules writes the line.
log = logging.getLogger("raftsched.raft")
#: What an entry that is not msgpack applies as (counted, refused the same everywhere).
_UNDECODABLE = Unreadable(error={"code": "protocol_error", "message": "undecodable command"})
T = TypeVar("T")


def _reader_name(fn: Any) -> str:
    """``read <qualified name>`` of a reader, unwrapping partials: cheap (it runs at every
    read) and bounded (a partial's repr would print every argument, thousands of runs)."""
    while isinstance(fn, partial):
        fn = fn.func
    return "read " + str(getattr(fn, "__qualname__", None) or type(fn).__qualname__)


def _describe(cmd: Any) -> str:
    """A command's op and the sizes of its list fields, for the slow-hold log line."""
    if not isinstance(cmd, dict):
        return f"apply {type(cmd).__name__}"
    sizes = " ".join(f"{k}={len(v)}" for k, v in cmd.items() if isinstance(v, list | dict))
    return f"apply {cmd.get('op')}" + (f" {sizes}" if sizes else "")


class Replica:
    """The apply side and read port of a node's state; see the module docstring.

    :param sync: pysyncobj's object (made, not yet started), read here for log
        positions and terms only.
    :param history_limit: runs kept per job.
    :param on_effects: called in the Raft thread with each apply's effects.
    :param on_fatal: called once when an entry or a snapshot cannot be read.
    """

    def __init__(self, *, sync: RaftSyncObj, history_limit: int,
                 on_effects: Callable[[list[Effect]], None],
                 on_fatal: Callable[[str], None] | None) -> None:
        self.sync = sync
        #: Why this replica stopped applying (a format it cannot read), else None.
        self.fatal: str | None = None
        #: The log position (index, term) the state is at (written under the lock).
        self.applied_pos: tuple[int, int] | None = None
        self.on_effects = on_effects
        #: Seconds spent in applies, and applies, since start (metrics).
        self.apply_seconds = 0.0
        self.apply_count = 0
        self._on_fatal = on_fatal
        # Private: the edges read through read() and change the state only by submit().
        self._lock = TimedLock()  # every hold timed: raftsched_raft_lock_hold_seconds
        self._state = ClusterState(history_limit=history_limit)

    @property
    def state(self) -> ClusterState:
        """The state itself, for pysyncobj's snapshot (encoded in its forked child)."""
        return self._state

    def _refuse(self, problem: str) -> None:
        """Stop applying: a replica that skipped an entry it cannot read would go on
        from a state the others do not have. Every later entry is refused too (the
        state stays as it was before the unknown one) and the node is told to stop."""
        if self.fatal is not None:
            return
        self.fatal = problem
        log.error("%s", problem)
        if self._on_fatal is not None:
            try:
                self._on_fatal(problem)
            except Exception:  # noqa: BLE001 - the Raft thread must go on
                log.exception("fatal listener failed")

    def apply(self, blob: bytes) -> Any:
        """Apply one committed entry (pysyncobj's thread); never raises."""
        if self.fatal is not None:
            return {"ok": False, "error": {"code": "not_ready", "message": self.fatal}}
        t0 = time.perf_counter()
        cmd = decode_command(blob)
        if cmd is None and (version := unknown_command_version(blob)) is not None:
            self._refuse(f"log entry {self.sync.raftLastApplied + 1}: "
                         f"{format_problem('command', version, COMMAND_VERSIONS)}; "
                         f"the node stops instead of skipping it")
            return {"ok": False, "error": {"code": "not_ready", "message": self.fatal}}
        # Outside the lock: reading a big plan's items takes milliseconds.
        parsed = _UNDECODABLE if cmd is None else read(cmd)
        if isinstance(parsed, Command):
            # Also outside the lock: this thread alone changes the state (see prepare).
            self._state.prepare(parsed)
        entry_term = self.sync.applying_term()
        with self._lock:
            if cmd is not None:
                self._lock.what = partial(_describe, cmd)  # formatted only if slow
            reply = self._state.apply(parsed, entry_term)
            self.applied_pos = (int(self.sync.raftLastApplied) + 1, int(entry_term or 0))
            effects = self._state.take_effects()
        self.apply_seconds += time.perf_counter() - t0
        self.apply_count += 1
        if effects:
            try:
                self.on_effects(effects)
            except Exception:  # noqa: BLE001 - a listener bug must not wedge the Raft thread
                log.exception("effect listener failed")
        return reply

    def restore(self, data: Any) -> None:
        """Replace the state with a snapshot's (pysyncobj's thread)."""
        try:
            with gcwatch.paused():
                state = decode_state(bytes(data))
                # The restored state lives as long as the process: out of the
                # collector's reach before it is back on, whose first young collection
                # walked every object the decode made (0.3 s of a 1M-job restart,
                # bench/results/2026-12-06-restart-rows.md).
                gc.freeze()
        except Exception as exc:  # noqa: BLE001 - refuse to go on from a partial state
            # pysyncobj counts the snapshot's entries applied whatever happens here: a
            # node that went on would serve (and snapshot) an empty state.
            self._refuse(f"cannot load the state snapshot: {exc}")
            return
        with self._lock:
            self._state = state
            self.applied_pos = None  # pysyncobj sets its own once the snapshot is in
        try:
            self.on_effects([Restored()])
        except Exception:  # noqa: BLE001
            log.exception("effect listener failed")

    # ---------------------------------------------------------------- the replica port

    def read(self, fn: Callable[[ClusterState], T]) -> T:
        """``fn(state)`` run under the state lock, which pysyncobj's thread needs to apply
        commands and send heartbeats: the one way the edges read the replicated state.

        ``fn`` must be short (microseconds; bounded by what it reads, never by the whole
        table unless that is its job, and then in chunks), must not block, and must
        return copies or immutable values (the state changes the moment the lock is
        released). Changes go through :meth:`submit`, never through ``fn``."""
        with self._lock:
            # A slow hold is logged at this site: name the reader (its qualified name;
            # a partial's function, never its repr, which formats its arguments).
            self._lock.what = _reader_name(fn)
            return fn(self._state)

    @property
    def lock_max_hold_s(self) -> float:
        """The longest hold of the state lock since start (seconds)."""
        return float(self._lock.max_hold_s)

    def observe_lock_holds(self, observer: Callable[[float], None]) -> None:
        """Call ``observer(seconds)`` after every hold of the state lock."""
        self._lock.observer = observer

    def position(self) -> tuple[int, int]:
        """(index, term) of the log entry the state is at; call inside :meth:`read`."""
        return self.applied_pos or (int(self.sync.raftLastApplied), 0)

