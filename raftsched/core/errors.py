"""The error vocabulary of raftsched.

Every error carries a stable ``code`` (the wire ``{code, message}``) and, where
there is one, the offending id or field. Errors subclass the builtin that fits
them so callers can catch either the raftsched class or the builtin.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any


class RaftschedError(Exception):
    """Base of every raftsched error; ``code`` is stable and goes on the wire."""

    code: str = "internal"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def to_wire(self) -> dict[str, Any]:
        """The ``{code, message}`` map sent in an error reply."""
        return {"code": self.code, "message": self.message}


class InvalidSpec(RaftschedError, ValueError):
    """A job spec (or a command argument) failed validation; names the field."""

    code = "invalid_spec"

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field


class InvalidArgument(RaftschedError, ValueError):
    """A request argument other than a job spec is wrong; names the argument."""

    code = "invalid_argument"

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field


class ConfigError(RaftschedError, ValueError):
    """The cluster config is missing a key or has a wrong value; names the key."""

    code = "config_error"

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"config {key}: {problem}")
        self.key = key


class UnknownJob(RaftschedError, LookupError):
    """No job by this id exists."""

    code = "unknown_job"

    def __init__(self, job_id: str) -> None:
        super().__init__(f"no job with id {job_id!r}")
        self.job_id = job_id


class UnknownRun(RaftschedError, LookupError):
    """No run by this id exists (or it is no longer active)."""

    code = "unknown_run"

    def __init__(self, run_id: str, problem: str | None = None) -> None:
        super().__init__(problem or f"no active run with id {run_id!r}")
        self.run_id = run_id


class StaleFence(RaftschedError, PermissionError):
    """A start/finish carried a fence that is no longer the run's current one."""

    code = "stale_fence"

    def __init__(self, run_id: str, fence: int, current: int | None) -> None:
        super().__init__(f"run {run_id!r}: fence {fence} is stale (current {current})")
        self.run_id = run_id
        self.fence = fence
        self.current = current


class Conflict(RaftschedError, RuntimeError):
    """The request conflicts with the current state (e.g. overlap policy refuses it)."""

    code = "conflict"

    def __init__(self, subject: str, problem: str) -> None:
        super().__init__(f"{subject}: {problem}")
        self.subject = subject


class LimitExceeded(RaftschedError, OverflowError):
    """A configured limit was hit (jobs, frame size, pending commands, connections)."""

    code = "limit_exceeded"

    def __init__(self, limit: str, problem: str) -> None:
        super().__init__(f"{limit}: {problem}")
        self.limit = limit


class FrameTooLarge(LimitExceeded):
    """A frame's declared length is over the limit; it was refused unread."""

    code = "frame_too_large"

    def __init__(self, size: int, limit: int) -> None:
        RaftschedError.__init__(self, f"frame of {size} bytes is over the limit of {limit}")
        self.limit = "max_frame_bytes"
        self.size = size


class Overloaded(LimitExceeded):
    """Too many commands are pending; retry later (backpressure)."""

    code = "overloaded"


class ProtocolError(RaftschedError, ValueError):
    """A frame could not be decoded or has the wrong shape."""

    code = "protocol_error"


class Unauthenticated(RaftschedError, PermissionError):
    """The client did not prove knowledge of the cluster secret."""

    code = "unauthenticated"

    def __init__(self, message: str = "authentication required") -> None:
        super().__init__(message)


class NotReady(RaftschedError, ConnectionError):
    """The node has no leader or no quorum right now; the command's outcome is unknown
    only if ``maybe_committed`` is true."""

    code = "not_ready"
    #: The command may still commit (it reached the log before leadership moved):
    #: retry with the same request id, never with a new one.
    maybe_committed: bool = False

    def __init__(self, message: str, *, maybe_committed: bool = False) -> None:
        super().__init__(message)
        self.maybe_committed = maybe_committed

    def to_wire(self) -> dict[str, Any]:
        """``{code, message}``, plus ``maybe_committed: true`` when it is (an older
        client ignores the key; a missing key reads as false)."""
        out = super().to_wire()
        if self.maybe_committed:
            out["maybe_committed"] = True
        return out


