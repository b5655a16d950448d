"""``raftsched apply DIR|FILE [--prune] [--dry-run]`` and ``raftsched job export [--dir DIR]``.

``apply`` asks the cluster for the diff first (``diff_apply``: the same computation the
state machine makes), prints it like ``kubectl diff`` (a unified diff of each job's spec
as TOML, env values masked), then commits one ``apply`` command carrying the versions the
diff saw: a job changed in between refuses the whole apply. ``export`` writes each job
as a job file that ``apply`` reads back unchanged; an env value, which the cluster never
hands out, is written as ``{ keep = true }`` (keep the cluster's current value).
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import sys
from typing import Any

from raftsched.core.errors import InvalidSpec, RaftschedError

#: Env values of exported jobs: "keep the cluster's value" (never the mask, never a value).
KEEP_VALUE = {"keep": True}
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+\Z")
#: Top-level fields in the order a job file lists them.
_ORDER = ("id", "schedule", "start", "end", "after", "on", "command", "call", "http",
          "timeout", "overlap", "misfire", "retries", "on_node_lost", "tags", "jitter",
          "paused", "concurrency", "env")


# ------------------------------------------------------------------ TOML out

def _toml_str(text: str) -> str:
    out = ['"']
    for ch in text:
        if ch in ('"', "\\"):
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def toml_value(value: Any) -> str:
    """A value of a job spec as TOML (strings, integers, booleans, lists, inline tables)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return _toml_str(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        if not value:
            return "{}"
        return "{ " + ", ".join(f"{_key(k)} = {toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"no TOML for {type(value).__name__}")


def _key(key: str) -> str:
    return key if _BARE_KEY.match(key) else _toml_str(key)


def toml_job(spec: dict[str, Any]) -> str:
    """One job as the lines of a job file (fields in their usual order)."""
    keys = [k for k in _ORDER if k in spec] + sorted(k for k in spec if k not in _ORDER)
    return "".join(f"{_key(k)} = {toml_value(spec[k])}\n" for k in keys)


# ------------------------------------------------------------------ export

def compact(spec: dict[str, Any]) -> dict[str, Any]:
    """A spec without the fields left at their defaults (``env`` as given)."""
    from raftsched.core.model import JobSpec
    base: dict[str, Any] = {k: spec[k] for k in ("id", "schedule", "after", "command", "call",
                                                 "http") if k in spec}
    try:
        # With env: an http table names env values (${NAME}) that must be there.
        defaults = JobSpec.from_spec(dict(base, env=spec.get("env")),
                                     allowed_call_prefixes=None).to_spec()
    except RaftschedError:
        return spec
    defaults["env"] = {}
    return {k: v for k, v in spec.items() if k in base or defaults.get(k) != v}


def exported(spec: dict[str, Any]) -> dict[str, Any]:
    """A job's spec (as ``job get`` shows it) as a job file: fields left at their defaults
    are dropped, env values become ``{ keep = true }``."""
    out = compact(spec)
    if spec.get("env"):
        out["env"] = {name: dict(KEEP_VALUE) for name in spec["env"]}
    return out


def _cmd_export(args: argparse.Namespace) -> int:
    from raftsched.faces.cli_common import connect
    from raftsched.faces.cliformat import clean
    with connect(args) as client:
        result = client.list_jobs(limit=100_000)
    specs = [exported(j["spec"]) for j in result.get("jobs") or []]
    if args.json:
        print(json.dumps(specs, indent=2, sort_keys=True))
        return 0
    if args.dir is None:
        sys.stdout.write("\n".join("[[jobs]]\n" + toml_job(s) for s in specs))
        return 0
    os.makedirs(args.dir, exist_ok=True)
    for spec in specs:
        path = os.path.join(args.dir, f"{spec['id']}.toml")
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(toml_job(spec))
        os.replace(tmp, path)
    print(f"exported {len(specs)} job{'' if len(specs) == 1 else 's'} to {clean(args.dir)}")
    return 0


# ------------------------------------------------------------------ apply

def load_sources(path: str) -> tuple[list[dict[str, Any]], list[tuple[str, int, int]]]:
    """The specs of a job file, or of every ``*.toml``/``*.json`` file in a directory (not
    recursive, in name order), with each spec's ``(file, index in file, jobs in file)``."""
    from raftsched.faces.jobfile import load_job_file
    if os.path.isdir(path):
        names = sorted(n for n in os.listdir(path)
                       if n.endswith((".toml", ".json")) and not n.startswith("."))
        files = [os.path.join(path, n) for n in names]
    else:
        files = [path]
    specs: list[dict[str, Any]] = []
    where: list[tuple[str, int, int]] = []
    for file in files:
        jobs = load_job_file(file)
        specs.extend(jobs)
        where.extend((file, i, len(jobs)) for i in range(len(jobs)))
    return specs, where


def _source_field(field: str, specs: list[dict[str, Any]],
                  where: list[tuple[str, int, int]]) -> str:
    """``specs[3].schedule`` as ``jobs/b.toml: schedule`` (or ``...: jobs[1] ('x').f``)."""
    m = re.match(r"specs\[(\d+)\]\.?(.*)\Z", field)
    if not m or int(m.group(1)) >= len(where):
        return field
    file, i, n = where[int(m.group(1))]
    rest = m.group(2)
    if n == 1:
        return f"{file}: {rest}"
    job_id = specs[int(m.group(1))].get("id")
    label = f"jobs[{i}] ({job_id!r})" if isinstance(job_id, str) else f"jobs[{i}]"
    return f"{file}: {label}.{rest}"


def format_diff(diff: dict[str, Any]) -> str:
    """The changes as unified diffs of TOML, then a one-line summary."""
    out: list[str] = []
    counts = {"create": 0, "update": 0, "remove": 0}
    for ch in diff.get("changes") or []:
        action, job = ch.get("action"), str(ch.get("job"))
        counts[action] = counts.get(action, 0) + 1
        before = toml_job(compact(ch["before"])).splitlines(keepends=True) \
            if ch.get("before") else []
        after = toml_job(compact(ch["after"])).splitlines(keepends=True) \
            if ch.get("after") else []
        old = f"cluster/{job} (version {ch.get('version')})" if before else "/dev/null"
        new = f"files/{job}" if after else "/dev/null"
        out.append(f"{action} {job}" + (f": {', '.join(ch.get('fields') or [])}"
                                        if action == "update" else ""))
        out.extend(line.rstrip("\n") for line in difflib.unified_diff(
            before, after, old, new, n=max(len(before), len(after))))
    unchanged = len(diff.get("unchanged") or [])
    out.append(f"{counts['create']} to create, {counts['update']} to update, "
               f"{counts['remove']} to remove, {unchanged} unchanged")
    return "\n".join(out)


def _cmd_apply(args: argparse.Namespace) -> int:
    from raftsched.faces.cli_common import connect
    from raftsched.faces.cliformat import clean
    specs, where = load_sources(args.path)
    if not specs and not args.prune:
        raise InvalidSpec(args.path, "holds no job files (*.toml, *.json)")
    with connect(args) as client:
        try:
            diff = client.diff_apply(specs, prune=args.prune)
            if not args.json:
                print(clean(format_diff(diff), multiline=True))
            if args.dry_run or not diff.get("changes"):
                if args.json:
                    print(json.dumps(diff, indent=2, sort_keys=True))
                return 0
            result = client.apply(specs, prune=args.prune, expect=diff.get("expect"))
        except InvalidSpec as exc:
            field, _, problem = exc.message.partition(": ")
            raise InvalidSpec(_source_field(field, specs, where), problem) from None
    if args.json:
        print(json.dumps(result, indent=2, sort_keys=True))
        return 0
    for action, job, version in result.get("results") or []:
        verb = {"create": "created", "update": "updated", "remove": "removed"}.get(action,
                                                                                   action)
        print(f"{verb} {clean(job)}" + (f" (version {version})" if action != "remove"
                                        else ""))
    return 0


def add_commands(sub: Any, jsub: Any, common: argparse.ArgumentParser) -> None:
    """Register ``apply`` and ``job export`` on the CLI's parsers."""
    p = sub.add_parser("apply", parents=[common],
                       help="make the cluster's jobs equal a directory (or file) of job "
                            "files, as one change; prints the diff first")
    p.add_argument("path", metavar="DIR|FILE", help="a job file, or a directory of "
                                                    "*.toml/*.json job files")
    p.add_argument("--prune", action="store_true",
                   help="also remove the jobs that no file names")
    p.add_argument("--dry-run", action="store_true", help="print the diff, change nothing")
    p.set_defaults(run=_cmd_apply)
    p = jsub.add_parser("export", parents=[common],
                        help="write the jobs out as job files (env values as "
                             "{ keep = true })")
    p.add_argument("--dir", metavar="DIR", help="one <id>.toml per job in DIR (default: "
                                                "all jobs as one TOML document on stdout)")
    p.set_defaults(run=_cmd_export)


__all__ = ["add_commands", "exported", "format_diff", "load_sources", "toml_job",
           "toml_value"]
