"""A hypothesis state machine driving ClusterState with random interleavings of every
command (plans made by raftsched.core.leader.plan, stale and duplicate plans, stale fences,
releases, restarts, restores) and checking the claim invariants after every step."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from raftsched.core.cmdbase import FEATURES, HELD_IDS_VERSION
from raftsched.core.codec import decode_command, decode_state, encode_command, encode_state
from raftsched.core.commands import FINISH_OUTCOMES as _FINISH_OUTCOMES
from raftsched.core.commands import Plan
from raftsched.core.effects import (
    ClaimRefused,
    JobRemoved,
    PlanRejected,
    RangeMissed,
    RunAssigned,
    RunCreated,
)
from raftsched.core.leader import Capacity, LeaderContext, plan
from raftsched.core.machine import ClusterState
from raftsched.core.model import job_of_run
from tests.support.budget import examples
from tests.support.stateutil import forget_refusal, state_bytes

pytestmark = pytest.mark.timeout(60)

S = 1000
T0 = 20_000 * 86_400 * S
HISTORY_LIMIT = 6
JOBS = ("j1", "j2", "j3")
NODES = ("n1", "n2", "n3")
SCHEDULES = [{"every": "1s"}, {"every": "2s"}, {"every": "5s"}, {"every": "10s"},
             {"every": "30s", "offset": "7s"}, {"cron": "*/3 * * * * *"},
             {"cron": "* * * * *", "tz": "Europe/Berlin"}]
#: Time steps: round seconds often (so triggers land on fire times), odd ms too.
STEP_MS = st.sampled_from([0, 500, 1000, 2000, 5000, 10_000]) | st.integers(0, 20_000)
GARBAGE: list[Any] = [
    None, [], {"op": "plan", "at": T0}, {"op": "start", "at": T0, "node": 5},
    {"op": "put_job", "at": T0, "spec": {"id": "bad id"}},
    {"op": "trigger", "at": T0, "job": "nope"}, {"op": "release", "at": T0, "node": "ghost"},
    {"op": "heartbeat", "at": T0, "node": "n1", "boot": -1, "slots": 1, "queue": 0},
    {"op": "finish", "at": -5, "node": "n1", "items": []},
    {"op": "plan", "at": T0, "term": 0, "fires": "x"},
]



class SchedulerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.st = ClusterState(history_limit=HISTORY_LIMIT)
        self.log: list[Any] = []
        self.now = T0
        self.max_fence = 0
        self.fences: dict[str, list[int]] = {}        # run id -> every fence it was given
        self.created: dict[str, set[str]] = {j: set() for j in JOBS}
        self.marks: dict[str, int] = {}               # job -> highest mark seen
        self.plans: list[Plan] = []
        self.boots: dict[str, int] = {}
        self.steps = 0

    # ----------------------------------------------------------------- apply

    def apply(self, cmd: Any) -> dict[str, Any]:
        st = self.st
        st.take_effects()
        before = state_bytes(st)
        history_ids = {j: Counter(h.run_id for h in hist) for j, hist in st.history.items()}
        live_ids = set(st.runs)
        reply = st.apply_map(cmd)
        self.log.append(cmd)
        assert isinstance(reply, dict) and isinstance(reply.get("ok"), bool)
        if not reply["ok"]:
            # (d) a rejected command changes nothing.
            assert reply["error"]["code"] != "internal", (cmd, reply)
            remembered = dict(st.dedupe)
            forget_refusal(st, cmd, reply)
            assert state_bytes(st) == before, cmd
            st.dedupe.clear()
            st.dedupe.update(remembered)
            assert all(isinstance(e, (ClaimRefused, PlanRejected)) for e in st.effects)
        for effect in st.take_effects():
            if isinstance(effect, RunAssigned):
                # (b) fences strictly increase.
                run_id, fence = effect.run_id, effect.fence
                assert fence > self.max_fence, (effect, self.max_fence)
                self.max_fence = fence
                self.fences.setdefault(run_id, []).append(fence)
            elif isinstance(effect, RunCreated):
                # (a) a run id never reuses the id of a live run or of a history record;
                # a fire time of the schedule is created at most once per job (incarnation)
                # (a manual run's id is only unique among the runs the state still holds).
                run_id = effect.run_id
                job = job_of_run(run_id)
                assert run_id not in live_ids, ("id of a live run", run_id, cmd)
                assert run_id not in history_ids.get(job, set()), ("id in history", run_id)
                if isinstance(cmd, Plan):
                    assert run_id not in self.created[job], ("created twice", run_id, cmd)
                    self.created[job].add(run_id)
            elif isinstance(effect, RangeMissed):
                # (a) also for a range's record: a new one never takes a kept id (a
                # range that grew keeps its own record).
                run_id = effect.run_id
                job = job_of_run(run_id)
                before_n = history_ids.get(job, Counter())[run_id]
                after_n = sum(h.run_id == run_id for h in st.history.get(job, ()))
                assert not (before_n and after_n > before_n), ("range id kept", run_id, cmd)
                assert run_id not in live_ids, ("range id of a live run", run_id, cmd)
            elif isinstance(effect, JobRemoved):
                self.created[effect.job_id] = set()
                self.marks.pop(effect.job_id, None)
        return reply

    # ----------------------------------------------------------------- rules

    @initialize(scheds=st.lists(st.sampled_from(SCHEDULES), min_size=2, max_size=2),
                overlaps=st.lists(st.sampled_from(["skip", "allow", "queue", "replace"]),
                                  min_size=2, max_size=2))
    def setup(self, scheds: list[dict[str, Any]], overlaps: list[str]) -> None:
        self.apply({"op": "leader", "at": self.now, "node": "n1", "term": 1})
        for node in NODES[:2]:
            self.heartbeat(node, False, 2, 1, node == "n2")
        for job, sched, overlap in zip(JOBS, scheds, overlaps, strict=False):
            self.apply({"op": "put_job", "at": self.now, "spec": {
                "id": job, "schedule": sched, "command": ["true"], "overlap": overlap,
                "retries": {"max": 1, "backoff": "1s"}}})

    @rule(ms=STEP_MS)
    def advance(self, ms: int) -> None:
        self.now += ms

    @rule(job=st.sampled_from(JOBS), sched=st.sampled_from(SCHEDULES),
          overlap=st.sampled_from(["skip", "allow", "queue", "replace"]),
          policy=st.sampled_from(["skip", "once", "all"]),
          grace=st.sampled_from(["0s", "3s", "20s", "1m"]),
          retries=st.integers(0, 2), lost=st.sampled_from(["retry", "fail"]),
          tags=st.sampled_from([[], ["gpu"]]), paused=st.booleans(),
          rid=st.none() | st.sampled_from(["r1", "r2"]),
          skew=st.sampled_from([0, 0, 0, -1000, 1000]))
    def put_job(self, job: str, sched: dict[str, Any], overlap: str, policy: str,
                grace: str, retries: int, lost: str, tags: list[str], paused: bool,
                rid: str | None, skew: int) -> None:
        spec = {"id": job, "schedule": sched, "command": ["true"], "overlap": overlap,
                "misfire": {"policy": policy, "grace": grace, "max_catchup": 3},
                "retries": {"max": retries, "backoff": "1s"}, "on_node_lost": lost,
                "tags": tags}
        if paused:
            spec["paused"] = False  # explicit default
        # skew: stamped by another node whose clock differs a little.
        cmd: dict[str, Any] = {"op": "put_job", "at": self.now + skew, "spec": spec}
        if rid is not None:
            cmd["rid"] = rid
        self.apply(cmd)

    @rule(jobs=st.lists(st.sampled_from(JOBS), min_size=1, max_size=3),
          sched=st.sampled_from(SCHEDULES), bad=st.booleans(), max_jobs=st.sampled_from([2, 99]))
    def put_jobs_atomic(self, jobs: list[str], sched: dict[str, Any], bad: bool,
                        max_jobs: int) -> None:
        """A job file: all of it or nothing (a bad last spec, an id twice, no room)."""
        specs = [{"id": j, "schedule": sched, "command": ["true"]} for j in jobs]
        if bad:
            specs[-1]["overlap"] = "sometimes"
        before = {j: (r.version, r.spec) for j, r in self.st.jobs.items()}
        reply = self.apply({"op": "put_jobs", "at": self.now, "atomic": True,
                            "max_jobs": max_jobs, "specs": specs})
        if bad or len(set(jobs)) < len(jobs):
            assert not reply["ok"], reply
        if not reply["ok"]:
            assert {j: (r.version, r.spec) for j, r in self.st.jobs.items()} == before
        else:
            assert all(r["ok"] for r in reply["results"])

    @rule(job=st.sampled_from(JOBS))
    def delete_job(self, job: str) -> None:
        self.apply({"op": "delete_job", "at": self.now, "job": job})

    @rule(job=st.sampled_from(JOBS))
    def pause(self, job: str) -> None:
        self.apply({"op": "pause", "at": self.now, "job": job})

    @rule(job=st.sampled_from(JOBS), catch_up=st.booleans(), missed=st.integers(0, 5))
    def resume(self, job: str, catch_up: bool, missed: int) -> None:
        # As a node writes it once every member lists ``runids``.
        self.apply({"op": "resume", "at": self.now, "job": job, "catch_up": catch_up,
                    "missed": missed, "v": HELD_IDS_VERSION})

    @rule(job=st.sampled_from(JOBS), force=st.booleans(),
          offset=st.sampled_from([0, 1000, 2000, 5000]) | st.integers(0, 3000))
    def trigger(self, job: str, force: bool, offset: int) -> None:
        # offset: a trigger stamped a little ahead (another node's clock), so it may land
        # on a future fire time.
        self.apply({"op": "trigger", "at": self.now + offset, "job": job, "force": force})

    @rule(node=st.sampled_from(NODES), new_boot=st.booleans(), slots=st.integers(0, 3),
          queue=st.integers(0, 2), gpu=st.booleans())
    def heartbeat(self, node: str, new_boot: bool, slots: int, queue: int, gpu: bool) -> None:
        boot = self.boots.get(node, 1) + (1 if new_boot else 0)
        self.boots[node] = boot
        # Every release since the members' features lists them (so the plan covers a
        # fire time a kept record holds: core/heldids.py).
        self.apply({"op": "heartbeat", "at": self.now, "node": node, "boot": boot,
                    "slots": slots, "queue": queue, "tags": ["gpu"] if gpu else [],
                    "api": "", "features": list(FEATURES)})

    @rule(node=st.sampled_from(NODES), delta=st.sampled_from([-1, 0, 0, 1, 1]))
    def leader(self, node: str, delta: int) -> None:
        lead = self.st.leader.to_row()
        term = max(lead["term"] + delta, 0)
        reply = self.apply({"op": "leader", "at": self.now, "node": node, "term": term})
        # One leader per term: a record for the current term by another node is refused.
        assert reply["ok"] == (term > lead["term"] or (
            term == lead["term"] and lead["node"] in (None, node)))

    @rule(data=st.data(), lookahead=st.sampled_from([0, 0, 500, 2000]),
          older=st.integers(0, 9), ms=STEP_MS)
    def leader_plan(self, data: st.DataObject, lookahead: int, older: int, ms: int) -> None:
        self.now += ms
        s = self.st
        live = []
        for node_id, rec in sorted(s.nodes.items()):
            if not rec.alive or data.draw(st.integers(0, 4), label=f"skip {node_id}") == 0:
                continue
            live.append(Capacity(node_id=node_id, tags=frozenset(rec.tags), slots=rec.slots,
                                 limit=rec.slots + rec.queue,
                                 load=len(s.by_node.get(node_id, ()))))
        term = s.leader.term - (1 if older == 0 and s.leader.term > 0 else 0)
        ctx = LeaderContext(node_id=s.leader.node or "n1", term=term, now_ms=self.now,
                            lookahead_ms=lookahead, since_ms=s.leader.since_ms,
                            boot_ms=T0, live=tuple(live))
        before = state_bytes(s)
        cmd = plan(s, ctx)
        assert state_bytes(s) == before, "plan() must not mutate the state"
        if cmd is None:
            return
        reply = self.apply(cmd)
        # Only the recorded leader, in its own term, plans.
        assert reply["ok"] == (term == s.leader.term and ctx.node_id == s.leader.node)
        self.plans.append(cmd)

    @rule(data=st.data(), ms=st.integers(0, 3_000))
    def leader_plan_again(self, data: st.DataObject, ms: int) -> None:
        self.leader_plan(data, 0, 1, ms)

    @precondition(lambda self: bool(self.plans))
    @rule(data=st.data())
    def reapply_old_plan(self, data: st.DataObject) -> None:
        old = data.draw(st.sampled_from(self.plans), label="old plan")
        self.apply(old)

    def _pick_run(self, data: st.DataObject) -> str | None:
        ids = sorted(set(self.st.runs) | set(self.fences))
        if not ids:
            return None
        return data.draw(st.sampled_from(ids), label="run")

    def _pick_fence(self, data: st.DataObject, run_id: str) -> int:
        run = self.st.runs.get(run_id)
        options = list(self.fences.get(run_id, [])) + [0, self.max_fence + 1]
        if run is not None:
            options += [run.fence, run.fence, run.fence - 1]
        return data.draw(st.sampled_from(options), label="fence")

    def _pick_node(self, data: st.DataObject, run: Any) -> str:
        own = [run.node] * 3 if run is not None and run.node is not None else []
        return data.draw(st.sampled_from(own + list(NODES)), label="node")

    def _pick_claim(self, data: st.DataObject) -> tuple[str, int, Any, str] | None:
        """A run id (maybe unknown), a fence (maybe stale), its record, a node."""
        run_id = self._pick_run(data)
        if run_id is None:
            return None
        fence = self._pick_fence(data, run_id)
        run = self.st.runs.get(run_id)
        return run_id, fence, run, self._pick_node(data, run)

    @rule(data=st.data())
    def start(self, data: st.DataObject) -> None:
        picked = self._pick_claim(data)
        if picked is None:
            return
        run_id, fence, run, node = picked
        expected = (run is not None and run.state == "assigned" and run.node == node
                    and run.fence == fence)
        reply = self.apply({"op": "start", "at": self.now, "node": node,
                            "items": [[run_id, fence]]})
        # (c) only the current fence, from the assigned node, starts a run.
        assert reply["results"][0][0] is expected, (run_id, fence, node)

    @rule(data=st.data(), outcome=st.sampled_from(
        ["succeeded", "failed", "timed_out", "shed", "cancelled", "lost", "bogus"]))
    def finish(self, data: st.DataObject, outcome: str) -> None:
        picked = self._pick_claim(data)
        if picked is None:
            return
        run_id, fence, run, node = picked
        expected = (run is not None and run.node == node and run.fence == fence
                    and outcome in _FINISH_OUTCOMES
                    and (run.state == "started" or (run.state == "assigned"
                                                    and outcome in ("shed", "cancelled"))))
        reply = self.apply({"op": "finish", "at": self.now, "node": node,
                            "items": [[run_id, fence, outcome, 1, "out", "why"]]})
        assert reply["results"][0][0] is expected, (run_id, fence, node, outcome)

    def _in_state(self, state: str) -> list[str]:
        return sorted(r for r, run in self.st.runs.items() if run.state == state)

    @precondition(lambda self: bool(self._in_state("assigned")))
    @rule(data=st.data())
    def start_current(self, data: st.DataObject) -> None:
        """The worker's normal path: start an assigned run with its current fence."""
        run = self.st.runs[data.draw(st.sampled_from(self._in_state("assigned")))]
        reply = self.apply({"op": "start", "at": self.now, "node": run.node,
                            "items": [[run.run_id, run.fence]]})
        assert reply["results"] == [(True, run.fence)]

    @precondition(lambda self: bool(self._in_state("started")))
    @rule(data=st.data(), outcome=st.sampled_from(["succeeded", "failed", "timed_out"]))
    def finish_current(self, data: st.DataObject, outcome: str) -> None:
        run = self.st.runs[data.draw(st.sampled_from(self._in_state("started")))]
        run_id, fence, node = run.run_id, run.fence, run.node
        reply = self.apply({"op": "finish", "at": self.now, "node": node,
                            "items": [[run_id, fence, outcome, 0, "", ""]]})
        assert reply["results"] == [(True, fence)]
        # A second report with the same fence is refused (the claim is gone).
        again = self.apply({"op": "finish", "at": self.now, "node": node,
                            "items": [[run_id, fence, outcome, 0, "", ""]]})
        assert again["results"][0][0] is False

    @rule(node=st.sampled_from(NODES), scope=st.sampled_from(["assigned", "all"]),
          stale=st.sampled_from([False, False, False, True]))
    def release(self, node: str, scope: str, stale: bool) -> None:
        known = node in self.st.nodes
        lead = self.st.leader.to_row()
        # stale: a deposed leader's release, proposed in an older term.
        term = lead["term"] - 1 if stale else lead["term"]
        reply = self.apply({"op": "release", "at": self.now, "node": node, "scope": scope,
                            "reason": "test", "term": term, "leader": lead["node"]})
        assert reply["ok"] == (known and not stale and lead["node"] is not None)
        if not reply["ok"]:
            return
        if known:
            left = [self.st.runs[r].state for r in self.st.by_node.get(node, ())]
            assert "assigned" not in left
            if scope == "all":
                assert not left and not self.st.nodes[node].alive

    @rule(cmd=st.sampled_from(GARBAGE))
    def garbage(self, cmd: Any) -> None:
        assert self.apply(cmd)["ok"] is False

    @rule()
    def restore(self) -> None:
        """Continue from a snapshot (as a restarted replica would)."""
        blob = encode_state(self.st)
        back = decode_state(blob)
        assert encode_state(back) == blob
        self.st = back

    # ----------------------------------------------------------------- invariants

    @invariant()
    def indexes_consistent(self) -> None:
        # (e)
        s = self.st
        by_node: dict[str, set[str]] = {}
        for run_id, run in s.runs.items():
            assert run.run_id == run_id
            assert run.state in ("pending", "queued", "assigned", "started"), run.state
            rec = s.jobs[run.job_id]
            assert run_id in rec.active
            if run.state in ("assigned", "started"):
                assert run.node is not None and run.fence > 0
                by_node.setdefault(run.node, set()).add(run_id)
                assert s.nodes[run.node].alive
            if rec.spec.paused:
                assert run.state == "started" or run.manual, (run_id, run.state)
        assert {n: ids for n, ids in s.by_node.items() if ids} == by_node
        assert set(s.pending) == {r for r, run in s.runs.items() if run.state == "pending"}
        for job_id, rec in s.jobs.items():
            assert len(rec.active) == len(set(rec.active))
            assert all(r in s.runs and s.runs[r].job_id == job_id for r in rec.active)
            queued = [r for r in rec.active if s.runs[r].state == "queued"]
            assert len(queued) <= 1
            if queued:
                assert len(rec.active) > 1, "a queued run with nothing ahead of it is stuck"
            # The mark never goes down.
            assert rec.hwm_ms >= self.marks.get(job_id, rec.hwm_ms)
            self.marks[job_id] = rec.hwm_ms
        assert s.fence == self.max_fence

    @invariant()
    def history_bounded(self) -> None:
        # (f)
        for job_id, hist in self.st.history.items():
            assert job_id in self.st.jobs
            assert len(hist) <= HISTORY_LIMIT

    @invariant()
    def snapshot_round_trip(self) -> None:
        self.steps += 1
        if self.steps % 7 == 0:
            blob = encode_state(self.st)
            assert encode_state(decode_state(blob)) == blob

    def teardown(self) -> None:
        # (g) replaying the same log on a fresh state gives the same bytes; so does
        # replaying it as a journal would (its bytes, decoded): typed commands (the
        # plans) and maps alike.
        fresh = ClusterState(history_limit=HISTORY_LIMIT)
        journal = ClusterState(history_limit=HISTORY_LIMIT)
        for cmd in self.log:
            fresh.apply_map(cmd)
            journal.apply_map(decode_command(encode_command(cmd)) if isinstance(cmd, (dict, Plan))
                          else cmd)
        assert encode_state(fresh) == encode_state(self.st)
        assert encode_state(journal) == encode_state(self.st)
        blob = encode_state(self.st)
        assert encode_state(decode_state(blob)) == blob


SchedulerMachine.TestCase.settings = settings(
    max_examples=examples(200), stateful_step_count=50, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
test_scheduler_state_machine = SchedulerMachine.TestCase
