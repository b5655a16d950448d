"""The ``[notify]`` table of the cluster config: the cluster-default webhook and how the
leader retries deliveries.

```toml
[notify]
url = "https://hooks.example.com/raftsched"   # the cluster default (off when absent)
on = ["failed", "timed_out", "lost", "missed", "shed"]
attempts = 8          # per notification, then recorded failed
backoff = "1s"        # doubles each attempt ...
backoff_max = "5m"    # ... up to this
timeout = "5s"        # per attempt
```
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from raftsched.core.errors import ConfigError, InvalidSpec
from raftsched.core.notifydata import NotifySpec

KEYS = ("url", "on", "attempts", "backoff", "backoff_max", "timeout")


@dataclass(frozen=True, slots=True, kw_only=True)
class NotifyConfig:
    """``[notify]``.

    :var default: the cluster default (``url`` and ``on``), or None without a ``url``.
    :var attempts: delivery attempts per notification before it is recorded failed.
    :var backoff_ms: the wait after the first failed attempt; doubles each attempt.
    :var backoff_max_ms: the longest wait between attempts.
    :var timeout_ms: how long one attempt may take.
    """

    default: NotifySpec | None = None
    attempts: int = 8
    backoff_ms: int = 1000
    backoff_max_ms: int = 300_000
    timeout_ms: int = 5000

    def delay_ms(self, attempts: int) -> int:
        """The wait before the next attempt after ``attempts`` failed ones."""
        return min(self.backoff_ms << min(max(attempts - 1, 0), 30), self.backoff_max_ms)


def parse_notify(tbl: Any, section: Any, int_: Any, duration: Any) -> NotifyConfig:
    """``[notify]`` with the config module's helpers (``section``, ``int_``,
    ``duration``), so errors read like every other config error."""
    tbl = section(tbl, "notify", KEYS)
    default = None
    if "url" in tbl or "on" in tbl:
        if "url" not in tbl:
            raise ConfigError("notify.url", "required key is missing (the cluster default "
                                            "webhook; `on` alone says nothing where)")
        try:
            default = NotifySpec.from_spec({k: tbl[k] for k in ("url", "on") if k in tbl})
        except InvalidSpec as exc:
            raise ConfigError(exc.field, exc.message.partition(": ")[2]) from None
    return NotifyConfig(
        default=default,
        attempts=int_(tbl, "attempts", "notify.attempts", 8, 1, 100),
        backoff_ms=duration(tbl, "backoff", "notify.backoff", 1000, 0, 3600_000),
        backoff_max_ms=duration(tbl, "backoff_max", "notify.backoff_max", 300_000, 0,
                                24 * 3600_000),
        timeout_ms=duration(tbl, "timeout", "notify.timeout", 5000, 100, 60_000))


__all__ = ["NotifyConfig", "parse_notify"]
