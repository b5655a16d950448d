"""Claim transitions of the state machine: plan (assign), start, finish, release.

Split from :mod:`raftsched.state` to keep each module on one job. Every function here
runs inside ``ClusterState.apply`` — pure, deterministic, time from the command.
Batched commands accept or reject each item on its own; a rejected item changes
nothing (the rejection goes out as an effect, for events and metrics).
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

from raftsched.errors import Conflict, InvalidArgument
from raftsched.model import RunState, run_id_of
from raftsched.records import RunRecord
from raftsched.trigger import next_fire

if TYPE_CHECKING:
    from raftsched.records import JobRecord
    from raftsched.state import ClusterState

_PENDING = RunState.pending.value
_QUEUED = RunState.queued.value
_ASSIGNED = RunState.assigned.value
_STARTED = RunState.started.value
#: Only the newest runs of a job keep their output tail in the replicated state;
#: older history keeps its outcome but drops the text (bounded memory and snapshots).
TAILS_KEPT = 5
#: Outcomes a worker may report in ``finish``.
_FINISH_OUTCOMES = frozenset({"succeeded", "failed", "timed_out", "shed", "cancelled",
                              "lost", "missed"})
#: Outcomes a leader may record for a fire time that did not run.
_MISS_OUTCOMES = frozenset({"missed", "skipped", "shed"})
#: Outcomes a leader may impose on an active run.
_DROP_OUTCOMES = frozenset({"shed", "cancelled", "missed"})
MAX_BATCH = 20000
MAX_TAIL = 65536


# ---------------------------------------------------------------- building blocks

def new_run(st: ClusterState, rec: JobRecord, sched: int, at: int, *, manual: bool = False,
            state: RunState = RunState.pending) -> RunRecord:
    run = RunRecord(run_id=run_id_of(rec.spec.id, sched), job_id=rec.spec.id,
                    scheduled_ms=sched, created_ms=at, state=state.value, manual=manual)
    run.note(at, "manual" if manual else "")
    st.runs[run.run_id] = run
    if run.state == _PENDING:
        st.pending[run.run_id] = None
    rec.add_active(run.run_id)
    st.effects.append(("created", run.run_id))
    return run


def assign(st: ClusterState, run: RunRecord, node: str, at: int) -> None:
    st.fence += 1
    run.fence = st.fence
    run.node = node
    run.state = _ASSIGNED
    run.assigned_ms = at
    st.pending.pop(run.run_id, None)
    st.by_node.setdefault(node, set()).add(run.run_id)
    run.note(at)
    st.effects.append(("assigned", run.run_id, node, run.fence))


def _unlink(st: ClusterState, run: RunRecord) -> None:
    if run.node is not None:
        on = st.by_node.get(run.node)
        if on is not None:
            on.discard(run.run_id)


def end_run(st: ClusterState, run: RunRecord, at: int, state: RunState, reason: str, *,
            keep_history: bool = True) -> None:
    """Move an active run to a terminal state (and history), releasing its claim."""
    was_started = run.state == _STARTED
    _unlink(st, run)
    st.runs.pop(run.run_id, None)
    st.pending.pop(run.run_id, None)
    rec = st.jobs.get(run.job_id)
    if rec is not None:
        rec.drop_active(run.run_id)
    run.state = state.value
    run.reason = reason
    run.finished_ms = at
    run.note(at, reason)
    st.totals[run.state] = st.totals.get(run.state, 0) + 1
    if was_started and state is RunState.cancelled and run.node is not None:
        # The node must stop the process: its finish will be refused from now on.
        st.effects.append(("cancel", run.run_id, run.node))
    st.effects.append(("ended", run.run_id, run.state, run.node, reason))
    if rec is None:
        return
    if keep_history:
        _push(_history(st, run.job_id), run)
        rec.last = (run.run_id, run.state, reason, at)
    _release_queued(st, rec, at)


def _history(st: ClusterState, job_id: str) -> deque[RunRecord]:
    """The job's history, created on first use: an empty deque costs ~600 bytes, and
    most of a million far-future jobs never run."""
    hist = st.history.get(job_id)
    if hist is None:
        hist = st.history[job_id] = deque(maxlen=st.history_limit)
    return hist


def _push(hist: Any, run: RunRecord) -> None:
    hist.append(run)
    if len(hist) > TAILS_KEPT and hist[-TAILS_KEPT - 1].tail:
        hist[-TAILS_KEPT - 1].tail = ""


def _release_queued(st: ClusterState, rec: JobRecord, at: int) -> None:
    """``overlap = queue``: the buffered run becomes pending when nothing else runs."""
    queued = None
    for run_id in rec.active:
        run = st.runs[run_id]
        if run.state == _QUEUED:
            queued = run
        else:
            return
    if queued is not None:
        queued.state = _PENDING
        st.pending[queued.run_id] = None
        queued.note(at, "dequeued")


def record_miss(st: ClusterState, rec: JobRecord, first: int, last: int, count: int,
                state: RunState, reason: str, at: int) -> None:
    """Record fire times ``first..last`` (``count`` of them) that did not run.

    Consecutive misses with the same outcome and reason fold into one range record,
    so a long outage or a long overload costs one history entry, not thousands."""
    hist = _history(st, rec.spec.id)
    st.totals[state.value] = st.totals.get(state.value, 0) + count
    rec.last = (run_id_of(rec.spec.id, first), state.value, reason, at)
    prev = hist[-1] if hist else None
    if (prev is not None and prev.state == state.value and prev.reason == reason
            and not prev.manual and prev.started_ms is None
            and (prev.until_ms or prev.scheduled_ms) < first
            # Only a contiguous range folds: a run between them must stay visible.
            and next_fire(rec.spec.schedule, prev.until_ms or prev.scheduled_ms) == first):
        prev.until_ms = last
        prev.count += count
        prev.finished_ms = at
        st.effects.append(("missed", prev.run_id, state.value, reason, first, last, count))
        return
    run = RunRecord(run_id=run_id_of(rec.spec.id, first), job_id=rec.spec.id,
                    scheduled_ms=first, created_ms=at, state=state.value, reason=reason,
                    finished_ms=at, until_ms=last if last != first else None, count=count)
    run.note(at, reason)
    hist.append(run)
    st.effects.append(("missed", run.run_id, state.value, reason, first, last, count))


# ---------------------------------------------------------------- commands

def _items(cmd: dict[str, Any], key: str, width: int) -> list[list[Any]]:
    items = cmd.get(key, [])
    if not isinstance(items, list) or len(items) > MAX_BATCH:
        raise InvalidArgument(key, f"must be a list of at most {MAX_BATCH} items")
    for item in items:
        if not isinstance(item, list) or len(item) != width:
            raise InvalidArgument(key, f"each item must be a list of {width} values")
    return items


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def apply_plan(st: ClusterState, cmd: dict[str, Any], at: int) -> dict[str, Any]:
    """The leader's batch: fire times, placements, drops and next-fire hints.

    ``fires`` holds, in time order per job:
      ``["run", job, scheduled_ms, node|None, queued]`` — a run for a fire time above
      the job's high-water mark (raises the mark); assigned at once if ``node`` is set;
      ``["miss", job, first_ms, last_ms, count, outcome, reason]`` — fire times that will
      not run (``first_ms`` above the mark, which rises to ``last_ms``).
    ``place``: ``[run_id, node]`` — assign a pending run (new fence).
    ``drop``:  ``[run_id, outcome, reason]`` — end an active run (shed, cancelled).
    ``next``:  ``[job, next_ms|None]`` — the next fire time after the mark.
    """
    term = cmd.get("term")
    if not _is_int(term):
        raise InvalidArgument("term", "must be an integer")
    if term < st.leader["term"]:
        raise Conflict("plan", f"from term {term}, older than {st.leader['term']}")
    fires = cmd.get("fires", [])
    if not isinstance(fires, list) or len(fires) > MAX_BATCH or not all(
            isinstance(f, list) and len(f) in (5, 7) for f in fires):
        raise InvalidArgument("fires", "must be a list of run/miss items")
    place, drop, nxt = _items(cmd, "place", 2), _items(cmd, "drop", 3), _items(cmd, "next", 2)
    versions = cmd.get("versions", {})
    if not isinstance(versions, dict):
        raise InvalidArgument("versions", "must be a map of job id to version")
    rejected: list[list[Any]] = []
    for item in fires:
        kind, job_id = item[0], item[1]
        rec = st.jobs.get(job_id) if isinstance(job_id, str) else None
        if rec is not None and versions.get(job_id, rec.version) != rec.version:
            # Planned from an older version of the job (changed since): its schedule
            # and policies may differ, so none of its items apply; the next plan redoes it.
            rec = None
        if kind == "miss" and len(item) == 7:
            _, _, first, last, count, outcome, reason = item
            if (rec is None or not _is_int(first) or not _is_int(last) or not _is_int(count)
                    or first > last or first <= rec.hwm_ms or count < 1
                    or not isinstance(outcome, str) or outcome not in _MISS_OUTCOMES
                    or not isinstance(reason, str)):
                rejected.append(["miss", job_id, first])
                continue
            record_miss(st, rec, first, last, count, RunState(outcome), reason[:64], at)
            rec.hwm_ms = last
        elif kind == "run" and len(item) == 5:
            _, _, sched, node, queued = item
            if (rec is None or not _is_int(sched) or sched <= rec.hwm_ms or rec.spec.paused
                    or (node is not None and not isinstance(node, str))
                    or not isinstance(queued, bool) or len(rec.active) >= 64
                    or run_id_of(job_id, sched) in st.runs):  # e.g. a manual run's id
                rejected.append(["run", job_id, sched])
                continue
            rec.hwm_ms = sched
            run = new_run(st, rec, sched, at,
                          state=RunState.queued if queued else RunState.pending)
            if node is not None and not queued and _node_ok(st, node):
                assign(st, run, node, at)
            elif queued:
                # The run it queues behind may have ended since the plan was made.
                _release_queued(st, rec, at)
        else:
            rejected.append(["fire", job_id])
    for run_id, outcome, reason in drop:
        run = st.runs.get(run_id) if isinstance(run_id, str) else None
        if run is None or not isinstance(outcome, str) or outcome not in _DROP_OUTCOMES \
                or not isinstance(reason, str):
            rejected.append(["drop", run_id])
            continue
        end_run(st, run, at, RunState(outcome), reason[:64])
    for run_id, node in place:
        run = st.runs.get(run_id) if isinstance(run_id, str) else None
        if run is None or run.state != _PENDING or not isinstance(node, str) \
                or not _node_ok(st, node):
            rejected.append(["place", run_id])
            continue
        assign(st, run, node, at)
    for job_id, next_ms in nxt:
        rec = st.jobs.get(job_id) if isinstance(job_id, str) else None
        if rec is not None and versions.get(job_id, rec.version) != rec.version:
            rec = None
        if rec is None or not (next_ms is None or (_is_int(next_ms) and next_ms > rec.hwm_ms)):
            rejected.append(["next", job_id])
            continue
        st._set_next(rec, next_ms)
    st.leader["last_ms"] = max(st.leader["last_ms"], at)
    if rejected:
        st.effects.append(("plan_rejected", rejected[:50]))
    return {"ok": True, "rejected": rejected[:200], "fence": st.fence}


def _node_ok(st: ClusterState, node: str) -> bool:
    rec = st.nodes.get(node)
    return rec is not None and rec.alive


def apply_start(st: ClusterState, cmd: dict[str, Any], at: int) -> dict[str, Any]:
    """A node starts assigned runs: each is accepted only with its current fence."""
    node = cmd.get("node")
    if not isinstance(node, str):
        raise InvalidArgument("node", "must be a node id")
    results: list[Any] = []
    for run_id, fence in _items(cmd, "items", 2):
        run = st.runs.get(run_id) if isinstance(run_id, str) else None
        if run is None or run.state != _ASSIGNED or run.node != node or run.fence != fence:
            current = run.fence if run is not None else None
            results.append([False, current])
            st.effects.append(("start_rejected", run_id, node, fence, current))
            continue
        run.state = _STARTED
        run.started_ms = at
        run.note(at)
        results.append([True, fence])
        st.effects.append(("started", run.run_id, node, fence))
    return {"ok": True, "results": results}


def apply_finish(st: ClusterState, cmd: dict[str, Any], at: int) -> dict[str, Any]:
    """A node reports outcomes ``[run_id, fence, outcome, exit_code, tail, reason]``."""
    node = cmd.get("node")
    if not isinstance(node, str):
        raise InvalidArgument("node", "must be a node id")
    results: list[Any] = []
    for run_id, fence, outcome, exit_code, tail, reason in _items(cmd, "items", 6):
        run = st.runs.get(run_id) if isinstance(run_id, str) else None
        ok_state = run is not None and (
            (run.state == _STARTED and outcome != "missed")
            or (run.state == _ASSIGNED and outcome in ("shed", "cancelled", "missed")))
        if (not ok_state or run.node != node or run.fence != fence
                or not isinstance(outcome, str) or outcome not in _FINISH_OUTCOMES
                or not (exit_code is None or _is_int(exit_code))
                or not isinstance(tail, str) or not isinstance(reason, str)):
            current = run.fence if run is not None else None
            results.append([False, current])
            st.effects.append(("finish_rejected", run_id, node, fence, current))
            continue
        run.exit_code = exit_code
        run.tail = tail[-MAX_TAIL:]
        rec = st.jobs.get(run.job_id)
        retries = rec.spec.retries if rec is not None else None
        if outcome == "lost":
            # The node stopped the run itself (lost quorum, shutdown): as if lost.
            if (rec is not None and rec.spec.on_node_lost.value == "retry"
                    and not rec.spec.paused):
                _retry(st, run, at, RunState.lost, reason[:200], at)
            else:
                end_run(st, run, at, RunState.lost, reason[:200])
        elif (outcome in ("failed", "timed_out") and retries is not None
                and run.attempt <= retries.max and not rec.spec.paused):
            _retry(st, run, at, RunState(outcome), reason[:200],
                   at + retries.delay_ms(run.attempt))
        else:
            end_run(st, run, at, RunState(outcome), reason[:200])
        results.append([True, fence])
    return {"ok": True, "results": results}


def _retry(st: ClusterState, run: RunRecord, at: int, outcome: RunState, reason: str,
           not_before: int) -> None:
    """Keep the failed attempt in history, then make the run pending for the next one."""
    attempt = run.copy()
    attempt.state = outcome.value
    attempt.reason = reason
    attempt.finished_ms = at
    attempt.note(at, "retrying")
    if run.job_id in st.jobs:
        _push(_history(st, run.job_id), attempt)
    st.totals[outcome.value] = st.totals.get(outcome.value, 0) + 1
    _unlink(st, run)
    st.effects.append(("ended", run.run_id, outcome.value, run.node, reason + " (retrying)"))
    run.attempt += 1
    run.state = _PENDING
    st.pending[run.run_id] = None
    run.node = None
    run.started_ms = None
    run.exit_code = None
    run.not_before_ms = not_before
    run.note(at, f"retry attempt {run.attempt}")


def apply_release(st: ClusterState, cmd: dict[str, Any], at: int) -> dict[str, Any]:
    """The leader declares a node gone: its claims are released at once.

    Assigned (not started) runs go back to pending and are placed again with a new
    fence; with ``scope = all`` started runs follow the job's ``on_node_lost``."""
    node = cmd.get("node")
    scope = cmd.get("scope", "all")
    reason = cmd.get("reason", "node lost")
    if not isinstance(node, str) or node not in st.nodes:
        raise InvalidArgument("node", "must be a known node id")
    if scope not in ("assigned", "all") or not isinstance(reason, str):
        raise InvalidArgument("scope", "must be 'assigned' or 'all'")
    released = release_node(st, node, at, scope, reason[:64])
    if scope == "all":
        nrec = st.nodes[node]
        if nrec.alive:
            nrec.alive = False
            nrec.lost_ms = at
            st.effects.append(("node_lost", node, reason[:64]))
    return {"ok": True, "released": released}


def release_node(st: ClusterState, node: str, at: int, scope: str, reason: str) -> list[str]:
    """Release a node's claims: ``assigned`` runs (scope ``assigned`` or ``all``) go back
    to pending; ``started`` runs (scope ``started`` or ``all``) follow ``on_node_lost``."""
    released: list[str] = []
    for run in st.active_on(node):
        if run.state == _ASSIGNED and scope in ("assigned", "all"):
            _unlink(st, run)
            run.state = _PENDING
            run.node = None
            st.pending[run.run_id] = None
            run.note(at, f"released: {reason}")
            released.append(run.run_id)
        elif run.state == _STARTED and scope in ("started", "all"):
            rec = st.jobs.get(run.job_id)
            if (rec is not None and rec.spec.on_node_lost.value == "retry"
                    and not rec.spec.paused):
                _retry(st, run, at, RunState.lost, f"node {node} {reason}", at)
            else:
                end_run(st, run, at, RunState.lost, f"node {node} {reason}")
            released.append(run.run_id)
    if released:
        st.effects.append(("released", node, released, reason))
    return released
