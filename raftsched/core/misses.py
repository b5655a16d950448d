"""The miss detector: pure decisions about fire times that cannot simply run.

Given a job's high-water mark and the leader's ``now``, :func:`classify` splits the
fire times that are due into the ones to run and the ones to record as missed, by
the job's misfire policy. :func:`overlap_decision` applies the overlap policy to a
fire while earlier runs are active. Nothing here reads a clock or touches I/O.

Definitions (documented in docs/concepts.md, "What happens to every fire time"):

* A fire time ``f`` is *due* when ``f <= now + lookahead``; it is *late* when
  ``now - f > grace``.
* Due fire times that are not late run (for ``policy = once`` only the newest
  overdue one runs: the others are folded into it).
* Late fire times follow the policy: ``skip`` records them missed; ``once`` runs the
  newest one and records the others ``coalesced``; ``all`` runs the newest
  ``max_catchup`` of them, oldest first, and records the older rest ``catchup_limit``.
* Why a late fire time was missed is the caller's knowledge (``no_leader``,
  ``cluster_down``, ``overload`` …) and comes in as ``reason``.
"""

from __future__ import annotations

from dataclasses import dataclass

from raftsched.core.model import (
    FireAction,
    MisfirePolicy,
    MisfireSpec,
    MissReason,
    Overlap,
    RunState,
)
from raftsched.core.trigger import Schedule, count_fires, fire_times, latest_fire_at_or_before

#: Most fire times one job may put into one plan (on-time ones; a catch-up is
#: bounded by ``max_catchup`` as well).
MAX_DUE_PER_JOB = 64


@dataclass(frozen=True, slots=True, kw_only=True)
class MissRange:
    """Fire times that will not run.

    :var first_ms: the first of them.
    :var last_ms: the last of them.
    :var count: how many, exactly (counted per day, whatever the range).
    :var reason: a :class:`MissReason` value or a caller's reason.
    """

    first_ms: int
    last_ms: int
    count: int
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Classified:
    """What to do with a job's due fire times.

    :var run: fire times to run, ascending.
    :var missed: ranges to record as missed, ascending.
    :var hwm_ms: the new high-water mark (everything up to it is accounted for), or
        ``None`` if nothing was due.
    """

    run: tuple[int, ...]
    missed: tuple[MissRange, ...]
    hwm_ms: int | None


def classify(*, schedule: Schedule, hwm_ms: int, now_ms: int, lookahead_ms: int,
             misfire: MisfireSpec, reason: str) -> Classified:
    """Split the due fire times after ``hwm_ms`` by the misfire policy (see module doc)."""
    horizon = now_ms + lookahead_ms
    cutoff = now_ms - misfire.grace_ms  # fire times strictly below are late
    late_last = latest_fire_at_or_before(schedule, hwm_ms, cutoff - 1) if cutoff - 1 > hwm_ms \
        else None
    on_time_from = hwm_ms if late_last is None else late_last
    on_time = fire_times(schedule, on_time_from, horizon, MAX_DUE_PER_JOB)
    if late_last is None and not on_time:
        return Classified(run=(), missed=(), hwm_ms=None)
    run: list[int] = []
    missed: list[MissRange] = []
    policy = misfire.policy
    if late_last is not None:
        count = count_fires(schedule, hwm_ms, late_last)
        first = fire_times(schedule, hwm_ms, late_last, 1)[0]
        if policy is MisfirePolicy.skip:
            missed.append(MissRange(first_ms=first, last_ms=late_last, count=count,
                                    reason=reason))
        elif policy is MisfirePolicy.once:
            overdue_on_time = [f for f in on_time if f <= now_ms]
            if overdue_on_time:
                # A newer overdue fire within the grace absorbs every late one.
                missed.append(MissRange(first_ms=first, last_ms=late_last, count=count,
                                        reason=MissReason.coalesced.value))
            else:
                if count > 1:
                    before = _last_before(schedule, hwm_ms, late_last)
                    missed.append(MissRange(first_ms=first, last_ms=before, count=count - 1,
                                            reason=MissReason.coalesced.value))
                run.append(late_last)
        else:
            keep = _newest(schedule, hwm_ms, late_last, misfire.max_catchup)
            if count > len(keep):
                dropped_last = _last_before(schedule, hwm_ms, keep[0])
                missed.append(MissRange(first_ms=first, last_ms=dropped_last,
                                        count=count - len(keep),
                                        reason=MissReason.catchup_limit.value))
            run.extend(keep)
    if policy is MisfirePolicy.once and on_time and on_time[0] < now_ms:
        # The newest overdue fire may lie beyond the MAX_DUE_PER_JOB oldest in on_time.
        # (It is at most now_ms: with on_time[0] not yet due, there is none to look for,
        # which spares an on-time plan a backward calendar search.)
        newest = latest_fire_at_or_before(schedule, on_time_from, now_ms)
        if newest is not None and on_time[0] < newest:
            n = count_fires(schedule, on_time_from, newest)
            missed.append(MissRange(first_ms=on_time[0],
                                    last_ms=_last_before(schedule, on_time_from, newest),
                                    count=n - 1, reason=MissReason.coalesced.value))
            on_time = [newest, *fire_times(schedule, newest, horizon, MAX_DUE_PER_JOB)]
    run.extend(on_time)
    last = max([*run, *(m.last_ms for m in missed)])
    return Classified(run=tuple(run), missed=tuple(missed), hwm_ms=last)


