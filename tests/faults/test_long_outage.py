"""Issue 13: a whole cluster down for a week, restarted: it answers throughout recovery.

100 per-minute cron jobs in Europe/Berlin with ``misfire = once`` on 3 nodes; all nodes
stop, and start again with their clocks a week ahead (``RAFTSCHED_CLOCK_OFFSET_MS``), so
each job has ~10,080 missed fire times to account for. Before the fix the leader
counted them one by one under the Raft lock: 300 jobs stalled the cluster ~35 s with 7
term changes. Asserted: ``status`` answers in every second once a leader is known (it
is served from the node's event loop and takes the Raft lock), every job gets its
catch-up run and one exact missed range, and its records cover every fire time; at
most one second unanswered (a loaded machine's margin) and no term change once the
start's own election settled.

``RAFTSCHED_OUTAGE_JOBS=300 pytest tests/faults/test_long_outage.py -s`` runs the
issue's original scenario and prints its figures.
"""

from __future__ import annotations

import os
import time
from typing import Any

import pytest

from raftsched.core.trigger import count_fires, next_fire, schedule_from_spec
from raftsched.faces.launcher import StatusPoller
from raftsched.wire.client import Client
from tests.support.harness import wait_until

pytestmark = [pytest.mark.integration]

WEEK_MS = 7 * 86_400_000
JOBS = int(os.environ.get("RAFTSCHED_OUTAGE_JOBS", "100"))
#: How long recovery may take; raise it to measure a slow build by hand.
RECOVERY_S = float(os.environ.get("RAFTSCHED_OUTAGE_WAIT_S", "60"))
#: The start's vote race settles within this of the first leader; after it, a change of
#: leader is a stall of the recovery.
SETTLE_S = 1.0
SCHEDULE = {"cron": "* * * * *", "tz": "Europe/Berlin"}


def _accounted(cl: Client, job: str, created_ms: int) -> dict[str, Any] | None:
    """The job's catch-up run and missed range once both are recorded, else None;
    checks that its records cover every fire time from its creation on."""
    by_fire: dict[int, dict[str, Any]] = {}  # attempts of one fire time: the newest
    for r in cl.runs(job, 100)["runs"]:
        prev = by_fire.get(r["scheduled_ms"])
        if prev is None or r["attempt"] > prev["attempt"]:
            by_fire[r["scheduled_ms"]] = r
    runs = [by_fire[t] for t in sorted(by_fire)]
    ranges = [r for r in runs if r["until_ms"] is not None]
    catch_up = [r for r in runs if r["until_ms"] is None and ranges
                and r["scheduled_ms"] > ranges[-1]["until_ms"] and r["state"] == "succeeded"]
    if not ranges or not catch_up:
        return None
    sched = schedule_from_spec(SCHEDULE)
    assert runs[0]["scheduled_ms"] == next_fire(sched, created_ms), (job, runs[0])
    for a, b in zip(runs, runs[1:], strict=False):  # contiguous: no fire time left out
        assert next_fire(sched, a["until_ms"] or a["scheduled_ms"]) == b["scheduled_ms"], (a, b)
    for r in ranges:
        assert r["count"] == count_fires(sched, r["scheduled_ms"] - 1, r["until_ms"]), r
    return {"range": ranges[-1], "run": catch_up[0]}


@pytest.mark.timeout(150)
def test_week_long_outage_recovers_answering_throughout(cluster_factory, tmp_path):
    c = cluster_factory(3, workers=max(16, JOBS // 2))
    c.start_all()
    c.wait_leader(30)
    with c.client() as cl:
        for k in range(0, JOBS, 500):
            # /bin/true: a hundred Python witnesses starting at once would measure the CPU
            # of the test machine, not the cluster's recovery.
            cl.put_jobs([{"id": f"w{i:04d}", "schedule": SCHEDULE, "command": ["true"],
                          "misfire": {"policy": "once", "grace": "60s"}}
                         for i in range(k, min(k + 500, JOBS))])
        created = {j["id"]: j["created_ms"] for j in cl.list_jobs()["jobs"]}
    assert len(created) == JOBS
    c.terminate_all(15)

    offset = {"RAFTSCHED_CLOCK_OFFSET_MS": str(WEEK_MS)}
    t_restart = time.monotonic()
    c.start_all(env={nid: offset for nid in c.ids})
    done: dict[str, dict[str, Any]] = {}
    t_all = None
    with StatusPoller(c) as poller:
        try:
            c.wait_leader(RECOVERY_S)
            with c.client(timeout=10) as cl:
                def all_accounted() -> bool:
                    for job in created:
                        if job not in done:
                            got = _accounted(cl, job, created[job])
                            if got is None:
                                return False
                            done[job] = got
                    return True

                wait_until(all_accounted, RECOVERY_S,
                           f"catch-up run and missed range of {JOBS} jobs", interval=0.5)
            t_all = round(time.monotonic() - t_restart, 2)
            time.sleep(2)  # keep polling a little after the catch-up: nothing stalls later
        finally:
            figures = poller.figures(t_restart) if any(
                s and s.get("leader") for _, _, s in poller.samples) else {}
            figures.update(all_accounted_s=t_all, jobs_accounted=len(done),
                           lock_hold_max_ms=c.lock_hold_max_ms())
            print(f"\nweek-long outage, {JOBS} jobs: {figures}")

    for job, got in done.items():
        assert got["range"]["count"] > 10_000 - 60, (job, got)  # a week of minutes, exact
        assert got["range"]["state"] == "missed", (job, got)
    assert all(got["run"]["exit_code"] == 0 for got in done.values())  # it ran, here
    # Measured 0 and 0 (also beside a nemesis run); one unanswered second is the
    # margin for a loaded 2-core machine, a recovery that costs an election is a bug.
    assert figures["unanswered_seconds"] <= 1, figures
    # The elections that may happen are the start's own vote race, while the three
    # processes come up one after another (measured: the leader that stayed reported
    # 0.09-0.21 s after the first, terms [2, 4, 5]); once it settled, no term change.
    assert figures["term_changes"] == 0 or \
        figures["stable_leader_s"] - figures["first_leader_s"] < SETTLE_S, figures
