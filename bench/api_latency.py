"""API round-trip latency by transport: cleartext protocol 1 (a baseline source tree,
e.g. the commit before encryption) against sealed frames and TLS (this tree).

``python -m bench.api_latency --baseline /path/to/old/tree [--n 400] [--rounds 3]``

Each measurement is a fresh one-node cluster (a real ``raftsched node`` process) and a
client on loopback, both from the tree being measured, in a worker process whose
``PYTHONPATH`` is that tree. Rounds alternate between the variants, so drift of a
loaded machine falls on all of them alike. Printed: median and p99 per op (µs), and
each variant's ratio to the baseline. It never asserts timings.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SECRET = "bench-api-latency-secret-0123456789"
OPS = ("put_job", "get_job", "get_job_stale")


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _worker(mode: str, n: int) -> dict[str, Any]:
    """Runs inside the measured tree: one node, n round trips of each op."""
    from raftsched.wire.client import Client

    with tempfile.TemporaryDirectory(prefix="rs-apilat-") as tmp:
        raft, api = _free_ports(2)
        lines = ["[cluster]", f'data_dir = "{tmp}/data"', 'secret_env = "RS_BENCH_SECRET"']
        kwargs: dict[str, Any] = {}
        if mode == "tls":
            from raftsched.wire.certs import create_ca, create_node
            create_ca(f"{tmp}/certs")
            create_node(f"{tmp}/certs", "n1")
            lines += [f'tls_cert = "{tmp}/certs/{{id}}.crt"',
                      f'tls_key = "{tmp}/certs/{{id}}.key"', f'tls_ca = "{tmp}/certs/ca.crt"']
            kwargs["tls_ca"] = f"{tmp}/certs/ca.crt"
        elif mode == "sealed":
            kwargs["tls_ca"] = ""
        lines += ["", "[log]", 'level = "warning"', "", "[[nodes]]", 'id = "n1"',
                  f'raft = "127.0.0.1:{raft}"', f'api = "127.0.0.1:{api}"', ""]
        with open(f"{tmp}/c.toml", "w", encoding="utf-8") as f:
            f.write("\n".join(lines))
        env = dict(os.environ, RS_BENCH_SECRET=SECRET)
        node = subprocess.Popen([sys.executable, "-m", "raftsched", "node", "--config",
                                 f"{tmp}/c.toml", "--id", "n1"], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
        try:
            with Client([f"127.0.0.1:{api}"], secret=SECRET, timeout=15, **kwargs) as client:
                deadline = time.monotonic() + 30
                while True:
                    try:
                        if client.status().get("leader"):
                            break
                    except Exception:  # noqa: BLE001 - starting up
                        if time.monotonic() > deadline:
                            raise
                    time.sleep(0.05)
                spec = {"id": "bench", "schedule": {"at": "2099-01-01T00:00:00Z"},
                        "command": ["true"], "env": {"DB_PASSWORD": "x" * 32}}
                out: dict[str, list[float]] = {op: [] for op in OPS}
                for i in range(n + 20):  # the first 20 warm up
                    t0 = time.perf_counter()
                    client.put_job(dict(spec, id=f"bench-{i % 50}"))
                    t1 = time.perf_counter()
                    client.get_job(f"bench-{i % 50}")
                    t2 = time.perf_counter()
                    client.get_job(f"bench-{i % 50}", stale=True)
                    t3 = time.perf_counter()
                    if i >= 20:
                        out["put_job"].append(t1 - t0)
                        out["get_job"].append(t2 - t1)
                        out["get_job_stale"].append(t3 - t2)
                return out
        finally:
            os.killpg(node.pid, signal.SIGKILL)
            node.wait(10)


def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", required=True, help="source tree of the cleartext baseline")
    ap.add_argument("--n", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(_worker(args.worker, args.n)))
        return 0
    variants = [("cleartext (baseline)", args.baseline, "plain"), ("sealed", HERE, "sealed"),
                ("tls", HERE, "tls")]
    samples: dict[str, dict[str, list[float]]] = {v[0]: {op: [] for op in OPS}
                                                 for v in variants}
    for _ in range(args.rounds):
        for name, root, mode in variants:
            env = dict(os.environ, PYTHONPATH=root)
            res = subprocess.run([sys.executable, os.path.abspath(__file__), "--baseline",
                                  args.baseline, "--worker", mode, "--n", str(args.n)],
                                 env=env, cwd=root, capture_output=True, text=True, timeout=600)
            if res.returncode != 0:
                print(f"{name}: failed\n{res.stderr[-2000:]}", file=sys.stderr)
                return 1
            for op, values in json.loads(res.stdout.strip().splitlines()[-1]).items():
                samples[name][op] += values
    base = variants[0][0]
    print(f"API round trips, one node on loopback, {args.rounds} rounds x {args.n} per op "
          f"(µs: median / p99; ratio of medians to the baseline)")
    print(f"{'variant':22} " + " ".join(f"{op:>28}" for op in OPS))
    for name, _, _ in variants:
        cells = []
        for op in OPS:
            med = statistics.median(samples[name][op])
            ratio = med / statistics.median(samples[base][op])
            cells.append(f"{med * 1e6:8.0f} / {_pct(samples[name][op], 0.99) * 1e6:7.0f} "
                         f"x{ratio:5.2f}")
        print(f"{name:22} " + " ".join(f"{c:>28}" for c in cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
