"""Credentials derived from the cluster secret, for clients that cannot run the
msgpack API's nonce handshake (HTTP: browsers, curl, scripts).

Every credential is HMAC-SHA256(secret, label) with a label naming its use and
version, so one secret yields independent tokens, none of which reveals the secret or
another token. This is the one place that derives them: a rotation (or a new kind of
credential) extends :data:`LABELS` and :func:`token`, and every server and CLI follows.
"""

from __future__ import annotations

import enum
import hashlib
import hmac


class Role(enum.StrEnum):
    """What a bearer token may do over HTTP."""

    #: Everything: reads and writes (put, delete, pause, resume, trigger).
    admin = "admin"
    #: GET requests only.
    read = "read"


#: The HMAC label of each role's token (versioned: a new derivation gets a new label).
LABELS: dict[Role, bytes] = {Role.admin: b"raftsched-http-v1:admin",
                             Role.read: b"raftsched-http-v1:read"}


def token(secret: str, role: Role) -> str:
    """The bearer token of ``role`` for the cluster whose secret is ``secret`` (64 hex)."""
    return hmac.new(secret.encode("utf-8"), LABELS[Role(role)], hashlib.sha256).hexdigest()


def role_of(secret: str, presented: str) -> Role | None:
    """The role ``presented`` grants, or None. Constant-time per comparison; every role
    is compared, so the time does not say which one nearly matched."""
    got = presented.encode("utf-8", "replace")
    found = None
    for role in Role:
        if hmac.compare_digest(got, token(secret, role).encode("ascii")):
            found = role
    return found


__all__ = ["LABELS", "Role", "role_of", "token"]
