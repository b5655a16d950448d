"""Issue 29 papercut: the live feed of ``raftsched local`` printed three lines per run
and every leader change once per node, and ``run.start_rejected ... current_fence=None``
after a restart (the quorum's loss, which it did not show, is
tests/cluster/test_live_feed.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from raftsched.core.effects import ClaimRefused
from raftsched.faces.local import format_event
from raftsched.node.observe import eventpolicy, events

pytestmark = pytest.mark.timeout(30)

RUN = "tick@1796340104000"


def line(**ev: Any) -> str:
    return json.dumps(dict({"ts_ms": 1796340104003}, **ev))


def test_a_run_is_two_feed_lines_its_start_and_its_end() -> None:
    story = [("n3", line(event="run.started", node="n3", run_id=RUN, fence=1, attempt=1)),
             ("n3", line(event="run.finished", node="n3", run_id=RUN, outcome="succeeded",
                         fence=1, exit_code=0)),
             ("n2", line(event="run.ended", node="n2", run_id=RUN, outcome="succeeded",
                         ran_on="n3", reason="exit 0"))]
    shown = [text for text in (format_event(n, raw) for n, raw in story) if text]
    assert [t.split()[2] for t in shown] == ["run.started", "run.ended"], shown
    assert "-> succeeded ran_on=n3" in shown[1]


def test_a_leader_change_is_one_line_from_the_new_leader() -> None:
    shown = [format_event(n, line(event="leader.changed", node=n, leader="n2", term=3))
             for n in ("n1", "n2", "n3")]
    assert [t is not None for t in shown] == [False, True, False], shown


def test_a_refused_start_is_not_in_the_feed_but_the_quorum_is() -> None:
    assert format_event("n3", line(event="run.start_rejected", node="n3", run_id=RUN,
                                   fence=1, current_fence=None)) is None
    lost = format_event("n2", line(event="quorum.lost", node="n2", without_ms=1050,
                                   reason="no heartbeat of this node committed"))
    assert lost is not None and "[n2] quorum.lost" in lost and "without_ms=1050" in lost
    assert format_event("n2", line(event="quorum.back", node="n2", without_ms=8200))


@pytest.fixture
def emitted(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, dict[str, Any]]]:
    seen: list[tuple[str, dict[str, Any]]] = []
    monkeypatch.setattr(events, "emit", lambda name, **kw: seen.append((name, kw)))
    return seen


def test_a_refusal_says_why_in_words(emitted: list[tuple[str, dict[str, Any]]]) -> None:
    eventpolicy.emit_for(ClaimRefused("start", RUN, "n1", 4, None), me="n1", leads=False)
    eventpolicy.emit_for(ClaimRefused("start", RUN, "n1", 4, 6), me="n1", leads=False)
    eventpolicy.emit_for(ClaimRefused("finish", RUN, "n1", 4, 4), me="n1", leads=False)
    assert [(name, kw["reason"]) for name, kw in emitted] == [
        ("run.start_rejected", "the run had already ended (or its job was removed) before "
                               "this start committed"),
        ("run.start_rejected", "the run moved on to attempt fence 6 (this node held fence 4)"),
        ("run.finish_rejected", "the run is not in a state this outcome can follow")]


def test_a_retried_start_whose_first_try_committed_is_no_refusal(
        emitted: list[tuple[str, dict[str, Any]]]) -> None:
    eventpolicy.emit_for(ClaimRefused("start", RUN, "n1", 4, 4), me="n1", leads=False)
    eventpolicy.emit_for(ClaimRefused("start", RUN, "n2", 4, None), me="n1", leads=False)
    assert emitted == []


def test_a_covered_fire_time_shows_in_the_feed_as_run_covered() -> None:
    """A fire time a kept record accounts for (core/heldids.py) does not vanish from the
    feed: it shows as run.covered, with its run and job."""
    from raftsched.core.effects import FireCovered

    ev = events.feed_event(FireCovered("j1@1728000005000"), node="n1", seq=7, ts_ms=1)
    assert ev is not None
    assert (ev["event"], ev["run_id"], ev["job_id"]) == ("run.covered", "j1@1728000005000",
                                                         "j1")
