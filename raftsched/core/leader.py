"""The leader's planning, pure: due runs, misses, overlap and placement into one batch.

:func:`plan_input` copies what a plan reads out of the state (the caller holds the
state lock; O(due jobs + pending runs), microseconds each). :func:`plan_from` computes
the body of one ``plan`` command from that copy, or ``None`` when there is nothing to
do, WITHOUT the lock: the miss detector's work (fire times, counts) never delays the
Raft thread. Neither mutates the state: the plan takes effect only when committed, and
the high-water marks and job versions make a plan from a stale copy, or from a stale
or second leader, harmless. :func:`plan` is both in one call.

Every plan is bounded (the lock budget: docs/architecture.md): it reads at most
``MAX_JOBS_PER_PLAN`` due jobs and ``MAX_RUNS_PER_PLAN`` pending runs, and creates or
places at most ``MAX_RUNS_PER_PLAN`` runs, so that both the copy and the apply (on every
node, under the Raft lock) take about a millisecond. A minute's first second of
thousands of cron jobs is therefore many plans; the leader keeps several in flight and
passes the jobs and runs of those not yet committed as ``skip_jobs`` / ``skip_runs``, so
no job is planned twice and the next plan reads the next jobs.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from raftsched.core import members
from raftsched.core.cmdbase import COMMAND_VERSION, HELD_IDS_VERSION
from raftsched.core.commands import Drop, Fire, MissFire, Next, Place, Plan, RunFire
from raftsched.core.misses import classify, late_reason, overlap_decision
from raftsched.core.model import FireAction, MissReason, Overlap, RunState
from raftsched.core.planinput import (  # re-exported: the planner's input, beside it
    MAX_BACKFILL_READ,
    MAX_JOBS_PER_PLAN,
    MAX_RUNS_PER_PLAN,
    DueJob,
    PendingRun,
    PlanInput,
    plan_input,
)
from raftsched.core.trigger import next_fire

if TYPE_CHECKING:
    from raftsched.core.state import StateData

#: Jobs with missed fire times (a catch-up after downtime) per plan: each is a missed
#: range besides its run (a plan of 48 applies in ~0.6 ms of CPU, at most ~2.8, like one
#: of 64 on-time runs); the others wait for the next plan. On-time jobs read in the same
#: plan are not held back.
MAX_CATCHUP_JOBS_PER_PLAN = 48
#: A new leader waits this long before it skips a fire time for overlap: finishes the
#: election held up (a run over on a follower, its finish not yet committed) land in
#: its first second; skipping sooner skipped the fire after every failover.
SETTLE_MS = 1500
#: An instant of many fire times is planned early in proportion to its size: its
#: planning begins ``runs / EARLY_RUNS_PER_MS`` ms ahead (W5 planned its 5,208-run
#: instant at ~5 per ms, on 2 cores beside the starts; 4 per ms leaves it room), never
#: less than the lookahead, so an instant of up to ``4 x lookahead`` runs is planned as
#: before. At 250 ms the last of those 5,208 were assigned and started after their
#: instant (lag p99 ~500 ms). (A longer lead does not help what exceeds the nodes'
#: slots: a start holds a slot, so those wait for one after the instant.)
EARLY_RUNS_PER_MS = 4
#: ... and never more than this many lookaheads ahead (2 s at the default 250 ms): a
#: claim, and its node's slot, is held from its assignment on.
MAX_EARLY_LOOKAHEADS = 8


@dataclass(slots=True, kw_only=True)
class Capacity:
    """A live node as placement sees it.

    :var node_id: the node.
    :var tags: its tags.
    :var slots: its worker slots.
    :var limit: how many active runs it may hold (slots + local queue).
    :var load: active runs (assigned or started) on it, counting this plan's.
    """

    node_id: str
    tags: frozenset[str]
    slots: int
    limit: int
    load: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaderContext:
    """What the leader knows besides the state.

    :var node_id: the leader's node id.
    :var term: its Raft term.
    :var now_ms: its wall clock, stamped into the plan.
    :var lookahead_ms: how far ahead of due time runs are assigned (by this plan: up to
        a big instant planned early, node/leader/early.py).
    :var usual_lookahead_ms: the configured lookahead, when ``lookahead_ms`` reaches
        further (None: it does not). A fire time beyond it whose job has a run not ended
        (or one made by this plan) waits until it is within, as before, unless the job's
        overlap is ``allow``: decided early, ``replace`` would cancel, and ``queue``
        queue behind, a run that has not even started.
    :var since_ms: when it became leader (for miss reasons).
    :var boot_ms: when its process started (for miss reasons).
    :var live: the nodes that may take work.
    :var budget: runs this plan may create or place (admission control grants it;
        at most ``MAX_RUNS_PER_PLAN``).
    """

    node_id: str
    term: int
    now_ms: int
    lookahead_ms: int
    since_ms: int
    boot_ms: int
    live: tuple[Capacity, ...] = field(default=())
    budget: int = MAX_RUNS_PER_PLAN
    usual_lookahead_ms: int | None = None


def max_lead_ms(lookahead_ms: int) -> int:
    """The furthest ahead of an instant its planning may begin (:func:`lead_ms`)."""
    return lookahead_ms * MAX_EARLY_LOOKAHEADS


def lead_ms(lookahead_ms: int, runs: int) -> int:
    """How long before an instant with ``runs`` due fire times the leader begins to plan
    it: the lookahead for a small instant; for a big one the time its runs take to plan
    at ``EARLY_RUNS_PER_MS``, up to :func:`max_lead_ms`."""
    return min(max(lookahead_ms, runs // EARLY_RUNS_PER_MS), max_lead_ms(lookahead_ms))


def runs_worth_counting(lookahead_ms: int) -> int:
    """Past this many due runs an instant's lead is :func:`max_lead_ms` whatever more
    there are: counting stops there."""
    return max_lead_ms(lookahead_ms) * EARLY_RUNS_PER_MS


def capacities(st: StateData, unavailable: Collection[str] = ()) -> tuple[Capacity, ...]:
    """The nodes that may take work, by id: alive and not draining in the state, and
    not ``unavailable`` (to the leader: lost, or cut off from it), with their load."""
    return tuple(
        Capacity(node_id=node_id, tags=frozenset(rec.tags), slots=rec.slots,
                 limit=rec.slots + rec.queue, load=len(st.by_node.get(node_id, ())))
        for node_id, rec in sorted(st.nodes.items())
        if rec.alive and not rec.draining and node_id not in unavailable)


def place(live: list[Capacity], tags: tuple[str, ...], rotor: int,
          leader: str | None = None) -> Capacity | None:
    """The live node having all ``tags`` with room: one with a free slot before one
    that would queue the run, a follower before the ``leader``, then the least loaded,
    ties broken by rotating through the nodes so equal nodes share the work.

    The leader takes runs only when no follower has a free slot: a leader killed with
    runs started on it leaves them held until the node timeout (later fires of an
    ``overlap = skip`` job are skipped meanwhile), and its job processes compete with
    the Raft thread every node's liveness depends on."""
    best: Capacity | None = None
    best_key: tuple[bool, bool, float, int] | None = None
    n = len(live)
    for i, cap in enumerate(live):
        if cap.load >= cap.limit or (tags and not cap.tags.issuperset(tags)):
            continue
        key = (cap.load >= cap.slots, cap.node_id == leader, cap.load / cap.slots,
               (i - rotor) % n)
        if best_key is None or key < best_key:
            best, best_key = cap, key
    return best


