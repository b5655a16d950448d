"""Job processes die with their node although they are spawned without ``preexec_fn``
(issue 14: Python code between fork and exec deadlocked a threaded node): the guard,
which spawns them, kills every one of them when the node's end of its socket closes."""

from __future__ import annotations

import os
import pathlib
import signal
import sys
import time

import pytest

from raftsched.core.durations import format_timestamp
from tests.support.harness import ROOT, json_lines, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

#: Records its pid, session and group, then runs (a child too) for up to a minute.
SCRIPT = """
import json, os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
rec = {"pid": os.getpid(), "sid": os.getsid(0), "pgid": os.getpgid(0), "child": child.pid,
       "ppid": os.getppid(), "t": time.time()}
with open(sys.argv[1], "a") as f:
    f.write(json.dumps(rec) + "\\n")
time.sleep(60)
"""


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_no_preexec_fn_anywhere_in_the_package() -> None:
    hits = [str(p) for p in pathlib.Path(ROOT, "raftsched").rglob("*.py")
            if "preexec_fn=" in p.read_text(encoding="utf-8")]
    assert hits == []


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_killing_the_node_kills_its_running_jobs_promptly(cluster_factory, tmp_path,
                                                          sig: int) -> None:
    # stop_timeout 0: a SIGTERMed node drains first (tests/cluster/test_stop_drains.py);
    # here it stops its runs at once.
    c = cluster_factory(1, timing={"stop_timeout": "0s"})
    out = str(tmp_path / "w.jsonl")
    c.start_all()
    c.wait_leader()
    at = (int(time.time()) + 2) * 1000
    with c.client() as cl:
        cl.put_job({"id": "long", "schedule": {"at": format_timestamp(at)},
                    "command": [sys.executable, "-c", SCRIPT, out]})
    rec = wait_until(lambda: json_lines(out), 20, "the job to start")[0]
    node_pid = c.procs["n1"].pid
    guard_pids = [int(p) for p in os.listdir("/proc") if p.isdigit()
                  and "raftsched/node/worker/guardproc.py" in _cmdline(int(p))
                  and _ppid(int(p)) == node_pid]
    assert len(guard_pids) == 1
    # Its own session and group (start_new_session), a child of the node's guard (which
    # spawns every job: see guard.py).
    assert rec["sid"] == rec["pid"] == rec["pgid"] and rec["ppid"] == guard_pids[0]
    t_kill = time.monotonic()
    os.kill(node_pid, sig)
    c.procs["n1"].wait(20)
    wait_until(lambda: _gone(rec["pid"]) and _gone(rec["child"]), 10,
               "the node's job and its child to die with the node")
    took = time.monotonic() - t_kill
    for pid in guard_pids:
        wait_until(lambda pid=pid: _gone(pid), 10, "the guard to exit after its node")
    print(f"\njob group killed {took:.2f}s after {signal.Signals(sig).name} "  # noqa: T201
          "of the node")


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _ppid(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError):
        return -1
