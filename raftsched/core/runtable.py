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
    """

    __slots__ = ("runs", "pending", "by_node", "fence")

    def __init__(self) -> None:
        self.runs: dict[str, RunRecord] = {}
        self.pending: dict[str, None] = {}
        self.by_node: dict[str, set[str]] = {}
        self.fence = 0

    def add(self, run: RunRecord) -> None:
        """A new active run (pending or queued)."""
        self.runs[run.run_id] = run
        if run.state == S.pending.value:
            self.pending[run.run_id] = None

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
        return True

    def active_on(self, node_id: str) -> list[RunRecord]:
        return [self.runs[r] for r in sorted(self.by_node.get(node_id, ()))]

    def rebuild(self) -> None:
        """Recompute the indexes from ``runs`` (after a restore)."""
        self.pending = {r: None for r, run in self.runs.items() if run.state == "pending"}
        self.by_node = {}
        for run in self.runs.values():
            if run.node is not None and run.state in ON_NODE:
                self.by_node.setdefault(run.node, set()).add(run.run_id)


def transition(table: RunTable, run: RunRecord, to: RunState, at: int, note: str = "", *,
               node: str | None | _Keep = KEEP) -> bool:
    """Move an active ``run`` to ``to`` (on ``node`` if given), keeping the table's
    indexes and noting it at ``at``; False, changing nothing, if :data:`LEGAL` forbids
    it. (The run stays in ``table.runs``: :meth:`RunTable.move` drops an ended one.)"""
    frm = run.state
    if to.value not in _LEGAL_VALUES.get(frm, ()):
        return False
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
    run.note(at, note)
    return True


__all__ = ["KEEP", "LEGAL", "ON_NODE", "RunTable", "may", "transition"]
