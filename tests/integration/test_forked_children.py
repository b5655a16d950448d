"""Forked children (pysyncobj's snapshot writer, job processes) neither keep the node's
listening ports nor outlive the thread that forked them."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

import raftsched.node as node_mod
import raftsched.raft  # noqa: F401 - registers the at-fork hook under test
from tests.integration.harness import ROOT

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]


def test_a_forked_child_does_not_keep_the_listening_sockets() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    node_mod._LISTENING_FDS.append(listener.fileno())
    try:
        pid = os.fork()
        if pid == 0:  # the child: the fd must already be closed
            try:
                os.fstat(listener.fileno())
                os._exit(1)
            except OSError:
                os._exit(0)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, "the child still had the socket"
    finally:
        node_mod._LISTENING_FDS.remove(listener.fileno())
        listener.close()


def _fork_from_a_thread(tmp_path, thread_name: str) -> tuple[bool, int]:
    """A process that imported raftsched.raft forks from a thread named ``thread_name``
    and exits; returns (did the child outlive it, the child's niceness)."""
    marker = tmp_path / f"survived-{thread_name}"
    nice = tmp_path / f"nice-{thread_name}"
    script = (
        "import os, sys, threading, time\n"
        f"sys.path.insert(0, {ROOT!r})\n"
        "import raftsched.raft\n"
        "def fork():\n"
        "    if os.fork() == 0:\n"
        f"        open({str(nice)!r}, 'w').write(str(os.nice(0)))\n"
        "        time.sleep(3)\n"
        f"        open({str(marker)!r}, 'w').write('yes')\n"
        "        os._exit(0)\n"
        f"t = threading.Thread(target=fork, name={thread_name!r}); t.start(); t.join()\n"
        "time.sleep(0.3)\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], timeout=20)
    assert proc.returncode == 0
    time.sleep(3.5)  # past the child's 3 s: it would have written the marker by now
    return marker.exists(), int(nice.read_text())


def test_the_snapshot_writer_dies_with_the_node_and_yields_the_cpu(tmp_path) -> None:
    """pysyncobj forks its snapshot writer from its tick thread: that child must not
    live on after the node, and runs at a lower priority than the node."""
    survived, nice = _fork_from_a_thread(tmp_path, raftsched.raft.RAFT_THREAD_NAME)
    assert not survived, "the forked child outlived the node process"
    assert nice >= os.nice(0) + raftsched.raft.SNAPSHOT_NICE or nice == 19


def test_forks_of_an_embedding_application_are_left_alone(tmp_path) -> None:
    survived, nice = _fork_from_a_thread(tmp_path, "app-worker")
    assert survived, "an application's own child was killed with its parent"
    assert nice == os.nice(0)
