"""Signing of failure-notification webhooks (**contract**, docs/notifications.md).

The webhook key is derived from the cluster secret, one way, so a receiver can verify
notifications without holding the secret itself::

    key = hex(HMAC-SHA256(key=<cluster secret, UTF-8>, msg="raftsched notify v1"))

(``raftsched notify-key`` prints it.) Each POST carries ``X-Raftsched-Timestamp`` (Unix
seconds) and ``X-Raftsched-Signature: v1=<hex>`` where ``<hex>`` is
``HMAC-SHA256(key=<key as ASCII>, msg=<timestamp> + "." + <body bytes>)``, and
``X-Raftsched-Delivery``, the idempotency key: the same for every attempt of one
notification (a receiver dedupes on it; delivery is at least once).
"""

from __future__ import annotations

import hashlib
import hmac
import time

KEY_LABEL = b"raftsched notify v1"
SIGNATURE_HEADER = "X-Raftsched-Signature"
TIMESTAMP_HEADER = "X-Raftsched-Timestamp"
DELIVERY_HEADER = "X-Raftsched-Delivery"
ATTEMPT_HEADER = "X-Raftsched-Attempt"
#: A receiver should refuse signatures older (or newer) than this (replays).
DEFAULT_TOLERANCE_S = 300


def notify_key(secret: str) -> str:
    """The webhook key of a cluster (64 hex characters)."""
    return hmac.new(secret.encode("utf-8"), KEY_LABEL, hashlib.sha256).hexdigest()


def sign(key: str, timestamp: int, body: bytes) -> str:
    """The ``X-Raftsched-Signature`` value for ``body`` sent at ``timestamp``."""
    mac = hmac.new(key.encode("ascii"), str(timestamp).encode("ascii") + b"." + body,
                   hashlib.sha256)
    return "v1=" + mac.hexdigest()


def verify(key: str, timestamp: str, signature: str, body: bytes, *,
           now: float | None = None, tolerance_s: float = DEFAULT_TOLERANCE_S) -> bool:
    """True if ``signature`` signs ``body`` at ``timestamp`` with ``key`` and the
    timestamp is within ``tolerance_s`` of ``now`` (default: this host's clock)."""
    try:
        ts = int(timestamp)
    except (TypeError, ValueError):
        return False
    if abs((time.time() if now is None else now) - ts) > tolerance_s:
        return False
    return hmac.compare_digest(sign(key, ts, body), str(signature))


__all__ = ["ATTEMPT_HEADER", "DELIVERY_HEADER", "SIGNATURE_HEADER", "TIMESTAMP_HEADER",
           "notify_key", "sign", "verify"]
