"""The ``raftsched`` command line: run nodes, and manage jobs through the client API.

The ``format_*`` functions are pure (result dicts in, text out) so the human output
is testable without a cluster. Secrets are read from an environment variable named
by ``--secret-env``, never from argv (argv is visible to every local user).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tomllib
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from raftsched.errors import InvalidSpec, RaftschedError

DEFAULT_ADDR = "127.0.0.1:7101"
ADDR_ENV = "RAFTSCHED_ADDR"
DEFAULT_SECRET_ENV = "RAFTSCHED_SECRET"

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# Job output and reasons are untrusted text: control characters could drive the terminal.
_SAFE_CONTROLS = {"\n", "\t"}


# ------------------------------------------------------------------ formatting

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


def format_last(last: Any) -> str:
    """``[run_id, state, reason, at_ms]`` as ``state`` or ``state(reason)``."""
    if not last:
        return "-"
    state = last[1] if len(last) > 1 else "?"
    reason = last[2] if len(last) > 2 else ""
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
    rows = [[j.get("id"), format_schedule((j.get("spec") or {}).get("schedule")),
             format_time(j.get("next_ms")), _yes(j.get("paused")), format_last(j.get("last")),
             len(j.get("active") or [])] for j in jobs]
    out = format_table(["ID", "SCHEDULE", "NEXT", "PAUSED", "LAST", "ACTIVE"], rows)
    total = result.get("total")
    if isinstance(total, int) and total > len(jobs):
        out += f"\n({len(jobs)} of {total} jobs shown; narrow with --prefix or raise --limit)"
    return out


def format_job(job: dict[str, Any]) -> str:
    """``job get``: one ``key: value`` line per field, the spec as indented JSON."""
    last = job.get("last")
    if last:
        last_text = f"{format_last(last)} {last[0]} at {format_time(last[3])}" \
            if len(last) >= 4 else format_last(last)
    else:
        last_text = "-"
    lines = [
        f"id: {clean(job.get('id'))}",
        f"version: {job.get('version')}",
        f"paused: {_yes(job.get('paused'))}",
        f"next: {format_time(job.get('next_ms'))}",
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
                     format_time(r.get("started_ms")), format_time(r.get("finished_ms")),
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
        rows.append([n.get("node_id"), _yes(n.get("alive")), _yes(n.get("connected")),
                     _dash(n.get("api")), _dash(n.get("slots")), _dash(n.get("inflight")),
                     ",".join(map(str, n.get("tags") or [])) or "-", ago,
                     _dash(n.get("skew_ms"))])
    summary = status.get("summary") or f"cluster {status.get('health', 'unknown')}"
    lines = [clean(summary), "",
             format_table(["NODE", "ALIVE", "CONNECTED", "API", "SLOTS", "INFLIGHT", "TAGS",
                           "LAST_SEEN", "SKEW_MS"], rows)]
    lines.append("")
    lines.append(f"this node: {clean(status.get('node'))}  leader: "
                 f"{clean(_dash(status.get('leader')))} ({clean(_dash(status.get('leader_addr')))})"
                 f"  term: {status.get('term')}  commit: {status.get('commit_index')}"
                 f"  applied: {status.get('applied')}")
    totals = status.get("totals") or {}
    if totals:
        lines.append("totals: " + " ".join(f"{clean(k)}={v}" for k, v in sorted(totals.items())))
    return "\n".join(lines)


def format_put(result: dict[str, Any]) -> str:
    how = "created" if result.get("created") else "updated"
    return f"put {clean(result.get('job') or result.get('id'))} " \
           f"(version {result.get('version')}, {how})"


def _format_simple(verb: str) -> Callable[[dict[str, Any]], str]:
    def fmt(result: dict[str, Any]) -> str:
        text = f"{verb} {clean(result.get('job') or result.get('id'))}"
        if result.get("version") is not None:
            text += f" (version {result['version']})"
        skipped = result.get("skipped_fire_times")
        if skipped:
            text += f"; {skipped} fire times while paused were skipped (use --catch-up to run them)"
        return text
    return fmt


def format_trigger(result: dict[str, Any]) -> str:
    return f"triggered run {clean(result.get('run_id'))} ({clean(result.get('state'))})"


# ------------------------------------------------------------------ job files

def load_job_file(path: str) -> list[dict[str, Any]]:
    """The job specs in a .toml/.json file (or JSON on stdin for ``-``); InvalidSpec
    naming the file for syntax errors and wrong shapes."""
    name = "<stdin>" if path == "-" else path
    try:
        if path == "-":
            data: Any = json.loads(sys.stdin.read())
        elif path.lower().endswith(".json"):
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        else:
            with open(path, "rb") as f:
                data = tomllib.load(f)
    except OSError as exc:
        raise InvalidSpec(name, f"cannot read: {exc.strerror or exc}") from None
    except (json.JSONDecodeError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise InvalidSpec(name, str(exc)) from None
    if isinstance(data, dict) and isinstance(data.get("jobs"), list):
        jobs = data["jobs"]
    elif isinstance(data, list):
        jobs = data
    elif isinstance(data, dict):
        jobs = [data]
    else:
        raise InvalidSpec(name, "must hold a job table/object or a list of them")
    if not jobs:
        raise InvalidSpec(name, "holds no jobs")
    for i, job in enumerate(jobs):
        if not isinstance(job, dict):
            raise InvalidSpec(name, f"jobs[{i}] must be a table/object, not {type(job).__name__}")
    return jobs


# ------------------------------------------------------------------ commands

def _client(args: argparse.Namespace) -> Any:
    from raftsched.client import Client

    addrs: list[str] = []
    for item in args.addr or [os.environ.get(ADDR_ENV) or DEFAULT_ADDR]:
        addrs.extend(a.strip() for a in item.split(",") if a.strip())
    secret = os.environ.get(args.secret_env) or None
    return Client(addrs or [DEFAULT_ADDR], secret=secret, timeout=args.timeout)


def _emit(args: argparse.Namespace, result: Any, fmt: Callable[[Any], str]) -> None:
    if args.json:
        print(json.dumps(result, indent=2, sort_keys=True, default=str))
    else:
        print(fmt(result))


def _cmd_job_put(args: argparse.Namespace) -> int:
    specs = load_job_file(args.file)
    results = []
    with _client(args) as client:
        for spec in specs:
            try:
                result = client.put_job(spec)
            except RaftschedError as exc:
                # Earlier jobs of the file are in; say which one failed and stop there.
                if args.json:
                    _emit(args, results, str)
                where = f"job {clean(spec.get('id'))!r}: " if len(specs) > 1 else ""
                print(f"error: {exc.code}: {where}{clean(exc.message)}{_hint(args, exc)}",
                      file=sys.stderr)
                return 1
            results.append(result)
            if not args.json:
                print(format_put(result))
    if args.json:
        _emit(args, results, str)
    return 0


def _simple(method: str, fmt: Callable[[Any], str],
            build: Callable[[argparse.Namespace], dict[str, Any]]) -> Callable[..., int]:
    def run(args: argparse.Namespace) -> int:
        with _client(args) as client:
            result = getattr(client, method)(**build(args))
        _emit(args, result, fmt)
        return 0
    return run


def _cmd_node(args: argparse.Namespace) -> int:
    from raftsched.node import run_node
    return int(run_node(args.config, args.id, args.data_dir))


def _cmd_local(args: argparse.Namespace) -> int:
    from raftsched.local import run_local
    return int(run_local(nodes=args.nodes, base_port=args.base_port, data_dir=args.data_dir))


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError("must be positive")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="print the raw result as JSON")
    common.add_argument("--addr", action="append", metavar="HOST:PORT",
                        help=f"a node's API address; repeatable or comma-separated "
                             f"(default: ${ADDR_ENV} or {DEFAULT_ADDR})")
    common.add_argument("--secret-env", default=DEFAULT_SECRET_ENV, metavar="NAME",
                        help="environment variable holding the cluster secret "
                             f"(default {DEFAULT_SECRET_ENV})")
    common.add_argument("--timeout", type=_positive_float, default=10.0, metavar="SECONDS",
                        help="seconds a command may take, failover included (default 10)")

    parser = argparse.ArgumentParser(
        prog="raftsched", description="A Raft-replicated distributed job scheduler.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("node", help="run one cluster node")
    p.add_argument("--config", metavar="PATH", help="cluster config TOML (default: one "
                                                    "loopback node)")
    p.add_argument("--id", metavar="ID", help="this node's id in the config")
    p.add_argument("--data-dir", metavar="DIR", help="override cluster.data_dir")
    p.set_defaults(run=_cmd_node)

    p = sub.add_parser("local", help="run a whole cluster on loopback, for trying it out")
    p.add_argument("--nodes", type=_positive_int, default=3, metavar="N",
                   help="how many nodes (default 3)")
    p.add_argument("--base-port", type=_positive_int, default=7000, metavar="P",
                   help="node i gets raft P+i, api P+100+i, metrics P+200+i (default 7000)")
    p.add_argument("--data-dir", metavar="DIR", help="where the nodes keep their data "
                                                     "(default ./raftsched-local)")
    p.set_defaults(run=_cmd_local)

    job = sub.add_parser("job", help="manage jobs")
    jsub = job.add_subparsers(dest="job_command", metavar="ACTION")
    job.set_defaults(run=None, parser=job)

    p = jsub.add_parser("put", parents=[common], help="create or update jobs from a file")
    p.add_argument("file", metavar="FILE", help=".toml or .json file, or - for JSON on stdin")
    p.set_defaults(run=_cmd_job_put)
    p = jsub.add_parser("ls", parents=[common], help="list jobs")
    p.add_argument("--prefix", metavar="P", help="only job ids starting with P")
    p.add_argument("--limit", type=_positive_int, default=1000, metavar="N")
    p.set_defaults(run=_simple("list_jobs", format_jobs,
                               lambda a: {"prefix": a.prefix, "limit": a.limit}))
    for name, method, verb, text in (("get", "get_job", None, "show one job"),
                                     ("rm", "delete_job", "removed", "remove a job"),
                                     ("pause", "pause", "paused", "pause a job")):
        p = jsub.add_parser(name, parents=[common], help=text)
        p.add_argument("id", metavar="ID")
        fmt = format_job if verb is None else _format_simple(verb)
        p.set_defaults(run=_simple(method, fmt, lambda a: {"job_id": a.id}))
    p = jsub.add_parser("resume", parents=[common], help="resume a paused job")
    p.add_argument("id", metavar="ID")
    p.add_argument("--catch-up", action="store_true",
                   help="run fire times missed while paused (per the misfire policy)")
    p.set_defaults(run=_simple("resume", _format_simple("resumed"),
                               lambda a: {"job_id": a.id, "catch_up": a.catch_up}))
    p = jsub.add_parser("trigger", parents=[common], help="run a job now")
    p.add_argument("id", metavar="ID")
    p.add_argument("--force", action="store_true", help="run even if the overlap policy "
                                                        "would skip it")
    p.set_defaults(run=_simple("trigger", format_trigger,
                               lambda a: {"job_id": a.id, "force": a.force}))

    p = sub.add_parser("runs", parents=[common], help="show a job's runs, newest first")
    p.add_argument("id", metavar="ID")
    p.add_argument("--limit", type=_positive_int, default=100, metavar="N")
    p.set_defaults(run=_simple("runs", format_runs,
                               lambda a: {"job_id": a.id, "limit": a.limit}))

    p = sub.add_parser("status", parents=[common], help="cluster health and nodes")
    p.set_defaults(run=_simple("status", format_status, lambda a: {}))
    return parser


def _hint(args: argparse.Namespace, exc: RaftschedError) -> str:
    name = getattr(args, "secret_env", None)
    if exc.code != "unauthenticated" or not name:
        return ""
    # Only whether the variable is set is said, never anything about its value.
    return f" (${name} is not set)" if not os.environ.get(name) else f" (check ${name})"


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2)
        return exc.code if isinstance(exc.code, int) else 2
    run = getattr(args, "run", None)
    if run is None:
        (getattr(args, "parser", None) or parser).print_usage(sys.stderr)
        return 2
    try:
        return run(args)
    except RaftschedError as exc:
        print(f"error: {exc.code}: {clean(exc.message)}{_hint(args, exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # Output piped into `head` and the like: stop quietly, and keep the interpreter's
        # final flush from raising again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
