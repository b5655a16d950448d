"""Issue 15 item 2 with a real app server: ``gunicorn -w 4`` on one host, every worker
importing an app that embeds the host's raftsched member. Exactly one worker holds the
node (the data dir's lock); the others are its clients. When the holder is recycled
(SIGTERM, as ``max_requests`` does) or killed, another worker takes the node over from
the same data dir within seconds, and every fire time is executed once."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import urllib.request

import pytest

from tests.support.apps import Apps, executions, fire_times, quiet_moment
from tests.support.harness import free_ports, wait_until

pytest.importorskip("gunicorn")
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]

JOBS = 10


def _holder(a: Apps) -> int | None:
    """The pid holding the node's data dir (its lock file names it), if alive."""
    try:
        with open(os.path.join(a.tmp, "data", "n1", "lock"), encoding="ascii") as f:
            pid = int(f.read().strip() or 0)
    except (OSError, ValueError):
        return None
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return None
    return pid or None


def _get(port: int, path: str) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as resp:
        return json.loads(resp.read())


def _takeover(a: Apps, old: int, what: str) -> float:
    """Seconds until a worker other than ``old`` holds the node (and answers)."""
    t0 = time.monotonic()
    new = wait_until(lambda: (p := _holder(a)) not in (None, old) and p, 30, what)
    took = time.monotonic() - t0
    with a.client() as cl:
        wait_until(lambda: cl.status()["pid"] == new, 30, "the new holder's node answering")
    return took


def test_gunicorn_four_workers_one_node_taken_over_when_its_worker_goes(tmp_path):
    a = Apps(str(tmp_path), n=1)
    (port,) = free_ports(1)
    argv = [sys.executable, "-m", "gunicorn", "-w", "4", "-b", f"127.0.0.1:{port}",
            "--graceful-timeout", "30", "--timeout", "90", "--log-level", "warning",
            "tests.support.embedapp:app"]
    try:
        a.start("n1", argv=argv)
        wait_until(lambda: len(a.declared("n1")) >= 4, 120, "four workers declared")
        roles = sorted(d["role"] for d in a.declared("n1"))
        assert roles == ["client", "client", "client", "node"], a.tail("n1")
        wait_until(lambda: len(executions(a.witness)) >= 2 * JOBS, 60, "first runs")
        first = _holder(a)
        assert first is not None
        # Clients' calls reach the node: whichever worker answers, runs are there.
        for _ in range(8):
            assert _get(port, "/runs/tick0")["runs"]
        t_from = (int(time.time()) + 1) * 1000

        # Recycled: the holding worker exits cleanly (gunicorn's SIGTERM to a worker).
        quiet_moment(a.witness, JOBS)
        os.kill(first, signal.SIGTERM)
        recycled = _takeover(a, first, "a worker taking the node over after a recycle")
        second = _holder(a)
        # Killed: no drain, no goodbye.
        quiet_moment(a.witness, JOBS)
        os.kill(second, signal.SIGKILL)
        killed = _takeover(a, second, "a worker taking the node over after a SIGKILL")
        # Report only (docs/embedded.md: about a second; measured 0.1-0.2 s): how soon is
        # not this test's to assert on a loaded machine; that it happens is, within
        # _takeover's deadline.
        print(f"takeover after recycle {recycled:.2f}s, after SIGKILL {killed:.2f}s")  # noqa: T201

        t_to = (int(time.time()) + 3) * 1000
        wait_until(lambda: all(t_to in fire_times(a.witness).get(f"tick{i}", [])
                               for i in range(JOBS)), 90, "every job past the takeovers")
        doubled = {r: n for r, n in executions(a.witness).items() if n > 1}
        assert doubled == {}, doubled
        times = fire_times(a.witness)
        want = list(range(t_from, t_to + 1, 1000))
        for i in range(JOBS):
            assert [t for t in times[f"tick{i}"] if t_from <= t <= t_to] == want, f"tick{i}"
        # Only holders ever executed (no fire twice, above): the first, then the ones that
        # took over. The second holder may be SIGKILLed before its first fire on a slow
        # machine, so it need not appear.
        pids = {json.loads(line)["pid"] for line in open(a.witness, encoding="utf-8")}
        assert first in pids and 2 <= len(pids) <= 3, pids
        assert _get(port, "/runs/tick0")["runs"][0]["state"] in ("succeeded", "started",
                                                                  "assigned")
    finally:
        if a.procs.get("n1") is not None and a.procs["n1"].poll() is None:
            a.procs["n1"].send_signal(signal.SIGTERM)  # gunicorn stops its workers
            try:
                a.procs["n1"].wait(60)
            except Exception:  # noqa: BLE001 - killed below
                pass
        a.close()
