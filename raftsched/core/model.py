"""Data shapes of raftsched and their validation at the boundary.

A job spec arrives as a plain dict (TOML, JSON or msgpack); :meth:`JobSpec.from_spec`
validates every field, names the field in every error, and returns a frozen record.
:meth:`JobSpec.to_spec` gives back the normalized dict, which is what the replicated
log and the snapshots carry (``JobSpec.from_spec(s.to_spec()) == s``).
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field
from typing import Any

from raftsched.core.durations import format_duration, parse_duration
from raftsched.core.errors import InvalidSpec, unknown_hint
from raftsched.core.httpspec import HttpSpec
from raftsched.core.notifydata import NotifySpec
from raftsched.core.specext import (
    ConcurrencySpec,
    DepOn,
    after_from_spec,
    concurrency_from_spec,
)
from raftsched.core.trigger import (
    AFTER,
    Schedule,
    bounds_from_spec,
    bounds_to_spec,
    schedule_from_spec,
)

#: Job ids are used in run ids (``<job_id>@<ms>``), file names and metrics labels.
JOB_ID_RE = re.compile(r"[A-Za-z0-9_.-]{1,128}\Z")
TAG_RE = re.compile(r"[A-Za-z0-9_.:-]{1,64}\Z")
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}\Z")
_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
CALL_RE = re.compile(rf"({_IDENT}(?:\.{_IDENT})*):({_IDENT})\Z")

#: Limits on the pieces of a spec; the whole encoded spec is limited by the config.
MAX_ARGV = 256
MAX_ARG_LEN = 4096
MAX_ENV = 128
MAX_ENV_VALUE = 4096
MAX_TAGS = 32
MAX_TIMEOUT_MS = 7 * 24 * 3600 * 1000
MAX_RETRIES = 100
MAX_CATCHUP = 1000
DEFAULT_TIMEOUT_MS = 3600 * 1000
DEFAULT_GRACE_MS = 60 * 1000
DEFAULT_CATCHUP = 10
DEFAULT_BACKOFF_MS = 10 * 1000
#: Exponential backoff never waits longer than this between attempts.
DEFAULT_BACKOFF_MAX_MS = 3600 * 1000
#: The RAFTSCHED_* names belong to the scheduler; a job may not set them.
RESERVED_ENV_PREFIX = "RAFTSCHED_"
#: What ``job get`` shows instead of an env value. A put carrying it back (``job get
#: --json | jq .spec``) is refused: a job never runs with the mask as its value.
ENV_MASK = "***"


class Overlap(enum.StrEnum):
    """What a fire does while the job's previous run is still active."""

    skip = "skip"
    """Record the new fire as ``skipped`` (default)."""
    allow = "allow"
    """Run both at once."""
    queue = "queue"
    """Buffer one fire; it runs when the previous run ends (further fires are skipped)."""
    # (a member named like str.replace: the spec's word for the policy)
    replace = "replace"  # type: ignore[assignment]
    """Cancel the running one (recorded ``cancelled``), then start the new one."""


class MisfirePolicy(enum.StrEnum):
    """What happens to fire times found older than the grace (after downtime)."""

    skip = "skip"
    """Record them all ``missed``; run none."""
    once = "once"
    """Run the latest one; record the others ``missed`` (reason ``coalesced``)."""
    all = "all"
    """Run up to ``max_catchup`` of them, oldest first; record the rest ``missed``."""


class OnNodeLost(enum.StrEnum):
    """What happens to a started run whose node is lost."""

    retry = "retry"
    """A new attempt with a new fence on a live node (at-least-once; default)."""
    fail = "fail"
    """Record the run ``lost`` (at-most-once)."""


class RunState(enum.StrEnum):
    """The states of a run; the last eight are terminal."""

    pending = "pending"
    """Waiting to be placed on a node (new, released or retrying)."""
    queued = "queued"
    """Buffered by ``overlap = queue`` until the previous run ends, or waiting for a place
    of its ``concurrency`` key (reason ``concurrency``)."""
    assigned = "assigned"
    """Placed on a node with a fence; not yet started."""
    started = "started"
    """The node committed its start with the current fence and is executing."""
    succeeded = "succeeded"
    """Exited 0 (or the callable returned)."""
    failed = "failed"
    """Exited non-zero or raised, with no retry left."""
    timed_out = "timed_out"
    """Ran past its timeout and was terminated."""
    lost = "lost"
    """Its node was lost while it ran and ``on_node_lost = fail``."""
    missed = "missed"
    """Never ran: fell due while it could not run (reason says why)."""
    skipped = "skipped"
    """Never ran: the overlap policy skipped it."""
    shed = "shed"
    """Never ran: no capacity within its grace (reason ``overload``)."""
    cancelled = "cancelled"
    """Stopped or dropped on purpose (job removed, replaced, cancelled)."""


