"""The nemesis's promise checks on hand-made histories (tests/nemesis/promises.py):
each finds its violation, and the clean history beside it gives none."""

from __future__ import annotations

from tests.nemesis import checker, promises
from tests.nemesis.checker import Execution
from tests.support.histories import rec, wl

S = 1000
T0 = 1_800_000_000_000


def ex(run_id: str, start: float, last: float, fence: int = 1, node: str = "n1") -> Execution:
    return Execution(run_id=run_id, job_id=run_id.split("@")[0], fence=fence, attempt=1,
                     node=node, pid=hash(run_id) % 10_000, start=start, last=last,
                     ended=True)


def test_a_succeeded_record_needs_an_execution_with_its_fence() -> None:
    runs = {"j": [rec("j", T0), rec("j", T0 + S, fence=2)]}
    execs = checker.executions([wl(f"j@{T0}", 1, 10, "start", 1.0),
                                wl(f"j@{T0}", 1, 10, "end", 1.1)])
    found = promises.check_succeeded_executed(runs, execs, T0 + 5 * S)
    assert [f["run_id"] for f in found] == [f"j@{T0 + S}"]
    assert found[0]["kind"] == "succeeded_without_execution"
    execs += [ex(f"j@{T0 + S}", 2.0, 2.1, fence=2)]
    assert promises.check_succeeded_executed(runs, execs, T0 + 5 * S) == []
    # After the end of the checked window the witness is not read: no finding.
    assert promises.check_succeeded_executed(runs, execs[:1], T0) == []


def test_a_run_still_active_after_the_settle_time_is_unsettled() -> None:
    runs = {"j": [rec("j", T0), rec("j", T0 + S, "started"), rec("j", T0 + 9 * S, "started")]}
    found = promises.check_settled(runs, T0 + 5 * S)
    assert [(f["kind"], f["fire_ms"]) for f in found] == [("unsettled", T0 + S)]


def test_a_guard_kill_right_after_a_start_is_found() -> None:
    runs = {"j": [rec("j", T0, "failed", reason="guard: node gone", started_ms=T0,
                      finished_ms=T0 + 120),
                  rec("j", T0 + S, "failed", reason="guard: node gone", started_ms=T0 + S,
                      finished_ms=T0 + S + 900)]}
    found = promises.check_guard_kills(runs)
    assert [(f["kind"], f["run_id"]) for f in found] == [("guard_kill_at_start", f"j@{T0}")]


def test_a_guard_kill_is_not_judged_at_start_from_a_stepped_clock() -> None:
    """The node's clock stepped back between the run's start and its finish (a nemesis
    clock fault): its record says it ended 5 s before it began; its witness says its
    process lived 2.5 s. Not a kill at its start; the same record with a witness that
    lived 0.1 s, or with none, is one."""
    stepped = {"j": [rec("j", T0, "lost", reason="guard: node unresponsive",
                         started_ms=T0 + 5 * S, finished_ms=T0)]}
    run_id = f"j@{T0}"
    assert promises.check_guard_kills(stepped, [ex(run_id, 10.0, 12.5)]) == []
    found = promises.check_guard_kills(stepped, [ex(run_id, 10.0, 10.1)])
    assert [(f["kind"], f["witnessed_alive_ms"]) for f in found] == [
        ("guard_kill_at_start", 100)]
    # Unwitnessed, its times running backwards cannot be judged (reported apart); another
    # attempt's witness (another fence) says nothing about this one.
    for execs in ([], [ex(run_id, 10.0, 12.5, fence=7)]):
        assert [f["kind"] for f in promises.check_guard_kills(stepped, execs)] == [
            "guard_kill_unjudged"]
    # Its process forked 0.6 s before its start line (a slow interpreter start, or a
    # node frozen meanwhile): it lived from its fork.
    forked = [Execution(run_id=run_id, job_id="j", fence=1, attempt=1, node="n1", pid=1,
                        start=10.6, last=10.6, ended=False, forked=10.0)]
    assert promises.check_guard_kills(stepped, forked) == []
    # A record that says 4.4 s beside a witness that ticked 0.1 s (the node frozen with
    # its jobs, then killed at the thaw): not soon.
    frozen = {"j": [rec("j", T0, "lost", reason="guard: node unresponsive",
                        started_ms=T0, finished_ms=T0 + 4400)]}
    assert promises.check_guard_kills(frozen, [ex(run_id, 10.0, 10.1)]) == []
    # Unwitnessed with times that run forwards: judged by them.
    soon = {"j": [rec("j", T0, "lost", reason="guard: node unresponsive",
                      started_ms=T0, finished_ms=T0 + 100)]}
    assert [f["kind"] for f in promises.check_guard_kills(soon)] == ["guard_kill_at_start"]


def test_a_cluster_that_executes_nothing_makes_no_progress() -> None:
    """The case the old checker passed: every fire time has a record, none ran."""
    missed = {"j": [rec("j", T0, "missed", until_ms=T0 + 99 * S, count=100,
                        reason="no_leader")]}
    figures, found = promises.check_progress(missed, {"j": S}, {"j": T0}, T0 + 99 * S, [], [])
    assert [f["kind"] for f in found] == ["no_progress"]
    assert checker.check_fire_times("j", missed["j"], S, T0, T0 + 99 * S)[1] == []
    ran = {"j": [rec("j", T0 + i * S) for i in range(100)]}
    execs = [ex(f"j@{T0 + i * S}", T0 / 1000 + i, T0 / 1000 + i + 0.1) for i in range(100)]
    figures, found = promises.check_progress(ran, {"j": S}, {"j": T0}, T0 + 99 * S, execs, [])
    assert found == [] and figures["quiet_success"] == 1.0


