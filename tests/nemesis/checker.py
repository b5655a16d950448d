"""The nemesis checker (Chronos-style): pure functions over what a run recorded.

Inputs are plain data: the witness lines the jobs wrote (start/tick/end of every
execution), the run records the cluster returned, the writer's and readers' histories,
node log lines and status polls. Each check returns a list of findings (dicts with a
``kind`` and enough detail to find the case); nothing here reads a clock or a file.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

#: Run states (in a record's transitions) that say the run was started on a node.
STARTED = {"started", "succeeded", "failed", "timed_out"}


@dataclass(frozen=True, slots=True, kw_only=True)
class Execution:
    """One execution of one attempt as its witness lines show it.

    :var run_id: ``job@scheduled_ms``.
    :var job_id: the job.
    :var fence: the fence it was given.
    :var attempt: its attempt number.
    :var node: the node that ran it.
    :var pid: its process id (tells two executions of one fence apart).
    :var start: wall time (s) it began.
    :var last: the last wall time (s) it was seen alive (its end if it ended).
    :var ended: whether it wrote its end line (false: killed, or still running).
    :var forked: wall time (s, 10 ms ticks) its process was forked, if known: before
        ``start`` by the interpreter's startup, or by a freeze of the whole node.
    """

    run_id: str
    job_id: str
    fence: int
    attempt: int
    node: str
    pid: int
    start: float
    last: float
    ended: bool
    forked: float | None = None

    @property
    def began(self) -> float:
        """When it was spawned, as well as the witness tells."""
        return min(self.start, self.forked) if self.forked is not None else self.start


def executions(witness: Iterable[dict[str, Any]]) -> list[Execution]:
    """Witness lines (``phase`` start/tick/end, keyed by pid and fence) -> executions."""
    by_key: dict[tuple[str, int, int], dict[str, Any]] = {}
    for w in witness:
        try:
            key = (str(w["RUN_ID"]), int(w["FENCE"]), int(w["pid"]))
        except (KeyError, TypeError, ValueError):
            continue
        e = by_key.get(key)
        if e is None:
            e = by_key[key] = {"w": w, "start": None, "last": float(w["t"]), "ended": False,
                               "forked": None}
        t = float(w["t"])
        if isinstance(w.get("forked"), (int, float)):
            e["forked"] = float(w["forked"])
        if w.get("phase", "start") == "start":
            e["start"] = t if e["start"] is None else min(e["start"], t)
        e["last"] = max(e["last"], t)
        if w.get("phase") == "end":
            e["ended"] = True
    out = []
    for (run_id, fence, pid), e in by_key.items():
        w = e["w"]
        start = e["start"] if e["start"] is not None else e["last"]
        out.append(Execution(run_id=run_id, job_id=str(w.get("JOB_ID")), fence=fence,
                             attempt=int(w.get("ATTEMPT") or 0), node=str(w.get("NODE_ID")),
                             pid=pid, start=start, last=e["last"], ended=e["ended"],
                             forked=e["forked"]))
    out.sort(key=lambda x: (x.run_id, x.start))
    return out


def fire_outcomes(records: Iterable[dict[str, Any]], period_ms: int, lo_ms: int,
                  hi_ms: int) -> dict[int, set[str]]:
    """Fire time in ``[lo_ms, hi_ms]`` -> the run ids whose records stand for it (a
    range record ``scheduled_ms..until_ms`` stands for every fire time of the period in
    it). One run id may have several records: one per attempt."""
    out: dict[int, set[str]] = defaultdict(set)
    for r in records:
        if r.get("manual"):
            continue
        first = int(r["scheduled_ms"])
        last = int(r.get("until_ms") or first)
        for t in range(max(first, first + (lo_ms - first) // period_ms * period_ms),
                       min(last, hi_ms) + 1, period_ms):
            if lo_ms <= t:
                out[t].add(r["run_id"])
    return out


def check_fire_times(job_id: str, records: list[dict[str, Any]], period_ms: int,
                     lo_ms: int, hi_ms: int) -> tuple[int, list[dict[str, Any]]]:
    """Every fire time of an every-``period_ms`` job in ``[lo_ms, hi_ms]`` has exactly one
    run (an outcome, or a run still active), and a range record counts its fire times
    right. Returns (fire times checked, findings)."""
    findings: list[dict[str, Any]] = []
    outcomes = fire_outcomes(records, period_ms, lo_ms, hi_ms)
    first = -(-lo_ms // period_ms) * period_ms
    checked = 0
    for t in range(first, hi_ms + 1, period_ms):
        checked += 1
        rs = outcomes.get(t, set())
        if not rs:
            findings.append({"kind": "no_outcome", "job": job_id, "fire_ms": t})
        elif len(rs) > 1:
            findings.append({"kind": "two_outcomes", "job": job_id, "fire_ms": t,
                             "runs": sorted(rs)})
    for r in records:
        count = int(r.get("count") or 1)
        if r.get("until_ms"):
            n = (int(r["until_ms"]) - int(r["scheduled_ms"])) // period_ms + 1
            if n != count:
                findings.append({"kind": "range_count", "job": job_id, "run_id": r["run_id"],
                                 "count": count, "fire_times": n})
    return checked, findings


def check_executions(policy: dict[str, str], execs: list[Execution],
                     records: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per run id: under ``fail`` at most one execution; under ``retry`` attempts never
    overlap in time and fences strictly increase in the order they were spawned; and
    every execution has a record (of some attempt of the run) saying it started with
    that fence."""
    findings: list[dict[str, Any]] = []
    by_run: dict[str, list[Execution]] = defaultdict(list)
    for e in execs:
        by_run[e.run_id].append(e)
    for run_id, es in by_run.items():
        es.sort(key=lambda e: e.start)
        on_lost = policy.get(es[0].job_id)
        if on_lost == "fail" and len({(e.fence, e.pid) for e in es}) > 1:
            findings.append({"kind": "double_execution", "run_id": run_id,
                             "executions": [_brief(e) for e in es]})
        spawned = sorted(es, key=lambda e: e.began)
        for a, b in zip(spawned, spawned[1:], strict=False):
            if b.fence <= a.fence:
                findings.append({"kind": "fence_not_increasing", "run_id": run_id,
                                 "executions": [_brief(a), _brief(b)]})
        for i, a in enumerate(es):
            for b in es[i + 1:]:
                if b.start < a.last:
                    findings.append({"kind": "overlapping_attempts", "run_id": run_id,
                                     "policy": on_lost, "overlap_s": round(a.last - b.start, 3),
                                     "executions": [_brief(a), _brief(b)]})
        recs = records.get(run_id, [])
        for e in es:
            started = any(
                (int(r.get("fence") or 0) == e.fence and r.get("started_ms") is not None)
                or any(state in STARTED and fence == e.fence
                       for state, fence in map(_state_fence, r.get("transitions") or ()))
                for r in recs)
            if not started:
                findings.append({"kind": "execution_without_record", "run_id": run_id,
                                 "execution": _brief(e),
                                 "records": [{k: r.get(k) for k in ("state", "fence", "reason",
                                                                   "attempt")} for r in recs]})
    return findings


