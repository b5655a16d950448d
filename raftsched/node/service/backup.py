"""``raftsched backup`` (a node's side) and ``raftsched restore``.

Backup: the node first waits for a read barrier committed through the leader (so its
state holds everything the cluster had committed when the request arrived), then
takes the state at the log position it has applied. The encoding runs in a forked
child: the parent holds the Raft lock only for the ``fork()`` (a million-job state
takes tens of seconds to encode, and the Raft thread must keep applying). The file
(``backupfile.py``) is served in chunks that fit the API's frame limit.

Restore: checks the whole file (size, checksum, state format), then writes each node's
starting snapshot into an empty data dir of a *new* cluster (``raft.write_seed_dump``).
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from raftsched.core.codec import encode_state
from raftsched.core.errors import ConfigError, InvalidArgument
from raftsched.node.observe import gcwatch
from raftsched.node.observe.clock import now_ms
from raftsched.node.replica.procs import die_with_parent
from raftsched.node.replica.raft import DUMP_FILE, JOURNAL_FILE, write_seed_dump
from raftsched.node.service.backupfile import decode_backup, encode_backup, seed_state

if TYPE_CHECKING:
    from raftsched.core.machine import ClusterState
    from raftsched.node.config.config import ClusterConfig
    from raftsched.node.replica.port import ReplicaPort
    from raftsched.node.replica.reads import ReadBarrier

#: Bytes per ``backup`` reply: well below the smallest frame limit a config allows.
CHUNK_BYTES = 256 * 1024
#: A backup not fetched to its end is dropped after this long.
KEEP_S = 300.0


def _encode_forked(raft: ReplicaPort) -> tuple[bytes, int, int]:
    """(state bytes, index, term) of the state as applied now, encoded in a child."""
    read_fd, write_fd = os.pipe()

    def fork(st: ClusterState) -> tuple[int, int, int]:
        # Under the state lock only for the fork: the child encodes the state frozen as
        # it was (one thread, its own copy of the memory); the parent returns at once.
        index, term = raft.position()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(read_fd)
                die_with_parent()
                with gcwatch.paused():
                    view = memoryview(encode_state(st))
                while view:
                    view = view[os.write(write_fd, view):]
                os._exit(0)
            except BaseException:  # noqa: BLE001 - nothing of the parent may run here
                os._exit(1)
        return pid, index, term

    pid, index, term = raft.read(fork)
    os.close(write_fd)
    chunks = []
    with os.fdopen(read_fd, "rb") as pipe:
        while chunk := pipe.read(1 << 20):
            chunks.append(chunk)
    _, status = os.waitpid(pid, 0)
    if status != 0:
        raise OSError(f"the backup writer failed (status {status})")
    return b"".join(chunks), index, term


class Backups:
    """The backups of one node being fetched, by id (the ``backup`` operation).

    :param raft: the replica whose applied state is backed up.
    :param reads: the read barrier (the backup holds everything committed before it).
    :param node_id: this node's id (named in the file's header).
    :param cluster_id: the cluster id of the secret in use, read at each backup (a
        secret rotation changes it).
    """

    def __init__(self, *, raft: ReplicaPort, reads: ReadBarrier, node_id: str,
                 cluster_id: Callable[[], str]) -> None:
        self.raft = raft
        self.reads = reads
        self.node_id = node_id
        self.cluster_id = cluster_id
        self._held: dict[str, tuple[float, bytes]] = {}

    async def handle(self, args: dict[str, Any]) -> dict[str, Any]:
        backup_id, offset = args.get("id"), args.get("offset", 0)
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise InvalidArgument("offset", "must be a byte offset")
        now = time.monotonic()
        self._held = {k: v for k, v in self._held.items() if now - v[0] < KEEP_S}
        if backup_id is None:
            await self.reads.wait()
            blob, index, term = await asyncio.to_thread(_encode_forked, self.raft)
            data = encode_backup(blob, cluster_id=self.cluster_id(), index=index, term=term,
                                 time_ms=now_ms(), node=self.node_id)
            backup_id = uuid.uuid4().hex
            self._held[backup_id] = (now, data)
        elif not isinstance(backup_id, str) or backup_id not in self._held:
            raise InvalidArgument("id", "no such backup on this node (expired after "
                                        f"{KEEP_S:.0f}s, or the node restarted): start again")
        data = self._held[backup_id][1]
        chunk = data[offset:offset + CHUNK_BYTES]
        if offset + len(chunk) >= len(data):
            self._held.pop(backup_id, None)
        return {"id": backup_id, "size": len(data), "offset": offset, "chunk": chunk}


def restore(path: str, cfg: ClusterConfig, node_ids: list[str] | None = None) -> dict[str, Any]:
    """Seed the data dirs of ``node_ids`` (default: every node of ``cfg``) from the backup
    at ``path``; CorruptBackup or ConfigError (nothing written) when it cannot."""
    with open(path, "rb") as f:
        data = f.read()
    header, state = decode_backup(data, path)
    ids = node_ids or [n.id for n in cfg.nodes]
    dirs = {nid: cfg.node_data_dir(nid) for nid in ids}
    for node_dir in dirs.values():
        for name in (JOURNAL_FILE, DUMP_FILE):
            if os.path.exists(os.path.join(node_dir, name)):
                raise ConfigError("--data-dir", f"{node_dir} already holds {name}: restore "
                                                f"seeds a new cluster; use empty data dirs")
    with gcwatch.paused():
        blob = encode_state(seed_state(state))
    members = [n.raft for n in cfg.nodes]
    written = []
    for node_dir in dirs.values():
        os.makedirs(node_dir, mode=0o700, exist_ok=True)
        written.append(write_seed_dump(node_dir, blob, max(int(header["index"]), 2), members))
    return {"header": header, "jobs": len(state.jobs), "written": written}
