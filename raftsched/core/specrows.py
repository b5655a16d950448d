"""Job specs as snapshot rows, and a snapshot's job table.

Rows instead of spec dicts in snapshots: restoring a million jobs must not re-run cron
validation, and equal sub-records (schedules, policies) are shared in memory. A large
table (snapshot version 4) goes further: each distinct spec row is written once, without
its id, and each job names it by index, so that a restart builds one spec per distinct
row (a million jobs put from one template: decoded in 2.4-3.0 s instead of 5.1-6.0,
55 MB instead of 132 before gzip); the other jobs of the row hold that spec until
theirs is first read (:class:`~raftsched.core.records.LazyJobRecord`).
"""

from __future__ import annotations

from typing import Any

from raftsched.core.errors import ProtocolError
from raftsched.core.model import (
    NO_ENV,
    JobSpec,
    MisfirePolicy,
    MisfireSpec,
    OnNodeLost,
    Overlap,
    RetrySpec,
)
from raftsched.core.packing import packb
from raftsched.core.records import JobRecord, stored_spec
from raftsched.core.specclone import same_but_id
from raftsched.core.specext import ConcurrencySpec, DepOn
from raftsched.core.trigger import AtSchedule, bounded, schedule_from_row, schedule_to_row

#: From this many jobs on, a snapshot writes the shared spec table (version 4). A
#: smaller state keeps the bytes of versions 1-3, which the releases before it read.
SHARED_SPECS_MIN_JOBS = 10_000

def spec_to_row(spec: JobSpec) -> list[Any]:
    sched = spec.schedule
    row = [spec.id, schedule_to_row(sched),
           list(spec.command) if spec.command is not None else None, spec.call,
           spec.timeout_ms, spec.overlap.value,
           [spec.misfire.policy.value, spec.misfire.grace_ms, spec.misfire.max_catchup],
           [spec.retries.max, spec.retries.backoff_ms, spec.retries.backoff_max_ms],
           spec.on_node_lost.value, list(spec.tags), spec.jitter_ms, spec.paused,
           dict(spec.env)]
    bounds = sched.start_ms is not None or sched.end_ms is not None
    ext = _ext_row(spec)
    if bounds or ext:
        # Only then (snapshot version 2): an unbounded job's row is the 13 values it was.
        row.append([sched.start_ms, sched.end_ms] if bounds else None)
    if ext:
        row.append(ext)  # only then (snapshot version 3)
    return row


def _ext_row(spec: JobSpec) -> dict[str, Any] | None:
    """A spec's third-wave fields as a row's 15th value, None when it has none."""
    ext: dict[str, Any] = {}
    if spec.after:
        ext["after"] = list(spec.after)
        ext["on"] = spec.on.value
    if spec.concurrency is not None:
        ext["conc"] = spec.concurrency.to_row()
    return ext or None


def uses_v3(spec: JobSpec) -> bool:
    """Whether a job's row needs snapshot version 3."""
    return bool(spec.after) or spec.concurrency is not None


class Interner:
    """Builds each distinct sub-record once per restore, keyed by its raw row, and
    shares equal strings and integers: msgpack makes a fresh object for every value
    it decodes, so a restored million-job state would otherwise hold a million copies
    of the same call string (64 bytes each) and of each timestamp (32 bytes)."""

    #: Bound on the value cache (cleared when reached): most distinct values are
    #: met again within a few rows (jobs sorted by id were mostly put together).
    LIMIT = 100_000

    def __init__(self) -> None:
        self.cache: dict[Any, Any] = {}
        self.values: dict[Any, Any] = {}

    def get(self, key: Any, build: Any) -> Any:
        found = self.cache.get(key)
        if found is None:
            found = self.cache[key] = build()
        return found

    def share(self, value: Any) -> Any:
        """An equal object met before, else ``value``. Exact ints and strings only (no
        int equals a string): a bool or a float must not come back as an equal int."""
        if type(value) is not int and type(value) is not str:
            return value
        values = self.values
        if len(values) >= self.LIMIT:
            values.clear()
        return values.setdefault(value, value)


_OVERLAP = {m.value: m for m in Overlap}
_LOST = {m.value: m for m in OnNodeLost}


def spec_from_row(row: list[Any], intern: Interner | None = None) -> JobSpec:
    it = intern or Interner()
    (job_id, sch, command, call, timeout, overlap, mis, ret, lost, tags, jitter, paused,
     env) = row[:13]
    if len(row) > 13 and row[13] is not None:
        start, end = row[13]
        schedule = it.get(("s", *sch, start, end),
                          lambda: bounded(schedule_from_row(sch), start, end))
    else:
        schedule = it.get(("s", *sch), lambda: schedule_from_row(sch))
    ext = row[14] if len(row) > 14 else None
    misfire = it.get(("m", *mis), lambda: MisfireSpec(
        policy=MisfirePolicy(mis[0]), grace_ms=mis[1], max_catchup=mis[2]))
    retries = it.get(("r", *ret), lambda: RetrySpec(max=ret[0], backoff_ms=ret[1],
                                                    backoff_max_ms=ret[2]))
    return JobSpec(
        id=job_id, schedule=schedule,
        command=it.get(("c", *command), lambda: tuple(command)) if command is not None
        else None, call=it.share(call), timeout_ms=it.share(timeout),
        overlap=_OVERLAP[overlap], misfire=misfire, retries=retries, on_node_lost=_LOST[lost],
        tags=it.get(("t", *tags), lambda: tuple(tags)) if tags else (),
        jitter_ms=it.share(jitter), paused=paused,
        # Equal envs are shared like the state shares them (never mutated).
        env=it.get(("e", *env.items()), lambda: env) if env else NO_ENV,
        **(_ext_fields(ext, it) if ext else {}))


