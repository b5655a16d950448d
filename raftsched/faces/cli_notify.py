"""``raftsched notify-key`` and the notification lines of ``raftsched runs``."""

from __future__ import annotations

import argparse
import os
from typing import Any

from raftsched.core.errors import InvalidArgument


def find_secret(args: argparse.Namespace) -> str | None:
    """The cluster secret the way every client command finds it, with no node to ask:
    ``$secret_env``, else ``$RAFTSCHED_SECRET_FILE``, else the file a node at one of the
    command's addresses (:func:`~raftsched.faces.cli.addresses`) registered for this
    user — the client tries each address in turn, so a first node that is down (its
    pointer gone with it) does not hide the next one's."""
    from raftsched.faces.cli_common import addresses
    from raftsched.wire.secretfile import candidate_secrets
    secret = os.environ.get(args.secret_env)
    if secret:
        return secret
    for addr in addresses(args):
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


__all__ = ["add_commands"]
