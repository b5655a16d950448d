"""Which node writes the event line for an applied effect.

Every replica applies every command, so every node sees every effect. Events for
cluster-wide facts are written by the leader only (one line per fact in the cluster);
a node writes its own worker's events (a refused start or finish) itself.
"""

from __future__ import annotations

import logging

from raftsched.core.effects import (
    ClaimRefused,
    ClaimsReleased,
    Effect,
    FireCovered,
    JobPaused,
    JobPut,
    JobRemoved,
    JobResumed,
    LeaderChanged,
    NodeBack,
    NodeCertified,
    NodeDraining,
    NodeLost,
    NotifyDone,
    PlanRejected,
    RangeMissed,
    RunAssigned,
    RunEnded,
)
from raftsched.node.observe import events

log = logging.getLogger("raftsched.node")

#: Event names of the job effects.
_JOB_EVENTS = {JobPut: "job.put", JobRemoved: "job.removed", JobPaused: "job.paused",
               JobResumed: "job.resumed"}


#: The effects a node that does not lead may write a line for (its own news); a
#: follower's share of every run's effects returns before the match.
_ANY_NODE = frozenset({LeaderChanged, ClaimRefused})


def emit_for(eff: Effect, *, me: str, leads: bool) -> None:
    """Write ``eff``'s event line if node ``me`` is the one to (``leads``: this node's
    leader loop is active)."""
    if not leads and type(eff) not in _ANY_NODE:
        return
    match eff:
        case RunAssigned(run_id, node, fence) if leads:
            events.emit("run.assigned", node=me, run_id=run_id, assigned_to=node,
                        fence=fence)
        case RunEnded(run_id, state, node, reason) if leads:
            events.emit("run.ended", node=me, run_id=run_id, outcome=state, ran_on=node,
                        reason=reason)
        case RangeMissed(run_id, state, reason, first, last, count) if leads:
            events.emit(f"run.{state}", node=me, run_id=run_id, outcome=state,
                        reason=reason, first_ms=first, last_ms=last, count=count)
        case FireCovered(run_id) if leads:
            events.emit("run.covered", node=me, run_id=run_id,
                        reason="a kept record holds its run id")
        case ClaimsReleased(node, runs, reason) if leads:
            events.emit("claim.released", node=me, lost_node=node, runs=runs,
                        reason=reason)
        case NodeLost(node, reason) if leads:
            events.emit("node.lost", node=me, lost_node=node, reason=reason,
                        level=logging.WARNING)
        case NodeCertified(node, boot, by, released) if leads:
            events.emit("node.certified", node=me, dead_node=node, incarnation=boot,
                        proved_by=by, released=released, level=logging.WARNING)
        case NodeBack(node) if leads:
            events.emit("node.back", node=me, back_node=node)
        case NodeDraining(node, draining) if leads:
            events.emit("node.draining" if draining else "node.undrained", node=me,
                        drained_node=node)
        case LeaderChanged(node, term):
            events.emit("leader.changed", node=me, leader=node, term=term)
        case JobPut() | JobRemoved() | JobPaused() | JobResumed() if leads:
            events.emit(_JOB_EVENTS[type(eff)], node=me, job_id=eff.job_id)
        case ClaimRefused(op, run_id, node, fence, current) if node == me and not (
                op == "start" and current == fence):
            # (The same fence: a retried start whose first try committed; the worker
            # counts it as started, and so is it.)
            events.emit(f"run.{op}_rejected", node=me, run_id=run_id, fence=fence,
                        current_fence=current, reason=_refusal(op, fence, current),
                        level=logging.WARNING)
        case NotifyDone(key, state, attempts) if leads and state != "delivered":
            # The notifier logs each failed attempt; this is the final word on it.
            log.info("notification %s %s after %d attempts", key, state, attempts)
        case PlanRejected(items) if leads:
            # A plan from a copy the state moved past: harmless (the next plan redoes
            # those jobs), but a plan refused every time is a bug worth seeing.
            log.debug("plan items refused: %s", items[:5])


def _refusal(op: str, fence: int, current: int | None) -> str:
    """Why the state machine refused this node's start or finish of a run, in words (a
    bare ``current_fence=None`` read as an error after every restart)."""
    if current is None:
        return f"the run had already ended (or its job was removed) before this {op} committed"
    if current != fence:
        return f"the run moved on to attempt fence {current} (this node held fence {fence})"
    return "the run is not in a state this outcome can follow"


__all__ = ["emit_for"]
