"""The benchmark's CPU of a node counts the children the node forks and reaps (its
snapshot writers): /proc puts a reaped child's CPU in its parent's ``cutime`` only, so
a reading of the parent alone left a writer's seconds out of every CPU-per-run figure."""

from __future__ import annotations

import os
import select
import subprocess
import sys

from bench.cluster import proc_cpu_s

#: CPU seconds the child spends (process time, not wall: the same on a loaded machine).
BURN_S = 0.3
#: /proc counts CPU in clock ticks, sampled: a reading may fall short by a few.
SLACK_S = 0.08
_CHILD = f"import time\nwhile time.process_time() < {BURN_S}: pass\n"


def test_a_reaped_childs_cpu_counts_in_the_tree_and_not_in_the_process_alone() -> None:
    me = os.getpid()
    own0, tree0 = proc_cpu_s(me, tree=False), proc_cpu_s(me)
    assert own0 is not None and tree0 is not None
    child = subprocess.Popen([sys.executable, "-c", _CHILD])
    assert child.wait(timeout=60) == 0
    own1, tree1 = proc_cpu_s(me, tree=False), proc_cpu_s(me)
    assert own1 is not None and tree1 is not None
    # The child's burn (and its interpreter's start) is in the tree, not in the process.
    assert (tree1 - tree0) - (own1 - own0) >= BURN_S - SLACK_S


def test_a_live_childs_cpu_counts_in_the_tree() -> None:
    me = os.getpid()
    # Before the child: this process's reaped children (an earlier test's) are in both
    # readings' difference already, so only what the live child adds is compared.
    own0, tree0 = proc_cpu_s(me, tree=False), proc_cpu_s(me)
    assert own0 is not None and tree0 is not None
    # The child says when it has burnt all of BURN_S (then waits on stdin, alive): waiting
    # only until its reading reached the threshold left the tree's reading on that edge.
    child = subprocess.Popen(
        [sys.executable, "-c",
         _CHILD + "import sys\nprint('burnt', flush=True)\nsys.stdin.read()\n"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None
        ready, _, _ = select.select([child.stdout], [], [], 60.0)
        assert ready, "the child did not burn its share within 60 s"
        assert child.stdout.readline().strip() == b"burnt"
        own1, tree1 = proc_cpu_s(me, tree=False), proc_cpu_s(me)
        assert own1 is not None and tree1 is not None
        assert child.poll() is None  # counted alive, not reaped
        assert (tree1 - tree0) - (own1 - own0) >= BURN_S - SLACK_S
    finally:
        child.kill()
        child.wait(timeout=10)


def test_a_process_that_is_gone_has_no_cpu() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(timeout=60)
    assert proc_cpu_s(child.pid) is None
