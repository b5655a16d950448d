"""Issue 15 items 1, 3 and 4 with real app processes: three instances of an app each
embed a member of one cluster (tests/support/embedapp.py) and run its callables."""

from __future__ import annotations

import signal
import time

import pytest

from tests.support.apps import Apps, executions, fire_times, quiet_moment
from tests.support.harness import json_lines, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

JOBS = 10


@pytest.fixture
def apps(tmp_path):
    made: list[Apps] = []

    def make(**kw) -> Apps:
        a = Apps(str(tmp_path), **kw)
        made.append(a)
        return a

    yield make
    for a in made:
        a.close()


def _versions(a: Apps) -> dict[str, int]:
    with a.client() as cl:
        return {j["id"]: j["version"] for j in cl.list_jobs(limit=1000)["jobs"]}


@pytest.mark.timeout(240)
def test_three_instances_declaring_50_jobs_make_one_version_and_a_changed_one_one_more(apps):
    a = apps()
    idle = {"EMBEDAPP_JOBS": "0", "EMBEDAPP_IDLE": "50"}
    # Members from RAFTSCHED_PEERS (one image for every replica), not the config file.
    for nid in a.ids:
        a.start(nid, dict(idle, RAFTSCHED_CONFIG="", RAFTSCHED_PEERS=a.peers,
                          RAFTSCHED_SECRET=a.secret,
                          EMBEDAPP_DATA=f"{a.tmp}/data"))
    for nid in a.ids:
        wait_until(lambda n=nid: a.declared(n), 90, f"{nid}'s declarations")
    versions = _versions(a)
    assert len(versions) == 50 and set(versions.values()) == {1}, versions
    # All three put 50 specs; exactly one of them created each job.
    reports = [a.declared(n)[0] for n in a.ids]
    assert sum(r["created"] for r in reports) == 50, reports
    assert all(r["created"] + r["unchanged"] == 50 and r["updated"] == [] for r in reports)
    # One instance's code changes one job's cron; it restarts: one new version.
    assert a.stop("n3") == 0, a.tail("n3")
    a.start("n3", dict(idle, RAFTSCHED_CONFIG="", RAFTSCHED_PEERS=a.peers,
                       RAFTSCHED_SECRET=a.secret, EMBEDAPP_DATA=f"{a.tmp}/data",
                       EMBEDAPP_CHANGED="idle7"))
    wait_until(lambda: len(a.declared("n3")) == 2, 90, "n3's declarations after its restart")
    assert a.declared("n3")[1]["updated"] == ["idle7"]
    versions = _versions(a)
    assert versions.pop("idle7") == 2 and set(versions.values()) == {1}, versions
    with a.client() as cl:
        assert cl.get_job("idle7")["spec"]["schedule"]["cron"] == "*/5 * * * *"


def _check_once(a: Apps, t_from: int, t_to: int) -> None:
    """Every job executed every fire time in [t_from, t_to] exactly once."""
    times = fire_times(a.witness)
    doubled = {r: n for r, n in executions(a.witness).items() if n > 1}
    assert doubled == {}, doubled
    for i in range(JOBS):
        got = [t for t in times.get(f"tick{i}", []) if t_from <= t <= t_to]
        want = list(range(t_from, t_to + 1, 1000))
        if got != want:
            with a.client() as cl:
                runs = [r for r in cl.runs(f"tick{i}", limit=100)["runs"]
                        if r["scheduled_ms"] in set(want) - set(got)]
            raise AssertionError(f"tick{i}: fire times not executed once: {runs}")


