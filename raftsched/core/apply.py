"""Declarative apply: make the cluster's jobs equal a set of job files, as one change.

Pure. :func:`plan_apply` compares the desired specs with the current jobs and says, per
job, what one ``apply`` command would do: ``create``, ``update`` (naming the changed
fields), leave it ``unchanged`` (no new version), or ``remove`` it (``prune``). The state
machine (:func:`apply_apply`, which ``StateData.apply`` dispatches to) and the node's
dry run (``diff_apply``) call the same function, so the diff an operator reviews is the
change that commits.

``env`` values the cluster already holds need not be written down: an env value
``{keep = true}`` (what ``raftsched job export`` writes instead of the masked value)
stands for the job's current value of that variable, resolved here against the state.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from raftsched.core import deps, jobs
from raftsched.core.commands import ApplyJobs, DeleteJob
from raftsched.core.errors import Conflict, InvalidSpec, LimitExceeded, RaftschedError
from raftsched.core.model import JobSpec
from raftsched.core.specprep import KEEP, Checked, CheckedSpec, intern_spec, is_keep
from raftsched.core.trigger import next_fire

if TYPE_CHECKING:
    from raftsched.core.state import StateData

#: Jobs an apply may remove (``prune``) in one command: a bounded apply time.
MAX_REMOVALS = 1000


@dataclass(frozen=True, slots=True, kw_only=True)
class Change:
    """What an apply does to one job.

    :var action: ``create``, ``update``, ``unchanged`` or ``remove``.
    :var job: the job id.
    :var spec: the desired spec (None for ``remove``).
    :var fields: for ``update``, the changed top-level fields and ``env.NAME`` entries
        (values never: an env value may be a secret).
    :var version: the job's current version (0 for ``create``).
    """

    action: str
    job: str
    spec: JobSpec | None
    fields: tuple[str, ...] = ()
    version: int = 0


def resolve_keep(raw: Any, current: JobSpec | None, where: str) -> Any:
    """``raw`` with every ``{keep = true}`` env value replaced by ``current``'s value.

    Raises :class:`InvalidSpec` naming ``<where>.env.NAME`` when there is nothing to
    keep (a new job, or a job without that variable)."""
    if not isinstance(raw, dict):
        return raw
    env = raw.get("env")
    if not isinstance(env, dict) or not any(is_keep(v) for v in env.values()):
        return raw
    out = {}
    for name, value in env.items():
        if is_keep(value):
            have = current.env if current is not None else {}
            if name not in have:
                whose = f"job {current.id!r} has no env {name}" if current is not None \
                    else "the job does not exist yet"
                raise InvalidSpec(f"{where}env.{name}",
                                  f"{{keep = true}} keeps the cluster's current value, but "
                                  f"{whose}; write the value")
            out[name] = have[name]
        else:
            out[name] = value
    return dict(raw, env=out)


def changed_fields(old: JobSpec, new: JobSpec) -> tuple[str, ...]:
    """The top-level fields that differ (``paused`` is not compared: see module doc),
    with env changes as ``env.NAME``."""
    a, b = old.to_spec(), new.to_spec()
    out = [k for k in sorted(set(a) | set(b))
           if k not in ("env", "paused") and a.get(k) != b.get(k)]
    for name in sorted(set(old.env) | set(new.env)):
        if old.env.get(name) != new.env.get(name):
            out.append(f"env.{name}")
    return tuple(out)


def plan_apply(specs: list[Any], current: Mapping[str, tuple[JobSpec, int]], *,
               all_ids: Iterable[str], prune: bool,
               allowed_call_prefixes: tuple[str, ...] | None = None,
               checked: tuple[Checked, ...] = ()) -> list[Change]:
    """The changes that make the jobs equal ``specs`` (validated whole; raises
    :class:`InvalidSpec` naming ``specs[i].field`` on the first problem, changing nothing).

    ``current`` maps the ids of ``specs`` that exist (at least) to (spec, version);
    ``all_ids`` is every job id, for ``prune``. ``allowed_call_prefixes`` is None when the
    specs were already validated where they entered (the state machine's replay).
    ``paused`` is taken from a file only when it creates the job: an update keeps the
    job's paused state (``job pause``/``resume`` have their own accounting).
    ``checked``: the specs as the command's ``from_wire`` prepared them (replay only)."""
    changes: list[Change] = []
    seen: set[str] = set()
    for i, raw in enumerate(specs):
        where = f"specs[{i}]."
        job_id = raw.get("id") if isinstance(raw, dict) else None
        have = current.get(job_id) if isinstance(job_id, str) else None
        ready = checked[i] if checked else None
        try:
            if isinstance(ready, InvalidSpec):
                raise ready
            spec = ready.spec if isinstance(ready, CheckedSpec) else JobSpec.from_spec(
                resolve_keep(raw, have[0] if have else None, ""),
                allowed_call_prefixes=allowed_call_prefixes)
        except InvalidSpec as exc:
            raise InvalidSpec(where + exc.field, exc.message.partition(": ")[2]) from None
        if spec.id in seen:
            raise InvalidSpec(where + "id", f"{spec.id!r} appears twice")
        seen.add(spec.id)
        if have is None:
            changes.append(Change(action="create", job=spec.id, spec=spec))
            continue
        old, version = have
        spec = replace(spec, paused=old.paused)
        fields = () if spec == old else changed_fields(old, spec)
        changes.append(Change(action="update" if fields else "unchanged", job=spec.id,
                              spec=spec, fields=fields, version=version))
    if prune:
        gone = sorted(j for j in all_ids if j not in seen)
        if len(gone) > MAX_REMOVALS:
            raise InvalidSpec("prune", f"would remove {len(gone)} jobs; at most "
                                       f"{MAX_REMOVALS} per apply")
        for job_id in gone:
            have = current.get(job_id)
            changes.append(Change(action="remove", job=job_id, spec=None,
                                  version=have[1] if have else 0))
    return changes


@dataclass(frozen=True, slots=True, kw_only=True)
class Prepared:
    """An apply's changes, worked out from the state it will be applied to."""

    changes: list[Change]
    """What the command does to each job (``plan_apply``)."""
    specs: dict[str, CheckedSpec]
    """Job id -> the spec to put, with its next fire time after the mark the job is
    expected to have (a job whose mark turns out otherwise finds its own)."""


def prepare_apply(st: StateData, cmd: ApplyJobs) -> Prepared:
    """The pure part of an apply: validating, diffing and finding fire times (raises
    :class:`InvalidSpec` as the apply would). ``ClusterState.prepare`` runs it before
    the state lock is taken, where it costs the lock's other users nothing."""
    changes = plan_apply(list(cmd.specs), _Current(st), all_ids=st.jobs, prune=cmd.prune,
                         checked=cmd.checked)
    firsts = {c.spec.id: c for c in cmd.checked if isinstance(c, CheckedSpec)}
    specs: dict[str, CheckedSpec] = {}
    for ch in changes:
        if ch.action in ("remove", "unchanged") or ch.spec is None:
            continue
        rec = st.jobs.get(ch.job)
        # put_spec's mark: a new job's and a new schedule's accounting starts at `at`.
        mark = cmd.at if rec is None else (max(rec.hwm_ms, cmd.at)
                                           if ch.spec.schedule != rec.spec.schedule
                                           else rec.hwm_ms)
        first = firsts.get(ch.job)
        # from_wire's spec is interned already, and its first fire time holds for the
        # spec plan_apply made of it (which replaces only `paused`) when the mark is `at`.
        nxt = first.next_after(mark) if first is not None else next_fire(ch.spec.schedule,
                                                                         mark)
        spec = ch.spec if first is not None else intern_spec(ch.spec)
        specs[ch.job] = CheckedSpec(spec=spec, after_ms=mark, next_ms=nxt)
    return Prepared(changes=changes, specs=specs)


class _Current(Mapping[str, tuple[JobSpec, int]]):
    """The state's jobs as ``id -> (spec, version)``, without copying them."""

    def __init__(self, st: StateData) -> None:
        self.jobs = st.jobs

    def __getitem__(self, job_id: str) -> tuple[JobSpec, int]:
        rec = self.jobs[job_id]
        return rec.spec, rec.version

    def __iter__(self) -> Any:
        return iter(self.jobs)

    def __len__(self) -> int:
        return len(self.jobs)


def apply_apply(st: StateData, cmd: ApplyJobs, ready: Any = None) -> dict[str, Any]:
    """:class:`~raftsched.core.commands.ApplyJobs`: one all-or-nothing change.

    Everything that could refuse it is checked before anything changes: each spec
    (``specs[i].field``), ``{keep = true}`` env values, ``expect`` (``{job: version}``
    as the dry run saw it, 0 for absent: a job changed since then refuses the whole
    apply) and ``max_jobs``. Then unchanged jobs are left alone (no new version),
    changed ones are put and, with ``prune``, jobs not in ``specs`` are removed.
    Reply: ``results`` ``[[action, job, version]]`` for what changed, ``unchanged`` (a
    count). ``ready``: what :func:`prepare_apply` made of ``cmd`` outside the state
    lock (the dispatcher's ``take_prepared``), else None."""
    at, expect = cmd.at, cmd.expect
    if isinstance(ready, RaftschedError):
        raise ready.with_traceback(None)
    if not isinstance(ready, Prepared):
        ready = prepare_apply(st, cmd)
    changes = ready.changes
    if expect is not None:
        for ch in changes:
            if expect.get(ch.job, 0) != ch.version:
                raise Conflict(ch.job, f"changed since the diff (version {ch.version}, the "
                                       f"diff saw {expect.get(ch.job, 0)}); run apply again")
    new = sum(ch.action == "create" for ch in changes)
    gone = sum(ch.action == "remove" for ch in changes)
    max_jobs = cmd.max_jobs
    if max_jobs is not None and new and len(st.jobs) + new - gone > max_jobs:
        raise LimitExceeded("max_jobs", f"the cluster holds {len(st.jobs)} jobs; applying "
                                        f"would make {len(st.jobs) + new - gone}")
    for ch in changes:  # an `at` beyond its grace would refuse its put half-way
        if ch.action not in ("remove", "unchanged") and ch.spec is not None:
            jobs.late_one_shot(ch.spec, st.jobs.get(ch.job), at, cmd.v)
    _check_graph(st, changes)
    results: list[list[Any]] = []
    for ch in changes:
        if ch.action == "remove":
            jobs.apply_delete_job(st, DeleteJob(job=ch.job, at=at), checked=True)
            results.append(["remove", ch.job, ch.version])
        elif ch.action != "unchanged" and ch.spec is not None:
            reply = jobs.put_spec(st, ready.specs[ch.job], None, at, cmd.v, checked=True)
            results.append([ch.action, ch.job, reply["version"]])
    return {"ok": True, "results": results, "unchanged": len(changes) - len(results)}


def _check_graph(st: StateData, changes: list[Change]) -> None:
    """The dependency graph as the whole apply leaves it: every ``after`` names a job
    that will exist, no cycle, and no job removed while a remaining one runs after it."""
    final: dict[str, JobSpec | None] = {
        ch.job: ch.spec for ch in changes if ch.action in ("create", "update", "remove")}
    for ch in changes:
        if ch.spec is not None and ch.action in ("create", "update"):
            try:
                deps.check_graph(st, ch.spec, final)
            except InvalidSpec as exc:
                raise InvalidSpec(f"{ch.job}.{exc.field}",
                                  exc.message.partition(": ")[2]) from None
    for ch in changes:
        if ch.action == "remove":
            kids = sorted(k for k in st.dependents.get(ch.job, ())
                          if (spec := final.get(k, _current(st, k))) is not None
                          and ch.job in spec.after)
            if kids:
                raise Conflict("after", f"{', '.join(kids[:5])} run(s) after {ch.job}: "
                                        f"remove them or change their after too")


def _current(st: StateData, job_id: str) -> JobSpec | None:
    rec = st.jobs.get(job_id)
    return None if rec is None else rec.spec


__all__ = ["apply_apply", "KEEP", "MAX_REMOVALS", "Change", "Prepared", "changed_fields",
           "is_keep", "plan_apply", "prepare_apply", "resolve_keep"]
