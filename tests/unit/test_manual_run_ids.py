"""A fire time whose run id a kept record already holds is covered by that record, never
made a second time (core/heldids.py; found by tests/unit/test_state_machine.py in CI on
2026-12-06): two records never share one run id.

A manual run stamped ahead of the job's schedule (a trigger from a node whose clock is
ahead) takes ``job@<ms>``, an id that is no fire time of the schedule then; a put can
change the schedule so that this ms is one. A put of a one-shot ``at`` already past
lowers the mark to its instant, which a run of the old schedule may hold. The plan
covers such a fire time (version 6) once every member lists ``runids``; before that it
is planned as older releases did, and a plan of an older version is applied as written.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

from raftsched.core.cmdbase import COMMAND_VERSION, FEATURES, HELD_IDS_VERSION, PAST_AT_VERSION
from raftsched.core.codec import decode_command, decode_state, encode_command, encode_state
from raftsched.core.commands import Plan, RunFire
from raftsched.core.durations import format_timestamp
from raftsched.core.effects import FireCovered, PlanRejected, RangeMissed, RunCreated
from raftsched.core.leader import Capacity, LeaderContext, plan
from raftsched.core.machine import ClusterState
from raftsched.core.model import run_id_of

S = 1000
T0 = 20_000 * 86_400 * S


def _apply(st: ClusterState, cmd: Any) -> dict[str, Any]:
    """Apply ``cmd`` as a replica does (a command object through its wire bytes)."""
    if isinstance(cmd, Plan):
        cmd = decode_command(encode_command(cmd))
    reply = st.apply_map(cmd)
    assert reply["ok"], (cmd, reply)
    return reply


def _cluster(*, features: tuple[str, ...] | None = FEATURES,
             history_limit: int = 20) -> ClusterState:
    st = ClusterState(history_limit=history_limit)
    _apply(st, {"op": "leader", "at": T0, "node": "n1", "term": 1})
    for node in ("n1", "n2"):
        _apply(st, {"op": "heartbeat", "at": T0, "node": node, "boot": 1, "slots": 2,
                    "queue": 1, "tags": [], "api": "",
                    **({"features": list(features)} if features is not None else {})})
    return st


def _put(st: ClusterState, schedule: dict[str, Any], overlap: str = "allow",
         at: int = T0) -> None:
    _apply(st, {"op": "put_job", "at": at, "v": PAST_AT_VERSION, "spec": {
        "id": "j1", "schedule": schedule, "command": ["true"], "overlap": overlap}})


def _plan(st: ClusterState, now: int, term: int = 1) -> Plan | None:
    live = tuple(Capacity(node_id=n, tags=frozenset(), slots=2, limit=3, load=0)
                 for n in ("n1", "n2"))
    return plan(st, LeaderContext(node_id="n1", term=term, now_ms=now, lookahead_ms=0,
                                  since_ms=st.leader.since_ms, boot_ms=T0, live=live))


def _ids(st: ClusterState) -> list[str]:
    """Every run id the state keeps (live and history), one entry per run: a retry's
    earlier attempts keep its id, so they are left out."""
    ids = list(st.runs)
    ids += [r.run_id for r in st.history.get("j1", ()) if r.run_id not in st.runs
            and r.attempt == 1]
    return ids


def _stamped_ahead(st: ClusterState) -> str:
    """A manual run 5 s ahead (every 2 s: its ms is no fire time then), replaced at once
    by another trigger, so it is in the history; then every 1 s: now it is one."""
    _put(st, {"every": "2s"}, "replace")
    ahead = _apply(st, {"op": "trigger", "at": T0 + 5 * S, "job": "j1",
                        "force": False})["run_id"]
    _apply(st, {"op": "trigger", "at": T0, "job": "j1", "force": False})
    assert ahead == run_id_of("j1", T0 + 5 * S)
    assert ahead in {r.run_id for r in st.history["j1"]}
    _put(st, {"every": "1s"})
    return ahead


def test_a_fire_time_never_reuses_the_id_of_a_manual_run_stamped_ahead() -> None:
    st = _cluster()
    ahead = _stamped_ahead(st)
    st.take_effects()
    cmd = _plan(st, T0 + 5 * S)
    assert cmd is not None and cmd.v == HELD_IDS_VERSION
    assert RunFire("j1", T0 + 5 * S, None, False) in cmd.fires
    _apply(st, cmd)
    effects = st.take_effects()
    # 1..4 s coalesce into one missed range (policy once); 5 s is the manual run's.
    assert not [e for e in effects if isinstance(e, (RunCreated, PlanRejected))], effects
    assert [e for e in effects if isinstance(e, FireCovered)] == [FireCovered(ahead)]
    assert st.jobs["j1"].hwm_ms == T0 + 5 * S  # the fire time is accounted for
    assert [r.manual for r in st.history["j1"] if r.run_id == ahead] == [True]
    ids = _ids(st)
    assert len(ids) == len(set(ids)), ids
    # The next plan goes on after it.
    nxt = _plan(st, T0 + 6 * S)
    assert nxt is not None and nxt.v == COMMAND_VERSION
    _apply(st, nxt)
    assert [e.run_id for e in st.take_effects() if isinstance(e, RunCreated)] == [
        run_id_of("j1", T0 + 6 * S)]


def test_a_live_manual_run_covers_its_fire_time_instead_of_refusing_it_every_plan() -> None:
    st = _cluster()
    _put(st, {"every": "2s"})
    ahead = _apply(st, {"op": "trigger", "at": T0 + 5 * S, "job": "j1",
                        "force": False})["run_id"]
    _put(st, {"every": "1s"})
    assert ahead in st.runs
    cmd = _plan(st, T0 + 5 * S)
    assert cmd is not None and cmd.v == HELD_IDS_VERSION
    _apply(st, cmd)
    effects = st.take_effects()
    assert not any(isinstance(e, PlanRejected) for e in effects)
    assert st.jobs["j1"].hwm_ms == T0 + 5 * S
    assert st.runs[ahead].manual  # the manual run is the one that holds the id


def test_a_missed_range_starts_after_a_fire_time_a_kept_record_holds() -> None:
    """Fire times missed while no leader planned: the range's record would take the id
    of its first fire time, which the manual run holds."""
    st = _cluster()
    ahead = _stamped_ahead(st)
    cmd = _plan(st, T0 + 4 * S)  # runs 1..4 s: the mark stops below the held 5 s
    assert cmd is not None and cmd.v == COMMAND_VERSION
    _apply(st, cmd)
    later = T0 + 120 * S  # a new leader, long past the grace
    _apply(st, {"op": "leader", "at": later, "node": "n1", "term": 2})
    st.take_effects()
    cmd = _plan(st, later, term=2)
    assert cmd is not None and cmd.v == HELD_IDS_VERSION
    _apply(st, cmd)
    missed = [(r.scheduled_ms, r.until_ms) for r in st.history["j1"]
              if r.scheduled_ms > T0 + 4 * S]
    assert missed[0] == (T0 + 5 * S, None)  # the manual run, replaced at once
    assert missed[1][0] == T0 + 6 * S and missed[1][1] is not None, missed
    ids = _ids(st)
    assert len(ids) == len(set(ids)), ids
    assert [r for r in st.history["j1"] if r.run_id == ahead and not r.manual] == []
    assert st.jobs["j1"].hwm_ms >= T0 + 100 * S


def test_a_past_at_put_over_a_run_of_the_old_schedule_is_covered_by_that_run() -> None:
    """A one-shot ``at`` already past lowers the mark to its instant; the old schedule's
    run at that very ms holds the id."""
    st = _cluster()
    _put(st, {"every": "1s"})
    cmd = _plan(st, T0 + 3 * S)  # 1..2 s coalesce into a missed range, 3 s runs
    assert cmd is not None
    _apply(st, cmd)
    old = run_id_of("j1", T0 + S)
    assert [r.until_ms for r in st.history["j1"] if r.run_id == old] == [T0 + 2 * S]
    _put(st, {"at": format_timestamp(T0 + S)}, at=T0 + 3 * S)  # 2 s past
    assert st.jobs["j1"].hwm_ms == T0 + S - 1
    cmd = _plan(st, T0 + 3 * S)
    assert cmd is not None and cmd.v == HELD_IDS_VERSION
    st.take_effects()
    _apply(st, cmd)
    assert not [e for e in st.take_effects() if isinstance(e, RunCreated)]
    assert st.jobs["j1"].hwm_ms == T0 + S
    ids = _ids(st)
    assert len(ids) == len(set(ids)), ids


def test_until_every_member_lists_runids_the_plan_is_written_as_before() -> None:
    """A rolling upgrade: an older member would stop on a version 6 plan, so the plan is
    written and applied as that release did (it makes the second record)."""
    st = _cluster(features=tuple(f for f in FEATURES if f != "runids"))
    ahead = _stamped_ahead(st)
    cmd = _plan(st, T0 + 5 * S)
    assert cmd is not None and cmd.v == COMMAND_VERSION
    st.take_effects()
    _apply(st, cmd)
    assert ahead in [e.run_id for e in st.take_effects() if isinstance(e, RunCreated)]


def _paused_over_a_missed_range(st: ClusterState) -> str:
    """Paused, then a one-shot put on the ms of the old schedule's missed range (no
    clock ahead): resuming without catch-up records the paused fire times from there."""
    _put(st, {"every": "1s"})
    cmd = _plan(st, T0 + 3 * S)  # 1..2 s coalesce into a missed range, 3 s runs
    assert cmd is not None
    _apply(st, cmd)
    _apply(st, {"op": "pause", "at": T0 + 3 * S, "job": "j1"})
    _put(st, {"at": format_timestamp(T0 + S)}, at=T0 + 3 * S)
    return run_id_of("j1", T0 + S)


def _paused_after_its_first_run(st: ClusterState) -> None:
    """An every-second job whose first fire time (T0 + 1 s) was planned, then paused."""
    _put(st, {"every": "1s"})
    cmd = _plan(st, T0 + S)
    assert cmd is not None
    _apply(st, cmd)
    _apply(st, {"op": "pause", "at": T0 + S, "job": "j1"})


def test_a_resume_covers_a_paused_fire_time_whose_id_a_kept_record_holds() -> None:
    st = _cluster()
    held = _paused_over_a_missed_range(st)
    st.take_effects()
    _apply(st, {"op": "resume", "at": T0 + 4 * S, "job": "j1", "catch_up": False,
                "missed": 1, "v": HELD_IDS_VERSION})
    assert [e for e in st.take_effects() if isinstance(e, FireCovered)] == [FireCovered(held)]
    assert [r.run_id for r in st.history["j1"]].count(held) == 1
    assert st.jobs["j1"].hwm_ms == T0 + 4 * S


def test_a_resume_records_the_fire_times_after_a_covered_one_whatever_its_count() -> None:
    """The count a node puts in a resume is its own estimate (its clock, before the
    leader stamps the command): covering 5 s must not leave 6 s and 7 s unrecorded."""
    st = _cluster()
    ahead = _stamped_ahead(st)  # the manual run holds 5 s
    cmd = _plan(st, T0 + 4 * S)
    assert cmd is not None
    _apply(st, cmd)
    _apply(st, {"op": "pause", "at": T0 + 4 * S, "job": "j1"})
    st.take_effects()
    _apply(st, {"op": "resume", "at": T0 + 7 * S, "job": "j1", "catch_up": False,
                "missed": 1, "v": HELD_IDS_VERSION})
    effects = st.take_effects()
    assert FireCovered(ahead) in effects
    ranges = [(e.first_ms, e.last_ms, e.fire_count) for e in effects
              if isinstance(e, RangeMissed)]
    assert ranges == [(T0 + 6 * S, T0 + 7 * S, 2)], ranges  # counted by the apply
    assert st.jobs["j1"].hwm_ms == T0 + 7 * S


def test_a_v6_resume_records_its_range_even_when_the_node_counted_none() -> None:
    """A node that had not applied the pause yet counts 0: a v6 resume counts the range
    itself, so the paused fire times still get their record (a v2 resume records none)."""
    for v, expected in ((HELD_IDS_VERSION, [(T0 + 2 * S, T0 + 4 * S, 3)]),
                        (COMMAND_VERSION, [])):
        st = _cluster()
        _paused_after_its_first_run(st)
        st.take_effects()
        _apply(st, {"op": "resume", "at": T0 + 4 * S, "job": "j1", "catch_up": False,
                    "missed": 0, "v": v})
        ranges = [(e.first_ms, e.last_ms, e.fire_count) for e in st.take_effects()
                  if isinstance(e, RangeMissed)]
        assert ranges == expected, (v, ranges)


def test_an_older_resume_is_applied_as_it_was_written() -> None:
    st = _cluster()
    held = _paused_over_a_missed_range(st)
    _apply(st, {"op": "resume", "at": T0 + 4 * S, "job": "j1", "catch_up": False,
                "missed": 1, "v": COMMAND_VERSION})
    assert [r.run_id for r in st.history["j1"]].count(held) == 2


def test_what_the_leader_covers_stays_covered_when_the_plan_evicts_the_holder() -> None:
    """History of one: the plan's own missed range (1..4 s) pushes the manual run out of
    the history before the covered item applies. The item is still covered (found
    before any item applies), on a live replica and on one restored from a snapshot
    alike, byte for byte."""
    st = _cluster(history_limit=1)
    ahead = _stamped_ahead(st)
    back = decode_state(encode_state(st))
    assert back.held_ahead == st.held_ahead
    cmd = _plan(st, T0 + 5 * S)
    assert cmd is not None and cmd.v == HELD_IDS_VERSION
    for replica in (st, back):
        replica.take_effects()
        _apply(replica, cmd)
        effects = replica.take_effects()
        assert FireCovered(ahead) in effects
        assert not [e for e in effects if isinstance(e, RunCreated)]
        assert ahead not in replica.runs
    assert encode_state(st) == encode_state(back)


def test_an_older_plan_is_applied_as_it_was_written() -> None:
    """Replaying a log: a v2 plan that made such a run makes it again (as the release
    that wrote it did), so every replica's state stays the same."""
    st = _cluster()
    ahead = _stamped_ahead(st)
    cmd = _plan(st, T0 + 5 * S)
    assert cmd is not None
    st.take_effects()
    _apply(st, cmd.__class__(**{**{f: getattr(cmd, f) for f in (
        "at", "term", "leader", "fires", "place", "drop", "next", "versions")},
        "v": COMMAND_VERSION}))
    assert ahead in [e.run_id for e in st.take_effects() if isinstance(e, RunCreated)]


