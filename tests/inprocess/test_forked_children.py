"""Forked children (pysyncobj's snapshot writer, job processes) neither keep the node's
listening ports nor outlive the thread that forked them."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

import raftsched.node.node as node_mod
import raftsched.node.replica.raft  # noqa: F401 - registers the at-fork hook under test
from tests.support.harness import ROOT, wait_until

pytestmark = pytest.mark.timeout(90)


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
    """A process that imported raftsched.node.replica.raft forks from a thread named ``thread_name``
    and exits; returns (did the child outlive it, the child's niceness)."""
    marker = tmp_path / f"survived-{thread_name}"
    nice = tmp_path / f"nice-{thread_name}"
    pidfile = tmp_path / f"pid-{thread_name}"
    script = (
        "import os, sys, threading, time\n"
        f"sys.path.insert(0, {ROOT!r})\n"
        "import raftsched.node.replica.raft\n"
        "def fork():\n"
        "    if os.fork() == 0:\n"
        f"        open({str(pidfile)!r}, 'w').write(str(os.getpid()))\n"
        f"        open({str(nice) + '.tmp'!r}, 'w').write(str(os.nice(0)))\n"
        f"        os.rename({str(nice) + '.tmp'!r}, {str(nice)!r})\n"
        "        time.sleep(3)\n"
        f"        open({str(marker)!r}, 'w').write('yes')\n"
        "        os._exit(0)\n"
        # The forking thread lives on, as pysyncobj's tick thread does, until the child
        # has started (niced, it may take a while on a busy machine): a parent-death
        # signal follows the thread that forked, and the test is about the process.
        "    deadline = time.monotonic() + 10\n"
        f"    while not os.path.exists({str(nice)!r}) and time.monotonic() < deadline:\n"
        "        time.sleep(0.01)\n"
        f"t = threading.Thread(target=fork, name={thread_name!r}); t.start(); t.join()\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], timeout=20)
    assert proc.returncode == 0
    # The child's end, killed or after its 3 s and the marker: awaited, as a loaded
    # machine may run the child's last step late.
    child = int(pidfile.read_text())

    def gone() -> bool:
        try:
            with open(f"/proc/{child}/stat") as f:
                return f.read().rpartition(")")[2].split()[0] == "Z"
        except FileNotFoundError:
            return True

    wait_until(gone, 30, "the forked child to end")
    return marker.exists(), int(nice.read_text())


def test_the_snapshot_writer_dies_with_the_node_and_yields_the_cpu(tmp_path) -> None:
    """pysyncobj forks its snapshot writer from its tick thread: that child must not
    live on after the node, and runs at a lower priority than the node."""
    survived, nice = _fork_from_a_thread(tmp_path, raftsched.node.replica.raft.RAFT_THREAD_NAME)
    assert not survived, "the forked child outlived the node process"
    assert nice >= os.nice(0) + raftsched.node.replica.raft.SNAPSHOT_NICE or nice == 19


def test_forks_of_an_embedding_application_are_left_alone(tmp_path) -> None:
    survived, nice = _fork_from_a_thread(tmp_path, "app-worker")
    assert survived, "an application's own child was killed with its parent"
    assert nice == os.nice(0)
