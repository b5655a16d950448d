"""The leader's plans in flight: what the next plan must leave out.

Plans are bounded (``core/leader.py``: a millisecond or two to copy and to apply, under
the Raft lock pysyncobj's thread needs for heartbeats), so a busy second is many plans.
Up to ``MAX_PLANS_IN_FLIGHT`` are committed at once: each next plan leaves out the jobs
and runs of those not yet committed and counts their placements in the nodes' load, so
nothing is planned twice. A plan whose commit failed (a timeout, a lost leadership) may
still commit later: its jobs stay left out until a command the loop submitted after it
has committed (Raft applies in log order, so by then it has applied or never will), a
read barrier if nothing else follows it. Planning them again from a copy that misses
it could otherwise let its later fire times through while its refused first ones are
never recorded. Runs on the node's event loop, like the leader loop that owns it.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from raftsched.core.commands import Drop, MissFire, Next, Place, Plan, RunFire

#: Bounded plans committed at once. Each is ~1 ms to apply; together they are what
#: pysyncobj's thread may apply in one tick (between two heartbeats). Each next plan's
#: read passes over the jobs of those in flight (~1 us each), so more cost reads.
MAX_PLANS_IN_FLIGHT = 6


@dataclass(frozen=True, slots=True, kw_only=True)
class InFlight:
    """A plan submitted and not yet answered.

    :var jobs: the jobs it plans (left out of the next plans until it is answered).
    :var runs: the pending runs it places or drops (likewise).
    :var load: runs it assigns, by node (added to the nodes' load meanwhile).
    :var size: its items (a plan whose every item is refused made no progress).
    :var task: its commit.
    :var seq: its place in the order the loop submitted commands.
    :var submitted: when (the loop's monotonic clock) it was submitted.
    """

    jobs: frozenset[str]
    runs: frozenset[str]
    load: Counter[str]
    size: int
    task: asyncio.Task[dict[str, Any] | None]
    seq: int = 0
    submitted: float = 0.0


def in_flight(cmd: Plan, task: asyncio.Task[dict[str, Any] | None], seq: int = 0,
              submitted: float = 0.0) -> InFlight:
    """What the next plans must leave out while ``cmd`` commits."""
    jobs = {f.job for f in cmd.fires if isinstance(f, RunFire | MissFire)} | {
        n.job for n in cmd.next if isinstance(n, Next)} | set(cmd.versions)
    runs = {p.run_id for p in cmd.place if isinstance(p, Place)} | {
        d.run_id for d in cmd.drop if isinstance(d, Drop)}
    load: Counter[str] = Counter(p.node for p in cmd.place if isinstance(p, Place))
    load.update(f.node for f in cmd.fires
                if isinstance(f, RunFire) and f.node is not None and not f.queued)
    return InFlight(jobs=frozenset(jobs), runs=frozenset(runs), load=load, size=cmd.size(),
                    task=task, seq=seq, submitted=submitted)


@dataclass(slots=True, kw_only=True)
class PlanBook:
    """One term's plans: in flight, and failed but possibly still committing.

    :var inflight: submitted and not yet answered, oldest first.
    :var doubtful: answered with a failure; left out until settled (see the module doc).
    :var seq: the loop's submissions so far (plans and barriers).
    :var committed_seq: the last submission known committed.
    """

    inflight: list[InFlight] = field(default_factory=list)
    doubtful: list[InFlight] = field(default_factory=list)
    seq: int = 0
    committed_seq: int = 0

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def add(self, cmd: Plan, task: asyncio.Task[dict[str, Any] | None],
            submitted: float = 0.0) -> None:
        self.inflight.append(in_flight(cmd, task, self.next_seq(), submitted))

    def committed(self, seq: int) -> None:
        """Submission ``seq`` committed: every one before it is settled."""
        self.committed_seq = max(self.committed_seq, seq)
        self.reap()

    def forget(self) -> None:
        """A new term (its leadership record committed after all of these), or none."""
        self.inflight.clear()
        self.doubtful.clear()
        self.committed_seq = self.seq

    def reap(self) -> None:
        """Settle the plans answered meanwhile: a committed one's effects are in the
        state now; a failed one stays left out until a later submission commits."""
        flying = []
        for f in self.inflight:
            if not f.task.done():
                flying.append(f)
            elif f.task.result() is None:
                self.doubtful.append(f)
            else:
                self.committed_seq = max(self.committed_seq, f.seq)
        self.inflight = flying
        self.doubtful = [f for f in self.doubtful if f.seq > self.committed_seq]

    def held(self) -> tuple[frozenset[str], frozenset[str], Counter[str]]:
        """(jobs, pending runs) the next plan leaves out, and the runs by node it must
        count in the nodes' load, for the plans in flight and the doubtful ones."""
        held = self.inflight + self.doubtful
        extra: Counter[str] = Counter()
        for f in held:
            extra.update(f.load)
        return (frozenset().union(*(f.jobs for f in held)),
                frozenset().union(*(f.runs for f in held)), extra)
