"""``raftsched notify-key`` and the notification lines of ``raftsched runs``."""

from __future__ import annotations

import argparse
import os
from typing import Any

from raftsched.core.errors import InvalidArgument


def format_notifications(runs: list[dict[str, Any]]) -> str:
    """A table of the runs' notifications (empty when none has one)."""
    from raftsched.faces.cliformat import format_table
    rows = [[r.get("run_id"), n.get("state"), n.get("attempts"), n.get("error") or "-"]
            for r in runs if isinstance(n := r.get("notify"), dict)]
    if not rows:
        return ""
    return "--- notifications ---\n" + format_table(
        ["RUN_ID", "NOTIFY", "ATTEMPTS", "ERROR"], rows)


def find_secret(args: argparse.Namespace) -> str | None:
    """The cluster secret the way every client command finds it: ``$secret_env``, else
    ``$RAFTSCHED_SECRET_FILE``, else the file the node at the first ``--addr`` (or
    ``$RAFTSCHED_ADDR``, or the default address) registered for this user."""
    from raftsched.wire.client import DEFAULT_ADDR
    from raftsched.wire.secretfile import candidate_secrets
    secret = os.environ.get(args.secret_env)
    if secret:
        return secret
    addrs = [a.strip() for item in (args.addr or [os.environ.get("RAFTSCHED_ADDR")
                                                  or DEFAULT_ADDR])
             for a in item.split(",") if a.strip()]
    for addr in addrs[:1] or [DEFAULT_ADDR]:
        found = candidate_secrets(addr)
        if found:
            return found[0]
    return None


def _cmd_notify_key(args: argparse.Namespace) -> int:
    from raftsched.wire.webhook import notify_key
    secret = find_secret(args)
    if not secret:
        raise InvalidArgument("--secret-env", f"${args.secret_env} is not set, nor "
                                              "$RAFTSCHED_SECRET_FILE, and no local node "
                                              "registered its secret: the webhook key is "
                                              "derived from the cluster secret")
    print(notify_key(secret))
    return 0


def add_commands(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("notify-key", parents=[common],
                       help="print the key webhook receivers verify notifications with "
                            "(derived from the cluster secret in $RAFTSCHED_SECRET)")
    p.set_defaults(run=_cmd_notify_key)


__all__ = ["add_commands", "format_notifications"]