@pytest.mark.timeout(300)
def test_kill_one_instance_freeze_another_restart_every_fire_time_once(apps):
    a = apps()
    for nid in a.ids:
        a.start(nid)
    wait_until(lambda: all(a.declared(n) for n in a.ids), 90, "every instance declared")
    wait_until(lambda: len(executions(a.witness)) >= 3 * JOBS, 60, "runs in the cluster")
    t_from = (int(time.time()) + 1) * 1000
    quiet_moment(a.witness, JOBS, idle=lambda: a.holds("n1"))
    a.kill("n1")
    time.sleep(2)
    quiet_moment(a.witness, JOBS, idle=lambda: a.holds("n2"))
    t_freeze = time.time()
    a.signal("n2", signal.SIGSTOP)
    time.sleep(5)
    a.signal("n2", signal.SIGCONT)
    t_thaw = time.time()
    a.start("n1")
    wait_until(lambda: len(a.declared("n1")) == 2, 90, "n1 back")
    t_to = (int(time.time()) + 3) * 1000
    wait_until(lambda: all(t_to in fire_times(a.witness).get(f"tick{i}", [])
                           for i in range(JOBS)), 90, "every job past the faults")
    _check_once(a, t_from, t_to)
    # The callables' outcomes are recorded: succeeded, with what they returned. (The
    # witness shows a call ran; its finish commits a moment later: awaited.)
    def settled() -> list[dict] | None:
        with a.client() as cl:
            runs = cl.runs("tick0", limit=100)["runs"]
        window = [r for r in runs if t_from <= r["scheduled_ms"] <= t_to]
        return None if any(r["state"] in ("pending", "assigned", "started")
                           for r in window) else window

    done = wait_until(settled, 60, "tick0's runs of the window settled")
    # With n1 dead and n2 frozen there is no quorum: a run that a loaded machine still
    # had claimed or running when the freeze began is stopped by its node's self-fence and
    # recorded lost; on_node_lost then gives that fire time a second attempt (the witness
    # check above proved it executed once all the same). quiet_moment makes that rare, it
    # cannot rule it out. So the records are counted per fire time, not per attempt:
    # each fire time has exactly one succeeded attempt, and any other is such a fence.
    fenced = [r for r in done if r["state"] == "lost"
              and r["reason"].startswith("self-fenced: no quorum")
              and (t_freeze - 2) * 1000 <= r["scheduled_ms"] <= t_thaw * 1000]
    bad = [(r["run_id"], r["attempt"], r["state"], r["reason"]) for r in done
           if r["state"] != "succeeded" and r not in fenced]
    assert bad == [], bad
    succeeded = sorted(r["scheduled_ms"] for r in done if r["state"] == "succeeded")
    assert succeeded == list(range(t_from, t_to + 1, 1000)), [
        (r["run_id"], r["attempt"], r["state"]) for r in done]
    # The newest runs keep their output tail (older history keeps only the outcome).
    newest = max((r for r in done if r["state"] == "succeeded"), key=lambda r: r["scheduled_ms"])
    assert newest["tail"].startswith("pid "), newest
    # Processes on all three members ran callables.
    assert len({w["node"] for w in json_lines(a.witness)}) == 3


@pytest.mark.timeout(300)
def test_rolling_restart_with_a_drain_loses_and_doubles_nothing(apps):
    a = apps()
    slow = {"EMBEDAPP_SLEEP": "0.6"}  # a run is often under way when its instance stops
    for nid in a.ids:
        a.start(nid, slow)
    wait_until(lambda: all(a.declared(n) for n in a.ids), 90, "every instance declared")
    wait_until(lambda: len(executions(a.witness)) >= 3 * JOBS, 60, "runs in the cluster")
    t_from = (int(time.time()) + 1) * 1000
    for nid in a.ids:  # a deploy: one instance at a time, each drained by SIGTERM
        assert a.stop(nid) == 0, a.tail(nid)
        a.start(nid, slow)
        wait_until(lambda n=nid: len(a.declared(n)) == 2, 90, f"{nid} back")
    t_to = (int(time.time()) + 3) * 1000
    wait_until(lambda: all(t_to in fire_times(a.witness).get(f"tick{i}", [])
                           for i in range(JOBS)), 90, "every job past the deploy")
    _check_once(a, t_from, t_to)
    with a.client() as cl:
        lost = [r for i in range(JOBS) for r in cl.runs(f"tick{i}", limit=100)["runs"]
                if r["state"] == "lost" and r["scheduled_ms"] >= t_from]
    assert lost == []
