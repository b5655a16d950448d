"""Job specs prepared for a put outside the state lock.

Validating a spec, sharing its sub-values with other jobs and finding its first fire
time are pure, and cost ~100 µs a spec: 1,000 of them under the state lock hold it for
~100 ms, and the lock is the one pysyncobj's thread needs to send heartbeats. A put
command's ``from_wire`` (which the replica runs before it takes the lock, on every
replica alike) prepares its specs here; the apply then only checks them against the
state and stores them. A command built in memory (no ``from_wire``) is prepared in the
apply, with the same result.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import Any

from raftsched.core.errors import InvalidSpec
from raftsched.core.model import JOB_ID_RE, JobSpec
from raftsched.core.packing import packb_exact
from raftsched.core.specclone import with_id
from raftsched.core.trigger import Schedule, next_fire

#: The env value that keeps the cluster's current value (TOML ``{ keep = true }``).
KEEP = {"keep": True}

#: The JobSpec fields that ``intern_spec`` shares between jobs (all hashable, immutable).
_SHARED_SPEC_FIELDS = ("schedule", "command", "call", "timeout_ms", "misfire", "retries",
                       "tags")
_SPEC_DEFAULTS = {f.name: f.default for f in fields(JobSpec) if f.name in _SHARED_SPEC_FIELDS}
#: Values shared between jobs, keyed by (field, value); cleared when it grows past this.
#: It lives as long as the process (``from_wire`` has no state to keep it in), so it may
#: hold a removed job's values (its env too) until it is cleared; the state held them.
_CACHE_MAX = 100_000
_cache: dict[Any, Any] = {}
#: Valid specs by their template (the spec without its id), across commands: a client
#: that puts one job at a time, or a replayed journal of such puts (a restart), read
#: each spec in full otherwise (~30 µs; a restarted 1M node replayed 5,652 single puts
#: at ~95 µs each, ~40 with this). Reading a spec is pure and depends on its id only
#: through the id's own check and ``after``, so an entry is what reading it again would
#: make. Cleared when it grows past this, as ``_cache`` is (and like it, it may hold a
#: removed job's spec, its env too, until then).
_TEMPLATES_MAX = 4096
_templates: dict[Any, JobSpec] = {}


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckedSpec:
    """A valid spec, ready to store."""

    spec: JobSpec
    """The spec, its sub-values shared with equal ones of other jobs."""
    after_ms: int | None
    """The mark ``next_ms`` was found after (the command's ``at``); None: not found."""
    next_ms: int | None
    """``next_fire(spec.schedule, after_ms)``: the first fire time of a job whose mark
    is ``after_ms`` (a new job, or a new schedule)."""
    like: JobSpec | None = None
    """The earlier valid spec ``spec`` was copied from (another id, every other field
    the same objects), or None: a new job's record holds it instead of the copy and
    makes its own when first read (:class:`~raftsched.core.records.LazyJobRecord`)."""

    def next_after(self, mark: int) -> int | None:
        """The job's next fire time after ``mark``."""
        if mark == self.after_ms:
            return self.next_ms
        return next_fire(self.spec.schedule, mark)


#: A spec as ``from_wire`` left it: prepared, refused, or None (prepare it in the apply).
Checked = CheckedSpec | InvalidSpec | None


def check_specs(specs: tuple[Any, ...] | list[Any], at: Any,
                skip: Callable[[Any], bool] | None = None) -> tuple[Checked, ...]:
    """Each spec prepared as the apply would, or the refusal it would get; None for a
    spec that ``skip`` names (one whose reading depends on the state).

    A bulk put is mostly copies of a few templates that differ in ``id`` alone: a spec
    equal to an earlier valid one (of this batch or of an earlier command, ``_templates``)
    but for its id is that one with the new id (reading a spec depends on its id only
    through the id's own check and ``after`` not naming it), and a schedule's first
    fire time is found once per schedule."""
    after = at if isinstance(at, int) and not isinstance(at, bool) and at >= 0 else None
    templates = _templates
    if len(templates) > _TEMPLATES_MAX:
        templates.clear()
    firsts: dict[Schedule, int | None] = {}
    out: list[Checked] = []
    for raw in specs:
        if skip is not None and skip(raw):
            out.append(None)
            continue
        try:
            key = _template_key(raw)
            known = templates.get(key) if key is not None else None
            job_id = raw.get("id") if known is not None else None
            if (known is not None and isinstance(job_id, str) and JOB_ID_RE.match(job_id)
                    and job_id not in known.after):  # a job never runs after itself
                like = None if known.id == job_id else known
                spec = known if like is None else with_id(known, job_id)
            else:
                like = None
                spec = intern_spec(JobSpec.from_spec(raw, allowed_call_prefixes=None))
                if key is not None:
                    templates[key] = spec
            first = None
            if after is not None:
                if spec.schedule in firsts:
                    first = firsts[spec.schedule]
                else:
                    first = firsts[spec.schedule] = next_fire(spec.schedule, after)
            out.append(CheckedSpec(spec=spec, after_ms=after, next_ms=first, like=like))
        except InvalidSpec as exc:
            out.append(exc)
        except Exception:  # noqa: BLE001 - the apply prepares it again and answers for it
            out.append(None)
    return tuple(out)


def _template_key(raw: Any) -> bytes | None:
    """``raw`` without its id, as bytes that tell types apart (``1``, ``1.0`` and
    ``True`` are equal in Python, not in a spec): msgpack with exact types, so equal
    bytes are equal values of equal types, and a tuple or a subclass has no key. None:
    not a plain spec. (A spec written out in full has a dozen fields: ~1.5 µs here,
    5 µs as the nested tuples this was before.)"""
    if type(raw) is not dict or "id" not in raw:
        return None
    try:
        return packb_exact({k: v for k, v in raw.items() if k != "id"})
    except (TypeError, ValueError, OverflowError):
        return None


def prepare(raw: Any, after: int | None) -> CheckedSpec:
    """Validate ``raw`` (a replayed spec: the entry checks were made where it came in)."""
    spec = intern_spec(JobSpec.from_spec(raw, allowed_call_prefixes=None))
    return CheckedSpec(spec=spec, after_ms=after,
                       next_ms=None if after is None else next_fire(spec.schedule, after))


def is_keep(value: Any) -> bool:
    return isinstance(value, dict) and value == KEEP


def keeps_env(raw: Any) -> bool:
    """Whether ``raw`` has a ``{keep = true}`` env value (``raftsched apply``)."""
    env = raw.get("env") if isinstance(raw, dict) else None
    return isinstance(env, dict) and any(is_keep(v) for v in env.values())


def checked_spec(raw: Any, checked: tuple[Checked, ...], i: int) -> CheckedSpec:
    """Spec ``i`` of a command, as ``from_wire`` prepared it or prepared now; raises
    :class:`InvalidSpec` for an invalid one."""
    found = checked[i] if checked else None
    if isinstance(found, CheckedSpec):
        return found
    if isinstance(found, InvalidSpec):
        # The very error from_spec raised: rebuilt from its text, a field name holding
        # ": " (an unknown key is quoted in it) would read differently.
        raise found.with_traceback(None)
    return prepare(raw, None)


def intern_spec(spec: JobSpec) -> JobSpec:
    """Share equal sub-values between jobs: a decoded command holds a fresh copy of
    each (the call string alone is 64 bytes), so a million jobs made from one
    template would hold a million copies. Everything shared here is immutable (or,
    for ``env``, never mutated). Keys are tagged so that values of different
    fields never meet in the cache (a command ``("call", "x")`` is not a call)."""
    cache = _cache
    if len(cache) > _CACHE_MAX:
        cache.clear()
    changed: dict[str, Any] = {}
    for name in _SHARED_SPEC_FIELDS:
        value = getattr(spec, name)
        if value is None or value is _SPEC_DEFAULTS[name]:
            continue  # already shared (the default objects, (), None)
        found = cache.setdefault((name, value), value)
        if found is not value:
            changed[name] = found
    if spec.env:
        env = cache.setdefault(("env", tuple(spec.env.items())), spec.env)
        if env is not spec.env:
            changed["env"] = env
    return replace(spec, **changed) if changed else spec