def test_the_filter_is_rebuilt_from_a_snapshot() -> None:
    st = _stamped_ahead_state()
    back = decode_state(encode_state(st))
    assert back.held_ahead == st.held_ahead == {"j1": T0 + 5 * S}
    cmd = _plan(back, T0 + 5 * S)
    assert cmd is not None and cmd.v == HELD_IDS_VERSION


def _stamped_ahead_state() -> ClusterState:
    st = _cluster()
    _stamped_ahead(st)
    return st


class _Writes:
    """The node's client writes over a plain state: what it submits, applied."""

    def __init__(self, st: ClusterState) -> None:
        self.st = st
        self.sent: list[Any] = []

    async def submit(self, cmd: Any, rid: Any = None) -> dict[str, Any]:
        cmd = replace(cmd, at=T0 + 4 * S).written()
        self.sent.append(cmd)
        return self.st.apply(cmd)


def _resume_through_the_node(st: ClusterState) -> Any:
    from raftsched.node.config.config import Limits
    from raftsched.node.service.jobops import JobOps
    from tests.unit.test_read_chunks import _Caught, _Replica

    writes = _Writes(st)
    ops = JobOps(raft=_Replica(st), writes=writes, reads=_Caught(),  # type: ignore[arg-type]
                 limits=Limits(), allowed_call_prefixes=lambda: None)
    answer = asyncio.run(ops.resume({"id": "j1"}))
    (cmd,) = writes.sent
    return cmd, answer