def unfit(tags: tuple[str, ...], live: list[Capacity],
          member_tags: tuple[frozenset[str], ...] | None) -> str | None:
    """Why no live node may take a run of a job with ``tags``, when the tags are why:
    ``unplaceable: ...`` (no member has them), else ``no_node`` (only members that are
    down have them, or no node is live). None when a live node has them: a run that
    still finds no room waits for capacity (``overload``)."""
    if any(c.tags.issuperset(tags) for c in live):
        return None
    return members.unplaceable(tags, member_tags) or MissReason.no_node.value


def plan(st: StateData, ctx: LeaderContext) -> Plan | None:
    """One batch of assignments and miss records (see module doc)."""
    return plan_from(plan_input(st, ctx.now_ms + ctx.lookahead_ms), ctx)


def plan_from(inp: PlanInput, ctx: LeaderContext) -> Plan | None:
    """The plan for a copied input; needs no lock (see module doc)."""
    live = [Capacity(node_id=c.node_id, tags=c.tags, slots=max(c.slots, 1), limit=c.limit,
                     load=c.load) for c in ctx.live]
    fires: list[Fire] = []
    place_items: list[Place] = []
    drop: list[Drop] = []
    nxt: list[Next] = []
    versions: dict[str, int] = {}
    rotor = ctx.now_ms // 1000
    budget = min(ctx.budget, MAX_RUNS_PER_PLAN)
    catch_ups = 0
    last_leader_ms = inp.last_leader_ms
    covers = False  # an item covers a fire time a kept record holds (version 6)

    # Runs this plan ends: they no longer hold back their job's next fire (overlap).
    ended: set[str] = set()
    # Per concurrency key: its runs on nodes, counting this plan's, and its max.
    keys = dict(inp.keys)
    # Runs waiting for a node first: released claims are reassigned at once.
    for run in inp.pending:
        if budget <= 0:
            break
        if run.backfill:
            continue  # after the on-time runs (below)
        if run.key is not None and _key_full(keys, run.key):
            continue  # it waits for a run of its key to end (never shed for it)
        waited_from = max(run.scheduled_ms, run.not_before_ms)
        late = ctx.now_ms - waited_from > run.grace_ms
        if late and run.attempt > 1:
            # A retry is due at its not-before time and obeys the misfire grace as a
            # fire time does: one that fell due while the cluster was down is recorded
            # as such a fire time is, not run minutes late beside the on-time fire.
            outcome, reason = late_reason(fire_ms=waited_from, leader_since_ms=ctx.since_ms,
                                          leader_boot_ms=ctx.boot_ms,
                                          last_leader_ms=last_leader_ms)
            why = unfit(run.tags, live, inp.member_tags)
            if outcome is RunState.shed and why is not None:
                outcome, reason = RunState.missed, why
            drop.append(Drop(run.run_id, outcome, reason))
            ended.add(run.run_id)
            continue
        target = place(live, run.tags, rotor, ctx.node_id)
        if target is None:
            if late:
                why = unfit(run.tags, live, inp.member_tags)
                drop.append(Drop(run.run_id, RunState.shed, MissReason.overload.value)
                            if why is None else Drop(run.run_id, RunState.missed, why))
                ended.add(run.run_id)
            continue
        target.load += 1
        rotor += 1
        budget -= 1
        _take_key(keys, run.key)
        place_items.append(Place(run.run_id, target.node_id))

    for rec in inp.due:
        if budget <= 0:
            break
        spec = rec.spec
        outcome, reason = late_reason(fire_ms=rec.next_ms or ctx.now_ms,
                                      leader_since_ms=ctx.since_ms,
                                      leader_boot_ms=ctx.boot_ms, last_leader_ms=last_leader_ms)
        why = unfit(spec.tags, live, inp.member_tags)
        if outcome is RunState.shed and why is not None:
            # Not for want of capacity: no live node (or no member at all) has its tags.
            outcome, reason = RunState.missed, why
        overdue = rec.next_ms is not None and ctx.now_ms - rec.next_ms > spec.misfire.grace_ms
        if overdue and catch_ups >= MAX_CATCHUP_JOBS_PER_PLAN:
            continue  # a catch-up: the next plan takes it
        res = classify(schedule=spec.schedule, hwm_ms=rec.hwm_ms, now_ms=ctx.now_ms,
                       lookahead_ms=ctx.lookahead_ms, misfire=spec.misfire, reason=reason)
        if res.hwm_ms is None:
            continue
        if res.missed:
            if catch_ups >= MAX_CATCHUP_JOBS_PER_PLAN:
                continue
            catch_ups += 1
        hwm = rec.hwm_ms
        active = [a for a in rec.active if a[0] not in ended]
        items: list[Fire] = []
        blocked = False
        for m in res.missed:
            m_outcome = outcome if m.reason == reason else RunState.missed
            first: int | None = m.first_ms
            count = m.count
            while first is not None and first in rec.held and count > 0:
                # The range's record would take the id a kept record holds: that fire
                # time is covered instead, and the range starts after it.
                items.append(RunFire(spec.id, first, None, False))
                covers = True
                count -= 1
                first = next_fire(spec.schedule, first) if count else None
            if first is not None and count > 0:
                items.append(MissFire(spec.id, first, m.last_ms, count, m_outcome, m.reason))
            hwm = m.last_ms
        made = False  # a run of this job made by this plan
        for fire in res.run:
            if fire in rec.held:
                items.append(RunFire(spec.id, fire, None, False))  # covered (no run)
                covers = True
                hwm = fire
                continue
            if budget <= 0:
                # A catch-up of many fire times (``misfire = all``): the rest next plan.
                blocked = True
                break
            if (ctx.usual_lookahead_ms is not None and spec.overlap is not Overlap.allow
                    and (active or made) and fire > ctx.now_ms + ctx.usual_lookahead_ms):
                blocked = True  # planned early only without a run to overlap with
                break
            decision = overlap_decision(spec.overlap, active)
            if decision.action is FireAction.skip and (fire > ctx.now_ms
                                              or ctx.now_ms - ctx.since_ms < SETTLE_MS):
                # Not yet its time, or a leader just elected: the previous run may be
                # over already with its finish still in flight (typically held up by
                # the election). Decide at the fire time, once settled; the finish,
                # when it lands, wakes the leader.
                blocked = True
                break
            if decision.action is FireAction.skip:
                items.append(MissFire(spec.id, fire, fire, 1, RunState.skipped,
                                      MissReason.overlap.value))
                hwm = fire
                continue
            for run_id in decision.cancel:
                drop.append(Drop(run_id, RunState.cancelled, "replaced"))
            active = [a for a in active if a[0] not in decision.cancel]
            queued = decision.action is FireAction.queue
            key = spec.concurrency.key if spec.concurrency is not None else None
            if not queued and key is not None and _key_full(keys, key):
                # Its key is at its max: the run is made now (the apply records it
                # queued, or skipped under policy = skip) and placed when a place frees.
                budget -= 1
                items.append(RunFire(spec.id, fire, None, False))
                made = True
                if spec.overlap in (Overlap.skip, Overlap.queue):
                    active.append((f"{spec.id}@{fire}", "queued"))
                hwm = fire
                continue
            target = None if queued else place(live, spec.tags, rotor, ctx.node_id)
            if target is None and not queued:
                # No room now: keep the mark here and try again next tick; once it is
                # past the grace the miss detector records it shed (overload).
                if why is not None and ctx.now_ms - fire > spec.misfire.grace_ms:
                    items.append(MissFire(spec.id, fire, fire, 1, RunState.missed, why))
                    hwm = fire
                    continue
                blocked = True
                break
            if target is not None:
                target.load += 1
                rotor += 1
                _take_key(keys, key)
            budget -= 1
            items.append(RunFire(spec.id, fire, target.node_id if target else None, queued))
            made = True
            # A run this plan creates is the job's previous run for the next fire time
            # in the same plan (a catch-up, or a late fire beside an on-time one):
            # under skip/queue the later one is skipped, queued behind it, or decided
            # at its fire time, never started beside it. Under
            # overlap = queue the buffered fire is one: later ones see it and skip.
            if queued:
                active.append((f"{spec.id}@{fire}", "queued"))
            elif spec.overlap in (Overlap.skip, Overlap.queue):
                active.append((f"{spec.id}@{fire}", "assigned"))
            hwm = fire
        fires.extend(_merge_misses(items))
        versions[spec.id] = rec.version
        if hwm != rec.hwm_ms or not blocked:
            nxt.append(Next(spec.id, next_fire(spec.schedule, hwm)))
    # Backfills' runs last, on idle slots only (never a node's queue): on-time runs
    # first, always (see core/backfill.py).
    for run in inp.pending:
        if budget <= 0:
            break
        if not run.backfill or (run.key is not None and _key_full(keys, run.key)):
            continue
        idle = [c for c in live if c.load < c.slots]
        target = place(idle, run.tags, rotor, ctx.node_id)
        if target is None:
            why = unfit(run.tags, live, inp.member_tags)
            if why is not None and why.startswith(MissReason.unplaceable.value):
                # No member could ever run it: recorded so, not waited for forever.
                drop.append(Drop(run.run_id, RunState.missed, why))
            continue
        target.load += 1
        rotor += 1
        budget -= 1
        _take_key(keys, run.key)
        place_items.append(Place(run.run_id, target.node_id))
    if not (fires or place_items or drop or nxt):
        return None
    return Plan(at=ctx.now_ms, term=ctx.term, leader=ctx.node_id, fires=tuple(fires),
                place=tuple(place_items), drop=tuple(drop), next=tuple(nxt),
                versions=versions, v=HELD_IDS_VERSION if covers else COMMAND_VERSION)


