"""What a bare pysyncobj cluster costs at idle, with and without its password.

    python -m bench.pysyncobj_idle [--window 45] [--period 0.05]

Three ``SyncObj`` processes on loopback and nothing else (no journal, no entries, no
raftsched), pysyncobj's defaults but the append period and election timeouts raftsched
uses; each process's CPU (utime + stime from ``/proc``) over the window, in % of one
core, once with a password (Fernet on every message) and once without. The floor under
raftsched's own idle cost (``bench/idle.py``): ``bench/results/2026-12-05-idle-pacing.md``
is what it found. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from raftsched.faces.launcher import free_ports

_TCK = os.sysconf("SC_CLK_TCK")
_CHILD = """
import sys, time
from pysyncobj import SyncObj, SyncObjConf
me, peers, period, pw, life = sys.argv[1], sys.argv[2].split(","), float(sys.argv[3]), \\
    sys.argv[4], float(sys.argv[5])
conf = SyncObjConf(appendEntriesPeriod=period, autoTickPeriod=period,
                   raftMinTimeout=4 * period, raftMaxTimeout=12 * period,
                   password=pw or None, appendEntriesUseBatch=False)
node = SyncObj(me, peers, conf=conf)
time.sleep(life)
"""


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TCK


def measure(password: str, period: float, window: float, warmup: float = 15.0) -> list[float]:
    """% of one core of each of three SyncObj processes over ``window`` seconds."""
    addrs = [f"127.0.0.1:{p}" for p in free_ports(3)]
    procs = [subprocess.Popen(
        [sys.executable, "-c", _CHILD, a, ",".join(b for b in addrs if b != a), str(period),
         password, str(warmup + window + 30)]) for a in addrs]
    try:
        time.sleep(warmup)
        before = [_cpu_s(p.pid) for p in procs]
        t0 = time.monotonic()
        time.sleep(window)
        wall = time.monotonic() - t0
        return [round((_cpu_s(p.pid) - b) / wall * 100, 2) for p, b in zip(procs, before,
                                                                                strict=True)]
    finally:
        for p in procs:
            p.kill()
            p.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--window", type=float, default=45.0, help="seconds")
    ap.add_argument("--period", type=float, default=0.05, help="append period, seconds")
    args = ap.parse_args()
    for label, password in (("password (Fernet)", "bench-secret-0123456789"), ("none", "")):
        cpu = measure(password, args.period, args.window)
        print(f"{label}: {', '.join(f'{c:.2f}' for c in cpu)} % of a core per process "
              f"(append period {args.period * 1000:.0f} ms, {args.window:.0f} s)")


if __name__ == "__main__":
    main()
