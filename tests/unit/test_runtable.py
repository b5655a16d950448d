"""Run states change in one place, by one table: illegal moves are refused and change
nothing, legal ones keep the indexes in step."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from raftsched.core.codec import encode_state
from raftsched.core.machine import ClusterState
from raftsched.core.model import ACTIVE_STATES, RunState
from raftsched.core.records import RunRecord
from raftsched.core.runtable import LEGAL, may, transition

pytestmark = pytest.mark.timeout(60)

PKG = Path(__file__).resolve().parents[2] / "raftsched" / "core"


def _state_with(run_state: RunState) -> tuple[ClusterState, RunRecord]:
    st = ClusterState()
    run = RunRecord(run_id="j@1", job_id="j", scheduled_ms=1, created_ms=1,
                    state=run_state.value, node="n1" if run_state.value in (
                        "assigned", "started") else None, fence=1)
    st.runs[run.run_id] = run
    if run_state is RunState.pending:
        st.pending[run.run_id] = None
    if run.node is not None:
        st.by_node["n1"] = {run.run_id}
    return st, run


def test_the_table_covers_the_active_states_and_ends_in_terminal_ones() -> None:
    assert set(LEGAL) == set(ACTIVE_STATES)
    for targets in LEGAL.values():
        assert RunState.queued not in targets  # a run is queued only when created


@pytest.mark.parametrize("frm", sorted(ACTIVE_STATES))
@pytest.mark.parametrize("to", sorted(RunState))
def test_every_pair_is_refused_or_applied_with_indexes_in_step(frm: RunState,
                                                               to: RunState) -> None:
    st, run = _state_with(frm)
    before = (run.state, run.node, list(run.transitions), dict(st.pending),
              {k: set(v) for k, v in st.by_node.items()})
    node = "n2" if to in (RunState.assigned,) else None
    kwargs = {"node": node} if node is not None else {}
    done = transition(st.table, run, to, 5, "why", **kwargs)
    assert done == (to in LEGAL[frm]) == may(_state_with(frm)[1], to)
    if not done:
        assert (run.state, run.node, list(run.transitions), dict(st.pending),
                {k: set(v) for k, v in st.by_node.items()}) == before
        return
    assert run.state == to.value and run.transitions[-1][1] == to.value
    assert (run.run_id in st.pending) == (to is RunState.pending)
    holders = {n for n, ids in st.by_node.items() if run.run_id in ids}
    assert holders == ({run.node} if to in (RunState.assigned, RunState.started) else set())


def test_terminal_states_never_move() -> None:
    st, run = _state_with(RunState.started)
    assert st.table.move(run, RunState.succeeded, 5)
    for to in RunState:
        assert not st.table.move(run, to, 6)


def test_a_refused_finish_outcome_is_a_refused_item_not_an_error() -> None:
    """A started run cannot be 'missed': the finish item is refused, the state kept."""
    from tests.support.stateutil import base, put  # the state tests' helpers

    st = base()
    put(st, "j")
    st.apply_map({"op": "trigger", "at": 10, "job": "j"})
    run_id = next(iter(st.runs))
    st.apply_map({"op": "plan", "at": 10, "term": st.leader.term, "leader": st.leader.node,
              "place": [[run_id, "n1"]]})
    fence = st.runs[run_id].fence
    assert st.apply_map({"op": "start", "at": 11, "node": "n1", "items": [[run_id, fence]]})[
        "results"] == [(True, fence)]
    before = encode_state(st)
    reply = st.apply_map({"op": "finish", "at": 12, "node": "n1",
                      "items": [[run_id, fence, "missed", None, "", ""]]})
    assert reply["ok"] and reply["results"] == [(False, fence)]
    st.applied -= 1
    assert encode_state(st) == before


def test_run_states_are_assigned_only_by_transition() -> None:
    """No core module but runtable.py sets an active run's state (a history copy of
    an ended attempt, and a record's constructor, set it where the record is built)."""
    pattern = re.compile(r"\b(\w+)\.state = ")
    for path in PKG.glob("*.py"):
        for m in pattern.finditer(path.read_text(encoding="utf-8")):
            assert path.name == "runtable.py" or m.group(1) == "attempt" or (
                path.name, m.group(1)) == ("records.py", "self"), (path.name, m[0])


def test_only_the_run_table_changes_runs_indexes_and_the_fence() -> None:
    """The claim handlers and the state go through RunTable's methods: no module that
    handles a ClusterState adds or removes runs, edits the pending/by_node indexes or
    bumps the fence (the snapshot restore in codec.py rebuilds the table: aside)."""
    writes = re.compile(r"\b(?:st|self)\.(?:runs|pending|by_node|fence)\b\s*(?:\[[^\]]*\]\s*=(?!=)"
                        r"|\.(?:pop|setdefault|clear|update)\(|\+=|=(?!=))")
    for name in ("state.py", "jobs.py", "nodes.py", "claims.py", "apply.py", "leader.py",
                 "misses.py", "members.py", "notify.py"):
        path = PKG / name
        for m in writes.finditer(path.read_text(encoding="utf-8")):
            raise AssertionError((path.name, m[0]))