def test_a_node_writes_resume_as_version_6_once_every_member_lists_runids() -> None:
    st = _cluster()
    held = _paused_over_a_missed_range(st)
    cmd, answer = _resume_through_the_node(st)
    assert cmd.v == HELD_IDS_VERSION
    assert [r.run_id for r in st.history["j1"]].count(held) == 1
    # The answer says what was recorded: the one paused fire time was covered, not
    # skipped (the node's own count, from its clock, said 1).
    assert cmd.missed == 1
    assert answer["skipped_fire_times"] == 0


def test_a_node_writes_resume_as_before_while_a_member_does_not_list_runids() -> None:
    st = _cluster(features=tuple(f for f in FEATURES if f != "runids"))
    _paused_over_a_missed_range(st)
    cmd, answer = _resume_through_the_node(st)
    assert cmd.v == COMMAND_VERSION
    assert answer["skipped_fire_times"] == cmd.missed == 1  # the estimate, as before


def test_a_node_answers_a_resume_with_the_count_the_state_recorded() -> None:
    """The node counts with its own clock before the leader stamps the resume (here a
    clock years past the pause): a v6 answer says what was recorded, 2..4 s."""
    st = _cluster()
    _paused_after_its_first_run(st)
    st.take_effects()
    sent, answer = _resume_through_the_node(st)
    (missed,) = [e for e in st.take_effects() if isinstance(e, RangeMissed)]
    assert missed.fire_count == 3
    assert sent.missed > 1_000_000  # the node's estimate
    assert answer["skipped_fire_times"] == 3


