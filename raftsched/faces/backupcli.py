"""``raftsched backup FILE`` and ``raftsched restore FILE``."""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from typing import Any

from raftsched.core.errors import ConfigError


def _when(ms: Any) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ms / 1000)) \
        if isinstance(ms, int) else "?"


def _describe(header: dict[str, Any]) -> str:
    return (f"cluster {header.get('cluster_id')} at log index {header.get('index')} (term "
            f"{header.get('term')}), taken by {header.get('node')} at "
            f"{_when(header.get('time_ms'))}, "
            f"{header.get('size')} bytes of state, sha256 {str(header.get('sha256'))[:16]}…")


def cmd_backup(args: argparse.Namespace, client_of: Callable[[argparse.Namespace], Any]) -> int:
    from raftsched.node.service.backupfile import read_header

    with client_of(args) as client:
        data = client.backup()
    header, _ = read_header(data, "<backup from the node>")  # what we got is whole
    tmp = f"{args.file}.tmp"
    # Job env values are in it in the clear (as in the journal): owner only.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with open(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, args.file)
    if args.json:
        print(json.dumps(dict(header, file=args.file), indent=2, sort_keys=True))
    else:
        print(f"wrote {args.file}: {_describe(header)}")
    return 0


def cmd_restore(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from raftsched.node.config.config import load_config
    from raftsched.node.service.backup import restore

    cfg = load_config(args.config)
    if args.data_dir:
        cfg = replace(cfg, data_dir=args.data_dir)
    try:
        done = restore(args.file, cfg, [args.id] if args.id else None)
    except FileNotFoundError:
        raise ConfigError("FILE", f"{args.file}: no such file") from None
    if args.json:
        print(json.dumps(done, indent=2, sort_keys=True))
    else:
        print(f"restored {done['jobs']} jobs from {_describe(done['header'])}")
        for path in done["written"]:
            print(f"  seeded {os.path.dirname(path)}")
        print("start the new cluster's nodes as usual (`raftsched node --config ... --id ...`)")
    return 0


def add_parsers(sub: Any, common: argparse.ArgumentParser,
                client_of: Callable[[argparse.Namespace], Any]) -> None:
    p = sub.add_parser("backup", parents=[common],
                       help="write a consistent backup of the cluster's state to FILE")
    p.add_argument("file", metavar="FILE")
    p.set_defaults(run=lambda a: cmd_backup(a, client_of), default_timeout=120.0)
    p = sub.add_parser("restore", help="seed a new cluster's data dirs from a backup FILE")
    p.add_argument("file", metavar="FILE")
    p.add_argument("--config", required=True, metavar="PATH",
                   help="the new cluster's config TOML (its nodes become the members)")
    p.add_argument("--data-dir", metavar="DIR", help="override cluster.data_dir")
    p.add_argument("--id", metavar="ID", help="seed only this node's data dir (one machine)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(run=cmd_restore)
