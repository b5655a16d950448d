"""The leader's planning, pure: due runs, misses, overlap and placement into one batch.

:func:`plan` reads the state (the caller holds the state lock) and returns the body of
one ``plan`` command, or ``None`` when there is nothing to do. It never mutates the
state: the plan takes effect only when committed, and the high-water marks make a
plan from a stale or second leader harmless.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from raftsched.misses import classify, late_reason, overlap_decision
from raftsched.model import MissReason
from raftsched.trigger import next_fire

if TYPE_CHECKING:
    from raftsched.state import ClusterState

#: Jobs examined per plan; the rest wait for the next tick (keeps a tick short).
MAX_JOBS_PER_PLAN = 5000
#: Runs created or placed per plan.
MAX_RUNS_PER_PLAN = 5000


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
    :var lookahead_ms: how far ahead of due time runs are assigned.
    :var since_ms: when it became leader (for miss reasons).
    :var boot_ms: when its process started (for miss reasons).
    :var live: the nodes that may take work.
    """

    node_id: str
    term: int
    now_ms: int
    lookahead_ms: int
    since_ms: int
    boot_ms: int
    live: tuple[Capacity, ...] = field(default=())


def place(live: list[Capacity], tags: tuple[str, ...], rotor: int) -> Capacity | None:
    """The least loaded live node having all ``tags`` with room, ties broken by
    rotating through the nodes so equal nodes share the work."""
    best: Capacity | None = None
    best_key: tuple[float, int] | None = None
    n = len(live)
    for i, cap in enumerate(live):
        if cap.load >= cap.limit or (tags and not cap.tags.issuperset(tags)):
            continue
        key = (cap.load / cap.slots, (i - rotor) % n)
        if best_key is None or key < best_key:
            best, best_key = cap, key
    return best


def plan(st: ClusterState, ctx: LeaderContext) -> dict[str, Any] | None:
    """One batch of assignments and miss records (see module doc)."""
    live = [Capacity(node_id=c.node_id, tags=c.tags, slots=max(c.slots, 1), limit=c.limit,
                     load=c.load) for c in ctx.live]
    fires: list[list[Any]] = []
    place_items: list[list[Any]] = []
    drop: list[list[Any]] = []
    nxt: list[list[Any]] = []
    versions: dict[str, int] = {}
    rotor = ctx.now_ms // 1000
    budget = MAX_RUNS_PER_PLAN
    horizon = ctx.now_ms + ctx.lookahead_ms
    last_leader_ms = int(st.leader.get("prev_ms", 0))

    # Runs waiting for a node first: released claims are reassigned at once.
    for run_id in list(st.pending):
        if budget <= 0:
            break
        run = st.runs[run_id]
        if run.not_before_ms > horizon:
            continue
        rec = st.jobs.get(run.job_id)
        if rec is None:
            continue
        target = place(live, rec.spec.tags, rotor)
        if target is None:
            waited_from = max(run.scheduled_ms, run.not_before_ms)
            if ctx.now_ms - waited_from > rec.spec.misfire.grace_ms:
                reason = MissReason.overload.value if live else MissReason.no_node.value
                drop.append([run.run_id, "shed", reason])
            continue
        target.load += 1
        rotor += 1
        budget -= 1
        place_items.append([run.run_id, target.node_id])

    for rec in st.due_jobs(horizon, MAX_JOBS_PER_PLAN):
        if budget <= 0:
            break
        spec = rec.spec
        outcome, reason = late_reason(fire_ms=rec.next_ms or ctx.now_ms,
                                      leader_since_ms=ctx.since_ms,
                                      leader_boot_ms=ctx.boot_ms, last_leader_ms=last_leader_ms)
        res = classify(schedule=spec.schedule, hwm_ms=rec.hwm_ms, now_ms=ctx.now_ms,
                       lookahead_ms=ctx.lookahead_ms, misfire=spec.misfire, reason=reason)
        if res.hwm_ms is None:
            continue
        hwm = rec.hwm_ms
        active = [(r, st.runs[r].state) for r in rec.active]
        items: list[list[Any]] = []
        blocked = False
        for m in res.missed:
            m_outcome = outcome if m.reason == reason else "missed"
            items.append(["miss", spec.id, m.first_ms, m.last_ms, m.count, m_outcome, m.reason])
            hwm = m.last_ms
        for fire in res.run:
            decision = overlap_decision(spec.overlap, active)
            if decision.action == "skip" and fire > ctx.now_ms:
                # Not yet its time: the previous run may be over already with its
                # finish still in flight (typically held up by an election). Decide at
                # the fire time; the finish, when it lands, wakes the leader.
                blocked = True
                break
            if decision.action == "skip":
                items.append(["miss", spec.id, fire, fire, 1, "skipped",
                              MissReason.overlap.value])
                hwm = fire
                continue
            for run_id in decision.cancel:
                drop.append([run_id, "cancelled", "replaced"])
            active = [a for a in active if a[0] not in decision.cancel]
            queued = decision.action == "queue"
            target = None if queued else place(live, spec.tags, rotor)
            if target is None and not queued:
                # No room now: keep the mark here and try again next tick; once it is
                # past the grace the miss detector records it shed (overload).
                if not live or not any(c.tags.issuperset(spec.tags) for c in live):
                    if ctx.now_ms - fire > spec.misfire.grace_ms:
                        items.append(["miss", spec.id, fire, fire, 1, "missed",
                                      MissReason.no_node.value])
                        hwm = fire
                        continue
                blocked = True
                break
            if target is not None:
                target.load += 1
                rotor += 1
            budget -= 1
            items.append(["run", spec.id, fire, target.node_id if target else None, queued])
            # Overlap is judged against the runs active before this plan: several fire
            # times in one plan only happen in a catch-up, which the policy asked for.
            # But overlap = queue buffers ONE fire: the later ones see it and are skipped.
            if queued:
                active.append((f"{spec.id}@{fire}", "queued"))
            hwm = fire
        fires.extend(_merge_misses(items))
        versions[spec.id] = rec.version
        if hwm != rec.hwm_ms or not blocked:
            nxt.append([spec.id, next_fire(spec.schedule, hwm)])
    if not (fires or place_items or drop or nxt):
        return None
    return {"op": "plan", "at": ctx.now_ms, "term": ctx.term, "leader": ctx.node_id,
            "fires": fires, "place": place_items, "drop": drop, "next": nxt,
            "versions": versions}


def _merge_misses(items: list[list[Any]]) -> list[list[Any]]:
    """Fold consecutive misses with the same outcome and reason into ranges."""
    out: list[list[Any]] = []
    for item in items:
        prev = out[-1] if out else None
        if (prev is not None and item[0] == "miss" and prev[0] == "miss"
                and prev[5] == item[5] and prev[6] == item[6]):
            prev[3] = item[3]
            prev[4] += item[4]
        else:
            out.append(list(item))
    return out
