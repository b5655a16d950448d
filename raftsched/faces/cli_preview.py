"""CLI commands that look before they leap: ``job next``, ``job put --dry-run`` and
``http-token`` (registered into the parser by :mod:`raftsched.faces.cli`)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from raftsched.core.errors import ConfigError, InvalidSpec

DEFAULT_COUNT = 5


def format_next(result: dict[str, Any]) -> str:
    """One job's preview: the words, then a table of fire times (zone, UTC, DST days;
    UTC alone for a UTC schedule)."""
    head = f"{result.get('id') or '-'}: {result.get('description')}"
    if result.get("paused"):
        head += "  [paused: nothing fires until it is resumed]"
    tz = str(result.get("tz") or "UTC")
    fires = result.get("fires") or []
    if result.get("after"):
        return head + "\n(no fire times of its own: one run per fire time of its parents, " \
                      "when their runs for it end as it waits for)"
    if not fires:
        end = result.get("end")
        return head + ("\n(no further fire times)" if not end
                       else f"\n(no further fire times up to its end, {end})")
    from raftsched.faces.cliformat import format_table

    if tz == "UTC":
        # Its local time is its UTC time, and UTC has no DST: one column says it all.
        return head + "\n" + format_table(
            ["#", "UTC"], [[str(i), f"{f['utc']} {f.get('weekday', '')}".rstrip()]
                           for i, f in enumerate(fires, 1)])
    rows = [[str(i), f"{f['local']} {f.get('weekday', '')}".rstrip(), f["utc"],
             f"DST day ({f['dst_change']})" if f.get("dst_change") else "-"]
            for i, f in enumerate(fires, 1)]
    return head + "\n" + format_table(["#", tz, "UTC", "NOTE"], rows)


def format_dry_run(result: dict[str, Any]) -> str:
    lines = []
    for r in result.get("results") or []:
        change = r.get("change")
        if change == "updated":
            lines.append(f"{r['id']}: would be updated ({', '.join(r.get('fields') or [])})")
            for key, d in sorted((r.get("diff") or {}).items()):
                lines.append(f"    {key}: {json.dumps(d.get('from'))} -> "
                             f"{json.dumps(d.get('to'))}")
        else:
            lines.append(f"{r['id']}: would be {change}" if change != "unchanged"
                         else f"{r['id']}: unchanged")
    lines.append("(dry run: nothing was changed)")
    return "\n".join(lines)


def _cmd_job_next(args: argparse.Namespace) -> int:
    from raftsched.faces.cli_common import connect, emit

    if os.path.exists(args.target) or args.target == "-" or \
            args.target.endswith((".toml", ".json")):
        # A file: computed here, no cluster needed (check a schedule before shipping it).
        from raftsched.faces.jobfile import check_job_file, load_job_file
        from raftsched.node.observe.clock import now_ms
        from raftsched.node.service.preview import MAX_COUNT, next_fires

        if args.count > MAX_COUNT:
            raise InvalidSpec("--count", f"must be 1..{MAX_COUNT}")
        now = now_ms()
        # What `job put` would refuse is refused here, in its words: no fire times of a
        # file that cannot be put. A past `at` is judged as a new job's (no cluster to
        # ask whether it is the stored job's own).
        jobs = check_job_file(args.target, load_job_file(args.target), now_ms=now)
        results = [dict(next_fires(job.schedule, now, args.count), id=job.id,
                        paused=job.paused) for job in jobs]
    else:
        with connect(args) as client:
            results = [client.next_fires(args.target, count=args.count)]
    if args.json:
        emit(args, results if len(results) > 1 else results[0], str)
    else:
        print("\n\n".join(format_next(r) for r in results))
    return 0


def dry_run(args: argparse.Namespace, specs: list[dict[str, Any]]) -> int:
    """``job put --dry-run`` of ``specs`` (checked as the put checks them): the node
    validates and diffs as the put would; nothing is committed."""
    from raftsched.faces.cli_common import connect, emit
    from raftsched.faces.jobfile import refused_by_node

    with connect(args) as client:
        try:
            result = client.preview_put(specs)
        except InvalidSpec as exc:
            raise refused_by_node(exc, specs) from None
    emit(args, result, format_dry_run)
    return 0


def _cmd_http_token(args: argparse.Namespace) -> int:
    """Print an HTTP bearer token (or the dashboard's address with it) of the cluster
    at --addr, derived from the secret this CLI proves to it (as every command finds it)."""
    from raftsched.faces.cli_common import connect

    with connect(args) as client:
        tok = client.http_token(read_only=args.read_only)
        status = client.status(stale=True) if args.url else {}
    if args.url:
        http = (status.get("http") or {}).get(status.get("node"))
        if http is None:
            raise ConfigError("http", f"node {status.get('node')} serves no HTTP: set "
                                      "`http = \"host:port\"` in its [[nodes]] entry")
        # The token rides in the fragment: a browser never sends it to a server or a log.
        scheme = status.get("http_scheme") or "http"
        sys.stdout.write(f"{scheme}://{http}/#token={tok}\n")
    else:
        sys.stdout.write(tok + "\n")
    return 0


def add_commands(sub: Any, jsub: Any, common: argparse.ArgumentParser) -> None:
    p = jsub.add_parser("next", parents=[common],
                        help="the next fire times of job ID or of the jobs in FILE")
    p.add_argument("target", metavar="ID|FILE")
    from raftsched.faces.cli_common import positive_int

    p.add_argument("--count", type=positive_int, default=DEFAULT_COUNT, metavar="N",
                   help=f"how many fire times (default {DEFAULT_COUNT})")
    p.set_defaults(run=_cmd_job_next)
    p = sub.add_parser("http-token", parents=[common],
                       help="print a bearer token for the HTTP API and dashboard")
    p.add_argument("--read-only", action="store_true",
                   help="a token that may only read (GET), not change anything")
    p.add_argument("--url", action="store_true",
                   help="print the node's dashboard address with the token in it")
    p.set_defaults(run=_cmd_http_token)


__all__ = ["add_commands", "dry_run", "format_dry_run", "format_next"]