def _state_fence(t: Any) -> tuple[Any, Any]:
    """(state, fence) of a record's transition: a map (the API's shape,
    ``{at_ms, state, node, fence, note}``) or a row ``[at_ms, state, node, fence, note]``."""
    if isinstance(t, dict):
        return t.get("state"), t.get("fence")
    return (t[1], t[3]) if len(t) > 3 else (None, None)


#: A frozen node's guard kills its old jobs at its first look after the thaw (it polls
#: every 50 ms): an old execution still running beside the new attempt longer than this
#: after the thaw is not the freeze window but a guard that failed, and stays an
#: ``overlapping_attempts`` finding. docs/concepts.md reports at most 10 ms, measured over
#: thousands of faults; the margin is for a loaded 2-core machine, which delays the guard's look.
FREEZE_WINDOW_BOUND_S = 0.25
#: The resolution of a witness's fork time (/proc counts clock ticks of 10 ms).
FORK_TICK_S = 0.02


def attribute_freezes(findings: list[dict[str, Any]],
                      freezes: list[tuple[str, float, float]]) -> list[dict[str, Any]]:
    """Overlapping attempts whose earlier execution's node was frozen (cgroup freeze of
    the node with its guard and jobs: a paused VM, ``(node, start, thawed)``) while the
    later one started become ``freeze_window`` findings measuring what fences exist for:
    how long the old execution still ran after the thaw, beside the new attempt
    (``after_thaw_s``), unless that is over :data:`FREEZE_WINDOW_BOUND_S`. The old one
    may also be the one whose start line came later: a process forked just before the
    freeze writes it after the thaw — then its fork time (``forked``, before the freeze:
    nothing forks in a frozen node) is the evidence; one forked after the thaw is a stale
    start and stays a finding (with the ``fence_not_increasing`` it also makes). Other
    findings pass through unchanged."""
    out = []
    for f in findings:
        if f["kind"] not in ("overlapping_attempts", "job_overlap"):
            out.append(f)
            continue
        a, b = f["executions"]
        hit = [(s, t) for node, s, t in freezes
               if node == a["node"] and s <= b["start"] <= t + 0.5 and t >= a["start"]]
        if not hit and b.get("forked") is not None and b["fence"] < a["fence"]:
            hit = [(s, t) for node, s, t in freezes
                   if node == b["node"] and s <= a["start"] <= t + 0.5
                   and b["forked"] <= s + FORK_TICK_S]
        if not hit:
            out.append(f)
            continue
        thawed = max(t for _, t in hit)
        after = max(0.0, min(a["last"], b["last"]) - thawed)
        kind = "freeze_window" if after <= FREEZE_WINDOW_BOUND_S else f["kind"]
        out.append(dict(f, kind=kind, after_thaw_s=round(after, 3)))
    return out