def _key_full(keys: dict[str, tuple[int, int]], key: str) -> bool:
    running, limit = keys.get(key, (0, 0))
    return running >= limit


def _take_key(keys: dict[str, tuple[int, int]], key: str | None) -> None:
    if key is not None and key in keys:
        running, limit = keys[key]
        keys[key] = (running + 1, limit)


def _merge_misses(items: list[Fire]) -> list[Fire]:
    """Fold consecutive misses with the same outcome and reason into ranges."""
    out: list[Fire] = []
    for item in items:
        prev = out[-1] if out else None
        if (isinstance(prev, MissFire) and isinstance(item, MissFire)
                and prev.outcome == item.outcome and prev.reason == item.reason):
            out[-1] = prev._replace(last_ms=item.last_ms,
                                    fire_count=prev.fire_count + item.fire_count)
        else:
            out.append(item)
    return out


__all__ = ["EARLY_RUNS_PER_MS", "MAX_BACKFILL_READ", "MAX_CATCHUP_JOBS_PER_PLAN",
           "MAX_EARLY_LOOKAHEADS", "MAX_JOBS_PER_PLAN", "MAX_RUNS_PER_PLAN", "SETTLE_MS",
           "Capacity", "DueJob", "LeaderContext", "PendingRun", "PlanInput", "capacities",
           "lead_ms", "max_lead_ms", "place", "plan", "plan_from", "plan_input",
           "runs_worth_counting", "unfit"]
