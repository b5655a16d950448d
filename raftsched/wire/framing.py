"""API frames: a 4-byte big-endian length, then one msgpack map.

Here, not in the core's codec, so that a client (the CLI, an app's ``Client``) loads the
framing and the msgpack helpers alone, never the state machine.
"""

from __future__ import annotations

import struct
from typing import Any

from raftsched.core.errors import FrameTooLarge
from raftsched.core.packing import packb

#: Version of API frames (``"v"`` in each map).
WIRE_VERSION = 1
FRAME_HEADER = struct.Struct(">I")


def encode_frame(msg: dict[str, Any]) -> bytes:
    body = packb(msg)
    return FRAME_HEADER.pack(len(body)) + body


def frame_length(header: bytes, limit: int) -> int:
    """The body length announced by a 4-byte header; refuses it before any read."""
    (size,) = FRAME_HEADER.unpack(header)
    if size > limit:
        raise FrameTooLarge(size, limit)
    return size


__all__ = ["FRAME_HEADER", "WIRE_VERSION", "encode_frame", "frame_length"]