def _last_before(schedule: Schedule, after_ms: int, before_ms: int) -> int:
    """The newest fire time in ``(after_ms, before_ms)``."""
    found = latest_fire_at_or_before(schedule, after_ms, before_ms - 1)
    assert found is not None, "caller guarantees an earlier fire time exists"
    return found


def _newest(schedule: Schedule, after_ms: int, until_ms: int, n: int) -> list[int]:
    """The newest ``n`` fire times in ``(after_ms, until_ms]``, ascending."""
    out: list[int] = []
    cursor = until_ms
    while len(out) < n:
        found = latest_fire_at_or_before(schedule, after_ms, cursor)
        if found is None:
            break
        out.append(found)
        cursor = found - 1
    out.reverse()
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class OverlapDecision:
    """What one fire does given the job's active runs.

    :var action: ``run`` (new run), ``queue`` (buffer it), ``skip`` (record skipped).
    :var cancel: active run ids to cancel first (``overlap = replace``).
    """

    action: FireAction
    cancel: tuple[str, ...] = ()


def overlap_decision(overlap: Overlap, active: list[tuple[str, str]]) -> OverlapDecision:
    """``active`` lists ``(run_id, state)`` of the job's active runs."""
    if not active or overlap is Overlap.allow:
        return OverlapDecision(action=FireAction.run)
    if overlap is Overlap.skip:
        return OverlapDecision(action=FireAction.skip)
    if overlap is Overlap.queue:
        if any(state == RunState.queued for _, state in active):
            return OverlapDecision(action=FireAction.skip)
        return OverlapDecision(action=FireAction.queue)
    return OverlapDecision(action=FireAction.run,
                           cancel=tuple(r for r, s in active if s != RunState.queued))


def late_reason(*, fire_ms: int, leader_since_ms: int, leader_boot_ms: int,
                last_leader_ms: int) -> tuple[RunState, str]:
    """``(outcome, reason)`` for a late fire time, from what the leader knows.

    If this leader was already leading when it fell due, it could not be placed in
    time: ``shed``/``overload``. Otherwise no leader handled it: ``cluster_down`` when
    this node was itself down then and no leader was active after it, else
    ``no_leader``."""
    if fire_ms >= leader_since_ms:
        return RunState.shed, MissReason.overload.value
    if fire_ms < leader_boot_ms and fire_ms > last_leader_ms:
        return RunState.missed, MissReason.cluster_down.value
    return RunState.missed, MissReason.no_leader.value
