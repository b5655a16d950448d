"""Issue 26: overload is graceful. Three real nodes are offered a fire storm this
machine cannot keep up with (12,000 every-second no-op jobs; a 2-core host runs about
4,000-5,000 runs/s). The leader reaches its jobs late instead of planning what the
cluster cannot carry: the storm ends with the term it began in, no node stopped its
runs for want of a quorum, and every fire time of the window has exactly one outcome
(a run, or a recorded miss) once the leader has reached past it.

Not a timing test: nothing here asserts a rate or a latency. The storm is the
benchmark's own (``bench.w1.run_raftsched``), so the test and W1 read the cluster the
same way.
"""

from __future__ import annotations

import os

import pytest

from bench import w1
from bench.common import Ctx

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(420)]

JOBS = 12_000
WINDOW_S = 8


def test_a_storm_beyond_capacity_keeps_its_leader_and_accounts_for_every_fire_time(
        tmp_path: os.PathLike[str]) -> None:
    ctx = Ctx(quick=True, tmp=str(tmp_path), out=str(tmp_path), stamp="overload")
    r = w1.run_raftsched(ctx, JOBS, WINDOW_S, 3)
    outcomes = r["outcomes"]
    assert r["fires"] == JOBS * WINDOW_S
    # Judged when the storm's window is drained, before the benchmark's bulk read of
    # every job's runs (which can itself cost an election: not yet throttled).
    assert r["term_start"] == r["term_drained"], r["problems"]
    fenced = r["self_fenced_drained"]
    assert fenced == {n: 0 for n in fenced}, fenced
    # Every fire time of the window is covered once: nothing without a record, nothing
    # with two different outcomes, no attempt started twice.
    assert outcomes.get("none", 0) == 0, outcomes
    assert sum(outcomes.values()) == r["fires"], outcomes
    assert (r["multi"], r["dup_records"], r["dup_exec"]) == ([], [], []), \
        (r["multi"][:3], r["dup_records"][:3], r["dup_exec"][:3])
    assert r["reach_s"] is not None, "the leader never reached past the window"
    # It was beyond capacity: the leader reached jobs late and folded fire times. (On a
    # host with more cores the storm may fit; the properties above hold either way.)
    if (os.cpu_count() or 1) <= 2:
        assert outcomes.get("missed:coalesced", 0) > 0, outcomes
