"""Issue 29 papercut: the live feed said nothing while the quorum was lost (nothing
commits then, so no replicated effect can say it): the node cut off says it itself, in
its event log (``raftsched local``'s feed) and in its HTTP event stream (the dashboard's
feed), and says so again when the quorum is back."""

from __future__ import annotations

import signal
from typing import Any

import pytest

from tests.support.harness import wait_until
from tests.support.httputil import EventStream, tokens, wait_serving

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

SECRET = "live-feed-test-secret-0123456789"


def test_a_node_cut_off_from_the_quorum_says_so_and_again_when_it_is_back(
        cluster_factory: Any) -> None:
    c = cluster_factory(3, secret=SECRET, http=True)
    c.start_all()
    c.wait_leader()
    watcher, *others = c.ids
    wait_serving(c.http[watcher])
    wait_until(lambda: c.status(watcher)["health"] == "ok", 20, "the cluster ok")
    stream = EventStream(c.http[watcher], tokens(SECRET)["read"])
    try:
        assert stream.status == 200
        for nid in others:
            c.signal(nid, signal.SIGSTOP)
        try:
            lost = stream.wait_for(lambda ev: ev.get("event") == "quorum.lost", 30,
                                   "quorum.lost")
            assert lost["node"] == watcher and lost["without_ms"] >= 900, lost
        finally:
            for nid in others:
                c.signal(nid, signal.SIGCONT)
        back = stream.wait_for(lambda ev: ev.get("event") == "quorum.back", 30,
                               "quorum.back")
        assert back["node"] == watcher and back["without_ms"] >= lost["without_ms"], back
    finally:
        stream.close()
    logged = [e for e in c.events(watcher) if e.get("event", "").startswith("quorum.")]
    assert [e["event"] for e in logged] == ["quorum.lost", "quorum.back"], logged
    # A node that was stopped may see the loss when it runs again (its heartbeats went
    # unanswered for as long): then it says it once, and that the quorum is back.
    def settled(nid: str) -> bool:
        said = [e["event"] for e in c.events(nid) if e.get("event", "").startswith("quorum.")]
        return said in ([], ["quorum.lost", "quorum.back"])

    for nid in others:
        wait_until(lambda nid=nid: settled(nid), 20, f"{nid}'s quorum events settled")
