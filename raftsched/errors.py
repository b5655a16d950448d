"""The error vocabulary of raftsched.

Every error carries a stable ``code`` (the wire ``{code, message}``) and, where
there is one, the offending id or field. Errors subclass the builtin that fits
them so callers can catch either the raftsched class or the builtin.
"""

from __future__ import annotations

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

    def __init__(self, run_id: str) -> None:
        super().__init__(f"no active run with id {run_id!r}")
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

    def __init__(self, message: str, *, maybe_committed: bool = False) -> None:
        super().__init__(message)
        self.maybe_committed = maybe_committed


class Unavailable(RaftschedError, ConnectionError):
    """No address the client knows answered."""

    code = "unavailable"


_BY_CODE: dict[str, type[RaftschedError]] = {
    c.code: c
    for c in (
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
    return exc