class Unavailable(RaftschedError, ConnectionError):
    """No address the client knows answered."""

    code = "unavailable"


class NodeUnavailable(RaftschedError):
    """What was asked for is on one node (a run's log), and that node does not answer.
    Not a reason to ask another node: none has it. The message names the node."""

    code = "node_unavailable"
    #: The node (empty on a client, which rebuilds the error from its message).
    node: str = ""

    def __init__(self, node: str, message: str) -> None:
        super().__init__(message)
        self.node = node


class WrongCluster(RaftschedError, ConnectionError):
    """The node belongs to another cluster than the one the client was told to use."""

    code = "wrong_cluster"


class DataDirLocked(RaftschedError, OSError):
    """Another process holds this node's data directory; names the directory and pid."""

    code = "data_dir_locked"

    def __init__(self, path: str, pid: int | None) -> None:
        holder = f"process {pid}" if pid else "another process"
        super().__init__(f"data directory {path} is in use by {holder}: one node per data "
                         f"directory (stop it, or give this node another data_dir)")
        self.path = path
        self.pid = pid


class CorruptJournal(RaftschedError, ValueError):
    """A node's Raft journal failed its format check at boot; names the file and offset."""

    code = "corrupt_journal"

    def __init__(self, path: str, offset: int, problem: str) -> None:
        super().__init__(f"{path}: corrupt at byte {offset}: {problem}; refusing to replay it "
                         f"(move the node's data directory aside: the node then fetches the "
                         f"log from its peers, or restore it from a backup)")
        self.path = path
        self.offset = offset


class CorruptBackup(RaftschedError, ValueError):
    """A backup file is not one ``restore`` can trust: names the file and what is wrong."""

    code = "corrupt_backup"

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}; nothing was restored")
        self.path = path


_BY_CODE: dict[str, type[RaftschedError]] = {
    c.code: c
    for c in (
        CorruptBackup,
        InvalidSpec,
        InvalidArgument,
        ConfigError,
        UnknownJob,
        UnknownRun,
        StaleFence,
        Conflict,
        LimitExceeded,
        FrameTooLarge,
        Overloaded,
        ProtocolError,
        Unauthenticated,
        NotReady,
        Unavailable,
        NodeUnavailable,
        WrongCluster,
    )
}


class RemoteError(RaftschedError):
    """An error reply from a node whose code has no richer local class."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def from_wire(err: Any) -> RaftschedError:
    """Rebuild an error from a wire ``{code, message}``; never raises."""
    if not isinstance(err, dict):
        return RemoteError("internal", f"malformed error reply: {err!r:.200}")
    code = str(err.get("code", "internal"))
    message = str(err.get("message", ""))
    cls = _BY_CODE.get(code)
    if cls is None:
        return RemoteError(code, message)
    exc = cls.__new__(cls)
    RaftschedError.__init__(exc, message)
    # The fields an error carries travel inside its message ("field: problem"):
    # restore them, so a caller can read exc.field / exc.job_id on either side.
    attr = _PREFIX_ATTR.get(cls)
    if attr is not None:
        setattr(exc, attr, message.partition(": ")[0])
    elif cls is UnknownJob and isinstance(exc, UnknownJob):
        exc.job_id = message.removeprefix("no job with id ").strip("'\"")
    elif isinstance(exc, NotReady):
        exc.maybe_committed = err.get("maybe_committed") is True
    return exc


#: Errors whose message starts with their subject, and the attribute it goes in.
_PREFIX_ATTR: dict[type, str] = {InvalidSpec: "field", InvalidArgument: "field",
                                 Conflict: "subject", LimitExceeded: "limit",
                                 Overloaded: "limit"}


def unknown_hint(problem: str, key: str, known: Iterable[str]) -> str:
    """``problem``, plus ``(did you mean 'x'?)`` when a known name is close to ``key``
    (job-spec typos get the same help as config typos)."""
    hint = difflib.get_close_matches(str(key)[:64], sorted(known), n=1)
    return f"{problem} (did you mean {hint[0]!r}?)" if hint else problem
