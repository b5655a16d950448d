"""CLI commands that need no cluster: certificates, the read-only token, shell completion.

``raftsched certs create-ca`` / ``create-node`` make a private CA and node certificates
for TLS on the API port; ``raftsched secret read-only`` prints the read-only token of
the cluster secret (a credential for status, job ls/get and runs only);
``raftsched completion bash|zsh`` prints a completion script generated from the
argparse definition by ``shtab``.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from raftsched.core.errors import ConfigError, Unauthenticated

SECRET_FILE_ENV = "RAFTSCHED_SECRET_FILE"


def _cmd_create_ca(args: argparse.Namespace) -> int:
    from raftsched.wire.certs import create_ca
    cert, key = create_ca(args.dir, force=args.force)
    print(f"wrote {cert} and {key} (keep the key off the nodes; it signs node certificates)")
    return 0


def _cmd_create_node(args: argparse.Namespace) -> int:
    from raftsched.wire.certs import DEFAULT_HOSTS, create_node
    cert, key = create_node(args.dir, args.id, args.host or [], force=args.force)
    hosts = ", ".join(dict.fromkeys([*(args.host or []), *DEFAULT_HOSTS]))
    print(f"wrote {cert} and {key} for {args.id} (valid for {hosts})")
    return 0


def _cmd_read_only(args: argparse.Namespace) -> int:
    from raftsched.wire.secretfile import read_secret_file
    from raftsched.wire.session import read_only_token
    secret = os.environ.get(args.secret_env) or None
    if secret is None and os.environ.get(SECRET_FILE_ENV):
        secret = read_secret_file(os.environ[SECRET_FILE_ENV])
    if secret is None:
        raise Unauthenticated(f"no secret: set ${args.secret_env} or ${SECRET_FILE_ENV} "
                              f"to the cluster's (admin) secret")
    if secret.startswith("ro1."):
        raise ConfigError(args.secret_env, "holds a read-only token already, not the "
                                           "admin secret")
    print(read_only_token(secret))
    return 0


def _cmd_completion(args: argparse.Namespace) -> int:
    import shtab

    print(shtab.complete(args.root_parser, shell=args.shell), end="")
    return 0


def add_parsers(sub: Any, default_secret_env: str, root: argparse.ArgumentParser) -> None:
    """The certs, secret and completion commands, on the main parser's subparsers
    (``root``, the main parser, is what completion describes)."""
    p = sub.add_parser("certs", help="make a CA and node certificates for TLS")
    csub = p.add_subparsers(dest="certs_command", metavar="ACTION")
    p.set_defaults(run=None, parser=p)
    q = csub.add_parser("create-ca", help="write ca.crt and ca.key (0600) into --dir")
    q.add_argument("--dir", default="certs", metavar="DIR", help="default ./certs")
    q.add_argument("--force", action="store_true", help="overwrite existing files")
    q.set_defaults(run=_cmd_create_ca)
    q = csub.add_parser("create-node", help="write ID.crt and ID.key signed by the CA in --dir")
    q.add_argument("id", metavar="ID")
    q.add_argument("--dir", default="certs", metavar="DIR", help="default ./certs")
    q.add_argument("--host", action="append", metavar="NAME",
                   help="an IP address or DNS name clients dial the node by (repeatable; "
                        "loopback is always included)")
    q.add_argument("--force", action="store_true", help="overwrite existing files")
    q.set_defaults(run=_cmd_create_node)

    p = sub.add_parser("secret", help="derived credentials")
    ssub = p.add_subparsers(dest="secret_command", metavar="ACTION")
    p.set_defaults(run=None, parser=p)
    q = ssub.add_parser("read-only", help="print the read-only token of the cluster secret "
                                          "(status, job ls/get, runs; never a change)")
    q.add_argument("--secret-env", default=default_secret_env, metavar="NAME",
                   help=f"variable holding the admin secret (default {default_secret_env}; "
                        f"else ${SECRET_FILE_ENV})")
    q.set_defaults(run=_cmd_read_only)

    p = sub.add_parser("completion", help="print a shell completion script")
    p.add_argument("shell", choices=("bash", "zsh"))
    p.set_defaults(run=_cmd_completion, root_parser=root)
