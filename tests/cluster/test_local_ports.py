"""Issue 29 item 8: ``raftsched local`` beside something holding one of its ports.

It half-started: n1 restart-looped on its taken port while n2 and n3 formed a cluster,
and the banner pointed ``--addr`` at whatever held n1's API port. Now it checks every
port first, names the taken one and its holder, and starts nothing."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.support.harness import ROOT
from tests.support.localproc import free_local_base

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def _processes_naming(text: str) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if text.encode() in f.read():
                        out.append(int(entry))
            except OSError:
                continue
    return out


@pytest.mark.parametrize("offset, what", [(101, "n1 api"), (3, "n3 raft")])
def test_a_taken_port_is_named_with_its_holder_and_nothing_starts(tmp_path, offset, what):
    base = free_local_base()
    data_dir = str(tmp_path / "local")
    with socket.socket() as held:
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        held.bind(("127.0.0.1", base + offset))
        held.listen()
        env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        t0 = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "-m", "raftsched", "local", "--nodes", "3", "--base-port",
             str(base), "--data-dir", data_dir],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
            start_new_session=True)
        try:
            out, err = proc.communicate(timeout=20)
        finally:
            took = time.monotonic() - t0
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
            # Nodes it started anyway (each in a session of its own), found by the
            # unique data dir on their command line: before the fix there were two.
            started = _processes_naming(data_dir)
            for pid in started:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
    assert started == [], "it started nodes beside the taken port"
    assert proc.returncode == 1, (out, err)
    assert took < 15, took
    # The port, what it is for, and who holds it (this test's process).
    assert f"port 127.0.0.1:{base + offset} ({what}) is in use by pid {os.getpid()}" in err, err
    assert "started nothing" in err and "--base-port" in err, err
    # No banner, no node, not even its data dir.
    assert "pid" not in out and out == "", out
    assert not os.path.exists(data_dir)
