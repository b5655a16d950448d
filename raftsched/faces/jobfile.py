"""Job files for the CLI: reading them, and the checks ``job put`` makes of them.

``job put``, ``job put --dry-run`` and ``job next FILE`` all read a file with
:func:`load_job_file` and check it with :func:`check_job_file`, so a file one of them
refuses, all of them refuse, with the same words. What only the cluster knows (its
allowed ``call`` prefixes and size limits, and whether a past ``at`` is the stored
job's own) the node checks on put and on a dry run alike.
"""

from __future__ import annotations

import json
import sys
import tomllib
from typing import Any

from raftsched.core.errors import InvalidSpec
from raftsched.faces.cliformat import clean

#: A job file is applied as one put_jobs command (the state machine's batch limit).
MAX_FILE_JOBS = 1000


def load_job_file(path: str) -> list[dict[str, Any]]:
    """The job specs in a .toml/.json file (or JSON on stdin for ``-``); InvalidSpec
    naming the file for syntax errors and wrong shapes."""
    name = "<stdin>" if path == "-" else path
    try:
        if path == "-":
            data: Any = json.loads(sys.stdin.read())
        elif path.lower().endswith(".json"):
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        else:
            with open(path, "rb") as f:
                data = tomllib.load(f)
    except OSError as exc:
        raise InvalidSpec(name, f"cannot read: {exc.strerror or exc}") from None
    except (json.JSONDecodeError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise InvalidSpec(name, str(exc)) from None
    if isinstance(data, dict) and isinstance(data.get("jobs"), list):
        jobs = data["jobs"]
    elif isinstance(data, list):
        jobs = data
    elif isinstance(data, dict):
        jobs = [data]
    else:
        raise InvalidSpec(name, "must hold a job table/object or a list of them")
    if not jobs:
        raise InvalidSpec(name, "holds no jobs")
    for i, job in enumerate(jobs):
        if not isinstance(job, dict):
            raise InvalidSpec(name, f"jobs[{i}] must be a table/object, not {type(job).__name__}")
    return jobs


def check_job_file(name: str, specs: list[dict[str, Any]], *,
                   now_ms: int | None = None) -> list[Any]:
    """Each spec as the JobSpec ``job put`` would send, refused as the put would refuse
    it (InvalidSpec naming the field in the file's terms, see :func:`spec_field`).

    ``now_ms``: also refuse an ``at`` that passed beyond its grace, as the node does for
    a new job — for a caller with no cluster to ask whether it is the stored job's."""
    from raftsched.core.commands import PAST_AT_VERSION
    from raftsched.core.jobs import late_at
    from raftsched.core.model import JobSpec

    if len(specs) > MAX_FILE_JOBS:
        raise InvalidSpec(name, f"holds {len(specs)} jobs; a file is applied as one "
                                f"change of at most {MAX_FILE_JOBS} jobs")
    jobs: list[JobSpec] = []
    seen: set[str] = set()
    for i, raw in enumerate(specs):
        try:
            job = JobSpec.from_spec(raw, allowed_call_prefixes=_any_call(raw))
            if job.id in seen:
                raise InvalidSpec("id", f"{job.id!r} appears twice")
            if now_ms is not None:
                late_at(job, None, now_ms, PAST_AT_VERSION)
        except InvalidSpec as exc:
            raise InvalidSpec(spec_field(exc.field, i, specs),
                              exc.message.partition(": ")[2]) from None
        seen.add(job.id)
        jobs.append(job)
    return jobs


def _any_call(raw: dict[str, Any]) -> tuple[str, ...]:
    # Only the cluster knows its allowed call prefixes (the node checks them); here a
    # call's own module passes, and every check made where a spec enters (the env mask)
    # is still made, which ``allowed_call_prefixes=None`` (a replay) would skip.
    call = raw.get("call")
    return (call.partition(":")[0],) if isinstance(call, str) else ()


def spec_field(field: str, i: int, specs: list[dict[str, Any]]) -> str:
    """Field ``field`` of spec ``i``: as it is (a file of one job, whose put is a
    ``put_job``), else ``jobs[1] ('m6').field`` — the file's own terms."""
    if len(specs) == 1:
        return field
    job_id = specs[i].get("id") if i < len(specs) else None
    return f"jobs[{i}] ({clean(job_id)!r}).{field}" if isinstance(job_id, str) \
        else f"jobs[{i}].{field}"


def wire_field(field: str, specs: list[dict[str, Any]]) -> str:
    """A node's ``specs[1].schedule`` (``put_jobs``, ``preview_put``) in the file's terms."""
    head, sep, rest = field.partition("].")
    if not head.startswith("specs[") or not sep or not head[6:].isdigit():
        return field
    return spec_field(rest, int(head[6:]), specs)


def refused_by_node(exc: InvalidSpec, specs: list[dict[str, Any]]) -> InvalidSpec:
    """The node's refusal of ``specs`` (its message is ``<field>: <problem>``), the field
    in the file's terms."""
    field, _, problem = exc.message.partition(": ")
    return InvalidSpec(wire_field(field, specs), problem)


__all__ = ["MAX_FILE_JOBS", "check_job_file", "load_job_file", "refused_by_node",
           "spec_field", "wire_field"]