def _ext_fields(ext: dict[str, Any], it: Interner) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if "after" in ext:
        out["after"] = tuple(ext["after"])
        out["on"] = DepOn(ext["on"])
    if "conc" in ext:
        conc = ext["conc"]
        out["concurrency"] = it.get(("k", *conc), lambda: ConcurrencySpec.from_row(conc))
    return out


# ------------------------------------------------------------------ the job table

def job_rows(jobs: dict[str, JobRecord], shared: bool) -> tuple[list[Any] | None, list[Any]]:
    """``(specs, rows)``: the jobs' rows in id order. Shared (version 4): ``specs`` is
    the distinct spec rows without their ids, in order of first use, and a job's row is
    ``[id, spec index, version, created, updated, hwm, next, active, last]``. Else
    ``specs`` is None and a row starts with the whole spec row instead of id and index."""
    specs: list[Any] | None = [] if shared else None
    index: dict[bytes, int] = {}
    rows: list[list[Any]] = []
    prev: JobSpec | None = None
    at = 0
    for job_id, r in sorted(jobs.items()):
        # ``active`` as it is (a list or the shared empty tuple: msgpack writes both as
        # an array), not a copy per job: the rows are packed before anything changes.
        times = (r.version, r.created_ms, r.updated_ms, r.hwm_ms, r.next_ms, r.active,
                 list(r.last) if r.last else None)
        if specs is None:
            rows.append([spec_to_row(r.spec), *times])
            continue
        # A job made from the same template as the one before it (the common case of a
        # large table) takes that one's row without building the row again.
        # The stored spec: a restored record's own copy is not made for its row.
        spec = stored_spec(r)
        if prev is None or (spec is not prev and not same_but_id(spec, prev)):
            rest = spec_to_row(spec)[1:]
            key = packb(rest)
            found = index.get(key)
            if found is None:
                found = index[key] = len(specs)
                specs.append(rest)
            at = found
        prev = spec
        rows.append([job_id, at, *times])
    return specs, rows




class JobTable:
    """Builds the job records of a snapshot's table, one row at a time."""

    def __init__(self, specs: list[Any] | None, intern: Interner) -> None:
        #: The shared spec rows (version 4), or None when each row holds its own.
        self.specs = specs
        #: The spec built for each shared row, once its first job came.
        self.built: list[JobSpec | None] = [None] * len(specs) if specs is not None else []
        self.intern = intern
        #: The previous row's shared times (created, updated, hwm, next): rows put by one
        #: command repeat them, and a comparison costs a fifth of a share() call (four a
        #: row were 0.9 s of a million-job restore).
        self.times: tuple[Any, Any, Any, Any] = (None, None, None, None)

    def record(self, row: list[Any]) -> JobRecord:
        if self.specs is None:
            spec_row, version, created, updated, hwm, nxt, active, last = row
            spec = spec_from_row(spec_row, self.intern)
            job_id = spec.id
        else:
            job_id, at, version, created, updated, hwm, nxt, active, last = row
            if type(at) is not int or not 0 <= at < len(self.built):
                raise ProtocolError(f"job {str(job_id)[:64]!r} names no spec row ({at!r})")
            made = self.built[at]
            if made is None:
                spec = self.built[at] = spec_from_row([job_id, *self.specs[at]], self.intern)
            else:
                spec = made  # the record makes its own copy when first read
        share = self.intern.share
        # An "at" job's next fire is its schedule's instant: one int for all such jobs.
        # The other times repeat from row to row (jobs put by one command share its
        # "at"), hence share(), or the previous row's object when equal. Exact ints
        # only, as share() (a bool or a float must not come back as an equal int).
        if nxt is not None and isinstance(spec.schedule, AtSchedule) \
                and nxt == spec.schedule.at_ms:
            nxt = spec.schedule.at_ms
        pc, pu, ph, pn = self.times
        created = pc if type(created) is int is type(pc) and created == pc else share(created)
        updated = pu if type(updated) is int is type(pu) and updated == pu else share(updated)
        hwm = ph if type(hwm) is int is type(ph) and hwm == ph else share(hwm)
        nxt = pn if type(nxt) is int is type(pn) and nxt == pn else share(nxt)
        self.times = (created, updated, hwm, nxt)
        return JobRecord.restored(spec, job_id, version, created, updated, hwm, nxt, active,
                                  tuple(map(share, last)) if last else None)
