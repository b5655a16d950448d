"""The command line's human output: pure functions from result dicts to text.

Results come from a node (or a file) and may hold anything: every value is shown through
:func:`clean`, so job output and reasons cannot drive the terminal. The ``--json`` output
is not made here (it is the result itself).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# Job output and reasons are untrusted text: control characters could drive the terminal.
_SAFE_CONTROLS = {"\n", "\t"}


def format_time(ms: int | None) -> str:
    """Epoch ms as RFC 3339 UTC (``2026-11-29T08:00:00Z``; ms only when nonzero)."""
    if ms is None or isinstance(ms, bool) or not isinstance(ms, int):
        return "-"
    secs, rem = divmod(ms, 1000)
    try:
        text = (_EPOCH + timedelta(seconds=secs)).strftime("%Y-%m-%dT%H:%M:%S")
    except OverflowError:
        return str(ms)
    return f"{text}.{rem:03d}Z" if rem else f"{text}Z"


def clean(text: Any, *, multiline: bool = False) -> str:
    """``text`` as a string with control characters escaped (newlines kept if multiline)."""
    s = "" if text is None else str(text)
    if s.isprintable() and not multiline:
        return s
    out = []
    for ch in s:
        if ch.isprintable() or (multiline and ch in _SAFE_CONTROLS):
            out.append(ch)
        else:
            out.append(ch.encode("unicode_escape").decode("ascii"))
    return "".join(out)


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Left-aligned columns separated by two spaces, no trailing blanks."""
    cells = [[clean(c) for c in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        for i, c in enumerate(row):
            widths[i] = max(widths[i], len(c))
    lines = []
    for row in [list(headers), *cells]:
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return "\n".join(lines)


def format_schedule(schedule: Any) -> str:
    """``0 8 * * * Europe/Berlin``, ``every 15m (+5m)`` or ``at 2026-11-29T08:00:00Z``."""
    if not isinstance(schedule, dict):
        return clean(schedule) if schedule is not None else "-"
    if "cron" in schedule:
        tz = schedule.get("tz")
        return f"{schedule['cron']} {tz}" if tz else str(schedule["cron"])
    if "every" in schedule:
        offset = schedule.get("offset")
        return f"every {schedule['every']}" + (f" (+{offset})" if offset else "")
    if "at" in schedule:
        at = schedule["at"]
        return f"at {format_time(at) if isinstance(at, int) else at}"
    return json.dumps(schedule, sort_keys=True)


def format_trigger_of(spec: dict[str, Any]) -> str:
    """What makes a job run: its schedule (and bounds), or ``after a, b (on failure)``;
    `` [key 2]`` after it for a concurrency key."""
    after = spec.get("after")
    if after:
        on = spec.get("on") or "success"
        text = "after " + ", ".join(map(str, after)) + ("" if on == "success" else f" (on {on})")
    else:
        text = format_schedule(spec.get("schedule")) + format_bounds(spec)
    conc = spec.get("concurrency")
    if isinstance(conc, dict):
        text += f" [{conc.get('key')} {conc.get('max')}]"
    return text


def format_bounds(spec: Any) -> str:
    """A spec's ``start``/``end`` after its schedule: `` from <start> until <end>``."""
    if not isinstance(spec, dict):
        return ""
    out = ""
    if spec.get("start"):
        out += f" from {clean(spec['start'])}"
    if spec.get("end"):
        out += f" until {clean(spec['end'])}"
    return out


def format_last(last: Any) -> str:
    """``{run_id, state, reason, at_ms}`` as ``state`` or ``state(reason)``."""
    if not isinstance(last, dict) or not last:
        return "-"
    state = last.get("state") or "?"
    reason = last.get("reason") or ""
    if state == "succeeded" and reason == "exit 0":  # says nothing the state does not
        reason = ""
    return f"{state}({reason})" if reason else str(state)


def _yes(flag: Any) -> str:
    return "yes" if flag else "no"


def _dash(value: Any) -> str:
    return "-" if value is None or value == "" else str(value)


def format_jobs(result: dict[str, Any]) -> str:
    """The ``job ls`` table."""
    jobs = result.get("jobs") or []
    # The dependency graph, as far as this page shows it: each job's dependents.
    then: dict[str, list[str]] = {}
    for j in jobs:
        for parent in (j.get("spec") or {}).get("after") or []:
            then.setdefault(str(parent), []).append(str(j.get("id")))
    rows = [[j.get("id"), format_trigger_of(j.get("spec") or {}),
             "done" if j.get("done") else
             ("-" if (j.get("spec") or {}).get("after") else format_time(j.get("next_ms"))),
             _yes(j.get("paused")), format_last(j.get("last")),
             len(j.get("active") or [])] for j in jobs]
    headers = ["ID", "SCHEDULE", "NEXT", "PAUSED", "LAST", "ACTIVE"]
    if then:
        headers.append("THEN")
        for row, j in zip(rows, jobs, strict=True):
            row.append(", ".join(then.get(str(j.get("id")), [])) or "-")
    out = format_table(headers, rows)
    total = result.get("total")
    if isinstance(total, int) and total > len(jobs):
        out += f"\n({len(jobs)} of {total} jobs shown; narrow with --prefix or raise --limit)"
    return out


def format_job(job: dict[str, Any]) -> str:
    """``job get``: one ``key: value`` line per field, the spec as indented JSON."""
    last = job.get("last")
    if isinstance(last, dict) and last:
        last_text = f"{format_last(last)} {last.get('run_id')} at {format_time(last.get('at_ms'))}"
    else:
        last_text = "-"
    lines = [
        f"id: {clean(job.get('id'))}",
        f"version: {job.get('version')}",
        f"paused: {_yes(job.get('paused'))}",
        f"next: {'done' if job.get('done') else format_time(job.get('next_ms'))}",
        f"accounted_until: {format_time(job.get('hwm_ms'))}",
        f"created: {format_time(job.get('created_ms'))}",
        f"updated: {format_time(job.get('updated_ms'))}",
        f"active: {clean(', '.join(map(str, job.get('active') or [])) or '-')}",
        f"last: {clean(last_text)}",
        "spec: " + clean(json.dumps(job.get("spec"), indent=2, sort_keys=True),
                         multiline=True).replace("\n", "\n  "),
    ]
    return "\n".join(lines)


def format_runs(result: dict[str, Any]) -> str:
    """The ``runs`` table, then the output tail of the newest run that has one."""
    runs = result.get("runs") or []
    rows = []
    for r in runs:
        run_id = str(r.get("run_id"))
        scheduled = format_time(r.get("scheduled_ms"))
        if r.get("until_ms") is not None:
            run_id += f" ×{r.get('count', '?')}"
            scheduled += f"..{format_time(r.get('until_ms'))}"
        rows.append([run_id, scheduled, _dash(r.get("node")), _dash(r.get("attempt")),
                     _dash(r.get("fence")), _dash(r.get("state")), _dash(r.get("reason")),
                     format_time(r.get("executed_ms", r.get("started_ms"))),
                     format_time(r.get("finished_ms")),
                     _dash(r.get("exit_code"))])
    if not rows:
        return f"no runs of {clean(result.get('job', '?'))} yet"
    out = format_table(["RUN_ID", "SCHEDULED", "NODE", "ATT", "FENCE", "STATE", "REASON",
                        "START", "END", "EXIT"], rows)
    with_tail = [r for r in runs if r.get("tail")]
    if with_tail:
        newest = max(with_tail, key=lambda r: (r.get("scheduled_ms") or 0, r.get("attempt") or 0))
        tail = clean(newest["tail"], multiline=True).rstrip("\n")
        out += f"\n--- output tail of {clean(newest.get('run_id'))} ---\n{tail}"
    if notes := format_notifications(runs):
        out += "\n" + notes
    return out


def format_status(status: dict[str, Any]) -> str:
    """``status``: the health summary line, the node table, then cluster counters."""
    nodes = status.get("nodes") or []
    seen = [n.get("last_seen_ms") for n in nodes if isinstance(n.get("last_seen_ms"), int)]
    # Ages are on the node's clock (its now_ms), never ours: the CLI host may be skewed.
    # Without now_ms, relative to the freshest heartbeat.
    ref = status.get("now_ms") if isinstance(status.get("now_ms"), int) else \
        (max(seen) if seen else None)
    rows = []
    for n in nodes:
        ls = n.get("last_seen_ms")
        ago = f"{max(ref - ls, 0) / 1000:.1f}s" if ref is not None and isinstance(ls, int) \
            else "-"
        alive = "removed" if n.get("removed") else \
            _yes(n.get("alive")) + (" (draining)" if n.get("draining") else "")
        rows.append([n.get("node_id"), alive, _yes(n.get("connected")),
                     _dash(n.get("pid")), _dash(n.get("api")), _dash(n.get("slots")),
                     _dash(n.get("inflight")),
                     ",".join(map(str, n.get("tags") or [])) or "-", ago,
                     _dash(n.get("skew_ms"))])
    summary = status.get("summary") or f"cluster {status.get('health', 'unknown')}"
    lines = [clean(summary), "",
             format_table(["NODE", "ALIVE", "CONNECTED", "PID", "API", "SLOTS", "INFLIGHT", "TAGS",
                           "LAST_SEEN", "SKEW_MS"], rows)]
    lines.append("")
    lines.append(f"this node: {clean(status.get('node'))}  leader: "
                 f"{clean(_dash(status.get('leader')))} ({clean(_dash(status.get('leader_addr')))})"
                 f"  term: {status.get('term')}  commit: {status.get('commit_index')}"
                 f"  applied: {status.get('applied_index', status.get('applied'))}")
    totals = status.get("totals") or {}
    if totals:
        lines.append("totals: " + " ".join(f"{clean(k)}={v}" for k, v in sorted(totals.items())))
    members = status.get("membership") or {}
    if members.get("problems"):
        active = [m.get("node_id") for m in members.get("members") or []
                  if m.get("status") == "active"]
        lines.append(f"members (replicated, the truth): {clean(', '.join(map(str, active)))}"
                     f"; config file: {clean(', '.join(map(str, members.get('config') or [])))}")
        lines.extend(f"  - {clean(p)}" for p in members["problems"])
    lines.extend(_status_extras(status))
    return "\n".join(lines)


def format_notifications(runs: list[dict[str, Any]]) -> str:
    """A table of the runs' notifications (empty when none has one)."""
    rows = [[r.get("run_id"), n.get("state"), n.get("attempts"), n.get("error") or "-"]
            for r in runs if isinstance(n := r.get("notify"), dict)]
    if not rows:
        return ""
    return "--- notifications ---\n" + format_table(
        ["RUN_ID", "NOTIFY", "ATTEMPTS", "ERROR"], rows)


def format_backfill(bf: dict[str, Any]) -> str:
    """One backfill on one line: id, job, progress, state, counts."""
    counts = " ".join(f"{clean(k)}={v}" for k, v in sorted((bf.get("counts") or {}).items()))
    head = (f"{clean(bf.get('id'))} {clean(bf.get('job'))}: {bf.get('done')}/"
            f"{bf.get('fire_times')} fire times {clean(bf.get('state'))}")
    span = f"{format_time(bf.get('from_ms'))} .. {format_time(bf.get('to_ms'))}"
    tail = f" ({clean(bf.get('reason'))})" if bf.get("reason") else ""
    return f"{head}{tail}, {span}, max {bf.get('max')}, overlap {clean(bf.get('overlap'))}" \
           + (", rerun" if bf.get("rerun") else "") + (f" [{counts}]" if counts else "")


def _status_extras(status: dict[str, Any]) -> list[str]:
    """What ``status`` adds: running backfills, and each concurrency key's use."""
    lines = []
    running = [b for b in status.get("backfills") or [] if b.get("state") == "running"]
    if running:
        lines.append("backfills:")
        lines.extend("  " + format_backfill(b) for b in running)
    keys = status.get("concurrency") or []
    if keys:
        lines.append("concurrency: " + ", ".join(
            f"{clean(k.get('key'))} {k.get('running')}/{k.get('max')} running"
            + (f" ({k.get('queued')} queued)" if k.get("queued") else "") for k in keys))
    return lines


def format_put(result: dict[str, Any]) -> str:
    how = "created" if result.get("created") else "updated"
    return f"put {clean(result.get('job') or result.get('id'))} " \
           f"(version {result.get('version')}, {how})"


def format_simple(verb: str) -> Callable[[dict[str, Any]], str]:
    def fmt(result: dict[str, Any]) -> str:
        text = f"{verb} {clean(result.get('job') or result.get('id'))}"
        if result.get("version") is not None:
            text += f" (version {result['version']})"
        skipped = result.get("skipped_fire_times")
        if skipped:
            text += f"; {skipped} fire times while paused were skipped (use --catch-up to run them)"
        return text
    return fmt


def format_drain(result: dict[str, Any]) -> str:
    verb = "draining" if result.get("draining") else "undrained"
    return f"{verb} {clean(result.get('node'))}"


def format_member(result: dict[str, Any]) -> str:
    verb = "removed" if result.get("status") == "removed" else "added"
    return (f"{verb} {clean(result.get('node'))} (raft {clean(result.get('raft'))}); the "
            f"cluster has {result.get('members')} members")


def format_transfer(result: dict[str, Any]) -> str:
    return (f"asked leader {clean(result.get('from'))} (term {result.get('term')}) to hand "
            f"leadership to {clean(result.get('to') or 'the most caught-up node')}")


def format_trigger(result: dict[str, Any]) -> str:
    return f"triggered run {clean(result.get('run_id'))} ({clean(result.get('state'))})"
