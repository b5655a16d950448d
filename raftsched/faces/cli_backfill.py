"""CLI commands of backfills: ``job backfill``, ``job backfills`` and ``job
backfill-cancel`` (registered into the parser by :mod:`raftsched.faces.cli`)."""

from __future__ import annotations

import argparse
from typing import Any

from raftsched.faces.cliformat import format_backfill, format_table, format_time


def format_backfills(result: dict[str, Any]) -> str:
    items = result.get("backfills") or []
    if not items:
        return "no backfills"
    rows = [[b.get("id"), b.get("job"), b.get("state"), f"{b.get('done')}/{b.get('fire_times')}",
             len(b.get("active") or []), format_time(b.get("next_ms")),
             " ".join(f"{k}={v}" for k, v in sorted((b.get("counts") or {}).items())) or "-"]
            for b in items]
    return format_table(["BACKFILL", "JOB", "STATE", "DONE", "ACTIVE", "NEXT", "COUNTS"], rows)


def add_commands(jsub: Any, common: argparse.ArgumentParser) -> None:
    from raftsched.faces.cli_common import positive_int, simple_command

    p = jsub.add_parser("backfill", parents=[common],
                        help="run job ID's past fire times in --from..--to once each")
    p.add_argument("id", metavar="ID")
    p.add_argument("--from", dest="start", required=True, metavar="T1",
                   help="first instant, RFC 3339 (2026-11-01T00:00:00Z), inclusive")
    p.add_argument("--to", dest="end", required=True, metavar="T2",
                   help="last instant, inclusive (at most now)")
    p.add_argument("--overlap", choices=("allow", "skip", "queue"), default="queue",
                   help="while an on-time run of the job is active: run beside it, "
                        "record the fire time skipped, or wait (default queue)")
    p.add_argument("--max", type=positive_int, default=1, metavar="N",
                   help="runs of this backfill active at once (default 1, at most 8)")
    p.add_argument("--rerun", action="store_true",
                   help="run fire times already recorded again (a new attempt of their run id)")
    p.set_defaults(run=simple_command("backfill", format_backfill, lambda a: {
        "job_id": a.id, "start": a.start, "end": a.end, "overlap": a.overlap,
        "max_active": a.max, "rerun": a.rerun}))
    p = jsub.add_parser("backfills", parents=[common],
                        help="running and recently finished backfills")
    p.add_argument("id", metavar="ID", nargs="?", help="only job ID's")
    p.set_defaults(run=simple_command("backfills", format_backfills, lambda a: {"job_id": a.id}))
    p = jsub.add_parser("backfill-cancel", parents=[common], help="cancel a backfill")
    p.add_argument("backfill", metavar="BACKFILL_ID", help="bf-<n>, as `job backfills` shows")
    p.set_defaults(run=simple_command("backfill_cancel", format_backfill,
                               lambda a: {"backfill_id": a.backfill}))


__all__ = ["add_commands", "format_backfills"]
