"""W4's bounds in one process: what a million jobs cost to apply, to hold, to snapshot
and to load again, phase by phase.

    python -m bench.w4_parts --jobs 1000000

W4 (``bench/w4.py``) measures a real cluster: RSS per job, the snapshot's duration, the
restart of three nodes to answering. This probe takes the state machine alone (no
Raft, no sockets) through the same steps, each timed on its own, so that the results
can say which step bounds which figure:

1. apply ``put_jobs`` of W4's far-future specs in the node's batches: CPU per job and
   RSS per job (``/proc/self/status``, the cyclic collector paused as the node does);
2. ``encode_state`` (what the snapshot writer does) and gzip at the node's level;
3. in a fresh interpreter, as a restarting node: gunzip, ``decode_state`` (unpack and
   build the records, then the derived indexes), and that process's RSS per job.

A restarted node does more than step 3: it starts Python and imports raftsched,
replays the journal since its snapshot (up to 7,500 entries), and waits for a leader
and catch-up; W4 has those on 2 cores shared by three restarting nodes.
"""

from __future__ import annotations

import argparse
import gc
import gzip
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

import msgpack

from bench.common import bulk_batch
from bench.w4 import far_spec


def _rss_kb() -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def _load(path: str, n: int) -> dict[str, Any]:
    """Step 3, run in a fresh interpreter (``--load``)."""
    from raftsched.core.codec import decode_state
    from raftsched.node.replica.durable import SNAPSHOT_GZIP_LEVEL  # noqa: F401 - import cost as a node

    rss0 = _rss_kb()
    gc.disable()  # as Replica.restore does (gcwatch.paused)
    t0 = time.perf_counter()
    with open(path, "rb") as f:
        packed = f.read()
    t1 = time.perf_counter()
    blob = gzip.decompress(packed)
    t2 = time.perf_counter()
    st = decode_state(blob)
    t3 = time.perf_counter()
    del blob, packed
    rss1 = _rss_kb()
    st.rebuild_indexes()  # decode_state ran it once already: this times it alone
    t4 = time.perf_counter()
    assert len(st.jobs) == n
    # Unpacking alone (the rows as msgpack makes them, no records), after the RSS
    # reading: decode_state minus this and the indexes is building the records.
    with open(path, "rb") as f:
        blob = gzip.decompress(f.read())
    t5 = time.perf_counter()
    up = msgpack.Unpacker(io.BytesIO(blob), raw=False, strict_map_key=True, use_list=True)
    for _ in range(up.read_map_header()):
        if up.unpack() == "jobs":  # one row at a time, as decode_state streams them
            for _ in range(up.read_array_header()):
                up.unpack()
        else:
            up.unpack()
    t6 = time.perf_counter()
    return {"read_s": t1 - t0, "gunzip_s": t2 - t1, "decode_s": t3 - t2,
            "indexes_s": t4 - t3, "unpack_s": t6 - t5,
            "rss_per_job_b": (rss1 - rss0) * 1024 / n}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=1_000_000)
    ap.add_argument("--load", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.load:
        print(json.dumps(_load(args.load, args.jobs)))
        return
    from raftsched.core.codec import encode_state
    from raftsched.core.machine import ClusterState
    from raftsched.node.replica.durable import SNAPSHOT_GZIP_LEVEL

    n = args.jobs
    gc.disable()
    st = ClusterState()
    rss0 = _rss_kb()
    batch = bulk_batch()
    cpu0, t0 = time.process_time(), time.perf_counter()
    for i in range(0, n, batch):
        st.apply_map({"op": "put_jobs", "at": 1_800_000_000_000, "rid": f"w4p-{i}",
                  "specs": [far_spec(k) for k in range(i, min(i + batch, n))]})
        st.take_effects()
    apply_s, apply_cpu = time.perf_counter() - t0, time.process_time() - cpu0
    rss1 = _rss_kb()
    t0 = time.perf_counter()
    blob = encode_state(st)
    encode_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    packed = gzip.compress(blob, compresslevel=SNAPSHOT_GZIP_LEVEL)
    gzip_s = time.perf_counter() - t0
    with tempfile.TemporaryDirectory(prefix="w4parts-") as tmp:
        path = os.path.join(tmp, "state.gz")
        with open(path, "wb") as f:
            f.write(packed)
        t0 = time.perf_counter()
        out = subprocess.run([sys.executable, "-m", "bench.w4_parts", "--jobs", str(n),
                              "--load", path], capture_output=True, text=True)
        if out.returncode:
            raise SystemExit(f"the loading process failed:\n{out.stderr}")
        load_wall = time.perf_counter() - t0
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"{n:,} far-future jobs (W4's specs), the state machine alone, one process")
    print("| step | figure |")
    print("|---|---|")
    print(f"| apply put_jobs, batches of {batch} | {apply_s:.1f} s wall, "
          f"{apply_cpu / n * 1e6:.1f} us CPU per job |")
    print(f"| RSS per job after the applies | {(rss1 - rss0) * 1024 / n:.0f} B |")
    print(f"| encode_state (the snapshot writer's work) | {encode_s:.2f} s, "
          f"{len(blob) / 1e6:.1f} MB |")
    print(f"| gzip at level {SNAPSHOT_GZIP_LEVEL} | {gzip_s:.2f} s, {len(packed) / 1e6:.1f} MB |")
    print(f"| load: read the file | {loaded['read_s']:.2f} s |")
    print(f"| load: gunzip | {loaded['gunzip_s']:.2f} s |")
    print(f"| load: decode_state (records and indexes) | {loaded['decode_s']:.2f} s |")
    print(f"| ... of which the derived indexes (rebuild_indexes) | {loaded['indexes_s']:.2f} s |")
    print(f"| ... unpacking alone, row by row as decode_state does (no records) | "
          f"{loaded['unpack_s']:.2f} s |")
    print(f"| RSS per job of the loading process | {loaded['rss_per_job_b']:.0f} B |")
    print(f"| the loading process, start to exit | {load_wall:.2f} s |")


if __name__ == "__main__":
    main()
