"""The checks that make the nemesis fail on a cluster that keeps its promises only by
doing nothing (issue 27 item 3): a ``succeeded`` record needs an execution behind it,
nothing is left unsettled, the work gets done outside fault windows, two runs of a
``skip``/``queue`` job never execute at once, read errors happen only around faults, a
leader returns after every heal, and the guard does not kill runs as they start.

Pure functions over plain data, like :mod:`tests.nemesis.checker`; each returns
findings (dicts with a ``kind``).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from typing import Any

from tests.nemesis.checker import Execution, _brief, fire_outcomes

#: Active states: the run has no outcome yet.
ACTIVE = frozenset({"pending", "queued", "assigned", "started"})
#: A fire time this close to a fault (before its start, after its heal: an election,
#: a catch-up, a node's restart) is not counted for progress, nor a read error then.
BEFORE_S = 1.0
AFTER_S = 5.0
#: Outside those windows at least this share of fire times must have succeeded or
#: ended as their overlap policy says while another run of the job was working.
MIN_SUCCESS = 0.9
#: (state, reason) outcomes of the overlap policies: the job was busy, not idle.
POLICY_OUTCOMES = frozenset({("skipped", "overlap"), ("cancelled", "replaced")})
#: A guard kill this soon after the run's start is a guard that killed a live run.
GUARD_KILL_SOON_MS = 300


def check_succeeded_executed(runs: dict[str, list[dict[str, Any]]],
                             execs: list[Execution], hi_ms: int) -> list[dict[str, Any]]:
    """Every ``succeeded`` record due by ``hi_ms`` has an execution in the witness with
    its run id and fence (``succeeded_without_execution`` otherwise)."""
    seen = {(e.run_id, e.fence) for e in execs}
    out = []
    for rs in runs.values():
        for r in rs:
            if r.get("state") == "succeeded" and int(r["scheduled_ms"]) <= hi_ms \
                    and (r["run_id"], int(r.get("fence") or 0)) not in seen:
                out.append({"kind": "succeeded_without_execution", "run_id": r["run_id"],
                            "fence": r.get("fence"), "node": r.get("node")})
    return out


def check_settled(runs: dict[str, list[dict[str, Any]]], hi_ms: int) -> list[dict[str, Any]]:
    """After the settle time no run due by ``hi_ms`` is still active (``unsettled``)."""
    return [{"kind": "unsettled", "run_id": r["run_id"], "state": r["state"],
             "fire_ms": r["scheduled_ms"]}
            for rs in runs.values() for r in rs
            if r.get("state") in ACTIVE and int(r["scheduled_ms"]) <= hi_ms]


def check_guard_kills(runs: dict[str, list[dict[str, Any]]],
                      execs: Iterable[Execution] = ()) -> list[dict[str, Any]]:
    """A run the guard ended within GUARD_KILL_SOON_MS of its start
    (``guard_kill_at_start``): the guard killed a run its node had just started.

    Two clocks say how long it ran, and the nemesis can fool each: the record's start
    and finish are stamped by its node's clock, which a clock fault steps (a step back
    between them made runs killed seconds after they began look killed at once, or
    before they began: a 1,000-fault run had 8 such records, finished 4-6 s "before"
    they started); its witness (the host's clock, from its fork or its start line to its
    last sign of life) stops while a freeze holds the node with its jobs. A kill is
    soon only when both say so (or the record alone, with no witness); a record whose
    times run backwards and that no witness saw cannot be judged
    (``guard_kill_unjudged``, reported, not a violation)."""
    lived = {(e.run_id, e.fence): e.last - min(e.start, e.forked or e.start) for e in execs}
    out = []
    for rs in runs.values():
        for r in rs:
            s, f = r.get("started_ms"), r.get("finished_ms")
            if not (str(r.get("reason", "")).startswith("guard:") and s and f
                    and f - s < GUARD_KILL_SOON_MS):
                continue
            alive_s = lived.get((r["run_id"], r.get("fence")))
            if alive_s is not None and alive_s * 1000 >= GUARD_KILL_SOON_MS:
                continue  # its process lived that long by the host's own clock
            kind = ("guard_kill_unjudged" if alive_s is None and f < s
                    else "guard_kill_at_start")
            out.append({"kind": kind, "run_id": r["run_id"], "after_ms": f - s,
                        "reason": r.get("reason"), "witnessed_alive_ms": None
                        if alive_s is None else round(alive_s * 1000)})
    return out


def quiet(t: float, faults: Iterable[tuple[float, float]]) -> bool:
    """Is wall time ``t`` away from every fault ``(start, healed)`` by the margins?"""
    return all(not (s - BEFORE_S <= t <= (h or float("inf")) + AFTER_S) for s, h in faults)


#: After a measured outage ends (a leader with a quorum answers again) its first plans
#: record what the outage missed and start what is due: this long is the recovery's.
OUTAGE_AFTER_S = 2.0


def served(t: float, outages: Iterable[tuple[float, float]]) -> bool:
    """Is wall time ``t`` away from every measured outage ``(start, length)``: a leader
    with a quorum answered from BEFORE_S before it to OUTAGE_AFTER_S after?"""
    return all(not (s - BEFORE_S <= t <= s + w + OUTAGE_AFTER_S) for s, w in outages)


def check_progress(runs: dict[str, list[dict[str, Any]]], periods: dict[str, int],
                   lo_ms: dict[str, int], hi_ms: int, execs: list[Execution],
                   faults: list[tuple[float, float]],
                   outages: Iterable[tuple[float, float]] = ()
                   ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The work got done: executions were witnessed, and of the fire times away from
    every fault and every measured outage some succeeded and at least MIN_SUCCESS
    succeeded or ended by their overlap policy (``no_progress`` otherwise).

    A restart of a majority is healed when its processes start, but the cluster answers
    only once they have loaded and elected (``outages``, measured by the status
    monitor, and bounded apart by :func:`check_leader_returns` and the unavailability
    figures): a fire time in that recovery is judged by the outage figures, not here.
    The figures also give the share counted from the heals alone (``quiet_*``) and how
    the fire times judged here that did not succeed ended. Returns the figures and the
    findings."""
    outages = list(outages)
    quiet_n = ok = succeeded = 0
    judged_n = judged_ok = judged_succeeded = 0
    failed: Counter[str] = Counter()
    for job, rs in runs.items():
        state: dict[str, set[tuple[str, str]]] = defaultdict(set)
        for r in rs:
            state[r["run_id"]].add((str(r.get("state")), str(r.get("reason") or "")))
        outcomes = fire_outcomes(rs, periods[job], lo_ms[job], hi_ms)
        first = -(-lo_ms[job] // periods[job]) * periods[job]
        for t in range(first, hi_ms + 1, periods[job]):
            if not quiet(t / 1000, faults):
                continue
            up = served(t / 1000, outages)
            quiet_n += 1
            judged_n += up
            ends = {e for r in outcomes.get(t, ()) for e in state[r]}
            if any(s == "succeeded" for s, _ in ends):
                succeeded += 1
                ok += 1
                judged_succeeded += up
                judged_ok += up
            elif ends & POLICY_OUTCOMES:
                ok += 1
                judged_ok += up
            elif up:
                failed.update(f"{s} ({r})" if r else s for s, r in ends or {("none", "")})
    share = judged_ok / judged_n if judged_n else 0.0
    figures = {"fire_times": judged_n, "succeeded": judged_succeeded,
               "success": round(share, 4), "executions": len(execs),
               "not_succeeded": dict(failed.most_common()),
               "quiet_fire_times": quiet_n, "quiet_succeeded": succeeded,
               "quiet_success": round(ok / quiet_n, 4) if quiet_n else 0.0}
    findings = []
    if not execs or judged_n == 0 or judged_succeeded == 0 or share < MIN_SUCCESS:
        findings.append({"kind": "no_progress", **figures})
    return figures, findings


def check_job_overlap(overlap: dict[str, str],
                      execs: list[Execution]) -> list[dict[str, Any]]:
    """Under ``overlap = skip``/``queue`` two runs (different run ids) of one job never
    execute at the same time (``job_overlap``; a whole-node freeze makes it a
    ``freeze_window`` through :func:`checker.attribute_freezes`)."""
    by_job: dict[str, list[Execution]] = defaultdict(list)
    for e in execs:
        if overlap.get(e.job_id) in ("skip", "queue"):
            by_job[e.job_id].append(e)
    out = []
    for job, es in by_job.items():
        es.sort(key=lambda e: e.start)
        for i, a in enumerate(es):
            for b in es[i + 1:]:
                if b.start >= a.last:
                    break
                if b.run_id != a.run_id:
                    out.append({"kind": "job_overlap", "job": job, "run_id": b.run_id,
                                "policy": overlap[job],
                                "overlap_s": round(a.last - b.start, 3),
                                "executions": [_brief(a), _brief(b)]})
    return out


def check_read_errors(error_times: list[float], faults: list[tuple[float, float]],
                      outages: list[tuple[float, float]]) -> list[dict[str, Any]]:
    """A read that failed away from every fault and every measured outage
    (``read_error_unexplained``); times on the readers' clock (wall)."""
    out = []
    for t in error_times:
        if quiet(t, faults) and not any(s - BEFORE_S <= t <= s + w + AFTER_S
                                        for s, w in outages):
            out.append({"kind": "read_error_unexplained", "t": round(t, 3)})
    return out


def check_leader_returns(misses: list[float]) -> list[dict[str, Any]]:
    """Each heal after which no leader answered within 30 s (``no_leader_after_heal``)."""
    return [{"kind": "no_leader_after_heal", "healed": round(t, 3)} for t in misses]


#: The outcomes each ``on`` of a dependent job accepts (core/specext.py ON_STATES).
ON_ACCEPTS = {"success": frozenset({"succeeded"}),
              "failure": frozenset({"failed", "timed_out", "lost"}),
              "always": frozenset({"succeeded", "failed", "timed_out", "lost"})}


def check_children(runs: dict[str, list[dict[str, Any]]],
                   deps: dict[str, tuple[list[str], str]], hi_ms: int
                   ) -> list[dict[str, Any]]:
    """``deps``: dependent job -> (its parents, its ``on``). A child run exactly once per
    fire time whose every parent's run ended in an accepted outcome (``child_missing``,
    ``child_doubled``), and none for another (``child_unexpected``). Only fire times all
    the jobs' kept histories still cover (they are bounded) and due by ``hi_ms``."""
    out: list[dict[str, Any]] = []
    for child, (parents, on) in sorted(deps.items()):
        accepts = ON_ACCEPTS[on]
        jobs = [*parents, child]
        if not all(runs.get(j) for j in parents):
            continue
        lo = max(min(int(r["scheduled_ms"]) for r in runs[j]) for j in jobs if runs.get(j))
        final: dict[str, dict[int, str]] = {}
        for p in parents:
            # The newest record of a fire time is its final outcome (retried attempts
            # come first); runs come newest first.
            ends: dict[int, str] = {}
            for r in runs[p]:
                if r.get("until_ms") is None:
                    ends.setdefault(int(r["scheduled_ms"]), str(r["state"]))
            final[p] = ends
        matched = {t for t in final[parents[0]]
                   if lo <= t <= hi_ms and all(final[p].get(t) in accepts for p in parents)}
        made: dict[int, int] = defaultdict(int)
        for r in runs.get(child, ()):
            t = int(r["scheduled_ms"])
            if lo <= t <= hi_ms and r.get("until_ms") is None \
                    and r["run_id"] == f"{child}@{t}" and "retrying" not in _notes(r):
                made[t] += 1
        for t in sorted(matched - set(made)):
            out.append({"kind": "child_missing", "job": child, "fire_ms": t,
                        "parents": {p: final[p].get(t) for p in parents}})
        for t in sorted(set(made) - matched):
            out.append({"kind": "child_unexpected", "job": child, "fire_ms": t,
                        "parents": {p: final[p].get(t) for p in parents}})
        for t, n in sorted(made.items()):
            if n > 1:
                out.append({"kind": "child_doubled", "job": child, "fire_ms": t, "records": n})
    return out


def _notes(r: dict[str, Any]) -> list[str]:
    """A record's transition notes (a retried attempt's last one is ``retrying``)."""
    return [str(t.get("note") if isinstance(t, dict) else t[4]) for t in
            r.get("transitions") or ()][-1:]
