"""``python -m bench.http_latency``: request latency of the HTTP API (issue 17).

One 3-node loopback cluster with HTTP on every node (the integration tests' launcher);
300 sequential GETs per route on a follower (consistent and stale reads, status, a
10-fire preview), the msgpack ``get_job`` on the same node for comparison, 100
pause/resume writes, and 50 writes timed until their event arrives on the same
follower's Server-Sent-Events stream. Prints p50/p99; asserts nothing.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from tests.support.httputil import EventStream, http_cluster, request, tokens

SECRET = "bench-http-secret-0123456789abcdef"


def _pct(xs: list[float]) -> str:
    xs = sorted(xs)
    return (f"p50 {statistics.median(xs) * 1000:.2f} ms  "
            f"p99 {xs[max(int(len(xs) * 0.99) - 1, 0)] * 1000:.2f} ms")


def _timed(n: int, fn: Callable[[int], object]) -> list[float]:
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        fn(i)
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    tok = tokens(SECRET)
    with http_cluster("rs-bench-http-", SECRET) as c:
        leader = c.wait_leader()
        node = next(n for n in c.ids if n != leader)
        addr = c.http[node]

        def ok(method: str, path: str, role: str = "read") -> None:
            status, body, _ = request(addr, method, path, tok[role], {} if method == "POST"
                                      else None)
            assert status == 200, (path, status, body)

        request(addr, "PUT", "/api/v1/jobs/b1", tok["admin"],
                {"schedule": {"every": "1h"}, "command": ["true"]})
        for name, path in (("GET job (consistent)", "/api/v1/jobs/b1"),
                           ("GET job (stale)", "/api/v1/jobs/b1?stale=true"),
                           ("GET status", "/api/v1/status"),
                           ("GET next count=10", "/api/v1/jobs/b1/next?count=10&stale=true")):
            lat = _pct(_timed(300, lambda _i, p=path: ok('GET', p)))
            print(f"{name} on follower {node}: {lat}")
        with c.client([node]) as cl:
            print(f"msgpack get_job (consistent) on {node}: "
                  f"{_pct(_timed(300, lambda _i: cl.get_job('b1')))}")

        def flip(i: int) -> None:
            ok("POST", f"/api/v1/jobs/b1/{'pause' if i % 2 == 0 else 'resume'}", "admin")

        print(f"POST pause/resume on follower: {_pct(_timed(100, flip))}")
        stream = EventStream(addr, tok["read"])
        try:
            stream.wait_for(lambda e: e["event"] == "stream.open", 10, "stream.open")

            def flip_seen(i: int) -> None:
                flip(i)
                stream.wait_for(lambda e: e["event"] in ("job.paused", "job.resumed"), 10,
                                "the write's event")

            print(f"write -> its SSE event on the same follower: {_pct(_timed(50, flip_seen))}")
        finally:
            stream.close()


if __name__ == "__main__":
    main()
