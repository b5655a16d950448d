"""Which of this node's claims the worker looks at after a command applies.

The worker learns its claims from the state: the runs assigned here that it does not
hold yet, and the runs it waits on whose claim moved on (released, cancelled,
reassigned). It read them by scanning every claim of this node and every run it held,
after every applied command that could concern it: in a storm of 5,000 runs a second,
those scans were about a tenth of a follower's CPU (issue 31), for the handful of runs
each command changed.

Every such change comes with an effect of the apply that made it (``RunAssigned``,
``RunEnded``, ``ClaimsReleased``, ``RunStarted`` — a start of a run this worker waits
on, committed by an earlier process of this node —, ``Restored`` for a whole new
state), and the node hands each to :meth:`ClaimSync.note` on the event loop, where the
worker runs. The worker then looks at the runs those effects named
(:meth:`ClaimSync.take`), and at everything when it cannot be sure it heard of every
change: before its first look, after a restore or a failed read, when more changed
than :data:`MAX_TOUCHED`, and every :data:`FULL_SCAN_S` in any case, so that a change
no effect named would cost up to a second of delay, never a claim.

The order between an apply and its effects: the replica hands the effects on after the
apply has released the state lock, so a noted change is in the state the worker reads.
A change applied before the worker's read whose effect has not arrived yet is not
looked at in that step; its effect arrives after and names the run, and the next step
looks: ``RunEnded``, ``ClaimsReleased`` and ``Restored`` wake the worker, and so does
``RunAssigned`` to this node (one to another node follows a release or an end that
woke it; a ``RunStarted`` of an earlier process waits for the next step, as before).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from raftsched.core.effects import (
    ClaimsReleased,
    Restored,
    RunAssigned,
    RunEnded,
    RunStarted,
)

if TYPE_CHECKING:
    from collections.abc import Container

    from raftsched.core.effects import Effect

#: The worker looks at every claim of its node at least this often (seconds).
FULL_SCAN_S = 1.0
#: More runs named than this between two looks (a journal replayed at start, a restore):
#: one full look instead.
MAX_TOUCHED = 10_000
#: The effects that name a run whose claim on some node changed.
CLAIM_NEWS = frozenset({RunAssigned, RunEnded, ClaimsReleased, RunStarted, Restored})


class ClaimSync:
    """The runs named since the worker's last look. Event loop only.

    :param node_id: this node.
    :param incremental: look at the named runs only (the node feeds :meth:`note`);
        False: every look is a full one (a pool driven without effects, as in tests).
    """

    def __init__(self, node_id: str, *, incremental: bool = False) -> None:
        self.node_id = node_id
        self.incremental = incremental
        self._touched: set[str] = set()
        self._full = True
        self._next_full = 0.0
        #: Full and partial looks taken (for tests and the curious).
        self.full_looks = 0
        self.partial_looks = 0

    def note(self, eff: Effect, held: Container[str]) -> None:
        """An applied effect of a :data:`CLAIM_NEWS` kind; ``held``: the run ids the
        worker holds (a run ended elsewhere is none of its business)."""
        if self._full:
            return
        touched = self._touched
        if isinstance(eff, RunAssigned):
            if eff.node == self.node_id or eff.run_id in held:
                touched.add(eff.run_id)
        elif isinstance(eff, (RunEnded, RunStarted)):
            if eff.run_id in held:
                touched.add(eff.run_id)
        elif isinstance(eff, ClaimsReleased):
            if eff.node == self.node_id:
                touched.update(eff.runs)
            else:
                touched.update(r for r in eff.runs if r in held)
        elif isinstance(eff, Restored):
            self.look_at_all()
            return
        if len(touched) > MAX_TOUCHED:
            self.look_at_all()

    def look_at_all(self) -> None:
        """The next look is a full one."""
        self._full = True
        self._touched = set()

    def take(self, mono: float) -> set[str] | None:
        """What the next look covers, and forget it: the run ids named since the last
        look, or None for every claim (``mono``: the monotonic clock, seconds)."""
        if not self.incremental or self._full or mono >= self._next_full:
            self._full = False
            self._touched = set()
            self._next_full = mono + FULL_SCAN_S
            self.full_looks += 1
            return None
        touched, self._touched = self._touched, set()
        self.partial_looks += 1
        return touched


__all__ = ["CLAIM_NEWS", "FULL_SCAN_S", "MAX_TOUCHED", "ClaimSync"]