def test_a_resume_that_finds_the_job_resumed_already_answers_none_skipped() -> None:
    """Two clients resume the same job at once: both nodes read it paused and counted;
    the second resume to apply changes nothing and says so."""
    st = _cluster()
    _paused_after_its_first_run(st)

    class _Raced(_Writes):
        async def submit(self, cmd: Any, rid: Any = None) -> dict[str, Any]:
            first = replace(cmd, at=T0 + 4 * S).written()
            self.st.apply(first)  # the other client's resume applies first
            return await super().submit(cmd, rid)

    from raftsched.node.config.config import Limits
    from raftsched.node.service.jobops import JobOps
    from tests.unit.test_read_chunks import _Caught, _Replica

    ops = JobOps(raft=_Replica(st), writes=_Raced(st), reads=_Caught(),  # type: ignore[arg-type]
                 limits=Limits(), allowed_call_prefixes=lambda: None)
    answer = asyncio.run(ops.resume({"id": "j1"}))
    assert answer["skipped_fire_times"] == 0


def _run_through(st: ClusterState, run_id: str) -> None:
    """Place (if pending), start and finish ``run_id``: it leaves the live runs for the
    history."""
    run = st.runs[run_id]
    at = T0 + S
    if run.state == "pending":
        _apply(st, {"op": "plan", "at": at, "term": 1, "leader": "n1",
                    "place": [[run_id, "n2"]]})
    run = st.runs[run_id]
    _apply(st, {"op": "start", "at": at, "node": run.node, "items": [[run_id, run.fence]]})
    _apply(st, {"op": "finish", "at": at, "node": run.node,
                "items": [[run_id, run.fence, "succeeded", 0, "", ""]]})


def test_the_filter_is_rebuilt_from_a_live_run_alone_and_from_history_alone() -> None:
    """A restore asks only the jobs with a kept record (a live run or a history): one
    holding its instant ahead in a live run and no history, and one holding it in its
    history and no live run, are each found."""
    live = _cluster()
    _put(live, {"every": "2s"})
    ahead = _apply(live, {"op": "trigger", "at": T0 + 5 * S, "job": "j1",
                          "force": False})["run_id"]
    assert ahead in live.runs and "j1" not in live.history
    kept = _stamped_ahead_state()
    for run_id in list(kept.jobs["j1"].active):
        _run_through(kept, run_id)
    assert not kept.jobs["j1"].active and kept.history["j1"]
    for st in (live, kept):
        assert st.held_ahead == {"j1": T0 + 5 * S}
        assert decode_state(encode_state(st)).held_ahead == st.held_ahead