def test_progress_is_judged_away_from_faults_only() -> None:
    """Half the fire times fall in a fault window and did not run: still progress."""
    rs = [rec("j", T0 + i * S) if i < 50 else rec("j", T0 + i * S, "missed",
                                                    reason="no_leader")
          for i in range(100)]
    execs = [ex(f"j@{T0 + i * S}", T0 / 1000 + i, T0 / 1000 + i + 0.1) for i in range(50)]
    fault = [(T0 / 1000 + 50 + promises.BEFORE_S, T0 / 1000 + 99)]
    _, found = promises.check_progress({"j": rs}, {"j": S}, {"j": T0}, T0 + 99 * S, execs, fault)
    assert found == []
    _, found = promises.check_progress({"j": rs}, {"j": S}, {"j": T0}, T0 + 99 * S, execs, [])
    assert [f["kind"] for f in found] == ["no_progress"]


def test_a_recovery_measured_as_an_outage_is_judged_by_the_outage_not_as_idleness() -> None:
    """A restart healed at 10 s whose cluster answered only at 30 s: the fire times up
    to OUTAGE_AFTER_S after the outage are not judged here (the strict share from the
    heal alone is still reported), and what did not succeed is listed by outcome."""
    rs = [rec("j", T0 + i * S) if not 10 <= i <= 31 else
          rec("j", T0 + i * S, "missed", reason="no_leader") for i in range(100)]
    execs = [ex(f"j@{T0 + i * S}", T0 / 1000 + i, T0 / 1000 + i + 0.1) for i in range(100)
             if not 10 <= i <= 31]
    fault = [(T0 / 1000 + 2, T0 / 1000 + 10 - promises.AFTER_S)]  # healed 5 s before 10
    outage = [(T0 / 1000 + 10, 20.0)]
    figures, found = promises.check_progress({"j": rs}, {"j": S}, {"j": T0}, T0 + 99 * S,
                                             execs, fault, outage)
    assert found == [] and figures["success"] == 1.0
    assert figures["quiet_success"] < promises.MIN_SUCCESS  # judged from the heal: fails
    # One more fire time missed after the recovery margin is judged, and named.
    late = 30 + int(promises.OUTAGE_AFTER_S) + 1
    rs2 = [r if r["scheduled_ms"] != T0 + late * S else
           rec("j", T0 + late * S, "missed", reason="coalesced") for r in rs]
    figures, _ = promises.check_progress({"j": rs2}, {"j": S}, {"j": T0}, T0 + 99 * S,
                                         execs, fault, outage)
    assert figures["not_succeeded"] == {"missed (coalesced)": 1}


def test_a_cluster_that_never_answers_makes_no_progress() -> None:
    """An outage over the whole history leaves nothing to judge: that is no progress."""
    rs = [rec("j", T0 + i * S, "missed", reason="no_leader") for i in range(100)]
    _, found = promises.check_progress({"j": rs}, {"j": S}, {"j": T0}, T0 + 99 * S, [], [],
                                       [(T0 / 1000 - 5, 200.0)])
    assert [f["kind"] for f in found] == ["no_progress"]


def test_fire_times_skipped_by_the_overlap_policy_count_as_work_not_idleness() -> None:
    """A job running 3 s every second under overlap = skip succeeds one fire in three."""
    rs = [rec("j", T0 + i * S) if i % 3 == 0 else
          rec("j", T0 + i * S, "skipped", reason="overlap") for i in range(99)]
    execs = [ex(f"j@{T0 + i * S}", T0 / 1000 + i, T0 / 1000 + i + 3) for i in range(0, 99, 3)]
    figures, found = promises.check_progress({"j": rs}, {"j": S}, {"j": T0}, T0 + 98 * S,
                                             execs, [])
    assert found == [] and figures["quiet_succeeded"] == 33
    skipped_only = [rec("j", T0 + i * S, "skipped", reason="overlap") for i in range(99)]
    _, found = promises.check_progress({"j": skipped_only}, {"j": S}, {"j": T0},
                                       T0 + 98 * S, execs, [])
    assert [f["kind"] for f in found] == ["no_progress"]


def test_two_runs_of_a_skip_job_at_once_are_found_attempts_of_one_run_are_not() -> None:
    execs = [ex(f"s@{T0}", 1.0, 3.0), ex(f"s@{T0 + S}", 2.0, 2.5, node="n2"),
             ex(f"a@{T0}", 1.0, 3.0), ex(f"a@{T0 + S}", 2.0, 2.5),
             ex(f"r@{T0}", 1.0, 3.0), ex(f"r@{T0}", 4.0, 5.0, fence=2)]
    found = promises.check_job_overlap({"s": "skip", "a": "allow", "r": "queue"}, execs)
    assert [(f["kind"], f["job"]) for f in found] == [("job_overlap", "s")]
    # A whole-node freeze turns it into the measured freeze window, as for attempts.
    frozen = checker.attribute_freezes(found, [("n1", 1.5, 2.4)])
    assert [f["kind"] for f in frozen] == ["freeze_window"]


def test_read_errors_away_from_faults_and_outages_are_unexplained() -> None:
    faults = [(100.0, 105.0)]
    outages = [(200.0, 3.0)]
    found = promises.check_read_errors([101.0, 104.0 + promises.AFTER_S, 202.0, 150.0], faults,
                                       outages)
    assert [f["t"] for f in found] == [150.0]


def test_a_heal_without_a_leader_after_it_is_found() -> None:
    assert promises.check_leader_returns([]) == []
    assert [f["kind"] for f in promises.check_leader_returns([12.5])] == \
        ["no_leader_after_heal"]
