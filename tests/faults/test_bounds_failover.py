"""Issue 32 item 6 on a 3-node cluster: a job whose ``end`` is a few seconds ahead runs
until its end and then shows done, with the leader SIGKILLed in between. Each fire time
inside the bounds gets one outcome and runs at most once; none after the end runs or is
recorded; the killed node, restarted, replays the bounds from its journal and shows the
job done too."""

from __future__ import annotations

import time
from typing import Any

import pytest

from raftsched.core.durations import format_timestamp, parse_timestamp
from tests.support.harness import (
    outcomes_by_fire_time,
    read_witness,
    wait_until,
    witness_command,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

ACTIVE = ("pending", "queued", "assigned", "started")


def test_a_bounded_job_ends_on_time_across_a_leader_sigkill(cluster_factory: Any,
                                                             tmp_path: Any) -> None:
    c = cluster_factory(3, workers=4)
    c.start_all()
    leader = c.wait_leader(30)
    ran = str(tmp_path / "ran.jsonl")
    # Whole seconds: an every-second schedule fires on both bounds.
    start = (int(time.time()) + 2) * 1000
    end = start + 14_000
    with c.client() as cl:
        cl.put_job({"id": "window", "schedule": {"every": "1s"},
                    "start": format_timestamp(start), "end": format_timestamp(end),
                    # Exactly-once per fire time is what this test checks: a run its
                    # node took down with it is recorded lost, not run again.
                    "on_node_lost": "fail", "overlap": "allow",
                    "command": witness_command(ran)})
        wait_until(lambda: len(cl.runs("window")["runs"]) >= 2, 30, "the job running")
    assert time.time() * 1000 < end - 4000, "the machine is too slow for this window"
    c.kill(leader)
    survivors = [n for n in c.ids if n != leader]
    c.wait_leader(30, among=survivors)

    def done() -> dict[str, Any] | None:
        with c.client(survivors) as cl:
            job = cl.get_job("window")
            runs = cl.runs("window", limit=200)["runs"]
        if not job["done"] or any(r["state"] in ACTIVE for r in runs):
            return None
        return {"job": job, "runs": runs}

    seen = wait_until(done, 90, "the job done after its end, every run ended")
    assert seen["job"]["next_ms"] is None
    by_fire = outcomes_by_fire_time(seen["runs"])
    assert set(by_fire) == set(range(start, end + 1, 1000)), sorted(by_fire)
    assert all(len(o) == 1 for o in by_fire.values()), by_fire
    witnessed = [(w["RUN_ID"], parse_timestamp(w["SCHEDULED_AT"], "w"))
                 for w in read_witness(ran)]
    assert len({run_id for run_id, _ in witnessed}) == len(witnessed), witnessed
    assert all(start <= t <= end for _, t in witnessed), witnessed

    # The killed node comes back: its journal holds the bounds, and it sees the job done.
    c.start(leader)

    def restarted_sees_done() -> bool:
        with c.client([leader]) as cl:
            job = cl.get_job("window", stale=True)
        return bool(job["done"]) and job["spec"]["end"] == format_timestamp(end)

    wait_until(restarted_sees_done, 60, "the restarted node showing the job done")
    # Nothing runs after the end, also once every node is back: the window of a few
    # fire times of the schedule shows no new run or record.
    settle_until = time.time() + 3
    wait_until(lambda: time.time() > settle_until, 10, "three more seconds")
    with c.client() as cl:
        after = cl.runs("window", limit=200)["runs"]
    assert sorted(r["run_id"] for r in after) == sorted(r["run_id"] for r in seen["runs"])
    assert len(read_witness(ran)) == len(witnessed)
