"""The backup file (``raftsched backup`` / ``restore``): a header, then a state snapshot.

Layout::

    RAFTSCHED-BACKUP\\n
    {"format": 1, "cluster_id": ..., "index": ..., "term": ..., "time_ms": ...,
     "node": ..., "state_format": 1, "size": ..., "sha256": ...}\\n
    <size bytes: the state as ``codec.encode_state`` writes it>

The header is one line of JSON (readable with ``head -2``); ``index`` and ``term`` are
the Raft log position the state was taken at (everything committed up to it, nothing
after), ``size`` and ``sha256`` cover the state bytes, so a truncated or damaged file is
refused before anything is restored. No I/O here: bytes in, bytes out.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from raftsched.core.codec import SNAPSHOT_VERSION, decode_state, format_problem, state_version
from raftsched.core.errors import CorruptBackup, ProtocolError
from raftsched.core.machine import ClusterState
from raftsched.core.records import Leadership
from raftsched.node.observe import gcwatch

MAGIC = b"RAFTSCHED-BACKUP\n"
#: Version of the backup envelope written by this code, and those it reads.
BACKUP_FORMAT = 1
BACKUP_FORMATS = frozenset({1})
#: A header longer than this is not one of ours.
MAX_HEADER_BYTES = 4096
_HEADER_KEYS = ("format", "cluster_id", "index", "term", "time_ms", "node", "state_format",
                "size", "sha256")


def encode_backup(state_blob: bytes, *, cluster_id: str, index: int, term: int, time_ms: int,
                  node: str) -> bytes:
    """The whole backup file for ``state_blob`` (``encode_state`` bytes)."""
    header = {"format": BACKUP_FORMAT, "cluster_id": cluster_id, "index": index, "term": term,
              "time_ms": time_ms, "node": node,
              # The blob's own (a state without bounded jobs is still written as v1).
              "state_format": state_version(state_blob) or SNAPSHOT_VERSION,
              "size": len(state_blob), "sha256": hashlib.sha256(state_blob).hexdigest()}
    return MAGIC + json.dumps(header, sort_keys=True).encode() + b"\n" + state_blob


def read_header(data: bytes, path: str) -> tuple[dict[str, Any], bytes]:
    """The header and the state bytes, checked (size, checksum); CorruptBackup if not."""
    if not data.startswith(MAGIC):
        raise CorruptBackup(path, "not a raftsched backup (it does not start with "
                                  "RAFTSCHED-BACKUP)" if data else "the file is empty")
    end = data.find(b"\n", len(MAGIC), len(MAGIC) + MAX_HEADER_BYTES)
    if end < 0:
        raise CorruptBackup(path, "truncated or damaged: the header line does not end")
    try:
        header = json.loads(data[len(MAGIC):end])
    except ValueError:
        raise CorruptBackup(path, "damaged: the header is not JSON") from None
    if not isinstance(header, dict) or any(k not in header for k in _HEADER_KEYS):
        raise CorruptBackup(path, f"damaged: the header lacks some of {', '.join(_HEADER_KEYS)}")
    if header["format"] not in BACKUP_FORMATS:
        raise CorruptBackup(path, format_problem("backup", header["format"], BACKUP_FORMATS))
    body = data[end + 1:]
    if not isinstance(header["size"], int) or len(body) != header["size"]:
        raise CorruptBackup(path, f"truncated or damaged: the header announces "
                                  f"{header['size']} bytes of state, the file holds {len(body)}")
    if hashlib.sha256(body).hexdigest() != header["sha256"]:
        raise CorruptBackup(path, "damaged: the state's checksum does not match the header's")
    return header, body


def decode_backup(data: bytes, path: str) -> tuple[dict[str, Any], ClusterState]:
    """The header and the state of a backup file; CorruptBackup naming the problem."""
    header, body = read_header(data, path)
    try:
        with gcwatch.paused():
            return header, decode_state(body)
    except ProtocolError as exc:
        raise CorruptBackup(path, f"the state cannot be read: {exc}") from None


def seed_state(state: ClusterState) -> ClusterState:
    """The restored state a new cluster starts from: the old cluster's membership and
    leadership do not carry over (the new cluster's first leader seeds its members from
    its own config file and starts its terms from 1). Jobs, runs, history, fence and
    request ids do."""
    state.members = {}
    state.leader = Leadership(prev_ms=state.leader.last_ms)
    return state
