"""The job spec fields of the third wave's dependencies and concurrency limits, parsed
beside :mod:`raftsched.core.model` (which stays under its size): ``after`` and ``on``
(a dependent job: it runs when its parents' runs for one fire time ended in the
matching outcome) and ``concurrency = { key, max, policy }`` (at most ``max`` runs of
all jobs sharing ``key`` execute at once across the cluster).

Each is written into the normalized spec only when set: a spec without them encodes to
exactly the bytes it had before they existed.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from raftsched.core.errors import InvalidSpec, unknown_hint

#: Parents one dependent job may wait for (fan-in).
MAX_PARENTS = 16
#: The largest ``concurrency.max``.
MAX_CONCURRENCY = 10_000
#: Concurrency keys are shown in metrics, views and reasons: short and plain.
KEY_RE = re.compile(r"[A-Za-z0-9_.:-]{1,64}\Z")
_ID_RE = re.compile(r"[A-Za-z0-9_.-]{1,128}\Z")  # model.JOB_ID_RE (no import cycle)


class DepOn(enum.StrEnum):
    """Which outcome of the parents' runs makes a dependent job run."""

    success = "success"
    """Every parent's run succeeded (default)."""
    failure = "failure"
    """Every parent's run failed, timed out or was lost."""
    always = "always"
    """Every parent's run ran to any end: succeeded, failed, timed out or lost."""


#: The terminal run states each ``on`` value accepts (a fire time that never ran, such
#: as missed, skipped, shed or cancelled, makes no dependent run).
ON_STATES: dict[DepOn, frozenset[str]] = {
    DepOn.success: frozenset({"succeeded"}),
    DepOn.failure: frozenset({"failed", "timed_out", "lost"}),
    DepOn.always: frozenset({"succeeded", "failed", "timed_out", "lost"}),
}


class ConcPolicy(enum.StrEnum):
    """What a run does when its concurrency key is at its ``max``."""

    queue = "queue"
    """Wait, recorded ``queued``, until a run of the key ends (default; its wait shows
    in its lateness)."""
    skip = "skip"
    """Recorded ``skipped`` with reason ``concurrency``; never runs."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ConcurrencySpec:
    """A cluster-wide limit shared by the jobs naming the same key."""

    key: str
    """The key the jobs share."""
    max: int
    """At most this many runs of the key hold a claim at once (when jobs sharing a key
    give different values, the smallest holds)."""
    policy: ConcPolicy = ConcPolicy.queue
    """What a run over the limit does."""

    def to_spec(self) -> dict[str, Any]:
        """The normalized msgpack-friendly map (every key written)."""
        return {"key": self.key, "max": self.max, "policy": self.policy.value}

    def to_row(self) -> list[Any]:
        """The snapshot row ``[key, max, policy]``."""
        return [self.key, self.max, self.policy.value]

    @classmethod
    def from_row(cls, row: list[Any]) -> ConcurrencySpec:
        key, mx, policy = row
        return cls(key=key, max=mx, policy=ConcPolicy(policy))


def after_from_spec(spec: Mapping[str, Any], job_id: str) -> tuple[tuple[str, ...], DepOn]:
    """``after`` and ``on`` of a spec: ``((), success)`` for a job with a schedule.
    Errors name ``after``, ``after[i]``, ``on`` or ``schedule``."""
    if "after" not in spec:
        if "on" in spec:
            raise InvalidSpec("on", "is only allowed with after (a dependent job)")
        return (), DepOn.success
    value = spec["after"]
    if not isinstance(value, (list, tuple)) or not 0 < len(value) <= MAX_PARENTS:
        raise InvalidSpec("after", f"must be a list of 1..{MAX_PARENTS} job ids")
    seen: set[str] = set()
    for i, parent in enumerate(value):
        if not isinstance(parent, str) or not _ID_RE.match(parent):
            raise InvalidSpec(f"after[{i}]", "must be a job id")
        if parent == job_id:
            raise InvalidSpec(f"after[{i}]", "a job cannot run after itself")
        if parent in seen:
            raise InvalidSpec(f"after[{i}]", f"{parent!r} appears twice")
        seen.add(parent)
    if "schedule" in spec:
        raise InvalidSpec("after", "a job with after has no schedule of its own: give "
                                   "either schedule or after, not both")
    for key in ("start", "end"):
        if key in spec:
            raise InvalidSpec(key, "bounds a schedule: a job with after has none")
    on = spec.get("on", DepOn.success.value)
    try:
        return tuple(value), DepOn(on)
    except (ValueError, TypeError):
        raise InvalidSpec("on", "must be one of success | failure | always") from None


def concurrency_from_spec(value: object) -> ConcurrencySpec | None:
    """``concurrency = { key, max, policy }``; errors name ``concurrency.<key>``."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise InvalidSpec("concurrency", "must be a table/map { key, max, policy }")
    known = ("key", "max", "policy")
    unknown = sorted(str(k) for k in value if k not in known)
    if unknown:
        raise InvalidSpec(f"concurrency.{unknown[0][:64]}",
                          unknown_hint("unknown field", unknown[0], known))
    key = value.get("key")
    if not isinstance(key, str) or not KEY_RE.match(key):
        raise InvalidSpec("concurrency.key", "is required: [A-Za-z0-9_.:-]{1,64}")
    mx = value.get("max")
    if isinstance(mx, bool) or not isinstance(mx, int) or not 1 <= mx <= MAX_CONCURRENCY:
        raise InvalidSpec("concurrency.max", f"is required: an integer in 1..{MAX_CONCURRENCY}")
    try:
        policy = ConcPolicy(value.get("policy", ConcPolicy.queue.value))
    except (ValueError, TypeError):
        raise InvalidSpec("concurrency.policy", "must be one of queue | skip") from None
    return ConcurrencySpec(key=key, max=mx, policy=policy)


def uses_new_fields(spec: Any) -> bool:
    """Whether a raw spec carries ``after``, ``on`` or ``concurrency`` (see
    :data:`raftsched.core.cmdbase.DEPS_VERSION`)."""
    return isinstance(spec, dict) and any(k in spec for k in NEW_FIELDS)


#: The spec fields this module adds.
NEW_FIELDS = ("after", "on", "concurrency")

__all__ = ["MAX_CONCURRENCY", "MAX_PARENTS", "NEW_FIELDS", "ON_STATES", "ConcPolicy",
           "ConcurrencySpec", "DepOn", "after_from_spec", "concurrency_from_spec",
           "uses_new_fields"]
