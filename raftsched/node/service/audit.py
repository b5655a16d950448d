"""Audit events: every request that may change jobs or membership is recorded with the
credential that made it.

One ``audit`` event per such request, on the node that received it, whatever its
outcome: the op, what it targets (job ids, a node id — never a spec, an env value or
the secret), the credential's name (``admin:<fingerprint>``, ``read:<fingerprint>``,
``http-admin:<fingerprint>``; see :mod:`raftsched.wire.session`), the request id and
``ok`` or the error code. Reads are not audited.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from raftsched.core.errors import RaftschedError
from raftsched.node.observe import events
from raftsched.wire.api import CREDENTIAL
from raftsched.wire.session import READ_OPS

#: Ops that change nothing, besides the read-only credential's ones.
_QUIET = READ_OPS | {"next_fires", "preview_put", "ping", "hello", "auth"}
_MAX_TARGETS = 20


def targets(op: str, args: dict[str, Any]) -> str:
    """What a request acts on, as ids only (comma-separated, at most 20)."""
    ids: list[str] = []
    if isinstance(args.get("id"), str):
        ids.append(args["id"])
    spec = args.get("spec")
    if isinstance(spec, dict) and isinstance(spec.get("id"), str):
        ids.append(spec["id"])
    for s in args.get("specs") or [] if isinstance(args.get("specs"), list) else []:
        if isinstance(s, dict) and isinstance(s.get("id"), str):
            ids.append(s["id"])
    for key in ("node", "to"):
        if isinstance(args.get(key), str):
            ids.append(f"{key}={args[key]}")
    more = f",+{len(ids) - _MAX_TARGETS}" if len(ids) > _MAX_TARGETS else ""
    return ",".join(i[:128] for i in ids[:_MAX_TARGETS]) + more


async def audited(node_id: str, op: str, args: dict[str, Any],
                  call: Callable[[], Awaitable[Any]]) -> Any:
    """Run ``call`` and, unless ``op`` only reads, emit its audit event."""
    if op in _QUIET:
        return await call()
    cred = CREDENTIAL.get()
    outcome = "ok"
    try:
        return await call()
    except RaftschedError as exc:
        outcome = exc.code
        raise
    except Exception:
        outcome = "internal"
        raise
    finally:
        rid = args.get("rid")
        events.emit("audit", node=node_id, outcome=outcome, op=op[:64],
                    credential=cred.name if cred is not None else "in-process",
                    role=cred.role if cred is not None else "admin",
                    targets=targets(op, args), rid=rid[:64] if isinstance(rid, str) else None,
                    level=logging.INFO if outcome == "ok" else logging.WARNING)