def _brief(e: Execution) -> dict[str, Any]:
    return {"node": e.node, "fence": e.fence, "attempt": e.attempt, "pid": e.pid,
            "start": round(e.start, 3), "last": round(e.last, 3), "ended": e.ended,
            "forked": None if e.forked is None else round(e.forked, 3)}


# ---------------------------------------------------------------- writes and reads


@dataclass(slots=True, kw_only=True)
class Op:
    """One write (put or delete) by the writer, in invocation order per key.

    :var key: the side job's id.
    :var seq: the writer's sequence number (also written into the spec); 0 is the
        initial "absent".
    :var kind: ``put`` or ``delete``.
    :var start: when it was invoked (s, monotonic or wall, one clock for all ops).
    :var end: when its reply arrived (None: no reply, the outcome is unknown).
    :var ok: acknowledged.
    """

    key: str
    seq: int
    kind: str
    start: float
    end: float | None = None
    ok: bool = False


@dataclass(slots=True, kw_only=True)
class Read:
    """One ``get_job``: what it returned (``seq`` of the spec, or None: no such job).

    :var key: the side job's id.
    :var seq: the sequence number in the spec read (None: absent).
    :var start: when it was invoked.
    :var end: when it returned.
    :var final: the read after all faults healed (a stale one is a lost write).
    :var partial: the spec's fields disagreed about its seq.
    """

    key: str
    seq: int | None
    start: float
    end: float
    final: bool = False
    partial: bool = False


@dataclass(slots=True)
class _KeyOps:
    ops: list[Op] = field(default_factory=list)


def check_reads(ops: list[Op], reads: list[Read]) -> list[dict[str, Any]]:
    """A read may return the value of a write W (a put's seq, or absent for a delete or
    the initial state) only if W was invoked before the read ended and no acknowledged
    write V invoked after W was acknowledged completed before the read started (W
    would then be overwritten for good). A stale final read is a lost write."""
    by_key: dict[str, list[Op]] = defaultdict(list)
    for op in ops:
        by_key[op.key].append(op)
    findings: list[dict[str, Any]] = []
    for rd in reads:
        kops = [Op(key=rd.key, seq=0, kind="delete", start=float("-inf"),
                   end=float("-inf"), ok=True)] + sorted(by_key.get(rd.key, []),
                                                         key=lambda o: o.seq)
        if rd.partial:
            findings.append({"kind": "partial_read", "key": rd.key, "seq": rd.seq})
        if rd.seq is None:
            candidates = [o for o in kops if o.kind == "delete"]
        else:
            candidates = [o for o in kops if o.seq == rd.seq and o.kind == "put"]
            if not candidates:
                findings.append({"kind": "phantom_read", "key": rd.key, "seq": rd.seq})
                continue
        ok = False
        for w in candidates:
            if w.start > rd.end:
                continue  # invoked after the read ended
            overwritten = w.ok and w.end is not None and any(
                v.ok and v.end is not None and v.start > w.end and v.end < rd.start
                for v in kops)
            if not overwritten:
                ok = True
                break
        if not ok:
            newest = max((v for v in kops if v.ok and v.end is not None and v.end < rd.start),
                         key=lambda v: v.seq, default=None)
            findings.append({"kind": "lost_write" if rd.final else "stale_read",
                             "key": rd.key, "read_seq": rd.seq,
                             "acknowledged_seq": newest.seq if newest else None,
                             "acknowledged_kind": newest.kind if newest else None,
                             "read_start": round(rd.start, 3)})
    return findings


# ---------------------------------------------------------------- logs and availability


