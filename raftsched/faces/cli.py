"""The ``raftsched`` command line: run nodes, and manage jobs through the client API.

The human output is made by the pure functions of cliformat.py (result dicts in, text
out), testable without a cluster. Secrets are read from an environment variable named
by ``--secret-env``, never from argv (argv is visible to every local user).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from raftsched.core.errors import InvalidSpec, RaftschedError
from raftsched.faces.cli_common import (
    ADDR_ENV,
    DEFAULT_ADDR,
    connect,
    emit,
    positive_float,
    positive_int,
    simple_command,
)
from raftsched.faces.cliformat import (
    clean,
    format_drain,
    format_job,
    format_jobs,
    format_member,
    format_put,
    format_runs,
    format_simple,
    format_status,
    format_transfer,
    format_trigger,
)
from raftsched.faces.jobfile import check_job_file, load_job_file, refused_by_node

DEFAULT_SECRET_ENV = "RAFTSCHED_SECRET"

#: Exit codes (**contract**, docs/cli.md "Exit codes and errors"): ok, an error, a usage error, and
#: "the cluster is degraded or cannot answer" (no quorum, no node reachable).
EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_UNAVAILABLE = 0, 1, 2, 3
#: Error codes that mean the cluster (not the request) is the problem.
UNAVAILABLE_CODES = frozenset({"not_ready", "unavailable", "node_unavailable"})

# ------------------------------------------------------------------ commands

def _cmd_job_put(args: argparse.Namespace) -> int:
    specs = load_job_file(args.file)
    # The checks a put, its dry run and `job next FILE` share; the node makes its own.
    check_job_file(args.file, specs)
    if args.dry_run:
        from raftsched.faces.cli_preview import dry_run
        return dry_run(args, specs)
    with connect(args) as client:
        if len(specs) == 1:
            results = [client.put_job(specs[0])]
        else:
            # The whole file is validated and applied as one command: all or nothing.
            try:
                replies = client.put_jobs(specs, atomic=True)["results"]
            except InvalidSpec as exc:
                raise refused_by_node(exc, specs) from None
            results = [{k: r[k] for k in ("job", "version", "created", "warnings") if k in r}
                       for r in replies]
    if args.json:
        emit(args, results, str)
    else:
        for result in results:
            print(format_put(result))
    # Put all the same (a node with the tags may join later), but said where it is seen.
    for result in results:
        for warning in result.get("warnings") or ():
            print(f"warning: job {clean(result.get('job'))}: {clean(warning)}", file=sys.stderr)
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    with connect(args) as client:
        result = client.status(stale=True) if getattr(args, "stale", False) else client.status()
    emit(args, result, format_status)
    # Scripts and probes act on the exit code: a degraded or down cluster is not "ok".
    return EXIT_OK if isinstance(result, dict) and result.get("health") == "ok" \
        else EXIT_UNAVAILABLE


def _cmd_node(args: argparse.Namespace) -> int:
    from raftsched.node.process import run_node
    return int(run_node(args.config, args.id, args.data_dir, join=args.join))


def _cmd_local(args: argparse.Namespace) -> int:
    from raftsched.faces.local import run_local
    return int(run_local(nodes=args.nodes, base_port=args.base_port, data_dir=args.data_dir))


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("raftsched")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


def _stale_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--stale", action="store_true",
                   help="answer at once from this node's state, which may be behind the "
                        "cluster (default: wait until the node has caught up, else "
                        "not_ready)")


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="print the raw result as JSON")
    common.add_argument("--addr", action="append", metavar="HOST:PORT",
                        help=f"a node's API address; repeatable or comma-separated "
                             f"(default: ${ADDR_ENV} or {DEFAULT_ADDR})")
    common.add_argument("--secret-env", default=DEFAULT_SECRET_ENV, metavar="NAME",
                        help="environment variable holding the cluster secret "
                             f"(default {DEFAULT_SECRET_ENV})")
    common.add_argument("--tls-ca", metavar="PATH",
                        help="CA certificate of a TLS cluster: speak TLS, accept only nodes "
                             "it signed (default: $RAFTSCHED_TLS_CA, else no TLS)")
    common.add_argument("--timeout", type=positive_float, default=None, metavar="SECONDS",
                        help="seconds a command may take, failover included (default 10; "
                             "backup 120, cluster add-node 90, remove-node 150)")

    parser = argparse.ArgumentParser(
        prog="raftsched", description="A Raft-replicated distributed job scheduler.")
    parser.add_argument("--version", action="version", version=f"raftsched {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("node", help="run one cluster node")
    p.add_argument("--config", metavar="PATH", help="cluster config TOML (default: one "
                                                    "loopback node)")
    p.add_argument("--id", metavar="ID", help="this node's id in the config")
    p.add_argument("--data-dir", metavar="DIR", help="override cluster.data_dir")
    p.add_argument("--join", action="store_true",
                   help="a new node for a running cluster: wait to be added (`cluster "
                        "add-node`) instead of starting elections")
    p.set_defaults(run=_cmd_node)
    nsub = p.add_subparsers(dest="node_command", metavar="ACTION")
    for name, text, method in (
            ("drain", "place no new runs on node ID and move leadership off it", "drain"),
            ("undrain", "let node ID take runs again", "undrain")):
        q = nsub.add_parser(name, parents=[common], help=text)
        q.add_argument("id", metavar="ID")
        q.set_defaults(run=simple_command(method, format_drain, lambda a: {"node_id": a.id}))

    p = sub.add_parser("cluster", help="operate the cluster")
    csub = p.add_subparsers(dest="cluster_command", metavar="ACTION")
    p.set_defaults(run=None, parser=p)
    q = csub.add_parser("transfer-leader", parents=[common],
                        help="hand leadership to node ID (default: the most caught-up one)")
    q.add_argument("id", metavar="ID", nargs="?")
    q.set_defaults(run=simple_command("transfer_leader", format_transfer, lambda a: {"to": a.id}))
    q = csub.add_parser("add-node", parents=[common],
                        help="add node ID to the cluster (start it with `node --join` first)")
    q.add_argument("id", metavar="ID")
    q.add_argument("--raft", required=True, metavar="HOST:PORT", help="its Raft address")
    q.add_argument("--api", required=True, metavar="HOST:PORT", help="its API address")
    q.add_argument("--force", action="store_true",
                   help="add it even if the cluster would then lack a reachable majority")
    q.set_defaults(run=simple_command("add_node", format_member, lambda a: {
        "node_id": a.id, "raft": a.raft, "api": a.api, "force": a.force}), default_timeout=90.0)
    q = csub.add_parser("remove-node", parents=[common],
                        help="remove node ID (drained first; its runs end)")
    q.add_argument("id", metavar="ID")
    q.add_argument("--wait", type=positive_float, default=60.0, metavar="SECONDS",
                   help="how long its runs may take to end (default 60)")
    q.set_defaults(run=simple_command("remove_node", format_member, lambda a: {
        "node_id": a.id, "wait": a.wait}), default_timeout=150.0)

    p = sub.add_parser("local", help="run a whole cluster on loopback, for trying it out")
    p.add_argument("--nodes", type=positive_int, default=3, metavar="N",
                   help="how many nodes (default 3)")
    p.add_argument("--base-port", type=positive_int, default=7000, metavar="P",
                   help="node i gets raft P+i, api P+100+i, metrics P+200+i (default 7000)")
    p.add_argument("--data-dir", metavar="DIR", help="where the nodes keep their data "
                                                     "(default ./raftsched-local)")
    p.set_defaults(run=_cmd_local)

    job = sub.add_parser("job", help="manage jobs")
    jsub = job.add_subparsers(dest="job_command", metavar="ACTION")
    job.set_defaults(run=None, parser=job)

    p = jsub.add_parser("put", parents=[common], help="create or update jobs from a file")
    p.add_argument("file", metavar="FILE", help=".toml or .json file, or - for JSON on stdin")
    p.add_argument("--dry-run", action="store_true",
                   help="validate and show what would change, change nothing")
    p.set_defaults(run=_cmd_job_put)
    p = jsub.add_parser("ls", parents=[common], help="list jobs")
    p.add_argument("--prefix", metavar="P", help="only job ids starting with P")
    p.add_argument("--limit", type=positive_int, default=1000, metavar="N")
    _stale_flag(p)
    p.set_defaults(run=simple_command("list_jobs", format_jobs,
                               lambda a: {"prefix": a.prefix, "limit": a.limit}))
    for name, method, verb, text in (("get", "get_job", None, "show one job"),
                                     ("rm", "delete_job", "removed", "remove a job"),
                                     ("pause", "pause", "paused", "pause a job")):
        p = jsub.add_parser(name, parents=[common], help=text)
        p.add_argument("id", metavar="ID")
        fmt = format_job if verb is None else format_simple(verb)
        if verb is None:
            _stale_flag(p)
        p.set_defaults(run=simple_command(method, fmt, lambda a: {"job_id": a.id}))
    p = jsub.add_parser("resume", parents=[common], help="resume a paused job")
    p.add_argument("id", metavar="ID")
    p.add_argument("--catch-up", action="store_true",
                   help="run fire times missed while paused (per the misfire policy)")
    p.set_defaults(run=simple_command("resume", format_simple("resumed"),
                               lambda a: {"job_id": a.id, "catch_up": a.catch_up}))
    p = jsub.add_parser("trigger", parents=[common], help="run a job now")
    p.add_argument("id", metavar="ID")
    p.add_argument("--force", action="store_true", help="run even if the overlap policy "
                                                        "would skip it")
    p.set_defaults(run=simple_command("trigger", format_trigger,
                               lambda a: {"job_id": a.id, "force": a.force}))

    from raftsched.faces.cli_preview import add_commands
    add_commands(sub, jsub, common)
    from raftsched.faces import cli_backfill  # job backfill, backfills, backfill-cancel
    cli_backfill.add_commands(jsub, common)

    p = sub.add_parser("runs", parents=[common], help="show a job's runs, newest first")
    p.add_argument("id", metavar="ID")
    p.add_argument("--limit", type=positive_int, default=100, metavar="N")
    _stale_flag(p)
    p.set_defaults(run=simple_command("runs", format_runs,
                               lambda a: {"job_id": a.id, "limit": a.limit}))

    from raftsched.faces import cli_apply, cli_logs, cli_notify  # apply, export; notify-key
    cli_apply.add_commands(sub, jsub, common)
    cli_notify.add_commands(sub, common)
    cli_logs.add_commands(sub, common)

    from raftsched.faces.backupcli import add_parsers
    add_parsers(sub, common, connect)

    p = sub.add_parser("status", parents=[common], help="cluster health and nodes "
                                                        "(exit 3 unless the cluster is ok)")
    _stale_flag(p)
    p.set_defaults(run=_cmd_status)

    from raftsched.faces.admin import add_parsers as add_admin_parsers
    add_admin_parsers(sub, DEFAULT_SECRET_ENV, parser)
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
    except SystemExit as exc:  # --help/--version (0) or a usage error (2)
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    run = getattr(args, "run", None)
    if run is None:
        (getattr(args, "parser", None) or parser).print_usage(sys.stderr)
        return EXIT_USAGE
    try:
        return run(args)
    except RaftschedError as exc:
        message = f"{exc.message}{_hint(args, exc)}"
        if getattr(args, "json", False):
            # Scripts parse stdout: the error is JSON there too, and the exit code says it.
            print(json.dumps({"error": {"code": exc.code, "message": message}}, indent=2,
                             sort_keys=True))
        else:
            print(f"error: {exc.code}: {clean(message)}", file=sys.stderr)
        return EXIT_UNAVAILABLE if exc.code in UNAVAILABLE_CODES else EXIT_ERROR
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
