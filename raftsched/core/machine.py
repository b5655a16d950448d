"""The replicated state machine: the one dispatcher that applies a command to the
state — the top of the core's stack.

:class:`ClusterState` is the data of :mod:`raftsched.core.state` with ``apply``: the
checks every command passes first (time, proposer term, request-id dedupe), then the
command's handler, which lives with its subject (:mod:`~raftsched.core.jobs`,
:mod:`~raftsched.core.nodes`, :mod:`~raftsched.core.claims`,
:mod:`~raftsched.core.members`, :mod:`~raftsched.core.notify`,
:mod:`~raftsched.core.apply`, :mod:`~raftsched.core.backfill`).

Pure and deterministic: :meth:`ClusterState.apply` takes one typed command (or the
:class:`~raftsched.core.commands.Unreadable` a replica read from an entry it cannot
apply: :func:`~raftsched.core.commands.read` makes one or the other from a decoded map)
and returns a reply dict; it reads no clock, does no I/O and never raises — a command
that cannot be applied is rejected and changes nothing. Times come inside the command
(epoch ms stamped by the sender).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from raftsched.core import apply as declarative
from raftsched.core import backfill, claims, deps, jobs, members, nodes, notify
from raftsched.core.cmdbase import DEPS_VERSION, REFUSAL_REMEMBERED_VERSION
from raftsched.core.commands import (
    MAX_AT_MS,
    MAX_PUT_BATCH,
    ApplyJobs,
    Backfill,
    BackfillCancel,
    Certify,
    Command,
    DeleteJob,
    Drain,
    Finish,
    Heartbeat,
    LeaderRecord,
    Member,
    NotifyDefault,
    NotifyResults,
    Pause,
    Plan,
    PutJob,
    PutJobs,
    Read,
    Release,
    Resume,
    Start,
    Transfer,
    Trigger,
    Unreadable,
    read,
)
from raftsched.core.errors import Conflict, InvalidArgument, RaftschedError
from raftsched.core.records import JobRecord, RunRecord
from raftsched.core.state import DEDUPE_ITEMS_LIMIT, DEDUPE_LIMIT, DEFAULT_HISTORY_LIMIT, StateData

C = TypeVar("C", bound=Command)
B = TypeVar("B", Backfill, BackfillCancel)


class ClusterState(StateData):
    """The replicated state with its dispatcher. See the module docstring."""

    def __init__(self, *, history_limit: int = DEFAULT_HISTORY_LIMIT) -> None:
        super().__init__(history_limit=history_limit)
        #: (commands applied, the command, its prepared work): see ``prepare``.
        self._prepared: tuple[int, Command, Any] | None = None

    def after_run_end(self, rec: JobRecord, run: RunRecord, at: int) -> None:
        # In this very apply, on every replica: a dependent's run, and a backfill's
        # next, follow the outcome with no window for a failover to fall into.
        deps.on_run_end(self, rec, run, at)
        backfill.on_run_end(self, rec, run, at)

    def apply(self, cmd: Command | Unreadable,
              entry_term: int | None = None) -> dict[str, Any]:
        """Apply one command; never raises. Returns ``{"ok": True, ...}`` or
        ``{"ok": False, "error": {code, message}}``. An :class:`Unreadable` entry is
        counted and refused (or, a repeat of an answered request, answered again).

        ``entry_term`` is the Raft term of the log entry holding the command (the same
        on every replica). A leader-only command is applied only if it was proposed in
        that very term: a log entry of term T is appended by T's leader alone, so a
        command a deposed leader proposed (and pysyncobj forwarded to the new leader,
        which appended it in its own term) is refused.

        The replica reads the command from its bytes (``read``) outside the state lock:
        a plan of 20,000 items takes ~40 ms to read."""
        self.applied += 1
        try:
            if isinstance(cmd, Unreadable):
                seen = self.dedupe.get(cmd.rid) if cmd.rid is not None else None
                if seen is not None:
                    self._prepared = None
                    return dict(seen, duplicate=True)
                return {"ok": False, "error": dict(cmd.error)}  # one per reply
            op = cmd.OP
            handler = _HANDLERS[op]
            at = cmd.at
            if isinstance(at, bool) or not isinstance(at, int) or not 0 <= at < MAX_AT_MS:
                raise InvalidArgument("at", "must be epoch milliseconds before year 10000")
            if op in LEADER_ONLY:
                _check_proposer(cmd, op, entry_term)
            rid = getattr(cmd, "rid", None)
            if rid is not None:
                seen = self.dedupe.get(rid)
                if seen is not None:
                    self._prepared = None
                    return dict(seen, duplicate=True)
            try:
                reply = handler(self, cmd)
            except RaftschedError as exc:
                reply = {"ok": False, "error": exc.to_wire()}
                if rid is not None and cmd.v >= REFUSAL_REMEMBERED_VERSION:
                    # A copy of this request still in flight (a node's retry, a forward
                    # over a slow link) may commit after the client heard this refusal
                    # and went on: it must get the same answer, not be applied against
                    # a state the client has changed since (a late ``delete`` of a job
                    # absent then would delete the job put since).
                    self._remember(rid, reply)
                return reply
            if rid is not None:
                self._remember(rid, reply)
            return reply
        except RaftschedError as exc:
            return {"ok": False, "error": exc.to_wire()}
        except Exception as exc:  # noqa: BLE001 - apply must never raise (pysyncobj wedges)
            return {"ok": False, "error": {"code": "internal",
                                           "message": f"{type(exc).__name__}: {exc}"[:300]}}

    def apply_map(self, cmd: Any, entry_term: int | None = None) -> dict[str, Any]:
        """``apply(read(cmd))``: for tests and tools that hold a decoded map."""
        return self.apply(read(cmd), entry_term)

    def prepare(self, cmd: Command | Unreadable) -> None:
        """Do the pure part of ``cmd``'s apply now, before the state lock is taken: the
        replica calls this on the thread that then applies ``cmd``. Only applies change
        the jobs, and that thread alone applies, so the jobs read here are the ones the
        apply sees (the apply checks that no command came between). Other threads change
        only the derived ``due`` index (the leader's planner, under the lock): nothing
        prepared here may read it. Today: a ``raftsched apply``'s diff of up to 1,000
        jobs (~70 ms of CPU), or the refusal it gets. Never raises."""
        self._prepared = None
        if isinstance(cmd, ApplyJobs):
            try:
                work: Any = declarative.prepare_apply(self, cmd)
            except RaftschedError as exc:  # the apply raises it: no second try under the lock
                work = exc
            except Exception:  # noqa: BLE001 - the apply does the work and answers for it
                return
            self._prepared = (self.applied, cmd, work)

    def take_prepared(self, cmd: Command) -> Any:
        """What ``prepare`` made for ``cmd``, if ``cmd`` is the command being applied and
        nothing was applied in between; else None."""
        found, self._prepared = self._prepared, None
        if found is not None and found[1] is cmd and found[0] == self.applied - 1:
            return found[2]
        return None

    def _remember(self, rid: str, reply: dict[str, Any]) -> None:
        self.dedupe[rid] = reply
        # Bounded by replies and by their items (a put_jobs reply holds one per spec).
        weight = sum(1 + len(r.get("results", ())) for r in self.dedupe.values()) \
            if len(reply.get("results", ())) else None
        while len(self.dedupe) > DEDUPE_LIMIT or (weight is not None
                                                  and weight > DEDUPE_ITEMS_LIMIT):
            _, old = self.dedupe.popitem(last=False)
            if weight is not None:
                weight -= 1 + len(old.get("results", ()))


#: Commands only the leader proposes; each carries the proposer's ``term``.
LEADER_ONLY = frozenset({"leader", "plan", "release", "notify_default"})


def _check_proposer(cmd: Command, op: str, entry_term: int | None) -> None:
    """A leader-only command must come from the leader of the log entry's term.

    Commands written before version 2 (``v`` 1) predate the check and keep their
    meaning when a journal is replayed."""
    term = getattr(cmd, "term", None)
    if cmd.v == 1 and term is None:
        return
    if isinstance(term, bool) or not isinstance(term, int) or term < 0:
        raise InvalidArgument("term", "a leader-only command must carry its proposer's term")
    if entry_term is not None and term != entry_term:
        raise Conflict("term", f"{op} proposed in term {term} but appended in term "
                               f"{entry_term}: the proposer no longer leads")


#: A handler: what one command does to the state; its reply.
Handler = Callable[[ClusterState, Any], dict[str, Any]]


def _on(cls: type[C], fn: Callable[[ClusterState, C], dict[str, Any]]) -> tuple[str, Handler]:
    """``cls``'s handler, typed: mypy checks that ``fn`` takes that very command."""
    return cls.OP, fn


def _apply_jobs(st: ClusterState, cmd: ApplyJobs) -> dict[str, Any]:
    return declarative.apply_apply(st, cmd, st.take_prepared(cmd))


def _backfill(st: ClusterState, cmd: Backfill) -> dict[str, Any]:
    return backfill.apply_backfill(st, _v5(cmd))


def _backfill_cancel(st: ClusterState, cmd: BackfillCancel) -> dict[str, Any]:
    return backfill.apply_cancel(st, _v5(cmd))


#: Each command's handler, by its op (every command class has one: a unit test checks).
_HANDLERS: dict[str, Handler] = dict((
    _on(PutJob, jobs.apply_put_job),
    _on(PutJobs, jobs.apply_put_jobs),
    _on(DeleteJob, jobs.apply_delete_job),
    _on(Pause, jobs.apply_pause),
    _on(Resume, jobs.apply_resume),
    _on(Trigger, jobs.apply_trigger),
    _on(Heartbeat, nodes.apply_heartbeat),
    _on(LeaderRecord, nodes.apply_leader),
    _on(Read, nodes.apply_read),
    _on(Drain, nodes.apply_drain),
    _on(Transfer, nodes.apply_transfer),
    _on(Certify, nodes.apply_certify),
    _on(ApplyJobs, _apply_jobs),
    _on(NotifyResults, notify.apply_notified),
    _on(NotifyDefault, notify.apply_default),
    _on(Member, members.apply_member),
    _on(Plan, claims.apply_plan),
    _on(Start, claims.apply_start),
    _on(Finish, claims.apply_finish),
    _on(Release, claims.apply_release),
    _on(Backfill, _backfill),
    _on(BackfillCancel, _backfill_cancel),
))


def _v5(cmd: B) -> B:
    """A backfill command written below version 5 is refused as the release before them
    refused an unknown op (none was ever written: this keeps replay exact regardless)."""
    if cmd.v < DEPS_VERSION:
        raise InvalidArgument("op", f"unknown operation {cmd.OP!r:.40}")
    return cmd

__all__ = ["LEADER_ONLY", "MAX_AT_MS", "MAX_PUT_BATCH", "ClusterState"]