class FireAction(enum.StrEnum):
    """What a new run does now, by its job's overlap policy and concurrency key."""

    run = "run"
    """Runs: nothing in its way."""
    queue = "queue"
    """Waits for an active run (``overlap = queue``) or its key's place to end."""
    skip = "skip"
    """Does not run: recorded skipped."""


ACTIVE_STATES = frozenset({RunState.pending, RunState.queued, RunState.assigned, RunState.started})


class MissReason(enum.StrEnum):
    """Why a fire time did not run (or ran late)."""

    no_leader = "no_leader"
    """There was no leader when it fell due (election, partition)."""
    cluster_down = "cluster_down"
    """The whole cluster was down when it fell due."""
    paused = "paused"
    """The job was paused when it fell due."""
    overload = "overload"
    """No worker slot within the grace."""
    coalesced = "coalesced"
    """Folded into a later run by ``misfire.policy = once``."""
    catchup_limit = "catchup_limit"
    """Beyond ``misfire.max_catchup`` under ``misfire.policy = all``."""
    overlap = "overlap"
    """The previous run was still active (``overlap = skip``/``queue``)."""
    no_node = "no_node"
    """No live node has the job's tags (a member that is down has them)."""
    unplaceable = "unplaceable"
    """No member has the job's tags; the reason names them:
    ``unplaceable: no member has tags [gpu]``."""
    concurrency = "concurrency"
    """Its ``concurrency`` key was at its ``max`` (``policy = skip``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MisfireSpec:
    """Misfire handling of one job.

    :var policy: what to do with fire times older than ``grace_ms``.
    :var grace_ms: how late a run may still start and count as on time.
    :var max_catchup: under ``all``, how many late fire times run at most.
    """

    policy: MisfirePolicy = MisfirePolicy.once
    grace_ms: int = DEFAULT_GRACE_MS
    max_catchup: int = DEFAULT_CATCHUP


@dataclass(frozen=True, slots=True, kw_only=True)
class RetrySpec:
    """Retries of failed runs.

    :var max: retries after the first attempt (0 = none).
    :var backoff_ms: wait before the first retry; doubles each attempt.
    :var backoff_max_ms: cap on the wait.
    """

    max: int = 0
    backoff_ms: int = DEFAULT_BACKOFF_MS
    backoff_max_ms: int = DEFAULT_BACKOFF_MAX_MS

    def delay_ms(self, attempt: int) -> int:
        """The wait before attempt ``attempt + 1`` given that ``attempt`` just failed."""
        return min(self.backoff_ms << min(max(attempt - 1, 0), 40), self.backoff_max_ms)


#: The shared empty env of jobs that set none (never mutated; saves memory at scale).
NO_ENV: dict[str, str] = {}
_DEFAULT_MISFIRE = MisfireSpec()
_DEFAULT_RETRY = RetrySpec()


@dataclass(frozen=True, slots=True, kw_only=True)
class JobSpec:
    """A validated job.

    :var id: the job id, ``[A-Za-z0-9_.-]{1,128}``.
    :var schedule: when it fires (cron, every or at), with the spec's ``start``/``end``
        as its bounds (``schedule.start_ms``/``end_ms``): every fire time comes from it.
    :var command: the argv to execute (no shell), or ``None`` when ``call`` is set.
    :var call: ``"package.module:function"`` to call in the worker, or ``None``.
    :var timeout_ms: a run longer than this is terminated and recorded ``timed_out``.
    :var overlap: what a fire does while the previous run is active.
    :var misfire: what happens to fire times found late.
    :var retries: how failed runs are retried.
    :var on_node_lost: what happens to a started run whose node is lost.
    :var tags: only nodes having all these tags run the job.
    :var jitter_ms: each run starts up to this much after its fire time (deterministic).
    :var paused: a paused job fires nothing.
    :var env: extra environment for the job process (values are never logged).
    :var notify: failure notifications of this job (None: the cluster default's).
    :var http: the request the node makes, when neither ``command`` nor ``call`` is set.
    :var after: a dependent job's parents (its schedule is then ``AFTER``: no fire
        times of its own); empty for a job with a schedule.
    :var on: which outcome of the parents' runs makes it run.
    :var concurrency: the cluster-wide limit it shares with the jobs of its key, or None.
    """

    id: str
    schedule: Schedule
    command: tuple[str, ...] | None = None
    call: str | None = None
    timeout_ms: int = DEFAULT_TIMEOUT_MS
    overlap: Overlap = Overlap.skip
    misfire: MisfireSpec = _DEFAULT_MISFIRE
    retries: RetrySpec = _DEFAULT_RETRY
    on_node_lost: OnNodeLost = OnNodeLost.retry
    tags: tuple[str, ...] = ()
    jitter_ms: int = 0
    paused: bool = False
    env: dict[str, str] = field(default_factory=lambda: NO_ENV, hash=False, compare=True)
    notify: NotifySpec | None = None
    http: HttpSpec | None = None
    after: tuple[str, ...] = ()
    on: DepOn = DepOn.success
    concurrency: ConcurrencySpec | None = None

    @classmethod
    def from_spec(
        cls, spec: object, *, allowed_call_prefixes: tuple[str, ...] | None = None
    ) -> JobSpec:
        """Validate a spec dict. ``allowed_call_prefixes`` ``None`` is the replay of an
        already accepted spec: it skips the checks made where a request enters (the
        call prefix, the env mask); an empty tuple forbids ``call``."""
        if not isinstance(spec, dict):
            raise InvalidSpec("spec", f"must be a table/map, not {type(spec).__name__}")
        unknown = sorted(str(k) for k in spec if k not in _FIELDS)
        if unknown:
            raise InvalidSpec(unknown[0][:64], unknown_hint("unknown field", unknown[0], _FIELDS))
        job_id = _req(spec, "id")
        if not isinstance(job_id, str) or not JOB_ID_RE.match(job_id):
            raise InvalidSpec("id", "must match [A-Za-z0-9_.-]{1,128}")
        after, on = after_from_spec(spec, job_id)
        schedule = AFTER if after else bounds_from_spec(
            spec, schedule_from_spec(_req(spec, "schedule"), "schedule"))
        command = _command(spec.get("command"))
        call = _call(spec.get("call"), allowed_call_prefixes)
        has_http = spec.get("http") is not None
        if (command is not None) + (call is not None) + has_http != 1:
            raise InvalidSpec("command", "give exactly one of command (argv), call or http")
        # Evaluated in this order: a spec with several problems names the same first one
        # it always did (http, read last, names env values it needs parsed).
        fields: dict[str, Any] = dict(
            timeout_ms=_duration(spec, "timeout", DEFAULT_TIMEOUT_MS, 1000, MAX_TIMEOUT_MS),
            overlap=_enum(spec, "overlap", Overlap, Overlap.skip),
            misfire=_misfire(spec.get("misfire")),
            retries=_retries(spec.get("retries")),
            on_node_lost=_enum(spec, "on_node_lost", OnNodeLost, OnNodeLost.retry),
            tags=_tags(spec.get("tags")),
            jitter_ms=_duration(spec, "jitter", 0, 0, 3600 * 1000),
            paused=_bool(spec, "paused", False),
            env=_env(spec.get("env"), entering=allowed_call_prefixes is not None),
            notify=None if spec.get("notify") is None else NotifySpec.from_spec(spec["notify"]),
            after=after,
            on=on,
            concurrency=concurrency_from_spec(spec.get("concurrency")),
        )
        if has_http:
            fields["http"] = HttpSpec.from_spec(spec["http"], fields["env"])
        return cls(id=job_id, schedule=schedule, command=command, call=call, **fields)

    def to_spec(self) -> dict[str, Any]:
        """The normalized, msgpack-friendly dict; defaults are written out in full."""
        out: dict[str, Any] = {"id": self.id}
        if self.after:
            out["after"] = list(self.after)
            out["on"] = self.on.value
        else:
            out["schedule"] = self.schedule.to_spec()
        # Only when set: a spec without bounds is written exactly as before they existed.
        out.update(bounds_to_spec(self.schedule))
        if self.command is not None:
            out["command"] = list(self.command)
        elif self.http is not None:
            # Only an HTTP job has the key: every other spec keeps its bytes.
            out["http"] = self.http.to_spec()
        else:
            out["call"] = self.call
        out["timeout"] = format_duration(self.timeout_ms)
        out["overlap"] = self.overlap.value
        out["misfire"] = {
            "policy": self.misfire.policy.value,
            "grace": format_duration(self.misfire.grace_ms),
            "max_catchup": self.misfire.max_catchup,
        }
        out["retries"] = {
            "max": self.retries.max,
            "backoff": format_duration(self.retries.backoff_ms),
            "backoff_max": format_duration(self.retries.backoff_max_ms),
        }
        out["on_node_lost"] = self.on_node_lost.value
        out["tags"] = list(self.tags)
        out["jitter"] = format_duration(self.jitter_ms)
        out["paused"] = self.paused
        out["env"] = dict(self.env)
        if self.concurrency is not None:  # only when set, like bounds
            out["concurrency"] = self.concurrency.to_spec()
        if self.notify is not None:
            out["notify"] = self.notify.to_spec()
        return out

    def redacted(self) -> dict[str, Any]:
        """The spec for display: env values masked, so they never reach logs or a CLI."""
        out = self.to_spec()
        out["env"] = {k: ENV_MASK for k in self.env}
        return out


#: The fields of specs before ``start``/``end`` existed (what a command of an older
#: version was validated against: see :func:`raftsched.core.jobs.late_one_shot`).
FIELDS_BEFORE_BOUNDS = frozenset(
    {"id", "schedule", "command", "call", "timeout", "overlap", "misfire", "retries",
     "on_node_lost", "tags", "jitter", "paused", "env", "notify", "http"}
)
#: ... and before ``after``/``on``/``concurrency`` (see :data:`cmdbase.DEPS_VERSION`).
FIELDS_BEFORE_DEPS = FIELDS_BEFORE_BOUNDS | {"start", "end"}
_FIELDS = FIELDS_BEFORE_DEPS | {"after", "on", "concurrency"}


def _req(spec: dict[str, Any], key: str) -> Any:
    if key not in spec:
        raise InvalidSpec(key, "is required")
    return spec[key]


def _bool(spec: dict[str, Any], key: str, default: bool) -> bool:
    value = spec.get(key, default)
    if not isinstance(value, bool):
        raise InvalidSpec(key, "must be true or false")
    return value


def _enum(spec: dict[str, Any], key: str, kind: type[enum.Enum], default: Any, *,
          prefix: str = "") -> Any:
    value = spec.get(key, default.value)
    try:
        return kind(value)
    except (ValueError, TypeError):
        choices = " | ".join(m.value for m in kind)
        raise InvalidSpec(prefix + key, f"must be one of {choices}") from None


def _duration(spec: dict[str, Any], key: str, default: int, lo: int, hi: int, *,
              prefix: str = "") -> int:
    if key not in spec:
        return default
    return parse_duration(spec[key], prefix + key, minimum_ms=lo, maximum_ms=hi)


def _int(spec: dict[str, Any], key: str, default: int, lo: int, hi: int, prefix: str) -> int:
    value = spec.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise InvalidSpec(prefix + key, f"must be an integer in {lo}..{hi}")
    return value


def _sub(value: object, name: str, keys: frozenset[str]) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidSpec(name, "must be a table/map")
    unknown = sorted(str(k) for k in value if k not in keys)
    if unknown:
        raise InvalidSpec(f"{name}.{unknown[0][:64]}",
                          unknown_hint("unknown field", unknown[0], keys))
    return value



def _misfire(value: object) -> MisfireSpec:
    if value is None:
        return _DEFAULT_MISFIRE
    d = _sub(value, "misfire", frozenset({"policy", "grace", "max_catchup"}))
    spec = MisfireSpec(
        policy=_enum(d, "policy", MisfirePolicy, MisfirePolicy.once, prefix="misfire."),
        grace_ms=_duration(d, "grace", DEFAULT_GRACE_MS, 0, 366 * 24 * 3600 * 1000,
                           prefix="misfire."),
        max_catchup=_int(d, "max_catchup", DEFAULT_CATCHUP, 1, MAX_CATCHUP, "misfire."),
    )
    return _DEFAULT_MISFIRE if spec == _DEFAULT_MISFIRE else spec


def _retries(value: object) -> RetrySpec:
    if value is None:
        return _DEFAULT_RETRY
    d = _sub(value, "retries", frozenset({"max", "backoff", "backoff_max"}))
    spec = RetrySpec(
        max=_int(d, "max", 0, 0, MAX_RETRIES, "retries."),
        backoff_ms=_duration(d, "backoff", DEFAULT_BACKOFF_MS, 0, 24 * 3600 * 1000,
                             prefix="retries."),
        backoff_max_ms=_duration(d, "backoff_max", DEFAULT_BACKOFF_MAX_MS, 0,
                                 7 * 24 * 3600 * 1000, prefix="retries."),
    )
    return _DEFAULT_RETRY if spec == _DEFAULT_RETRY else spec


def _command(value: object) -> tuple[str, ...] | None:
    if value is None:
        return None
    if not isinstance(value, (list, tuple)) or not value:
        raise InvalidSpec("command", "must be a non-empty list of strings (argv)")
    if len(value) > MAX_ARGV:
        raise InvalidSpec("command", f"at most {MAX_ARGV} arguments")
    for i, arg in enumerate(value):
        if not isinstance(arg, str):
            raise InvalidSpec(f"command[{i}]", "must be a string")
        if len(arg) > MAX_ARG_LEN or "\x00" in arg or not _utf8(arg):
            raise InvalidSpec(f"command[{i}]", f"at most {MAX_ARG_LEN} chars, no NUL, "
                                               "valid UTF-8")
    if not value[0]:
        raise InvalidSpec("command[0]", "must not be empty")
    return tuple(value)


def _call(value: object, allowed: tuple[str, ...] | None) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > 256 or not CALL_RE.match(value):
        raise InvalidSpec("call", 'must look like "package.module:function"')
    if allowed is not None:
        module = value.split(":", 1)[0]
        if not any(module == p or module.startswith(p + ".") for p in allowed):
            raise InvalidSpec(
                "call", f"module {module!r} is not under an allowed prefix "
                "(cluster.allowed_call_prefixes)")
    return value


def _tags(value: object) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, (list, tuple)) or len(value) > MAX_TAGS:
        raise InvalidSpec("tags", f"must be a list of at most {MAX_TAGS} strings")
    for i, tag in enumerate(value):
        if not isinstance(tag, str) or not TAG_RE.match(tag):
            raise InvalidSpec(f"tags[{i}]", "must match [A-Za-z0-9_.:-]{1,64}")
    return tuple(sorted(set(value)))


def _env(value: object, *, entering: bool = True) -> dict[str, str]:
    if value is None or value == {}:
        return NO_ENV
    if not isinstance(value, dict) or len(value) > MAX_ENV:
        raise InvalidSpec("env", f"must be a map of at most {MAX_ENV} entries")
    out: dict[str, str] = {}
    for name in sorted(value, key=str):
        if not isinstance(name, str) or not ENV_NAME_RE.match(name):
            raise InvalidSpec("env", "names must match [A-Za-z_][A-Za-z0-9_]*")
        if name.startswith(RESERVED_ENV_PREFIX):
            raise InvalidSpec(f"env.{name}", "RAFTSCHED_* names are reserved")
        val = value[name]
        if val == {"keep": True}:
            raise InvalidSpec(f"env.{name}", "{keep = true} (what `job export` writes) is "
                                             "understood by `raftsched apply` only; write "
                                             "the value")
        # The value itself never goes into an error: it may be a secret.
        if not isinstance(val, str) or len(val) > MAX_ENV_VALUE or "\x00" in val \
                or not _utf8(val):
            raise InvalidSpec(f"env.{name}", f"must be a string of at most {MAX_ENV_VALUE} chars")
        if entering and val == ENV_MASK:
            raise InvalidSpec(f"env.{name}", f"{ENV_MASK!r} is the mask `job get` shows "
                                             "instead of the value; put the real value")
        out[name] = val
    return out


def _utf8(text: str) -> bool:
    """False for text msgpack cannot carry (lone surrogates, e.g. from a JSON escape)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def run_id_of(job_id: str, scheduled_ms: int) -> str:
    """The contract run id: ``<job_id>@<scheduled_at_ms>``."""
    return f"{job_id}@{scheduled_ms}"


def job_of_run(run_id: str) -> str:
    """The job id inside a run id."""
    return run_id.rpartition("@")[0]
