"""Jobs declared in code (``@sched.job``, ``add_job``) and their reconciliation.

Every app instance declares the same jobs at start. A declaration is a job spec whose
``call`` is the function's import path (``module:qualname``; never pickled, so any
process can declare it and only the node's process runs it). Reconciling puts every
declared spec with ``if_changed``: the state machine compares the normalized spec with
the stored one (under the Raft log's order, so instances racing with the same
definition make one version, and a changed definition exactly one new version).
Callable jobs stored in the cluster but declared nowhere in this process are reported;
they are deleted only with ``prune=True``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from raftsched.core.errors import InvalidSpec, NotReady, RaftschedError, Unavailable
from raftsched.core.machine import MAX_PUT_BATCH
from raftsched.core.model import JobSpec

#: A client-mode instance may declare before the node's process has allowed the
#: callables' modules (it declares the same jobs at its own start): retried this long.
ALLOW_RETRY_S = 10.0


@dataclass(frozen=True, slots=True, kw_only=True)
class ReconcileReport:
    """What one reconciliation did.

    :var created: ids of jobs that did not exist.
    :var updated: ids whose stored definition differed (one new version each).
    :var unchanged: ids stored exactly as declared (no new version).
    :var undeclared: callable jobs in the cluster this process does not declare.
    :var pruned: the undeclared ones deleted (``prune=True``).
    """

    created: tuple[str, ...] = ()
    updated: tuple[str, ...] = ()
    unchanged: tuple[str, ...] = ()
    undeclared: tuple[str, ...] = ()
    pruned: tuple[str, ...] = ()


def call_name(func: Any) -> tuple[str, str]:
    """``(module, qualname)`` of a module-level callable; InvalidSpec naming ``call``."""
    if not callable(func):
        raise InvalidSpec("call", f"must be a function, not {type(func).__name__}")
    module = getattr(func, "__module__", None)
    qualname = getattr(func, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str):
        raise InvalidSpec("call", f"{type(func).__name__} objects cannot be imported by name; "
                                  "pass a module-level function (not a partial)")
    if "<" in qualname or "." in qualname:  # <lambda>, f.<locals>.g, Class.method
        raise InvalidSpec("call", f"{qualname!r} cannot be imported by name; pass a "
                                  "module-level function")
    return module, qualname


def build_spec(func: Any, *, id: str | None = None, schedule: dict[str, Any] | None = None,
               cron: str | None = None, every: Any = None, at: Any = None,
               tz: str | None = None, **policy: Any) -> dict[str, Any]:
    """The job spec a declaration stands for, validated (InvalidSpec names the field)."""
    module, qualname = call_name(func)
    given = [k for k, v in (("cron", cron), ("every", every), ("at", at)) if v is not None]
    if schedule is not None and given:
        raise InvalidSpec("schedule", f"give schedule= or {given[0]}=, not both")
    if schedule is None and "after" in policy and not given:
        pass  # a dependent job (after=[...]): no schedule of its own
    elif schedule is None:
        if len(given) != 1:
            raise InvalidSpec("schedule", "give exactly one of cron=, every= or at=")
        if tz is not None and cron is None:
            raise InvalidSpec("schedule.tz", "only a cron schedule takes tz=")
        schedule = {"cron": cron} if cron is not None else \
            {"every": every} if every is not None else {"at": at}
        if tz is not None:
            schedule["tz"] = tz
    elif tz is not None:
        raise InvalidSpec("schedule.tz", "put tz inside schedule= ")
    for key in ("call", "command"):
        if key in policy:
            raise InvalidSpec(key, "is the decorated function; do not pass it")
    spec = dict(policy, id=id or f"{module}.{qualname}",
                **({} if schedule is None else {"schedule": schedule}),
                call=f"{module}:{qualname}")
    # Validated now (a typo fails at import, naming the field), stored as given.
    JobSpec.from_spec(spec, allowed_call_prefixes=None)
    return spec


def put_declarations(client: Any, specs: list[dict[str, Any]], *,
                     sleep: Callable[[float], None] = time.sleep) -> list[dict[str, Any]]:
    """Put ``specs`` with ``if_changed``; the per-job results (``job``, ``version``,
    ``created``, ``changed``). A refused spec raises InvalidSpec naming the job."""
    out: dict[str, dict[str, Any]] = {}
    pending = list(specs)
    deadline = time.monotonic() + ALLOW_RETRY_S
    while pending:
        retry: list[dict[str, Any]] = []
        for i in range(0, len(pending), MAX_PUT_BATCH):
            batch = pending[i:i + MAX_PUT_BATCH]
            reply = client.call("put_jobs", specs=batch, if_changed=True)
            for spec, res in zip(batch, reply["results"], strict=True):
                if res.get("ok"):
                    out[res["job"]] = {k: res[k] for k in ("job", "version", "created")}
                    out[res["job"]]["changed"] = bool(res["created"] or res.get("changed", True))
                    continue
                message = str((res.get("error") or {}).get("message", ""))
                if "allowed prefix" in message and time.monotonic() < deadline:
                    retry.append(spec)  # the node's process has not declared it yet
                    continue
                raise InvalidSpec(f"job {spec['id']!r}", message or "refused")
        pending = retry
        if pending:
            sleep(0.5)
    return [out[s["id"]] for s in specs]


def reconcile(client: Any, specs: list[dict[str, Any]], *, prune: bool = False,
              sleep: Callable[[float], None] = time.sleep) -> ReconcileReport:
    """Put ``specs`` (unchanged ones make no version), then report/prune undeclared jobs."""
    results = put_declarations(client, specs, sleep=sleep) if specs else []
    declared = {s["id"] for s in specs}
    stored = client.list_jobs(limit=100_000)["jobs"]
    undeclared = sorted(j["id"] for j in stored
                        if j["spec"].get("call") and j["id"] not in declared)
    pruned: list[str] = []
    # Not logged here: the caller knows when the app has declared everything it will
    # (see Scheduler), and an early report would name jobs the app is about to declare.
    if prune:
        for job_id in undeclared:
            client.delete_job(job_id)
            pruned.append(job_id)
    return ReconcileReport(
        created=tuple(r["job"] for r in results if r["created"]),
        updated=tuple(r["job"] for r in results if r["changed"] and not r["created"]),
        unchanged=tuple(r["job"] for r in results if not r["changed"]),
        undeclared=tuple(undeclared), pruned=tuple(pruned))


def with_later(report: ReconcileReport, later: list[dict[str, Any]],
               declared: set[str]) -> ReconcileReport:
    """``report`` of a start's reconciliation with the declarations made after it counted
    in: ``later`` are their put results (``job``, ``created``, ``changed``) in order,
    ``declared`` every id the process declares now. A job declared since (``add_job`` in
    a ``with`` block) is no longer undeclared, and its put is reported like the others."""
    created = dict.fromkeys(report.created)
    updated = dict.fromkeys(report.updated)
    unchanged = dict.fromkeys(report.unchanged)
    for res in later:
        job = res["job"]
        if job in created:
            continue
        if res["created"]:
            updated.pop(job, None)
            unchanged.pop(job, None)
            created[job] = None
        elif res["changed"]:
            unchanged.pop(job, None)
            updated[job] = None
        elif job not in updated:
            unchanged[job] = None
    return ReconcileReport(
        created=tuple(created), updated=tuple(updated), unchanged=tuple(unchanged),
        undeclared=tuple(j for j in report.undeclared if j not in declared),
        pruned=report.pruned)


def retriable(exc: BaseException) -> bool:
    """Errors a background declaration waits out (no quorum yet, node not listening)."""
    return isinstance(exc, (NotReady, Unavailable, ConnectionError, TimeoutError)) or (
        isinstance(exc, RaftschedError) and exc.code in ("not_ready", "unavailable"))
