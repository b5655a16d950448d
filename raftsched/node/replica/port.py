"""The replica as the other rooms see it: a typed port, so that the worker, the leader
and the service name what they need of the replica (read, submit, where it stands)
rather than the concrete pysyncobj-backed :class:`~raftsched.node.replica.raft.RaftNode`,
and a test can hand them anything that answers these."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from raftsched.core.commands import Command
    from raftsched.core.machine import ClusterState

T = TypeVar("T")


class ReplicaPort(Protocol):
    """The replicated state, read and changed."""

    def read(self, fn: Callable[[ClusterState], T]) -> T:
        """``fn(state)`` under the state lock: short, non-blocking, returning copies."""
        ...

    def submit(self, cmd: Command | dict[str, Any]) -> Future[Any]:
        """Propose ``cmd``; the future holds its apply's reply once committed here."""
        ...

    def ready(self) -> bool:
        """This node has caught up with the cluster's commits and may serve reads."""
        ...

    def position(self) -> tuple[int, int]:
        """(index, term) of the log entry the state is at (inside :meth:`read`)."""
        ...

    def is_leader(self) -> bool:
        """This node leads now."""
        ...

    def leader_term(self) -> int | None:
        """The term this node leads in, else None."""
        ...

    def term(self) -> int:
        """The current Raft term."""
        ...

    def quorum_contact_age(self) -> float | None:
        """Seconds since this node last knew a leader in contact with a quorum (its own
        Raft thread's view, no log entry); None with no leader known."""
        ...

    @property
    def pending(self) -> int:
        """Commands submitted here and not yet answered."""
        ...


__all__ = ["ReplicaPort"]
