"""The run table: active runs, their indexes and the fence, changed in one place.

:class:`RunTable` owns the active runs (by id), the derived ``pending`` and ``by_node``
indexes and the cluster-wide ``fence`` counter; the claim handlers
(:mod:`raftsched.core.claims`) change them only through its methods. Every change of
an active run's state goes through :meth:`RunTable.move`, driven by one legality table
(:data:`LEGAL`): a move the table does not list is refused (False, nothing changed:
the state machine turns that into a refused item, it never raises); a legal one keeps
the indexes in step and notes the transition on the run (bounded). Adding a run and
recording missed fire times (history-only records) are births, not transitions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from raftsched.core.model import RunState

if TYPE_CHECKING:
    from raftsched.core.records import RunRecord

S = RunState
#: From each active state, the states a run may move to. Terminal states are the end.
LEGAL: Final[dict[RunState, frozenset[RunState]]] = {
    # placed on a node; or dropped by the leader, cancelled, shed past its grace
    S.pending: frozenset({S.assigned, S.cancelled, S.shed, S.missed}),
    # the run ahead of it ended; or dropped, cancelled
    S.queued: frozenset({S.pending, S.cancelled, S.shed, S.missed}),
    # its node started it; released back to pending; given up before it started
    S.assigned: frozenset({S.started, S.pending, S.cancelled, S.shed, S.missed}),
    # ended (pending again for a retry), or its node was lost
    S.started: frozenset({S.pending, S.succeeded, S.failed, S.timed_out, S.lost,
                          S.cancelled, S.shed}),
}
#: States in which a run holds a claim on a node (the ``by_node`` index).
ON_NODE: Final = frozenset({S.assigned.value, S.started.value})
#: States in which a run of a concurrency key holds one of its places (``holding``).
HOLDING: Final = frozenset({S.pending.value, S.assigned.value, S.started.value})
#: The ``reason`` of a run queued for its concurrency key (not by ``overlap = queue``).
CONC_WAIT: Final = "concurrency"
_LEGAL_VALUES = {frm.value: frozenset(t.value for t in to) for frm, to in LEGAL.items()}


class _Keep:
    """The run keeps its node."""


KEEP: Final = _Keep()


def may(run: RunRecord, to: RunState) -> bool:
    """May ``run`` move to ``to`` now?"""
    return to.value in _LEGAL_VALUES.get(run.state, ())


class RunTable:
    """The active runs and what is derived from them (never snapshotted but ``runs`` and
    ``fence``; the indexes are rebuilt on restore).

    :ivar runs: active runs (pending, queued, assigned, started) by id.
    :ivar pending: ids of the pending runs, in the order they became pending.
    :ivar by_node: node id -> ids of the runs holding a claim on it (assigned, started).
    :ivar fence: the last fence handed out (every assignment takes the next one).
    :ivar job_keys: job id -> its concurrency key (set by the job handlers).
    :ivar key_max: key -> job id -> that job's ``max`` (the smallest one holds).
    :ivar holding: key -> ids of its runs that are pending, assigned or started.
    :ivar waiting: key -> ids of its runs queued for a place (reason ``CONC_WAIT``).
    """

    __slots__ = ("runs", "pending", "by_node", "fence", "job_keys", "key_max", "holding",
                 "waiting", "_limits")

    def __init__(self) -> None:
        self.runs: dict[str, RunRecord] = {}
        self.pending: dict[str, None] = {}
        self.by_node: dict[str, set[str]] = {}
        self.fence = 0
        self.job_keys: dict[str, str] = {}
        self.key_max: dict[str, dict[str, int]] = {}
        self.holding: dict[str, set[str]] = {}
        self.waiting: dict[str, set[str]] = {}
        #: key -> the smallest max of its jobs (kept as they change: one apply may ask
        #: it for each of 64 runs, and thousands of jobs may share a key).
        self._limits: dict[str, int] = {}

    def add(self, run: RunRecord) -> None:
        """A new active run (pending or queued)."""
        self.runs[run.run_id] = run
        if run.state == S.pending.value:
            self.pending[run.run_id] = None
        self._index(run)

    # ------------------------------------------------------------ concurrency keys

    def limit(self, key: str) -> int:
        """The key's ``max``: the smallest of its jobs' (0 when no job has the key)."""
        found = self._limits.get(key)
        if found is None:
            maxes = self.key_max.get(key)
            found = self._limits[key] = min(maxes.values()) if maxes else 0
        return found

    def on_node(self, key: str) -> int:
        """Runs of the key holding a claim on a node (assigned or started)."""
        runs = self.runs
        return sum(1 for r in self.holding.get(key, ()) if runs[r].state in ON_NODE)

    def _index(self, run: RunRecord) -> None:
        key = self.job_keys.get(run.job_id)
        if key is None:
            return
        if run.state in HOLDING:
            self.holding.setdefault(key, set()).add(run.run_id)
        elif run.state == S.queued.value and run.reason == CONC_WAIT:
            self.waiting.setdefault(key, set()).add(run.run_id)

    def _unindex(self, run: RunRecord) -> None:
        key = self.job_keys.get(run.job_id)
        if key is None:
            return
        for index in (self.holding, self.waiting):
            found = index.get(key)
            if found is not None:
                found.discard(run.run_id)
                if not found:
                    del index[key]

    def dequeue(self, key: str, at: int) -> None:
        """Runs queued for ``key`` become pending, oldest first, while it has room. The
        order is the runs' own (creation, fire time, id): the same on every replica,
        whether it applied the log or restored a snapshot."""
        waiting = self.waiting.get(key)
        room = self.limit(key) - len(self.holding.get(key, ()))
        while waiting and room > 0:
            runs = self.runs
            run = runs[min(waiting, key=lambda r: (runs[r].created_ms, runs[r].scheduled_ms,
                                                   r))]
            run.reason = ""
            run.not_before_ms = max(run.not_before_ms, at)  # its grace counts from here
            transition(self, run, S.pending, at, f"dequeued: concurrency {key}")
            room -= 1
            waiting = self.waiting.get(key)

    def set_job_key(self, job_id: str, key: str | None, maximum: int, active: list[str],
                    at: int) -> None:
        """Job ``job_id`` now has concurrency ``key`` (None: none) with ``maximum``: its
        active runs move to the key's indexes, and either key's queue moves on if it
        now has room. A run queued for a key its job no longer has becomes pending."""
        old = self.job_keys.get(job_id)
        runs = [self.runs[r] for r in active if r in self.runs]
        for run in runs:
            self._unindex(run)
        if old is not None:
            maxes = self.key_max.get(old, {})
            gone = maxes.pop(job_id, None)
            if not maxes:
                self.key_max.pop(old, None)
            if gone is not None and gone <= self._limits.get(old, 0):
                self._limits.pop(old, None)  # it may have been the smallest: find again
            del self.job_keys[job_id]
        if key is not None:
            self.job_keys[job_id] = key
            self.key_max.setdefault(key, {})[job_id] = maximum
            if key in self._limits:
                self._limits[key] = min(self._limits[key], maximum)
        for run in runs:
            if key is None and run.state == S.queued.value and run.reason == CONC_WAIT:
                run.reason = ""
                transition(self, run, S.pending, at, "dequeued: no concurrency key")
            else:
                self._index(run)
        for k in sorted({k for k in (old, key) if k is not None}):
            self.dequeue(k, at)

    def next_fence(self) -> int:
        self.fence += 1
        return self.fence

    def move(self, run: RunRecord, to: RunState, at: int, note: str = "", *,
             node: str | None | _Keep = KEEP) -> bool:
        """Move ``run`` to ``to`` (see :func:`transition`); a run that ends leaves the
        table."""
        if not transition(self, run, to, at, note, node=node):
            return False
        if to not in LEGAL:  # terminal
            self.runs.pop(run.run_id, None)
        if to.value not in HOLDING:
            key = self.job_keys.get(run.job_id)
            if key is not None and key in self.waiting:
                self.dequeue(key, at)  # it gave up its place: the next one takes it
        return True

    def active_on(self, node_id: str) -> list[RunRecord]:
        return [self.runs[r] for r in sorted(self.by_node.get(node_id, ()))]

    def unordered_on(self, node_id: str) -> list[RunRecord]:
        """:meth:`active_on` in no particular order, for a reader that orders them
        itself (a node's worker polls its runs after every plan: the sort was 5 % of
        a follower's CPU in a storm)."""
        runs = self.runs
        return [runs[r] for r in self.by_node.get(node_id, ())]

    def rebuild(self) -> None:
        """Recompute the indexes from ``runs`` (after a restore)."""
        self.pending = {r: None for r, run in self.runs.items() if run.state == RunState.pending}
        self.by_node = {}
        self.holding, self.waiting, self._limits = {}, {}, {}
        for run in self.runs.values():
            if run.node is not None and run.state in ON_NODE:
                self.by_node.setdefault(run.node, set()).add(run.run_id)
            self._index(run)


def transition(table: RunTable, run: RunRecord, to: RunState, at: int, note: str = "", *,
               node: str | None | _Keep = KEEP) -> bool:
    """Move an active ``run`` to ``to`` (on ``node`` if given), keeping the table's
    indexes and noting it at ``at``; False, changing nothing, if :data:`LEGAL` forbids
    it. (The run stays in ``table.runs``: :meth:`RunTable.move` drops an ended one.)"""
    frm = run.state
    if to.value not in _LEGAL_VALUES.get(frm, ()):
        return False
    table._unindex(run)
    new_node = run.node if isinstance(node, _Keep) else node
    was_on, now_on = frm in ON_NODE, to.value in ON_NODE
    if frm == S.pending.value:
        table.pending.pop(run.run_id, None)
    if was_on and run.node is not None and (not now_on or new_node != run.node):
        on = table.by_node.get(run.node)
        if on is not None:
            on.discard(run.run_id)
    if now_on and new_node is not None and (not was_on or new_node != run.node):
        table.by_node.setdefault(new_node, set()).add(run.run_id)
    run.node = new_node
    run.state = to.value
    if to is S.pending:
        table.pending[run.run_id] = None
    table._index(run)
    run.note(at, note)
    return True


__all__ = ["CONC_WAIT", "HOLDING", "KEEP", "LEGAL", "ON_NODE", "RunTable", "may",
           "transition"]