def check_logs(node: str, lines: Iterable[str]) -> list[dict[str, Any]]:
    """A Python traceback in a node's log is a finding (with the line after it)."""
    out = []
    lines = list(lines)
    for i, line in enumerate(lines):
        if "Traceback (most recent call last)" in line:
            tail = [x.rstrip() for x in lines[i + 1:i + 40] if x and not x.startswith(" ")]
            out.append({"kind": "traceback", "node": node, "line": i + 1,
                        "error": tail[0] if tail else ""})
    return out


def unavailability(up: list[float], lo: float, hi: float, min_gap_s: float = 1.0
                   ) -> list[tuple[float, float]]:
    """Times at which some node answered as a leader with a quorum -> the windows
    ``(start, length)`` inside ``[lo, hi]`` longer than ``min_gap_s`` with no such
    answer (polls run every ~0.2 s, so shorter gaps are polling, not outages)."""
    points = [lo] + sorted(t for t in up if lo <= t <= hi) + [hi]
    return [(a, b - a) for a, b in zip(points, points[1:], strict=False) if b - a > min_gap_s]


def summarize_windows(windows: list[tuple[float, float]]) -> dict[str, float]:
    lengths = [w for _, w in windows]
    if not lengths:
        return {"count": 0, "p50_s": 0.0, "max_s": 0.0, "total_s": 0.0}
    return {"count": len(lengths), "p50_s": round(statistics.median(lengths), 3),
            "max_s": round(max(lengths), 3), "total_s": round(sum(lengths), 3)}


# ------------------------------------------------------------------ concurrency keys

def max_concurrent(execs: Iterable[Execution]) -> int:
    """The most executions alive at one instant (each from its start to its last sign
    of life; one that ends as another starts does not overlap it)."""
    edges = sorted([(e.start, 1) for e in execs] + [(e.last, -1) for e in execs],
                   key=lambda x: (x[0], x[1]))
    most = alive = 0
    for _, step in edges:
        alive += step
        most = max(most, alive)
    return most


def check_concurrency(keys: dict[str, tuple[str, int]],
                      execs: list[Execution]) -> list[dict[str, Any]]:
    """``keys``: job id -> (concurrency key, max). Never more than ``max`` executions of
    the jobs sharing a key alive at once, from the witness's own times
    (``concurrency_exceeded``, with the instant and the executions alive then)."""
    findings: list[dict[str, Any]] = []
    by_key: dict[str, list[Execution]] = defaultdict(list)
    limit: dict[str, int] = {}
    for key, most in keys.values():
        limit[key] = min(most, limit.get(key, most))
    for e in execs:
        if e.job_id in keys:
            by_key[keys[e.job_id][0]].append(e)
    for key, es in sorted(by_key.items()):
        es.sort(key=lambda e: e.start)
        for e in es:
            alive = [x for x in es if x.start <= e.start < x.last]
            if len(alive) > limit[key]:
                findings.append({"kind": "concurrency_exceeded", "key": key,
                                 "max": limit[key], "at": e.start,
                                 "executions": [_brief(x) for x in alive]})
    return findings


def _began_before(x: dict[str, Any], s: float) -> bool:
    """Did execution ``x`` begin before a freeze that started at ``s``? Its start line
    says so, or its fork time does: the nemesis notes a freeze's start just before the
    cgroup stops the node, so a process forked before it may write its start line in
    those few milliseconds. A fork time is read in clock ticks (rounded down), hence the
    margin: only a fork surely before ``s`` counts (nothing forks in a frozen node)."""
    forked = x.get("forked")
    return x["start"] <= s or (forked is not None and forked <= s - FORK_TICK_S)


def attribute_key_freezes(findings: list[dict[str, Any]],
                          freezes: list[tuple[str, float, float]]) -> list[dict[str, Any]]:
    """A ``concurrency_exceeded`` that one execution of a frozen node explains becomes
    ``freeze_window``, as :func:`attribute_freezes` does for two attempts of one run: it
    began before the freeze (:func:`_began_before`; its run was released while its node
    was frozen, with its process not running), the excess began after the freeze did,
    and it ran on at most FREEZE_WINDOW_BOUND_S after the thaw (until its guard stopped
    it). Other findings pass through unchanged."""
    out = []
    for f in findings:
        if f["kind"] != "concurrency_exceeded":
            out.append(f)
            continue
        after = [x["last"] - t for x in f["executions"] for node, s, t in freezes
                 if x["node"] == node and _began_before(x, s) and s <= f["at"]
                 and x["last"] - t <= FREEZE_WINDOW_BOUND_S]
        out.append(dict(f, kind="freeze_window", after_thaw_s=round(max(0.0, min(after)), 3))
                   if after else f)
    return out
