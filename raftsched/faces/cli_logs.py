"""``raftsched logs RUN_ID [--follow] [--stderr] [--attempt N]``: a run's full log.

The log is on the node that ran the attempt; any node fetches it from there
(raftsched/node/service/logops.py). The bytes are written to stdout as the job wrote them
(``--json``: one object, the text decoded as UTF-8). Notes go to stderr: that the
other stream has output too, that the run is still going (without ``--follow``), or
that the log was removed by the node's limits.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from raftsched.core.errors import Unavailable

#: How long one poll of ``--follow`` stays open at the node for more output (the
#: command's --timeout must cover it, and the node's own ask of the holder).
FOLLOW_WAIT_S = 3.0


def add_commands(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("logs", parents=[common],
                       help="show a run's full log (fetched from the node that ran it)")
    p.add_argument("run_id", metavar="RUN_ID", help="<job_id>@<scheduled_ms>, as `runs` "
                                                    "shows it")
    p.add_argument("--follow", "-f", action="store_true",
                   help="keep printing while the run runs; ends when it ends")
    p.add_argument("--stderr", action="store_true",
                   help="show what the run wrote to stderr (default: stdout)")
    p.add_argument("--attempt", type=int, metavar="N",
                   help="show attempt N (default: the newest one that ran)")
    p.set_defaults(run=_cmd_logs)


def _cmd_logs(args: argparse.Namespace) -> int:
    from raftsched.faces.cli_common import command_timeout, connect
    out = sys.stdout.buffer
    offset = 0
    attempt = args.attempt
    waited_since = time.monotonic()
    texts: list[bytes] = []
    with connect(args) as client:
        while True:
            wait = FOLLOW_WAIT_S if args.follow else 0.0
            reply = client.run_log(args.run_id, stderr=args.stderr, offset=offset,
                                   attempt=attempt, wait=wait)
            data = reply["data"]
            if reply["node"] is not None:
                attempt = reply["attempt"]  # every later chunk from the same attempt
                waited_since = time.monotonic()
            if args.json:
                texts.append(data)
            elif data:
                out.write(data)
                out.flush()
            offset = reply["next_offset"]
            caught_up = not data or offset >= reply["size"]
            if caught_up and (reply["done"] or not args.follow):
                break
            if reply["node"] is None and time.monotonic() - waited_since > \
                    command_timeout(args):
                raise Unavailable(f"run {args.run_id} was not placed on a node within "
                                  f"{command_timeout(args):g}s ({reply['state']})")
            if reply["node"] is None:
                time.sleep(0.5)  # pending: the node that will run it is not known yet
    if args.json:
        print(json.dumps(_json_view(reply, b"".join(texts)), indent=2, sort_keys=True))
    else:
        for note in notes(reply, args.stderr, args.follow):
            print(f"note: {note}", file=sys.stderr)
    return 0


def _json_view(reply: dict[str, Any], data: bytes) -> dict[str, Any]:
    view = {k: v for k, v in reply.items() if k not in ("data", "offset", "next_offset")}
    view["text"] = data.decode("utf-8", "replace")
    return view


def notes(reply: dict[str, Any], stderr: bool, follow: bool) -> list[str]:
    """What the terminal is told beside the log (pure)."""
    out = []
    run, node = reply["run_id"], reply.get("node")
    if reply.get("removed"):
        out.append(f"the log of {run} (attempt {reply['attempt']}) was removed from "
                   f"{node} by its limits (limits.{reply['removed']})")
    elif node is None:
        out.append(f"{run} never ran on a node ({reply['state']}): it has no log")
    other = "stdout" if stderr else "stderr"
    size = (reply.get("sizes") or {}).get(other, 0)
    if size:
        flag = "" if stderr else " --stderr"
        out.append(f"{size} bytes on {other}: raftsched logs {run}{flag}")
    if not reply["done"] and not follow:
        out.append(f"{run} is still running on {node}: --follow to keep reading")
    return out


__all__ = ["add_commands", "notes"]
