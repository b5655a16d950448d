"""msgpack in one place: the byte form of commands, frames and snapshots.

Split from :mod:`raftsched.core.codec` so the command vocabulary
(:mod:`raftsched.core.commands`) can encode itself without importing the state machine.
"""

from __future__ import annotations

from typing import Any

import msgpack

from raftsched.core.errors import ProtocolError


def packb(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def packb_exact(obj: Any) -> bytes:
    """``obj`` as msgpack with exact types, for comparing values by their bytes: equal
    bytes are equal values of equal types (``1``, ``1.0`` and ``True`` differ). A
    tuple or a subclass of a packed type raises :class:`TypeError`, an int past 64 bits
    :class:`OverflowError`."""
    return msgpack.packb(obj, use_bin_type=True, strict_types=True)


def unpackb(data: bytes, *, max_len: int | None = None) -> Any:
    """Decode msgpack; every failure (truncated, nested too deep, bad types) becomes a
    :class:`ProtocolError`."""
    if max_len is not None and len(data) > max_len:
        raise ProtocolError(f"message of {len(data)} bytes is over {max_len}")
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=True, use_list=True)
    except Exception as exc:  # noqa: BLE001 - any decoder failure is the sender's fault
        raise ProtocolError(f"undecodable msgpack: {type(exc).__name__}") from None
