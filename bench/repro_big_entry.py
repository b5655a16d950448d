"""Reproducer (not part of the suite): pysyncobj 0.3.17 mis-sends log entries ≥ 64 KiB.

``python -m bench.repro_big_entry [--batch-bytes N] [--size 400000]`` starts three
plain ``SyncObj`` processes (``appendEntriesUseBatch=False`` as raftsched uses), the
leader commits 10 ``bytes`` entries of ``--size`` random bytes while a background
thread commits small entries every 10 ms, and prints the commit latencies plus the
number of ERROR/CRITICAL log lines each node wrote.

Why: ``SyncObj.__sendAppendEntries`` sends an entry of at least
``appendEntriesBatchSizeBytes`` (default 64 KiB) in chunks and marks the chunk with
``pos + batchSizeBytes >= len(entries[0][0])`` as ``finish`` — the length of the raw
command, not of the pickled entry it is slicing. Protocol-2 pickling stores ``bytes``
as latin-1 text encoded in UTF-8, so every byte ≥ 0x80 takes two bytes and the pickled
entry is longer than the command: followers get ``finish`` too early, fail
``pickle.loads`` (EOFError, UnicodeDecodeError) inside ``_onTick`` and only decode the
entry on a later chunk. raftsched's log entries are msgpack ``bytes`` (map/str headers
are ≥ 0x80), and a ``put_jobs`` of 1000 specs is ~80 KB. With ``--batch-bytes 4194304``
the chunked path is never taken and the errors disappear.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def node(idx: int, ports: list[int], batch_bytes: int, size: int) -> None:
    from pysyncobj import SyncObj, SyncObjConf, replicated

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(levelname)s %(message)s")
    addrs = [f"127.0.0.1:{p}" for p in ports]
    me = addrs[idx]
    kw = dict(bindAddress=me, appendEntriesUseBatch=False, connectionRetryTime=0.5,
              appendEntriesPeriod=0.05, raftMinTimeout=0.3, raftMaxTimeout=0.9)
    if batch_bytes:
        kw["appendEntriesBatchSizeBytes"] = batch_bytes

    class Obj(SyncObj):
        def __init__(self) -> None:
            super().__init__(me, [a for a in addrs if a != me], conf=SyncObjConf(**kw))
            self.n = 0

        @replicated
        def put(self, blob: object) -> int:
            self.n += 1
            return self.n

    obj = Obj()
    t_end = time.time() + 25
    while time.time() < t_end and not (obj._getLeader() and obj.isReady()):
        time.sleep(0.05)
    time.sleep(0.5)

    def small() -> None:
        while time.time() < t_end:
            obj.put(b"x" * 100)
            time.sleep(0.01)

    threading.Thread(target=small, daemon=True).start()
    if obj._isLeader():
        lat = []
        for _ in range(10):
            t = time.time()
            try:
                obj.put(os.urandom(size), sync=True, timeout=10)
            except Exception as exc:  # noqa: BLE001 - report it
                sys.stderr.write(f"ERROR put failed: {exc!r}\n")
            lat.append(round(time.time() - t, 3))
        sys.stdout.write(json.dumps({"commit_s": lat, "term": obj.raftCurrentTerm}) + "\n")
        sys.stdout.flush()
    while time.time() < t_end:
        time.sleep(0.2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch-bytes", type=int, default=0,
                    help="appendEntriesBatchSizeBytes (0: pysyncobj's default 64 KiB)")
    ap.add_argument("--size", type=int, default=400_000)
    ap.add_argument("--node", type=int, default=-1, help=argparse.SUPPRESS)
    ap.add_argument("--ports", default="", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.node >= 0:
        node(a.node, [int(p) for p in a.ports.split(",")], a.batch_bytes, a.size)
        return
    ports = _free_ports(3)
    procs = []
    try:
        for i in range(3):
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "bench.repro_big_entry", "--node", str(i), "--ports",
                 ",".join(map(str, ports)), "--batch-bytes", str(a.batch_bytes),
                 "--size", str(a.size)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                text=True, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
        for i, p in enumerate(procs):
            out, err = p.communicate(timeout=60)
            bad = [ln for ln in err.splitlines() if ln.startswith(("ERROR", "CRITICAL"))]
            kinds = sorted({ln[:60] for ln in bad})
            sys.stdout.write(f"node {i}: {out.strip() or '(follower)'}; {len(bad)} "
                             "ERROR/CRITICAL lines"
                             + (f": {kinds[:3]}" if kinds else "") + "\n")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(5)


if __name__ == "__main__":
    main()
