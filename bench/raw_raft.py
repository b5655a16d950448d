"""Baseline (a): the raw pysyncobj commit rate of a 3-process loopback cluster.

Self-contained (imports only pysyncobj): ``python -m bench.raw_raft [--seconds 10]
[--inflight 1000] [--payload 100]`` starts three ``node`` sub-processes of this file,
each a ``SyncObj`` with ``appendEntriesUseBatch=False`` and one ``@replicated noop``.
The node that becomes leader fires async no-op commands (a ~100-byte payload) with a
bounded window of commands in flight for the given seconds, counts the successful
callbacks and prints one JSON line; the orchestrator relays it and kills all three.
The journal is in memory (pysyncobj's default), like the research measurements.

Every node kills itself at its deadline or when its parent dies; the orchestrator
kills its three processes in ``finally``.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time


def _free_ports(n: int) -> list[int]:
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


def node_main(a: argparse.Namespace) -> None:
    from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, replicated

    deadline = time.monotonic() + a.budget
    ppid = os.getppid()

    def watchdog() -> None:
        while True:
            if time.monotonic() > deadline or os.getppid() != ppid:
                os._exit(3)
            time.sleep(0.2)

    threading.Thread(target=watchdog, daemon=True).start()
    ports = [int(p) for p in a.ports.split(",")]
    addrs = [f"127.0.0.1:{p}" for p in ports]
    me = addrs[a.idx]
    conf = SyncObjConf(bindAddress=me, appendEntriesUseBatch=False, connectionRetryTime=0.5)

    class Obj(SyncObj):
        def __init__(self) -> None:
            super().__init__(me, [x for x in addrs if x != me], conf=conf)
            self.applied = 0

        @replicated
        def noop(self, payload: str) -> int:
            self.applied += 1
            return self.applied

    obj = Obj()
    payload = "x" * a.payload
    while time.monotonic() < deadline:
        leader = obj._getLeader()
        if leader is not None and obj.isReady() and obj.hasQuorum:
            break
        time.sleep(0.05)
    time.sleep(0.5)  # let the other nodes settle on the same leader
    if not obj._isLeader():
        while True:  # a follower: just replicate until killed
            time.sleep(1)
    window = threading.Semaphore(a.inflight)
    lock = threading.Lock()
    counts = {"ok": 0, "err": 0}
    lats: list[float] = []

    def make_cb(t0: float):  # noqa: ANN202
        def cb(_res: object, err: int) -> None:
            t1 = time.monotonic()
            with lock:
                if err == FAIL_REASON.SUCCESS:
                    counts["ok"] += 1
                    if len(lats) < 200_000:
                        lats.append(t1 - t0)
                else:
                    counts["err"] += 1
            window.release()
        return cb

    t_start = time.monotonic()
    end = t_start + a.seconds
    sent = 0
    while time.monotonic() < end:
        if not window.acquire(timeout=max(0.0, end - time.monotonic())):
            break
        obj.noop(payload, callback=make_cb(time.monotonic()))
        sent += 1
    with lock:
        ok_at_end = counts["ok"]
    elapsed = time.monotonic() - t_start
    lats.sort()

    def pct(p: float) -> float | None:
        return lats[min(len(lats) - 1, int(p / 100 * len(lats)))] * 1000 if lats else None

    sys.stdout.write(json.dumps({
        "commits_per_s": ok_at_end / elapsed, "ok": ok_at_end, "sent": sent,
        "errors": counts["err"], "seconds": elapsed, "inflight": a.inflight,
        "payload_bytes": a.payload, "latency_p50_ms": pct(50),
        "latency_p99_ms": pct(99)}) + "\n")
    sys.stdout.flush()
    while True:
        time.sleep(1)


def run(seconds: float = 10.0, inflight: int = 1000, payload: int = 100,
        startup_budget: float = 30.0) -> dict[str, object]:
    """Start 3 node processes, return the leader's JSON report (or an error dict)."""
    ports = _free_ports(3)
    budget = startup_budget + seconds + 10
    procs: list[subprocess.Popen[str]] = []
    try:
        for i in range(3):
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "bench.raw_raft", "node", "--idx", str(i),
                 "--ports", ",".join(map(str, ports)), "--seconds", str(seconds),
                 "--inflight", str(inflight), "--payload", str(payload),
                 "--budget", str(budget)],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                text=True, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                start_new_session=True))
        deadline = time.monotonic() + budget
        outs = {p.stdout.fileno(): p for p in procs if p.stdout is not None}
        while time.monotonic() < deadline:
            ready, _, _ = select.select(list(outs), [], [], 1.0)
            for fd in ready:
                line = outs[fd].stdout.readline()  # type: ignore[union-attr]
                if line.strip():
                    return json.loads(line)
            if all(p.poll() is not None for p in procs):
                break
        return {"error": "no leader report within the budget"}
    finally:
        for p in procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            p.wait(10)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", nargs="?", default="run", choices=["run", "node"])
    ap.add_argument("--idx", type=int, default=0)
    ap.add_argument("--ports", default="")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--inflight", type=int, default=1000)
    ap.add_argument("--payload", type=int, default=100)
    ap.add_argument("--budget", type=float, default=60.0)
    a = ap.parse_args()
    if a.mode == "node":
        node_main(a)
    else:
        sys.stdout.write(json.dumps(run(a.seconds, a.inflight, a.payload)) + "\n")


if __name__ == "__main__":
    main()
