"""What every CLI command shares: the addresses it tries, its client, its timeout, how
it prints, and the argument types — apart from ``cli`` so that the command modules
(``cli_apply``, ``cli_backfill``, ...) import them without importing the CLI that
registers them."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from typing import Any

#: Where a command goes when neither ``--addr`` nor ``$RAFTSCHED_ADDR`` says.
DEFAULT_ADDR = "127.0.0.1:7101"
ADDR_ENV = "RAFTSCHED_ADDR"


def addresses(args: argparse.Namespace) -> list[str]:
    """The API addresses a command tries, in order: every ``--addr`` (each may list
    several, comma-separated), else ``$RAFTSCHED_ADDR``, else the default."""
    addrs: list[str] = []
    for item in args.addr or [os.environ.get(ADDR_ENV) or DEFAULT_ADDR]:
        addrs.extend(a.strip() for a in item.split(",") if a.strip())
    return addrs or [DEFAULT_ADDR]


def connect(args: argparse.Namespace) -> Any:
    from raftsched.wire.client import Client

    # No secret in the environment: the Client finds a local node's generated one.
    return Client(addresses(args), timeout=command_timeout(args),
                  secret_env=args.secret_env, tls_ca=args.tls_ca)


#: What ``--timeout`` is when not given, unless the command sets its own
#: (``default_timeout`` through ``set_defaults``: backup, add-node, remove-node).
DEFAULT_TIMEOUT_S = 10.0


def command_timeout(args: argparse.Namespace) -> float:
    """``--timeout`` if given, else the command's own default, else 10 s.

    A command's own default must not be ``set_defaults(timeout=...)``: argparse shares
    the ``--timeout`` action of the common parent among every subparser, and
    ``set_defaults`` on one changes that action's default for all of them (every
    command waited 120 s, the backup's). ``default_timeout`` is no action's dest, so it
    stays the one parser's."""
    if args.timeout is not None:
        return float(args.timeout)
    return float(getattr(args, "default_timeout", DEFAULT_TIMEOUT_S))


def emit(args: argparse.Namespace, result: Any, fmt: Callable[[Any], str]) -> None:
    if args.json:
        print(json.dumps(result, indent=2, sort_keys=True, default=str))
    else:
        print(fmt(result))


def simple_command(method: str, fmt: Callable[[Any], str],
            build: Callable[[argparse.Namespace], dict[str, Any]]) -> Callable[..., int]:
    def run(args: argparse.Namespace) -> int:
        kwargs = build(args)
        if getattr(args, "stale", False):
            kwargs["stale"] = True
        with connect(args) as client:
            result = getattr(client, method)(**kwargs)
        emit(args, result, fmt)
        if isinstance(result, dict) and result.get("stale") and not args.json:
            print("note: --stale: read from this node's state as it is, which may be behind "
                  "the cluster", file=sys.stderr)
        return 0
    return run


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError("must be positive")
    return value


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


__all__ = ["ADDR_ENV", "DEFAULT_ADDR", "DEFAULT_TIMEOUT_S", "addresses", "command_timeout",
           "connect", "emit", "positive_float", "positive_int", "simple_command"]
