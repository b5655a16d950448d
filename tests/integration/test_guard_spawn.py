"""The guard and a job whose process exists before the node could register its group.

A seeded nemesis run beside a CPU hog SIGKILLed a node 3 ms after it forked a job: the
node died before its ``+ PGID`` line, the guard killed only the groups it knew, and the
orphaned job ran on while the cluster started attempt 2 elsewhere (overlapping
attempts). The node now announces each spawn before the fork (``s FENCE RUN_ID``);
these tests drive the real guard process through :class:`Guard` with real child
processes in exactly the state the node leaves behind in that window."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from raftsched.node.guard import Guard

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


@pytest.fixture
def spawn() -> Iterator:
    """Starts a stand-in job process the way the executor does (own session) with the
    run's contract environment; kills whatever is left at the end."""
    made: list[subprocess.Popen[bytes]] = []

    def start(fence: int, run_id: str) -> subprocess.Popen[bytes]:
        env = dict(os.environ, RAFTSCHED_FENCE=str(fence), RAFTSCHED_RUN_ID=run_id)
        # Popen returns once the exec succeeded: /proc shows the job's environment.
        proc = subprocess.Popen(SLEEPER, env=env, start_new_session=True)
        made.append(proc)
        return proc

    yield start
    for proc in made:
        if proc.poll() is None:
            proc.kill()
        proc.wait(5)


def _close_and_await_exit(guard: Guard) -> None:
    """Close the node's pipe and wait until the guard process has exited: after that
    it kills nothing more, so what is still alive was spared, not merely not reached."""
    proc = guard.proc
    assert proc is not None
    guard.close()
    assert proc.wait(15) == 0


def test_a_node_dying_between_fork_and_register_takes_the_job_with_it(tmp_path,
                                                                      spawn) -> None:
    guard = Guard(str(tmp_path / "markers"))
    guard.spawning(41, "j@1000")
    job = spawn(41, "j@1000")  # forked; the node dies before guard.add()
    other_attempt = spawn(42, "j@1000")  # another attempt of the run (another node's)
    other_run = spawn(41, "k@1000")  # the same number on another run: a stranger
    _close_and_await_exit(guard)  # the node's pipe closes, as when it is SIGKILLed
    assert job.wait(10) == -9
    assert other_attempt.poll() is None and other_run.poll() is None


def test_after_a_death_the_guard_keeps_looking_for_a_child_not_yet_exec_ed(
        tmp_path, spawn) -> None:
    # The child of a node killed between fork and exec shows the node's environment at
    # the guard's first look; it is found once it has exec'd.
    guard = Guard(str(tmp_path / "markers"))
    guard.spawning(51, "j@6000")
    assert guard.proc is not None and guard.proc.stdin is not None
    guard.proc.stdin.close()  # the node dies (no wait for the guard)
    time.sleep(0.2)  # deliberately after the first look: the exec comes late
    job = spawn(51, "j@6000")
    assert job.wait(10) == -9
    assert guard.proc.wait(15) == 0


def test_a_frozen_node_past_its_deadline_loses_an_unregistered_job_and_learns_why(
        tmp_path, spawn) -> None:
    guard = Guard(str(tmp_path / "markers"))
    try:
        guard.spawning(7, "j@2000")
        job = spawn(7, "j@2000")
        untouched = spawn(8, "j@3000")  # registered and confirmed: an ordinary group
        guard.spawning(8, "j@3000")
        guard.add(untouched.pid, 8)
        guard.deadline(time.monotonic() - 1)  # the node froze; its self-fence has passed
        assert job.wait(10) == -9 and untouched.wait(10) == -9
        # Once it runs again the node confirms the spawn, reaps it and finds the reason.
        guard.add(job.pid, 7)
        guard.remove(job.pid)
        assert "unresponsive" in (guard.killed(job.pid) or "")
    finally:
        guard.close()


def test_a_spawn_that_never_happened_is_forgotten(tmp_path, spawn) -> None:
    guard = Guard(str(tmp_path / "markers"))
    try:
        guard.spawning(9, "j@4000")
        guard.not_spawned(9)  # refused by the kernel (no such file, say)
        late = spawn(9, "j@4000")  # a process carrying it now is not that spawn's
        victim = spawn(10, "j@5000")
        guard.spawning(10, "j@5000")
        guard.add(victim.pid, 10)
        guard.spawning(11, "j@7000")  # a second spawn, unconfirmed: one search is made
        found = spawn(11, "j@7000")
        guard.deadline(time.monotonic() - 1)
        assert victim.wait(10) == -9 and found.wait(10) == -9
    finally:
        _close_and_await_exit(guard)
    # The search that found fence 11 would have found fence 9 too, had the "x" (read
    # before it, in order) not withdrawn it.
    assert late.poll() is None
